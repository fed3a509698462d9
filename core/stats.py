"""Summary statistics of a tensor, computed where the tensor lives.

Statistics are the part of a capture that is always present, in both capture modes, so
they must be cheap: on the CPU the obvious ``isfinite().sum()`` and ``histc`` cost more
than the forward pass of the layer that produced the tensor (see PITFALLS.md). We take
one ``aminmax`` pass, which reveals whether any NaN or Inf is present, and count
non-finite values only when there are some; mean and std come from a sum and the L2
norm (one BLAS pass); the histogram of a large tensor is taken over an evenly strided
subsample whose stride is prime, so that it does not alias with the tensor's layout,
and its counts are scaled to ``numel`` (``hist_exact`` says when that happened).
"""

from __future__ import annotations

import math

import torch

HIST_BINS = 64
#: Tensors with more elements than this get a subsampled histogram (see module docstring).
HIST_EXACT_LIMIT = 1 << 14

#: Scalar statistics, in the order they are packed on the device.
SCALAR_KEYS = (
    "numel",
    "min",
    "max",
    "mean",
    "std",
    "mean_abs",
    "l2",
    "zero_fraction",
    "nan_count",
    "inf_count",
)
#: Every key of a statistics dict.
STAT_KEYS = (*SCALAR_KEYS, "hist", "hist_range", "hist_exact")

_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73,
           79, 83, 89, 97, 101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157, 163,
           167, 173, 179, 181, 191, 193, 197, 199, 211, 223, 227, 229, 233, 239, 241, 251)


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
        x = x.float()
    elif x.dtype in (torch.float16, torch.bfloat16):
        # Half-precision sums overflow and histc does not take them.
        x = x.float()
    return x


@torch.no_grad()
def tensor_stats(t: torch.Tensor, hist_exact_limit: int | None = HIST_EXACT_LIMIT) -> dict:
    """Summary statistics of a tensor.

    Parameters
    ----------
    t : torch.Tensor
        Any tensor; it is not modified. Complex tensors are summarised by magnitude,
        integer and half-precision tensors in float32.
    hist_exact_limit : int or None
        Above this many elements the histogram is computed on an evenly strided
        subsample and scaled; ``None`` always counts every element.

    Returns
    -------
    dict
        ``numel`` (int), ``min``, ``max``, ``mean``, ``std``, ``mean_abs``, ``l2``,
        ``zero_fraction`` (floats; min/max/mean/std/mean_abs/l2 ignore NaN and Inf when
        there are some), ``nan_count``, ``inf_count`` (ints), ``hist`` (float32 tensor of
        ``HIST_BINS`` counts on the CPU, summing to the number of finite values),
        ``hist_range`` (tuple of two floats: the lower edge of the first bin and the upper
        edge of the last), ``hist_exact`` (bool).
    """
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
    if m:
        # The kernels are picked for speed on the CPU, measured on an 8x256x56x56 tensor:
        # sum, dot and float sign are vectorised and threaded, while count_nonzero,
        # (x != 0).sum() and vector_norm(x, 1) took 5 to 90 times as long. float32 sums are
        # pairwise (cascade) sums in torch; a float64 sum would convert the tensor first.
        flat = finite.contiguous()
        total = flat.sum()
        sumsq = torch.dot(flat, flat) if flat.device.type == "cpu" else flat.square().sum()
        if lo_f >= 0:
            # Non-negative tensors (ReLU outputs): mean |x| = mean, and sign is 0 or 1.
            l1 = total
            nonzero = flat.sign().sum()
        else:
            abs_ = flat.abs()
            l1 = abs_.sum()
            nonzero = abs_.sign_().sum()
        total_f, sumsq_f, l1_f, nonzero_i = torch.stack(
            [total.double(), sumsq.double(), l1.double(), nonzero.double()]
        ).tolist()
        hist, hist_range, exact = _histogram(finite, lo_f, hi_f, hist_exact_limit)
        return stats_from_sums(n, lo_f, hi_f, total_f, sumsq_f, l1_f, int(nonzero_i), nan_count, inf_count,
                               hist, hist_range, exact)
    out = empty_stats()  # no finite value: nothing to summarise
    out.update(numel=n, min=lo_f, max=hi_f, l2=float("nan"), nan_count=nan_count, inf_count=inf_count)
    return out


def stats_from_sums(n: int, lo: float, hi: float, total: float, sumsq: float, l1: float, nonzero: int,
                    nan_count: int, inf_count: int, hist: torch.Tensor, hist_range: tuple[float, float],
                    exact: bool) -> dict:
    """The statistics dict from the sums over the finite values of ``n`` elements (of which
    there is at least one); shared by the CPU path and the GPU kernels' rows."""
    m = n - nan_count - inf_count
    l2 = math.sqrt(max(sumsq, 0.0))
    mean = total / m
    var = max(l2 * l2 - m * mean * mean, 0.0) / max(m - 1, 1)
    return {
        "numel": n,
        "min": lo,
        "max": hi,
        "mean": mean,
        "std": math.sqrt(var),
        "mean_abs": l1 / m,
        "l2": l2,
        "zero_fraction": (m - nonzero) / n,  # zeros among the finite values
        "nan_count": nan_count,
        "inf_count": inf_count,
        "hist": hist,
        "hist_range": hist_range,
        "hist_exact": exact,
    }


def histogram_sample(n: int, limit: int | None) -> tuple[int, int, int]:
    """(offset, step, count) of the elements a histogram of ``n`` values counts: every one
    up to ``limit``, else every ``step``-th from ``offset``, ``step`` an odd prime."""
    if limit is None or n <= limit:
        return 0, 1, n
    step = _prime_at_least(math.ceil(n / limit))
    offset = step // 2
    return offset, step, (n - offset + step - 1) // step


def histogram_range(lo: float, hi: float) -> tuple[float, float]:
    """The histogram's range for finite values in [lo, hi]: widened by 0.5 when flat."""
    return (lo - 0.5, hi + 0.5) if hi <= lo else (lo, hi)


def _histogram(x: torch.Tensor, lo: float, hi: float, limit: int | None):
    lo, hi = histogram_range(lo, hi)
    n = x.numel()
    offset, step, _count = histogram_sample(n, limit)
    sample = x[offset::step] if step > 1 else x
    counts = torch.histc(sample, HIST_BINS, lo, hi)
    exact = sample.numel() == n
    if not exact:
        counts = counts * (n / sample.numel())
    return counts.float().cpu(), (float(lo), float(hi)), exact


def empty_stats() -> dict:
    """Statistics of a tensor with no elements."""
    nan = float("nan")
    return {
        "numel": 0, "min": nan, "max": nan, "mean": nan, "std": nan, "mean_abs": nan,
        "l2": 0.0, "zero_fraction": 0.0, "nan_count": 0, "inf_count": 0,
        "hist": torch.zeros(HIST_BINS), "hist_range": (0.0, 1.0), "hist_exact": True,
    }


def has_nonfinite(stats: dict | None) -> bool:
    """Whether statistics report any NaN or Inf value."""
    return bool(stats) and (stats["nan_count"] > 0 or stats["inf_count"] > 0)
