"""Parameters split over ranks: which part of a tensor this rank's statistics count.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``) every parameter and its gradient is a
``DTensor``: each rank holds one shard (rows of dim 0, the last ranks possibly fewer or
none). Tensor parallelism uses the same type with other placements. The watch never
gathers a full tensor: each rank summarises the part it holds, and rank 0 merges those
summaries (``gradexplorer.stats.merge.MergeStats``, exact in float64), so the statistics
are those of the whole, unsharded tensor.

The rule, per placement on each dimension of the device mesh:

* ``Shard(d)``: every rank counts its own shard; the shards partition the tensor.
* ``Replicate()``: every rank holds the same values; only the ranks at coordinate 0 on
  that mesh dimension count them, or they would be counted once per replica.
* ``Partial()``: a reduction is still pending (each rank holds a summand, not a value):
  no statistic of the values can be made from one rank's part. Reported, never guessed.

A plain tensor under ``torch.distributed`` (DDP's replicated parameters) is counted by
rank 0 alone, as before DTensors existed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.sharded_params import fsdp_module_type, is_dtensor

__all__ = ["LocalPart", "fsdp_module_type", "is_dtensor", "local_part", "original_class", "refuse_flat_sharding"]


@dataclass(frozen=True)
class LocalPart:
    """What one rank counts of a tensor.

    Attributes
    ----------
    tensor : Tensor or None
        The local values to summarise (a plain tensor), or None when this rank counts
        nothing of it.
    problem : str or None
        Why nothing can be counted on any rank (a pending reduction), in words.
    """

    tensor: torch.Tensor | None
    problem: str | None = None


def local_part(t: torch.Tensor, rank: int) -> LocalPart:
    """The part of ``t`` this rank's statistics count (see the module docstring).

    Parameters
    ----------
    t : Tensor
        A plain tensor or a DTensor.
    rank : int
        This process's rank in the default group (0 without ``torch.distributed``).
    """
    if not is_dtensor(t):
        return LocalPart(t if rank == 0 else None)
    placements = tuple(t.placements)  # type: ignore[attr-defined]
    if any(p.is_partial() for p in placements):
        return LocalPart(None, f"its values are a DTensor with a pending reduction ({placements}): each rank "
                               "holds a summand, so no rank's part has statistics of its own")
    coordinate = t.device_mesh.get_coordinate()  # type: ignore[attr-defined]
    if coordinate is None:  # this rank is not in the tensor's mesh
        return LocalPart(None)
    for dim, placement in enumerate(placements):
        if placement.is_replicate() and coordinate[dim] != 0:
            return LocalPart(None)
    return LocalPart(t.to_local())  # type: ignore[attr-defined]


def original_class(module: nn.Module) -> type:
    """The class the user's module had: ``fully_shard`` replaces a module's class with a
    subclass named ``FSDP<class>`` that mixes ``FSDPModule`` in; this is the class below it."""
    cls = type(module)
    fsdp = fsdp_module_type()
    if fsdp is not None and isinstance(module, fsdp):
        for base in cls.__bases__:
            if base is not fsdp and issubclass(base, nn.Module):
                return base
    return cls


def refuse_flat_sharding(model: nn.Module) -> None:
    """Refuse a model wrapped with FSDP1 (``FullyShardedDataParallel``).

    FSDP1 flattens each wrapped module's parameters into one buffer and shards that: a
    parameter's gradient on a rank is a slice of the flat buffer that may cut through
    rows, and with ``use_orig_params=False`` the original parameters are gone. FSDP2
    shards each parameter by rows as a DTensor, which the watch merges exactly.

    Raises
    ------
    GradExplorerError
        ``model`` holds a ``FullyShardedDataParallel`` module.
    """
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - torch without distributed
        return
    wrapped = [name or "(model)" for name, m in model.named_modules() if isinstance(m, FullyShardedDataParallel)]
    if wrapped:
        raise GradExplorerError(
            f"{wrapped[0]} is wrapped with FullyShardedDataParallel (FSDP1), whose flat shards cut "
            "parameters at arbitrary offsets, so per-parameter statistics cannot be merged from them;",
            "shard with FSDP2 instead (from torch.distributed.fsdp import fully_shard; fully_shard(block) for "
            "each block, then fully_shard(model)), which the watch merges exactly over the ranks.")
