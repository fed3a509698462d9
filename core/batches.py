"""Making a :class:`~core.batch.Batch` from what the user points at.

Sources are image files or folders, a tensor file saved with ``torch.save``, a random
batch of a given shape, or the demo batch of a demo model. :func:`load_batch` picks the
right loader for what the CLI or GUI was given; the other functions are its parts.
Every failure the user can cause is a :class:`~core.errors.BatchError` naming the file
or value, the problem and the fix.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import threading
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from core.batch import Batch
from core.errors import BatchError
from core.loaded_model import LoadedModel

__all__ = [
    "DEFAULT_PREPROCESS_DESCRIPTION",
    "IMAGE_SUFFIXES",
    "TENSOR_SUFFIXES",
    "check_batch_shape",
    "default_preprocess",
    "describe",
    "load_batch",
    "load_images",
    "load_tensor_file",
    "parse_labels",
    "random_batch",
]

#: File endings a folder is expanded to. Files named explicitly are tried whatever
#: their ending, so any format Pillow reads works when asked for by name.
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".gif"})
TENSOR_SUFFIXES = frozenset({".pt", ".pth"})

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_PREPROCESS_DESCRIPTION = (
    "resize shorter side to 256 px, center crop 224×224, scale to [0, 1], "
    "normalise with ImageNet mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225)"
)

# Originals kept for thumbnails and overlays are shrunk to this many pixels on their
# longer side: a folder of 24-megapixel photos would otherwise hold gigabytes.
MAX_KEPT_IMAGE_SIDE = 1024

# 2 GiB of float32; a typo such as 8x3x2240x2240 should be refused, not swap the machine.
MAX_RANDOM_ELEMENTS = 2**29

_INPUT_KEYS = ("input", "inputs", "x", "images")
_LABEL_KEYS = ("labels", "label", "y", "targets")
_CAPTURE_FORMAT = "gradexplorer.capture"
_SOURCES_HINT = (
    "give image files or a folder of images, one .pt tensor file, "
    "a random batch such as 'random:2x3x224x224', or 'demo'"
)
_IMAGE_FIX = "choose PNG or JPEG files (BMP, WebP and TIFF also work)"
_TENSOR_FIX = (
    "save the input as a plain tensor, torch.save(x, 'input.pt'), "
    "or as a dict, torch.save({'input': x, 'labels': y}, 'input.pt')"
)

_truncation_lock = threading.Lock()


# ---------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------


def default_preprocess() -> Callable[[object], torch.Tensor]:
    """The preprocess used for images when the model brings none.

    Resize the shorter side to 256 px (bilinear, antialiased), center crop 224×224,
    convert to a float tensor in [0, 1] and normalise with the ImageNet mean and
    standard deviation: the recipe of torchvision's classification weights.

    Returns
    -------
    callable
        Maps one RGB ``PIL.Image`` to a ``(3, 224, 224)`` float32 tensor.
    """
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


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


def _read_image(path: Path) -> tuple[object, list[str]]:
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


def _to_rgb(img, notes: list[str]):
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


def _expand_image_paths(paths: Sequence[str | os.PathLike]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise BatchError(f"'{raw}' does not exist;", "check the path, or " + _SOURCES_HINT + ".")
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
        raise BatchError("no images were given;", _SOURCES_HINT + ".")
    return files


def _shrunk_copy(img):
    if max(img.size) <= MAX_KEPT_IMAGE_SIDE:
        return img
    small = img.copy()
    small.thumbnail((MAX_KEPT_IMAGE_SIDE, MAX_KEPT_IMAGE_SIDE))
    return small


def _origin(paths: Sequence[str | os.PathLike]) -> str:
    shown = [_display_path(Path(p)) for p in paths]
    if len(shown) <= 3:
        return ", ".join(shown)
    return ", ".join(shown[:3]) + f" and {len(shown) - 3} more"


def _display_path(path: Path) -> str:
    text = str(path)
    home = str(Path.home())
    if home not in ("", "/") and (text == home or text.startswith(home + os.sep)):
        return "~" + text[len(home):]
    return text


def load_images(
    paths: Sequence[str | os.PathLike],
    preprocess: Callable[[object], torch.Tensor] | None = None,
    preprocess_description: str | None = None,
    labels=None,
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
    files = _expand_image_paths(paths)
    if preprocess is None:
        preprocess = default_preprocess()
        preprocess_description = preprocess_description or DEFAULT_PREPROCESS_DESCRIPTION
    preprocess_description = preprocess_description or "custom preprocess"

    tensors: list[torch.Tensor] = []
    kept = []
    notes_by_kind: dict[str, list[str]] = {}
    for path in files:
        rgb, notes = _read_image(path)
        for note in notes:
            notes_by_kind.setdefault(note, []).append(path.name)
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
        tensors.append(sample.detach())
        kept.append(_shrunk_copy(rgb))

    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) > 1:
        listed = "; ".join(
            f"'{p.name}' → {tuple(t.shape)}" for p, t in list(zip(files, tensors))[:6]
        )
        raise BatchError(
            f"the images have different shapes after preprocessing ({listed});",
            "use a preprocess that resizes and crops to one size (the default does), "
            "or give images of one size.",
        )

    steps = [
        f"{note} ({_few(names)})" if len(names) < len(files) else note
        for note, names in notes_by_kind.items()
    ]
    steps.append(preprocess_description)
    batch = Batch(
        tensor=torch.stack(tensors),
        labels=None,
        names=[p.name for p in files],
        source=f"{len(files)} image{'s' if len(files) != 1 else ''} from {_origin(paths)}",
        preprocessing="; ".join(steps),
        images=kept,
    )
    if labels is not None:
        batch.labels = parse_labels(labels, len(batch))
    return batch


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


# ---------------------------------------------------------------------------
# Tensor files
# ---------------------------------------------------------------------------


def _found(obj) -> str:
    """What a loaded object is, in words, for error messages."""
    if isinstance(obj, dict):
        if not obj:
            return "an empty dict"
        keys = ", ".join(repr(k) for k in list(obj)[:8])
        more = f" and {len(obj) - 8} more" if len(obj) > 8 else ""
        return f"a dict with keys {keys}{more}"
    if isinstance(obj, (list, tuple)):
        kind = type(obj).__name__
        if not obj:
            return f"an empty {kind}"
        items = "item" if len(obj) == 1 else "items"
        kinds = ", ".join(sorted({type(item).__name__ for item in obj}))
        return f"a {kind} of {len(obj)} {items} ({kinds})"
    return f"a {type(obj).__name__}"


def _pick(obj: dict, keys: Sequence[str]):
    lowered = {k.lower(): k for k in obj if isinstance(k, str)}
    for key in keys:
        if key in lowered:
            return lowered[key], obj[lowered[key]]
    return None, None


def _torch_load(path: Path):
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # a damaged file can fail with KeyError, EOFError, RuntimeError...
        text = str(exc)
        unsafe = re.search(r"Unsupported global: GLOBAL (\S+)", text)
        if unsafe:
            raise BatchError(
                f"file '{path}' holds pickled Python objects ({unsafe.group(1)}), "
                "which gradexplorer does not unpickle because unpickling can run code;",
                _TENSOR_FIX + ".",
            ) from exc
        if path.stat().st_size == 0:
            why = "the file is empty"
        else:
            first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            why = f"{type(exc).__name__}: {first[:200]}"
        raise BatchError(
            f"file '{path}' is not a readable PyTorch file ({why});",
            "choose a file written by torch.save, or " + _TENSOR_FIX + ".",
        ) from exc


def load_tensor_file(path: str | os.PathLike, labels=None) -> Batch:
    """Read a batch saved with ``torch.save``.

    The file is loaded with ``weights_only=True``: it is never unpickled in a way that
    could run code, so files holding custom Python objects are refused.

    Parameters
    ----------
    path : str or path-like
        A file holding one of: a tensor ``(B, ...)``; a dict with the input under
        ``"input"``, ``"inputs"``, ``"x"`` or ``"images"`` and optionally integer
        labels ``(B,)`` under ``"labels"``, ``"label"``, ``"y"`` or ``"targets"``;
        or a gradexplorer capture file, whose ``"input"`` is used.
    labels : str, int, sequence or Tensor, optional
        Class indices (see :func:`parse_labels`); they replace labels in the file.

    Returns
    -------
    Batch
        The tensor as stored, on the CPU and detached. ``uint8`` tensors are taken as
        8-bit images and scaled to float in [0, 1] (said in ``preprocessing``); other
        dtypes, integer token ids included, are kept. The shape is not checked here:
        a single sample saved without its batch dimension is reported by
        :func:`check_batch_shape`.

    Raises
    ------
    BatchError
        The file is missing, empty, damaged, holds pickled objects, holds no input
        tensor, holds a 0-d tensor, or its labels do not fit the input.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise BatchError(
            f"'{path}' does not exist;" if not path.exists() else f"'{path}' is not a file;",
            "choose a .pt file written by torch.save.",
        )
    obj = _torch_load(path)

    file_labels = None
    what = "tensor"
    if isinstance(obj, torch.Tensor):
        tensor = obj
    elif isinstance(obj, dict):
        if obj.get("format") == _CAPTURE_FORMAT:
            key, tensor = _pick(obj, ("input",))
            what = "capture file's input"
            if key is None:
                raise BatchError(
                    f"capture file '{path}' holds no input tensor;",
                    "capture again with the input kept, or give the input another way.",
                )
        else:
            key, tensor = _pick(obj, _INPUT_KEYS)
            if key is None:
                raise BatchError(
                    f"file '{path}' holds {_found(obj)}, but no input tensor;",
                    "store the input under one of the keys "
                    + ", ".join(repr(k) for k in _INPUT_KEYS)
                    + f", or {_TENSOR_FIX}.",
                )
            what = f"{key!r} entry"
        if not isinstance(tensor, torch.Tensor):
            raise BatchError(
                f"the {what} in '{path}' is {_found(tensor)}, not a tensor;", _TENSOR_FIX + "."
            )
        label_key, file_labels = _pick(obj, _LABEL_KEYS)
        if label_key is not None and labels is None and file_labels is not None:
            if not isinstance(file_labels, torch.Tensor):
                raise BatchError(
                    f"the {label_key!r} entry in '{path}' is {_found(file_labels)}, not a tensor;",
                    "store labels as an integer tensor of shape (B,).",
                )
    else:
        raise BatchError(
            f"file '{path}' holds {_found(obj)}, not a tensor;",
            "expected a tensor or a dict with an 'input' tensor: " + _TENSOR_FIX + ".",
        )

    tensor = tensor.detach().to("cpu")
    if tensor.dim() == 0:
        raise BatchError(
            f"the {what} in '{path}' is a single number, not a batch;",
            "save a tensor of shape (B, ...), e.g. (B, 3, 224, 224) for images.",
        )
    preprocessing = "none (tensor used as stored)"
    if tensor.dtype == torch.uint8:
        # uint8 is how 8-bit images are stored; models want floats. Other integer
        # dtypes are usually token or class ids, so they are left alone.
        tensor = tensor.float().div_(255.0)
        preprocessing = "uint8 values scaled to float in [0, 1] (divided by 255)"
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()

    n = int(tensor.shape[0])
    batch = Batch(
        tensor=tensor,
        labels=None,
        names=[f"{path.stem}[{i}]" for i in range(n)],
        source=f"{n} sample{'s' if n != 1 else ''} from {_display_path(path)}",
        preprocessing=preprocessing,
    )
    if labels is not None:
        batch.labels = parse_labels(labels, n)
    elif file_labels is not None:
        batch.labels = _checked_label_tensor(file_labels, n, f"the labels in '{path}'")
    return batch


def _checked_label_tensor(labels: torch.Tensor, n: int, what: str) -> torch.Tensor:
    labels = labels.detach().to("cpu")
    if labels.is_floating_point() and torch.equal(labels, labels.round()):
        labels = labels.long()
    if labels.dtype in (torch.bool,) or labels.is_floating_point() or labels.is_complex():
        raise BatchError(
            f"{what} have dtype {labels.dtype}, not integer class indices;",
            "give labels as integers (class indices), one per sample.",
        )
    if labels.dim() == 0:
        labels = labels.reshape(1)
    if labels.dim() != 1:
        raise BatchError(
            f"{what} have shape {tuple(labels.shape)}; one class index per sample is needed;",
            f"give a tensor of shape ({n},) (for one-hot labels, use labels.argmax(1)).",
        )
    if labels.numel() == 1 and n != 1:
        labels = labels.expand(n)
    if labels.numel() != n:
        raise BatchError(
            f"{what} give {labels.numel()} labels for {n} sample{'s' if n != 1 else ''};",
            "give one label per sample, or a single label for all of them.",
        )
    if n and int(labels.min()) < 0:
        raise BatchError(f"{what} include a negative class index;", "class indices start at 0.")
    return labels.to(torch.int64).clone()


# ---------------------------------------------------------------------------
# Random batches
# ---------------------------------------------------------------------------

_SHAPE_RE = re.compile(r"^\(?\s*\d+(?:\s*[x×,*\s]\s*\d+)*\s*,?\s*\)?$", re.IGNORECASE)
_SHAPE_EXAMPLE = "write the shape as numbers joined by 'x' or ',', e.g. '2x3x224x224' (batch, channels, height, width)."


def _parse_shape(shape: str | Sequence[int]) -> tuple[int, ...]:
    if isinstance(shape, str):
        text = shape.strip()
        if not text or not _SHAPE_RE.match(text):
            raise BatchError(f"'{shape}' is not a shape;", _SHAPE_EXAMPLE)
        dims = tuple(int(d) for d in re.findall(r"\d+", text))
    else:
        try:
            items = list(shape)
            if any(isinstance(d, bool) or float(d) != int(d) for d in items):
                raise ValueError
            dims = tuple(int(d) for d in items)
        except (TypeError, ValueError) as exc:
            raise BatchError(f"{shape!r} is not a shape (sizes must be whole numbers);", _SHAPE_EXAMPLE) from exc
    if not dims:
        raise BatchError("an empty shape was given;", _SHAPE_EXAMPLE)
    if any(d <= 0 for d in dims):
        raise BatchError(f"shape {'x'.join(map(str, dims))} has a size of 0 or less;", "every size must be at least 1.")
    count = 1
    for d in dims:
        count *= d
    if count > MAX_RANDOM_ELEMENTS:
        raise BatchError(
            f"shape {'x'.join(map(str, dims))} has {count:,} values, more than the "
            f"{MAX_RANDOM_ELEMENTS:,} allowed for a random batch;",
            "use a smaller batch or image size.",
        )
    return dims


def random_batch(shape: str | Sequence[int], seed: int | None = 0) -> Batch:
    """A batch of standard normal values.

    Parameters
    ----------
    shape : str or sequence of int
        The full shape, batch first: ``"2x3x224x224"``, ``"2,3,224,224"``,
        ``"(2, 3, 224, 224)"`` or ``(2, 3, 224, 224)``.
    seed : int or None, default 0
        Seed for the values: the same seed gives the same batch. ``None`` picks a fresh
        seed, which is reported in ``Batch.source`` so the batch can be made again.

    Returns
    -------
    Batch
        float32 values drawn from N(0, 1), no labels, no images.

    Raises
    ------
    BatchError
        The shape cannot be parsed, has a size below 1, or is too large.
    """
    dims = _parse_shape(shape)
    generator = torch.Generator()
    if seed is None:
        seed = generator.seed()
    else:
        generator.manual_seed(int(seed))
    tensor = torch.randn(dims, generator=generator)
    n = dims[0]
    return Batch(
        tensor=tensor,
        labels=None,
        names=[f"random[{i}]" for i in range(n)],
        source=f"{n} random sample{'s' if n != 1 else ''} from N(0, 1), seed {seed}",
        preprocessing="none",
    )


# ---------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------


def _normalise_name(name: str) -> str:
    return " ".join(name.replace("_", " ").split()).casefold()


def _label_index(token, categories: Sequence[str] | None) -> int:
    if isinstance(token, bool):
        raise BatchError(f"label {token!r} is not a class index or name;", "give class indices such as 3,1,0.")
    if isinstance(token, int) or (isinstance(token, str) and re.fullmatch(r"[+-]?\d+", token.strip())):
        index = int(token)
        if index < 0:
            raise BatchError(f"label {index} is negative;", "class indices start at 0.")
        if categories is not None and index >= len(categories):
            raise BatchError(
                f"label {index} is out of range: the model has {len(categories)} classes;",
                f"give an index from 0 to {len(categories) - 1}.",
            )
        return index
    if not isinstance(token, str):
        raise BatchError(f"label {token!r} is not a class index or name;", "give class indices such as 3,1,0.")
    name = token.strip()
    if not name:
        raise BatchError("an empty label was given;", "give class indices or names separated by commas, e.g. 3,1,0.")
    if not categories:
        raise BatchError(
            f"label '{name}' is a class name, but the model has no class names;",
            "give class indices such as 3,1,0.",
        )
    wanted = _normalise_name(name)
    normalised = [_normalise_name(c) for c in categories]
    matches = [i for i, c in enumerate(normalised) if c == wanted]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        # ImageNet, for one, has two classes named "crane" (bird and machine).
        raise BatchError(
            f"label '{name}' matches several classes ({', '.join(map(str, matches))});",
            "give the class index instead.",
        )
    close = difflib.get_close_matches(wanted, normalised, n=3, cutoff=0.6)
    if close:
        names = ", ".join(f"'{categories[normalised.index(c)]}'" for c in close)
        fix = f"did you mean {names}?"
    else:
        fix = f"give a class index from 0 to {len(categories) - 1} or one of the model's class names."
    raise BatchError(f"label '{name}' is not one of the model's classes;", fix)


def parse_labels(spec, n: int, categories: Sequence[str] | None = None) -> torch.Tensor:
    """Turn the user's labels into class indices, one per sample.

    Parameters
    ----------
    spec : str, int, sequence of int or str, or Tensor
        ``"3,1,0"``, ``"tabby, tiger cat"``, ``"3"``, ``[3, 1, 0]``... Names are matched
        against ``categories`` ignoring case, underscores and repeated spaces. A single
        label is used for every sample.
    n : int
        The number of samples.
    categories : sequence of str, optional
        The model's class names, index-aligned with its logits; needed for names and
        used to check index range.

    Returns
    -------
    torch.Tensor
        ``(n,)`` int64.

    Raises
    ------
    BatchError
        A label is negative, out of range, an unknown or ambiguous name (close matches
        are suggested), or the number of labels is neither 1 nor ``n``.
    """
    if isinstance(spec, torch.Tensor):
        labels = _checked_label_tensor(spec, n, "the labels")
        if categories is not None and n and int(labels.max()) >= len(categories):
            raise BatchError(
                f"label {int(labels.max())} is out of range: the model has {len(categories)} classes;",
                f"give indices from 0 to {len(categories) - 1}.",
            )
        return labels
    if isinstance(spec, str):
        tokens = [t.strip() for t in spec.split(",")]
        if all(not t for t in tokens):
            raise BatchError("no labels were given;", "give class indices or names separated by commas, e.g. 3,1,0.")
    elif isinstance(spec, int):
        tokens = [spec]
    else:
        try:
            tokens = list(spec)
        except TypeError as exc:
            raise BatchError(f"labels {spec!r} cannot be read;", "give class indices such as 3,1,0.") from exc
    indices = [_label_index(t, categories) for t in tokens]
    if len(indices) == 1:
        indices = indices * n
    if len(indices) != n:
        raise BatchError(
            f"{len(indices)} labels were given for {n} sample{'s' if n != 1 else ''};",
            "give one label per sample, or a single label for all of them.",
        )
    return torch.tensor(indices, dtype=torch.int64)


# ---------------------------------------------------------------------------
# Shape check
# ---------------------------------------------------------------------------


def _fmt_shape(dims: Sequence) -> str:
    inner = ", ".join("?" if d is None else str(d) for d in dims)
    return f"({inner},)" if len(dims) == 1 else f"({inner})"


def check_batch_shape(batch: Batch, input_shape: tuple[int, ...] | None) -> None:
    """Check that a batch can be fed to a model with the given per-sample shape.

    Only the rank and the first per-sample size (channels for images and video,
    features for 1-D inputs) are compared. Spatial and temporal sizes may differ,
    because convolutional networks accept any size; models that need one fixed size
    (vision transformers) fail in forward, where that error is reported.

    Parameters
    ----------
    batch : Batch
        The batch to check.
    input_shape : tuple of int or None
        The model's shape for one sample, e.g. ``(3, 224, 224)``. ``None`` (unknown)
        skips the check; ``None`` entries are not compared.

    Raises
    ------
    BatchError
        The batch's rank differs (a missing batch dimension is named as such) or its
        channel count differs. The message gives the expected shape, e.g.
        ``(B, 3, 224, 224)``, and the one given.
    """
    if input_shape is None:
        return
    given = tuple(batch.tensor.shape)
    expected = ("B", *input_shape)
    expected_text = "(" + ", ".join("?" if d is None else str(d) for d in expected) + ")"
    given_text = _fmt_shape(given)
    if len(given) != len(expected):
        problem = f"the input has shape {given_text}, but the model expects {expected_text}"
        if len(given) == len(input_shape):
            raise BatchError(
                f"{problem}: the batch dimension is missing;",
                "add a batch dimension with x.unsqueeze(0) (for one sample) before saving the input.",
            )
        if len(given) == len(expected) + 1 and given[0] == 1:
            raise BatchError(
                f"{problem}: it has one dimension too many;",
                "remove the extra leading dimension with x.squeeze(0).",
            )
        fix = f"give a tensor with {len(expected)} dimensions, {expected_text}."
        raise BatchError(f"{problem} ({len(given)} dimensions instead of {len(expected)});", fix)

    want = input_shape[0] if input_shape else None
    have = given[1] if len(given) > 1 else None
    if want is not None and have is not None and have != want:
        unit = "channel" if len(input_shape) >= 2 else "feature"
        problem = (
            f"the input has shape {given_text}, but the model expects {expected_text}: "
            f"{have} {unit}{'s' if have != 1 else ''} instead of {want};"
        )
        if unit == "channel" and have == 1 and want == 3:
            fix = (
                "give RGB images (image files are converted to RGB), or repeat the channel "
                "with x.expand(-1, 3, *x.shape[2:])."
            )
        elif unit == "channel" and have == 3 and want == 1:
            fix = "convert to grayscale, e.g. x.mean(1, keepdim=True), or choose a model for RGB inputs."
        elif unit == "channel" and have == 4 and want == 3:
            fix = "drop the alpha channel with x[:, :3], or load the images as files (alpha is composited onto white)."
        else:
            fix = f"give inputs with {want} {unit}s, {expected_text}."
        raise BatchError(problem, fix)


# ---------------------------------------------------------------------------
# Dispatch and description
# ---------------------------------------------------------------------------


def _looks_like_tensor_file(path: Path) -> bool:
    if path.suffix.lower() in TENSOR_SUFFIXES:
        return True
    # torch.save writes a zip archive; this catches capture files and other endings.
    return path.is_file() and path.suffix.lower() not in IMAGE_SUFFIXES and zipfile.is_zipfile(path)


def load_batch(
    sources: Sequence[str],
    model: LoadedModel | None = None,
    labels: str | None = None,
) -> Batch:
    """Make a batch from what the user gave on the command line or in the GUI.

    Parameters
    ----------
    sources : sequence of str
        One of:

        - ``"random:2x3x224x224"`` or a bare shape ``"2x3x224x224"``: :func:`random_batch`
          with seed 0. ``"random"`` alone uses two samples of ``model.input_shape``.
        - one ``.pt``/``.pth`` file (or another ``torch.save`` zip archive, such as a
          capture file): :func:`load_tensor_file`.
        - ``"demo"``: the demo batch of the demo model ``model`` (``core.demos``).
        - image files and folders: :func:`load_images` with the model's preprocess
          (the default ImageNet preprocess when the model has none).
    model : LoadedModel, optional
        Supplies the preprocess, the class names labels are matched against, and the
        input shape the batch is checked against (:func:`check_batch_shape`).
    labels : str, optional
        Class indices or names, e.g. ``"3,1,0"`` or ``"tabby"``; they replace labels
        that came with the batch.

    Returns
    -------
    Batch

    Raises
    ------
    BatchError
        Nothing was given, a path does not exist, a source cannot be read, the labels
        do not fit, or the batch's shape does not fit the model.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    sources = [str(s) for s in sources if str(s).strip()]
    if not sources:
        raise BatchError("no input was given;", _SOURCES_HINT + ".")
    categories = model.categories if model is not None else None
    input_shape = model.input_shape if model is not None else None

    batch: Batch | None = None
    if len(sources) == 1:
        source = sources[0].strip()
        path = Path(source).expanduser()
        lowered = source.lower()
        if lowered == "demo" and not path.exists():
            if model is None:
                raise BatchError("'demo' inputs need a demo model;", "load a model such as 'demo:shapes' first.")
            from core.demos import demo_batch  # written alongside; imported late to keep core light

            batch = demo_batch(model.spec)
        elif (lowered == "random" or lowered.startswith("random:")) and not path.exists():
            rest = source[len("random:"):].strip()
            if rest:
                batch = random_batch(rest, seed=0)
            elif input_shape is not None and all(d is not None for d in input_shape):
                batch = random_batch((2, *input_shape), seed=0)
            else:
                raise BatchError(
                    "'random' needs a shape, and the model's input shape is not known;",
                    "give the full shape, e.g. 'random:2x3x224x224'.",
                )
        elif not path.exists() and _SHAPE_RE.match(source) and re.search(r"\d\D+\d", source):
            batch = random_batch(source, seed=0)
        elif path.exists() and _looks_like_tensor_file(path):
            batch = load_tensor_file(path)
    else:
        tensor_files = [s for s in sources if Path(s).suffix.lower() in TENSOR_SUFFIXES]
        if tensor_files:
            raise BatchError(
                f"'{tensor_files[0]}' is a tensor file, which must be the only input;",
                "give either one .pt file or image files and folders.",
            )

    if batch is None:
        for source in sources:
            if not Path(source).expanduser().exists():
                raise BatchError(f"'{source}' does not exist;", "check the path, or " + _SOURCES_HINT + ".")
        if model is not None and model.preprocess is not None:
            batch = load_images(sources, model.preprocess, model.preprocess_description)
        else:
            batch = load_images(sources)

    if labels is not None and str(labels).strip():
        batch.labels = parse_labels(labels, len(batch), categories)
    check_batch_shape(batch, input_shape)
    return batch


def describe(batch: Batch) -> str:
    """One line about a batch, for status bars and the CLI.

    Parameters
    ----------
    batch : Batch

    Returns
    -------
    str
        E.g. ``"8 images (3×224×224) from ~/cats, preprocessing: resize ..."``.
    """
    tensor = batch.tensor
    sample = "×".join(str(d) for d in tensor.shape[1:]) if tensor.dim() > 1 else "scalar"
    source = batch.source
    head, sep, tail = source.partition(" from ")
    if sep and head[:1].isdigit():
        text = f"{head} ({sample}) from {tail}"
    else:
        n = int(tensor.shape[0]) if tensor.dim() else 1
        text = f"{n} sample{'s' if n != 1 else ''} ({sample}) from {source}"
    if batch.labels is not None:
        text += ", with labels"
    return f"{text}, preprocessing: {batch.preprocessing}"
