"""The numba kernels of ``gradexplorer.stats.cpu`` (imported only when numba is installed).

Module-level definitions, so that ``cache=True`` finds them again in the next process
(functions defined inside another function got a new cache entry every time).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from gradexplorer.stats.moments import HIST_BINS, chan_merge, histogram_in_float64, histogram_range

#: Elements per block: the extremes' and zeros' loops and the copy re-read a block from the
#: L1 cache. Reading float32 from memory on one core of the build machine (an AMD EPYC),
#: blocks of 2048 took 0.29 ns per value, of 4096 0.38 (1024 to 16384 measured: 0.29-0.38).
BLOCK = 2048
#: Columns of a chunk's row: finite count, mean, m2, sum of magnitudes, min, max,
#: non-zero count, NaN count.
COLS = 8
#: Columns of the merged result: a chunk's, then the Inf count, the number of finite
#: values the histogram counted, and its range (lower, upper edge).
RESULT = 12

_INF = np.inf
_INF32 = np.float32(np.inf)
#: A block's spread (max - min) for which its float32 sums of squared deviations hold the
#: accuracy contract (1e-6 relative of float64): above 2^-40, no square that matters reaches
#: float32's subnormals (their rounding is absolute, 2^-150); below 2^58, BLOCK squares of
#: deviations stay below float32's maximum. Other blocks take the float64 loop.
_SPREAD_LO = 2.0 ** -40
_SPREAD_HI = 2.0 ** 58
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


#: ``gradexplorer.stats.moments.chan_merge`` compiled: the kernels merge blocks and chunks with the same
#: function as everything else. (numba's on-disk cache tracks the kernels' own source
#: file only: after editing it in core/stats/summary.py, clear __pycache__ or touch this file.)
_chan: Any = njit(inline="always")(chan_merge)
_hist_range: Any = njit(inline="always")(histogram_range)
_hist_in_float64: Any = njit(inline="always")(histogram_in_float64)


@njit(cache=True, fastmath=_FASTMATH)  # not inline="always": that stopped vectorisation
def chunk(x: Any, table: Any, start: int, stop: int, copy: bool, out: Any, res: Any, row: int,
          offset: int, step: int, sample: Any, f32: bool) -> None:
    """The moments of ``x[start:stop]`` into ``res[row]`` (see ``COLS``); the copy into
    ``out`` when ``copy``; the histogram's sample elements (``offset + k * step``) of this
    range into ``sample[k]``, read while their block is in the cache."""
    cnt = 0.0
    mean = 0.0
    m2 = 0.0
    sumabs = 0.0
    lo = _INF
    hi = -_INF
    zeros = 0
    nnan = 0
    k = max(0, (start - offset + step - 1) // step)  # the first sample index at or after start
    for b in range(start, stop, BLOCK):
        e = min(b + BLOCK, stop)
        # Indices from 0 within a slice: numba wraps negative indices, and an index that
        # LLVM cannot prove non-negative made it gather element by element (8x slower).
        xb = x[b:e]
        size = e - b
        if copy:
            out[b:e] = xb  # from the L1 cache: the copy costs no second read
        done = False
        bc = 0.0
        bmean = 0.0
        bm2 = 0.0
        ba = 0.0
        bz = 0
        flo = _INF
        fhi = -_INF
        if f32:
            # float32 lanes (twice float64's): sums of the values and their magnitudes,
            # then, when those are finite (so is every value), the extremes and zeros, and
            # the sums of the deviations from the block's float32 mean and their squares.
            # Rounding stays within the accuracy contract because the squared values are
            # deviations from a mean (no cancellation) and every lane sums only
            # BLOCK / lanes of them; blocks merge in float64. Kept out of float32: blocks
            # whose spread would overflow a float32 square, or is so small that the
            # squares reach float32's subnormals (1e-30-scale values): the float64 loop.
            s32, a32 = sums32(xb, table)
            if a32 < _INF32:
                blo, bhi, bz = finite_extremes_and_zeros(xb, table)
                flo = np.float64(blo)
                fhi = np.float64(bhi)
                spread = fhi - flo
                bc = float(size)
                if spread == 0.0:  # a constant block: exact
                    bmean = flo
                    bm2 = 0.0
                    ba = abs(flo) * bc
                    done = True
                elif _SPREAD_LO <= spread < _SPREAD_HI:
                    mu = np.float32(s32 / np.float32(size))
                    es, eq = deviations32(xb, table, mu)
                    bmean = np.float64(mu) + np.float64(es) / bc
                    bm2 = _m2(np.float64(es), np.float64(eq), bc)
                    ba = np.float64(a32)
                    done = True
        if not done:
            # float64 sums of the deviations from the block's first value p (a value inside
            # the block keeps sum((v - p)^2) within BLOCK times the block's m2, so
            # m2 = sum((v - p)^2) - sum(v - p)^2 / count loses only float64 roundings) and
            # of the magnitudes. NaN or Inf anywhere in the block (or a float64 square
            # beyond float64) leaves bq non-finite: then the careful loop.
            p = load(xb, table, 0)
            bs = 0.0
            bq = 0.0
            ba = 0.0
            for i in range(size):
                v = load(xb, table, i)
                d = v - p
                bs += d
                bq += d * d
                ba += abs(v)
            if bq < _INF:
                bc = float(size)
                # Extremes and zeros in a loop of their own (with the float64 sums in it,
                # LLVM vectorised nothing), in the data's own type, compiled for finite values.
                blo, bhi, bz = finite_extremes_and_zeros(xb, table)
                flo = np.float64(blo)
                fhi = np.float64(bhi)
                bmean = p + bs / bc
                bm2 = _m2(bs, bq, bc)
            else:
                bc, bmean, bm2, ba, bz, bn, flo, fhi = careful(xb, table)
                nnan += bn
        # The histogram's sample only now, from the L1 cache: read before the block's
        # loops, each element was a cache miss (75 ns apiece, 20% of a 6.4M-element pass).
        while k < sample.size and offset + k * step < e:
            sample[k] = load(x, table, offset + k * step)
            k += 1
        if bc == 0.0:
            continue
        cnt, mean, m2 = _chan(cnt, mean, m2, bc, bmean, bm2)
        sumabs += ba
        zeros += bz
        lo = min(lo, flo)
        hi = max(hi, fhi)
    res[row, 0] = cnt
    res[row, 1] = mean
    res[row, 2] = m2
    res[row, 3] = sumabs
    res[row, 4] = lo
    res[row, 5] = hi
    res[row, 6] = cnt - zeros
    res[row, 7] = nnan


@njit(cache=True, fastmath=_FASTMATH)
def sums32(xb: Any, table: Any) -> Any:
    """(sum of the values, sum of their magnitudes) of a block in float32 lanes; either is
    non-finite when a value is NaN or Inf (or the magnitudes' sum leaves float32)."""
    s = np.float32(0.0)
    a = np.float32(0.0)
    for i in range(xb.size):
        v = np.float32(native(xb, table, i))
        s += v
        a += abs(v)
    return s, a


@njit(cache=True, fastmath=_FASTMATH)
def deviations32(xb: Any, table: Any, mu: Any) -> Any:
    """(sum of v - mu, sum of (v - mu)^2) over a block of finite values, in float32 lanes:
    each lane sums BLOCK / lanes terms (a pairwise sum's leaves), and the squares are of
    deviations from the block's mean, so no cancellation is left for the rounding to
    amplify; the first sum corrects the mean to float64 accuracy."""
    s = np.float32(0.0)
    q = np.float32(0.0)
    for i in range(xb.size):
        d = np.float32(native(xb, table, i)) - mu
        s += d
        q += d * d
    return s, q


#: For blocks known to hold only finite values: without NaN semantics to keep, minnum and
#: maxnum become plain vector min and max, and the zero count joins their loop (0.07 ns
#: per value from the L1 cache, against 0.14 for two loops with NaN semantics).
_FINITE_FASTMATH = _FASTMATH | {"nnan", "ninf"}


@njit(cache=True, fastmath=_FINITE_FASTMATH)
def finite_extremes_and_zeros(xb: Any, table: Any) -> Any:
    """(min, max, zero count) of a block whose values are all finite (the fast loop's
    sum of squares was finite), in the data's own type: float32 lanes for float32 and
    half types, twice as many as float64's."""
    blo = native(xb, table, 0)
    bhi = blo
    nz = np.int32(0)  # a block holds far fewer than 2^31 values
    for i in range(xb.size):
        v = native(xb, table, i)
        blo = fmin(blo, v)
        bhi = fmax(bhi, v)
        nz += np.int32(v == 0)
    return blo, bhi, int(nz)


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


def like(v: Any, lo: Any) -> Any:  # pragma: no cover - replaced by the overload in compiled code
    """``v`` in the float type of ``lo``: float32 when the histogram is binned in float32."""
    raise NotImplementedError


@overload(like, inline="always")
def _like(v, lo):  # type: ignore[no-untyped-def]
    if lo == types.float32:
        return lambda v, lo: np.float32(v)
    return lambda v, lo: v


@njit(cache=True, nogil=True, error_model="numpy")
def _positions(sample: Any, lo: Any, width: Any, pos: Any) -> None:
    """The bin of each sampled value in ``torch.histc``'s arithmetic, float32 or float64
    as ``lo`` and ``width`` are (the same expression as ``gradexplorer.stats.summary``'s torch path);
    ``HIST_BINS`` for NaN and Inf. Selects, not branches, so that LLVM can vectorise the
    loop."""
    for k in range(sample.size):
        v = sample[k]
        ok = abs(v) < _INF
        f = like(v, lo) if ok else lo
        p = min(max(int((f - lo) * like(HIST_BINS, lo) / width), 0), HIST_BINS - 1)
        pos[k] = p if ok else HIST_BINS


@njit(cache=True, nogil=True, error_model="numpy")
def finish(res: Any, n: int, sample: Any, wide: bool) -> Any:
    """The chunks' rows merged into one (the ``RESULT`` columns) and the histogram of the
    sample's finite values over their range (``gradexplorer.stats.moments.histogram_range``), in
    ``torch.histc``'s arithmetic (float32 unless the data are float64 or the range needs
    float64), so that the bins agree with the torch path's."""
    out = np.zeros(RESULT, np.float64)
    cnt = 0.0
    mean = 0.0
    m2 = 0.0
    lo = _INF
    hi = -_INF
    for r in range(res.shape[0]):
        cnt, mean, m2 = _chan(cnt, mean, m2, res[r, 0], res[r, 1], res[r, 2])
        out[3] += res[r, 3]
        lo = min(lo, res[r, 4])
        hi = max(hi, res[r, 5])
        out[6] += res[r, 6]
        out[7] += res[r, 7]
    out[0] = cnt
    out[1] = mean
    out[2] = m2
    out[4] = lo
    out[5] = hi
    out[8] = n - cnt - out[7]
    counts = np.zeros(HIST_BINS, np.float32)
    if cnt == 0.0:
        return out, counts
    hlo, hhi = _hist_range(lo, hi)
    wide = wide or _hist_in_float64(hlo, hhi)
    lo32 = np.float32(hlo)
    width32 = np.float32(np.float32(hhi) - lo32)
    width = hhi - hlo
    # Positions first (a loop of selects: a division per value), then the tally: in one
    # loop the two ran scalar: 21 against 14 us for a sample of 16,384 values. NaN and Inf
    # go to an extra bin that is not returned.
    pos = np.empty(sample.size, np.int32)
    if wide:
        _positions(sample, hlo, width, pos)
    else:
        _positions(sample, lo32, width32, pos)
    tally = np.zeros(HIST_BINS + 1, np.int64)
    for k in range(pos.size):
        tally[pos[k]] += 1
    for b in range(HIST_BINS):
        counts[b] = np.float32(tally[b])
    sampled = float(sample.size - tally[HIST_BINS])
    out[9] = sampled
    out[10] = hlo
    out[11] = hhi
    return out, counts


@njit(cache=True, nogil=True)
def serial(x: Any, table: Any, copy: bool, out: Any, offset: int, step: int, count: int, wide: bool,
           f32: bool) -> Any:
    """``finish`` of one chunk over all of ``x``: (result row, histogram counts). ``f32``:
    blocks in float32 lanes where that holds the accuracy contract (float32 and half data)."""
    res = np.empty((1, COLS), np.float64)
    sample = np.empty(count, np.float64)
    chunk(x, table, 0, x.size, copy, out, res, 0, offset, step, sample, f32)
    return finish(res, x.size, sample, wide)


@njit(cache=True, nogil=True, parallel=True)
def parallel(x: Any, table: Any, copy: bool, out: Any, nchunks: int, offset: int, step: int, count: int,
             wide: bool, f32: bool) -> Any:
    """``serial`` with ``nchunks`` chunks on numba's threads."""
    n = x.size
    size = (n + nchunks - 1) // nchunks
    res = np.empty((nchunks, COLS), np.float64)
    sample = np.empty(count, np.float64)
    for c in prange(nchunks):
        chunk(x, table, min(c * size, n), min((c + 1) * size, n), copy, out, res, c, offset, step, sample, f32)
    return finish(res, n, sample, wide)
