"""The one formula of gradexplorer's statistics, and its torch path.

Every path that summarises a tensor (the torch operations here, the numba pass of
``gradexplorer.stats.cpu``, the Triton kernels of ``gradexplorer.stats.device``, the
batches of ``gradexplorer.stats.batched``) ends in :func:`stats_from_moments`; blocks are
merged with :func:`chan_merge`; the histogram's sample and range follow
:func:`histogram_sample` and :func:`histogram_range`. ``gradexplorer.stats.tensor_stats``
explains why (float64, blocks around their own mean, scaled squares, a prime stride).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any, TypeVar, cast

import torch

from gradexplorer.stats.record import SCALAR_KEYS, STAT_KEYS, TensorStats

__all__ = ["HIST_BINS", "HIST_EXACT_LIMIT", "SCALAR_KEYS", "STAT_KEYS", "TensorStats", "torch_stats", "chan_merge",
           "merge_moments", "stats_from_moments", "histogram_sample", "histogram_range", "histogram_in_float64",
           "empty_stats", "no_finite_stats", "has_nonfinite", "fused_cpu_enabled", "Count"]

HIST_BINS = 64
#: Tensors with more elements than this get a subsampled histogram (see module docstring).
HIST_EXACT_LIMIT = 1 << 14

_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73,
           79, 83, 89, 97, 101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157, 163,
           167, 173, 179, 181, 191, 193, 197, 199, 211, 223, 227, 229, 233, 239, 241, 251)
#: float64 tensors whose largest magnitude lies outside [2**-_SAFE_EXP, 2**_SAFE_EXP] are
#: scaled by a power of two before squaring (their squares would overflow or underflow).
_SAFE_EXP = 480
#: float32 maximum: a histogram range wider than this is binned in float64.
_F32_MAX = 3.4028234663852886e38


#: A count: int (MergeStats, GradientMoments) or float (the kernels' float64 rows).
Count = TypeVar("Count", int, float)


def _prime_at_least(n: int) -> int:
    for p in _PRIMES:
        if p >= n and p > 2:
            return p
    # Odd numbers are enough past this point: layouts with such strides do not occur.
    return n | 1


def _as_real(t: torch.Tensor) -> torch.Tensor:
    x = t.detach()
    if x.is_complex():
        x = x.abs()
    if not x.is_floating_point():
        x = x.float() if x.element_size() < 4 or x.dtype == torch.bool else x.double()
    elif x.dtype in (torch.float16, torch.bfloat16):
        # histc does not take half types.
        x = x.float()
    return x


def fused_cpu_enabled() -> bool:
    """Whether CPU tensors go through the fused kernels (``GRADEXPLORER_CPU_KERNEL=0``: no)."""
    return os.environ.get("GRADEXPLORER_CPU_KERNEL", "1") != "0"


@torch.no_grad()
def torch_stats(t: torch.Tensor, hist_exact_limit: int | None = HIST_EXACT_LIMIT) -> TensorStats:
    """``tensor_stats`` by plain torch operations (any device, any dtype): the fallback of
    the fused kernels, and the path for tensors they do not take. Same parameters."""
    x = _as_real(t).reshape(-1)
    n = x.numel()
    if n == 0:
        return empty_stats()
    lo, hi = torch.aminmax(x)
    lo_f, hi_f = torch.stack([lo, hi]).tolist()
    nan_count = inf_count = 0
    finite = x
    if not (math.isfinite(lo_f) and math.isfinite(hi_f)):
        # Rare path: only here do we pay for the element-wise finite test.
        nan_mask = torch.isnan(x)
        inf_mask = torch.isinf(x)
        nan_count = int(nan_mask.sum())
        inf_count = int(inf_mask.sum())
        finite = x[~(nan_mask | inf_mask)]
        if finite.numel():
            lo_f, hi_f = torch.stack(torch.aminmax(finite)).tolist()
        else:
            lo_f = hi_f = float("nan")
    m = finite.numel()
    if not m:
        return no_finite_stats(n, nan_count, inf_count)
    # float64 throughout: float32 squares of |x| >= 1e19 overflow and E[x²] - E[x]² in
    # float32 cancels catastrophically. float64 data far from 1 is scaled first (exact).
    amax = max(abs(lo_f), abs(hi_f))
    exponent = 0
    if x.dtype == torch.float64 and amax > 0 and not (2.0 ** -_SAFE_EXP < amax < 2.0 ** _SAFE_EXP):
        exponent = math.frexp(amax)[1]
    flat = finite.to(torch.float64).contiguous()
    if exponent:
        flat = torch.ldexp(flat, torch.tensor(-exponent, dtype=torch.int32))
    mean_s = flat.sum() / m
    dev = flat - mean_s  # two passes: the second around the (float64) mean
    m2 = torch.dot(dev, dev) if flat.device.type == "cpu" else dev.square().sum()
    sumsq = torch.dot(flat, flat) if flat.device.type == "cpu" else flat.square().sum()
    abs_ = flat.abs()
    l1 = abs_.sum()
    # A sign sum: count_nonzero and (x != 0).sum() are many times slower on the CPU.
    nonzero = abs_.sign_().sum()
    mean_f, m2_f, sumsq_f, l1_f, nonzero_f = torch.stack([mean_s, m2, sumsq, l1, nonzero]).tolist()
    hist, hist_range, exact = _histogram(x, lo_f, hi_f, hist_exact_limit, m)
    return stats_from_moments(n, lo_f, hi_f, mean_f, m2_f, sumsq_f, l1_f, int(nonzero_f), nan_count, inf_count,
                              hist, hist_range, exact, exponent)


def chan_merge(na: Count, mean_a: Any, m2_a: Any, nb: Count, mean_b: Any, m2_b: Any) -> tuple[Count, Any, Any]:
    """Chan, Golub and LeVeque's merge of two sets' (count, mean, sum of squared
    deviations from the mean) into their union's: (count, mean, m2).

    The pairwise delta form, ``d = mean_b - mean_a``, ``mean = mean_a + d * nb / n``,
    ``m2 = m2_a + m2_b + d^2 * na * nb / n``: exact when the means are equal (a constant
    tensor's m2 stays 0), accurate when |mean| >> std, unlike sums of squares. A set with
    a count of 0 is the identity. Plain arithmetic on floats, so that the numba kernels
    (``gradexplorer.stats.cpu_kernels``) compile this same function; every merge of moments in
    ``core`` goes through it (``MergeStats.merge`` too). The means and m2s may be floats
    or tensors of them (``GradientMoments``: element-wise).
    """
    if na == 0:
        return nb, mean_b, m2_b
    if nb == 0:
        return na, mean_a, m2_a
    n = na + nb
    delta = mean_b - mean_a
    return n, mean_a + delta * (nb / n), m2_a + m2_b + delta * delta * (na * (nb / n))


def merge_moments(counts: Iterable[float], means: Iterable[float], m2s: Iterable[float]) -> tuple[float, float, float]:
    """``chan_merge`` folded over any number of blocks' (count, mean, m2): the whole's
    (count, mean, m2). Takes sequences of numbers; blocks with a count of 0 are ignored,
    and no block at all gives (0, nan, 0)."""
    n, mean, m2 = 0.0, float("nan"), 0.0
    for c, mu, q in zip(counts, means, m2s):
        n, mean, m2 = chan_merge(n, mean, m2, float(c), float(mu), float(q))
    return n, mean, m2


def stats_from_moments(n: int, lo: float, hi: float, mean: float, m2: float, sumsq: float, l1: float,
                       nonzero: int, nan_count: int, inf_count: int, hist: torch.Tensor,
                       hist_range: tuple[float, float], exact: bool, exponent: int = 0,
                       into: TensorStats | None = None) -> TensorStats:
    """The statistics record from the moments of the finite values of ``n`` elements (of
    which there is at least one); shared by the CPU paths and the GPU kernels' rows.

    Parameters
    ----------
    n, lo, hi : int, float, float
        Element count, finite minimum and maximum.
    mean, m2, sumsq, l1 : float
        Of the finite values times 2**-``exponent``: their mean, sum of squared deviations
        from it, sum of squares and sum of magnitudes, accumulated in float64.
    nonzero, nan_count, inf_count : int
        Non-zero finite values, NaN and Inf counts.
    hist, hist_range, exact
        As in ``tensor_stats``.
    exponent : int
        0 unless the values were scaled by 2**-exponent to keep their squares in float64;
        undone after the square roots, so that only a statistic that is truly beyond
        float64 overflows, and is then named in ``overflow``.
    into : TensorStats, optional
        An empty record to fill and return (one handed out before the statistics existed)
        instead of a new one.
    """
    m = n - nan_count - inf_count
    # Written for speed as much as for reading: a capture builds a record per tensor, and
    # for small tensors the record costs more than the arithmetic that filled it.
    # max(v, 0.0) as a comparison, NaN kept (as max() kept it)
    l2 = math.sqrt(sumsq if not sumsq < 0.0 else 0.0)
    std = math.sqrt((m2 if not m2 < 0.0 else 0.0) / (m - 1 if m > 1 else 1))
    mean_abs = l1 / m
    if exponent:
        l2, std, mean, mean_abs = (_ldexp(l2, exponent), _ldexp(std, exponent), _ldexp(mean, exponent),
                                   _ldexp(mean_abs, exponent))
    overflow: tuple[str, ...] = ()
    if l2 == math.inf or std == math.inf:
        overflow = tuple(k for k, v in (("std", std), ("l2", l2)) if v == math.inf)
    out = into if into is not None else cast(TensorStats, {})
    out["numel"] = n
    out["min"] = lo
    out["max"] = hi
    out["mean"] = mean
    out["std"] = std
    out["mean_abs"] = mean_abs
    out["l2"] = l2
    out["zero_fraction"] = (m - nonzero) / n  # zeros among the finite values
    out["nan_count"] = nan_count
    out["inf_count"] = inf_count
    out["hist"] = hist
    out["hist_range"] = hist_range
    out["hist_exact"] = exact
    out["overflow"] = overflow
    return out


def _ldexp(value: float, exponent: int) -> float:
    """value * 2**exponent, inf where that is beyond float64 (math.ldexp raises there)."""
    if not exponent:  # the usual case: four calls per tensor, hundreds of tensors per capture
        return value
    try:
        return math.ldexp(value, exponent)
    except OverflowError:
        return math.copysign(math.inf, value)


def histogram_sample(n: int, limit: int | None) -> tuple[int, int, int]:
    """(offset, step, count) of the elements a histogram of ``n`` values counts: every one
    up to ``limit``, else every ``step``-th from ``offset``, ``step`` an odd prime."""
    if limit is None or n <= limit:
        return 0, 1, n
    step = _prime_at_least(math.ceil(n / limit))
    offset = step // 2
    return offset, step, (n - offset + step - 1) // step


def histogram_range(lo: float, hi: float) -> tuple[float, float]:
    """The histogram's range for finite values in [lo, hi]: widened when flat, by 0.5 or,
    for large values (1e20 ± 0.5 is 1e20), by a millionth of their magnitude."""
    if hi > lo:
        return lo, hi
    pad = max(0.5, abs(lo) * 1e-6)
    return lo - pad, hi + pad


def histogram_in_float64(lo: float, hi: float) -> bool:
    """Whether bins over [lo, hi] must be computed in float64: the width of a float32
    range can overflow float32 (-3e38 to 3e38), which would put every value in one bin."""
    return not (hi - lo <= _F32_MAX)


def _histogram(x: torch.Tensor, lo: float, hi: float, limit: int | None,
               finite_count: int) -> tuple[torch.Tensor, tuple[float, float], bool]:
    """Counts of the finite values among the sample ``histogram_sample`` picks from all of
    ``x`` (as the fused kernels take it), scaled to ``finite_count`` when subsampled."""
    lo, hi = histogram_range(lo, hi)
    n = x.numel()
    offset, step, _count = histogram_sample(n, limit)
    sample = x[offset::step] if step > 1 else x
    if histogram_in_float64(lo, hi):
        sample = sample.double()
    counts = torch.histc(sample, HIST_BINS, lo, hi)  # histc skips NaN, and Inf lies outside
    exact = step == 1
    if not exact:
        sampled = float(counts.sum())
        counts = counts * (finite_count / sampled) if sampled else torch.zeros(HIST_BINS)
    return counts.float().cpu(), (float(lo), float(hi)), exact


def empty_stats() -> TensorStats:
    """Statistics of a tensor with no elements."""
    nan = float("nan")
    return {
        "numel": 0, "min": nan, "max": nan, "mean": nan, "std": nan, "mean_abs": nan,
        "l2": 0.0, "zero_fraction": 0.0, "nan_count": 0, "inf_count": 0,
        "hist": torch.zeros(HIST_BINS), "hist_range": (0.0, 1.0), "hist_exact": True, "overflow": (),
    }


def no_finite_stats(n: int, nan_count: int, inf_count: int) -> TensorStats:
    """Statistics of ``n`` elements none of which is finite: counted, not summarised."""
    out = empty_stats()
    out.update({"numel": n, "l2": float("nan"), "nan_count": nan_count, "inf_count": inf_count})
    return out


def has_nonfinite(stats: TensorStats | None) -> bool:
    """Whether statistics report any NaN or Inf value."""
    return stats is not None and bool(stats) and (stats["nan_count"] > 0 or stats["inf_count"] > 0)
