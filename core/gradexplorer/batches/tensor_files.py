"""Tensor files written by ``torch.save``, read safely into a batch.

Files are loaded with ``weights_only=True`` only: nothing in them can run code.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from gradexplorer.base import tensor_memory
from gradexplorer.base.errors import BatchError, listing
from gradexplorer.batches.images import IMAGE_SUFFIXES
from gradexplorer.batches.labels import LabelSpec, checked_label_tensor, parse_labels
from gradexplorer.batches.paths import display_path
from gradexplorer.capturing.inputs import Batch, ModelInputs
from gradexplorer.files.capture_file import FORMAT as CAPTURE_FORMAT
from gradexplorer.files.pickle_scan import refusal, short_reason

TENSOR_SUFFIXES = frozenset({".pt", ".pth"})

_INPUT_KEYS = ("input", "inputs", "x", "images")
_LABEL_KEYS = ("labels", "label", "y", "targets")
_TENSOR_FIX = (
    "save the input as a plain tensor, torch.save(x, 'input.pt'), "
    "or as a dict, torch.save({'input': x, 'labels': y}, 'input.pt')"
)


def _found(obj: object) -> str:
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


def _pick(obj: dict, keys: Sequence[str]) -> tuple[str | None, object]:
    lowered = {k.lower(): k for k in obj if isinstance(k, str)}
    for key in keys:
        if key in lowered:
            return lowered[key], obj[lowered[key]]
    return None, None


def _torch_load(path: Path) -> object:
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # a damaged file can fail with KeyError, EOFError, RuntimeError...
        refused = refusal(path, exc)
        if refused is not None:
            raise BatchError(
                f"file '{path}' holds pickled Python objects, which gradexplorer does not "
                f"unpickle because unpickling can run code ({refused.reason()});",
                _TENSOR_FIX + ".",
            ) from exc
        if path.stat().st_size == 0:
            why = "the file is empty"
        else:
            why = f"{type(exc).__name__}: {short_reason(exc)[:200]}"
        raise BatchError(
            f"file '{path}' is not a readable PyTorch file ({why});",
            "choose a file written by torch.save, or " + _TENSOR_FIX + ".",
        ) from exc


#: A probe or capture forward on one sample holds at least this many times its size
#: (activations of the first layers, their gradients): a sample larger than the budget over
#: this is refused before the model sees it.
SAMPLE_WORK_FACTOR = 16


def load_tensor_file(path: str | os.PathLike, labels: LabelSpec | None = None,
                     memory_budget: int | None = None, forward_args: Collection[str] | None = None) -> Batch:
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

        For a model of several inputs: a tuple or list of tensors (positional
        arguments), or a dict of entries named like the forward's parameters (keyword
        arguments, labels apart), stored as is or under ``"input"``/``"inputs"``. They
        go into ``Batch.inputs``; the first tensor is ``Batch.tensor``. Every other entry
        stored beside ``"input"``, tensor or not (a padding mask, ``scale=3.0``), is a
        keyword argument too; an entry whose key is not a Python name, or a list or dict
        holding tensors, is refused by name. Nothing in the file is left out, except labels
        the forward does not take (the batch's labels) and labels replaced by ``labels``.
    labels : str, int, sequence or Tensor, optional
        Class indices (see :func:`parse_labels`); they replace labels in the file.
    forward_args : collection of str, optional
        The parameters the model's forward names. A labels entry (``"labels"``,
        ``"label"``, ``"y"``, ``"targets"``) whose key is one of them is passed to the
        forward under that name (a Hugging Face model's ``labels``, per-token labels of a
        language model included) rather than taken out; it is also the batch's labels
        when it holds one class index per sample.
    memory_budget : int, optional
        Bytes (``--memory-budget``); by default half the free RAM. Every tensor in the file
        is measured by the elements its sizes declare (an expanded, stride-0 view stored in
        a few bytes counts in full) before anything makes it dense; a sample that, times
        ``SAMPLE_WORK_FACTOR``, exceeds the budget is refused before the model runs.

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
    TensorTooLarge
        A tensor, or one sample's forward, does not fit the memory budget.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise BatchError(
            f"'{path}' does not exist;" if not path.exists() else f"'{path}' is not a file;",
            "choose a .pt file written by torch.save.",
        )
    obj = _torch_load(path)
    found = _find_input(obj, path, want_labels=labels is None, forward_args=forward_args)
    _check_fits(found, path, memory_budget)
    tensor, preprocessing = _as_batch_tensor(found.tensor, found.what, path)
    inputs = None
    if found.inputs is not None:
        # Every input as stored, the primary one checked and converted like a single input.
        inputs = found.inputs.map(
            lambda t: tensor if t is found.tensor else _as_batch_tensor(t, found.what, path, any_rank=True)[0]
        )
    n = int(tensor.shape[0])
    source = f"{n} sample{'s' if n != 1 else ''} from {display_path(path)}"
    if inputs is not None:
        count = len(inputs.args) + len(inputs.kwargs)
        source += f" ({count} inputs: {_argument_names(inputs)})"
    batch = Batch(
        tensor=tensor,
        labels=None,
        names=[f"{path.stem}[{i}]" for i in range(n)],
        source=source,
        preprocessing=preprocessing,
        inputs=inputs,
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
    inputs: ModelInputs | None = None
    """Every argument, for a model of several inputs (``tensor`` is the first)."""


def _several(value: object) -> ModelInputs | None:
    # A tuple or list of tensors is positional arguments.
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return ModelInputs(args=tuple(value))
    return None


def _argument_names(inputs: ModelInputs) -> str:
    names = [f"#{i + 1}" for i in range(len(inputs.args))] + list(inputs.kwargs)
    return ", ".join(names)


def _holds_tensor(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    return False


def _keyword_arguments(entries: dict, path: Path) -> dict[str, object]:
    """Entries of a stored dict as keyword arguments of the forward: tensors and plain
    values (``scale=3.0``) alike, each passed under its key. A key that cannot be a keyword
    argument, and a container of tensors (whose tensors no check would see), are refused
    by name: nothing in the file is left out in silence."""
    not_names = [repr(k) for k in entries if not (isinstance(k, str) and k.isidentifier())]
    if not_names:
        one = len(not_names) == 1
        raise BatchError(
            f"the {'entry' if one else 'entries'} {listing(not_names)} in '{path}' cannot be passed to the "
            f"forward: {'its key is' if one else 'their keys are'} not a Python name, so not a keyword argument;",
            "save every entry under the name of the forward's argument it is (key_padding_mask, not "
            "key-padding-mask), or leave it out of the file.",
        )
    nested = [repr(k) for k, v in entries.items() if isinstance(v, (dict, list, tuple)) and _holds_tensor(v)]
    if nested:
        raise BatchError(
            f"the {'entry' if len(nested) == 1 else 'entries'} {listing(nested)} in '{path}' "
            f"{'holds' if len(nested) == 1 else 'hold'} tensors inside a list or dict;",
            "save each tensor under its own key, named after the forward's argument it is "
            "(or the positional inputs as a tuple under 'input').",
        )
    return dict(entries)


def _find_input(obj: object, path: Path, *, want_labels: bool,
                forward_args: Collection[str] | None = None) -> _FoundInput:
    # The input tensor and the labels stored with it, from what torch.load returned.
    if isinstance(obj, torch.Tensor):
        return _FoundInput(obj, "tensor", None)
    several = _several(obj) if isinstance(obj, (tuple, list)) else None
    if several is not None:
        return _FoundInput(several.primary, "first input", None, several)
    if isinstance(obj, dict) and obj.get("format") != CAPTURE_FORMAT:
        return _from_dict(obj, path, want_labels=want_labels, forward_args=forward_args)
    if not isinstance(obj, dict):
        raise BatchError(
            f"file '{path}' holds {_found(obj)}, not a tensor;",
            "expected a tensor or a dict with an 'input' tensor: " + _TENSOR_FIX + ".",
        )
    key, tensor = _pick(obj, ("input",))
    what = "capture file's input"
    if key is None:
        raise BatchError(
            f"capture file '{path}' holds no input tensor;",
            "capture again with the input kept, or give the input another way.",
        )
    if not isinstance(tensor, torch.Tensor):
        raise BatchError(
            f"the {what} in '{path}' is {_found(tensor)}, not a tensor;", _TENSOR_FIX + "."
        )
    return _FoundInput(tensor, what, _file_labels(obj, path, want_labels))


def _from_dict(obj: dict, path: Path, *, want_labels: bool,
               forward_args: Collection[str] | None) -> _FoundInput:
    """A stored dict as the forward's arguments. The entry under an input key (``input``,
    ``inputs``, ``x``, ``images``) is the positional input (a tuple or list: several;
    a dict: keyword arguments); every other entry, tensor or not, is a keyword argument
    under its key, except the labels when the forward does not take them."""
    key, value = _pick(obj, _INPUT_KEYS)
    labels_key, _ = _pick(obj, _LABEL_KEYS)
    # Labels under a name the forward takes (a Hugging Face model's labels) are one of
    # its arguments: passed, never taken out.
    labels_are_argument = labels_key is not None and forward_args is not None and labels_key in forward_args
    apart = () if labels_are_argument else (labels_key,)
    rest = {k: v for k, v in obj.items() if k != key and k not in apart}
    if key is None:
        # Named entries and no input key: keyword arguments, when at least one is a tensor.
        # Without the model's forward to say which names it takes, only a dict of tensors
        # is taken as its arguments (a dict with an epoch count beside tensors is more
        # likely a checkpoint than a batch).
        tensors_only = bool(rest) and all(isinstance(v, torch.Tensor) for v in rest.values())
        if not any(isinstance(v, torch.Tensor) for v in rest.values()) or (
                forward_args is None and not tensors_only):
            raise BatchError(
                f"file '{path}' holds {_found(obj)}, but no input tensor;",
                "store the input under one of the keys "
                + ", ".join(repr(k) for k in _INPUT_KEYS)
                + f", or {_TENSOR_FIX}.",
            )
        several = ModelInputs(kwargs=_keyword_arguments(rest, path))
    else:
        what = f"{key!r} entry"
        extra = _keyword_arguments(rest, path)
        if isinstance(value, torch.Tensor):
            if not extra:
                return _FoundInput(value, what, _file_labels(obj, path, want_labels))
            several = ModelInputs(args=(value,), kwargs=extra)
        elif (positional := _several(value)) is not None:
            several = ModelInputs(args=positional.args, kwargs=extra)
        elif isinstance(value, dict) and any(isinstance(v, torch.Tensor) for v in value.values()):
            named = _keyword_arguments(value, path)
            twice = [repr(k) for k in named if k in extra]
            if twice:
                raise BatchError(
                    f"{listing(twice)} is stored both inside the {what} and beside it in '{path}';",
                    "keep one of them.",
                )
            several = ModelInputs(kwargs={**named, **extra})
        else:
            raise BatchError(
                f"the {what} in '{path}' is {_found(value)}, not a tensor;", _TENSOR_FIX + "."
            )
    file_labels = _file_labels(obj, path, want_labels)
    if labels_are_argument and file_labels is not None and file_labels.dim() != 1:
        file_labels = None  # per-token labels: the forward's, not one class per sample
    return _FoundInput(several.primary, "first input", file_labels, several)


def _file_labels(obj: dict, path: Path, want_labels: bool) -> torch.Tensor | None:
    label_key, file_labels = _pick(obj, _LABEL_KEYS)
    if label_key is None or not want_labels or file_labels is None:
        return None  # the user's labels replace the file's: whatever they are, they are not read
    if not isinstance(file_labels, torch.Tensor):
        raise BatchError(
            f"the {label_key!r} entry in '{path}' is {_found(file_labels)}, not a tensor;",
            "store labels as an integer tensor of shape (B,).",
        )
    return file_labels


def _check_fits(found: _FoundInput, path: Path, budget: int | None) -> None:
    """Every input, whole and one sample of it at work, within the memory budget."""
    tensors = [found.tensor] if found.inputs is None else [
        t for t in (*found.inputs.args, *found.inputs.kwargs.values()) if isinstance(t, torch.Tensor)]
    if found.labels is not None:
        tensors.append(found.labels)
    fix = (f"save a smaller batch or smaller samples in '{path.name}', or raise --memory-budget "
           "if this machine has the memory.")
    for t in tensors:
        tensor_memory.check_tensor_fits(t, f"the {found.what} in '{path.name}'", budget, fix=fix)
        if t.dim() >= 1 and t.shape[0] > 0:
            tensor_memory.check_tensor_fits(t[:1], f"one sample of the {found.what} in '{path.name}'", budget,
                                            factor=SAMPLE_WORK_FACTOR, fix=fix)


def _as_batch_tensor(
    tensor: torch.Tensor, what: str, path: Path, *, any_rank: bool = False
) -> tuple[torch.Tensor, str]:
    # The stored tensor as a dense CPU batch, and the preprocessing that took, in words.
    tensor = tensor.detach().to("cpu")
    if tensor.dim() == 0 and not any_rank:
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

