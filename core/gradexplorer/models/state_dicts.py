"""State dicts: finding one inside a checkpoint, and fitting it to a model."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple, TypeGuard

import torch
from torch import nn

from gradexplorer.base import tensor_memory
from gradexplorer.base.errors import ModelLoadError, listing
from gradexplorer.base.units import format_bytes
from gradexplorer.files.pickle_scan import Refusal, holds_inert, is_dangerous, load_inert, refusal, short_reason
from gradexplorer.models.files import (
    check_file,
    is_export_archive,
    is_torchscript,
    not_a_checkpoint,
    torchscript_error,
    zip_members,
)

#: Where state dicts sit inside a checkpoint dict.
STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model")


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


def is_state_dict(obj: object) -> TypeGuard[Mapping[str, torch.Tensor]]:
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
            found = obj.get(key)
            if is_state_dict(found):
                return found
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

    Every tensor is measured by the elements its sizes declare before anything makes it
    dense or builds a model to fit it (a stride-0 view stored in a few bytes can declare a
    classifier of a billion classes): the weights must fit the memory budget, half of the
    free RAM (``gradexplorer.base.tensor_memory``).

    Raises
    ------
    ModelLoadError
        The file is missing, empty or damaged, is a whole model (a ``torch.export`` or
        TorchScript archive), holds Python objects (the message names the blocked global and
        what the file seems to be), or holds no state dict.
    TensorTooLarge
        Its tensors declare more memory than the budget.
    """
    check_file(path, "weights file")
    if path.suffix.lower() == ".safetensors":
        return _checked_size(_read_safetensors(path), path)
    members = zip_members(path)
    if is_export_archive(path, members):
        raise ModelLoadError(
            f"'{path}' is a torch.export program (a whole model with its code), not a weights file.",
            "Give it as the model, --model FILE --trust (only if you trust where it came from), or save "
            "the weights alone: torch.save(model.state_dict(), 'weights.pth').")
    if members is not None and is_torchscript(members):
        raise torchscript_error(path)
    try:
        with warnings.catch_warnings():
            # Raw pickles made with pickle.dump trip this; the safe unpickler still applies.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # damaged and unsafe files raise many different types
        refused = refusal(path, exc)
        if refused is None:
            raise not_a_checkpoint(path, "weights file", short_reason(exc)) from exc
        state = _state_dict_despite(path, refused)
        if state is not None:
            return _checked_size(state, path)
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
    return _checked_size(state, path)


def _checked_size(state: Mapping[str, torch.Tensor], path: Path) -> Mapping[str, torch.Tensor]:
    """``state``, once each tensor and all of them together fit the memory budget."""
    limit = tensor_memory.read_budget()
    if limit is None:
        return state
    fix = "check that these are the weights of this model, or free memory (close other programs) and try again."
    total = 0
    for key, tensor in state.items():
        tensor_memory.check_tensor_fits(tensor, f"the tensor '{key}' of the weights file '{path.name}'", fix=fix)
        total += tensor_memory.declared_bytes(tensor)
    if total > limit:
        raise tensor_memory.TensorTooLarge(
            f"the tensors of the weights file '{path.name}' declare {format_bytes(total)} once dense, but the "
            f"memory budget is {format_bytes(limit)} (half of the free RAM);", fix)
    return state


def _read_safetensors(path: Path) -> Mapping[str, torch.Tensor]:
    # safetensors holds tensors only: nothing in it can run code.
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ModelLoadError(f"'{path}' is a safetensors file, and the safetensors package is not installed.",
                             "Install it: pip install safetensors (or 'gradexplorer[hf]').") from None
    try:
        state = load_file(str(path), device="cpu")
    except Exception as exc:  # a damaged header or data raises several kinds
        raise ModelLoadError(f"The weights file '{path}' cannot be read as safetensors: {short_reason(exc)}",
                             "Check that the file is complete.") from exc
    if not state:
        raise ModelLoadError(f"The safetensors file '{path}' holds no tensors.", "Give the model's weights file.")
    return state


def tied_keys(module: nn.Module) -> dict[str, str]:
    """The model's state-dict keys that share their tensor with an earlier key, mapped to it
    (a language model's ``lm_head.weight`` -> ``transformer.wte.weight``).

    ``save_pretrained`` leaves such keys out of its files, since loading the other fills them.
    """
    first: dict[tuple[int, int, tuple[int, ...]], str] = {}
    tied: dict[str, str] = {}
    for key, value in module.state_dict(keep_vars=True).items():
        if not isinstance(value, torch.Tensor) or value.numel() == 0:
            continue
        ident = (value.untyped_storage().data_ptr(), int(value.storage_offset()), tuple(value.shape))
        if ident in first:
            tied[key] = first[ident]
        else:
            first[ident] = key
    return tied


def fill_tied(state: Mapping[str, torch.Tensor], module: nn.Module) -> tuple[dict[str, torch.Tensor], list[str]]:
    """``state`` with the model's tied keys it lacks filled from the key they are tied to,
    and the keys so filled."""
    out = _copy(state)
    filled = []
    for key, other in tied_keys(module).items():
        if key not in out and other in out:
            out[key] = out[other]
            filled.append(key)
        elif other not in out and key in out:
            out[other] = out[key]
            filled.append(other)
    return out, filled


def _state_dict_despite(path: Path, refused: Refusal) -> Mapping[str, torch.Tensor] | None:
    # A checkpoint whose other entries hold Python objects (a Lightning checkpoint's
    # hyper_parameters with a pathlib.Path) still has a state dict of tensors: read it with
    # those objects made inert, unless the file imports something that runs commands.
    if refused.whole_model or any(is_dangerous(g) for g in refused.globals):
        return None
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            obj = load_inert(path, refused.globals)
    except Exception:  # noqa: BLE001 - not readable this way either: the refusal stands
        return None
    state = find_state_dict(obj)
    if state is None or holds_inert(state):
        return None
    return state


def describe_object(obj: object) -> str:
    """What a loaded object is, in a few words ("a dict with keys 'epoch', 'lr'")."""
    if isinstance(obj, Mapping):
        keys = [repr(k) for k in obj]
        return f"a dict with keys {listing(keys, 6)}" if keys else "an empty dict"
    return f"a {type(obj).__name__}"


class KeyMatch(NamedTuple):
    """A file's state dict with its keys made to match a model's, and what was done.

    Attributes
    ----------
    state : dict of str to Tensor
        The state dict to load.
    prefix : str
        The prefix removed from every key ("model." of a Lightning checkpoint,
        "module." of DataParallel), or "".
    dropped : tuple of str
        Keys outside that prefix, left out (a Lightning module's loss or metric buffers).
    """

    state: dict[str, torch.Tensor]
    prefix: str = ""
    dropped: tuple[str, ...] = ()

    def note(self, source: Path) -> str | None:
        """What was done, for the user, or None when the keys were used as they are."""
        if not self.prefix:
            return None
        text = f"removed the prefix '{self.prefix}' from the keys of {source.name}"
        if self.dropped:
            text += (f" and left out {len(self.dropped)} keys outside it "
                     f"({listing(list(self.dropped), 3)})")
        return text


def match_keys(state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]) -> KeyMatch:
    """``state`` with the common key prefix removed that makes its keys the model's.

    Lightning checkpoints hold ``{"state_dict": {"model.conv1.weight": ...}}``; wrappers
    (DataParallel, DDP, ``torch.compile``) add "module." or "_orig_mod.". A prefix is
    removed only when afterwards the keys are exactly the model's own (shapes may still
    differ); keys outside the prefix are then left out.

    Parameters
    ----------
    state : mapping of str to Tensor
        The file's state dict.
    own : mapping of str to Tensor
        The model's ``state_dict()``.

    Returns
    -------
    KeyMatch
        ``state`` unchanged (``prefix == ""``) when no prefix makes the keys fit.
    """
    wanted = set(own)
    if set(state) == wanted:
        return KeyMatch(_copy(state))
    for prefix in _candidate_prefixes(state, own):
        inside = _copy(state, prefix)
        if set(inside) == wanted:
            return KeyMatch(inside, prefix, tuple(k for k in state if not k.startswith(prefix)))
    return KeyMatch(_copy(state))


def _copy(state: Mapping[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    # The keys under ``prefix``, without it. torch.save keeps each module's state-dict
    # version in ``_metadata`` (MNASNet refuses a state dict without it), so carry it over.
    out = OrderedDict((k[len(prefix):], v) for k, v in state.items() if k.startswith(prefix))
    metadata = getattr(state, "_metadata", None)
    if metadata is not None:
        module = prefix[:-1]
        out._metadata = OrderedDict(  # type: ignore[attr-defined]  # torch's convention: an attribute, no subclass
            ("" if k == module else k[len(prefix):], v)
            for k, v in metadata.items()
            if not prefix or k == module or k.startswith(prefix)
        )
    return out


def common_prefix(keys: list[str]) -> str:
    """The dotted prefix every key shares ("model." or "model.backbone."), or ""."""
    if not keys:
        return ""
    parts = [k.split(".")[:-1] for k in keys]
    shared: list[str] = []
    for column in zip(*parts):
        if len(set(column)) != 1:
            break
        shared.append(column[0])
    return "".join(part + "." for part in shared)


def _candidate_prefixes(state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]) -> list[str]:
    # Dotted prefixes (up to three parts) of the file's keys that no model key starts with,
    # the ones covering most keys first: "model." before "model.backbone.".
    counts: dict[str, int] = {}
    for key in state:
        parts = key.split(".")[:-1]
        for depth in range(1, min(len(parts), 3) + 1):
            prefix = "".join(part + "." for part in parts[:depth])
            counts[prefix] = counts.get(prefix, 0) + 1
    own_prefixes = {k.split(".")[0] + "." for k in own}
    candidates = [
        p for p, n in counts.items()
        if n >= len(own) and p.split(".")[0] + "." not in own_prefixes
    ]
    candidates.sort(key=lambda p: (-counts[p], len(p)))
    return candidates


def fit_report(state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]) -> FitReport:
    """Compare the keys and shapes of ``state`` with the model's own state dict ``own``."""
    return FitReport(
        missing=[k for k in own if k not in state],
        unexpected=[k for k in state if k not in own],
        mismatched=[k for k in own if k in state and state[k].shape != own[k].shape],
    )


def load_state_into(
    module: nn.Module, state: Mapping[str, torch.Tensor], source: Path, target: str
) -> list[str]:
    """Load ``state`` into ``module`` (after :func:`match_keys`), or say what does not fit.

    Returns
    -------
    list of str
        Notes for the user (a prefix that was removed).

    Raises
    ------
    ModelLoadError
        Keys are missing, unexpected or of another shape; the message lists a few of each
        and names a prefix the file's keys share that the model's lack.
    """
    own = module.state_dict()
    matched = match_keys(state, own)
    state, tied = fill_tied(matched.state, module)
    report = fit_report(state, own)
    if not report.fits:
        raise ModelLoadError(
            f"The weights in '{source}' do not fit {target}: {_differences(report, state, own)}"
            f"{_prefix_hint(matched, state, own)}.",
            "Check that the architecture is the one the file was saved from.",
        )
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise ModelLoadError(
            f"The weights in '{source}' do not fit {target}: {short_reason(exc)}",
            "Check that the architecture is the one the file was saved from.",
        ) from exc
    notes = [n for n in [matched.note(source)] if n]
    if tied:
        others = tied_keys(module)
        notes.append(f"{listing(tied, 3)} tied to {listing([others.get(k, k) for k in tied], 3)} "
                     f"(shared weights, left out of {source.name})")
    return notes


def _prefix_hint(
    matched: KeyMatch, state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor]
) -> str:
    # The prefix the file's keys share (or the one removed), which the model's keys lack.
    if matched.prefix:
        return f" (after removing the prefix '{matched.prefix}' the file's keys share)"
    prefix = common_prefix(list(state))
    if prefix and not any(k.startswith(prefix) for k in own):
        example = next(iter(own), "")
        return (f" (every key in the file starts with '{prefix}', the model's do not, "
                f"e.g. '{example}')")
    return ""


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
