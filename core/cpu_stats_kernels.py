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

#: Elements per block: the extremes' loop and the copy re-read a block from the L1 cache.
BLOCK = 4096
#: Columns of a chunk's result row.
COLS = 10  # count, mean, m2, sumsq, sumabs, min, max, nonzero, nan, inf

_INF = np.inf
#: Vectorised float64 sums; NaN and Inf semantics kept (no "nnan", "ninf").
_FASTMATH = {"reassoc", "contract", "nsz"}


def load(x: Any, table: Any, i: int) -> float:  # pragma: no cover - replaced by the overload in compiled code
    """Element ``i`` of ``x`` as float64; through ``table`` for 16-bit patterns of half types."""
    raise NotImplementedError


# No annotations here: numba compares the typing function's signature with its result's.
@overload(load, inline="always")
def _load(x, table, i):  # type: ignore[no-untyped-def]
    if table.dtype == types.float32:  # half types: x holds 16-bit patterns
        return lambda x, table, i: np.float64(table[x[i]])
    return lambda x, table, i: np.float64(x[i])


def native(x: Any, table: Any, i: int) -> float:  # pragma: no cover - replaced by the overload in compiled code
    """Element ``i`` of ``x`` in the narrowest float type that holds it exactly (float32
    for float32 and half types, float64 otherwise): min and max need no widening, and
    float32 lanes are twice as many."""
    raise NotImplementedError


@overload(native, inline="always")
def _native(x, table, i):  # type: ignore[no-untyped-def]
    if table.dtype == types.float32:
        return lambda x, table, i: table[x[i]]
    if x.dtype in (types.float32, types.float64):
        return lambda x, table, i: x[i]
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
    sumabs = 0.0
    lo = _INF
    hi = -_INF
    zeros = 0
    nnan = 0
    for b in range(start, stop, BLOCK):
        e = min(b + BLOCK, stop)
        # Indices from 0 within a slice: numba wraps negative indices, and an index that
        # LLVM cannot prove non-negative made it gather element by element (8x slower).
        xb = x[b:e]
        size = e - b
        if copy:
            out[b:e] = xb  # from the L1 cache: the copy costs no second read
        # The fast loop: float64 sums of the deviations from the block's first value p
        # (a value inside the block keeps sum((v - p)^2) within BLOCK times the block's
        # m2, so m2 = sum((v - p)^2) - sum(v - p)^2 / count loses only float64 roundings),
        # sum of magnitudes, zero count. NaN or Inf anywhere in the block (or a float64
        # square beyond float64) leaves bq non-finite: then the careful loop below.
        p = load(xb, table, 0)
        bs = 0.0
        bq = 0.0
        ba = 0.0
        bz = 0
        for i in range(size):
            v = load(xb, table, i)
            d = v - p
            bs += d
            bq += d * d
            ba += abs(v)
            bz += v == 0.0
        if bq < _INF:
            bc = float(size)
            # Extremes in a loop of their own: with other sums in it, LLVM did not
            # vectorise the min/max reductions (nor the sums).
            blo = native(xb, table, 0)
            bhi = blo
            for i in range(size):
                v = native(xb, table, i)
                blo = fmin(blo, v)
                bhi = fmax(bhi, v)
            flo = np.float64(blo)
            fhi = np.float64(bhi)
            bmean = p + bs / bc
            bm2 = _m2(bs, bq, bc)
        else:
            bc, bmean, bm2, ba, bz, bn, flo, fhi = careful(xb, table)
            nnan += bn
            if bc == 0.0:
                continue
        # Chan's merge of the block into the chunk.
        tot = cnt + bc
        delta = bmean - mean
        mean += delta * (bc / tot)
        m2 += bm2 + delta * delta * (cnt * bc / tot)
        cnt = tot
        sumabs += ba
        zeros += bz
        lo = min(lo, flo)
        hi = max(hi, fhi)
    res[row, 0] = cnt
    res[row, 1] = mean
    res[row, 2] = m2
    res[row, 3] = m2 + cnt * mean * mean if cnt > 0.0 else 0.0  # sum of squares, no cancellation
    res[row, 4] = sumabs
    res[row, 5] = lo
    res[row, 6] = hi
    res[row, 7] = cnt - zeros
    res[row, 8] = nnan
    res[row, 9] = (stop - start) - cnt - nnan


@njit(cache=True, fastmath=_FASTMATH)
def careful(xb: Any, table: Any) -> Any:
    """The moments of a block that holds NaN or Inf (or float64 values whose squares
    leave float64), over its finite values: (count, mean, m2, sum of magnitudes, zeros,
    NaN count, finite min, finite max). Deviations are taken about the first finite
    value, as in the fast loop; m2 is not finite when the squares overflowed."""
    size = xb.size
    p = 0.0
    for i in range(size):
        v = load(xb, table, i)
        if abs(v) < _INF:
            p = v
            break
    bc = 0.0
    bs = 0.0
    bq = 0.0
    ba = 0.0
    bz = 0
    bn = 0
    for i in range(size):
        v = load(xb, table, i)
        ok = abs(v) < _INF  # False for NaN and +-Inf
        f = v if ok else p
        d = f - p
        bs += d
        bq += d * d
        ba += abs(f) * np.float64(ok)  # f is finite: times 0.0 or 1.0, exact
        bc += np.float64(ok)
        bz += v == 0.0
        bn += v != v
    lo = _INF
    hi = -_INF
    for i in range(size):
        v = load(xb, table, i)
        lo = fmin(lo, v if abs(v) < _INF else _INF)
        hi = fmax(hi, v if abs(v) < _INF else -_INF)
    if bc == 0.0:
        return 0.0, 0.0, 0.0, 0.0, bz, bn, lo, hi
    return bc, p + bs / bc, _m2(bs, bq, bc), ba, bz, bn, lo, hi


@njit(cache=True, inline="always")
def _m2(bs: float, bq: float, bc: float) -> float:
    """sum((v - mean)^2) from the sums of v - p and (v - p)^2 over bc values; a
    rounding below 0 becomes 0, a non-finite result (overflow) stays."""
    m2 = bq - bs * (bs / bc)
    return 0.0 if m2 < 0.0 else m2


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
