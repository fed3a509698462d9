"""Statistics of small CPU tensors as they are the moment they are handed over.

A capture must summarise each module's output as it was when the module returned: a later
in-place operation may change it, and one through ``.data`` (or a kernel of the model's
own) does so without bumping its version counter. Batching small outputs together
(``gradexplorer.stats.device.DeferredStats``) therefore needs their values of that moment.
A ``clone`` per output (an allocation and a torch dispatch) cost more than the rest of a
small call's statistics inside a capture of many small layers, and so did reading each one
at once with its own compiled call: alone a microsecond, inside a capture about seven, its
code and scratch space pushed out of the caches by the model's forward between two calls
(docs/benchmarks.md, "The cost of each hooked call").

``ImmediateStats`` copies the tensor's bytes instead, with one ``memmove`` (through
``ctypes``: a few hundred nanoseconds), into a buffer it owns (``arena_bytes``). When the
buffer is full, and when the caller flushes, the copies are summarised together by one
compiled call (``gradexplorer.stats.cpu.summarize_at``, the kernel of ``summarize_many``)
and the records, plain dicts handed out empty, are filled from its rows in a few NumPy
operations. The memory stays bounded by the buffer, and the values summarised are the ones
of that moment.

Float32, float16 and bfloat16 tensors of at most ``limit`` values (every value binned in
the histogram), dense in memory, of the plain ``torch.Tensor`` type, go this way; anything
else is refused (``add`` returns ``None``) and the caller summarises it as before. The
numbers are those of ``gradexplorer.stats.cpu.summarize`` on the same tensor: the same
per-tensor pass over the same values.
"""

from __future__ import annotations

import ctypes
import logging

import numpy as np
import torch

from gradexplorer.stats import cpu as cpu_stats
from gradexplorer.stats.moments import fused_cpu_enabled, torch_stats
from gradexplorer.stats.pending import PendingRecords
from gradexplorer.stats.record import TensorStats

log = logging.getLogger(__name__)

#: Bytes of the buffer the copies go to: summarised together when it is full (a capture of
#: a 200-leaf MLP at batch 4 fills a fifth of it), so a capture's outputs are summarised in
#: a handful of compiled calls, and the buffer's memory is all the copies ever take.
ARENA_BYTES = 1 << 20
#: Each copy starts at a multiple of this (a cache line): the kernel's vector loads stay aligned.
_ALIGN = 64

#: Bytes per value of the dtypes taken here: float32 read directly, half types through
#: their widening table.
_SIZES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}
#: The dtypes taken here.
DTYPES = tuple(_SIZES)

_memmove = ctypes.memmove


def available() -> bool:
    """Whether small tensors can be taken here: the compiled kernels of
    ``gradexplorer.stats.cpu`` build (numba is installed) and the fused CPU pass is not
    turned off."""
    return fused_cpu_enabled() and cpu_stats.available()


class ImmediateStats:
    """Statistics of small CPU tensors, taken as each is handed over (``add``), computed
    and their records filled together (``fill``, or when the buffer is full). One per
    capture (or per flush scope); not shared between threads.

    Parameters
    ----------
    limit : int
        The most values a tensor taken here may have (the histogram counts every one).
    arena_bytes : int
        The size of the buffer the copies go to (at least one tensor of ``limit`` values).
    later : PendingRecords, optional
        Where the computed statistics wait to be written into their records
        (``gradexplorer.stats.pending``); ``None``: written by ``fill``.
    """

    def __init__(self, limit: int, arena_bytes: int = ARENA_BYTES, later: PendingRecords | None = None) -> None:
        if not available():
            raise RuntimeError("ImmediateStats needs immediate.available()")
        self.limit = limit
        self.later = later
        size = max(arena_bytes, limit * 4 + _ALIGN)
        self._arena = np.empty(size, np.uint8)
        self._base = int(self._arena.ctypes.data)
        self._end = size  # (offsets are from _base, which numpy aligns to at least 16 bytes)
        self._offset = -self._base % _ALIGN
        self._start = self._offset
        self._records: list[TensorStats] = []
        self._numels: list[int] = []
        self._offsets: list[int] = []
        self._dtypes: list[torch.dtype] = []

    def add(self, t: torch.Tensor) -> TensorStats | None:
        """The record of ``t``'s statistics as they are now (filled by ``fill``), or ``None``
        when ``t`` cannot be read here (another dtype, not dense, a subclass, over ``limit``
        values, not in host memory): summarise it another way."""
        dtype = t.dtype
        size = _SIZES.get(dtype)
        # Host memory of the plain type only: a subclass may hold no memory of its own.
        if size is None or type(t) is not torch.Tensor or not t.is_cpu or t.is_neg():
            return None
        try:
            if not t.is_contiguous():
                return None
            address = t.data_ptr()
        except (RuntimeError, NotImplementedError):  # no storage (a functorch wrapper), another layout
            return None
        n = t.numel()
        if not 0 < n <= self.limit:  # (the buffer holds at least ``limit`` values: never past it)
            return None
        nbytes = n * size
        offset = self._offset
        if offset + nbytes > self._end:
            self.fill()
            offset = self._offset
        _memmove(self._base + offset, address, nbytes)
        self._offset = offset + nbytes + (-nbytes % _ALIGN)
        record: TensorStats = {}  # type: ignore[typeddict-item]  # (filled by fill: no cast() call per tensor)
        self._records.append(record)
        self._numels.append(n)
        self._offsets.append(offset)
        self._dtypes.append(dtype)
        return record

    def fill(self) -> None:
        """Summarise the tensors taken since the last call and fill their records, or leave
        them to ``later`` (then the buffer is free again)."""
        if not self._records:
            return
        records, numels, offsets, dtypes = self._records, self._numels, self._offsets, self._dtypes
        self._records, self._numels, self._offsets, self._dtypes = [], [], [], []
        self._offset = self._start
        for dtype in dict.fromkeys(dtypes):  # one compiled call per dtype (usually one)
            idx = [i for i, d in enumerate(dtypes) if d is dtype]
            group = [records[i] for i in idx]
            sizes = [numels[i] for i in idx]
            where = np.array([offsets[i] for i in idx], np.int64)
            try:
                cpu_stats.summarize_at(where + self._base, sizes, dtype, group, self.later)
            except Exception as exc:  # noqa: BLE001 - a compile or runtime failure: torch operations
                log.warning("fused CPU statistics failed (%s: %s): using torch operations", type(exc).__name__, exc)
                for record, offset, n in zip(group, where.tolist(), sizes):
                    values = torch.from_numpy(self._arena[offset:offset + n * _SIZES[dtype]]).view(dtype)
                    record.update(torch_stats(values, None))

    def __len__(self) -> int:
        return len(self._records)
