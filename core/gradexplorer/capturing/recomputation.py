"""Activation checkpointing (``torch.utils.checkpoint``, Hugging Face's
``gradient_checkpointing_enable``) seen from module hooks.

With ``use_reentrant=False`` a checkpointed region's forward runs again inside backward to
recompute what it did not save: every module in it is called a second time, with grad
enabled. Those calls are not the model's: :func:`recomputing` tells them apart (autograd
is executing a graph task), and capture does not count them. The tensor hooks of the first
calls still receive the gradients, since the graph is the first forward's.

With ``use_reentrant=True`` the region runs under ``no_grad`` in forward and is
differentiated by a nested ``backward()``, which ``torch.autograd.grad`` cannot drive: the
region's layers would have no gradients (or backward fails). :func:`reentrant_checkpoint`
recognises such a call so that it is refused in words.
"""

from __future__ import annotations

import sys
from types import FrameType

import torch

from gradexplorer.base.errors import GradExplorerError

__all__ = ["recomputing", "reentrant_checkpoint", "reentrant_refusal"]

# Frames looked at above a no-grad module call for checkpoint's forward.
_MAX_DEPTH = 64


def recomputing() -> bool:
    """Whether the module call now running is a recomputation inside backward."""
    return torch._C._current_graph_task_id() != -1


def reentrant_checkpoint() -> bool:
    """Whether the module call now running is inside ``torch.utils.checkpoint``'s
    reentrant forward (``use_reentrant=True``). Cheap unless grad is disabled: only then
    are the caller's frames looked at."""
    if torch.is_grad_enabled():
        return False
    target = _reentrant_forward_code()
    if target is None:
        return False
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_MAX_DEPTH):
        if frame is None:
            return False
        if frame.f_code is target:
            return True
        frame = frame.f_back
    return False


def reentrant_refusal(module_name: str) -> GradExplorerError:
    """The refusal of a model that checkpoints with ``use_reentrant=True``."""
    return GradExplorerError(
        f"The model runs torch.utils.checkpoint with use_reentrant=True (module '{module_name}'): "
        "that region runs without gradients in forward and is differentiated by a nested "
        "backward() that torch.autograd.grad cannot follow, so its layers would get no gradients.",
        "Checkpoint with use_reentrant=False (Hugging Face: model.gradient_checkpointing_enable("
        "gradient_checkpointing_kwargs={'use_reentrant': False})), or turn checkpointing off "
        "while inspecting (model.gradient_checkpointing_disable()).",
    )


def _reentrant_forward_code() -> object | None:
    function = getattr(torch.utils.checkpoint, "CheckpointFunction", None)
    forward = getattr(function, "forward", None)
    return getattr(forward, "__code__", None)
