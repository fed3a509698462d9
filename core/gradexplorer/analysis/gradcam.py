"""Grad-CAM heatmaps from a captured activation and its gradient, and overlays on pictures.

For a spatial layer with activation A (C x H x W) and gradient G of a pre-softmax
target: alpha_c = mean over H, W of G_c; CAM = ReLU(sum_c alpha_c A_c), upsampled to
the input size and min-max scaled per sample (Selvaraju et al., 2017). ViT token maps
``(B, 1+N, C)`` are turned into ``(B, C, sqrt(N), sqrt(N))`` first, and channels-last maps
``(B, H, W, C)`` (the norms and MLPs of ConvNeXt and Swin blocks) into ``(B, C, H, W)``
(:func:`is_channels_last`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from gradexplorer.analysis.token_grid import aligned_token_grid, is_image_input, token_grid
from gradexplorer.base.errors import GradExplorerError

_FIX = "Choose a convolutional layer (B, C, H, W) or a ViT block with (B, 1+N, C) tokens."


def is_channels_last(shape: Sequence[int], input_shape: Sequence[int] | None = None) -> bool:
    """Whether a 4-D activation is laid out ``(B, H, W, C)`` rather than ``(B, C, H, W)``.

    With a picture input ``(B, C, H, W)``: when only the channels-last reading gives a grid
    that divides the input with one stride in both directions (ConvNeXt's ``(B, 7, 7, 768)``
    on 224 px: 7 × 7 at stride 32, where channels first would be a 7 × 768 grid). Without
    one: when dims 1 and 2 are equal and the last is larger (a square grid of channels).
    Channels first wins whenever both readings fit.

    Parameters
    ----------
    shape : sequence of int
        Activation shape including the batch dimension.
    input_shape : sequence of int, optional
        The model input's shape (batch first).
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) != 4:
        return False
    if input_shape is not None and is_image_input(input_shape):
        h, w = int(input_shape[2]), int(input_shape[3])
        return _divides(shape[1], shape[2], h, w) and not _divides(shape[2], shape[3], h, w)
    return shape[1] == shape[2] and shape[3] > shape[1]


def _divides(gh: int, gw: int, h: int, w: int) -> bool:
    # A grid of gh × gw cells over an h × w picture: one stride (give or take rounding).
    if not (1 <= gh <= h and 1 <= gw <= w):
        return False
    sh, sw = h / gh, w / gw
    return abs(sh - sw) <= max(1.0, 0.25 * max(sh, sw))


def cam_grid(shape: Sequence[int], input_shape: Sequence[int] | None = None) -> tuple[int, int, bool] | None:
    """The spatial grid Grad-CAM weighs for an activation of this shape.

    Parameters
    ----------
    shape : sequence of int
        Activation shape including the batch dimension.
    input_shape : sequence of int, optional
        The model input's shape (batch first). When given, a grid must line up with an
        image input: conv maps need a picture input, tokens the patch grid of one
        (``gradexplorer.analysis.token_grid.aligned_token_grid``). Unknown: any grid counts.

    Returns
    -------
    (int, int, bool) or None
        ``(height, width, drops_class_token)``: a conv map's own ``H × W`` (also of a
        channels-last map, :func:`is_channels_last`), or the
        square grid of ViT tokens (``gradexplorer.analysis.token_grid``); ``None`` when there is none.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) == 4:
        h, w = (shape[1], shape[2]) if is_channels_last(shape, input_shape) else (shape[2], shape[3])
        if input_shape is not None and not is_image_input(input_shape):
            return None
        return (h, w, False) if h >= 1 and w >= 1 else None
    if len(shape) == 3:
        grid = aligned_token_grid(shape[1], input_shape)
        if grid is not None:
            return grid.side, grid.side, grid.class_token
    return None


def cam_supported(shape: Sequence[int], input_shape: Sequence[int] | None = None) -> bool:
    """Whether Grad-CAM can be computed for an activation of this shape.

    Parameters
    ----------
    shape : sequence of int
        Activation shape including the batch dimension, e.g. ``torch.Size``.

    Returns
    -------
    bool
        True for conv maps ``(B, C, H, W)`` and token maps ``(B, T, C)`` whose token
        count ``T`` or ``T - 1`` (a class token first) is a perfect square.
    """
    return cam_grid(shape, input_shape) is not None


def cam_unavailable_reason(shape: Sequence[int], input_shape: Sequence[int] | None = None,
                           layer: str | None = None) -> str | None:
    """Why Grad-CAM is not offered for an activation of this shape, in the user's words.

    Parameters
    ----------
    shape : sequence of int
        Activation shape including the batch dimension.
    input_shape : sequence of int, optional
        The model input's shape, as for ``cam_grid``.
    layer : str, optional
        The layer's name, for the message.

    Returns
    -------
    str or None
        ``None`` when Grad-CAM can be computed.
    """
    if cam_grid(shape, input_shape) is not None:
        return None
    shape = tuple(int(s) for s in shape)
    where = f"'{layer}'" if layer else "this layer"
    dims = ", ".join(["B", *map(str, shape[1:])])
    if input_shape is not None and len(shape) in (3, 4) and not is_image_input(input_shape):
        inp = ", ".join(["B", *map(str, tuple(input_shape)[1:])])
        return (f"Grad-CAM shows where in a picture the target looks, but this model's input ({inp}) is a "
                f"sequence, not a picture: {where} outputs ({dims}), positions of a sequence with no place "
                f"in an image. The Heatmap tab shows it as tokens × channels and the Saliency tab per token.")
    grid = token_grid(shape[1]) if len(shape) == 3 else None
    if grid is not None and input_shape is not None:
        h, w = int(input_shape[2]), int(input_shape[3])
        side = grid.side
        return (f"{where} outputs {shape[1]} tokens ({dims}); a {side}×{side} grid of them does not divide "
                f"the {h}×{w} input into patches, so they are not its patches and Grad-CAM has no place "
                f"to show. Choose a convolutional layer or a ViT block whose tokens match the image.")
    return (f"Grad-CAM needs a spatial layer: a conv map (B, C, H, W) or ViT tokens (B, 1+N, C); "
            f"{where} outputs ({dims}). Select a convolutional layer or a transformer block.")


def _to_channels_first(t: torch.Tensor, grid: tuple[int, int, bool], channels_last: bool) -> torch.Tensor:
    if t.dim() == 4:
        return t.permute(0, 3, 1, 2) if channels_last else t
    h, w, drop_cls = grid
    if drop_cls:
        t = t[:, 1:, :]
    return t.reshape(t.shape[0], h, w, t.shape[2]).permute(0, 3, 1, 2)


def grad_cam(
    activation: torch.Tensor,
    gradient: torch.Tensor | None,
    out_size: tuple[int, int] | None = None,
    *,
    layer: str | None = None,
    input_shape: Sequence[int] | None = None,
) -> torch.Tensor:
    """Grad-CAM heatmaps for a batch.

    Parameters
    ----------
    activation : torch.Tensor
        The layer's output: ``(B, C, H, W)``, or ViT tokens ``(B, 1+N, C)`` / ``(B, N, C)``
        with ``N`` a perfect square (the class token is dropped).
    gradient : torch.Tensor
        Gradient of the (pre-softmax) target with respect to ``activation``, same shape.
    out_size : (int, int), optional
        ``(height, width)`` to upsample to (bilinear), usually the input picture's size;
        the layer's own grid when omitted.
    layer : str, optional
        The layer's name, used only in error messages.
    input_shape : sequence of int, optional
        The model input's shape (batch first): tells a channels-last map ``(B, H, W, C)``
        from a channels-first one (:func:`is_channels_last`).

    Returns
    -------
    torch.Tensor
        ``(B, h, w)`` float32 in [0, 1], on ``activation``'s device. Each sample is
        min-max scaled on its own; a sample whose CAM is flat (all zero when no
        channel votes for the target) stays all zero, never NaN.

    Raises
    ------
    GradExplorerError
        When the layer has no spatial layout, the gradient is missing, or the two
        shapes differ.
    """
    where = f"'{layer}'" if layer else "this layer"
    shape = tuple(activation.shape)
    grid = cam_grid(shape)
    last = is_channels_last(shape, input_shape)
    if grid is not None and last:
        grid = (shape[1], shape[2], False)
    if grid is None:
        described = ", ".join(["B", *map(str, shape[1:])])
        raise GradExplorerError(
            f"Grad-CAM needs a spatial layer (conv or ViT tokens); {where} outputs shape ({described}).",
            _FIX,
        )
    if gradient is None:
        raise GradExplorerError(
            f"No gradient reached {where}, so Grad-CAM cannot weight its channels.",
            "Choose a layer that the target depends on.",
        )
    if tuple(gradient.shape) != shape:
        raise GradExplorerError(
            f"The gradient of {where} has shape {tuple(gradient.shape)} but its activation {shape}.",
            "Pass the gradient captured for the same layer and call.",
        )

    with torch.no_grad():
        a = _to_channels_first(activation.detach().float(), grid, last)
        g = _to_channels_first(gradient.detach().float(), grid, last)
        weights = g.mean(dim=(2, 3), keepdim=True)
        cam = F.relu((weights * a).sum(dim=1, keepdim=True))
        if out_size is not None and tuple(out_size) != tuple(cam.shape[2:]):
            cam = F.interpolate(cam, size=tuple(out_size), mode="bilinear", align_corners=False)
        cam = cam[:, 0]
        flat = cam.reshape(cam.shape[0], -1)
        low = flat.min(dim=1).values.view(-1, 1, 1)
        span = (flat.max(dim=1).values.view(-1, 1, 1) - low)
        # A flat map carries no location; dividing would give NaN, so it becomes zero.
        scaled = torch.where(span > 0, (cam - low) / span.clamp_min(torch.finfo(cam.dtype).tiny), 0.0)
    return scaled


# Degree-5 polynomial fit of Google's Turbo colour map (Mikhailov, 2019; fit by R. Du): close to
# the table except in the darkest few percent at each end, and needs no matplotlib.
_TURBO_R = (0.13572138, 4.61539260, -42.66032258, 132.13108234, -152.94239396, 59.28637943)
_TURBO_G = (0.09140261, 2.19418839, 4.84296658, -14.18503333, 4.27729857, 2.82956604)
_TURBO_B = (0.10667330, 12.64194608, -60.58204836, 110.36276771, -89.90310912, 27.34824973)


def turbo(values: np.ndarray) -> np.ndarray:
    """Map values in [0, 1] to Turbo colours (a perceptual rainbow: blue low, red high).

    Parameters
    ----------
    values : numpy.ndarray
        Any shape; clipped to [0, 1], NaN shown as 0.

    Returns
    -------
    numpy.ndarray
        ``values.shape + (3,)`` uint8 RGB.
    """
    x = np.clip(np.nan_to_num(np.asarray(values, dtype=np.float64)), 0.0, 1.0)
    powers = np.stack([x**k for k in range(6)], axis=-1)
    rgb = np.stack(
        [powers @ np.asarray(c) for c in (_TURBO_R, _TURBO_G, _TURBO_B)], axis=-1
    )
    return np.clip(np.rint(rgb * 255.0), 0, 255).astype(np.uint8)


def overlay(image: Image.Image, cam: torch.Tensor | np.ndarray, opacity: float = 0.5) -> Image.Image:
    """Blend a Turbo-coloured heatmap over a picture.

    Parameters
    ----------
    image : PIL.Image.Image
        The picture; converted to RGB.
    cam : torch.Tensor or numpy.ndarray
        2-D heatmap in [0, 1] (e.g. one sample of ``grad_cam``); resized bilinearly to
        the picture's size when it differs.
    opacity : float
        Weight of the heatmap, 0 (picture only) to 1 (heatmap only).

    Returns
    -------
    PIL.Image.Image
        RGB picture of the same size as ``image``.

    Raises
    ------
    GradExplorerError
        When ``cam`` is not 2-D or ``opacity`` is outside [0, 1].
    """
    if isinstance(cam, torch.Tensor):
        cam = cam.detach().cpu().float().numpy()
    cam = np.asarray(cam, dtype=np.float32)
    if cam.ndim != 2:
        raise GradExplorerError(
            f"A Grad-CAM overlay needs one 2-D heatmap, got shape {cam.shape}.",
            "Pass a single sample, e.g. cams[i].",
        )
    if not 0.0 <= opacity <= 1.0:
        raise GradExplorerError(f"Overlay opacity must be between 0 and 1, got {opacity}.", "")
    picture = image.convert("RGB")
    width, height = picture.size
    if cam.shape != (height, width):
        cam = np.asarray(Image.fromarray(cam).resize((width, height), Image.Resampling.BILINEAR))
    heat = turbo(cam).astype(np.float32)
    base = np.asarray(picture, dtype=np.float32)
    blended = (1.0 - opacity) * base + opacity * heat
    return Image.fromarray(np.clip(np.rint(blended), 0, 255).astype(np.uint8))
