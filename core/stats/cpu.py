"""One fused, multithreaded pass per tensor on the CPU, compiled with numba.

The torch path of ``gradexplorer.stats.summary`` reads a tensor five to seven times (aminmax, float64
conversion, sum, two dot products, abs, sign) and ``isfinite`` costs more than all of them
(34 ms on one 8×256×56×56 tensor, against about 1 ms for a min, max or norm).
Here the tensor is read from memory once, in blocks of ``cpu_kernels.BLOCK`` elements.

float32 data (most of a capture) take two loops per block, in float32 lanes. The first, as
the block arrives from memory, takes the minimum, maximum and zero count, and an integer test
of the exponent bits says whether the block held NaN or Inf. The second, from the L1 cache,
sums the magnitudes, the deviations from the previous block's mean (neighbouring values are
alike) and their squares, scaled by a power of two (exact) into float32's comfortable range,
over runs of ``cpu_kernels.LANE_RUN`` values, each run added in float64. When that shift or
scale does not fit the block (its mean is far from the previous one's, its spread far from
it), the sums are taken again around its own mean with its own scale. Meanwhile the next
block is prefetched, so that its read overlaps this block's arithmetic. That holds the
accuracy contract (every statistic within 1e-6 relative of float64: ``docs/benchmarks.md``):
no cancellation is left for float32's rounding to amplify, each lane sums at most
``LANE_RUN`` / 8 terms, and runs and blocks merge in float64. float16 and bfloat16 blocks take float32
lanes too (three loops: their sums, their extremes and zeros, their deviations from the
block's mean). ``GRADEXPLORER_CPU_FLOAT32=0``
turns the float32 lanes off; float64 and integer data always take float64.

The float64 pass: a first loop over a block sums, in float64, the deviations from the
block's first value and their squares, and the magnitudes. When those sums are finite,
so is every value of the block, and a second loop over it, still in the L1 cache, takes
the minimum and maximum and counts the zeros in the data's own float type, compiled
without NaN semantics. A block holding NaN or Inf (in either pass), or one that the
float32 lanes cannot take within the contract, is summed by these float64 loops; one
holding NaN or Inf is summed again by a careful loop over its finite values (rare).

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

import logging
import math
import os
import threading
import time
from typing import Any, Literal, overload

import torch

from gradexplorer.stats.moments import (
    empty_stats,
    fused_cpu_enabled,
    histogram_sample,
    no_finite_stats,
    stats_from_moments,
    torch_stats,
)
from gradexplorer.stats.record import TensorStats

log = logging.getLogger(__name__)

#: Tensors up to this many elements run on the calling thread (no parallel region): inside
#: a capture, a parallel launch for fewer cost more than it saved (resnet50 at batch 8, its
#: 194 tensors of 64Ki to 1Mi values: 0.80 ns per value in parallel, 0.55 serial).
_SERIAL_LIMIT = 1 << 20
#: With fewer numba threads than this, every tensor runs serially. Inside a capture on the
#: two-core build machine the parallel pass was slower than the serial one even on
#: resnet50's largest tensors (0.33-0.36 against 0.28-0.30 ns per value), and alone it
#: gained little: there one core already reads memory about as fast as two. On a two-core
#: AVX-512 Xeon two threads took 0.34 against 0.51 ns per value alone, but inside a capture
#: 0.42 against 0.41: torch's OpenMP worker, which spins for a while after each operation,
#: holds the second core while the hooks run (two Python threads, the helper pinned to the
#: other core, did no better).
_PARALLEL_MIN_THREADS = 4
#: Chunks per thread of a parallel pass: several, so that an unlucky thread does not hold the rest.
_CHUNKS_PER_THREAD = 4

_NUMPY_DTYPES = {
    torch.float32: "float32", torch.float64: "float64", torch.int8: "int8", torch.uint8: "uint8",
    torch.int16: "int16", torch.int32: "int32", torch.int64: "int64", torch.bool: "bool",
}
_HALF = (torch.float16, torch.bfloat16)

#: float32 and half tensors summed in float32 lanes where that holds the accuracy contract
#: (``cpu_kernels.chunk``); ``GRADEXPLORER_CPU_FLOAT32=0`` sums them in float64 instead.
#: On an AVX-512 Xeon the float32 lanes take 0.17 ns per value over a tensor in the L1
#: cache against 0.20 for float64's; inside a capture, where the pass waits on memory, both
#: take 0.40-0.42 on resnet50 at batch 8 (docs/benchmarks.md). The float64 pass keeps the
#: CPU pass, the device kernels and the merges equal to 1e-9 rather than to the contract's 1e-6.
float32_lanes = os.environ.get("GRADEXPLORER_CPU_FLOAT32", "1") != "0"

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
        # parallel regions: inside a capture the kernel ran 4x slower than alone. The
        # workqueue layer does not spin (and is serialised by _parallel_lock).
        numba.config.THREADING_LAYER = "workqueue"  # type: ignore[attr-defined]

    from gradexplorer.stats import cpu_kernels as k  # deferred: numba compiles them on import (seconds)

    return {"serial": k.serial, "parallel": k.parallel, "threads": numba.get_num_threads(),
            "no_table": np.zeros(1, np.int8), "float64": np.dtype(np.float64),
            "float32": np.dtype(np.float32)}


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
    serial and parallel, so that a capture's first hooks do not pay for it in the middle
    of its forward: about 10 s per dtype the first time on a machine, 0.4 s later.

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
        _prepared.add(d)
        done.append(d)
    return done


def _table(dtype: torch.dtype) -> Any:
    """float32 value of every 16-bit pattern of a half type."""
    tab = _tables.get(dtype)
    if tab is None:
        bits = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16)
        tab = _tables[dtype] = bits.view(dtype).float().numpy()
    return tab


def _readable(t: torch.Tensor) -> tuple[Any, Any] | None:
    """(numpy view of ``t``'s elements in memory order, widening table or None), or None."""
    x = t.detach()
    if x.dtype is torch.float32 and x.is_cpu and x.is_contiguous() and not x.is_neg():
        return x.numpy().reshape(-1), None  # most of a capture's tensors: the fewest calls
    if not x.is_cpu or x.is_complex():
        return None
    if x.dtype in _HALF:
        table = _table(x.dtype)
        x = x.contiguous().reshape(-1).view(torch.int16)
        return x.numpy().view("uint16"), table
    if x.dtype not in _NUMPY_DTYPES:
        return None
    if x.is_conj() or x.is_neg():
        x = x.resolve_conj().resolve_neg()
    return x.contiguous().reshape(-1).numpy(), None


@overload
def summarize(t: torch.Tensor, hist_limit: int | None, copy: Literal[False] = False) -> TensorStats | None:
    ...


@overload
def summarize(t: torch.Tensor, hist_limit: int | None, copy: Literal[True]) -> tuple[TensorStats, torch.Tensor] | None:
    ...


def summarize(t: torch.Tensor, hist_limit: int | None,
              copy: bool = False) -> TensorStats | tuple[TensorStats, torch.Tensor] | None:
    """``gradexplorer.stats.summary.tensor_stats`` of a CPU tensor in one fused pass, or ``None`` when this
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
    """
    k = _state["kernels"]
    if not k:
        if k is False or not available():
            return None
        k = _state["kernels"]
    readable = _readable(t)
    if readable is None:
        return None
    x, table = readable
    n = x.size
    if n == 0:
        stats = empty_stats()
        return (stats, t.detach().clone(memory_format=torch.contiguous_format)) if copy else stats
    use_table = table is not None
    if table is None:
        table = k["no_table"]  # its dtype (not float32) tells the kernels to read x directly
    if copy:
        dst = torch.empty(t.shape, dtype=t.dtype)
        out = dst.reshape(-1).view(torch.int16).numpy().view("uint16") if use_table else dst.reshape(-1).numpy()
    else:
        out = x[:0]
    dtype = x.dtype
    key = _keys.get((dtype, use_table))
    if key is None:
        key = _keys[(dtype, use_table)] = str(dtype) + ("/table" if use_table else "")
    first = key not in compile_seconds
    t0 = time.perf_counter() if first else 0.0
    offset, step, count = histogram_sample(n, hist_limit)
    wide = dtype == k["float64"]
    f32 = float32_lanes and (use_table or dtype == k["float32"])
    try:
        # The workqueue layer aborts the process on concurrent parallel launches (the
        # window's histogram while a capture runs): a busy pool means the serial kernel.
        if (n > _SERIAL_LIMIT and k["threads"] >= _PARALLEL_MIN_THREADS
                and _parallel_lock.acquire(blocking=False)):
            try:
                nchunks = max(1, min(k["threads"] * _CHUNKS_PER_THREAD, n // 2048))
                row, counts = k["parallel"](x, table, copy, out, nchunks, offset, step, count, wide, f32)
            finally:
                _parallel_lock.release()
        else:
            row, counts = k["serial"](x, table, copy, out, offset, step, count, wide, f32)
    except Exception as exc:  # noqa: BLE001 - a compile or runtime failure: fall back for good
        log.warning("fused CPU statistics failed (%s: %s): using torch operations", type(exc).__name__, exc)
        _state["kernels"] = False
        return None
    if first:
        compile_seconds[key] = time.perf_counter() - t0
    got = _stats_of(row.tolist(), counts, n, step == 1)
    if got is None:  # float64 values whose squares leave float64: the scaled torch path
        got = torch_stats(t, hist_limit)
    return (got, dst) if copy else got


def _stats_of(row: list, counts: Any, n: int, exact: bool) -> TensorStats | None:
    # Python floats from here: for the hundreds of small tensors of a capture, NumPy calls
    # on one-row arrays cost more than the kernel.
    m, mean, m2, sumabs, lo, hi, nonzero, nan_count, inf_count, sampled, hlo, hhi = row
    nan_count, inf_count = int(nan_count), int(inf_count)
    if m == 0:
        return no_finite_stats(n, nan_count, inf_count)
    sumsq = m2 + m * mean * mean  # both terms >= 0: no cancellation
    amax = max(abs(lo), abs(hi))
    if not (math.isfinite(sumsq) and math.isfinite(m2) and math.isfinite(sumabs)) or (0 < amax < 1e-150):
        return None  # only float64 data gets here: its squares overflow or underflow
    hist = torch.from_numpy(counts)  # scaled to the finite count by the kernel when subsampled
    return stats_from_moments(n, lo, hi, mean, m2, sumsq, sumabs, int(nonzero), nan_count,
                              inf_count, hist, (hlo, hhi), exact)
