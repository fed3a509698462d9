"""What a dataset capture holds, told before it runs: replicated on every rank, or sharded.

The capture keeps statistics, never tensors (``gradexplorer.recording.dataset_capture``), so what
it holds to the end (``MemoryEstimate.total``) is:

* the merged statistics: per selected call an activation, an output-gradient and a
  per-sample-norm row, per recorded parameter a gradient row (``MergeStats``, mostly its
  261-bin histogram), and the per-batch series (five float64 numbers per row and batch);
* the gradient moments across batches (``moments``): two float64 values per recorded
  parameter element, for the signal-to-noise ratio; sharded, each rank keeps a
  ``1/world`` part of them. They live where the gradients are: on a GPU run they count
  against the GPU (``transient``), not RAM;
* one batch in and its output (``io``).

While a batch runs (``transient``), on the run's device: what autograd saves of the
forward (every leaf module's output once) and the inputs, as for one capture
(``gradexplorer.capturing.memory_estimate``), plus the parameters' gradients:

* replicated: every trainable parameter's gradient at once (``torch.autograd.grad``);
* sharded over ``world`` ranks (``ShardPlan``): this rank's shards of every parameter
  (``shard_params``, padded as FSDP2 pads them), and ``gathered``: the two largest units
  gathered whole (the block running and the next one fetched ahead), the largest unit's
  gradients, and with the moments, the two buffers of the largest parameter's exchange.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from gradexplorer.capturing.inputs import ModelInputs
from gradexplorer.capturing.memory_estimate import MemoryEstimate, estimate_capture_memory
from gradexplorer.capturing.module_tree import ModuleTree
from gradexplorer.recording.dataset_capture import SERIES_FIELDS
from gradexplorer.recording.shard_blocks import ShardPlan
from gradexplorer.stats.merge import MergeStats

__all__ = ["estimate_dataset_memory"]


def _merge_stats_bytes() -> int:
    s = MergeStats.of_tensor(torch.arange(4.0))
    size = sys.getsizeof(s)
    for value in s.to_dict().values():
        size += sys.getsizeof(value)
        if hasattr(value, "nbytes"):
            size += int(value.nbytes)
    return size


def _series_row_bytes() -> int:
    row = [0.5] * len(SERIES_FIELDS)
    return sys.getsizeof(row) + sum(sys.getsizeof(v) for v in row) + sys.getsizeof({"layer#0:kind": row}) // 2


#: Bytes of one merged statistics row, and of one row's numbers in one batch's series.
MERGE_STATS_BYTES = _merge_stats_bytes()
SERIES_ROW_BYTES = _series_row_bytes()


def estimate_dataset_memory(
    tree: ModuleTree,
    selected: Sequence[str],
    inputs: torch.Tensor | ModelInputs,
    model: nn.Module,
    params: Mapping[str, nn.Parameter],
    *,
    batches: int,
    snr: bool = True,
    plan: ShardPlan | None = None,
    device: str | torch.device = "cpu",
) -> MemoryEstimate:
    """Estimate a dataset capture's memory on one rank (see the module docstring).

    Parameters
    ----------
    tree : ModuleTree
        Probed with a sample of the batches (``tree.probe(model, x)``).
    selected : list of str
        The selected modules.
    inputs : Tensor or ModelInputs
        One batch of the size the capture uses (only its size is read).
    model : nn.Module
        Whole, before any sharding.
    params : mapping
        The parameters whose gradients are recorded (``dataset.recorded_params``).
    batches : int
        Batches in the dataset (the series grows with them).
    snr : bool
        Whether the gradient moments are kept.
    plan : ShardPlan, optional
        How the model will be sharded; None when every rank holds it whole.
    device : str or torch.device
        Where the capture runs: on a GPU the moments live there (``moments_on_device``).

    Returns
    -------
    MemoryEstimate
        ``mode="stats"``; with a plan, ``shard_world``, ``shard_params`` and ``gathered`` set.
    """
    base = estimate_capture_memory(tree, list(selected), "stats", inputs, False, model)
    rows = 3 * base.calls + len(params)
    est = MemoryEstimate(mode="stats", layers=base.layers, calls=base.calls, io=base.io,
                         stats=rows * MERGE_STATS_BYTES + batches * rows * SERIES_ROW_BYTES)
    world = plan.world if plan is not None else 1
    if snr:
        est.moments = sum(16 * -(-p.numel() // world) for p in params.values())
    est.moments_on_device = torch.device(device).type != "cpu"
    on_device = est.moments if est.moments_on_device else 0
    all_grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    if plan is None:
        est.transient = base.transient + on_device
        return est
    largest = sorted(plan.unit_bytes, reverse=True)
    exchange = 2 * max((p.numel() * max(p.element_size(), 4) for p in params.values()), default=0) if snr else 0
    est.shard_world = plan.world
    est.shard_params = plan.shard_bytes
    est.gathered = sum(largest[:2]) + largest[0] + exchange
    est.transient = base.transient - all_grads + est.shard_params + est.gathered + on_device
    return est
