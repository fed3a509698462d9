"""The numba kernels of ``gradexplorer.stats.cpu`` (imported only when numba is installed).

Module-level definitions, so that ``cache=True`` finds them again in the next process
(functions defined inside another function got a new cache entry every time).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from gradexplorer.stats.moments import HIST_BINS, chan_merge, histogram_in_float64, histogram_range

#: Elements per block: the extremes' and zeros' loops and the copy re-read a block from the
#: L1 cache. Reading float32 from memory on one core of the build machine (an AMD EPYC),
#: blocks of 2048 took 0.29 ns per value, of 4096 0.38 (1024 to 16384 measured: 0.29-0.38).
BLOCK = 2048
#: The float32 lanes sum runs of this many values, then add each run's sums in float64.
#: Recursive summation in a lane of k terms can be off by k roundings of that lane's sum,
#: and a block whose squares are dominated by one outlier (its lane's sum near the
#: block's) rounds each later term of that lane the same way: with the whole block in the
#: lanes (2,048 / 16 = 128 terms each) the variance of 1e4 + 1e-3 N(0,1) with one value in
#: 2,048 at 1e4 + 1e3 came out 2.9e-6 relative off, beyond the contract. Runs of 128
#: leave a lane at most 128 / 8 = 16 terms (AVX2's 8 lanes; 8 with AVX-512's 16): at most
#: 16 roundings, 9.5e-7 of the variance, 4.8e-7 of the standard deviation.
LANE_RUN = 128
#: Columns of a chunk's row: finite count, mean, m2, sum of magnitudes, min, max,
#: non-zero count, NaN count.
COLS = 8
#: Columns of the merged result: a chunk's, then the Inf count, the number of finite
#: values the histogram counted, and its range (lower, upper edge).
RESULT = 12

_INF = np.inf
#: The float32 lanes sum deviations scaled by a power of two (exact) so that a block's
#: spread times the scale lies in [2^-_SCALED_RANGE, 2^_SCALED_RANGE] and no deviation
#: times the scale exceeds 2^_SCALED_RANGE: then the squares that matter are far from
#: float32's subnormals (whose rounding is absolute, 2^-150) and BLOCK of them far from its
#: maximum, and the sums hold the accuracy contract (1e-6 relative of float64).
_SCALED_RANGE = 40
_SCALED_LO = 2.0 ** -_SCALED_RANGE
_SCALED_HI = 2.0 ** _SCALED_RANGE
#: Blocks of half-type values, summed around their own float32 mean without a scale, take
#: the float32 lanes when their spread is at least this (else the float64 loop).
_SPREAD_LO = 2.0 ** -40
#: Half-type blocks whose magnitudes sum to less than this take the float32 lanes: every
#: deviation from the block's mean is then below 2^58, so BLOCK of their squares stay below
#: float32's maximum (2^11 * 2^116 < 2^128).
_ABS32_MAX = np.float32(2.0 ** 57)
#: The float32 exponent bits: a value whose bits hold all of them is NaN or Inf.
_EXP32 = np.int32(0x7F800000)
#: A block's deviations from the shift (the previous block's mean) are used as they are
#: when the shift's share of their sum of squares is at most this (the shift then lies
#: within a quarter of the block's standard deviation of its mean, and the rounding of
#: m2 = sum(d^2) - sum(d)^2 / count is at most 1.7 times that of deviations from the mean
#: itself); else they are taken again from the block's mean.
_SHIFT_SHARE = 1.0 / 17.0
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


#: Bytes of a cache line: the prefetch touches one address per line.
_LINE = 64


def _prefetch(typingctx: Any, arr: Any, i: Any) -> Any:
    """Ask the CPU to bring the cache line holding ``arr[i]`` (``0 <= i < arr.size``) into
    the cache, without waiting for it (LLVM's prefetch: read, high locality)."""
    from llvmlite import ir

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic(
            "llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]))
        address = builder.bitcast(builder.gep(ary.data, [args[1]]), byte_ptr)
        builder.call(fn, [address, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, i), codegen


prefetch: Any = intrinsic(_prefetch)


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
    bits = bits32(x)
    shift = np.float32(native(x, table, start)) if start < stop else np.float32(0.0)
    scale = np.float32(1.0)
    for b in range(start, stop, BLOCK):
        e = min(b + BLOCK, stop)
        # Indices from 0 within a slice: numba wraps negative indices, and an index that
        # LLVM cannot prove non-negative made it gather element by element (8x slower).
        # The next block is asked for now, so that its read from memory (or from the
        # last-level cache, where a tensor just written lies) overlaps this block's
        # arithmetic: inside a resnet50 capture on an AVX-512 Xeon the pass took 0.46-0.48
        # ns per value without it, 0.41-0.43 with it.
        for j in range(e, min(e + BLOCK, stop), _LINE // x.itemsize):
            prefetch(x, j)
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
            # float32 lanes (twice float64's). Rounding stays within the accuracy contract
            # because the squares summed are of deviations from a value close to the
            # block's mean (no cancellation left for the rounding to amplify), scaled by a
            # power of two into float32's comfortable range, each lane sums only
            # LANE_RUN / lanes of them, and runs and blocks merge in float64. Blocks
            # holding NaN or Inf take the careful loop, and blocks these checks refuse the
            # float64 loop.
            if direct32(x, table):
                # float32 data: the extremes, zeros and NaN/Inf test in one loop over the
                # block as it arrives from memory; then, from the L1 cache, the sums of
                # the deviations from the previous block's mean with the previous block's
                # scale (neighbours are alike), checked against the extremes before they
                # are taken. When they do not fit this block, the sums again around its
                # own mean with its own scale.
                blo, bhi, z32, emax = extremes32(xb, table, bits[b:e])
                if emax < _EXP32:  # all finite
                    flo = np.float64(blo)
                    fhi = np.float64(bhi)
                    spread = fhi - flo
                    bc = float(size)
                    bz = int(z32)
                    if spread == 0.0:  # a constant block: exact
                        bmean = flo
                        bm2 = 0.0
                        ba = abs(flo) * bc
                        done = True
                    else:
                        sh = np.float64(shift)
                        sc = np.float64(scale)
                        guess = 0.5 * (flo + fhi)  # within half the spread of every value
                        # Neither overflow nor subnormal squares: the sums are finite
                        # and exact enough (checked on the extremes, not on the sums).
                        if max(fhi - sh, sh - flo) * sc <= _SCALED_HI and spread * sc >= _SCALED_LO:
                            es64, eq64, ba = deviation_sums32(xb, table, scale, shift * scale)
                            guess = sh + es64 / (bc * sc)
                            if es64 * (es64 / bc) <= eq64 * _SHIFT_SHARE and ba < _INF:
                                bmean = guess
                                bm2 = _m2(es64, eq64, bc) / (sc * sc)
                                done = True
                        if not done:
                            own = scale_for(spread)
                            sc = np.float64(own)
                            mu = np.float32(min(max(guess, flo), fhi))
                            es64, eq64, ba = deviation_sums32(xb, table, own, mu * own)
                            if es64 * (es64 / bc) <= eq64 * _SHIFT_SHARE and ba < _INF:
                                bmean = np.float64(mu) + es64 / (bc * sc)
                                bm2 = _m2(es64, eq64, bc) / (sc * sc)
                                done = True
                    if done:  # the next block's shift and scale
                        shift = np.float32(bmean)
                        if spread > 0.0:
                            scale = scale_for(spread)
            else:
                # half types, read through their table: the sums of the values and of
                # their magnitudes (NaN and Inf kept: either sum is then not finite),
                # then, over values now known to be finite, the extremes, the zeros and
                # the deviations from the block's float32 mean.
                s32, a32 = sums32(xb, table)
                if a32 < _ABS32_MAX:
                    mu = np.float32(s32 / np.float32(size))
                    blo, bhi, z32 = finite_extremes_and_zeros(xb, table)
                    flo = np.float64(blo)
                    fhi = np.float64(bhi)
                    spread = fhi - flo
                    bc = float(size)
                    bz = int(z32)
                    if spread == 0.0:  # a constant block: exact
                        bmean = flo
                        bm2 = 0.0
                        ba = abs(flo) * bc
                        done = True
                    elif spread >= _SPREAD_LO:
                        es64, eq64, _a = deviation_sums32(xb, table, np.float32(1.0), mu)
                        bmean = np.float64(mu) + es64 / bc
                        bm2 = _m2(es64, eq64, bc)
                        ba = a32
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
        # A counted loop: a while loop that tested both bounds took 1.1 ns per element.
        k_end = min(sample.size, max(k, (e - offset + step - 1) // step))
        for j in range(k, k_end):
            sample[j] = native(x, table, offset + j * step)
        k = k_end
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
    """(sum of the values, sum of their magnitudes) of a block of half-type values, in
    float32 lanes over runs of ``LANE_RUN`` (``deviation_sums32`` says why), the runs
    added in float64; either is non-finite when a value is NaN or Inf."""
    s = 0.0
    a = 0.0
    n = xb.size
    full = n - n % LANE_RUN
    for j in range(0, full, LANE_RUN):
        run = xb[j:j + LANE_RUN]
        s32 = np.float32(0.0)
        a32 = np.float32(0.0)
        for i in range(LANE_RUN):
            v = np.float32(native(run, table, i))
            s32 += v
            a32 += abs(v)
        s += np.float64(s32)
        a += np.float64(a32)
    for i in range(full, n):  # the last, short run: few values, in float64
        v = np.float64(native(xb, table, i))
        s += v
        a += abs(v)
    return s, a


def bits32(x: Any) -> Any:  # pragma: no cover - replaced by the overload in compiled code
    """``x``'s memory as int32 for float32 ``x`` (an empty array otherwise)."""
    raise NotImplementedError


@overload(bits32, inline="always")
def _bits32(x):  # type: ignore[no-untyped-def]
    if x.dtype == types.float32:
        return lambda x: x.view(np.int32)
    return lambda x: np.empty(0, np.int32)


def direct32(x: Any, table: Any) -> bool:  # pragma: no cover - replaced by the overload in compiled code
    """Whether ``x`` holds float32 values as they are (not 16-bit patterns of a half type)."""
    raise NotImplementedError


@overload(direct32, inline="always")
def _direct32(x, table):  # type: ignore[no-untyped-def]
    if x.dtype == types.float32 and table.dtype != types.float32:
        return lambda x, table: True
    return lambda x, table: False


# nnan: the loop may meet NaN (its results are then not used: the integer test of the
# exponent bits, which no float flag affects, says so). Without it, LLVM vectorised
# neither minnum nor maxnum.
@njit(cache=True, fastmath=_FASTMATH | {"nnan"})
def extremes32(xb: Any, table: Any, bb: Any) -> Any:
    """(min, max, zero count, largest exponent field) of a block of float32 values ``xb``
    (``bb``: the same memory as int32), in float32 lanes, one loop over the block as it
    arrives from memory. The exponent field is ``_EXP32`` when a value is NaN or Inf; the
    other results are then meaningless. The zero count is a float32 (exact: a lane counts
    at most BLOCK), so that every lane of the loop is 32 bits wide."""
    # Read through native() so that this compiles for every dtype chunk() is compiled
    # for (numba types both sides of its branch); only float32 data run it.
    blo = np.float32(native(xb, table, 0))
    bhi = blo
    nz = np.float32(0.0)
    emax = np.int32(0)
    one = np.float32(1.0)
    zero = np.float32(0.0)
    for i in range(xb.size):
        v = np.float32(native(xb, table, i))
        emax = max(emax, np.int32(bb[i] & _EXP32))
        blo = fmin(blo, v)
        bhi = fmax(bhi, v)
        nz += one if v == zero else zero
    return blo, bhi, nz, emax


@njit(cache=True, fastmath=_FASTMATH)
def deviation_sums32(xb: Any, table: Any, scale: Any, scaled_mu: Any) -> Any:
    """(sum of d, sum of d^2, sum of |v|) with d = (v - mu) * scale over a block of finite
    float32 or half values (``scaled_mu`` = mu * scale, ``scale`` a power of two: both
    exact, and one fused multiply-add rounds d once), in float32 lanes, each run of
    ``LANE_RUN`` values added in float64: a lane sums at most LANE_RUN / 8 terms (8 float32
    lanes or more on every AVX machine), the squares are of deviations from a value near
    the block's mean (no cancellation left for the rounding to amplify), and the first sum
    corrects the mean to float64 accuracy. The sum of magnitudes is Inf when it leaves
    float32 within a run.

    The inner loop runs a fixed ``LANE_RUN`` times over a slice: bounded by
    ``min(j + LANE_RUN, n)`` instead, LLVM's code for it took 0.33 ns per value from the
    L1 cache on an AVX-512 Xeon, against 0.09; with the sums and the extremes in one such
    loop, the whole pass took 0.75 ns per value on a tensor in the cache, against 0.27 now."""
    s = 0.0
    q = 0.0
    a = 0.0
    n = xb.size
    full = n - n % LANE_RUN
    for j in range(0, full, LANE_RUN):
        run = xb[j:j + LANE_RUN]
        s32 = np.float32(0.0)
        q32 = np.float32(0.0)
        a32 = np.float32(0.0)
        for i in range(LANE_RUN):
            v = np.float32(native(run, table, i))
            d = v * scale - scaled_mu
            s32 += d
            q32 += d * d
            a32 += abs(v)
        s += np.float64(s32)
        q += np.float64(q32)
        a += np.float64(a32)
    for i in range(full, n):  # the last, short run: few values, in float64
        v = np.float32(native(xb, table, i))
        d = np.float64(v * scale - scaled_mu)
        s += d
        q += d * d
        a += abs(np.float64(v))
    return s, q, a


@njit(cache=True, inline="always")
def scale_for(spread: float) -> Any:
    """The power of two (float32) that brings ``spread`` (> 0) into [0.5, 1)."""
    e = min(max(math.frexp(spread)[1], -126), 126)
    return np.float32(math.ldexp(1.0, -e))


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
    # Zeros counted in the data's float type (exact: a lane counts at most BLOCK): an
    # integer count is 64 bits wide in numba and held the loop to 4 float32 lanes.
    one = like(1.0, blo)
    zero = like(0.0, blo)
    nz = zero
    for i in range(xb.size):
        v = native(xb, table, i)
        blo = fmin(blo, v)
        bhi = fmax(bhi, v)
        nz += one if v == zero else zero
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
    ``HIST_BINS`` for NaN and Inf. Selects, not branches, and 32-bit integers, so that
    LLVM can vectorise the loop (64-bit positions of float64 samples took 0.75 ns per
    value, 32-bit ones of float32 samples 0.41)."""
    top = np.int32(HIST_BINS - 1)
    nowhere = np.int32(HIST_BINS)
    low = np.int32(0)
    for k in range(sample.size):
        v = sample[k]
        ok = abs(v) < _INF
        f = like(v, lo) if ok else lo
        p = np.int32((f - lo) * like(HIST_BINS, lo) / width)
        p = min(max(p, low), top)
        pos[k] = p if ok else nowhere


@njit(cache=True, nogil=True)
def _tally(pos: Any) -> Any:
    """Counts of the positions 0..HIST_BINS. Four interleaved tables: consecutive values
    mostly fall in one bin, and one table would make every increment wait for the last."""
    loc = np.zeros((4, HIST_BINS + 1), np.int64)
    n = pos.size
    m = n - n % 4
    for i in range(0, m, 4):
        loc[0, pos[i]] += 1
        loc[1, pos[i + 1]] += 1
        loc[2, pos[i + 2]] += 1
        loc[3, pos[i + 3]] += 1
    for i in range(m, n):
        loc[0, pos[i]] += 1
    return loc[0] + loc[1] + loc[2] + loc[3]


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
    # loop the two ran scalar. NaN and Inf go to an extra bin that is not returned.
    pos = np.empty(sample.size, np.int32)
    if wide:
        _positions(sample, hlo, width, pos)
    else:
        _positions(sample, lo32, width32, pos)
    tally = _tally(pos)
    sampled = float(sample.size - tally[HIST_BINS])
    if sample.size == n:  # every element counted
        for b in range(HIST_BINS):
            counts[b] = np.float32(tally[b])
    elif sampled > 0.0:
        # A subsample: counts scaled to the number of finite values, in float32 as the
        # torch path's counts * (finite / sampled) (a float32 tensor times a number).
        factor = np.float32(cnt / sampled)
        for b in range(HIST_BINS):
            counts[b] = np.float32(tally[b]) * factor
    out[9] = sampled
    out[10] = hlo
    out[11] = hhi
    return out, counts


def sample_buffer(x: Any, table: Any, count: int) -> Any:  # pragma: no cover - replaced by the overload
    """An empty array for ``count`` sampled values of ``x``, of ``native``'s type."""
    raise NotImplementedError


@overload(sample_buffer, inline="always")
def _sample_buffer(x, table, count):  # type: ignore[no-untyped-def]
    if table.dtype == types.float32 or x.dtype == types.float32:
        return lambda x, table, count: np.empty(count, np.float32)
    return lambda x, table, count: np.empty(count, np.float64)


def is_direct(x: Any, table: Any) -> bool:  # pragma: no cover - replaced by the overload
    """Whether ``x`` holds float32 or float64 values as they are (not integers, nor 16-bit
    patterns of a half type): then a histogram of every element reads ``x`` itself,
    without a gathered copy."""
    raise NotImplementedError


@overload(is_direct, inline="always")
def _is_direct(x, table):  # type: ignore[no-untyped-def]
    if table.dtype != types.float32 and x.dtype in (types.float32, types.float64):
        return lambda x, table: True
    return lambda x, table: False


@njit(cache=True, nogil=True)
def serial(x: Any, table: Any, copy: bool, out: Any, offset: int, step: int, count: int, wide: bool,
           f32: bool) -> Any:
    """``finish`` of one chunk over all of ``x``: (result row, histogram counts). ``f32``:
    blocks in float32 lanes where that holds the accuracy contract (float32 and half data)."""
    res = np.empty((1, COLS), np.float64)
    if step == 1 and count == x.size and is_direct(x, table):
        # Every element is counted: the histogram reads x itself (no gathered copy).
        chunk(x, table, 0, x.size, copy, out, res, 0, offset, step, sample_buffer(x, table, 0), f32)
        return finish(res, x.size, x, wide)
    sample = sample_buffer(x, table, count)
    chunk(x, table, 0, x.size, copy, out, res, 0, offset, step, sample, f32)
    return finish(res, x.size, sample, wide)


@njit(cache=True, nogil=True, parallel=True)
def parallel(x: Any, table: Any, copy: bool, out: Any, nchunks: int, offset: int, step: int, count: int,
             wide: bool, f32: bool) -> Any:
    """``serial`` with ``nchunks`` chunks on numba's threads."""
    n = x.size
    size = (n + nchunks - 1) // nchunks
    res = np.empty((nchunks, COLS), np.float64)
    sample = sample_buffer(x, table, count)
    for c in prange(nchunks):
        chunk(x, table, min(c * size, n), min((c + 1) * size, n), copy, out, res, c, offset, step, sample, f32)
    return finish(res, n, sample, wide)
