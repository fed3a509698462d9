"""The numba kernels of ``gradexplorer.stats.merge_cpu`` (imported only when numba is installed).

A module of its own, like ``gradexplorer.stats.cpu_kernels``, so that ``cache=True`` finds the
compiled code again in the next process.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import carray, njit

from gradexplorer.stats.cpu_kernels import chunk, pointer

_NO_TABLE = np.zeros(1, np.int8)  # its dtype (not float32) tells chunk() to read x directly
#: Up to this many values, ``fold_counts_into`` counts each value's bin directly
#: (docs/benchmarks.md, "Watching a training run").
_DIRECT = 4096


@njit(cache=True, nogil=True)
def fold_counts(bits: Any, fold: Any, out: Any) -> None:
    """Add to ``out`` the counts of ``bits`` (float32 values viewed as int32) in the bins
    ``fold`` maps each ``(bits >> 23) + 256`` key to (-1: not counted)."""
    fold_counts_into(bits, fold, out, np.empty((4, 512), np.int64))


@njit(cache=True, nogil=True)
def fold_counts_into(bits: Any, fold: Any, out: Any, loc: Any) -> None:
    """``fold_counts`` with ``loc`` ((4, 512) int64, overwritten) as its scratch space: a
    batch of small tensors reuses one rather than allocating its own for each.

    Four interleaved tables: consecutive values mostly share a key, and one table would
    make every increment wait for the previous one. Up to ``_DIRECT`` values each value's
    bin is counted directly instead: clearing the tables and folding their 512 keys cost
    more than counting the values one by one, up to a few thousand values.
    """
    n = bits.size
    if n <= _DIRECT:
        for i in range(n):
            b = fold[(bits[i] >> 23) + 256]
            if b >= 0:
                out[b] += 1
        return
    loc[:] = 0
    m = n - n % 4
    for i in range(0, m, 4):
        loc[0, (bits[i] >> 23) + 256] += 1
        loc[1, (bits[i + 1] >> 23) + 256] += 1
        loc[2, (bits[i + 2] >> 23) + 256] += 1
        loc[3, (bits[i + 3] >> 23) + 256] += 1
    for i in range(m, n):
        loc[0, (bits[i] >> 23) + 256] += 1
    for k in range(512):
        b = fold[k]
        if b >= 0:
            out[b] += loc[0, k] + loc[1, k] + loc[2, k] + loc[3, k]


@njit(cache=True, nogil=True)
def moments_and_counts(x: Any, bits: Any, fold: Any, res: Any, out: Any) -> None:
    """The capture's fused moments of ``x`` (``cpu_kernels.chunk``: float64 sums
    around block pivots, the NaN count, finite extremes) into ``res[0]``, then the log2
    bin counts of its bits (``bits``: ``x`` viewed as int32) into ``out``."""
    # No histogram sample (the log2 bins count every value); made here, since numba
    # freezes a global array read-only and chunk writes its sample.
    chunk(x, _NO_TABLE, 0, x.size, False, x[:0], res, 0, 0, 1, np.empty(0, np.float64))
    fold_counts(bits, fold, out)


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def squared_distance(a: Any, b: Any) -> float:
    """Sum of (a - b)^2 over two float32 arrays of one size, in float64 (each difference
    exact: float32 values subtract exactly in float64)."""
    s = 0.0
    for i in range(a.size):
        d = np.float64(a[i]) - np.float64(b[i])
        s += d * d
    return s


@njit(cache=True, nogil=True)
def squared_distances_at(a_addresses: Any, b_addresses: Any, sizes: Any, like: Any, out: Any) -> None:
    """``squared_distance`` of each pair of a table of pointers into ``out[i]``: pair ``i``
    is ``sizes[i]`` float32 values at ``a_addresses[i]`` and as many at ``b_addresses[i]``,
    read there as ``like``'s dtype. One call for all the parameters of a watched step (a
    call per parameter cost more than its arithmetic on a model of small layers); the caller
    keeps the memory alive during the call."""
    for i in range(sizes.size):
        a = carray(pointer(a_addresses[i], like), (sizes[i],))
        b = carray(pointer(b_addresses[i], like), (sizes[i],))
        out[i] = squared_distance(a, b)


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def row_squares(x: Any, out: Any) -> None:
    """``out[r]`` = sum of squares of row ``r`` of the float32 matrix ``x``, in float64."""
    rows, cols = x.shape
    for r in range(rows):
        s = 0.0
        for c in range(cols):
            v = np.float64(x[r, c])
            s += v * v
        out[r] = s


@njit(cache=True, nogil=True)
def moments_and_counts_at(addresses: Any, sizes: Any, like: Any, bits_like: Any, fold: Any, rows: Any,
                          hists: Any) -> None:
    """``moments_and_counts`` of each tensor of a table of pointers into ``rows[i]`` and
    ``hists[i]``: tensor ``i`` is ``sizes[i]`` float32 values (never none) at memory address
    ``addresses[i]``, read there as ``like``'s dtype and, for its bits, as ``bits_like``'s
    (int32). One call for a batch of tensors, read where they lie, as ``cpu_kernels.many``
    reads a capture's: laying them end to end first was a copy of each. The caller keeps
    the tensors alive during the call."""
    loc = np.empty((4, 512), np.int64)  # scratch space for all: no allocation per tensor
    no_sample = np.empty(0, np.float64)
    for i in range(addresses.size):
        x = carray(pointer(addresses[i], like), (sizes[i],))
        bits = carray(pointer(addresses[i], bits_like), (sizes[i],))
        chunk(x, _NO_TABLE, 0, x.size, False, x[:0], rows, i, 0, 1, no_sample)
        fold_counts_into(bits, fold, hists[i], loc)
