"""Statistics of GPU tensors without waiting on the GPU.

``gradexplorer.stats.tensor_stats.tensor_stats`` is built for the CPU. On a CUDA device the same summary costs
some twenty small kernel launches and three host-device synchronisations per tensor, and a
capture of resnet50 at batch 8 summarises about 500 tensors: statistics-only capture took
several times a bare forward + backward on an H200 (``scripts/gpu_check.py``; the figures in
docs/benchmarks.md, "On a GPU"), all of it launch overhead and stalls, none of it arithmetic.

Here two fused Triton kernels compute the whole summary of a tensor (finite min and max,
the float64 moments of ``gradexplorer.stats.tensor_stats`` (count, mean, sum of squared deviations merged by
Chan's formula, sum of squares), sum of absolute values, non-zero, NaN and Inf counts, and the histogram
of the same evenly strided sample ``tensor_stats`` uses) into one row of numbers on the
device, launched from the hook without waiting for the result. ``DeferredStats.resolve``
copies every row of a capture to the host in one transfer at its end and fills the
statistics dicts, which the records already hold. The first kernel reduces the tensor in up
to ``_MAX_PROGRAMS`` chunks; the second, one program, combines the chunks in float64 and
counts the sample into bins.

Where the kernels cannot run (no Triton, a CPU tensor, float64 or complex or integer
tensors, an exact histogram of a huge tensor) or once they failed to build, ``summarize``
falls back to ``tensor_stats``. ``GRADEXPLORER_FUSED_STATS=0`` turns the kernels off;
``GRADEXPLORER_FUSED_STATS=all`` with ``TRITON_INTERPRET=1`` runs them on CPU tensors, in
Triton's interpreter (slow: for tests).

Small CPU tensors (at most ``SMALL_VALUES``) are held, a copy of an activation or a gradient
as it is, and summarised together (``gradexplorer.stats.batched``, one compiled call) when
``flush`` is called (the capture calls it at the end of forward and in ``resolve``) or
whenever ``SMALL_BATCH_BYTES`` of them are held: alone, each cost microseconds of calls
around nanoseconds of arithmetic. ``GRADEXPLORER_BATCHED_STATS=0`` summarises every tensor
alone.

``GRADEXPLORER_BATCHED_STATS=1`` also keeps the device tensors handed to ``summarize_later``
(the layers' gradients, the parameters' gradients, and copies of the activations) and
summarises them together with ``gradexplorer.stats.batched.device_batched_stats`` at
``flush``, or whenever ``BATCH_BYTES`` of them are held: a fixed number of launches instead
of two per tensor. Off by default until ``scripts/gpu_check.py`` (which times both) has
measured it on a GPU; ``GRADEXPLORER_BATCHED_STATS=all`` takes CPU tensors through those torch
operations too (how the tests run them without a GPU).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable
from typing import Any, cast

import torch

from gradexplorer.stats import batched, cpu as cpu_stats, immediate
from gradexplorer.stats.immediate import ImmediateStats
from gradexplorer.stats.moments import (
    HIST_BINS,
    fused_cpu_enabled,
    histogram_range,
    histogram_sample,
    no_finite_stats,
    stats_from_moments,
)
from gradexplorer.stats.pending import PendingRecords
from gradexplorer.stats.record import TensorStats
from gradexplorer.stats.tensor_stats import tensor_stats

log = logging.getLogger(__name__)

_BLOCK = 1024  # elements per program and loop step in the first kernel
_MAX_PROGRAMS = 1024  # chunks of the first kernel, combined by the second in one load
_SAMPLE_BLOCK = 256
#: An exact histogram (``hist_exact_limit=None``) would be counted by the second kernel's
#: single program over every element: above this many, the torch operations do it instead.
_EXACT_FUSED_LIMIT = 1 << 20
_PART = 7  # per chunk, float64: min, max, count, mean, m2, sumsq, sumabs
_ROW = 10 + HIST_BINS  # min, max, mean, m2, sumsq, sumabs, nonzero, nan, inf, sampled; bins
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_BIG = 3.4028234663852886e38  # float32 max: the identity of finite min and max

#: (partials, finish) once built; False when Triton is missing or failed.
_kernels: tuple[Any, Any] | bool | None = None
#: Bytes of gradients ``DeferredStats.summarize_later`` keeps before summarising them
#: together (the memory that batching costs).
BATCH_BYTES = 1 << 30
#: CPU tensors of at most this many values are summarised together, many at a time
#: (``gradexplorer.stats.batched``): alone, such a tensor costs microseconds of calls and
#: Python around nanoseconds of arithmetic. Larger ones take the fused pass at once.
SMALL_VALUES = 1 << 15
#: Bytes of small CPU tensors held (copies of activations, gradients) before they are
#: summarised: what bounds the memory the small batch takes.
SMALL_BATCH_BYTES = 16 << 20
#: dtypes of the small batch (``gradexplorer.stats.cpu.summarize_many``).
SMALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: Rows of each histogram table of ``DeferredStats`` (64 KiB of float32 histograms).
HIST_TABLE_ROWS = 256


def _build_kernels() -> tuple[Any, Any]:
    import triton
    import triton.language as tl

    # The moments are those of gradexplorer.stats.tensor_stats: float64 accumulation (float32 squares of 1e20
    # overflow), each BLOCK's squared deviations taken around the BLOCK's own mean and the
    # blocks merged by Chan's formula (E[x²] - E[x]² cancels when |mean| >> std). float64
    # arithmetic on the loaded block costs nothing measurable: the kernel waits on memory.
    # The kernels' arguments carry no type annotations: Triton reads a kernel's annotations
    # (tl.constexpr, and type names that change how it specialises the arguments).
    @triton.jit
    def partials(x_ptr, part_ptr, cnt_ptr, n, chunk,  # type: ignore[no-untyped-def]
                 BLOCK: tl.constexpr, BIG: tl.constexpr):
        pid = tl.program_id(0)
        start = pid.to(tl.int64) * chunk
        lanes = tl.arange(0, BLOCK)
        vmin = tl.full((BLOCK,), BIG, tl.float32)
        vmax = tl.full((BLOCK,), -BIG, tl.float32)
        vsq = tl.zeros((BLOCK,), tl.float64)
        vabs = tl.zeros((BLOCK,), tl.float64)
        nz = tl.zeros((BLOCK,), tl.int32)
        nnan = tl.zeros((BLOCK,), tl.int32)
        ninf = tl.zeros((BLOCK,), tl.int32)
        cnt = tl.sum(tl.zeros((BLOCK,), tl.float64), axis=0)
        mean = tl.sum(tl.zeros((BLOCK,), tl.float64), axis=0)
        m2 = tl.sum(tl.zeros((BLOCK,), tl.float64), axis=0)
        for i in range(0, chunk, BLOCK):
            offs = start + i + lanes
            inb = offs < n
            x = tl.load(x_ptr + offs, mask=inb, other=0.0).to(tl.float32)
            is_nan = x != x
            is_inf = tl.abs(x) > BIG
            ok = inb & (~is_nan) & (~is_inf)
            xd = tl.where(ok, x.to(tl.float64), 0.0)
            vmin = tl.minimum(vmin, tl.where(ok, x, BIG))
            vmax = tl.maximum(vmax, tl.where(ok, x, -BIG))
            vsq += xd * xd
            vabs += tl.abs(xd)
            nz += (xd != 0.0).to(tl.int32)
            nnan += (inb & is_nan).to(tl.int32)
            ninf += (inb & is_inf).to(tl.int32)
            bc = tl.sum(ok.to(tl.float64), axis=0)
            bmean = tl.sum(xd, axis=0) / tl.maximum(bc, 1.0)
            d = tl.where(ok, xd - bmean, 0.0)
            bm2 = tl.sum(d * d, axis=0)
            tot = cnt + bc
            w = bc / tl.maximum(tot, 1.0)
            delta = bmean - mean
            mean += delta * w
            m2 += bm2 + delta * delta * cnt * w
            cnt = tot
        row = part_ptr + pid * 7
        tl.store(row + 0, tl.min(vmin, axis=0).to(tl.float64))
        tl.store(row + 1, tl.max(vmax, axis=0).to(tl.float64))
        tl.store(row + 2, cnt)
        tl.store(row + 3, mean)
        tl.store(row + 4, m2)
        tl.store(row + 5, tl.sum(vsq, axis=0))
        tl.store(row + 6, tl.sum(vabs, axis=0))
        crow = cnt_ptr + pid * 3
        tl.store(crow + 0, tl.sum(nz, axis=0))
        tl.store(crow + 1, tl.sum(nnan, axis=0))
        tl.store(crow + 2, tl.sum(ninf, axis=0))

    @triton.jit
    def finish(x_ptr, part_ptr, cnt_ptr, out_ptr, g, n_sample, offset, step,  # type: ignore[no-untyped-def]
               BLOCK_G: tl.constexpr, SAMPLE_BLOCK: tl.constexpr, BINS: tl.constexpr, BIG: tl.constexpr):
        rows = tl.arange(0, BLOCK_G)
        rm = rows < g
        lo = tl.min(tl.load(part_ptr + rows * 7 + 0, mask=rm, other=BIG), axis=0)
        hi = tl.max(tl.load(part_ptr + rows * 7 + 1, mask=rm, other=-BIG), axis=0)
        c = tl.load(part_ptr + rows * 7 + 2, mask=rm, other=0.0)
        mu = tl.load(part_ptr + rows * 7 + 3, mask=rm, other=0.0)
        q = tl.load(part_ptr + rows * 7 + 4, mask=rm, other=0.0)
        # gradexplorer.stats.moments.merge_moments: within-chunk plus between-chunk sums of squares.
        total = tl.sum(c, axis=0)
        mean = tl.sum(c * mu, axis=0) / tl.maximum(total, 1.0)
        dm = tl.where(c > 0, mu - mean, 0.0)
        m2 = tl.sum(q, axis=0) + tl.sum(c * dm * dm, axis=0)
        sumsq = tl.sum(tl.load(part_ptr + rows * 7 + 5, mask=rm, other=0.0), axis=0)
        sumabs = tl.sum(tl.load(part_ptr + rows * 7 + 6, mask=rm, other=0.0), axis=0)
        nz = tl.sum(tl.load(cnt_ptr + rows * 3 + 0, mask=rm, other=0).to(tl.int64), axis=0)
        nnan = tl.sum(tl.load(cnt_ptr + rows * 3 + 1, mask=rm, other=0).to(tl.int64), axis=0)
        ninf = tl.sum(tl.load(cnt_ptr + rows * 3 + 2, mask=rm, other=0).to(tl.int64), axis=0)
        # gradexplorer.stats.moments.histogram_range: [min, max], widened when flat.
        flat = hi <= lo
        pad = tl.maximum(tl.abs(lo) * 1e-6, 0.5)
        hlo = tl.where(flat, lo - pad, lo)
        hhi = tl.where(flat, hi + pad, hi)
        none = hi < lo  # no finite value: nothing is counted, keep the arithmetic finite
        hlo = tl.where(none, 0.0, hlo)
        hhi = tl.where(none, 1.0, hhi)
        # gradexplorer.stats.moments.histogram_in_float64: a range wider than float32 holds is binned in float64.
        wide = (hhi - hlo) > BIG
        hlo32 = hlo.to(tl.float32)
        width32 = hhi.to(tl.float32) - hlo32
        bins = tl.arange(0, BINS)
        counts = tl.zeros((BINS,), tl.int32)
        for k0 in range(0, n_sample, SAMPLE_BLOCK):
            k = k0 + tl.arange(0, SAMPLE_BLOCK)
            km = k < n_sample
            x = tl.load(x_ptr + (offset + k.to(tl.int64) * step), mask=km, other=0.0).to(tl.float32)
            ok = km & (x == x) & (tl.abs(x) <= BIG)
            # torch.histc's arithmetic, so that the bins agree with the CPU path.
            pos32 = ((x - hlo32) * BINS / width32).to(tl.int32)
            pos64 = ((x.to(tl.float64) - hlo) * BINS / (hhi - hlo)).to(tl.int32)
            pos = tl.where(wide, pos64, pos32)
            pos = tl.minimum(tl.maximum(pos, 0), BINS - 1)
            hit = ok[:, None] & (pos[:, None] == bins[None, :])
            counts += tl.sum(hit.to(tl.int32), axis=0)
        tl.store(out_ptr + 0, lo)
        tl.store(out_ptr + 1, hi)
        tl.store(out_ptr + 2, mean)
        tl.store(out_ptr + 3, m2)
        tl.store(out_ptr + 4, sumsq)
        tl.store(out_ptr + 5, sumabs)
        tl.store(out_ptr + 6, nz.to(tl.float64))
        tl.store(out_ptr + 7, nnan.to(tl.float64))
        tl.store(out_ptr + 8, ninf.to(tl.float64))
        tl.store(out_ptr + 9, tl.sum(counts, axis=0).to(tl.float64))
        tl.store(out_ptr + 10 + bins, counts.to(tl.float64))

    return partials, finish


def fused_available() -> bool:
    """Whether the fused kernels can be used (Triton imports and they have not failed)."""
    global _kernels
    if os.environ.get("GRADEXPLORER_FUSED_STATS", "1") == "0":
        return False
    if _kernels is None:
        try:
            _kernels = _build_kernels()
        except Exception as exc:  # noqa: BLE001 - no Triton, or one that cannot build these
            log.info("fused GPU statistics unavailable (%s): using torch operations", exc)
            _kernels = False
    return bool(_kernels)


def launch(t: torch.Tensor, hist_limit: int | None) -> tuple[torch.Tensor, int, bool]:
    """Start the summary of ``t`` on its device: (row of ``_ROW`` float64 values, numel,
    whether the histogram counts every element). Raises when the kernels fail."""
    assert isinstance(_kernels, tuple), "fused_available() builds the kernels first"
    partials, finish = _kernels
    x = t.detach().reshape(-1)
    n = x.numel()
    chunk = math.ceil(math.ceil(n / _MAX_PROGRAMS) / _BLOCK) * _BLOCK
    g = math.ceil(n / chunk)
    part = torch.empty((g, _PART), dtype=torch.float64, device=x.device)
    cnt = torch.empty((g, 3), dtype=torch.int32, device=x.device)
    row = torch.empty(_ROW, dtype=torch.float64, device=x.device)
    offset, step, n_sample = histogram_sample(n, hist_limit)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        partials[(g,)](x, part, cnt, n, chunk, BLOCK=_BLOCK, BIG=_BIG)
        finish[(1,)](x, part, cnt, row, g, n_sample, offset, step,
                     BLOCK_G=_MAX_PROGRAMS, SAMPLE_BLOCK=_SAMPLE_BLOCK, BINS=HIST_BINS, BIG=_BIG)
    return row, n, step == 1


def stats_from_row(values: list[float], n: int, exact: bool) -> TensorStats:
    """The statistics record (as ``tensor_stats`` returns it) from one kernel row."""
    lo, hi, mean, m2, sumsq, sumabs, nonzero, nan, inf, sampled = values[:10]
    nan_count, inf_count = int(nan), int(inf)
    m = n - nan_count - inf_count
    if m == 0:
        return no_finite_stats(n, nan_count, inf_count)  # as tensor_stats
    counts = torch.tensor(values[10:], dtype=torch.float32)
    if not exact:
        counts = counts * (m / sampled) if sampled > 0 else torch.zeros(HIST_BINS)
    return stats_from_moments(n, lo, hi, mean, m2, sumsq, sumabs, int(nonzero), nan_count, inf_count,
                              counts, histogram_range(lo, hi), exact and sampled == m)


def _unfilled() -> TensorStats:
    """A record that ``DeferredStats`` hands out now and fills later (``resolve``, ``flush``):
    empty until then, so that whoever holds it sees the statistics once they exist."""
    return cast(TensorStats, {})


class DeferredStats:
    """The statistics of one capture's tensors, computed where they live.

    ``summarize`` returns the dict that will hold a tensor's statistics: filled at once on
    the CPU (``tensor_stats``), filled by ``resolve`` for tensors summarised by the fused
    GPU kernels. Call ``resolve`` once, after the capture's last ``summarize``.

    Parameters
    ----------
    hist_limit : int or None
        As ``tensor_stats``'s ``hist_exact_limit``.
    fused : bool or None
        ``None``: the kernels for CUDA tensors when available; ``True`` also for CPU
        tensors (Triton's interpreter, for tests); ``False``: never.
    later : PendingRecords, optional
        Where the statistics of small CPU tensors, computed together, wait to be written into
        their records until one is read (``gradexplorer.stats.pending``: a capture's
        records); ``None``: written when computed.
    """

    def __init__(self, hist_limit: int | None, fused: bool | None = None, later: PendingRecords | None = None):
        self.hist_limit = hist_limit
        self.later = later
        if fused is None:
            # "all": CPU tensors too, through TRITON_INTERPRET=1 (how tests run the kernels
            # on a machine without a GPU).
            fused = {"0": False, "all": True}.get(os.environ.get("GRADEXPLORER_FUSED_STATS", ""))
        self.fused = fused
        self._pending: list[tuple[TensorStats, torch.Tensor, int, bool]] = []
        # Tensors kept for gradexplorer.stats.batched (GRADEXPLORER_BATCHED_STATS=1, not yet the
        # default: to be measured on a GPU by scripts/gpu_check.py), with their bytes. On
        # the CPU the fused numba pass per tensor is several times faster than batching
        # (docs/benchmarks.md), so CPU tensors are batched only with
        # GRADEXPLORER_BATCHED_STATS=all (how tests run this path without a GPU).
        batched = os.environ.get("GRADEXPLORER_BATCHED_STATS", "")
        self.batched = batched in ("1", "all")
        self._batch_cpu = batched == "all"
        self._later: list[tuple[TensorStats, torch.Tensor]] = []
        self._later_bytes = 0
        # Small CPU tensors, summarised together at flush (or per SMALL_BATCH_BYTES held).
        # GRADEXPLORER_BATCHED_STATS=0: every tensor alone.
        # GRADEXPLORER_BATCHED_STATS=all: the device path for every tensor, and fused=True the
        # Triton kernels (tests of them on a CPU).
        # Public: a capture's hooks test it and call hold_small themselves.
        self.small_on = (batched not in ("0", "all") and self.fused is not True and fused_cpu_enabled()
                          and cpu_stats.available())
        # The histograms of the tensors summarised one by one on the CPU, rows of a table
        # (_hist_row).
        self._hist_table = torch.empty((0, HIST_BINS), dtype=torch.float32)
        self._hist_free = 0
        self._small: list[TensorStats] = []
        self._small_tensors: list[torch.Tensor] = []
        self._small_bytes = 0
        # Small CPU outputs taken as they are handed over, their bytes copied into one buffer,
        # instead of cloned for the batch (gradexplorer.stats.immediate): ``now(t)`` gives the
        # record, filled at the flush, or None for a tensor it cannot take (then hold a clone).
        # Callers skip the call for tensors over ``now_values`` values. None when that path is
        # unavailable.
        self.now: Callable[[torch.Tensor], TensorStats | None] | None = None
        self.now_values = 0
        self._immediate: ImmediateStats | None = None
        if self.small_on and immediate.available():
            limit = SMALL_VALUES if hist_limit is None else max(0, min(SMALL_VALUES, hist_limit))
            self._immediate = ImmediateStats(limit, later=later)
            self.now, self.now_values = self._immediate.add, limit

    def _use_fused(self, t: torch.Tensor) -> bool:
        if self.fused is False or t.dtype not in _DTYPES or t.numel() == 0:
            return False
        if not (t.is_cuda or self.fused):
            return False
        if self.hist_limit is None and t.numel() > _EXACT_FUSED_LIMIT:
            return False
        return fused_available()

    def _is_small(self, t: torch.Tensor) -> bool:
        """Whether ``t`` joins the small CPU batch."""
        return (self.small_on and t.is_cpu and t.dtype in SMALL_DTYPES and 0 < t.numel() <= SMALL_VALUES)

    def hold_small(self, t: torch.Tensor) -> TensorStats:
        """``t`` (which nothing changes before the next flush) for the small batch: a record,
        filled at the flush. For a caller that has checked, as ``summarize`` does, that ``t``
        joins the batch (``small_on``, a CPU tensor of ``SMALL_DTYPES`` with 1 to
        ``SMALL_VALUES`` values): a capture's hooks check it themselves, two calls fewer per
        tensor."""
        stats: TensorStats = {}  # type: ignore[typeddict-item]  # (_unfilled, without the call)
        self._small.append(stats)
        self._small_tensors.append(t)
        self._small_bytes += t.numel() * t.element_size()
        if self._small_bytes >= SMALL_BATCH_BYTES:
            self._flush_small()
        return stats

    def _hist_row(self) -> torch.Tensor:
        """A free row of this capture's histogram table, for one record's ``hist``: one
        allocation per ``HIST_TABLE_ROWS`` records rather than one per record
        (``gradexplorer.stats.cpu.summarize``'s ``hist_into``)."""
        if self._hist_free == 0:
            self._hist_table = torch.empty((HIST_TABLE_ROWS, HIST_BINS), dtype=torch.float32)
            self._hist_free = HIST_TABLE_ROWS
        self._hist_free -= 1
        return self._hist_table[HIST_TABLE_ROWS - 1 - self._hist_free]

    def summarize(self, t: torch.Tensor, into: TensorStats | None = None) -> TensorStats:
        """The statistics record of ``t``: filled now, or by ``flush`` or ``resolve`` for a
        small CPU tensor (a copy of it, so that later changes to ``t`` do not matter) and a
        tensor the fused GPU kernels summarise. ``into``: fill that (empty) record now instead
        of a new one."""
        global _kernels
        if into is None and self._is_small(t):
            return self.hold_small(t.detach().clone())
        stats = _unfilled() if into is None else into
        if self._use_fused(t):
            try:
                row, n, exact = launch(t, self.hist_limit)
            except Exception as exc:  # noqa: BLE001 - a Triton or driver failure: fall back for good
                log.warning("fused GPU statistics failed (%s: %s): using torch operations",
                            type(exc).__name__, exc)
                _kernels = False
            else:
                self._pending.append((stats, row, n, exact))
                return stats
        got = tensor_stats(t, self.hist_limit, hist_into=self._hist_row() if t.is_cpu else None)
        if into is None:
            return got
        into.update(got)
        return into

    def summarize_copy(self, t: torch.Tensor) -> tuple[TensorStats, torch.Tensor | None]:
        """``summarize(t)`` and, for a CPU tensor, a copy of it written by the same pass
        (``gradexplorer.stats.cpu``): the statistics of a kept tensor cost no second read. The
        copy is ``None`` where that path does not apply: copy it yourself."""
        if t.device.type == "cpu" and not self._use_fused(t):
            if self._is_small(t):
                # The copy kept is the copy summarised, with the other small tensors.
                kept = t.detach().clone(memory_format=torch.contiguous_format)
                return self.hold_small(kept), kept
            if fused_cpu_enabled():
                got = cpu_stats.summarize(t, self.hist_limit, copy=True, hist_into=self._hist_row())
                if got is not None:
                    return got
        return self.summarize(t), None

    def batches_on(self, device: torch.device) -> bool:
        """Whether ``summarize_later`` keeps tensors on ``device`` for a batch."""
        return self.batched and (self._batch_cpu or device.type != "cpu")

    def batches(self, t: torch.Tensor) -> bool:
        """Whether ``summarize_later(t)`` keeps ``t`` for a batch (else it summarises it now)."""
        return self.batched and (self._batch_cpu or not t.is_cpu)

    def summarize_later(self, t: torch.Tensor) -> TensorStats:
        """``summarize(t)`` for a tensor nothing will modify before the next ``flush`` (a
        gradient handed to a hook, a copy of an output taken when its module returned): with batching on,
        kept and summarised with the others by ``gradexplorer.stats.batched`` at ``flush`` or once
        they hold ``BATCH_BYTES``, in a few operations for all."""
        if not self.batches(t):
            if self._is_small(t):
                return self.hold_small(t.detach() if t.requires_grad else t)
            return self.summarize(t)
        stats = _unfilled()
        self._later.append((stats, t.detach()))
        self._later_bytes += t.numel() * t.element_size()
        if self._later_bytes >= BATCH_BYTES:
            self.flush()
        return stats

    def _flush_small(self) -> None:
        if self._small:
            records, tensors = self._small, self._small_tensors
            self._small, self._small_tensors, self._small_bytes = [], [], 0
            # Filled in place: the records handed out. (Looked up when called: tests wrap it.)
            batched.batched_stats(tensors, self.hist_limit, records, self.later)

    def flush(self) -> None:
        """Summarise the tensors kept by ``summarize_later`` (and the small CPU tensors) now,
        together, and let them go; fill the records of the ones summarised as handed over."""
        if self._immediate is not None:
            self._immediate.fill()
        self._flush_small()
        if self._later:
            try:
                # looked up when called: tests wrap it
                done = batched.device_batched_stats([t for _s, t in self._later], self.hist_limit)
            except Exception as exc:  # noqa: BLE001 - its buffers can exhaust a full GPU: one at a time
                log.warning("batched statistics failed (%s: %s): summarising one tensor at a time",
                            type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
                self.batched = False  # for the rest of this capture
                # The per-tensor kernels (small buffers), resolved with the other rows.
                for stats, t in self._later:
                    self.summarize(t, into=stats)
            else:
                for (stats, _t), got in zip(self._later, done):
                    stats.update(got)
        self._later.clear()
        self._later_bytes = 0

    def resolve(self) -> None:
        """Fill the records of the fused summaries: one device-to-host copy for all."""
        self.flush()
        if not self._pending:
            return
        table = torch.stack([row for _s, row, _n, _e in self._pending]).cpu().tolist()
        for (stats, _row, n, exact), values in zip(self._pending, table):
            stats.update(stats_from_row(values, n, exact))
        self._pending.clear()

    def __len__(self) -> int:
        return (len(self._pending) + len(self._later) + len(self._small)
                + (len(self._immediate) if self._immediate is not None else 0))
