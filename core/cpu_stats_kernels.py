"""The numba kernels of ``core.cpu_stats`` (imported only when numba is installed).

Module-level definitions, so that ``cache=True`` finds them again in the next process
(functions defined inside another function got a new cache entry every time).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from core.stats import HIST_BINS

#: Elements per block: the second and third loops re-read a block from the L1 cache.
BLOCK = 2048
#: Columns of a chunk's result row.
COLS = 10  # count, mean, m2, sumsq, sumabs, min, max, nonzero, nan, inf

_INF = np.inf
#: Vectorised float64 sums; NaN and Inf semantics kept (no "nnan", "ninf").
_FASTMATH = {"reassoc", "contract", "nsz"}


def load(x: Any, table: Any, i: int) -> float:  # pragma: no cover - replaced by the overload in compiled code
    """Element ``i`` of ``x`` as float64; through ``table`` for 16-bit patterns of half types."""
    raise NotImplementedError


@overload(load, inline="always")
def _load(x: Any, table: Any, i: Any) -> Any:
    if table.dtype == types.float32:  # half types: x holds 16-bit patterns
        return lambda x, table, i: np.float64(table[x[i]])
    return lambda x, table, i: np.float64(x[i])


def _call_intrinsic(builder: Any, name: str, args: Any) -> Any:
    from llvmlite import ir

    t = args[0].type
    return builder.call(builder.module.declare_intrinsic(name, [t], ir.FunctionType(t, [t, t])), args)


# numba's min() and max() test for NaN with branches that stop LLVM from vectorising the
# loop; LLVM's minnum and maxnum do not (and skip NaN operands).
def _fmin(typingctx: Any, a: Any, b: Any) -> Any:
    return a(a, b), lambda context, builder, sig, args: _call_intrinsic(builder, "llvm.minnum", args)


def _fmax(typingctx: Any, a: Any, b: Any) -> Any:
    return a(a, b), lambda context, builder, sig, args: _call_intrinsic(builder, "llvm.maxnum", args)


fmin: Any = intrinsic(_fmin)
fmax: Any = intrinsic(_fmax)


@njit(cache=True, fastmath=_FASTMATH)  # not inline="always": that stopped vectorisation
def chunk(x: Any, table: Any, start: int, stop: int, copy: bool, out: Any, res: Any, row: int) -> None:
    cnt = 0.0
    mean = 0.0
    m2 = 0.0
    sumsq = 0.0
    sumabs = 0.0
    lo = _INF
    hi = -_INF
    nz = 0.0
    nnan = 0.0
    for b in range(start, stop, BLOCK):
        e = min(b + BLOCK, stop)
        bc = 0.0
        bs = 0.0
        bq = 0.0
        ba = 0.0
        bz = 0.0
        bn = 0.0
        blo = _INF
        bhi = -_INF
        for i in range(b, e):
            v = load(x, table, i)
            ok = abs(v) < _INF  # False for NaN and +-Inf
            f = v if ok else 0.0
            bc += 1.0 if ok else 0.0
            bs += f
            bq += f * f
            ba += abs(f)
            bz += 1.0 if f != 0.0 else 0.0
            bn += 1.0 if v != v else 0.0
        # Separate loops over the block (in the L1 cache) vectorise; one loop doing
        # everything did not, and ran five times slower.
        for i in range(b, e):
            v = load(x, table, i)
            blo = fmin(blo, v)  # minnum/maxnum skip NaN
            bhi = fmax(bhi, v)
        if bc + bn < e - b:  # an Inf in the block (rare): the finite extremes
            blo = _INF
            bhi = -_INF
            for i in range(b, e):
                v = load(x, table, i)
                if abs(v) < _INF:
                    blo = min(blo, v)
                    bhi = max(bhi, v)
        if copy:
            out[b:e] = x[b:e]  # from the L1 cache: the copy costs no second read
        if bc == 0.0:
            nnan += bn
            continue
        bmean = bs / bc
        bm2 = 0.0
        for i in range(b, e):
            v = load(x, table, i)
            d = v - bmean if abs(v) < _INF else 0.0
            bm2 += d * d
        # Chan's merge of the block into the chunk.
        tot = cnt + bc
        delta = bmean - mean
        mean += delta * (bc / tot)
        m2 += bm2 + delta * delta * (cnt * bc / tot)
        cnt = tot
        sumsq += bq
        sumabs += ba
        nz += bz
        nnan += bn
        lo = min(lo, blo)
        hi = max(hi, bhi)
    res[row, 0] = cnt
    res[row, 1] = mean
    res[row, 2] = m2
    res[row, 3] = sumsq
    res[row, 4] = sumabs
    res[row, 5] = lo
    res[row, 6] = hi
    res[row, 7] = nz
    res[row, 8] = nnan
    res[row, 9] = (stop - start) - cnt - nnan


@njit(cache=True, nogil=True)
def serial(x: Any, table: Any, copy: bool, out: Any) -> Any:
    res = np.empty((1, COLS), np.float64)
    chunk(x, table, 0, x.size, copy, out, res, 0)
    return res


@njit(cache=True, nogil=True, parallel=True)
def parallel(x: Any, table: Any, copy: bool, out: Any, nchunks: int) -> Any:
    n = x.size
    size = (n + nchunks - 1) // nchunks
    res = np.empty((nchunks, COLS), np.float64)
    for c in prange(nchunks):
        chunk(x, table, min(c * size, n), min((c + 1) * size, n), copy, out, res, c)
    return res


@njit(cache=True, nogil=True, error_model="numpy")
def histogram(x: Any, table: Any, offset: int, step: int, count: int, lo: float, hi: float,
              wide: bool) -> Any:
    # torch.histc's arithmetic (float32 unless the range needs float64), so that the
    # bins agree with the torch path's.
    counts = np.zeros(HIST_BINS, np.float64)
    sampled = 0.0
    lo32 = np.float32(lo)
    width32 = np.float32(np.float32(hi) - lo32)
    width = hi - lo
    for k in range(count):
        v = load(x, table, offset + k * step)
        if not abs(v) < _INF:
            continue
        sampled += 1.0
        if wide:
            pos = int((v - lo) * HIST_BINS / width)
        else:
            pos = int((np.float32(v) - lo32) * np.float32(HIST_BINS) / width32)
        counts[min(max(pos, 0), HIST_BINS - 1)] += 1.0
    return counts, sampled
