"""The flags of a capture's layers: which output gradients look wrong, and why.

Read from the statistics alone, so they work on statistics-only captures. A capture's
own table (``gradexplorer.capturing.capture_table``), the gradient-flow view, the
statistics table, the graph and ``gradexplorer inspect`` show the same flags.

Flags (``layer_flags``), computed on the output gradient:

* ``"no gradient"``: the layer ran, but no call's output reached the target (its
  gradient was never computed, or autograd gave none: ``CallRecord.absent`` says why). A
  layer that never ran during forward (``nn.MultiheadAttention``'s ``out_proj``, whose
  weight its parent uses directly) has no gradient because it computed nothing: it is not
  flagged; ``gradexplorer.analysis.gradient_flow.flow_gaps`` tells it apart
  (``NOT_CALLED``), as ``LayerRecord.called`` and ``CaptureSummary.not_called`` do.
* ``"nan/inf"``: some activation or gradient value is NaN or infinite.
* ``"zero"``: a gradient exists but every value is exactly zero (a dead ReLU, a
  detached branch multiplied by zero...).
* ``"vanishing"`` / ``"exploding"``: the layer's root-mean-square gradient is below
  ``VANISHING_RATIO`` (1e-3) times, or above ``EXPLODING_RATIO`` (1e3) times, the median
  RMS of its neighbours: up to ``NEIGHBOURS`` (4) layers on each side in forward order
  that have a finite, non-zero gradient (the median is taken in log space, which for a
  median is the same number). RMS rather than the L2 norm, so that a layer is not
  flagged merely for having fewer elements than its neighbours. At least two such
  neighbours are needed to judge. The layer whose output the target was taken from (the
  logits: ``seed_calls``) is not judged, nor a neighbour: its output gradient is the
  target's seed (a one-hot of the top class, ones for ``sum``), set by the target rather
  than passed back, and on a model with random weights it stands a thousand times above
  the layers before it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from gradexplorer.stats.moments import has_nonfinite
from gradexplorer.stats.record import TensorStats

__all__ = ["VANISHING_RATIO", "EXPLODING_RATIO", "NEIGHBOURS", "FLAGS", "call_flags", "layer_flags",
           "neighbour_flags", "seed_calls"]

#: A call's statistics per tensor kind (``gradexplorer.capturing.data.CallStats``).
CallStats = Mapping[str, TensorStats | None]


# What the flags read of a capture, as protocols rather than gradexplorer.capturing.data's
# classes: a Capture shows its flags in its own table (``Capture._repr_html_``), so the
# data module reaches this one, which must not import it back.
class _Call(Protocol):
    @property
    def stats(self) -> CallStats: ...

    @property
    def shape(self) -> tuple: ...


class _Layer(Protocol):
    @property
    def calls(self) -> Sequence[_Call]: ...


class CaptureLike(Protocol):
    """The part of a ``gradexplorer.capturing.data.Capture`` the flags read."""

    @property
    def layer_order(self) -> list[str]: ...

    def __getitem__(self, name: str) -> _Layer: ...


VANISHING_RATIO = 1e-3
EXPLODING_RATIO = 1e3
NEIGHBOURS = 4
#: Every flag, in the order the views list them.
FLAGS = ("no gradient", "nan/inf", "zero", "vanishing", "exploding")


def _rms(stats_list: list[TensorStats]) -> float:
    finite = [s for s in stats_list if s and s["numel"] > s["nan_count"] + s["inf_count"]]
    if not finite:
        return math.nan
    n = sum(s["numel"] - s["nan_count"] - s["inf_count"] for s in finite)
    return math.hypot(*(float(s["l2"]) for s in finite)) / math.sqrt(n)  # no overflow at 1e308


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
        ``gradexplorer.stats.tensor_stats.tensor_stats`` records or ``None``.

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


def seed_calls(capture: CaptureLike) -> set[tuple[str, int]]:
    """The calls whose output is the tensor the target was taken from (the capture's
    ``output``): their output gradient is the target's seed, not a gradient passed back.

    Told by the output's statistics (element count, minimum, maximum, L2 norm), so that
    statistics-only captures are told too; empty for a capture without its output.
    """
    out = getattr(capture, "output", None)
    if not isinstance(out, torch.Tensor) or out.numel() == 0 or not out.dtype.is_floating_point:
        return set()
    shape = tuple(out.shape)
    ref: tuple[float, float, float] | None = None
    found = set()
    for name in capture.layer_order:
        for i, call in enumerate(capture[name].calls):
            stats = call.stats.get("activation")
            if tuple(call.shape) != shape or not stats or int(stats["numel"]) != out.numel():
                continue
            if ref is None:
                x = out.detach().to("cpu", torch.float64)
                ref = float(x.min()), float(x.max()), float(x.norm())
            got = float(stats["min"]), float(stats["max"]), float(stats["l2"])
            if all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-30) for a, b in zip(got, ref)):
                found.add((name, i))
    return found


def layer_flags(
    capture: CaptureLike,
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
    seeds = seed_calls(capture)
    for name in names:
        calls = [call_flags(c.stats) for c in capture[name].calls]
        present = [s for c in capture[name].calls if (s := c.stats.get("grad_output"))]
        if not present and capture[name].calls:  # a layer that never ran is not flagged
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
        if all((name, i) in seeds for i, c in enumerate(capture[name].calls) if c.stats.get("grad_output")):
            value = math.nan  # the target's seed: neither judged nor a neighbour
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
