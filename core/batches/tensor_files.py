"""Tensor files written by ``torch.save``, read safely into a batch.

Files are loaded with ``weights_only=True`` only: nothing in them can run code.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from core.batch import Batch
from core.batches.images import IMAGE_SUFFIXES
from core.batches.labels import checked_label_tensor, parse_labels
from core.batches.paths import display_path
from core.errors import BatchError

TENSOR_SUFFIXES = frozenset({".pt", ".pth"})

_INPUT_KEYS = ("input", "inputs", "x", "images")
_LABEL_KEYS = ("labels", "label", "y", "targets")
_CAPTURE_FORMAT = "gradexplorer.capture"
_TENSOR_FIX = (
    "save the input as a plain tensor, torch.save(x, 'input.pt'), "
    "or as a dict, torch.save({'input': x, 'labels': y}, 'input.pt')"
)


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
    found = _find_input(obj, path, want_labels=labels is None)
    tensor, preprocessing = _as_batch_tensor(found.tensor, found.what, path)
    n = int(tensor.shape[0])
    batch = Batch(
        tensor=tensor,
        labels=None,
        names=[f"{path.stem}[{i}]" for i in range(n)],
        source=f"{n} sample{'s' if n != 1 else ''} from {display_path(path)}",
        preprocessing=preprocessing,
    )
    if labels is not None:
        batch.labels = parse_labels(labels, n)
    elif found.labels is not None:
        batch.labels = checked_label_tensor(found.labels, n, f"the labels in '{path}'")
    return batch


class _FoundInput(NamedTuple):
    tensor: torch.Tensor
    what: str
    """How the input is named in messages ("tensor", "'x' entry")."""
    labels: torch.Tensor | None


def _find_input(obj: object, path: Path, *, want_labels: bool) -> _FoundInput:
    # The input tensor and the labels stored with it, from what torch.load returned.
    if isinstance(obj, torch.Tensor):
        return _FoundInput(obj, "tensor", None)
    if not isinstance(obj, dict):
        raise BatchError(
            f"file '{path}' holds {_found(obj)}, not a tensor;",
            "expected a tensor or a dict with an 'input' tensor: " + _TENSOR_FIX + ".",
        )
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
    if label_key is not None and want_labels and file_labels is not None:
        if not isinstance(file_labels, torch.Tensor):
            raise BatchError(
                f"the {label_key!r} entry in '{path}' is {_found(file_labels)}, not a tensor;",
                "store labels as an integer tensor of shape (B,).",
            )
    return _FoundInput(tensor, what, file_labels)


def _as_batch_tensor(tensor: torch.Tensor, what: str, path: Path) -> tuple[torch.Tensor, str]:
    # The stored tensor as a dense CPU batch, and the preprocessing that took, in words.
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
    return tensor, preprocessing


def looks_like_tensor_file(path: Path) -> bool:
    """Whether ``path`` is read as a tensor file (by ending, or a zip archive)."""
    if path.suffix.lower() in TENSOR_SUFFIXES:
        return True
    # torch.save writes a zip archive; this catches capture files and other endings.
    return path.is_file() and path.suffix.lower() not in IMAGE_SUFFIXES and zipfile.is_zipfile(path)

