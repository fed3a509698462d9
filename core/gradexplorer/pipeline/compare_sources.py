"""Where the second capture of a comparison comes from: the same run, one thing changed.

"Compare with..." takes the options of capture A (``gradexplorer.pipeline.options.CaptureOptions``) and a
:class:`Variant` saying what B changes: other weights or another checkpoint, autocast to
bf16/fp16, another device, train mode, another input batch or labels, another target.
B is then an ordinary capture of those options, run through ``gradexplorer.pipeline.job.CaptureJob``;
what B does not change (the loaded model, the batch) is reused from A, so that B sees
exactly A's batch.

Both captures run the model: call :func:`compare_variant` from a worker thread, never a
GUI thread.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.capture import CancelFlag, ProgressCallback
from gradexplorer.capturing.data import Capture
from gradexplorer.capturing.inputs import Batch
from gradexplorer.comparison.compare import Comparison, Tolerance, compare
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.job import CaptureJob
from gradexplorer.pipeline.live import is_live
from gradexplorer.pipeline.options import AUTOCAST_DTYPES, BatchSpec, CaptureOptions

#: ``Variant.autocast`` value that turns autocast off in B (when A used it).
AUTOCAST_OFF = "off"


@dataclass(frozen=True)
class Variant:
    """What capture B changes from capture A; ``None`` keeps A's setting.

    Attributes
    ----------
    model : str or None
        Another model spec, e.g. a fine-tuned checkpoint file.
    weights : str or None
        Other weights for the same architecture (``DEFAULT``, an enum name, a ``.pth``).
    autocast : str or None
        ``"bf16"`` or ``"fp16"``; ``"off"`` runs B without autocast.
    device : str or None
        ``cpu``, ``cuda:0``, ``mps``...
    train : bool or None
        Train mode (dropout, batch statistics) or eval.
    batch : BatchSpec or None
        Another input batch.
    labels : str or None
        Other labels (for ``cross_entropy``).
    target : str or None
        Another target (``class:3``, ``sum``...).
    """

    model: str | None = None
    weights: str | None = None
    autocast: str | None = None
    device: str | None = None
    train: bool | None = None
    batch: BatchSpec | None = None
    labels: str | None = None
    target: str | None = None

    def __post_init__(self) -> None:
        if self.autocast is not None and self.autocast not in AUTOCAST_DTYPES + (AUTOCAST_OFF,):
            raise GradExplorerError(f"unknown autocast dtype '{self.autocast}';",
                                    f"use {', '.join(AUTOCAST_DTYPES)} or '{AUTOCAST_OFF}'.")

    @property
    def new_model(self) -> bool:
        """Whether B needs a model of its own (another checkpoint or other weights)."""
        return self.model is not None or self.weights is not None

    @property
    def new_batch(self) -> bool:
        """Whether B reads a batch of its own."""
        return self.batch is not None or self.labels is not None

    def changes(self, base: CaptureOptions) -> dict[str, Any]:
        """The option fields B sets differently from ``base``."""
        out: dict[str, Any] = {}
        for f in ("model", "weights", "device", "train", "batch", "labels", "target"):
            v = getattr(self, f)
            if v is not None and v != getattr(base, f):
                out[f] = v
        if self.autocast is not None:
            v = None if self.autocast == AUTOCAST_OFF else self.autocast
            if v != base.autocast:
                out["autocast"] = v
        return out

    def apply(self, base: CaptureOptions) -> CaptureOptions:
        """B's options: ``base`` with this variant's changes.

        Raises
        ------
        GradExplorerError
            When nothing would change (B would be A again), or B's options are invalid.
        """
        changes = self.changes(base)
        if not changes:
            raise GradExplorerError(
                "the second capture would be the same as the first;",
                "choose what to change: other weights, autocast, device, train mode, input or target.",
            )
        return dataclasses.replace(base, **changes)

    def describe(self, base: CaptureOptions) -> str:
        """What B changes, in a few words (``"autocast bf16"``)."""
        return _describe_fields(self.changes(base))

    def report_names(self, base: CaptureOptions) -> tuple[str, str]:
        """A and B named by what tells them apart, for the comparison's report: the model,
        then A's and B's values of what B changes (``"resnet18, eval mode"`` against
        ``"resnet18, train mode"``; A had been named "resnet18", B "train mode")."""
        changes = self.changes(base)
        mine = {k: getattr(base, k) for k in changes}
        model_a = base.model
        model_b = changes.pop("model", base.model)
        mine.pop("model", None)
        a = ", ".join(w for w in (model_a, _describe_fields(mine, base=True)) if w)
        b = ", ".join(w for w in (model_b, _describe_fields(changes)) if w)
        return a, b


def _describe_fields(fields: dict[str, Any], base: bool = False) -> str:
    """Option fields in a few words; ``base``: the values of the capture B is compared with
    (no weights: random init or the model's own; no autocast: its dtype)."""
    words = []
    for k, v in fields.items():
        if k == "autocast":
            words.append(f"autocast {v}" if v else "no autocast")
        elif k == "train":
            words.append("train mode" if v else "eval mode")
        elif k == "batch":
            words.append("input " + (", ".join(v.sources()) or "default"))
        elif k == "weights" and v is None:
            words.append("its own weights" if base else "no weights")
        elif v is None:
            words.append(f"default {k}")
        else:
            words.append(f"{k} {v}")
    return ", ".join(words)


@dataclass
class ComparedRuns:
    """Two captures and their comparison (``compare(a, b)``)."""

    a: Capture
    b: Capture
    result: Comparison
    options_a: CaptureOptions
    options_b: CaptureOptions


def _staged(progress: ProgressCallback | None, prefix: str) -> ProgressCallback | None:
    if progress is None:
        return None

    def report(stage: str, done: int, total: int) -> None:
        progress(f"{prefix}: {stage}", done, total)

    return report


def compare_variant(
    base: CaptureOptions,
    variant: Variant,
    *,
    reference: Capture | None = None,
    loaded: LoadedModel | None = None,
    batch: Batch | None = None,
    lock: Any = None,
    progress: ProgressCallback | None = None,
    cancel: CancelFlag | None = None,
    tolerance: Tolerance | None = None,
) -> ComparedRuns:
    """Capture A (unless given) and its variant B, and compare them.

    Parameters
    ----------
    base : CaptureOptions
        A's options.
    variant : Variant
        What B changes.
    reference : Capture, optional
        A, when it was already captured with ``base`` (the window's last run).
    loaded, batch : optional
        A's model and batch, already loaded: reused by A and, unless the variant changes
        them, by B (so B sees A's very batch).
    lock : context manager, optional
        Held while hooks are on a model (``CaptureJob``).
    progress : callable, optional
        ``progress(stage, done, total)``; stages are prefixed with ``"A: "`` / ``"B: "``.
    cancel : object with ``is_set()``, optional
    tolerance : Tolerance, optional

    Returns
    -------
    ComparedRuns

    Raises
    ------
    GradExplorerError
        From either capture (``CaptureCancelled`` when cancelled), or a variant that
        changes nothing; ``gradexplorer.comparison.compare.CompareError`` when the captures share no layer.
    """
    if variant.weights is not None and variant.model is None and is_live(base.model):
        raise GradExplorerError(
            "other weights cannot be loaded for a model handed over in memory (gradexplorer.explore);",
            "change the autocast, device, train mode, input or target instead, or load the other weights "
            "into a second model and compare the two captures with gradexplorer.compare.")
    options_b = variant.apply(base)
    job_a = CaptureJob(base, _staged(progress, "A"), cancel, loaded=loaded, batch=batch, lock=lock)
    a = reference if reference is not None else job_a.run()
    if variant.new_model:
        loaded_b = None
    else:
        loaded_b = job_a.loaded if job_a.loaded is not None else loaded
    # Other weights may bring other preprocessing: B then reads A's inputs itself.
    batch_b = None if (variant.new_batch or variant.new_model) else (job_a.batch or batch)
    job_b = CaptureJob(options_b, _staged(progress, "B"), cancel, loaded=loaded_b, batch=batch_b, lock=lock)
    b = job_b.run()
    label_a, label_b = variant.report_names(base)
    result = compare(a, b, tolerance=tolerance, label_a=label_a, label_b=label_b)
    return ComparedRuns(a, b, result, base, options_b)


def options_from_session(session: Any) -> CaptureOptions:
    """The options of the window's next run (``gradexplorer.pipeline.session.Session``), as capture A's.

    Raises
    ------
    GradExplorerError
        No model, no batch, no layer selected, or labels that do not fit.
    """
    return session.run_request(new_generation=False).options
