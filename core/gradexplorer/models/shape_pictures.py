"""Procedural pictures of simple shapes: the data behind the ``demo:shapes`` model.

Every picture is drawn from a seed, so the training set, the shipped samples and
the fresh samples used by the Grad-CAM test are all reproducible without any file.
A picture holds one filled shape of a random class, size, rotation, colour and
position on a noisy two-colour gradient with a few small dots and thin lines as
distractors. The shape's pixel mask comes with it, which is what lets a test check
that Grad-CAM points at the shape.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image, ImageDraw

SHAPE_CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross", "hexagon")

# Per-channel statistics of the generator's pictures in [0, 1], measured on 20 000
# pictures by scripts/make_shapes_demo.py (which checks they still hold). Fixed
# constants rather than values stored with the weights, so the checkpoint stays a
# plain state_dict.
MEAN: tuple[float, float, float] = (0.5, 0.5, 0.5)
STD: tuple[float, float, float] = (0.24, 0.24, 0.24)

_SCALE_RANGE = (0.25, 0.45)  # diameter of the shape's circumscribed circle / image size
_MIN_CONTRAST = 90.0  # least RGB distance (0-255) between the shape and the background under it
_STAR_INNER = 0.45  # inner/outer radius of the five-pointed star
_CROSS_HALF_WIDTH = 0.3  # half-width of a cross arm / circumscribed radius


def _as_generator(rng: np.random.Generator | int | None) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(rng)


def _regular_polygon(cx: float, cy: float, r: float, n: int, phi: float) -> list[tuple[float, float]]:
    return [
        (cx + r * math.cos(phi + 2 * math.pi * k / n), cy + r * math.sin(phi + 2 * math.pi * k / n))
        for k in range(n)
    ]


def _star(cx: float, cy: float, r: float, phi: float) -> list[tuple[float, float]]:
    points = []
    for k in range(10):
        radius = r if k % 2 == 0 else r * _STAR_INNER
        angle = phi + math.pi * k / 5
        points.append((cx + radius * math.cos(angle), cy + radius * math.sin(angle)))
    return points


def _cross(cx: float, cy: float, r: float, phi: float) -> list[tuple[float, float]]:
    w = r * _CROSS_HALF_WIDTH
    # Arm length chosen so the arm's outer corners lie on the circumscribed circle,
    # which keeps the cross inside the same bounds as every other class.
    arm = math.sqrt(r * r - w * w)
    outline = [
        (w, w), (arm, w), (arm, -w), (w, -w), (w, -arm), (-w, -arm),
        (-w, -w), (-arm, -w), (-arm, w), (-w, w), (-w, arm), (w, arm),
    ]
    c, s = math.cos(phi), math.sin(phi)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in outline]


def _shape_outline(name: str, cx: float, cy: float, r: float, phi: float) -> list[tuple[float, float]]:
    if name == "square":
        return _regular_polygon(cx, cy, r, 4, phi)
    if name == "triangle":
        return _regular_polygon(cx, cy, r, 3, phi)
    if name == "hexagon":
        return _regular_polygon(cx, cy, r, 6, phi)
    if name == "star":
        return _star(cx, cy, r, phi)
    if name == "cross":
        return _cross(cx, cy, r, phi)
    raise ValueError(f"unknown shape {name!r}")


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    c0 = rng.uniform(0, 255, 3)
    c1 = rng.uniform(0, 255, 3)
    theta = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    t = xx * math.cos(theta) + yy * math.sin(theta)
    t = (t - t.min()) / max(t.max() - t.min(), 1e-9)
    bg = c0 * (1 - t[..., None]) + c1 * t[..., None]
    bg += rng.normal(0.0, rng.uniform(4, 20), bg.shape)
    return bg


def _draw_distractors(draw: ImageDraw.ImageDraw, rng: np.random.Generator, size: int) -> None:
    # Dots and thin strokes are far smaller than the smallest shape, and appear
    # equally often with every class, so they carry no label information.
    for _ in range(int(rng.integers(0, 5))):
        x, y = rng.uniform(0, size, 2)
        rad = rng.uniform(0.5, 1.8)
        draw.ellipse([x - rad, y - rad, x + rad, y + rad], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    for _ in range(int(rng.integers(0, 4))):
        x, y = rng.uniform(0, size, 2)
        length = rng.uniform(0.08, 0.25) * size
        angle = rng.uniform(0, 2 * math.pi)
        end = (x + length * math.cos(angle), y + length * math.sin(angle))
        draw.line([(x, y), end], fill=tuple(int(v) for v in rng.integers(0, 256, 3)), width=1)


def draw_sample(
    rng: np.random.Generator | int | None = None,
    size: int = 64,
    label: int | None = None,
) -> tuple[Image.Image, int, np.ndarray]:
    """Draw one picture of a random shape on a cluttered background.

    Parameters
    ----------
    rng : numpy.random.Generator or int or None
        Source of randomness. An ``int`` seeds a fresh generator, so the same seed
        always gives the same pixels; a ``Generator`` is advanced (for drawing many).
    size : int
        Width and height in pixels.
    label : int, optional
        Index into ``SHAPE_CLASSES`` to force the class; random when omitted.

    Returns
    -------
    image : PIL.Image.Image
        RGB picture, ``size`` x ``size``.
    label : int
        Index of the shape's class in ``SHAPE_CLASSES``.
    mask : numpy.ndarray
        ``(size, size)`` bool, True exactly on the pixels painted with the shape's
        colour. The shape lies fully inside the image, at a random position.
    """
    rng = _as_generator(rng)
    if label is None:
        label = int(rng.integers(len(SHAPE_CLASSES)))
    elif not 0 <= label < len(SHAPE_CLASSES):
        raise ValueError(f"label must be in [0, {len(SHAPE_CLASSES)}), got {label}")
    name = SHAPE_CLASSES[label]

    bg = _background(rng, size)
    image = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    _draw_distractors(draw, rng, size)

    r = rng.uniform(*_SCALE_RANGE) * size / 2
    # One pixel of margin beyond the circumscribed circle: rasterisation may round up.
    cx, cy = rng.uniform(r + 1, size - 1 - r, 2)
    phi = rng.uniform(0, 2 * math.pi)

    mask_image = Image.new("L", (size, size), 0)
    mask_draw = ImageDraw.Draw(mask_image)
    if name == "circle":
        box = [cx - r, cy - r, cx + r, cy + r]
        mask_draw.ellipse(box, fill=255)
    else:
        outline = _shape_outline(name, cx, cy, r, phi)
        mask_draw.polygon(outline, fill=255)
    mask = np.asarray(mask_image) > 0

    # The shape must stand out from what lies under it, or the label is unknowable.
    under = bg[mask].mean(axis=0)
    for _ in range(100):
        colour = rng.integers(0, 256, 3)
        if np.linalg.norm(colour - under) >= _MIN_CONTRAST:
            break
    else:
        colour = np.where(under < 128, 255, 0)
    fill = tuple(int(v) for v in colour)
    # Paint through the mask rather than drawing twice, so the mask is the painted
    # pixels by construction.
    image.paste(Image.new("RGB", (size, size), fill), (0, 0), mask_image)
    return image, label, mask


def to_tensor(image: Image.Image) -> torch.Tensor:
    """Convert an RGB picture to a ``(3, H, W)`` float32 tensor in [0, 1].

    Parameters
    ----------
    image : PIL.Image.Image
        Any picture; it is converted to RGB.

    Returns
    -------
    torch.Tensor
        ``(3, H, W)`` float32, ``pixel / 255``.
    """
    array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


def normalize(images: torch.Tensor) -> torch.Tensor:
    """Normalise ``(..., 3, H, W)`` pictures in [0, 1] with the demo's ``MEAN`` and ``STD``.

    Parameters
    ----------
    images : torch.Tensor
        One picture ``(3, H, W)`` or a batch ``(N, 3, H, W)``, values in [0, 1].

    Returns
    -------
    torch.Tensor
        ``(images - MEAN) / STD`` per channel, same shape.
    """
    mean = torch.tensor(MEAN, dtype=images.dtype).view(3, 1, 1)
    std = torch.tensor(STD, dtype=images.dtype).view(3, 1, 1)
    return (images - mean) / std


def make_dataset(
    n: int, seed: int, size: int = 64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw ``n`` pictures from one seed.

    Parameters
    ----------
    n : int
        Number of pictures.
    seed : int
        Seed of the generator; the same ``(n, seed, size)`` gives the same data.
    size : int
        Width and height in pixels.

    Returns
    -------
    images : torch.Tensor
        ``(n, 3, size, size)`` float32 in [0, 1], not normalised (see ``normalize``).
    labels : torch.Tensor
        ``(n,)`` int64 indices into ``SHAPE_CLASSES``.
    masks : torch.Tensor
        ``(n, size, size)`` bool shape masks.
    """
    rng = np.random.default_rng(seed)
    images = np.empty((n, size, size, 3), dtype=np.uint8)
    labels = np.empty(n, dtype=np.int64)
    masks = np.empty((n, size, size), dtype=bool)
    for i in range(n):
        image, labels[i], masks[i] = draw_sample(rng, size)
        images[i] = np.asarray(image)
    tensor = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255.0)
    return tensor.contiguous(), torch.from_numpy(labels), torch.from_numpy(masks)
