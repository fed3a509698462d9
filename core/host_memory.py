"""Freed host memory kept in the process for the next capture (glibc only).

By default glibc gives large freed blocks back to the kernel: a block over a threshold
(dynamic, at most 32 MiB) is mapped and unmapped on its own, and the free top of the heap is
trimmed once it passes twice that. The next capture then faults the same memory in again, page
by page, at about 1 µs per 4 KiB page on the build machine. A full capture keeps what it records
(1.4 GB on resnet50 at batch 8) while forward and backward still allocate, so each capture took
about 150,000 such faults on resnet50 and 200,000 on efficientnet_b0: more than computing the
statistics. A raised trim threshold keeps freed memory in the process for the next capture to
reuse, as PyTorch's caching allocator does on a GPU, up to a bound: an eighth of the machine's
memory, at most 2 GiB (unbounded, the overhead benchmark's process kept the 10 GB TorchLens had
freed, and the kernel's out-of-memory killer ended it). The mmap threshold is fixed at glibc's own
dynamic maximum, 32 MiB, so larger blocks are handed back at once, as by default. The cost: the
process's resident memory stays up to that bound above what it uses, until it exits or calls
:func:`release_freed_memory`.

The ``gradexplorer`` command and the window call :func:`reuse_freed_memory` when they start; a
notebook or training script that captures repeatedly can call it too (or set glibc's own
``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_MMAP_THRESHOLD_``). ``GRADEXPLORER_KEEP_FREED_MEMORY=0``
turns it off. Elsewhere than glibc (macOS, Windows, musl) both functions do nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap; glibc's dynamic threshold would reach it at the
#: first free of such a block anyway (its maximum on 64-bit), but setting the trim threshold
#: ends the dynamic one, and its start value (128 KiB) would map far more blocks.
MMAP_THRESHOLD = 32 << 20
#: The most free memory kept at the top of the heap (mallopt takes an int).
KEEP_AT_MOST = 2**31 - 1
#: ... and at most this share of the machine's memory.
KEEP_SHARE = 1 / 8


def kept_bytes() -> int:
    """The free memory a process keeps for reuse after :func:`reuse_freed_memory`."""
    from core.devices import _meminfo_bytes

    total = _meminfo_bytes("MemTotal")
    return min(KEEP_AT_MOST, int(total * KEEP_SHARE)) if total else 256 << 20


def _glibc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the C library the process already uses
    except OSError:
        return None
    if not all(hasattr(libc, f) for f in ("gnu_get_libc_version", "mallopt", "malloc_trim")):
        return None  # musl and others: no mallopt semantics to rely on
    return libc


def reuse_freed_memory() -> bool:
    """Keep freed host memory in the process for reuse instead of returning it to the
    system (see the module docstring).

    Returns
    -------
    bool
        Whether the C library took the setting: False elsewhere than glibc, or with
        ``GRADEXPLORER_KEEP_FREED_MEMORY=0``.
    """
    if os.environ.get("GRADEXPLORER_KEEP_FREED_MEMORY", "1") == "0":
        return False
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                and libc.mallopt(_M_TRIM_THRESHOLD, kept_bytes()) == 1)


def release_freed_memory() -> bool:
    """Give the free memory the process holds back to the system now (``malloc_trim``).

    Returns
    -------
    bool
        Whether any was given back (False elsewhere than glibc).
    """
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0) == 1)
