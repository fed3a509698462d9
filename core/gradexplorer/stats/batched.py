"""Statistics of many tensors at once, in a number of operations that does not grow with
the number of tensors: on the CPU one compiled call per dtype, on a device about twenty torch
operations (so that a capture on a GPU launches no storm of small kernels).

A capture's small tensors cost what the calls around them cost, not their values: on the
CPU the numba call, its Python and its record per tensor (docs/benchmarks.md, "The cost of
each hooked call"), on a GPU hook dispatch and two kernel launches each
(``gradexplorer.stats.device``), against a forward + backward that is itself launch-bound.

``batched_stats`` takes CPU tensors to ``gradexplorer.stats.cpu.summarize_many``: the fused
pass of ``tensor_stats`` over each tensor, read where it lies from a table of addresses, in
one compiled call (the numbers are each tensor's own, the same pass over the same values).
``device_batched_stats`` does it with torch operations on the tensors' own device: the
tensors are laid end to end in blocks of ``BLOCK`` values (each padded with NaN to whole
blocks, so that no block holds two tensors), every block's moments are taken in float64 by
rows (count, mean, squared deviations from the block's mean, magnitudes, zeros, NaN, finite
extremes), the blocks of each tensor are merged by Chan's formula in its shifted, vectorised
form (deviations from the tensor's first block mean, so that a constant keeps m2 = 0), and
the histogram samples of all tensors (``gradexplorer.stats.moments.histogram_sample``) are
binned by one ``bincount``. Two transfers bring the results to the host. The numbers are
those of ``gradexplorer.stats.tensor_stats.tensor_stats`` within the accuracy contract (the same
sample and torch.histc's bin arithmetic). float64, integer, bool and complex tensors (rare
in a capture) go through ``tensor_stats`` one by one.

A capture (``gradexplorer.stats.device.DeferredStats``) batches its small CPU tensors by
default, at the end of forward and of backward. The device path runs on a GPU when
``GRADEXPLORER_BATCHED_STATS=1`` (the layers' and parameters' gradients at the end of
backward, the outputs, from copies taken when their module returned, at the end of forward);
not yet by default: no GPU has measured it (``scripts/gpu_check.py`` times it against the
per-tensor kernels). Tested on CPU tensors against float64 NumPy
(``GRADEXPLORER_BATCHED_STATS=all`` takes a capture's CPU tensors through it).
"""

from __future__ import annotations

import math

import torch

from gradexplorer.stats import cpu as cpu_stats
from gradexplorer.stats.moments import (
    HIST_BINS,
    HIST_EXACT_LIMIT,
    empty_stats,
    fused_cpu_enabled,
    histogram_in_float64,
    histogram_range,
    histogram_sample,
    no_finite_stats,
    stats_from_moments,
)
from gradexplorer.stats.pending import PendingRecords
from gradexplorer.stats.record import TensorStats
from gradexplorer.stats.tensor_stats import tensor_stats

#: Values per block (row) of the laid-out tensors.
BLOCK = 1024
#: Rows reduced per step: bounds the float64 temporaries (about 24 bytes per value).
_ROWS_PER_STEP = 1 << 15
_BATCHED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@torch.no_grad()
def batched_stats(tensors: list[torch.Tensor], hist_limit: int | None = HIST_EXACT_LIMIT,
                  into: list[TensorStats] | None = None, later: PendingRecords | None = None) -> list[TensorStats]:
    """``gradexplorer.stats.tensor_stats.tensor_stats`` of every tensor, computed together.

    Parameters
    ----------
    tensors : list of torch.Tensor
        Any tensors; float32, float16 and bfloat16 ones are summarised together per device.
    hist_limit : int or None
        As ``tensor_stats``'s ``hist_exact_limit``.
    into : list of TensorStats, optional
        One empty record per tensor, to fill (and return) instead of new ones.
    later : PendingRecords, optional
        With ``into``: the records the compiled CPU pass summarises are written when
        ``later`` fills them (``gradexplorer.stats.pending``); the others now.

    Returns
    -------
    list of TensorStats
        One statistics record per tensor, in order.
    """
    if tensors and fused_cpu_enabled() and all(t.is_cpu for t in tensors):
        # Every tensor on the CPU (a capture's small ones): one compiled call per dtype.
        got = cpu_stats.summarize_many(tensors, hist_limit, into, later)
        if got is not None:
            return got
    if into is not None:
        for record, stats in zip(into, batched_stats(tensors, hist_limit)):
            record.update(stats)
        return into
    out: list[TensorStats | None] = [None] * len(tensors)
    groups: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.numel() == 0:
            out[i] = empty_stats()
        elif t.device.type == "cpu" or t.dtype in _BATCHED_DTYPES:
            groups.setdefault(t.device, []).append(i)
        else:
            out[i] = tensor_stats(t, hist_limit)
    for device, idx in groups.items():
        group = [tensors[i] for i in idx]
        got = cpu_stats.summarize_many(group, hist_limit) if device.type == "cpu" and fused_cpu_enabled() else None
        if got is None:
            got = device_batched_stats(group, hist_limit)
        for i, stats in zip(idx, got):
            out[i] = stats
    return [s if s is not None else empty_stats() for s in out]


@torch.no_grad()
def device_batched_stats(tensors: list[torch.Tensor], hist_limit: int | None = HIST_EXACT_LIMIT) -> list[TensorStats]:
    """``batched_stats`` by torch operations on the tensors' own device (a GPU's path; on
    the CPU where numba is missing, and in tests of this path): about twenty operations
    for all the tensors of a device.

    Parameters and returns as ``batched_stats``.
    """
    out: list[TensorStats | None] = [None] * len(tensors)
    groups: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.numel() == 0:
            out[i] = empty_stats()
        elif t.dtype in _BATCHED_DTYPES:
            groups.setdefault(t.device, []).append(i)
        else:
            out[i] = tensor_stats(t, hist_limit)
    for idx in groups.values():
        for i, stats in zip(idx, _together([tensors[i] for i in idx], hist_limit)):
            out[i] = stats
    return [s if s is not None else empty_stats() for s in out]


def _together(tensors: list[torch.Tensor], hist_limit: int | None) -> list[TensorStats]:
    dev = tensors[0].device
    count = len(tensors)
    sizes = [t.numel() for t in tensors]
    nblocks = [-(-n // BLOCK) for n in sizes]
    nan = torch.full((BLOCK,), math.nan, dtype=torch.float32, device=dev)
    pieces = []
    for t, n, b in zip(tensors, sizes, nblocks):
        flat = t.detach().reshape(-1)
        pieces.append(flat if flat.dtype == torch.float32 else flat.float())  # half values: exact
        if b * BLOCK > n:
            pieces.append(nan[: b * BLOCK - n])
    rows = torch.cat(pieces).view(-1, BLOCK)
    owner = torch.repeat_interleave(torch.arange(count, device=dev), torch.tensor(nblocks, device=dev))
    block = _block_moments(rows)
    cnt, mean_b, m2_b, sumabs_b, nonzero_b, nan_b, lo_b, hi_b = block

    def per_tensor(v: torch.Tensor) -> torch.Tensor:
        return torch.zeros(count, dtype=v.dtype, device=dev).index_add_(0, owner, v)

    # Chan's merge, shifted by each tensor's first block mean (exact for equal means).
    first = torch.tensor([sum(nblocks[:i]) for i in range(count)], device=dev)
    ref = mean_b[first]
    n_t = per_tensor(cnt)
    mean_t = ref + per_tensor(cnt * (mean_b - ref[owner])) / n_t.clamp_min(1)
    m2_t = per_tensor(m2_b) + per_tensor(cnt * (mean_b - mean_t[owner]) ** 2)
    pads = torch.tensor([b * BLOCK - n for n, b in zip(sizes, nblocks)], device=dev, dtype=torch.float64)
    lo_t = torch.full((count,), math.inf, dtype=torch.float64, device=dev).scatter_reduce_(
        0, owner, lo_b, "amin", include_self=True)
    hi_t = torch.full((count,), -math.inf, dtype=torch.float64, device=dev).scatter_reduce_(
        0, owner, hi_b, "amax", include_self=True)
    table = torch.stack([n_t, mean_t, m2_t, per_tensor(sumabs_b), per_tensor(nonzero_b),
                         per_tensor(nan_b) - pads, lo_t, hi_t], 1).cpu().tolist()  # transfer 1
    samples = [histogram_sample(n, hist_limit) for n in sizes]
    ranges = [histogram_range(r[6], r[7]) if r[0] > 0 else (0.0, 1.0) for r in table]
    counts = _histograms(rows.view(-1), [b * BLOCK for b in nblocks], samples, ranges).cpu()  # transfer 2
    results = []
    for i, (m, mean, m2, sumabs, nonzero, nan_count, lo, hi) in enumerate(table):
        n = sizes[i]
        nan_count = int(nan_count)
        inf_count = n - int(m) - nan_count
        if m == 0:
            results.append(no_finite_stats(n, nan_count, inf_count))
            continue
        hist = counts[i]
        exact = samples[i][1] == 1
        if not exact:
            sampled = float(hist.sum())
            hist = hist * (m / sampled) if sampled > 0 else torch.zeros(HIST_BINS)
        results.append(stats_from_moments(n, lo, hi, mean, m2, m2 + m * mean * mean, sumabs, int(nonzero),
                                          nan_count, inf_count, hist, ranges[i], exact))
    return results


def _block_moments(rows: torch.Tensor) -> list[torch.Tensor]:
    """Per row of float32 values: finite count, mean, m2 (two passes, float64), sum of
    magnitudes, non-zero count, NaN count, finite min and max (float64 vectors)."""
    parts: list[list[torch.Tensor]] = [[] for _ in range(8)]
    for start in range(0, rows.shape[0], _ROWS_PER_STEP):
        x = rows[start:start + _ROWS_PER_STEP]
        finite = torch.isfinite(x)
        x64 = torch.where(finite, x, 0).double()
        cnt = finite.sum(1).double()
        mean = x64.sum(1) / cnt.clamp_min(1)
        dev = torch.where(finite, x64 - mean[:, None], 0)
        got = [cnt, mean, (dev * dev).sum(1), x64.abs().sum(1), (x64 != 0).sum(1).double(),
               torch.isnan(x).sum(1).double(),
               torch.where(finite, x, math.inf).amin(1).double(), torch.where(finite, x, -math.inf).amax(1).double()]
        for p, g in zip(parts, got):
            p.append(g)
    return [torch.cat(p) for p in parts]


def _histograms(flat: torch.Tensor, lengths: list[int], samples: list[tuple[int, int, int]],
                ranges: list[tuple[float, float]]) -> torch.Tensor:
    """(tensors, HIST_BINS) counts of each tensor's sample over its range, in torch.histc's
    arithmetic (float32, or float64 where the range needs it), by one bincount."""
    dev = flat.device
    count = len(lengths)
    starts = [sum(lengths[:i]) for i in range(count)]
    per = torch.tensor([c for _o, _s, c in samples], device=dev)
    owner = torch.repeat_interleave(torch.arange(count, device=dev), per)
    first = torch.cumsum(per, 0) - per
    k = torch.arange(int(per.sum()), device=dev) - first[owner]
    base = torch.tensor([s + o for s, (o, _st, _c) in zip(starts, samples)], device=dev)
    step = torch.tensor([st for _o, st, _c in samples], device=dev)
    v = flat[base[owner] + k * step[owner]]
    lo = torch.tensor([r[0] for r in ranges], device=dev, dtype=torch.float64)
    hi = torch.tensor([r[1] for r in ranges], device=dev, dtype=torch.float64)
    wide = torch.tensor([histogram_in_float64(*r) for r in ranges], device=dev)
    lo32, hi32 = lo.float(), hi.float()
    pos32 = ((v - lo32[owner]) * HIST_BINS / (hi32 - lo32)[owner]).long()
    pos64 = ((v.double() - lo[owner]) * HIST_BINS / (hi - lo)[owner]).long()
    pos = torch.where(wide[owner], pos64, pos32).clamp_(0, HIST_BINS - 1)
    keep = torch.isfinite(v)
    keys = owner[keep] * HIST_BINS + pos[keep]
    return torch.bincount(keys, minlength=count * HIST_BINS).view(count, HIST_BINS).float()
