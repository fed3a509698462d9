"""Gradient flow: one number per captured layer, in forward order, and the layers to worry about.

Everything here reads the statistics of a capture, so it works on statistics-only
captures and costs nothing per element.

One bar per layer. A module called several times in one forward (a shared ReLU) gets
one value that aggregates its calls as if their tensors were concatenated: the L2 norm
is ``sqrt(sum of squared norms)``, mean |x| is weighted by element counts, max |x| is
the largest. Calls whose tensor is missing (no gradient reached them) are left out.

Flags (``layer_flags``, ``call_flags``, ``neighbour_flags``, ``seed_calls``) live beside the
capture, in ``gradexplorer.capturing.flags`` (a capture shows them in its own table), and are
named here too.

Where every gradient below some layer is zero, ``gradient_stop`` finds that layer: its output
gradient is not zero, its input gradient is, and the words say why (its output is all zeros:
its weights are zero, as torchvision initialises ViT's ``heads.head``; a dead ReLU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.data import Capture, LayerRecord
from gradexplorer.capturing.flags import (
    EXPLODING_RATIO,
    FLAGS,
    NEIGHBOURS,
    VANISHING_RATIO,
    call_flags,
    layer_flags,
    neighbour_flags,
    seed_calls,
)
from gradexplorer.stats.moments import has_nonfinite
from gradexplorer.stats.record import TensorStats

__all__ = ["METRICS", "KINDS", "METRIC_LABELS", "aggregate", "flow_series", "flow_gaps",
           "NOT_CALLED", "NO_GRADIENT", "NO_TENSOR", "NO_PARAMETERS", "NO_PARAMETER_GRADIENT",
           # the flags, named here for the views and the graph (gradexplorer.capturing.flags)
           "VANISHING_RATIO", "EXPLODING_RATIO", "NEIGHBOURS", "FLAGS", "call_flags", "layer_flags",
           "neighbour_flags", "seed_calls", "GradientStop", "gradient_stop"]

#: Metrics of ``flow_series``.
METRICS = ("l2", "mean_abs", "max_abs")
#: Tensors ``flow_series`` can follow: a call's tensors, or all parameter gradients.
KINDS = ("grad_output", "grad_input", "activation", "param")
#: Human labels for the metrics.
METRIC_LABELS = {"l2": "L2 norm", "mean_abs": "mean |x|", "max_abs": "max |x|"}


#: Why a layer has no value in a series (``flow_gaps``): it never ran during forward.
NOT_CALLED = "not called"
#: It ran, and no call has this gradient (``CallRecord.absent`` says why, call by call).
NO_GRADIENT = "no gradient"
#: It ran, and no call's output holds a tensor (kind ``activation``).
NO_TENSOR = "no tensor"
#: Kind ``param``: the module owns no parameter itself.
NO_PARAMETERS = "no parameters"
#: Kind ``param``: it owns parameters, none with a gradient (``LayerRecord.param_absent``).
NO_PARAMETER_GRADIENT = "no parameter gradient"


def _layer_stats(rec: LayerRecord, kind: str) -> list[TensorStats]:
    if kind == "param":
        return [s for s in rec.param_stats.values() if s]
    return [s for c in rec.calls if (s := c.stats.get(kind))]


def aggregate(stats_list: list[TensorStats], metric: str) -> float:
    """Aggregate one metric over several statistics records (see module docstring).

    Parameters
    ----------
    stats_list : list of TensorStats
        ``gradexplorer.stats.tensor_stats.tensor_stats`` results.
    metric : {"l2", "mean_abs", "max_abs"}

    Returns
    -------
    float
        NaN when the list is empty or holds no finite value.
    """
    if metric not in METRICS:
        raise GradExplorerError(f"Unknown gradient-flow metric '{metric}'.", f"Use one of {', '.join(METRICS)}.")
    finite = [s for s in stats_list if s and s["numel"] > s["nan_count"] + s["inf_count"]]
    if not finite:
        return math.nan
    if metric == "l2":
        return math.hypot(*(float(s["l2"]) for s in finite))  # hypot scales: no overflow at 1e308
    if metric == "max_abs":
        return max(max(abs(float(s["min"])), abs(float(s["max"]))) for s in finite)
    counts = [s["numel"] - s["nan_count"] - s["inf_count"] for s in finite]
    return sum(float(s["mean_abs"]) * n for s, n in zip(finite, counts)) / sum(counts)


def flow_series(capture: Capture, metric: str = "l2", kind: str = "grad_output") -> tuple[list[str], list[float]]:
    """One value per captured layer, in forward order.

    Parameters
    ----------
    capture : Capture
        Full or statistics-only.
    metric : {"l2", "mean_abs", "max_abs"}
        Norm of the tensor, mean absolute value, or largest absolute value, aggregated
        over the layer's calls (module docstring).
    kind : {"grad_output", "grad_input", "activation", "param"}
        The tensor: the gradient at the layer's output (default), at its input, the
        activation itself, or all of the layer's parameter gradients together.

    Returns
    -------
    (list of str, list of float)
        ``capture.layer_order`` and the values; NaN where the layer has no such tensor
        (e.g. no gradient reached it, or it has no parameters).

    Raises
    ------
    GradExplorerError
        For an unknown metric or kind.
    """
    if kind not in KINDS:
        raise GradExplorerError(f"Unknown gradient-flow tensor '{kind}'.", f"Use one of {', '.join(KINDS)}.")
    if metric not in METRICS:
        raise GradExplorerError(f"Unknown gradient-flow metric '{metric}'.", f"Use one of {', '.join(METRICS)}.")
    names = capture.layer_order
    return names, [aggregate(_layer_stats(capture[n], kind), metric) for n in names]


def flow_gaps(capture: Capture, kind: str = "grad_output") -> dict[str, str]:
    """Why layers have no value in ``flow_series(capture, metric, kind)``.

    Parameters
    ----------
    capture : Capture
    kind : {"grad_output", "grad_input", "activation", "param"}

    Returns
    -------
    dict
        Layer name to the reason, for each layer without any such statistics, in forward
        order: ``NOT_CALLED`` (it never ran during forward; kinds other than ``param``),
        ``NO_GRADIENT`` (it ran, no call has this gradient), ``NO_TENSOR`` (it ran, no call
        returned a tensor), ``NO_PARAMETERS`` or ``NO_PARAMETER_GRADIENT`` (``param``).
        A value that is NaN because every element is NaN or infinite is not a gap: the
        ``"nan/inf"`` flag says so.

    Raises
    ------
    GradExplorerError
        For an unknown kind.
    """
    if kind not in KINDS:
        raise GradExplorerError(f"Unknown gradient-flow tensor '{kind}'.", f"Use one of {', '.join(KINDS)}.")
    gaps: dict[str, str] = {}
    for name in capture.layer_order:
        rec = capture[name]
        if _layer_stats(rec, kind):
            continue
        if kind == "param":
            gaps[name] = NO_PARAMETER_GRADIENT if rec.param_stats else NO_PARAMETERS
        elif not rec.called:
            gaps[name] = NOT_CALLED
        else:
            gaps[name] = NO_TENSOR if kind == "activation" else NO_GRADIENT
    return gaps


def _forward_calls(capture: Capture) -> list[tuple[str, int]]:
    """Every (layer, call) in the order the calls returned (``meta["call_order"]``), else by
    layer in the order of their first call."""
    order = capture.meta.get("call_order") if isinstance(capture.meta, dict) else None
    if order:
        seen = [(str(n), int(i)) for n, i in order if n in capture and int(i) < len(capture[n].calls)]
        known = set(seen)
        return seen + [(n, i) for n, i, _ in capture.iter_calls() if (n, i) not in known]
    return [(n, i) for n, i, _ in capture.iter_calls()]


@dataclass(frozen=True)
class GradientStop:
    """The layer below which every gradient is zero (:func:`gradient_stop`).

    Attributes
    ----------
    layer : str
    call : int
    type : str
        The module's class.
    reason : str
        Why, in words: "its output is all zeros: its weights and bias are zero".
    below : tuple of str
        The layers before it (forward order) whose output gradient is zero because of it.
    """

    layer: str
    call: int
    type: str
    reason: str
    below: tuple[str, ...]

    def sentence(self) -> str:
        """One sentence for a status line or a tooltip."""
        n = len(self.below)
        return (f"The gradient stops at {self.layer} ({self.type}): {self.reason}. "
                f"{'Every layer' if n > 1 else 'The layer'} before it ({n}) has a zero gradient.")


def _is_zero(stats: TensorStats | None) -> bool:
    return bool(stats) and stats is not None and not has_nonfinite(stats) and (
        stats["numel"] == 0 or stats["zero_fraction"] >= 1.0)


def gradient_stop(capture: Capture) -> GradientStop | None:
    """Where the gradient stops: the last call in forward order whose output gradient is not
    zero while its input gradient is all zeros, when the layers before it have zero
    gradients; None when there is no such call.

    A random-init torchvision ViT is the case in point: its ``heads.head`` starts with zero
    weights and bias, so its output is all zeros and nothing of the target's gradient passes
    it. The reason names what is zero: the output (weights and bias, or a dead activation),
    else the weights.

    Parameters
    ----------
    capture : Capture
        Full or statistics-only; the input gradients must have been recorded (a call whose
        input does not require a gradient records none).
    """
    calls = _forward_calls(capture)
    for k in range(len(calls) - 1, -1, -1):
        name, i = calls[k]
        stats = capture[name].calls[i].stats
        grad, grad_in = stats.get("grad_output"), stats.get("grad_input")
        if not grad or _is_zero(grad) or has_nonfinite(grad) or not _is_zero(grad_in):
            continue
        below: list[str] = []
        for before, j in calls[:k]:
            g = capture[before].calls[j].stats.get("grad_output")
            if _is_zero(g) and before not in below:
                below.append(before)
        if not below:
            return None
        rec = capture[name]
        weights = "weight" in rec.param_stats
        if _is_zero(stats.get("activation")):
            if weights:
                bias = "bias" in rec.param_stats
                reason = (f"its output is all zeros: its weights{' and bias' if bias else ''} are zero, so nothing "
                          "of the gradient passes it (a head initialised to zeros, as torchvision's ViT's "
                          "heads.head is: load trained weights, or initialise it)")
            elif rec.type in ("ReLU", "ReLU6", "LeakyReLU", "Hardtanh", "Threshold"):
                reason = f"its output is all zeros (a dead {rec.type}: every input is below its threshold)"
            else:
                reason = "its output is all zeros, and nothing of the gradient passes it"
        elif weights:
            reason = "its input gradient is all zeros: its weights are zero, or send nothing back"
        else:
            reason = "nothing of its output gradient reaches its input"
        return GradientStop(name, i, rec.type, reason, tuple(below))
    return None
