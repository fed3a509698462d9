"""Files that hold Python objects: pickled ``nn.Module``s and ``torch.export`` archives.

Both run code when loaded, so both need the user's trust. Every file is first read with
``weights_only=True``; only when that fails because the file holds Python objects is it
unpickled, and only with ``trust``.
"""

from __future__ import annotations

import pickletools
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from core.errors import ModelLoadError, TrustRequired
from core.loaded_model import LoadedModel
from core.weights import short_reason

#: Where whole models sit inside a checkpoint dict.
MODULE_KEYS = ("model", "module", "net")
TRUST_FIX = "Load it only if you trust where it came from: pass --trust."


def listing(keys: list[str], limit: int = 4) -> str:
    """The first ``limit`` of ``keys`` and how many more, for messages."""
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def read_checkpoint(path: Path, *, trust: bool) -> object:
    """Read a ``torch.save`` file, unpickling Python objects only with ``trust``.

    Parameters
    ----------
    path : Path
        The file.
    trust : bool
        Whether a file that holds Python objects may be unpickled (which runs code).

    Returns
    -------
    object
        What the file holds, tensors on the CPU.

    Raises
    ------
    ModelLoadError
        The file is damaged, or unpickling it failed.
    TrustRequired
        The file holds Python objects and ``trust`` is false.
    """
    try:
        with warnings.catch_warnings():
            # Raw pickles made with pickle.dump trip this; the safe unpickler still applies.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - damaged and unsafe files raise many different types
        safe_error = exc
    unsafe = unsafe_globals(path, safe_error)
    if not unsafe:
        raise ModelLoadError(
            f"'{path}' cannot be read as a PyTorch checkpoint: {short_reason(safe_error)}",
            "Check that the file is complete and was written by torch.save.",
        ) from safe_error
    if not trust:
        raise TrustRequired(
            f"Loading '{path}' would run code: it holds pickled Python objects "
            f"({listing(unsafe, 6)}), not just tensors.",
            TRUST_FIX + " Safer: save model.state_dict() and load it with --arch.",
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # whatever the pickled code raises
        raise ModelLoadError(
            f"'{path}' could not be unpickled: {type(exc).__name__}: {exc}",
            "Make the code that defined the model importable (run from its project folder or "
            "install its package), or save a state dict instead.",
        ) from exc


def unsafe_globals(path: Path, error: Exception) -> list[str]:
    """The Python globals a file would import when unpickled, without unpickling it."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - only zip checkpoints are supported; the error message names the rest
        # Legacy torch.save files get this far and the error names the global; plain pickle
        # files stop earlier (on an opcode the safe unpickler lacks), so read their opcodes.
        found = re.findall(r"GLOBAL ([\w.]+)", str(error)) or pickle_globals(path)
    return list(dict.fromkeys(found))


def pickle_globals(path: Path) -> list[str]:
    """The globals a plain pickle file would import, read without unpickling anything."""
    found: list[str] = []
    pushed: list[str | None] = []  # recent string pushes, to name STACK_GLOBAL's operands
    memo: dict[int, str | None] = {}
    try:
        with open(path, "rb") as stream:
            for opcode, arg, _pos in pickletools.genops(stream):
                name = opcode.name
                if name == "GLOBAL" and isinstance(arg, str):
                    found.append(arg.replace(" ", "."))
                elif name == "STACK_GLOBAL":
                    if len(pushed) >= 2 and pushed[-2] and pushed[-1]:
                        found.append(f"{pushed[-2]}.{pushed[-1]}")
                elif name == "MEMOIZE":
                    memo[len(memo)] = pushed[-1] if pushed else None
                elif name.endswith("PUT"):
                    memo[arg] = pushed[-1] if pushed else None
                elif name.endswith("GET"):
                    pushed.append(memo.get(arg))
                elif isinstance(arg, str) and ("UNICODE" in name or "STRING" in name):
                    pushed.append(arg)
    except Exception:  # noqa: BLE001 - not a pickle, or a damaged one: report what was seen
        pass
    return found


def pickled_module(obj: object, path: Path, *, spec: str, arch: str | None) -> LoadedModel:
    """The model inside an unpickled checkpoint: the object itself or a dict entry.

    Raises
    ------
    ModelLoadError
        The file holds no ``nn.Module``, or an architecture was given for a whole model.
    """
    module = obj if isinstance(obj, nn.Module) else None
    if module is None and isinstance(obj, Mapping):
        module = next((obj[k] for k in MODULE_KEYS if isinstance(obj.get(k), nn.Module)), None)
    if module is None:
        raise ModelLoadError(
            f"'{path}' holds a {type(obj).__name__}, neither a model nor a state dict.",
            "Save the model with torch.save(model.state_dict(), path) or torch.save(model, path).",
        )
    if arch is not None:
        raise ModelLoadError(
            f"'{path}' holds a whole model; an architecture cannot be chosen for it.",
            "Leave --arch out.",
        )
    return LoadedModel(
        module=module.eval(),
        spec=spec,
        name=f"{type(module).__name__} ({path.name})",
        weights=f"file:{path}",
        task="other",
        notes=["unpickled from a trusted file"],
    )


def load_export(path: Path, *, spec: str, trust: bool) -> LoadedModel:
    """Load a ``torch.export`` archive (trusted only), with its submodules restored.

    Raises
    ------
    TrustRequired
        ``trust`` is false: loading the archive unpickles data.
    ModelLoadError
        The archive is damaged.
    """
    if not trust:
        raise TrustRequired(
            f"'{path}' is a torch.export archive; loading it unpickles data, which can run code.",
            TRUST_FIX,
        )
    try:
        program = torch.export.load(path)
    except Exception as exc:  # damaged archives raise many different types
        raise ModelLoadError(
            f"'{path}' cannot be read as a torch.export archive: {short_reason(exc)}",
            "Check that the file is complete and was written by torch.export.save.",
        ) from exc
    # ep.module() is flat; unflatten restores the submodules so hooks on children fire.
    module = torch.export.unflatten(program)
    notes = ["torch.export program: train/eval behaviour was fixed when it was exported"]
    input_shape = None
    example = getattr(program, "example_inputs", None)
    if example and example[0] and isinstance(example[0][0], torch.Tensor):
        first = example[0][0]
        input_shape = tuple(first.shape[1:])
        notes.append(
            f"exported with batch size {first.shape[0]}; other sizes work only if it was "
            "exported with dynamic shapes"
        )
    return LoadedModel(
        module=module.eval(),
        spec=spec,
        name=f"exported program ({path.name})",
        weights=f"file:{path}",
        input_shape=input_shape,
        task="other",
        notes=notes,
    )
