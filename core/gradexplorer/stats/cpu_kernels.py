"""The numba kernels of ``gradexplorer.stats.cpu`` (imported only when numba is installed).

Module-level definitions, so that ``cache=True`` finds them again in the next process
(functions defined inside another function got a new cache entry every time).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import carray, njit, prange, types
from numba.extending import intrinsic, overload

from gradexplorer.stats.moments import HIST_BINS, chan_merge, histogram_in_float64, histogram_range

#: Elements per block: the extremes' and zeros' loops and the copy re-read a block from the
#: L1 cache. Of the sizes measured (1024 to 16384), 2048 read fastest from memory on one
#: core (docs/benchmarks.md, "The CPU pass's design figures").
BLOCK = 2048
#: Elements per run of a block's sums loop: before each run the same number of elements a
#: block ahead are prefetched (docs/benchmarks.md, "The CPU pass's design figures").
RUN = 256
#: Columns of a chunk's row: finite count, mean, m2, sum of magnitudes, min, max,
#: non-zero count, NaN count.
COLS = 8
#: Columns of the merged result: a chunk's, then the Inf count, the number of finite
#: values the histogram counted, and its range (lower, upper edge).
RESULT = 12

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


def _pointer(typingctx: Any, address: Any, like: Any) -> Any:
    """The memory at ``address`` (an int64) as a pointer to values of ``like``'s dtype."""
    ptr_type = types.CPointer(like.dtype)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(ptr_type))

    return ptr_type(address, like), codegen


pointer: Any = intrinsic(_pointer)


#: ``gradexplorer.stats.moments.chan_merge`` compiled: the kernels merge blocks and chunks with the same
#: function as everything else. (numba's on-disk cache tracks the kernels' own source
#: file only: after editing it in core/gradexplorer/stats/tensor_stats.py, clear __pycache__ or touch this file.)
_chan: Any = njit(inline="always")(chan_merge)
_hist_range: Any = njit(inline="always")(histogram_range)
_hist_in_float64: Any = njit(inline="always")(histogram_in_float64)


@njit(cache=True, fastmath=_FASTMATH)  # not inline="always": that stopped vectorisation
def chunk(x: Any, table: Any, start: int, stop: int, copy: bool, out: Any, res: Any, row: int,
          offset: int, step: int, sample: Any) -> None:
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
    line = _LINE // x.itemsize
    for b in range(start, stop, BLOCK):
        e = min(b + BLOCK, stop)
        # Indices from 0 within a slice: numba wraps negative indices, and an index that
        # LLVM cannot prove non-negative made it gather element by element.
        xb = x[b:e]
        size = e - b
        # float64 sums of the deviations from the block's first value p (a value inside the
        # block keeps sum((v - p)^2) within BLOCK times the block's m2, so
        # m2 = sum((v - p)^2) - sum(v - p)^2 / count loses only float64 roundings) and of
        # the magnitudes. NaN or Inf anywhere in the block (or a float64 square beyond
        # float64) leaves bq non-finite: then the careful loop.
        p = load(xb, table, 0)
        bs = 0.0
        bq = 0.0
        ba = 0.0
        for s in range(0, size, RUN):
            # The run a block ahead is asked for now, a few lines at a time, so that its
            # read from memory (or from the last-level cache, where a tensor just written
            # lies) overlaps this run's arithmetic. Asked for all at once at the block's
            # start, the requests filled the core's miss buffers and the loop waited on
            # them (docs/benchmarks.md, "The CPU pass's design figures").
            a = min(b + s + BLOCK, stop)
            for j in range(a, min(a + RUN, stop), line):
                prefetch(x, j)
            xs = xb[s:min(s + RUN, size)]
            if copy:
                out[b + s:b + s + xs.size] = xs  # from the L1 cache: the copy costs no second read
            for i in range(xs.size):
                v = load(xs, table, i)
                d = v - p
                bs += d
                bq += d * d
                ba += abs(v)
        if bq < _INF:
            bc = float(size)
            # Extremes and zeros in a loop of their own (with the float64 sums in it, LLVM
            # vectorised nothing), in the data's own type, compiled for finite values.
            blo, bhi, bz = finite_extremes_and_zeros(xb, table)
            flo = np.float64(blo)
            fhi = np.float64(bhi)
            bmean = p + bs / bc
            bm2 = _m2(bs, bq, bc)
        else:
            bc, bmean, bm2, ba, bz, bn, flo, fhi = careful(xb, table)
            nnan += bn
        # The histogram's sample only now, from the L1 cache: read before the block's
        # loops, each element was a cache miss. A counted loop: a while loop that tested
        # both bounds was slower (figures in docs/benchmarks.md).
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


#: For blocks known to hold only finite values: without NaN semantics to keep, minnum and
#: maxnum become plain vector min and max, and the zero count joins their loop (one loop
#: instead of two: docs/benchmarks.md).
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
    as ``lo`` and ``width`` are (the same expression as ``gradexplorer.stats.tensor_stats``'s torch path);
    ``HIST_BINS`` for NaN and Inf. Selects, not branches, and 32-bit integers, so that
    LLVM can vectorise the loop (32-bit positions are the faster: docs/benchmarks.md)."""
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


#: Below this magnitude a float32 range is binned from values scaled by ``_TINY_SCALE``.
_TINY = 2.0 ** -64
_TINY_SCALE = 2.0 ** 64


@njit(cache=True, nogil=True, error_model="numpy")
def _positions_tiny(sample: Any, lo: float, width: Any, pos: Any) -> None:
    """``_positions`` in float32 for a range within (-2^-64, 2^-64), where float32 values
    ``v - lo`` can be subnormal: each value's distance from ``lo`` (a float32 value, as
    float64) is taken in float64 and scaled by 2^64 before its rounding to float32;
    ``width`` is the float32 width scaled the same.

    The same bins as ``_positions(sample, float32(lo), width / 2^64, pos)``, bit for bit:
    rounding the float64 difference to float32 rounds the exact difference once (float64
    has more than twice float32's precision plus two bits), scaling by a power of two
    commutes with rounding while nothing over- or underflows (the scaled values lie within
    [2^-85, 2]; an unscaled difference below 2^-126 is a multiple of 2^-149, hence exact),
    and the quotient is the same number. Only the speed differs: on CPUs that handle
    subnormal results with microcode assists (Intel's), a tensor of subnormal values (a
    vanishing gradient) took 8.5 ns per value here instead of 0.25."""
    top = np.int32(HIST_BINS - 1)
    nowhere = np.int32(HIST_BINS)
    low = np.int32(0)
    bins = np.float32(HIST_BINS)
    for k in range(sample.size):
        v = np.float64(sample[k])
        ok = abs(v) < _INF
        d = np.float32((v - lo) * _TINY_SCALE) if ok else np.float32(0.0)
        p = np.int32(d * bins / width)
        p = min(max(p, low), top)
        pos[k] = p if ok else nowhere


@njit(cache=True, nogil=True)
def _tally(pos: Any, loc: Any) -> None:
    """Counts of the positions 0..HIST_BINS into ``loc[0]`` (``loc``: (4, HIST_BINS + 1)
    int64, overwritten). Four interleaved tables: consecutive values mostly fall in one
    bin, and one table would make every increment wait for the last."""
    loc[:] = 0
    n = pos.size
    m = n - n % 4
    for i in range(0, m, 4):
        loc[0, pos[i]] += 1
        loc[1, pos[i + 1]] += 1
        loc[2, pos[i + 2]] += 1
        loc[3, pos[i + 3]] += 1
    for i in range(m, n):
        loc[0, pos[i]] += 1
    for b in range(HIST_BINS + 1):
        loc[0, b] += loc[1, b] + loc[2, b] + loc[3, b]


@njit(cache=True, nogil=True, error_model="numpy")
def finish_into(res: Any, n: int, sample: Any, wide: bool, out: Any, counts: Any, pos: Any, loc: Any) -> None:
    """The chunks' rows merged into ``out`` (the ``RESULT`` columns) and the histogram of the
    sample's finite values over their range (``gradexplorer.stats.moments.histogram_range``)
    into ``counts``, in ``torch.histc``'s arithmetic (float32 unless the data are float64 or
    the range needs float64), so that the bins agree with the torch path's. ``pos`` (int32,
    at least the sample's size) and ``loc`` (``_tally``'s) are scratch space: a batch of
    small tensors reuses them rather than allocating its own for each."""
    out[:] = 0.0
    counts[:] = 0.0
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
    if cnt == 0.0:
        return
    hlo, hhi = _hist_range(lo, hi)
    wide = wide or _hist_in_float64(hlo, hhi)
    lo32 = np.float32(hlo)
    width32 = np.float32(np.float32(hhi) - lo32)
    width = hhi - hlo
    # Positions first (a loop of selects: a division per value), then the tally: in one
    # loop the two ran scalar. NaN and Inf go to an extra bin that is not returned.
    where = pos[:sample.size]
    if wide:
        _positions(sample, hlo, width, where)
    elif max(abs(hlo), abs(hhi)) < _TINY:
        # Float32 differences that may be subnormal: the same bins, from scaled values.
        _positions_tiny(sample, np.float64(lo32), np.float32((hhi - np.float64(lo32)) * _TINY_SCALE), where)
    else:
        _positions(sample, lo32, width32, where)
    _tally(where, loc)
    tally = loc[0]
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


@njit(cache=True, nogil=True)
def finish(res: Any, n: int, sample: Any, wide: bool) -> Any:
    """``finish_into`` new arrays: (result row, histogram counts)."""
    out = np.empty(RESULT, np.float64)
    counts = np.empty(HIST_BINS, np.float32)
    finish_into(res, n, sample, wide, out, counts, np.empty(sample.size, np.int32),
                np.empty((4, HIST_BINS + 1), np.int64))
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
def serial(x: Any, table: Any, copy: bool, out: Any, offset: int, step: int, count: int, wide: bool) -> Any:
    """``finish`` of one chunk over all of ``x``: (result row, histogram counts)."""
    res = np.empty((1, COLS), np.float64)
    if step == 1 and count == x.size and is_direct(x, table):
        # Every element is counted: the histogram reads x itself (no gathered copy).
        chunk(x, table, 0, x.size, copy, out, res, 0, offset, step, sample_buffer(x, table, 0))
        return finish(res, x.size, x, wide)
    sample = sample_buffer(x, table, count)
    chunk(x, table, 0, x.size, copy, out, res, 0, offset, step, sample)
    return finish(res, x.size, sample, wide)


@njit(cache=True, nogil=True, parallel=True)
def parallel(x: Any, table: Any, copy: bool, out: Any, nchunks: int, offset: int, step: int, count: int,
             wide: bool) -> Any:
    """``serial`` with ``nchunks`` chunks on numba's threads."""
    n = x.size
    size = (n + nchunks - 1) // nchunks
    res = np.empty((nchunks, COLS), np.float64)
    sample = sample_buffer(x, table, count)
    for c in prange(nchunks):
        chunk(x, table, min(c * size, n), min((c + 1) * size, n), copy, out, res, c, offset, step, sample)
    return finish(res, n, sample, wide)


@njit(cache=True, nogil=True)
def many(addresses: Any, sizes: Any, like: Any, table: Any, offsets: Any, steps: Any, counts: Any, wide: bool,
         rows: Any, hists: Any) -> None:
    """``serial`` of each tensor of a table of pointers: tensor ``i`` is ``sizes[i]`` values
    (never none) of ``like``'s dtype at memory address ``addresses[i]`` (its histogram's
    sample ``offsets[i]``, ``steps[i]``, ``counts[i]``); its result row into ``rows[i]`` and
    its histogram into ``hists[i]``. One call for a whole batch of tensors, read where they
    lie (no copy laying them end to end), whose scratch space serves them all: the
    per-tensor cost is then nanoseconds of compiled code, not microseconds of Python and
    dispatch. The caller keeps the tensors alive during the call."""
    res = np.empty((1, COLS), np.float64)
    pos = np.empty(max(counts.max(), 1), np.int32)
    loc = np.empty((4, HIST_BINS + 1), np.int64)
    sample = sample_buffer(like, table, max(counts.max(), 1))
    for i in range(addresses.size):
        seg = carray(pointer(addresses[i], like), (sizes[i],))
        if steps[i] == 1 and counts[i] == seg.size and is_direct(like, table):
            # Every element is counted: the histogram reads the tensor itself.
            chunk(seg, table, 0, seg.size, False, seg[:0], res, 0, 0, 1, sample[:0])
            finish_into(res, seg.size, seg, wide, rows[i], hists[i], pos, loc)
        else:
            part = sample[:counts[i]]
            chunk(seg, table, 0, seg.size, False, seg[:0], res, 0, offsets[i], steps[i], part)
            finish_into(res, seg.size, part, wide, rows[i], hists[i], pos, loc)
