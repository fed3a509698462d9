"""A model sharded over the ranks with FSDP2, one ``fully_shard`` per block.

``gradexplorer capture --shard fsdp`` (under ``torchrun``) does not hold the whole model on
any rank: each block's parameters are split by rows over the ranks (``DTensor`` shards),
gathered for that block's forward and backward only, and freed again. Which modules are
the blocks decides how much is whole at once: the largest block's parameters (and the
next one's, gathered ahead) besides every block's shard.

The default rule (:func:`default_blocks`), from the root down:

1. **Repeated blocks.** The first ``nn.ModuleList`` or ``nn.Sequential`` met on each path
   whose children include at least two modules of one class that hold parameters gives
   its children that hold parameters as blocks, and the search stops there (a block's
   insides are not blocks again): torchvision ResNet's ``layer1.0`` ... ``layer4.1``, its
   ViT's ``encoder.layers.encoder_layer_0`` ..., Hugging Face's ``transformer.h.0`` ... or
   ``model.layers.0`` ..., timm's ``blocks.0`` ..., each ``Linear`` of a plain
   ``nn.Sequential`` of linear layers.
2. **Otherwise** the root's children that hold parameters.

The root is always wrapped last: it holds every parameter outside the blocks (embeddings,
the head, norms between blocks). ``blocks=`` (``--shard-blocks``) names the blocks
instead: names or glob patterns as ``--layers`` takes them, a module inside another chosen
one being part of it (``'layer*.*'`` chooses ``layer1.0`` but not ``layer1.0.conv1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.selection import resolve_layers
from gradexplorer.capturing.sharded_params import fsdp_module_type
from gradexplorer.recording.sharded import refuse_flat_sharding

__all__ = ["ShardPlan", "choose_blocks", "default_blocks", "local_param_bytes", "shard_model", "shard_rows"]


def _holds_params(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _repeated(container: nn.Module) -> bool:
    """Whether ``container`` is a list of blocks: two children of one class hold parameters."""
    if not isinstance(container, (nn.ModuleList, nn.Sequential)):
        return False
    seen: set[type] = set()
    for child in container.children():
        if not _holds_params(child):
            continue
        if type(child) in seen:
            return True
        seen.add(type(child))
    return False


def default_blocks(model: nn.Module) -> list[str]:
    """The blocks of ``model`` by the module docstring's rule, as qualified names in
    registration order (never the root, ``""``)."""
    blocks: list[str] = []

    def visit(prefix: str, module: nn.Module) -> None:
        if _repeated(module):
            blocks.extend(f"{prefix}{name}" for name, child in module.named_children() if _holds_params(child))
            return
        for name, child in module.named_children():
            visit(f"{prefix}{name}.", child)

    visit("", model)
    if not blocks:
        blocks = [name for name, child in model.named_children() if _holds_params(child)]
    return blocks


def choose_blocks(model: nn.Module, patterns: Sequence[str] | None = None) -> list[str]:
    """The blocks to shard: :func:`default_blocks`, or the outermost modules that
    ``patterns`` name or match (``gradexplorer.capturing.selection``'s names and globs).

    Raises
    ------
    GradExplorerError
        A pattern matches no module (with near names).
    """
    if not patterns:
        return default_blocks(model)
    chosen = [n for n in resolve_layers(model, list(patterns)) if n]
    outer: list[str] = []
    for name in chosen:
        if not any(name.startswith(o + ".") for o in outer):
            outer.append(name)
    return outer


def shard_rows(rows: int, world: int) -> int:
    """Rows of dim 0 that each rank allocates for a parameter of ``rows`` rows: FSDP2 cuts
    dim 0 as ``torch.chunk`` does and pads every rank's shard to the first chunk's size."""
    return -(-rows // world) if rows else 0


@dataclass(frozen=True)
class ShardPlan:
    """What sharding a model over ``world`` ranks with ``blocks`` leaves on each rank.

    Attributes
    ----------
    world : int
    blocks : list of str
        The blocks, each wrapped with ``fully_shard`` (then the root).
    shard_bytes : int
        Bytes of every parameter's shard on one rank (rank 0's: the largest, padded as FSDP2 pads).
    unit_bytes : list of int
        Whole (gathered) parameter bytes of each unit: the blocks', then the root's own.
    """

    world: int
    blocks: list[str]
    shard_bytes: int
    unit_bytes: list[int]

    @classmethod
    def of(cls, model: nn.Module, blocks: Sequence[str], world: int) -> ShardPlan:
        """The plan of ``model`` before it is sharded (its parameters still whole)."""
        unit_of: dict[int, int] = {}
        units = list(blocks)
        for i, name in enumerate(units):
            for p in model.get_submodule(name).parameters():
                unit_of.setdefault(id(p), i)
        unit_bytes = [0] * (len(units) + 1)
        shard = 0
        seen: set[int] = set()
        for p in model.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            size = p.numel() * p.element_size()
            unit_bytes[unit_of.get(id(p), len(units))] += size
            rows = p.shape[0] if p.dim() else 1
            shard += shard_rows(rows, world) * (size // rows if rows else 0)
        return cls(world, list(blocks), shard, unit_bytes)


def local_param_bytes(model: nn.Module) -> int:
    """Bytes of parameter storage this rank holds (a sharded parameter's local shard,
    with FSDP2's padding; a plain parameter whole)."""
    total = 0
    seen: set[int] = set()
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        storage = local.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def shard_model(model: nn.Module, blocks: Sequence[str], device: torch.device) -> None:
    """Shard ``model`` in place over the default process group with FSDP2: ``fully_shard``
    on each block, innermost first, then on the root (a 1-D device mesh of every rank).

    Parameters
    ----------
    model : nn.Module
        Whole on every rank (the same weights: each rank keeps its rows of them).
    blocks : list of str
        Qualified names (:func:`choose_blocks`).
    device : torch.device
        Where the shards live (``cpu`` with gloo, ``cuda:LOCAL_RANK`` with NCCL).

    Raises
    ------
    GradExplorerError
        No process group, a torch without FSDP2, a model already sharded, or
        ``fully_shard`` refused a block (its message, and how to choose others).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise GradExplorerError("sharding a model needs the ranks of torch.distributed;",
                                "start the command with torchrun --nproc-per-node N.")
    refuse_flat_sharding(model)
    fsdp = fsdp_module_type()
    if fsdp is None:  # pragma: no cover - torch < 2.4
        raise GradExplorerError(f"this torch ({torch.__version__}) has no FSDP2 (fully_shard);",
                                "install torch 2.6 or later.")
    if any(isinstance(m, fsdp) for m in model.modules()):
        raise GradExplorerError("the model is already sharded with fully_shard;",
                                "give the model whole: the capture shards it.")
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # pragma: no cover - torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    order = sorted(blocks, key=lambda n: n.count("."), reverse=True)  # children before parents
    for name in [*order, ""]:
        module = model.get_submodule(name)
        try:
            fully_shard(module, mesh=mesh)
        except Exception as exc:  # FSDP2's own refusals (shared parameters, types)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise GradExplorerError(
                f"fully_shard refused {name or 'the model'} ({type(exc).__name__}: {first[:300]});",
                "choose other blocks with --shard-blocks (a block must hold all the parameters it shares "
                "with others), or leave out --shard.") from exc
