"""State dicts: finding one inside a checkpoint, and fitting it to a model."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from core.errors import ModelLoadError, listing
from core.models.files import check_file
from core.pickle_scan import refusal, short_reason

#: Where state dicts sit inside a checkpoint dict.
STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model")
#: Prefixes that wrappers add to every key: DataParallel/DDP "module.", torch.compile
#: "_orig_mod.".
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


class FitReport(NamedTuple):
    """How the keys of a state dict differ from a model's.

    Attributes
    ----------
    missing : list of str
        The model's keys the file lacks.
    unexpected : list of str
        The file's keys the model lacks.
    mismatched : list of str
        Keys in both whose shapes differ.
    """

    missing: list[str]
    unexpected: list[str]
    mismatched: list[str]

    @property
    def fits(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)


def is_state_dict(obj: object) -> bool:
    """Whether ``obj`` is a non-empty mapping of names to tensors."""
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def find_state_dict(obj: object) -> Mapping[str, torch.Tensor] | None:
    """The state dict a checkpoint holds: the object itself or a well-known dict entry."""
    if is_state_dict(obj):
        return obj
    if isinstance(obj, Mapping):
        for key in STATE_DICT_KEYS:
            if is_state_dict(obj.get(key)):
                return obj[key]
    return None


def read_weights(path: Path) -> Mapping[str, torch.Tensor]:
    """The state dict in a weights file (``--weights``), read with ``weights_only=True``.

    Weights files never run code, whatever ``--trust`` says: trust is for the model file or
    factory the user named, not for the files given with it.

    Parameters
    ----------
    path : Path
        A file written by ``torch.save(model.state_dict(), path)``, or a checkpoint dict
        holding one (``"state_dict"``, ``"model_state_dict"``, ``"model"``).

    Returns
    -------
    dict of str to Tensor

    Raises
    ------
    ModelLoadError
        The file is missing, empty or damaged, holds Python objects (the message names the
        blocked global and what the file seems to be), or holds no state dict.
    """
    check_file(path, "weights file")
    try:
        with warnings.catch_warnings():
            # Raw pickles made with pickle.dump trip this; the safe unpickler still applies.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # damaged and unsafe files raise many different types
        refused = refusal(path, exc)
        if refused is None:
            raise ModelLoadError(
                f"The weights file '{path}' cannot be read as a PyTorch checkpoint: "
                f"{short_reason(exc)}",
                "Check that the file is complete and was written by torch.save.",
            ) from exc
        if refused.whole_model:
            fix = ("To use that model, give the file as the model instead: --model FILE "
                   "--trust (only if you trust where it came from).")
        else:
            fix = "Save the weights alone: torch.save(model.state_dict(), 'weights.pth')."
        raise ModelLoadError(
            f"The weights file '{path}' was not loaded: {refused.reason()}. Weights files "
            "are read as tensors only, whatever --trust says.",
            fix,
        ) from exc
    state = find_state_dict(obj)
    if state is None:
        raise ModelLoadError(
            f"'{path}' does not hold a state dict (it holds {describe_object(obj)}).",
            "Save it with torch.save(model.state_dict(), path).",
        )
    return state


def describe_object(obj: object) -> str:
    """What a loaded object is, in a few words ("a dict with keys 'epoch', 'lr'")."""
    if isinstance(obj, Mapping):
        keys = [repr(k) for k in obj]
        return f"a dict with keys {listing(keys, 6)}" if keys else "an empty dict"
    return f"a {type(obj).__name__}"


def strip_wrapper_prefix(
    state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``state`` without a wrapper's prefix on every key, when the model's keys lack it."""
    for prefix in WRAPPER_PREFIXES:
        if all(k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in own):
            return {k[len(prefix):]: v for k, v in state.items()}
    return dict(state)


def fit_report(state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]) -> FitReport:
    """Compare the keys and shapes of ``state`` with the model's own state dict ``own``."""
    return FitReport(
        missing=[k for k in own if k not in state],
        unexpected=[k for k in state if k not in own],
        mismatched=[k for k in own if k in state and state[k].shape != own[k].shape],
    )


def load_state_into(
    module: nn.Module, state: Mapping[str, torch.Tensor], source: Path, target: str
) -> None:
    """Load ``state`` into ``module``, or say which keys do not fit.

    Raises
    ------
    ModelLoadError
        Keys are missing, unexpected or of another shape; the message lists a few of each.
    """
    own = module.state_dict()
    state = strip_wrapper_prefix(state, own)
    report = fit_report(state, own)
    if not report.fits:
        raise ModelLoadError(
            f"The weights in '{source}' do not fit {target}: {_differences(report, state, own)}.",
            "Check that the architecture is the one the file was saved from.",
        )
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise ModelLoadError(
            f"The weights in '{source}' do not fit {target}: {short_reason(exc)}",
            "Check that the architecture is the one the file was saved from.",
        ) from exc


def _differences(
    report: FitReport, state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]
) -> str:
    parts = []
    if report.missing:
        parts.append(f"{len(report.missing)} missing ({listing(report.missing)})")
    if report.unexpected:
        parts.append(f"{len(report.unexpected)} unexpected ({listing(report.unexpected)})")
    if report.mismatched:
        shapes = [
            f"{k}: file {tuple(state[k].shape)}, model {tuple(own[k].shape)}"
            for k in report.mismatched
        ]
        parts.append(f"{len(report.mismatched)} of another shape ({listing(shapes, 2)})")
    return "; ".join(parts)
