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
* A mesh smaller than the world (FSDP2's data-parallel mesh on a model that is also
  tensor-parallel) has a copy on every other coordinate of the world: ranks holding the
  same coordinate hold the same part, which rank 0 counts once (``LocalPart.coordinate``).

A plain tensor under ``torch.distributed`` (DDP's replicated parameters) is counted by
rank 0 alone, as before DTensors existed.

Module outputs are another matter. Under data parallelism (DDP, FSDP2, HSDP) every rank runs
its own samples, so merging each rank's activation statistics gives those of the whole
batch. Under tensor parallelism (``parallelize_module`` with ``ColwiseParallel``,
``RowwiseParallel``, ...) the ranks run the *same* samples: some outputs are replicated on
every rank (after a row-wise all-reduce), others split over them (a column-wise local
output), and the plain local tensors a hook sees do not say which. A merge would count a
replicated output once per rank (count × world, L2 × √world). :func:`tensor_parallelism`
finds such a model, and the watch then keeps each rank's module rows apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.sharded_params import fsdp_module_type, is_dtensor

__all__ = ["LocalPart", "fsdp_module_type", "is_dtensor", "local_part", "original_class", "refuse_flat_sharding",
           "tensor_parallelism"]


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
    coordinate : tuple of int or None
        For a DTensor's part, this rank's coordinate on the tensor's mesh. A mesh smaller
        than the world repeats over the ranks outside it (FSDP2 over a tensor-parallel
        model shards a parameter that is not parallelized over the data-parallel mesh
        only: each tensor-parallel rank holds a copy of the same shards), so parts of equal
        coordinate on different ranks are the same values, to be counted once.
    """

    tensor: torch.Tensor | None
    problem: str | None = None
    coordinate: tuple[int, ...] | None = None


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
    placements = tuple(t.placements)
    if any(p.is_partial() for p in placements):
        return LocalPart(None, f"its values are a DTensor with a pending reduction ({placements}): each rank "
                               "holds a summand, so no rank's part has statistics of its own")
    coordinate = t.device_mesh.get_coordinate()
    if coordinate is None:  # this rank is not in the tensor's mesh
        return LocalPart(None)
    for dim, placement in enumerate(placements):
        if placement.is_replicate() and coordinate[dim] != 0:
            return LocalPart(None)
    return LocalPart(t.to_local(), coordinate=tuple(coordinate))


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


def _data_parallel_layout(placements: tuple) -> bool:
    """Whether a parameter's placements are those FSDP2 alone gives it: ``(Shard(d),)``
    (``fully_shard``), ``(Replicate(), Shard(d))`` (HSDP) or replicas only. A placement
    beyond these (a ``_StridedShard``, a ``Shard`` on a later mesh dimension, a trailing
    ``Replicate()`` after a shard) is a tensor-parallel dimension of the mesh."""
    from torch.distributed.tensor import Shard

    *leading, last = placements
    return all(p.is_replicate() for p in leading) and (last.is_replicate() or type(last) is Shard)


def tensor_parallelism(model: nn.Module) -> str | None:
    """Why ``model``'s ranks compute on the same samples (tensor parallelism), in words, or
    None for a model that is plain or only data-parallel (DDP, FSDP2, HSDP).

    Three signs, each enough: a module that ``parallelize_module`` (through
    ``distribute_module``) has hooked; a ``DTensor`` parameter that FSDP2 does not manage; a
    parameter FSDP2 manages whose placements hold a dimension beyond FSDP2's own (FSDP2
    over a tensor-parallel model, a 2-D mesh).

    Parameters
    ----------
    model : nn.Module
    """
    fsdp = fsdp_module_type()
    sharded = [name for name, m in model.named_modules() if fsdp is not None and isinstance(m, fsdp)]
    with_fsdp = " (and FSDP2 over the data-parallel dimension)" if sharded else ""
    for name, m in model.named_modules():
        if getattr(m, "_distribute_module_applied", False):
            return (f"module {name or '(model)'} is parallelized over the ranks with torch.distributed.tensor "
                    f"(parallelize_module or distribute_module){with_fsdp}")
    for pname, p in model.named_parameters():
        if not is_dtensor(p):
            continue
        owner = pname.rpartition(".")[0]
        placements = tuple(p.placements)
        if not any(s == "" or owner == s or owner.startswith(s + ".") for s in sharded):
            return f"{pname} is a DTensor ({_placements_text(placements)}) that FSDP2 does not shard"
        if not _data_parallel_layout(placements):
            return (f"{pname} is sharded by FSDP2 over a mesh with a tensor-parallel dimension "
                    f"({_placements_text(placements)})")
    return None


def _placements_text(placements: tuple) -> str:
    return ", ".join(repr(p) for p in placements)
