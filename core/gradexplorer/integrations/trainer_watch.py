"""The watch driven by a trainer's events: what the Lightning and Hugging Face callbacks share.

A trainer owns the loop, so the callbacks cannot call ``w.step()`` after ``opt.step()``
themselves, and the moment a trainer's callbacks see is not the moment the optimizer
steps: Lightning calls ``on_before_optimizer_step`` before it clips the gradients (and
after its GradScaler unscaled them), the Hugging Face ``Trainer`` clears ``.grad`` before
``on_step_end``. What the optimizer steps with is seen by an optimizer step pre-hook
(``optimizer.register_step_pre_hook``), which runs inside ``optimizer.step()``, after every
unscaling and clipping, also inside ``GradScaler.step`` — except where the trainer hands
the optimizer a closure (Lightning without a GradScaler: ``optimizer.step(closure)``, whose
closure runs the last micro-batch's backward and the clipping inside the step, after the
pre-hooks); there the pre-hook wraps the closure and reads the gradients when it returns.
So :class:`TrainerWatch`:

* at the start of training opens a ``gradexplorer.recording.watch.Watch`` on the model
  (after the trainer set up torch.distributed, so that rank 0 writes) with its steps
  numbered as the trainer's optimizer steps, and puts a step pre-hook on each optimizer
  (``gradexplorer.hooks.hooks_installed``), which calls ``Watch.record_gradients`` with the
  parameters that optimizer steps, before the update;
* has the watch's module hooks on only during training batches (``batch_start`` and
  ``batch_end``: ``Watch.resume`` and ``Watch.pause``), so that a validation or evaluation
  between batches is not recorded; under gradient accumulation the micro-batches of one
  optimizer step are merged into its rows (``Watch.pause``);
* ends the watched step when the trainer says the optimizer stepped (``Watch.step``), with
  the loss the step's gradient is of; a step whose ``optimizer.step()`` did not run (an AMP
  GradScaler skips a step whose gradients hold NaN or Inf) is reported in the log.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from gradexplorer.capturing.selection import LayerSpec
from gradexplorer.hooks.installed import hooks_installed
from gradexplorer.recording.watch import Watch, check_watch_outputs


def loss_value(loss: Any) -> float | None:
    """A float from what a trainer or model gives as its loss (a tensor, a number, or a
    dict or output object with a ``loss``); ``None`` when there is none."""
    if isinstance(loss, dict) or hasattr(loss, "keys"):
        loss = loss.get("loss") if hasattr(loss, "get") else None
    elif loss is not None and not isinstance(loss, (torch.Tensor, int, float)):
        loss = getattr(loss, "loss", None)
    if isinstance(loss, torch.Tensor):
        if loss.numel() == 0:
            return None
        return float(loss.detach().float().mean())
    if isinstance(loss, (int, float)):
        return float(loss)
    return None


class TrainerWatch:
    """A watch whose steps are a trainer's optimizer steps (module docstring).

    Parameters are those of ``gradexplorer.recording.watch.watch``.
    """

    def __init__(self, out: str | os.PathLike, *, every: int, layers: LayerSpec, params: bool, per_rank: bool,
                 grad_norms: bool, tensorboard: str | os.PathLike | None) -> None:
        check_watch_outputs(out, tensorboard)  # when the callback is made, not at the first watched step
        self.out = os.fspath(out)
        self.every, self.layers, self.params, self.per_rank = every, layers, params, per_rank
        self.grad_norms, self.tensorboard = grad_norms, tensorboard
        self.watch: Watch | None = None
        self._hooks = ExitStack()
        self._optimizer_stepped = False
        self._losses: list[float] = []

    def start(self, model: nn.Module, optimizers: Iterable[torch.optim.Optimizer], *, step: int = 0,
              scaler: Any = None) -> None:
        """Open the watch on ``model``; its first step is the trainer's optimizer step ``step``."""
        self.close()
        watch = Watch(model, self.out, every=self.every, layers=self.layers, params=self.params,
                      per_rank=self.per_rank, scaler=scaler, grad_norms=self.grad_norms, tensorboard=self.tensorboard)
        watch.step_index = step
        watch.__enter__()
        self.watch = watch
        try:
            watch.pause()  # the hooks go on with the first training batch
            hooks = self._hooks.enter_context(hooks_installed())
            for optimizer in optimizers:
                hooks.optimizer_step_pre(optimizer, self._on_optimizer_step)
        except BaseException:
            self.close()
            raise

    def _on_optimizer_step(self, optimizer: torch.optim.Optimizer, args: tuple,
                           kwargs: dict) -> tuple[tuple, dict] | None:
        # torch hands the hook step()'s own arguments: (optimizer, closure, ...) and kwargs.
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is None:
            self._record(optimizer)
            return None
        # ``optimizer.step(closure)`` (Lightning without a GradScaler) runs the backward and
        # the clipping inside the step, after this pre-hook: read when the closure returns.
        def recorded(*a: Any, **k: Any) -> Any:
            result = closure(*a, **k)
            self._record(optimizer)
            return result

        if "closure" in kwargs:
            return args, {**kwargs, "closure": recorded}
        return (args[0], recorded, *args[2:]), kwargs

    def _record(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer_stepped = True
        if self.watch is not None:
            self.watch.record_gradients(p for group in optimizer.param_groups for p in group["params"])

    def batch_start(self) -> None:
        """A training batch (or micro-batch) begins: the hooks go on when its step is watched."""
        if self.watch is not None:
            self.watch.resume()

    def batch_end(self, loss: Any, stepped: bool) -> None:
        """A training batch ended; ``stepped`` when the trainer's optimizer step came with it.

        Parameters
        ----------
        loss : tensor, number, dict or output with a ``loss``, or None
            This batch's part of the step's loss (the losses of one step's batches add up);
            read (on a GPU, waited for) only in watched steps.
        stepped : bool
            The trainer counted an optimizer step: the watched step ends.
        """
        watch = self.watch
        if watch is None:
            return
        watch.pause()
        value = loss_value(loss) if watch.watching else None
        if value is not None:
            self._losses.append(value)
        if not stepped:
            return
        if watch.watching and not self._optimizer_stepped:
            watch.report("(optimizer)", (
                "optimizer.step() did not run in this step (an AMP GradScaler skips a step whose gradients hold "
                "NaN or Inf): the parameter gradients logged are what .grad held when the trainer ended the step, "
                "if anything"))
        step_loss = math.fsum(self._losses) if self._losses else None
        self._losses = []
        self._optimizer_stepped = False
        watch.step(loss=step_loss)
        watch.pause()

    def close(self, exc: BaseException | None = None) -> None:
        """Take every hook off and close the log (a step not ended is dropped)."""
        self._hooks.close()
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.__exit__(type(exc) if exc is not None else None, exc, None)
        self._losses = []
        self._optimizer_stepped = False
