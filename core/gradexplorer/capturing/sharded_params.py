"""Models whose parameters are split over ranks: ``DTensor`` parameters (FSDP2's
``fully_shard``, tensor parallelism).

One capture takes parameter gradients with ``torch.autograd.grad`` on the model's
parameters. On a model sharded with FSDP2 those parameters are the shards, which the
forward never uses (FSDP2 gathers each block into other tensors and sets those on the
modules while the block runs), so the gradients would silently all be missing. Such a
model is refused in words (:func:`refuse_sharded_params`); the watch
(``gradexplorer.recording.watch``) and the sharded dataset capture
(``gradexplorer.recording.sharded_dataset``) handle it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeGuard

from torch import nn

if TYPE_CHECKING:  # imported for the types only: see _dtensor_type
    from torch.distributed.tensor import DTensor

from gradexplorer.base.errors import GradExplorerError

__all__ = ["fsdp_module_type", "is_dtensor", "refuse_sharded_params"]


def _dtensor_type() -> type | None:
    # A DTensor exists only once torch.distributed.tensor is loaded, so it is looked up
    # there and never imported: the import pulls in torch.fx's symbolic shapes and sympy
    # (time and memory: docs/benchmarks.md, "Start-up") for every capture of a model that
    # nobody sharded.
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def is_dtensor(t: Any) -> TypeGuard[DTensor]:
    """Whether ``t`` is a ``torch.distributed.tensor.DTensor``."""
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def fsdp_module_type() -> type[Any] | None:
    """FSDP2's ``FSDPModule`` (the class ``fully_shard`` mixes into each module it wraps),
    or None in a torch without it."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch < 2.6 kept it private
        try:
            from torch.distributed._composable.fsdp import FSDPModule
        except ImportError:  # pragma: no cover - torch without distributed
            return None
    return FSDPModule


def refuse_sharded_params(model: nn.Module, what: str, fix: str,
                          modules: Iterable[nn.Module] | None = None) -> None:
    """Refuse a model with ``DTensor`` parameters (see the module docstring).

    Parameters
    ----------
    model : nn.Module
    what : str
        The run refused, in words ("a capture", "a dataset capture").
    fix : str
        What to do instead.
    modules : iterable of nn.Module, optional
        ``model.modules()``, when the caller knows them without a walk
        (``gradexplorer.capturing.structure``).

    Raises
    ------
    GradExplorerError
        A parameter of ``model`` is a ``DTensor``.
    """
    cls = _dtensor_type()
    if cls is None:  # no DTensor can exist in this process
        return
    # The modules' own parameter dictionaries first (no generators: every capture asks).
    if not any(isinstance(p, cls) for m in (model.modules() if modules is None else modules)
               for p in m._parameters.values()):
        return
    name = next((n for n, p in model.named_parameters() if is_dtensor(p)), None)
    if name is None:
        return
    fsdp = fsdp_module_type()
    how = ("sharded with FSDP2 (fully_shard)" if fsdp is not None and any(isinstance(m, fsdp) for m in model.modules())
           else "a DTensor (tensor parallelism)")
    raise GradExplorerError(
        f"the model's parameters are split over ranks ({name} is {how}): {what} takes gradients with "
        "torch.autograd.grad on the parameters, which the sharded forward never uses, so it would record none;",
        fix)
