"""Statistics of small CPU tensors taken the moment they are handed over, where they lie.

A capture must summarise each module's output as it was when the module returned: a later
in-place operation may change it, and one through ``.data`` (or a kernel of the model's
own) does so without bumping its version counter. Batching small outputs together
(``gradexplorer.stats.device.DeferredStats``) therefore needed a copy of each, taken in the
hook; inside a capture of many small layers that copy and its memory cost more than the
rest of the call's statistics (docs/benchmarks.md, "The cost of each hooked call").

``ImmediateStats`` reads the tensor itself instead, at once, with one compiled call through
``ctypes`` (``gradexplorer.stats.immediate_kernels``): the moments and histogram go into a
row of a table, and the records (plain dicts, handed out empty) are filled from the table
together, in a few NumPy operations for a chunk of rows, when the caller flushes or a chunk
is full. No copy, and the values read are the ones of that moment.

Float32, float16 and bfloat16 tensors of at most ``limit`` values (every value binned in
the histogram), dense in memory, of the plain ``torch.Tensor`` type, go this way; anything
else is refused (``add`` returns ``None``) and the caller summarises it as before. The
numbers are those of ``gradexplorer.stats.cpu.summarize`` on the same tensor: the same
per-tensor pass, compiled for the same array types.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from typing import Any, cast

import numpy as np
import torch

from gradexplorer.stats import cpu as cpu_stats
from gradexplorer.stats.moments import HIST_BINS, fused_cpu_enabled
from gradexplorer.stats.record import TensorStats

log = logging.getLogger(__name__)

#: Rows of one table: records are filled a chunk at a time, and the chunk's histogram
#: table stays alive as long as one of its records does (each histogram is a view of it).
CHUNK = 256

#: The dtypes taken here: float32 read directly, half types through their widening table.
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_state: dict[str, Any] = {"functions": None}  # None: not built yet; False: unavailable
_lock = threading.Lock()
#: Four 64-bit integers (address, count, row, context): a C function that keeps the GIL
#: while it runs (it is a microsecond; releasing and taking the GIL back cost a fifth of that).
_PROTOTYPE = ctypes.PYFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)


def needs_preparing() -> bool:
    """Whether :func:`available` has compiling (or loading from numba's cache) to do in this
    process: seconds the first time on a machine, a fraction of one from the cache."""
    return _state["functions"] is None and fused_cpu_enabled() and cpu_stats.available()


def available() -> bool:
    """Whether the compiled functions can be used (numba imports and compiles them, and the
    fused CPU pass is not turned off)."""
    if not fused_cpu_enabled() or not cpu_stats.available():
        return False
    if _state["functions"] is None:
        with _lock:
            if _state["functions"] is None:
                t0 = time.perf_counter()
                try:
                    from gradexplorer.stats import immediate_kernels  # compiles (or loads) on import

                    k: Any = immediate_kernels  # (numba's cfunc objects, untyped)
                    _state["functions"] = {
                        "float32": _PROTOTYPE(k.float32_row.address),
                        "half": _PROTOTYPE(k.half_row.address),
                        "module": k,
                    }
                except Exception as exc:  # noqa: BLE001 - a numba that cannot build these
                    log.info("immediate CPU statistics unavailable (%s): copying small tensors instead", exc)
                    _state["functions"] = False
                else:
                    cpu_stats.compile_seconds["immediate"] = time.perf_counter() - t0
    return bool(_state["functions"])


class ImmediateStats:
    """Statistics of small CPU tensors, computed as each is handed over (``add``), their
    records filled together (``fill``). One per capture (or per flush scope); not shared
    between threads.

    Parameters
    ----------
    limit : int
        The most values a tensor taken here may have (the histogram counts every one).
    """

    def __init__(self, limit: int) -> None:
        functions = _state["functions"]
        if not functions:
            raise RuntimeError("ImmediateStats needs immediate.available()")
        k = functions["module"]
        self.limit = limit
        self._float32 = functions["float32"]
        self._half = functions["half"]
        self._context = np.zeros(k.CONTEXT, np.int64)
        self._context_address = int(self._context.ctypes.data)
        # Scratch space of one tensor, and the arrays the context points at: held here.
        self._held: dict[int, np.ndarray] = {
            k.POSITIONS: np.empty(max(limit, 1), np.int32),
            k.TALLY: np.empty((4, HIST_BINS + 1), np.int64),
            k.MOMENTS: np.empty((1, k.COLS), np.float64),
            k.SAMPLE: np.empty(max(limit, 1), np.float32),
            k.NO_TABLE: np.zeros(1, np.int8),
        }
        for slot, array in self._held.items():
            self._context[slot] = array.ctypes.data
        self._rows_slot, self._hists_slot, self._table_slot = k.ROWS, k.HISTS, k.TABLE
        self._columns = k.RESULT
        self._records: list[TensorStats] = []
        self._numels: list[int] = []
        self._new_chunk()

    def _new_chunk(self) -> None:
        self._rows = np.empty((CHUNK, self._columns), np.float64)
        self._hists = np.empty((CHUNK, HIST_BINS), np.float32)  # new: the records' histograms view it
        self._context[self._rows_slot] = self._rows.ctypes.data
        self._context[self._hists_slot] = self._hists.ctypes.data

    def add(self, t: torch.Tensor) -> TensorStats | None:
        """The record of ``t``'s statistics as they are now (filled by ``fill``), or ``None``
        when ``t`` cannot be read here (another dtype, not dense, a subclass, over ``limit``
        values, not in host memory): summarise it another way."""
        dtype = t.dtype
        if dtype is torch.float32:
            function = self._float32
        elif dtype is torch.float16 or dtype is torch.bfloat16:
            function = self._half
            self._context[self._table_slot] = cpu_stats.widening_table(dtype).ctypes.data
        else:
            return None
        # Host memory of the plain type only: a subclass may hold no memory of its own.
        if type(t) is not torch.Tensor or not t.is_cpu or t.is_neg():
            return None
        try:
            if not t.is_contiguous():
                return None
            address = t.data_ptr()
        except (RuntimeError, NotImplementedError):  # no storage (a functorch wrapper), another layout
            return None
        n = t.numel()
        if not 0 < n <= self.limit:  # (the scratch space holds ``limit`` values: never past it)
            return None
        row = len(self._records)
        if row >= CHUNK:  # (never, in one thread: the last row fills the chunk; but the
            self.fill()   # kernel writes where ``row`` says, so never past the table)
            row = 0
        function(address, n, row, self._context_address)
        record = cast(TensorStats, {})
        self._records.append(record)
        self._numels.append(n)
        if row + 1 == CHUNK:
            self.fill()
        return record

    def fill(self) -> None:
        """Fill the records handed out since the last call (then their rows are free again)."""
        count = len(self._records)
        if not count:
            return
        records, numels = self._records, self._numels
        self._records, self._numels = [], []
        rows, hists = self._rows[:count], self._hists[:count]
        self._new_chunk()
        cpu_stats.records_from_rows(rows, hists, numels, [True] * count, records, None, None)

    def __len__(self) -> int:
        return len(self._records)
