"""One fused, multithreaded pass per tensor on the CPU, compiled with numba.

The torch path of ``gradexplorer.stats.tensor_stats`` reads a tensor five to seven times (aminmax, float64
conversion, sum, two dot products, abs, sign) and ``isfinite`` costs more than all of them
(docs/benchmarks.md, "The CPU pass's design figures").
Here the tensor is read from memory once, in blocks of ``cpu_kernels.BLOCK`` elements.

Each block is summed in float64: a first loop sums the deviations from the block's first
value and their squares, and the magnitudes (a value inside the block keeps the squares
within a block's spread, so no cancellation is left for rounding to amplify). When those
sums are finite, so is every value of the block, and a second loop over it, still in the
L1 cache, takes the minimum and maximum and counts the zeros in the data's own float type
(float32 lanes for float32 and half data), compiled without NaN semantics. A block holding
NaN or Inf is summed again by a careful loop over its finite values (rare). Meanwhile the
next block is prefetched a few cache lines at a time, so that its read overlaps this
block's arithmetic. The
statistics are then within float64's roundings of float64 NumPy (about 1e-12 relative),
far inside the accuracy contract's 1e-6 (``docs/benchmarks.md``). Sums in float32 lanes,
over runs of 128 values added in float64, were measured against this inside captures of
resnet50, vit_b_16 and efficientnet_b0: there, where the pass waits on memory, they were
no faster (docs/benchmarks.md, "float32 lanes or float64"), so the one CPU pass is float64.

Blocks are merged by ``gradexplorer.stats.moments.chan_merge`` (compiled by numba). Tensors of
over a million values, on a machine with four or more numba threads, are cut into chunks
of blocks that run on numba's threads (``prange``, the workqueue layer: its OpenMP layer
fought torch's OpenMP threads), and the chunks are merged at the end of the same compiled
call. The histogram's elements (the strided sample ``gradexplorer.stats.moments.histogram_sample``
picks, every element for small tensors, then read in place) are gathered while their
block is in the cache and binned at the end of that call too: one call per tensor, whose
result Python reads as one list. In full capture the same pass also writes the kept copy,
block by block from the cache, so that the copy and the statistics cost one read of the
tensor (``summarize(..., copy=True)``).

float16 and bfloat16 (which numba cannot do arithmetic in) are read as their 16-bit
patterns and widened through a 65,536-entry table; integers and bools are widened to
float64; non-contiguous tensors are made contiguous first. Anything else (complex, float8,
non-CPU, a numba that is missing or fails to compile) returns ``None`` and
``gradexplorer.stats.moments.torch_stats`` does the work. ``GRADEXPLORER_CPU_KERNEL=0`` turns this path off.

Compiled code is cached on disk (``cache=True``, in ``__pycache__`` next to the kernels or
under ``NUMBA_CACHE_DIR``), so only the first process on a machine pays the compile time,
once per input dtype; ``compile_seconds`` records what this process paid (compiling, or
loading from the cache).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
from typing import Any, Literal, cast, overload

import numpy as np
import torch

from gradexplorer.stats.moments import (
    HIST_BINS,
    empty_stats,
    fused_cpu_enabled,
    histogram_sample,
    no_finite_stats,
    stats_from_moments,
    torch_stats,
)
from gradexplorer.stats.pending import PendingRecords
from gradexplorer.stats.record import TensorStats

log = logging.getLogger(__name__)

#: Tensors up to this many elements run on the calling thread (no parallel region): inside
#: a capture, a parallel launch for fewer cost more than it saved (measured on resnet50's
#: tensors of 64Ki to 1Mi values: docs/benchmarks.md, "The CPU pass's design figures").
_SERIAL_LIMIT = 1 << 20
#: With fewer numba threads than this, every tensor runs serially. Inside a capture on two
#: cores the parallel pass was no faster than the serial one, even on resnet50's largest
#: tensors: one core already reads memory about as fast as two, and torch's OpenMP worker,
#: which spins for a while after each operation, holds the second core while the hooks run
#: (two Python threads, the helper pinned to the other core, did no better; the figures:
#: docs/benchmarks.md, "The CPU pass's design figures").
_PARALLEL_MIN_THREADS = 4
#: Chunks per thread of a parallel pass: several, so that an unlucky thread does not hold the rest.
_CHUNKS_PER_THREAD = 4

_NUMPY_DTYPES = {
    torch.float32: "float32", torch.float64: "float64", torch.int8: "int8", torch.uint8: "uint8",
    torch.int16: "int16", torch.int32: "int32", torch.int64: "int64", torch.bool: "bool",
}
_HALF = (torch.float16, torch.bfloat16)

_state: dict = {"kernels": None}  # None: not built yet; False: unavailable
_lock = threading.Lock()
_parallel_lock = threading.Lock()
_tables: dict = {}
_keys: dict = {}
#: Seconds spent compiling (or loading from the cache) per input dtype, in this process.
compile_seconds: dict[str, float] = {}


def _build() -> dict[str, Any]:

    import numba
    import numpy as np

    if not os.environ.get("NUMBA_THREADING_LAYER"):
        # numba's OpenMP layer and torch's OpenMP threads spin against each other between
        # parallel regions, which made the kernel several times slower inside a capture
        # than alone (docs/benchmarks.md). The workqueue layer does not spin (and is
        # serialised by _parallel_lock).
        numba.config.THREADING_LAYER = "workqueue"  # type: ignore[attr-defined]

    from gradexplorer.stats import cpu_kernels as k  # deferred: numba compiles them on import (seconds)

    return {"serial": k.serial, "parallel": k.parallel, "many": k.many, "result_cols": k.RESULT,
            "float32_empty": np.empty(0, np.float32), "float64_empty": np.empty(0, np.float64),
            "uint16": np.empty(0, np.uint16),
            "threads": numba.get_num_threads(),
            "no_table": np.zeros(1, np.int8), "float64": np.dtype(np.float64)}


def available() -> bool:
    """Whether the numba kernels can be used (numba imports and has not failed)."""
    if _state["kernels"] is None:
        with _lock:
            if _state["kernels"] is None:
                try:
                    _state["kernels"] = _build()
                except Exception as exc:  # noqa: BLE001 - no numba, or one that cannot build these
                    log.info("fused CPU statistics unavailable (%s): using torch operations", exc)
                    _state["kernels"] = False
    return bool(_state["kernels"])


_prepared: set = set()


def needs_preparing(dtypes: Any) -> bool:
    """Whether :func:`prepare` has work for ``dtypes`` (torch dtypes) in this process."""
    return (fused_cpu_enabled() and available()
            and any((d in _NUMPY_DTYPES or d in _HALF) and d not in _prepared for d in dtypes))


def prepare(dtypes: Any) -> list[torch.dtype]:
    """Compile the kernels for ``dtypes`` now (or load them from numba's on-disk cache),
    serial, parallel and batched (``summarize_many``'s), so that a capture's first hooks
    and first flush do not pay for it in the middle of its forward (seconds per dtype the
    first time on a machine, much less from numba's cache: docs/benchmarks.md, "Where the
    time goes").

    Kernels compiled in one process agree with each other to the last bit, and so do
    kernels loaded from one process's cache; a kernel compiled here beside one loaded from
    a cache that another process wrote may order a block's float64 sums differently (other
    vector code for the same ``fastmath`` loop): about 1e-14 relative, far inside the
    accuracy contract, but no longer the same number on both paths.

    Returns
    -------
    list of torch.dtype
        The dtypes prepared by this call (none when numba is unavailable).
    """
    done = []
    for d in dtypes:
        if not needs_preparing([d]):
            continue
        for n in (8, _SERIAL_LIMIT + 1):  # the serial kernel, and the parallel one where used
            summarize(torch.zeros(n, dtype=d), None)
        if d in _MANY_DTYPES:
            summarize_many([torch.zeros(8, dtype=d)], None)
        _prepared.add(d)
        done.append(d)
    return done


def widening_table(dtype: torch.dtype) -> Any:
    """float32 value of every 16-bit pattern of a half type."""
    tab = _tables.get(dtype)
    if tab is None:
        bits = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16)
        tab = _tables[dtype] = bits.view(dtype).float().numpy()
    return tab


def _readable(t: torch.Tensor) -> tuple[Any, Any, torch.Tensor | None] | None:
    """(numpy view of ``t``'s elements in memory order, widening table or None, the tensor
    that view reads when it is a contiguous copy made here, else None), or None."""
    x = t.detach()
    if x.dtype is torch.float32 and x.is_cpu and x.is_contiguous() and not x.is_neg():
        return x.numpy().reshape(-1), None, None  # most of a capture's tensors: the fewest calls
    if not x.is_cpu or x.is_complex():
        return None
    if x.dtype in _HALF:
        dense = x.contiguous()
        return (dense.reshape(-1).view(torch.int16).numpy().view("uint16"), widening_table(x.dtype),
                _fresh(dense, t))
    if x.dtype not in _NUMPY_DTYPES:
        return None
    if x.is_conj() or x.is_neg():
        x = x.resolve_conj().resolve_neg()
    dense = x.contiguous()
    return dense.reshape(-1).numpy(), None, _fresh(dense, t)


def _fresh(dense: torch.Tensor, t: torch.Tensor) -> torch.Tensor | None:
    """``dense`` when it is a copy of ``t``'s values in memory of its own, else None."""
    return dense if dense.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() else None


@overload
def summarize(t: torch.Tensor, hist_limit: int | None, copy: Literal[False] = False,
              hist_into: torch.Tensor | None = None) -> TensorStats | None:
    ...


@overload
def summarize(t: torch.Tensor, hist_limit: int | None, copy: Literal[True],
              hist_into: torch.Tensor | None = None) -> tuple[TensorStats, torch.Tensor] | None:
    ...


def summarize(t: torch.Tensor, hist_limit: int | None, copy: bool = False,
              hist_into: torch.Tensor | None = None) -> TensorStats | tuple[TensorStats, torch.Tensor] | None:
    """``gradexplorer.stats.tensor_stats.tensor_stats`` of a CPU tensor in one fused pass, or ``None`` when this
    path cannot take it (then use ``gradexplorer.stats.moments.torch_stats``).

    Parameters
    ----------
    t : torch.Tensor
        A CPU tensor; non-contiguous ones are made contiguous first.
    hist_limit : int or None
        As ``tensor_stats``'s ``hist_exact_limit``.
    copy : bool
        Also return a contiguous copy of ``t`` (same dtype and shape), written by the same
        pass: then the result is ``(stats, copy)``.
    hist_into : torch.Tensor, optional
        A float32 CPU tensor of ``HIST_BINS`` values to hold the histogram (the record's
        ``hist``), instead of a tensor of its own: a row of a table that a capture's records
        share (``gradexplorer.stats.device.DeferredStats``). Hundreds of small allocations
        that live as long as the records, between the large tensors of a pass, left the
        heap of the C allocator in pieces: the next large tensors took fresh pages
        (docs/benchmarks.md, "Histograms in one table per capture").
    """
    k = _state["kernels"]
    if not k:
        if k is False or not available():
            return None
        k = _state["kernels"]
    readable = _readable(t)
    if readable is None:
        return None
    x, table, dense = readable
    n = x.size
    if n == 0:
        stats = empty_stats()
        return (stats, t.detach().clone(memory_format=torch.contiguous_format)) if copy else stats
    use_table = table is not None
    if table is None:
        table = k["no_table"]  # its dtype (not float32) tells the kernels to read x directly
    # A tensor read through a contiguous copy made above (a transposed or strided view, a
    # negated view): that copy is the one kept, the pass writes none (one copy, not two).
    write = copy and dense is None
    out = x[:0]
    if copy:
        dst = dense if dense is not None else torch.empty(t.shape, dtype=t.dtype)
    if write:
        out = dst.reshape(-1).view(torch.int16).numpy().view("uint16") if use_table else dst.reshape(-1).numpy()
    dtype = x.dtype
    key = _keys.get((dtype, use_table))
    if key is None:
        key = _keys[(dtype, use_table)] = str(dtype) + ("/table" if use_table else "")
    first = key not in compile_seconds
    t0 = time.perf_counter() if first else 0.0
    offset, step, count = histogram_sample(n, hist_limit)
    wide = dtype == k["float64"]
    try:
        # The workqueue layer aborts the process on concurrent parallel launches (the
        # window's histogram while a capture runs): a busy pool means the serial kernel.
        if (n > _SERIAL_LIMIT and k["threads"] >= _PARALLEL_MIN_THREADS
                and _parallel_lock.acquire(blocking=False)):
            try:
                nchunks = max(1, min(k["threads"] * _CHUNKS_PER_THREAD, n // 2048))
                row, counts = k["parallel"](x, table, write, out, nchunks, offset, step, count, wide)
            finally:
                _parallel_lock.release()
        else:
            row, counts = k["serial"](x, table, write, out, offset, step, count, wide)
    except Exception as exc:  # noqa: BLE001 - a compile or runtime failure: fall back for good
        log.warning("fused CPU statistics failed (%s: %s): using torch operations", type(exc).__name__, exc)
        _state["kernels"] = False
        return None
    if first:
        compile_seconds[key] = time.perf_counter() - t0
    hist = torch.from_numpy(counts) if hist_into is None else hist_into.copy_(torch.from_numpy(counts))
    got = _stats_of(row.tolist(), hist, n, step == 1, wide)
    if got is None:  # float64 values whose squares leave float64: the scaled torch path
        got = torch_stats(t, hist_limit)
    return (got, dst) if copy else got


#: The dtypes ``summarize_many`` lays end to end and summarises in one compiled call.
_MANY_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def summarize_many(tensors: list[torch.Tensor], hist_limit: int | None,
                   into: list[TensorStats] | None = None,
                   later: PendingRecords | None = None) -> list[TensorStats] | None:
    """``summarize`` of every tensor of ``tensors`` (CPU tensors), or ``None``
    when numba is unavailable (then summarise them one by one).

    The tensors of each floating dtype are summarised by one compiled call over a table of
    their addresses, read where they lie (``cpu_kernels.many``: the per-tensor pass,
    ``serial``, over each); others take ``summarize`` one by one. Each tensor's
    statistics are those ``summarize`` gives it alone: the same kernel over the same values.
    Made for many small tensors, whose cost alone is the call, not the values (a capture of
    a 200-layer MLP at batch 4: 256 values per tensor). ``into``: one empty record per tensor
    to fill (and return) instead of new ones. ``later``: with ``into``, the records of the
    tensors the compiled call summarises are written when ``later`` fills them (a capture's:
    ``gradexplorer.stats.pending``), not now.
    """
    k = _state["kernels"]
    if not k:
        if k is False or not available():
            return None
        k = _state["kernels"]
    count = len(tensors)
    dtypes = [t.dtype for t in tensors]
    numels = [t.numel() for t in tensors]
    dtype = dtypes[0] if count else None
    if dtype in _MANY_DTYPES and dtypes.count(dtype) == count and 0 not in numels:
        # One dtype, no empty tensor (a capture's small tensors): one group, no index lists.
        try:
            return _many_of_one_dtype(k, dtype, tensors, hist_limit, into, numels, later)
        except Exception as exc:  # noqa: BLE001 - a compile or runtime failure: fall back for good
            log.warning("fused CPU statistics failed (%s: %s): using torch operations", type(exc).__name__, exc)
            _state["kernels"] = False
            return None
    out: list[TensorStats | None] = [None] * count
    groups: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        dtype = dtypes[i]
        if dtype in _MANY_DTYPES and numels[i]:
            idx = groups.get(dtype)
            if idx is None:
                groups[dtype] = [i]
            else:
                idx.append(i)
        else:
            got = summarize(t, hist_limit) or torch_stats(t, hist_limit)
            if into is not None:
                into[i].update(got)
                got = into[i]
            out[i] = got
    for dtype, idx in groups.items():
        group = [tensors[i] for i in idx]
        records = None if into is None else [into[i] for i in idx]
        try:
            done = _many_of_one_dtype(k, dtype, group, hist_limit, records, [numels[i] for i in idx], later)
        except Exception as exc:  # noqa: BLE001 - a compile or runtime failure: fall back for good
            log.warning("fused CPU statistics failed (%s: %s): using torch operations", type(exc).__name__, exc)
            _state["kernels"] = False
            return None
        for i, stats in zip(idx, done):
            out[i] = stats
    return out  # type: ignore[return-value]  # every slot filled above


def _many_of_one_dtype(k: dict, dtype: torch.dtype, tensors: list[torch.Tensor],
                       hist_limit: int | None, into: list[TensorStats] | None,
                       numels: list[int], later: PendingRecords | None = None) -> list[TensorStats]:
    # A table of the tensors' addresses: the kernel reads each where it lies (laying them
    # end to end first, even in one torch call for all, cost more than the kernel). A tensor
    # that is not one dense run of memory is made one, and held until the call returns.
    held = [t.detach().resolve_neg().contiguous() for t in tensors if not t.is_contiguous() or t.is_neg()]
    if held:
        it = iter(held)
        tensors = [next(it) if not t.is_contiguous() or t.is_neg() else t for t in tensors]
    addresses = np.array([t.data_ptr() for t in tensors], np.int64)
    got = _many_at(k, dtype, addresses, numels, hist_limit, into, tensors if dtype == torch.float64 else None,
                   later)
    del held  # (kept alive through the call above)
    return got


def summarize_at(addresses: Any, numels: list[int], dtype: torch.dtype,
                 into: list[TensorStats], later: PendingRecords | None = None) -> list[TensorStats]:
    """``summarize`` of dense runs of float32, float16 or bfloat16 values in host memory:
    run ``i`` is ``numels[i]`` values (at least one) at address ``addresses[i]`` (an int64
    array), every value binned in its histogram. Its record is written into ``into[i]`` (empty
    records, as handed out), and the records are returned. One compiled call for all, the
    kernel of ``summarize_many``: each run gets the numbers ``summarize`` gives a tensor of the
    same values. The caller keeps the memory alive through the call and checks
    :func:`available` first. ``later``: the records are written when it fills them, as
    ``summarize_many``'s."""
    if dtype not in _MANY_DTYPES or dtype == torch.float64:
        raise ValueError(f"summarize_at reads float32, float16 or bfloat16 values, not {dtype}")
    return _many_at(_state["kernels"], dtype, addresses, numels, None, into, None, later)


def _many_at(k: dict, dtype: torch.dtype, addresses: Any, numels: list[int], hist_limit: int | None,
             into: list[TensorStats] | None, float64_tensors: list[torch.Tensor] | None,
             later: PendingRecords | None = None) -> list[TensorStats]:
    """The compiled call of ``summarize_many`` over dense runs of ``dtype`` values at
    ``addresses``, and their records (``float64_tensors``: the tensors, for float64 data),
    written now or, with ``later`` and records handed in (``into``), when it fills them."""
    count = len(numels)
    sizes = np.array(numels, np.int64)
    half = dtype in _HALF
    if half:
        like = k["uint16"]
        table = widening_table(dtype)
    else:
        like = k["float64_empty"] if dtype == torch.float64 else k["float32_empty"]
        table = k["no_table"]
    counts = sizes.copy()
    # The histogram's sample of each (histogram_sample): every value of the small ones.
    offsets = np.zeros(count, np.int64)
    steps = np.ones(count, np.int64)
    if hist_limit is not None:
        for i in np.flatnonzero(counts > hist_limit).tolist():
            offsets[i], steps[i], counts[i] = histogram_sample(int(sizes[i]), hist_limit)
    rows = np.empty((count, k["result_cols"]), np.float64)
    hists = np.empty((count, HIST_BINS), np.float32)
    key = str(like.dtype) + ("/table" if half else "") + "/many"
    first = key not in compile_seconds
    t0 = time.perf_counter() if first else 0.0
    k["many"](addresses, sizes, like, table, offsets, steps, counts, dtype == torch.float64, rows, hists)
    if first:
        compile_seconds[key] = time.perf_counter() - t0
    exact = (steps == 1).tolist()
    if later is not None and into is not None and float64_tensors is None:
        # The rows and histograms wait with the empty records: no tensor is held (float64
        # rows may need theirs: written now).
        later.add(functools.partial(records_from_rows, rows, hists, numels, exact, into, None, hist_limit),
                  bool(rows[:, 7:9].any()))  # (the NaN and Inf counts: records_from_rows's columns)
        return into
    records = into if into is not None else [cast(TensorStats, {}) for _ in range(count)]
    return records_from_rows(rows, hists, numels, exact, records, float64_tensors, hist_limit)


def records_from_rows(rows: Any, hists: Any, numels: list[int], exact: list[bool],
                      records: list[TensorStats], float64_tensors: list[torch.Tensor] | None,
                      hist_limit: int | None) -> list[TensorStats]:
    """The records of the kernels' result rows (``cpu_kernels.RESULT`` columns, one per
    tensor) and histograms (``hists``, float32, one row per tensor), written into
    ``records`` (empty ones, as handed out) and returned. ``numels``: the tensors' value
    counts; ``exact``: whether each histogram counted every value. ``float64_tensors``:
    the tensors themselves when they are float64, whose squares may leave float64 (then the
    scaled torch path summarises them); ``None`` for float32 and half tensors, whose rows
    are always enough."""
    # One view per tensor of the one histogram table (unbind: one call for all).
    views = torch.from_numpy(hists).unbind(0)
    if float64_tensors is not None:
        return [_record_of(row, views[i], numels[i], exact[i], True, records[i], float64_tensors[i], hist_limit)
                for i, row in enumerate(rows.tolist())]
    # stats_from_moments's arithmetic for every row at once, in the same float64 operations
    # in the same order (each rounded once, as Python's floats are): the same numbers, with
    # a few NumPy calls for the batch instead of a call and its Python per tensor (a
    # capture's hundreds of small tensors: the records cost more than the kernel).
    sizes = np.array(numels, np.int64)
    nan_count = rows[:, 7].astype(np.int64)
    inf_count = rows[:, 8].astype(np.int64)
    m = sizes - nan_count - inf_count  # the finite values (int, as stats_from_moments)
    mf = m.astype(np.float64)
    with np.errstate(all="ignore"):  # (rows without a finite value take the slow path)
        mean, m2 = rows[:, 1], rows[:, 2]
        sumsq = m2 + rows[:, 0] * mean * mean  # both terms >= 0: no cancellation
        l2 = np.sqrt(np.where(sumsq < 0.0, 0.0, sumsq))
        std = np.sqrt(np.where(m2 < 0.0, 0.0, m2) / np.where(m > 1, mf - 1.0, 1.0))
        mean_abs = rows[:, 3] / mf
        zero_fraction = (mf - rows[:, 6]) / sizes.astype(np.float64)
    # The usual row: some finite value (the kernel's count), no statistic overflowing.
    usual = ((rows[:, 0] != 0) & (l2 != np.inf) & (std != np.inf)).tolist()
    out = []
    for i, (lo, hi, mu, sd, ma, norm, zf, nans, infs, hlo, hhi, whole, record) in enumerate(zip(
            rows[:, 4].tolist(), rows[:, 5].tolist(), mean.tolist(), std.tolist(), mean_abs.tolist(),
            l2.tolist(), zero_fraction.tolist(), nan_count.tolist(), inf_count.tolist(), rows[:, 10].tolist(),
            rows[:, 11].tolist(), exact, records)):
        if not usual[i]:
            # (not float64: _stats_of always has the record, no tensor is needed)
            out.append(_record_of(rows[i].tolist(), views[i], numels[i], whole, False, record, None, hist_limit))
            continue
        # stats_from_moments's record, inline (written for speed: one per small tensor)
        record["numel"] = numels[i]
        record["min"] = lo
        record["max"] = hi
        record["mean"] = mu
        record["std"] = sd
        record["mean_abs"] = ma
        record["l2"] = norm
        record["zero_fraction"] = zf
        record["nan_count"] = nans
        record["inf_count"] = infs
        record["hist"] = views[i]
        record["hist_range"] = (hlo, hhi)
        record["hist_exact"] = whole
        record["overflow"] = ()
        out.append(record)
    return out


def _record_of(row: list, hist: torch.Tensor, n: int, exact: bool, wide: bool, record: TensorStats,
               t: torch.Tensor | None, hist_limit: int | None) -> TensorStats:
    """The record of one kernel result row, written into ``record`` (``_stats_of``, with the
    torch path where float64 values (``wide``, ``t`` given) left float64's range in their
    squares)."""
    got = _stats_of(row, hist, n, exact, wide, record)
    if got is None:  # float64 values whose squares leave float64: the scaled torch path
        assert t is not None, "only float64 rows need their tensor"
        record.update(torch_stats(t, hist_limit))
        got = record
    return got


def _stats_of(row: list, hist: torch.Tensor, n: int, exact: bool, wide: bool = True,
              into: TensorStats | None = None) -> TensorStats | None:
    """The record of one kernel result row (Python floats from here: for the hundreds of
    small tensors of a capture, NumPy calls on one-row arrays cost more than the kernel);
    ``None`` where float64 data (``wide``) left float64's range in its squares. ``into``:
    the empty record to fill."""
    m, mean, m2, sumabs, lo, hi, nonzero, nan_count, inf_count, _sampled, hlo, hhi = row
    if m == 0:
        got = no_finite_stats(n, int(nan_count), int(inf_count))
        if into is not None:
            into.update(got)
            return into
        return got
    sumsq = m2 + m * mean * mean  # both terms >= 0: no cancellation
    # Squares that overflowed, or magnitudes below 1e-150 whose squares underflow: only
    # float64 data can get here.
    if wide and (not (sumsq < _INF and sumabs < _INF) or 0 < max(-lo, hi) < 1e-150):
        return None
    # hist: scaled to the finite count by the kernel when subsampled
    return stats_from_moments(n, lo, hi, mean, m2, sumsq, sumabs, int(nonzero), int(nan_count),
                              int(inf_count), hist, (hlo, hhi), exact, into=into)


_INF = math.inf
