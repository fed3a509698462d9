"""The memory a tensor read from a file claims, told before anything materialises it.

A ``torch.save`` file stores a tensor as a storage and a view on it (sizes, strides, an
offset): ``torch.zeros(1).expand(1, 3, 30000, 30000)`` is a 1.6 KiB file that declares
2.7 billion elements. Anything that makes it dense (a forward pass, ``.contiguous()``,
statistics, a plot) then allocates all of them. :func:`check_tensor_fits` compares a
tensor's true element count (its sizes, whatever its strides: expanded, stride-0 and
overlapping views count every element) with the memory budget, in Python integers, so the
check itself allocates nothing.
"""

from __future__ import annotations

import math

import torch

from gradexplorer.base import devices
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.units import format_bytes

__all__ = ["TensorTooLarge", "check_tensor_fits", "declared_bytes", "read_budget"]

#: Share of the free RAM that tensors read from a file may claim (without --memory-budget).
READ_SHARE = 0.5


class TensorTooLarge(GradExplorerError):
    """A tensor in a file declares more elements than the memory budget holds."""


def declared_bytes(tensor: torch.Tensor) -> int:
    """Bytes the tensor occupies once dense: every element its sizes declare."""
    return math.prod(int(s) for s in tensor.shape) * tensor.element_size()


def read_budget(budget: int | None = None) -> int | None:
    """``budget`` when given (``--memory-budget``), else ``READ_SHARE`` of the free RAM now
    (None when that cannot be told)."""
    if budget is not None:
        return int(budget)
    free = devices.free_memory("cpu")  # looked up at call time: tests replace it
    return None if free is None else int(free * READ_SHARE)


def check_tensor_fits(tensor: torch.Tensor, what: str, budget: int | None = None, *, factor: int = 1,
                      fix: str = "") -> None:
    """Refuse ``tensor`` when ``factor`` times its dense size exceeds the memory budget.

    Parameters
    ----------
    tensor : torch.Tensor
        As read from the file (nothing of it is copied or made dense).
    what : str
        How it is named in the message ("the input in 'e.pt'").
    budget : int, optional
        Bytes (``--memory-budget``); by default half the free RAM.
    factor : int
        How many times its size the work on it holds (a forward pass on one sample keeps
        several activations of about its size).
    fix : str
        The way out, in the caller's words.

    Raises
    ------
    TensorTooLarge
        With the element count, the bytes needed and the budget.
    """
    limit = read_budget(budget)
    if limit is None:
        return
    need = declared_bytes(tensor) * max(1, factor)
    if need <= limit:
        return
    shape = "x".join(str(int(s)) for s in tensor.shape)
    numel = math.prod(int(s) for s in tensor.shape)
    stored = tensor.untyped_storage().nbytes() if tensor.layout == torch.strided else 0
    packed = f", stored in {format_bytes(stored)} (an expanded view)" if 0 < stored < declared_bytes(tensor) else ""
    work = f" and about {format_bytes(need)} to work on" if factor > 1 else ""
    source = "set by --memory-budget" if budget is not None else "half of the free RAM"
    raise TensorTooLarge(
        f"{what} is {shape} ({numel:,} elements, {format_bytes(declared_bytes(tensor))} once dense{packed}"
        f"{work}) but the memory budget is {format_bytes(limit)} ({source});",
        fix or "use a smaller tensor, or raise --memory-budget if this machine has the memory.",
    )
