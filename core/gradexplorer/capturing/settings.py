"""A capture's settings, one frozen object per concern, passed whole.

``gradexplorer.capturing.capture.capture`` takes its settings as keywords
(``capture(model, x, mode="stats", device="cuda")``) or whole, as one
:class:`CaptureSettings` (``capture(model, x, settings=s)``); either way it builds the
objects once and hands them to each of its steps, which read the concern they need:

* :class:`RecordSettings`: *what* is recorded (layers, target, labels, full tensors or
  statistics only, the input gradient, the histogram threshold, the calls expected);
* :class:`RunSettings`: *where and how* forward and backward run (device, train mode,
  autocast, tensors kept on the device);
* :class:`ReportSettings`: what the capture tells its caller while it runs and puts in
  what it returns (progress, the cancel flag, extra metadata).

The pipeline builds them from its plain options
(``gradexplorer.pipeline.options.CaptureOptions.capture_settings``). Values are checked
where they are used, by the capture, with the messages it has always given. Each object
can be varied with :func:`dataclasses.replace`::

    s = CaptureSettings(record=RecordSettings(layers="layer4.*", mode="stats"))
    cap = capture(model, x, settings=s)
    on_gpu = capture(model, x, settings=replace(s, run=RunSettings(device="cuda")))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import torch

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.selection import LayerSpec
from gradexplorer.capturing.targets import Target

__all__ = ["ProgressCallback", "CancelFlag", "RecordSettings", "RunSettings", "ReportSettings", "CaptureSettings"]

#: ``progress(stage, done, total)``, with stage ``"forward"`` or ``"backward"``.
ProgressCallback = Callable[[str, int, int], None]


class CancelFlag(Protocol):
    """What a capture checks to stop early (a ``threading.Event`` is one)."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class RecordSettings:
    """What a capture records.

    Attributes
    ----------
    layers : None, str, iterable of str, or callable
        Modules to record: ``None`` for the default selection, names or glob patterns, or
        a predicate ``(name, module) -> bool`` (``gradexplorer.capturing.selection``).
    target : str or Target
        The scalar to differentiate (``gradexplorer.capturing.targets.parse_target``).
    labels : Tensor, optional
        Class indices, for ``cross_entropy``.
    mode : {"full", "stats"}
        ``full`` keeps activations and gradients and their statistics; ``stats`` keeps
        statistics only.
    input_grad : bool
        Also record the gradient with respect to the input batch.
    hist_exact_limit : int, optional
        Histogram subsampling threshold; ``None`` is
        ``gradexplorer.stats.moments.HIST_EXACT_LIMIT``.
    expected_calls : int, optional
        Module calls per forward (``gradexplorer.capturing.module_tree.ModuleTree.probe``),
        for progress; ``None`` counts one per module.
    """

    layers: LayerSpec = None
    target: Target | str = "top1"
    labels: torch.Tensor | None = None
    mode: str = "full"
    input_grad: bool = False
    hist_exact_limit: int | None = None
    expected_calls: int | None = None


@dataclass(frozen=True)
class RunSettings:
    """Where and how a capture's forward and backward run.

    Attributes
    ----------
    device : str or torch.device, optional
        Where to run; ``None`` runs where the model is, ``"auto"`` picks a GPU if any.
    train : bool
        Train mode (dropout active, BatchNorm batch statistics); eval by default.
    autocast : {None, "bf16", "fp16"}
        Forward under ``torch.autocast`` with this dtype on the capture device.
    keep_on_device : bool
        Full mode on a GPU: keep tensors in device memory while they fit
        (``gradexplorer.capturing.capture.KEEP_SHARE``) instead of copying them to the host.
    """

    device: str | torch.device | None = None
    train: bool = False
    autocast: str | None = None
    keep_on_device: bool = False


@dataclass(frozen=True)
class ReportSettings:
    """What a capture tells its caller while it runs, and adds to what it returns.

    Attributes
    ----------
    progress : callable, optional
        ``progress(stage, done, total)`` with stage ``"forward"`` or ``"backward"``.
    cancel : object with ``is_set()``, optional
        Checked at every module call and every gradient; when set the capture stops with
        ``CaptureCancelled``.
    meta : dict, optional
        Extra metadata (model, weights, categories...) stored in ``Capture.meta``.
    """

    progress: ProgressCallback | None = None
    cancel: CancelFlag | None = None
    meta: dict | None = None


@dataclass(frozen=True)
class CaptureSettings:
    """All of one capture's settings: what it records, where it runs, what it reports."""

    record: RecordSettings = field(default_factory=RecordSettings)
    run: RunSettings = field(default_factory=RunSettings)
    report: ReportSettings = field(default_factory=ReportSettings)

    def refuse_alongside(self, keywords: CaptureSettings) -> None:
        """Raise when ``keywords`` (what ``capture``'s own keywords built) sets anything:
        settings come either whole or as keywords, never both (which one would win is
        not something to guess)."""
        default = CaptureSettings()
        given = [f.name for group in ("record", "run", "report")
                 for f in fields(getattr(default, group))
                 if _differs(getattr(getattr(keywords, group), f.name), getattr(getattr(default, group), f.name))]
        if given:
            raise GradExplorerError(
                f"capture() was given settings= and also {', '.join(f'{n}=' for n in given)};",
                "pass the settings either whole (settings=CaptureSettings(...)) or as keywords, not both.")


def _differs(value: Any, default: Any) -> bool:
    """Whether a keyword was set: defaults are None, False and short strings, so equality
    of the same type says it (a tensor or a callable is never a default)."""
    return value is not default and (type(value) is not type(default) or value != default)
