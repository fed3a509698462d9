"""Files that hold Python objects: pickled ``nn.Module``s and ``torch.export`` archives.

Both run code when loaded, so both need the user's trust. Every file is first read with
``weights_only=True``; only when that fails because the file holds Python objects is it
unpickled, and only with ``trust``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from gradexplorer.base.errors import ModelLoadError, TrustRequired, listing
from gradexplorer.files.pickle_scan import refusal, short_reason
from gradexplorer.models.files import import_path, not_a_checkpoint
from gradexplorer.models.input_size import declared_input_shape
from gradexplorer.models.loaded_model import LoadedModel

#: Where whole models sit inside a checkpoint dict.
MODULE_KEYS = ("model", "module", "net")
TRUST_FIX = "Load it only if you trust where it came from: pass --trust."


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
    refused = refusal(path, safe_error)
    if refused is None:
        raise not_a_checkpoint(path, "model file", short_reason(safe_error)) from safe_error
    if not trust:
        raise TrustRequired(
            f"Loading '{path}' would run code: {refused.reason()}; it holds pickled Python "
            f"objects ({listing(refused.globals, 6)}), not just tensors.",
            TRUST_FIX + " Safer: save model.state_dict() and load it with --arch.",
            subject=f"the model file '{path.resolve()}'",
        )
    try:
        # The classes of a pickled model usually live in the user's own module: look in
        # the current folder as `python -m gradexplorer` does (the console script's path lacks it).
        with import_path(Path.cwd()):
            return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # whatever the pickled code raises
        raise _unpickling_failed(path, exc) from exc


def _unpickling_failed(path: Path, exc: Exception) -> ModelLoadError:
    text = str(exc)
    if "__main__" in text or "__mp_main__" in text:
        return ModelLoadError(
            f"'{path}' could not be unpickled: its model class was defined in a script that "
            f"was run directly (__main__), which no other program can import ({text}).",
            "Move the class into a module file (e.g. nets.py), import it from the script, "
            "and save again; or save model.state_dict() and load it with --arch or a factory.",
        )
    if isinstance(exc, (ModuleNotFoundError, AttributeError)):
        missing = getattr(exc, "name", None) or text
        return ModelLoadError(
            f"'{path}' could not be unpickled: the code that defines the model is not "
            f"importable ({type(exc).__name__}: {text}).",
            f"Run gradexplorer from the folder that holds {missing} (or its package), or add "
            "that folder to PYTHONPATH, or install its package.",
        )
    return ModelLoadError(
        f"'{path}' could not be unpickled: {type(exc).__name__}: {text}",
        "Make the code that defined the model importable (run from its project folder or "
        "install its package), or save a state dict instead.",
    )


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
        input_shape=declared_input_shape(module),
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
            subject=f"the torch.export archive '{path.resolve()}'",
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
