"""The compiled functions of ``gradexplorer.stats.immediate`` (imported only when numba is
installed; compiling them, or loading them from numba's on-disk cache, happens on import).

Each is a C function (``numba.cfunc``) of four 64-bit integers: the address of a tensor's
first value, its number of values, the row it fills, and the address of a context (``CONTEXT``
slots, below) that says where the rows, the histograms and the scratch space are. Called
through ``ctypes`` with integers only, one costs under a microsecond of Python; numba's own
dispatcher, which types every argument at every call, several. The body is the per-tensor
pass that ``cpu_kernels.many`` runs over each tensor of a batch, compiled for the same array
types, so that a tensor's statistics are the same numbers whichever of the two computes them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import carray, cfunc, njit, types

from gradexplorer.stats.cpu_kernels import COLS, RESULT, chunk, finish_into, pointer
from gradexplorer.stats.moments import HIST_BINS

#: The context's slots: addresses of the result rows (float64, ``RESULT`` per row), the
#: histograms (float32, ``HIST_BINS`` per row), the scratch space of one tensor (the
#: histogram's positions, int32, and tally, int64, a chunk's moments, float64) and, for
#: half types, the widened sample (float32) and the 65,536-entry widening table; then an
#: int8 array of one value, the "no table" of float32 data (``cpu_kernels.load``).
ROWS, HISTS, POSITIONS, TALLY, MOMENTS, SAMPLE, TABLE, NO_TABLE = range(8)
CONTEXT = 8

_F64 = np.empty(0, np.float64)
_F32 = np.empty(0, np.float32)
_I64 = np.empty(0, np.int64)
_I32 = np.empty(0, np.int32)
_I8 = np.empty(0, np.int8)
_U16 = np.empty(0, np.uint16)

_SIGNATURE = types.void(types.int64, types.int64, types.int64, types.int64)


@njit(cache=True, inline="always")
def _outputs(n: int, row: int, c: Any) -> Any:
    """The row's result and histogram, and the scratch space, as arrays over the context's memory."""
    out = carray(pointer(c[ROWS] + row * (RESULT * 8), _F64), (RESULT,))
    hist = carray(pointer(c[HISTS] + row * (HIST_BINS * 4), _F32), (HIST_BINS,))
    positions = carray(pointer(c[POSITIONS], _I32), (n,))
    tally = carray(pointer(c[TALLY], _I64), (4, HIST_BINS + 1))
    moments = carray(pointer(c[MOMENTS], _F64), (1, COLS))
    return out, hist, positions, tally, moments


@cfunc(_SIGNATURE, cache=True)
def float32_row(address: int, n: int, row: int, context: int) -> None:  # pragma: no cover - compiled
    """The statistics of ``n`` float32 values at ``address`` into row ``row``: the
    histogram counts every value, read where it lies (``cpu_kernels.many``'s direct case)."""
    c = carray(pointer(context, _I64), (CONTEXT,))
    x = carray(pointer(address, _F32), (n,))
    out, hist, positions, tally, moments = _outputs(n, row, c)
    no_table = carray(pointer(c[NO_TABLE], _I8), (1,))
    chunk(x, no_table, 0, n, False, x[:0], moments, 0, 0, 1, x[:0])
    finish_into(moments, n, x, False, out, hist, positions, tally)


@cfunc(_SIGNATURE, cache=True)
def half_row(address: int, n: int, row: int, context: int) -> None:  # pragma: no cover - compiled
    """The same for ``n`` float16 or bfloat16 values (their 16-bit patterns, widened through
    the context's table): every value is gathered, widened, for the histogram."""
    c = carray(pointer(context, _I64), (CONTEXT,))
    x = carray(pointer(address, _U16), (n,))
    out, hist, positions, tally, moments = _outputs(n, row, c)
    table = carray(pointer(c[TABLE], _F32), (1 << 16,))
    sample = carray(pointer(c[SAMPLE], _F32), (n,))
    chunk(x, table, 0, n, False, x[:0], moments, 0, 0, 1, sample)
    finish_into(moments, n, sample, False, out, hist, positions, tally)
