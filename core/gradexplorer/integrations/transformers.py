"""``WatchCallback``: the watch in the Hugging Face ``Trainer``, one line in ``callbacks=[...]``.

::

    from gradexplorer.integrations.transformers import WatchCallback
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[WatchCallback("run.gxw", every=10)])

Per optimizer step (``state.global_step``; step N in the log is the optimizer step that
took it from N to N + 1), every ``every``-th one, it logs what ``gradexplorer.recording.watch``
logs, with the parameter gradients **the optimizer steps with**: summed over the
``gradient_accumulation_steps`` micro-batches, clipped to ``max_grad_norm``, and unscaled
under ``fp16`` (accelerate's GradScaler). The Trainer unscales and clips before
``on_pre_optimizer_step`` (transformers 5 unscales also without clipping, to log the
norm; a ``GradScaler.step`` of its own would unscale inside ``optimizer.step()``) and
clears ``.grad`` before ``on_step_end``: the gradients are read by a step pre-hook on the
optimizer (``gradexplorer.integrations.trainer_watch``), which sees them whatever the
Trainer's order.

Activations and output gradients come from every micro-batch of the step, merged per
layer and call (the statistics over all the step's samples); the output gradients are
those of the loss as the Trainer's backward saw it (divided by the accumulation steps
unless the model takes ``num_items_in_batch``) and, under fp16, divided by the
GradScaler's scale. Evaluation during training is not recorded. The loss logged is the
step's loss as the model returned it (``outputs.loss``): the mean over the micro-batches,
or their sum where the Trainer passed the model ``num_items_in_batch``; none when the
model returns no loss (a ``compute_loss`` of your own).

Under DDP (``torchrun``) rank 0 writes, as the watch does; FSDP2 (``fsdp_config``
``version: 2``) is merged exactly. DeepSpeed and FSDP1 are refused in words.
"""

from __future__ import annotations

import math
import os
from contextlib import ExitStack
from typing import Any

import torch

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.selection import LayerSpec
from gradexplorer.hooks.installed import hooks_installed
from gradexplorer.integrations.trainer_watch import TrainerWatch, loss_value
from gradexplorer.recording.watch import Watch

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError("gradexplorer.integrations.transformers needs the transformers package, which is not "
                      "installed: pip install transformers accelerate.") from None

__all__ = ["WatchCallback"]


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` (and other wrappers
    that keep it as ``.optimizer``): the one whose ``step()`` updates the parameters."""
    seen = 0
    while not type(optimizer).__module__.startswith("torch.") and isinstance(
            getattr(optimizer, "optimizer", None), torch.optim.Optimizer) and seen < 8:
        optimizer = optimizer.optimizer
        seen += 1
    return optimizer


def _refusal(args: Any) -> tuple[str, str] | None:
    if getattr(args, "deepspeed", None) or getattr(args, "hf_deepspeed_config", None) is not None:
        problem = ("DeepSpeed keeps the gradients in its own buffers (partitioned under ZeRO, and under ZeRO-3 the "
                   "parameters too) and steps its own optimizer, so no parameter's .grad holds what the optimizer "
                   "steps with")
        return problem, ("Watch without deepspeed=..., under DDP (torchrun) or FSDP2 (fsdp_config version 2), which "
                         "the watch merges exactly.")
    fsdp = getattr(args, "fsdp", None)
    config = getattr(args, "fsdp_config", None) or {}
    if fsdp and str(config.get("version", config.get("fsdp_version", 2))) == "1":
        problem = ("FSDP1 (fsdp_config version 1) flattens parameters into shards cut at arbitrary offsets, so "
                   "per-parameter statistics cannot be merged from them")
        return problem, "Set fsdp_config={'version': 2} (FSDP2, fully_shard), which the watch merges exactly."
    return None


class WatchCallback(TrainerCallback):
    """Watch a Hugging Face ``Trainer`` training into a ``.gxw`` log (see the module docstring).

    Parameters
    ----------
    out : path
        The watch log; rank 0 writes it.
    every : int
        Watch optimizer steps 0, every, 2*every, ... (``state.global_step``).
    layers : None, str, iterable of str, or callable
        Modules of the model whose activations and output gradients are recorded
        (``None``: every leaf), as for ``gradexplorer.recording.watch.watch``.
    params, per_rank, grad_norms, tensorboard
        As for ``gradexplorer.recording.watch.watch``: ``tensorboard="tb/"`` also writes
        TensorBoard event files while training.
    """

    def __init__(self, out: str | os.PathLike = "run.gxw", every: int = 1, layers: LayerSpec = None, *,
                 params: bool = True, per_rank: bool = False, grad_norms: bool = True,
                 tensorboard: str | os.PathLike | None = None) -> None:
        self._run = TrainerWatch(out, every=every, layers=layers, params=params, per_rank=per_rank,
                                 grad_norms=grad_norms, tensorboard=tensorboard)
        self._loss_hook = ExitStack()
        self._in_step = False
        self._losses: list[float] = []
        self._summed = False  # the model was given num_items_in_batch: its losses add up

    @property
    def watch(self) -> Watch | None:
        """The ``gradexplorer.recording.watch.Watch`` while training runs (its ``reports``), else None."""
        return self._run.watch

    def _refuse(self, args: Any) -> None:
        refused = _refusal(args)
        if refused is not None:
            problem, fix = refused
            raise GradExplorerError(f"gradexplorer's WatchCallback cannot watch this training: {problem}.", fix)

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._refuse(args)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        self._refuse(args)
        if model is None or optimizer is None:
            raise GradExplorerError("The Trainer gave the callback no model or optimizer at the start of training.",
                                    "Use WatchCallback with transformers' Trainer (or a subclass that keeps them).")
        self.close()
        scaler = getattr(optimizer, "scaler", None)  # accelerate's GradScaler under fp16
        self._run.start(model, [_torch_optimizer(optimizer)], step=state.global_step, scaler=scaler)
        hooks = self._loss_hook.enter_context(hooks_installed())
        hooks.forward(model, self._on_model_output, with_kwargs=True)

    def _on_model_output(self, module: Any, args: Any, kwargs: dict, output: Any) -> None:
        watch = self._run.watch
        if not self._in_step or watch is None or not watch.watching:
            return  # an evaluation between steps, or an unwatched step: the loss is not read (no GPU wait)
        loss = loss_value(output)
        if loss is not None:
            self._losses.append(loss)
            self._summed = self._summed or kwargs.get("num_items_in_batch") is not None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._in_step = True
        self._run.batch_start()

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # A micro-batch ended without an optimizer step: the next one's calls are merged with it.
        self._run.batch_end(None, stepped=False)
        self._run.batch_start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._in_step = False
        losses, self._losses = self._losses, []
        loss = None
        if losses:
            loss = math.fsum(losses) if self._summed else math.fsum(losses) / len(losses)
        self._summed = False
        self._run.batch_end(loss, stepped=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def close(self) -> None:
        """Take every hook off and close the log. The Trainer calls no callback when training
        raises: call it then, in your ``except`` or ``finally``."""
        self._loss_hook.close()
        self._run.close()
        self._in_step = False
        self._losses = []
        self._summed = False
