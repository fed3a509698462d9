"""What a piece of code allocates, measured without timing it: the largest tensor any torch
operation makes on this thread (:class:`LargestResult`), and the rise of the whole process's
peak resident memory, workers' threads included (:func:`peak_rss_rise`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode


class LargestResult(TorchDispatchMode):
    """Records the largest tensor any torch operation makes while it is on (on this thread:
    dispatch modes are thread-local). Fake tensors (a forward's peak told from shapes) hold
    no memory and are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


@dataclass
class Rise:
    bytes: int = 0


def _peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


@contextlib.contextmanager
def peak_rss_rise() -> Iterator[Rise]:
    """How far the process's peak resident memory rose above what it held at the start
    (Linux: the peak is reset through /proc/self/clear_refs); every thread counts."""
    Path("/proc/self/clear_refs").write_text("5")
    rise = Rise()
    start = _peak_rss()
    try:
        yield rise
    finally:
        rise.bytes = _peak_rss() - start


class RowReader(torch.nn.Module):
    """Reads the first 8 values of each row: cheap on an expanded batch as long as nothing
    copies it. ``dense=True`` makes a dense copy of its input first (``x * 2``), as many
    models would: 1 GiB for one 16384 x 16384 sample."""

    def __init__(self, dense: bool = False) -> None:
        super().__init__()
        self.dense = dense
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense:
            x = x * 2
        return self.fc(x[..., :8]).mean(1)
