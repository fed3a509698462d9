"""State dicts: finding one inside a checkpoint, and fitting it to a model."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from core.errors import ModelLoadError
from core.models.pickles import listing
from core.weights import short_reason

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
