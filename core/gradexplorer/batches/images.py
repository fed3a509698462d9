"""Image files and folders, read into a preprocessed batch.

Also home of the fallback preprocessing, torchvision's classification recipe, used for
images when the model brings none (and by ``gradexplorer.models`` for torchvision models without
weights).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gradexplorer.base.errors import BatchError, UnreadableImages, listing
from gradexplorer.batches.labels import LabelSpec, parse_labels
from gradexplorer.batches.paths import SOURCES_HINT, display_path, missing_source
from gradexplorer.capturing.inputs import Batch
from gradexplorer.models.preprocess import DEFAULT_PREPROCESS_DESCRIPTION, default_preprocess

if TYPE_CHECKING:
    from PIL import Image

#: File endings a folder is expanded to. Files named explicitly are tried whatever
#: their ending, so any format Pillow reads works when asked for by name.
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".gif"})

# Originals kept for thumbnails and overlays are shrunk to this many pixels on their
# longer side: a folder of 24-megapixel photos would otherwise hold gigabytes.
MAX_KEPT_IMAGE_SIDE = 1024

_IMAGE_FIX = "choose PNG or JPEG files (BMP, WebP and TIFF also work)"

_truncation_lock = threading.Lock()


@contextlib.contextmanager
def _truncated_images_refused() -> Iterator[None]:
    # With LOAD_TRUNCATED_IMAGES set (by the user's code or another library) Pillow
    # fills a cut-off image with grey and says nothing; gradients of such an input are
    # meaningless, so refuse it here and put the user's setting back afterwards.
    from PIL import ImageFile

    with _truncation_lock:
        saved = ImageFile.LOAD_TRUNCATED_IMAGES
        ImageFile.LOAD_TRUNCATED_IMAGES = False
        try:
            yield
        finally:
            ImageFile.LOAD_TRUNCATED_IMAGES = saved


def _unreadable(path: Path, why: str) -> BatchError:
    return BatchError(f"file '{path}' is not a readable image ({why});", _IMAGE_FIX + ".")


def _read_image(path: Path) -> tuple[Image.Image, list[str]]:
    """Open ``path`` fully decoded as RGB; return the image and what was done to it."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        size = path.stat().st_size
    except OSError as exc:
        raise _unreadable(path, exc.strerror or str(exc)) from exc
    if size == 0:
        raise _unreadable(path, "the file is empty")

    notes: list[str] = []
    fmt = "image"
    try:
        with _truncated_images_refused(), Image.open(path) as img:
            fmt = img.format or fmt
            if getattr(img, "n_frames", 1) > 1:
                notes.append("first frame only")
            img.load()
            if img.getexif().get(0x0112, 1) != 1:  # EXIF orientation tag
                img = ImageOps.exif_transpose(img)
                notes.append("rotated per EXIF orientation")
            rgb = _to_rgb(img, notes)
    except UnidentifiedImageError as exc:
        raise _unreadable(path, "not a recognised image format") from exc
    except Image.DecompressionBombError as exc:
        raise _unreadable(path, f"too large to decode safely: {exc}") from exc
    except (OSError, SyntaxError, ValueError, EOFError, IndexError) as exc:
        # Pillow reports damaged data through several exception types; the message
        # ("image file is truncated", "broken PNG file") is what the user needs.
        msg = str(exc) or type(exc).__name__
        if "truncated" in msg or isinstance(exc, EOFError):
            raise _unreadable(path, f"truncated {fmt} data") from exc
        raise _unreadable(path, f"damaged {fmt} data: {msg}") from exc
    return rgb, notes


def _to_rgb(img: Image.Image, notes: list[str]) -> Image.Image:
    from PIL import Image

    mode = img.mode
    has_alpha = mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info
    if has_alpha:
        # Transparent areas of icons and cut-outs are usually meant to look white;
        # dropping alpha instead would expose whatever colour the hidden pixels hold.
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        notes.append("alpha channel composited onto white")
        return Image.alpha_composite(white, rgba).convert("RGB")
    if mode == "RGB":
        return img.copy()
    if mode in ("I", "F") or mode.startswith("I;16"):
        # High bit-depth grey: Pillow's convert("RGB") clips at 255, which would turn a
        # 16-bit image almost white; scale by the largest value the type can hold.
        import numpy as np

        arr = np.asarray(img, dtype=np.float64)
        peak = float(arr.max(initial=0))
        if mode == "F":
            top = 1.0 if peak <= 1.0 else 255.0
        else:
            top = 65535.0 if peak > 255 else 255.0
        grey = Image.fromarray(np.clip(arr / top * 255.0, 0, 255).round().astype(np.uint8))
        notes.append(f"{mode} grayscale scaled to 8 bit and converted to RGB")
        return grey.convert("RGB")
    if mode in ("L", "1"):
        notes.append("grayscale converted to RGB")
    elif mode == "P":
        notes.append("palette image converted to RGB")
    else:
        notes.append(f"{mode} converted to RGB")
    return img.convert("RGB")


def expand_image_paths(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The image files that files and folders name, in order: a folder gives its image
    files (``IMAGE_SUFFIXES``, dot files left out) sorted by name.

    Raises
    ------
    BatchError
        A path is missing, a folder holds no image, or nothing was given.
    """
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise missing_source(raw)
        if path.is_dir():
            entries = sorted(path.iterdir(), key=lambda p: p.name)
            # Dot files include macOS "._photo.jpg" resource forks, which are not images.
            images = [
                p for p in entries
                if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES
            ]
            if not images:
                found = ", ".join(p.name for p in entries[:5]) or "nothing"
                more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
                raise BatchError(
                    f"folder '{path}' has no image files (found: {found}{more});",
                    "choose a folder that holds PNG or JPEG files.",
                )
            files.extend(images)
        else:
            files.append(path)
    if not files:
        raise BatchError("no images were given;", SOURCES_HINT + ".")
    return files


def _shrunk_copy(img: Image.Image) -> Image.Image:
    if max(img.size) <= MAX_KEPT_IMAGE_SIDE:
        return img
    small = img.copy()
    small.thumbnail((MAX_KEPT_IMAGE_SIDE, MAX_KEPT_IMAGE_SIDE))
    return small


def _origin(paths: Sequence[str | os.PathLike]) -> str:
    return listing([display_path(Path(p)) for p in paths], 3)


def load_images(
    paths: Sequence[str | os.PathLike],
    preprocess: Callable[[Image.Image], torch.Tensor] | None = None,
    preprocess_description: str | None = None,
    labels: LabelSpec | None = None,
    skip_unreadable: bool = False,
) -> Batch:
    """Read image files and folders into one preprocessed batch.

    Every image is decoded fully (a truncated file is an error, never padded with grey)
    and converted to RGB: an alpha channel is composited onto white, grayscale,
    palette, CMYK and 16-bit images are converted, and a photo's EXIF orientation is
    applied. Each such step is named in ``Batch.preprocessing``.

    Parameters
    ----------
    paths : sequence of str or path-like
        Image files (anything Pillow reads: PNG, JPEG, BMP, WebP, TIFF, GIF) and
        folders. A folder stands for its image files (by ending, see
        ``IMAGE_SUFFIXES``), sorted by name, not recursing; other files and dot files
        in it are ignored.
    preprocess : callable, optional
        Maps one RGB ``PIL.Image`` to a ``(C, H, W)`` tensor. Default: resize the
        shorter side to 256 px, center crop 224×224, convert to [0, 1] and normalise
        with the ImageNet mean and std (see :func:`default_preprocess`).
    preprocess_description : str, optional
        ``preprocess`` in words, for the user. Defaults to a description of the
        default preprocess, or "custom preprocess".
    labels : str, int, sequence or Tensor, optional
        Class indices, parsed with :func:`parse_labels` (indices only: names need the
        model's categories, which :func:`load_batch` supplies).
    skip_unreadable : bool
        Leave out the files that are not readable images (each named in
        ``Batch.preprocessing``) when others are; without it they are refused together.

    Returns
    -------
    Batch
        ``tensor`` of shape ``(N, C, H, W)``; ``images`` holds the RGB originals,
        shrunk to at most 1024 px on their longer side.

    Raises
    ------
    BatchError
        A path does not exist, a folder holds no images, a file is empty, corrupt,
        truncated or not an image, ``preprocess`` fails or returns something other
        than a tensor, or the preprocessed images differ in shape.
    """
    files = expand_image_paths(paths)
    if preprocess is None:
        preprocess = default_preprocess()
        preprocess_description = preprocess_description or DEFAULT_PREPROCESS_DESCRIPTION
    preprocess_description = preprocess_description or "custom preprocess"

    samples, unreadable = [], []
    for path in files:
        try:
            samples.append(_ImageSample.read(path, preprocess))
        except _UnreadableFile as exc:
            unreadable.append((path, exc.error))
    if unreadable and not samples:
        raise unreadable[0][1]
    if unreadable and not skip_unreadable:
        names = [str(path) for path, _ in unreadable]
        reasons = "; ".join(exc.problem.rstrip(";") for _, exc in unreadable[:3])
        raise UnreadableImages(
            f"{len(unreadable)} of the {len(files)} pictures cannot be read ({reasons});",
            f"remove {'it' if len(unreadable) == 1 else 'them'} from the inputs, or go on without "
            f"{'it' if len(unreadable) == 1 else 'them'} ({len(samples)} pictures): --skip-unreadable.",
            paths=names, readable=len(samples),
        )
    files = [sample.path for sample in samples]
    _check_one_shape(samples)
    steps = [
        f"{note} ({listing(names, 3)})" if len(names) < len(files) else note
        for note, names in _notes_by_kind(samples).items()
    ]
    steps.append(preprocess_description)
    if unreadable:
        steps.insert(0, f"left out, unreadable: {listing([path.name for path, _ in unreadable], 5)}")
    batch = Batch(
        tensor=torch.stack([sample.tensor for sample in samples]),
        labels=None,
        names=[p.name for p in files],
        source=f"{len(files)} image{'s' if len(files) != 1 else ''} from {_origin(paths)}",
        preprocessing="; ".join(steps),
        images=[sample.kept for sample in samples],
    )
    if labels is not None:
        batch.labels = parse_labels(labels, len(batch))
    return batch


@dataclass
class _ImageSample:
    """One image file: its preprocessed tensor, the original kept for display, and what
    was done to it on the way to RGB."""

    path: Path
    tensor: torch.Tensor
    kept: Image.Image
    notes: list[str]

    @classmethod
    def read(cls, path: Path, preprocess: Callable[[Image.Image], torch.Tensor]) -> _ImageSample:
        try:
            rgb, notes = _read_image(path)
        except BatchError as exc:
            raise _UnreadableFile(exc) from exc
        try:
            sample = preprocess(rgb)
        except Exception as exc:
            raise BatchError(
                f"preprocessing image '{path}' failed ({type(exc).__name__}: {exc});",
                "check the model's preprocess, or load a preprocessed tensor from a .pt file.",
            ) from exc
        if not isinstance(sample, torch.Tensor):
            raise BatchError(
                f"the preprocess returned a {type(sample).__name__} for '{path}', not a tensor;",
                "end the preprocess with a conversion to tensor (transforms.ToTensor()).",
            )
        return cls(path, sample.detach(), _shrunk_copy(rgb), notes)


class _UnreadableFile(Exception):
    """A file that is not a readable image (its ``BatchError`` inside), told apart from a
    preprocess that fails on a readable one."""

    def __init__(self, error: BatchError) -> None:
        super().__init__(str(error))
        self.error = error


def _check_one_shape(samples: list[_ImageSample]) -> None:
    if len({tuple(s.tensor.shape) for s in samples}) > 1:
        listed = "; ".join(f"'{s.path.name}' → {tuple(s.tensor.shape)}" for s in samples[:6])
        raise BatchError(
            f"the images have different shapes after preprocessing ({listed});",
            "use a preprocess that resizes and crops to one size (the default does), "
            "or give images of one size.",
        )


def _notes_by_kind(samples: list[_ImageSample]) -> dict[str, list[str]]:
    # One step per kind of conversion, naming the files it applied to.
    by_kind: dict[str, list[str]] = {}
    for sample in samples:
        for note in sample.notes:
            by_kind.setdefault(note, []).append(sample.path.name)
    return by_kind
