"""The statistics record of one tensor: ``TensorStats``, and the names of its keys.

Every path that summarises a tensor returns one (``gradexplorer.stats.tensor_stats.tensor_stats``,
the torch operations of ``gradexplorer.stats.moments``, the numba pass of
``gradexplorer.stats.cpu``, the Triton kernels' rows of ``gradexplorer.stats.device``, the
batches of ``gradexplorer.stats.batched``); a capture holds one per recorded tensor
(``CallRecord.stats``, ``LayerRecord.param_stats``), and the capture file, the comparison,
the gradient flow and the graph read it. It is a ``TypedDict``: a plain dict at run time,
so that a capture file holds only builtin containers and ``weights_only`` loading opens it,
and a record that mypy checks wherever it crosses a module.
"""

from __future__ import annotations

from typing import Literal, TypedDict

import torch

#: The name of a scalar statistic.
ScalarKey = Literal["numel", "min", "max", "mean", "std", "mean_abs", "l2", "zero_fraction",
                    "nan_count", "inf_count"]
#: The name of any key of a ``TensorStats``.
StatKey = Literal[ScalarKey, "hist", "hist_range", "hist_exact", "overflow"]

#: Scalar statistics, in the order they are packed on the device.
SCALAR_KEYS: tuple[ScalarKey, ...] = (
    "numel",
    "min",
    "max",
    "mean",
    "std",
    "mean_abs",
    "l2",
    "zero_fraction",
    "nan_count",
    "inf_count",
)
#: Every key of a ``TensorStats``. ``overflow`` names the statistics (``std``, ``l2``)
#: whose true value is beyond the float64 range and is shown as inf: not data Inf.
STAT_KEYS: tuple[StatKey, ...] = (*SCALAR_KEYS, "hist", "hist_range", "hist_exact", "overflow")


class _StatsInEveryFile(TypedDict):
    """The keys every statistics record holds, also one read from any capture file (the
    capture file's schema requires them: ``gradexplorer.files.schema.STATS``)."""

    numel: int
    min: float
    max: float
    mean: float
    std: float
    mean_abs: float
    l2: float
    zero_fraction: float
    nan_count: int
    inf_count: int
    hist: torch.Tensor
    hist_range: tuple[float, float]


class TensorStats(_StatsInEveryFile, total=False):
    """The summary statistics of one tensor (``gradexplorer.stats.tensor_stats.tensor_stats``).

    Keys
    ----
    numel : int
        Elements, finite or not.
    min, max, mean, std, mean_abs, l2, zero_fraction : float
        Over the finite values (NaN and Inf are counted, not summarised); NaN where there
        is none. ``std`` has n - 1 in the denominator, as ``torch.std``.
    nan_count, inf_count : int
        NaN and ±Inf values.
    hist : torch.Tensor
        float32 counts of ``gradexplorer.stats.moments.HIST_BINS`` equal bins, on the CPU,
        summing to the number of finite values.
    hist_range : tuple of two floats
        The lower edge of the first bin and the upper edge of the last.
    hist_exact : bool
        Whether the histogram counted every element (else a strided subsample, scaled).
    overflow : tuple of str
        The statistics beyond the float64 range, shown as inf (usually empty).

    Every statistics path writes all of these keys (``STAT_KEYS``). ``hist_exact`` and
    ``overflow`` may be absent from a record read from a capture file written before
    they existed, and ``overflow`` from a dataset capture's
    (``gradexplorer.stats.merge.DatasetTensorStats``).
    A record handed out during a capture whose tensor is still being summarised on a GPU
    is empty until the capture resolves it (``gradexplorer.stats.device.DeferredStats``),
    and one of a small CPU tensor until the capture's records are first read
    (``gradexplorer.stats.pending``, through ``Capture.layers``).
    """

    hist_exact: bool
    overflow: tuple[str, ...]

