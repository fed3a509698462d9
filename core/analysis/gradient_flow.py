"""Gradient flow: one number per captured layer, in forward order, and the layers to worry about.

Everything here reads the statistics of a capture, so it works on statistics-only
captures and costs nothing per element.

One bar per layer. A module called several times in one forward (a shared ReLU) gets
one value that aggregates its calls as if their tensors were concatenated: the L2 norm
is ``sqrt(sum of squared norms)``, mean |x| is weighted by element counts, max |x| is
the largest. Calls whose tensor is missing (no gradient reached them) are left out.

Flags (``layer_flags``), computed on the output gradient:

* ``"no gradient"``: no call's output reached the target (its gradient was never
  computed).
* ``"nan/inf"``: some activation or gradient value is NaN or infinite.
* ``"zero"``: a gradient exists but every value is exactly zero (a dead ReLU, a
  detached branch multiplied by zero...).
* ``"vanishing"`` / ``"exploding"``: the layer's root-mean-square gradient is below
  ``VANISHING_RATIO`` (1e-3) times, or above ``EXPLODING_RATIO`` (1e3) times, the median
  RMS of its neighbours: up to ``NEIGHBOURS`` (4) layers on each side in forward order
  that have a finite, non-zero gradient (the median is taken in log space, which for a
  median is the same number). RMS rather than the L2 norm, so that a layer is not
  flagged merely for having fewer elements than its neighbours. At least two such
  neighbours are needed to judge.
"""

from __future__ import annotations

import math
import statistics

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.data import CallStats, Capture, LayerRecord
from gradexplorer.stats.moments import has_nonfinite
from gradexplorer.stats.record import TensorStats

#: Metrics of ``flow_series``.
METRICS = ("l2", "mean_abs", "max_abs")
#: Tensors ``flow_series`` can follow: a call's tensors, or all parameter gradients.
KINDS = ("grad_output", "grad_input", "activation", "param")
#: Human labels for the metrics.
METRIC_LABELS = {"l2": "L2 norm", "mean_abs": "mean |x|", "max_abs": "max |x|"}

VANISHING_RATIO = 1e-3
EXPLODING_RATIO = 1e3
NEIGHBOURS = 4
#: Every flag, in the order the views list them.
FLAGS = ("no gradient", "nan/inf", "zero", "vanishing", "exploding")


def _layer_stats(rec: LayerRecord, kind: str) -> list[TensorStats]:
    if kind == "param":
        return [s for s in rec.param_stats.values() if s]
    return [s for c in rec.calls if (s := c.stats.get(kind))]


def aggregate(stats_list: list[TensorStats], metric: str) -> float:
    """Aggregate one metric over several statistics records (see module docstring).

    Parameters
    ----------
    stats_list : list of TensorStats
        ``gradexplorer.stats.summary.tensor_stats`` results.
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


def _rms(stats_list: list[TensorStats]) -> float:
    finite = [s for s in stats_list if s and s["numel"] > s["nan_count"] + s["inf_count"]]
    if not finite:
        return math.nan
    n = sum(s["numel"] - s["nan_count"] - s["inf_count"] for s in finite)
    return math.hypot(*(float(s["l2"]) for s in finite)) / math.sqrt(n)  # no overflow at 1e308


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


def call_flags(stats: CallStats) -> list[str]:
    """The flags of one call, from its statistics (``CallRecord.stats``).

    The per-call part of the rules in the module docstring: ``"no gradient"`` (no output
    gradient), ``"nan/inf"`` (in the activation, the output gradient or the input
    gradient; NaN/Inf in the forward may leave the gradients finite) and ``"zero"``
    (an output gradient that is all exact zeros, or empty). ``layer_flags`` builds on it.

    Parameters
    ----------
    stats : CallStats
        ``{"activation": ..., "grad_output": ..., "grad_input": ...}``, values
        ``gradexplorer.stats.summary.tensor_stats`` records or ``None``.

    Returns
    -------
    list of str
        In ``FLAGS`` order.
    """
    out: list[str] = []
    grad = stats.get("grad_output")
    if not grad:
        out.append("no gradient")
    if any(has_nonfinite(stats.get(kind)) for kind in ("activation", "grad_output", "grad_input")):
        out.append("nan/inf")
    if grad and (grad["numel"] == 0 or (grad["zero_fraction"] >= 1.0 and not has_nonfinite(grad))):
        out.append("zero")
    return out


def layer_flags(
    capture: Capture,
    *,
    vanishing: float = VANISHING_RATIO,
    exploding: float = EXPLODING_RATIO,
    neighbours: int = NEIGHBOURS,
) -> dict[str, list[str]]:
    """Layers whose output gradient looks wrong (see the module docstring for the rules).

    Parameters
    ----------
    capture : Capture
        Full or statistics-only.
    vanishing, exploding : float
        Ratios to the neighbours' median RMS gradient below / above which a layer is
        flagged.
    neighbours : int
        How many layers on each side form the neighbourhood.

    Returns
    -------
    dict
        Every captured layer name, in forward order, to its list of flags (in ``FLAGS``
        order; empty when all is well).
    """
    names = capture.layer_order
    flags: dict[str, list[str]] = {n: [] for n in names}
    rms: list[float] = []
    for name in names:
        calls = [call_flags(c.stats) for c in capture[name].calls]
        present = [s for c in capture[name].calls if (s := c.stats.get("grad_output"))]
        if not present:
            flags[name].append("no gradient")
        if any("nan/inf" in f for f in calls):
            flags[name].append("nan/inf")
        if not present:
            rms.append(math.nan)
            continue
        value = _rms(present)
        if all("zero" in f for f in calls if "no gradient" not in f):
            flags[name].append("zero")
            value = 0.0
        rms.append(value)

    for name, flag in zip(names, neighbour_flags(rms, vanishing=vanishing, exploding=exploding,
                                                 neighbours=neighbours)):
        if flag is not None:
            flags[name].append(flag)
    return flags


def neighbour_flags(
    rms: list[float],
    *,
    vanishing: float = VANISHING_RATIO,
    exploding: float = EXPLODING_RATIO,
    neighbours: int = NEIGHBOURS,
) -> list[str | None]:
    """The vanishing/exploding rule of the module docstring on a sequence of RMS gradients.

    Parameters
    ----------
    rms : list of float
        One RMS gradient per position, in forward order; NaN, inf, 0 and negative values
        are neither judged nor neighbours.
    vanishing, exploding, neighbours
        As for :func:`layer_flags`.

    Returns
    -------
    list
        ``"vanishing"``, ``"exploding"`` or ``None`` per position.
    """
    logs = [math.log10(v) if v > 0 and math.isfinite(v) else None for v in rms]
    out: list[str | None] = []
    for i, own in enumerate(logs):
        window = [v for j in range(max(0, i - neighbours), min(len(logs), i + neighbours + 1))
                  if j != i and (v := logs[j]) is not None]
        if own is None or len(window) < 2:
            out.append(None)
            continue
        median = statistics.median(window)
        if own < median + math.log10(vanishing):
            out.append("vanishing")
        elif own > median + math.log10(exploding):
            out.append("exploding")
        else:
            out.append(None)
    return out
