"""The metadata of a capture: one schema, written by the job, read by both front ends.

A capture's ``meta`` dict (``Capture.meta``, the ``"meta"`` entry of the file) holds
plain values only. ``gradexplorer.pipeline.provenance.build_meta`` writes the part that
describes the model, batch and options (``gradexplorer.pipeline.job.CaptureJob`` calls it);
``gradexplorer.capturing.capture.capture`` adds the facts of the run (target, device, dtype,
timing...). :func:`capture_meta` reads it back as a typed :class:`CaptureMeta`, for the
CLI's ``inspect`` and the window.

Format version 1 files had two dialects: the window wrote ``sample_names``,
``batch_source`` and ``preprocessing``; the CLI wrote ``input_names``, ``batch`` (one
line) and ``labels``. :func:`upgrade_meta` turns either into the version 2 schema when
a file is read, so every reader sees one set of keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gradexplorer.capturing.inputs import Batch, describe

if TYPE_CHECKING:
    from gradexplorer.capturing.data import Capture

# Keys written by gradexplorer.pipeline.provenance.build_meta; capture() adds RUN_KEYS.
# Every key is present in a version 2 file (None when unknown).
SOURCE_KEYS = (
    "model", "model_name", "weights", "arch", "categories", "task",
    "batch", "batch_source", "sample_names", "preprocessing", "labels",
    "input_grad", "autocast",
)
RUN_KEYS = (
    "target", "device", "dtype", "mode", "train", "torch_version", "created",
    "layer_order", "call_order", "not_called", "seconds", "timing",
)
# What differs between two captures of the same options: when and how fast.
VOLATILE_KEYS = ("created", "seconds", "timing")

_PREPROCESSING_MARK = ", preprocessing: "


@dataclass(frozen=True)
class CaptureMeta:
    """What a capture says about how it was made (the version 2 schema, typed).

    Attributes
    ----------
    model : str or None
        The model spec the user gave (``resnet18``, ``demo:shapes``, a file, a factory).
    model_name : str or None
        Its display name.
    weights : str or None
        Which weights were loaded (``ResNet18_Weights.IMAGENET1K_V1``, ``file:...``);
        ``None``: random initialisation.
    arch : str or None
        The architecture given for a weights-only checkpoint.
    categories : tuple of str or None
        Class names, index-aligned with the logits.
    task : str or None
    batch : str
        One line about the batch (``gradexplorer.batches.describe``).
    batch_source : str
        Where the batch came from, in words.
    sample_names : tuple of str
        One name per sample (file names, ``random[0]``...).
    preprocessing : str
        The preprocessing applied, in words; ``"unknown"`` when the file does not say.
    labels : tuple of int or None
        The class indices used (for ``cross_entropy``), when known.
    target, device, dtype, mode : str or None
    train, input_grad : bool or None
    autocast : str or None
        ``bf16`` / ``fp16`` when forward ran under ``torch.autocast``.
    torch_version, created : str or None
    seconds : float or None
        Forward and backward time.
    timing : dict
        Seconds per job step (``load_model``, ``load_batch``, ``probe``, ``capture``)
        when the job recorded them.
    layer_order, not_called : tuple of str
    call_order : tuple of (str, int)
        Every (layer, call index) in the order the calls returned, when recorded.
    tokens : tuple of tuple of str or None
        For a batch of texts, each sample's token strings, position by position.
    target_words : str or None
        The target in words ("the logit of the predicted next token at the last position").
    predicted_tokens : tuple of str or None
        For a target at one position of per-token logits: each sample's predicted token.
    input_grad_of : str or None
        What the input gradient is taken with respect to, when not the input itself (token
        ids have none: "the output of 'transformer.wte' (the token embeddings)").
    """

    model: str | None = None
    model_name: str | None = None
    weights: str | None = None
    arch: str | None = None
    categories: tuple[str, ...] | None = None
    task: str | None = None
    batch: str = ""
    batch_source: str = ""
    sample_names: tuple[str, ...] = ()
    preprocessing: str = "unknown"
    labels: tuple[int, ...] | None = None
    target: str | None = None
    device: str | None = None
    dtype: str | None = None
    mode: str | None = None
    train: bool | None = None
    input_grad: bool | None = None
    autocast: str | None = None
    torch_version: str | None = None
    created: str | None = None
    seconds: float | None = None
    timing: dict | None = None
    layer_order: tuple[str, ...] = ()
    call_order: tuple[tuple[str, int], ...] = ()
    not_called: tuple[str, ...] = ()
    tokens: tuple[tuple[str, ...], ...] | None = None
    target_words: str | None = None
    predicted_tokens: tuple[str, ...] | None = None
    input_grad_of: str | None = None

    def tokens_of(self, index: int) -> tuple[str, ...] | None:
        """Sample ``index``'s token strings, or None for a batch that was not text."""
        if self.tokens is None or not 0 <= index < len(self.tokens):
            return None
        return self.tokens[index]

    def sample_name(self, index: int) -> str:
        """The name of sample ``index`` (``"sample 3"`` when the file has none)."""
        if 0 <= index < len(self.sample_names):
            return self.sample_names[index]
        return f"sample {index}"


def _token_rows(rows: Any) -> tuple[tuple[str, ...], ...] | None:
    if rows is None:
        return None
    return tuple(tuple(str(t) for t in row) for row in rows)


def _parse_cli_batch_line(line: str) -> tuple[str, str | None]:
    """(source, preprocessing) from a version 1 CLI ``batch`` line, as well as it can.

    ``"3 images (3×224×224) from ~/cats, with labels, preprocessing: resize 256 ..."``
    gives ``("3 images from ~/cats", "resize 256 ...")``.
    """
    head, sep, preprocessing = line.partition(_PREPROCESSING_MARK)
    head = head.removesuffix(", with labels")
    # describe() wrote "<A> (<shape>) from <B>": A is "N samples" when the source was B
    # itself, else the source was "<A> from <B>" ("3 images from ~/cats").
    before, paren, after = head.partition(" (")
    if paren and ") from " in after:
        tail = after.split(") from ", 1)[1]
        head = tail if re.fullmatch(r"\d+ samples?", before) else f"{before} from {tail}"
    return head, (preprocessing if sep else None)


def upgrade_meta(meta: dict, version: int, input_tensor: torch.Tensor | None = None) -> dict:
    """The version 2 metadata of a capture read from a file of ``version``.

    Version 1 files of the window (``sample_names``, ``batch_source``, ``preprocessing``)
    and of the CLI (``input_names``, ``batch``, ``labels``) both become the one schema;
    keys a file does not have are filled with None (or derived, when they can be).

    Parameters
    ----------
    meta : dict
        The file's ``"meta"`` entry (not modified).
    version : int
        The file's format version.
    input_tensor : Tensor, optional
        The captured input, to describe the batch of a file that did not.

    Returns
    -------
    dict
    """
    out = dict(meta)
    if version < 2:
        names = out.pop("input_names", None)
        if out.get("sample_names") is None and names is not None:
            out["sample_names"] = list(names)
        line = out.get("batch")
        if isinstance(line, str) and line:
            source, preprocessing = _parse_cli_batch_line(line)
            out.setdefault("batch_source", source)
            if preprocessing is not None:
                out.setdefault("preprocessing", preprocessing)
    for key in SOURCE_KEYS + RUN_KEYS:
        out.setdefault(key, None)
    if not out.get("batch") and input_tensor is not None and out.get("batch_source"):
        labels = out.get("labels")
        out["batch"] = describe(Batch(
            tensor=input_tensor,
            labels=torch.tensor(labels) if labels is not None else None,
            names=list(out.get("sample_names") or []),
            source=str(out["batch_source"]),
            preprocessing=str(out.get("preprocessing") or "unknown"),
        ))
    return out


def _tuple(value: Any) -> tuple | None:
    return None if value is None else tuple(value)


def capture_meta(cap: Capture | dict) -> CaptureMeta:
    """The typed metadata of a capture (or of a ``meta`` dict).

    Works on captures read from files of either version (``gradexplorer.files.capture_file`` upgrades
    version 1 metadata when it reads them) and on captures just made.

    Parameters
    ----------
    cap : Capture or dict

    Returns
    -------
    CaptureMeta
    """
    meta = cap if isinstance(cap, dict) else cap.meta
    if "input_names" in meta or "sample_names" not in meta:
        meta = upgrade_meta(meta, 1, None if isinstance(cap, dict) else cap.input)
    get = meta.get
    timing = get("timing")
    return CaptureMeta(
        model=get("model"),
        model_name=get("model_name"),
        weights=get("weights"),
        arch=get("arch"),
        categories=_tuple(get("categories")),
        task=get("task"),
        batch=str(get("batch") or ""),
        batch_source=str(get("batch_source") or ""),
        sample_names=tuple(str(n) for n in (get("sample_names") or ())),
        preprocessing=str(get("preprocessing") or "unknown"),
        labels=_tuple(get("labels")),
        target=get("target"),
        device=get("device"),
        dtype=get("dtype"),
        mode=get("mode"),
        train=get("train"),
        input_grad=get("input_grad"),
        autocast=get("autocast"),
        torch_version=get("torch_version"),
        created=get("created"),
        seconds=get("seconds"),
        timing=dict(timing) if isinstance(timing, dict) else None,
        layer_order=tuple(get("layer_order") or ()),
        call_order=tuple((str(n), int(i)) for n, i in (get("call_order") or ())),
        not_called=tuple(get("not_called") or ()),
        tokens=_token_rows(get("tokens")),
        target_words=get("target_words"),
        predicted_tokens=_tuple(get("predicted_tokens")),
        input_grad_of=get("input_grad_of"),
    )
