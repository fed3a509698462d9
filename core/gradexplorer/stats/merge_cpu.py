"""``MergeStats`` of a float32 CPU tensor in compiled passes (the watch's and the dataset
capture's hot path).

``gradexplorer.stats.merge`` summarises a tensor with torch operations: aminmax, a float32 sum
and the deviations from it, a dot product, abs, and for the signed log2 histogram a
strided int16 view of the sign and exponent bits, a shift and a ``bincount`` over int64
keys. A watched resnet18 step summarises some 300 tensors (73 million values at 112 px):
those passes, above all the histogram's, were most of the watch's overhead. Here numba
reads the tensor once for its moments with the capture's own fused kernel
(``gradexplorer.stats.cpu_kernels.chunk``: float64 sums around block means, NaN and Inf counts,
finite extremes) and once for the histogram, counting the very keys of the torch path
(``(bits >> 23) + 256``) folded into bins by the same table: every value lands in the same
bin by construction.

Only float32 tensors on the CPU take this path, when the numba kernels are there
(``gradexplorer.stats.cpu.available()``, which ``GRADEXPLORER_CPU_KERNEL=0`` turns off); the
functions return ``None`` otherwise and ``gradexplorer.stats.merge`` uses torch. The kernels are
serial and release the GIL: no parallel region, so they never meet the capture's parallel
kernel.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

_state: dict = {"kernels": None}  # None: not built yet; False: unavailable
#: Empty arrays whose dtypes tell ``moments_and_counts_at`` how to read the memory it is given.
_FLOAT32 = np.empty(0, np.float32)
_INT32 = np.empty(0, np.int32)
_lock = threading.Lock()


def _kernels() -> Any:
    if _state["kernels"] is None:
        with _lock:
            if _state["kernels"] is None:
                try:
                    from gradexplorer.stats import cpu as cpu_stats

                    if not cpu_stats.available():  # numba, and the switch that turns kernels off
                        raise RuntimeError("numba kernels unavailable")
                    # Deferred: importing the kernels imports numba and compiles them (seconds).
                    from gradexplorer.stats import merge_kernels

                    _state["kernels"] = merge_kernels
                except Exception:  # noqa: BLE001 - no numba, or one that cannot build it: torch path
                    _state["kernels"] = False
    return _state["kernels"]


def _bits(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray] | None:
    """(float32 values, the same memory as int32) of a float32 CPU tensor, or None."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or not _kernels():
        return None
    values = _dense(x.detach()).reshape(-1).numpy()
    return values, values.view(np.int32)


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` when its values are one dense run of memory as they read, else a dense copy
    (a strided or a transposed view, a lazy negation), made from ``t`` detached."""
    return t if t.is_contiguous() and not t.is_neg() else t.detach().resolve_neg().contiguous()


def _fail() -> None:
    # A compile or runtime failure: the torch path for good.
    _state["kernels"] = False


def fold_counts(x: torch.Tensor, fold: torch.Tensor, bins: int) -> torch.Tensor | None:
    """Counts of ``x``'s values per bin, or ``None`` when this path cannot take ``x``.

    Parameters
    ----------
    x : torch.Tensor
        A float32 CPU tensor.
    fold : torch.Tensor
        int64, 512 entries: the bin of each ``(bits >> 23) + 256`` key, -1 for none.
    bins : int
        Length of the result.

    Returns
    -------
    torch.Tensor or None
        int64 counts.
    """
    got = _bits(x)
    if got is None:
        return None
    out = torch.zeros(bins, dtype=torch.long)
    try:
        _state["kernels"].fold_counts(got[1], fold.numpy(), out.numpy())
    except Exception:  # noqa: BLE001
        _fail()
        return None
    return out


def moments_and_counts(x: torch.Tensor, fold: torch.Tensor, bins: int) -> tuple[list[float], np.ndarray] | None:
    """Moments and log2 bin counts of a float32 CPU tensor, or ``None``.

    Returns
    -------
    (row, counts) or None
        ``row``: count, mean, m2, sum of magnitudes, min, max, non-zero count, NaN count
        (``gradexplorer.stats.cpu_kernels.COLS``), then the Inf count (what is neither finite nor
        NaN), float64, over the finite values; ``counts``: int64 per bin.
    """
    got = _bits(x)
    if got is None:
        return None
    from gradexplorer.stats.cpu_kernels import COLS  # deferred: imports numba (the kernels are built by now)

    res = np.empty((1, COLS), np.float64)
    out = np.zeros(bins, np.int64)
    try:
        _state["kernels"].moments_and_counts(got[0], got[1], fold.numpy(), res, out)
    except Exception:  # noqa: BLE001
        _fail()
        return None
    row = res[0].tolist()
    return [*row, x.numel() - row[0] - row[7]], out


def moments_and_counts_many(tensors: list[torch.Tensor], fold: torch.Tensor,
                            bins: int) -> tuple[list[list[float]], np.ndarray] | None:
    """``moments_and_counts`` of each of ``tensors`` (float32 CPU tensors, none empty), in
    one compiled call over a table of their addresses, or ``None`` when this path cannot
    take them.

    Returns
    -------
    (rows, counts) or None
        ``rows[i]`` as ``moments_and_counts``'s row of tensor ``i``; ``counts[i]`` its bin counts.
    """
    if not tensors or not _kernels() or any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
        return None
    from gradexplorer.stats.cpu_kernels import COLS  # deferred: imports numba (the kernels are built by now)

    # The kernel reads each tensor where it lies, from a table of addresses (laying them end
    # to end first copied every one). A tensor that is not one dense run of memory (a strided
    # or a negated view) is made one, and held until the call returns.
    with torch.no_grad():
        held = [_dense(t) for t in tensors]
    sizes = [t.numel() for t in held]
    addresses = np.array([t.data_ptr() for t in held], np.int64)
    res = np.empty((len(sizes), COLS), np.float64)
    out = np.zeros((len(sizes), bins), np.int64)
    try:
        _state["kernels"].moments_and_counts_at(addresses, np.array(sizes, np.int64), _FLOAT32, _INT32,
                                                fold.numpy(), res, out)
    except Exception:  # noqa: BLE001
        _fail()
        return None
    del held  # (kept alive through the call above)
    rows = res.tolist()
    for n, row in zip(sizes, rows):
        row.append(n - row[0] - row[7])  # the Inf count: neither finite nor NaN
    return rows, out


def distances(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float | None] | None:
    """||a - b|| of each pair ``(a, b)``, accumulated in float64 (one pass, no temporary):
    those of two float32 CPU tensors of one shape in one compiled call over a table of their
    addresses (a watched step's update ratios: one call per parameter was most of their cost
    on a model of small layers), ``None`` for the others; ``None`` for all when the kernels
    are unavailable."""
    if not pairs or not _kernels():
        return None
    out: list[float | None] = [None] * len(pairs)
    take = [i for i, (a, b) in enumerate(pairs)
            if a.dtype == b.dtype == torch.float32 and a.device.type == b.device.type == "cpu" and a.shape == b.shape]
    if not take:
        return out
    held = [(_dense(pairs[i][0]), _dense(pairs[i][1])) for i in take]  # held until the call returns
    squares = np.empty(len(take), np.float64)
    try:
        _state["kernels"].squared_distances_at(np.array([a.data_ptr() for a, _b in held], np.int64),
                                               np.array([b.data_ptr() for _a, b in held], np.int64),
                                               np.array([a.numel() for a, _b in held], np.int64), _FLOAT32, squares)
    except Exception:  # noqa: BLE001
        _fail()
        return None
    del held  # (kept alive through the call above)
    for i, norm in zip(take, np.sqrt(squares).tolist()):
        out[i] = norm
    return out


def row_norms(x: torch.Tensor) -> torch.Tensor | None:
    """The L2 norm of each sample of a batch-first float32 CPU tensor (float64
    accumulation, returned as float32 like ``gradexplorer.stats.merge.per_sample_norms``), or
    ``None`` when this path cannot take it."""
    if x.dim() < 1 or x.dtype != torch.float32 or x.device.type != "cpu" or not _kernels():
        return None
    out = np.empty(x.shape[0], np.float64)
    try:
        _state["kernels"].row_squares(_dense(x.detach()).numpy().reshape(x.shape[0], -1), out)
    except Exception:  # noqa: BLE001
        _fail()
        return None
    return torch.from_numpy(np.sqrt(out)).float()
