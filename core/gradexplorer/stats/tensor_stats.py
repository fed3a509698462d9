"""Summary statistics of a tensor, computed where the tensor lives.

Statistics are the part of a capture that is always present, in both capture modes, so
they must be cheap, and they are what the tool exists to show, so they must be right at
the extremes (exploding values are why people open it).

Right: the variance is never taken as E[x²] − E[x]² (in float32 a constant 1e4 over 1e6
values gave std 80.6, true 0). Every path computes the sum of squared deviations per block
around a value close to the block's mean, then merges the blocks in float64 with Chan's
formula (``chan_merge``). The accuracy contract: every statistic within 1e-6 relative of
float64 on the same tensor (the mean within 1e-6 times the mean |x|), counts, extremes and
the zero fraction exact. Every path accumulates in float64 (the fused CPU pass of
``gradexplorer.stats.cpu``, the torch path, the GPU kernels). Squares of float32 values cannot overflow
float64, and float64 tensors whose squares would (|x| above about 1e150) or would
underflow are scaled by a power of two first, which is exact. A statistic whose true value lies beyond float64
(the L2 norm of many 1e308 values) is reported as ``inf`` and named in ``overflow``, so
that it is not mistaken for an Inf in the data (``inf_count``).

Cheap: on the CPU one fused, multithreaded pass per tensor compiled with numba
(``gradexplorer.stats.cpu``) when numba is installed, and these torch operations otherwise (and
for tensors numba cannot read); on a GPU, fused Triton kernels (``gradexplorer.stats.device``).
All three end in ``stats_from_moments``, the one formula. The histogram of a large tensor
is taken over an evenly strided subsample whose stride is prime, so that it does not alias
with the tensor's layout, and its counts are scaled to the number of finite values
(``hist_exact`` says when that happened).
"""

from __future__ import annotations

import torch

from gradexplorer.stats import cpu as cpu_stats
from gradexplorer.stats.moments import HIST_EXACT_LIMIT, fused_cpu_enabled, torch_stats
from gradexplorer.stats.record import TensorStats


def tensor_stats(t: torch.Tensor, hist_exact_limit: int | None = HIST_EXACT_LIMIT,
                 hist_into: torch.Tensor | None = None) -> TensorStats:
    """Summary statistics of a tensor.

    Parameters
    ----------
    t : torch.Tensor
        Any tensor; it is not modified. Complex tensors are summarised by magnitude;
        integer, bool and half-precision values are widened (no sum can overflow).
    hist_exact_limit : int or None
        Above this many elements the histogram is computed on an evenly strided
        subsample and scaled; ``None`` always counts every element.
    hist_into : torch.Tensor, optional
        Where the fused CPU pass writes the histogram (``gradexplorer.stats.cpu.summarize``'s
        ``hist_into``: a row of a capture's table); the other paths make their own.

    Returns
    -------
    TensorStats
        A dict (``gradexplorer.stats.record``): ``numel`` (int), ``min``, ``max``,
        ``mean``, ``std``, ``mean_abs``, ``l2``, ``zero_fraction`` (floats over the finite
        values: NaN and Inf are counted, not summarised), ``nan_count``, ``inf_count``
        (ints), ``hist`` (float32 tensor of ``HIST_BINS`` counts on the CPU, summing to
        the number of finite values), ``hist_range`` (tuple of two floats: the lower edge
        of the first bin and the upper edge of the last), ``hist_exact`` (bool),
        ``overflow`` (tuple of the names of statistics beyond the float64 range, shown as
        inf; usually empty).
    """
    # No torch.no_grad() here: the fused pass reads a detached view, and torch_stats
    # sets it itself (entering and leaving it cost a third of a small tensor's summary).
    if t.is_cpu and fused_cpu_enabled():
        stats = cpu_stats.summarize(t, hist_exact_limit, hist_into=hist_into)
        if stats is not None:
            return stats
    return torch_stats(t, hist_exact_limit)
