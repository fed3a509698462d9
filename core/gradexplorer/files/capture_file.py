"""The ``.pt`` capture file: a user-facing contract (docs/capture.md, "The .pt capture format").

Only plain containers, tensors, strings, numbers, booleans and None are written, so
``torch.load(path, weights_only=True)`` opens a file anywhere, without gradexplorer.
Writes go through :mod:`gradexplorer.base.file_write`: atomic (a temporary file in the same folder,
flushed and fsynced, then renamed over the target; on any failure the temporary file is
removed and an existing file of that name is left as it was), and never over a special file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import torch

from gradexplorer.base import tensor_memory
from gradexplorer.base.errors import CaptureFileError
from gradexplorer.base.file_write import atomic_write
from gradexplorer.base.units import format_bytes
from gradexplorer.capturing.data import CallRecord, Capture, LayerRecord
from gradexplorer.files.meta import upgrade_meta
from gradexplorer.files.pickle_scan import refusal, short_reason
from gradexplorer.files.schema import check_capture_data, kind_of
from gradexplorer.stats.record import TensorStats

FORMAT = "gradexplorer.capture"
VERSION = 2
# Version 1: the window's and the CLI's metadata keys differed (gradexplorer.files.meta reads
# both). Version 2: one metadata schema (gradexplorer.files.meta), and the top-level "graph"
# and "nonfinite_onset" entries (None when absent). Later additions within version 2 are
# optional keys that older files lack and older readers ignore: a call's "absent" and a
# layer's "param_absent" (why a gradient is missing, in words), the root module's layer "".
READABLE_VERSIONS = (1, 2)


def _plain(obj: Any) -> Any:
    """Only builtin containers and scalars, so that ``weights_only`` loading accepts them
    (``torch.__version__`` is a ``str`` subclass that it would refuse)."""
    if obj is None or isinstance(obj, (bool, torch.Tensor)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, dict):
        return {_plain(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return str(obj)


def _plain_stats(stats: TensorStats | None) -> dict[str, Any] | None:
    """A statistics record as the file holds it (``hist_range`` and ``overflow`` lists)."""
    if stats is None:
        return None
    return _plain(stats)


def capture_to_dict(cap: Capture) -> dict:
    """The capture as the plain nested dict that ``save_capture`` writes."""
    layers = {}
    for name, rec in cap.layers.items():
        layers[name] = {
            "type": str(rec.type),
            "calls": [
                {
                    "activation": c.activation,
                    "grad_output": c.grad_output,
                    "grad_input": c.grad_input,
                    "output_key": c.output_key,
                    "shape": list(c.shape),
                    "dtype": c.dtype,
                    "stats": {k: _plain_stats(v) for k, v in c.stats.items()},
                    "absent": _plain(dict(c.absent)),
                }
                for c in rec.calls
            ],
            "param_grads": dict(rec.param_grads),
            "param_stats": {k: _plain_stats(v) for k, v in rec.param_stats.items()},
            "param_absent": _plain(dict(rec.param_absent)),
        }
    meta = _plain(dict(cap.meta))
    meta["layer_order"] = list(cap.layer_order)
    return {
        "format": FORMAT,
        "version": VERSION,
        "meta": meta,
        "input": cap.input,
        "input_grad": cap.input_grad,
        "output": cap.output,
        "layers": layers,
        "graph": _plain(cap.graph),
        "nonfinite_onset": _plain(cap.nonfinite_onset),
        "model_inputs": _plain(cap.model_inputs),
    }


def _stats_back(stats: Mapping[str, Any] | None) -> TensorStats | None:
    """A statistics record from the file (``gradexplorer.files.schema.STATS`` has checked it),
    ``hist_range`` a tuple again."""
    if stats is None:
        return None
    out = dict(stats)
    out["hist_range"] = tuple(stats["hist_range"])
    return cast(TensorStats, out)


def capture_from_dict(data: dict, source: str = "the file") -> Capture:
    """Rebuild a ``Capture`` from ``capture_to_dict``'s output.

    The format and version are read first, then the whole file is checked against
    :mod:`gradexplorer.files.schema` before any field is used, so a damaged or hand-edited file
    gives one message naming the field, never an error deep in a reader.

    Raises
    ------
    CaptureFileError
        Not a capture, a version this gradexplorer does not read, or a field that breaks
        the schema.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CaptureFileError(
            f"{source} is not a gradexplorer capture file.",
            "Open a .pt file that gradexplorer exported (its 'format' entry is 'gradexplorer.capture').",
        )
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise CaptureFileError(
            f"{source}: field version is {kind_of(version)}, expected an integer (the capture format version).",
            "The file is not a valid gradexplorer capture; export the capture again.",
        )
    if version < min(READABLE_VERSIONS):
        raise CaptureFileError(
            f"{source}: field version is {version}, not a capture format version (they start at 1).",
            "The file is not a valid gradexplorer capture; export the capture again.",
        )
    if version not in READABLE_VERSIONS:
        raise CaptureFileError(
            f"{source} was written by a newer gradexplorer (capture format version {version}; "
            f"this one reads up to {VERSION}).",
            "Update gradexplorer to open it.",
        )
    check_capture_data(data, source)
    layers = {}
    for name, rec in data["layers"].items():
        calls = [
            CallRecord(
                activation=c.get("activation"),
                grad_output=c.get("grad_output"),
                grad_input=c.get("grad_input"),
                stats={k: _stats_back(v) for k, v in c["stats"].items()},
                output_key=c.get("output_key", ""),
                shape=tuple(c.get("shape", ())),
                dtype=c.get("dtype", ""),
                absent=dict(c.get("absent") or {}),
            )
            for c in rec["calls"]
        ]
        layers[name] = LayerRecord(
            rec["type"], calls, dict(rec.get("param_grads", {})),
            {k: _stats_back(v) for k, v in rec.get("param_stats", {}).items()},
            dict(rec.get("param_absent") or {}),
        )
    meta = upgrade_meta(dict(data["meta"]), version, data.get("input"))
    return Capture(meta, data.get("input"), data.get("output"), data.get("input_grad"), layers,
                   data.get("graph"), data.get("nonfinite_onset"), data.get("model_inputs"))


def atomic_save(obj: object, path: str | os.PathLike, saver: Callable[[Any, Any], object] | None = None,
                expected_size: int | None = None) -> Path:
    """Write ``obj`` with ``saver(obj, file)`` (default ``torch.save``) through
    :func:`gradexplorer.base.file_write.atomic_write`: never a half-written file, never a special file
    replaced. With ``expected_size`` (bytes), a disk with less free space is refused before
    anything is written.

    Raises
    ------
    CaptureFileError
        Folder missing or read-only, disk full, a folder or special file as ``path``, or any
        other write failure; no partial file is left behind.
    gradexplorer.base.file_write.SaveInterrupted
        Ctrl+C or SIGTERM during the save; nothing was saved.
    """
    save: Callable[[Any, Any], object] = saver or torch.save
    return atomic_write(path, lambda fh: save(obj, fh), expected_size=expected_size, error=CaptureFileError)


def _tensor_bytes(obj: object) -> int:
    """The bytes of the tensors in plain containers: about the size of their ``torch.save`` file."""
    if isinstance(obj, torch.Tensor):
        return obj.nelement() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def save_capture(cap: Capture, path: str | os.PathLike) -> Path:
    """Export a capture to ``path`` (atomically; refused at once when the disk has less free
    space than its tensors take). docs/capture.md documents the format. Tensors a capture kept on
    its GPU are copied to the host first: the file loads anywhere."""
    data = capture_to_dict(cap.on_host())
    return atomic_save(data, path, expected_size=_tensor_bytes(data))


def load_capture(path: str | os.PathLike) -> Capture:
    """Open a capture file written by ``save_capture``.

    Raises
    ------
    CaptureFileError
        Missing, unreadable, foreign or newer-version files; never runs pickled code.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise CaptureFileError(f"There is no file '{path}'.", "Check the path.")
    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - torch.load raises many types for bad files
        refused = refusal(path, exc)  # never torch's advice to load it unsafely
        why = refused.reason() if refused is not None else short_reason(exc)[:200]
        raise CaptureFileError(
            f"'{path.name}' cannot be read as a capture file ({why}).",
            "Open a .pt file that gradexplorer exported.",
        ) from None
    _check_declared_memory(data, path)
    return capture_from_dict(data, source=f"'{path.name}'")


def _check_declared_memory(data: object, path: Path) -> None:
    """Refuse a capture whose tensors declare more memory than the budget, before anything
    makes them dense (a stride-0 view stored in a few bytes can declare 10^12 elements)."""
    limit = tensor_memory.read_budget()
    if limit is None:
        return
    total = 0
    stack: list[tuple[str, object]] = [("", data)]
    seen = 0
    while stack and seen < 1_000_000:
        name, obj = stack.pop()
        seen += 1
        if isinstance(obj, torch.Tensor):
            what = f"the tensor '{name or 'capture'}' of '{path.name}'"
            fix = "this capture cannot be opened within the memory; it was not read further."
            tensor_memory.check_tensor_fits(obj, what, fix=fix)
            total += tensor_memory.declared_bytes(obj)
            if total > limit:
                raise tensor_memory.TensorTooLarge(
                    f"the tensors of '{path.name}' declare more than {format_bytes(limit)}, "
                    "the memory budget (half of the free RAM);", fix)
        elif isinstance(obj, dict):
            stack.extend((f"{name}.{k}" if name else str(k), v) for k, v in obj.items())
        elif isinstance(obj, (list, tuple)):
            stack.extend((f"{name}[{i}]", v) for i, v in enumerate(obj))
