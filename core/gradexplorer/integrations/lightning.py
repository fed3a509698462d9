"""``WatchCallback``: the watch in Lightning's ``Trainer``, one line in ``callbacks=[...]``.

::

    from gradexplorer.integrations.lightning import WatchCallback
    trainer = Trainer(callbacks=[WatchCallback("run.gxw", every=10)], accumulate_grad_batches=4,
                      gradient_clip_val=1.0, precision="bf16-mixed")

Per optimizer step (``trainer.global_step``; step N in the log is the optimizer step that
took it from N to N + 1), every ``every``-th one, it logs what ``gradexplorer.recording.watch``
logs, with the parameter gradients **the optimizer steps with**: summed over the
``accumulate_grad_batches`` micro-batches, unscaled under ``precision="16-mixed"`` and
clipped by ``gradient_clip_val``. Lightning calls ``on_before_optimizer_step`` before it
clips; the gradients are read instead by a step pre-hook on each optimizer
(``gradexplorer.integrations.trainer_watch``), inside ``optimizer.step()``.

Activations and output gradients come from every micro-batch of the step, merged per
layer and call (the statistics over all the step's samples); the output gradients are
those of Lightning's loss as backward saw it (divided by ``accumulate_grad_batches``) and,
under 16-mixed, divided by the GradScaler's scale. Validation and sanity-check batches are
not recorded. The loss logged is the sum of the step's normalised micro-batch losses
(``outputs["loss"]``): the loss whose gradient the optimizer stepped with.

Under DDP (``strategy="ddp"``) and FSDP2 (``ModelParallelStrategy`` with ``fully_shard`` in
``configure_model``: each parameter's whole gradient, merged from the shards) rank 0 writes,
as the watch does. DeepSpeed and Lightning's FSDP1 ``FSDPStrategy`` are refused in words:
neither leaves in ``.grad`` per parameter what its optimizer steps with. Works with the
``lightning`` package and with ``pytorch_lightning`` (the callback is a ``Callback`` of
whichever are installed).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.selection import LayerSpec
from gradexplorer.integrations.trainer_watch import TrainerWatch
from gradexplorer.recording.watch import Watch

__all__ = ["WatchCallback"]


def _callback_bases() -> tuple[type, ...]:
    """Lightning's ``Callback`` classes, of each import name installed: a Trainer of either
    package accepts the callback (each checks ``isinstance(callback, Callback)``)."""
    bases: list[type] = []
    try:
        from lightning.pytorch import Callback
    except ImportError:
        pass
    else:
        bases.append(Callback)
    try:
        from pytorch_lightning import Callback as LegacyCallback
    except ImportError:
        pass
    else:
        if LegacyCallback not in bases:
            bases.append(LegacyCallback)
    if not bases:
        raise ImportError("gradexplorer.integrations.lightning needs Lightning 2.x, which is not installed: "
                          "pip install lightning (or pytorch-lightning).")
    return tuple(bases)


if TYPE_CHECKING:
    from lightning.pytorch import Callback as _Base
else:
    _Base = type("_Base", _callback_bases(), {})

#: Strategies whose gradients are not the user's ``.grad`` per parameter, and why.
_REFUSED = {
    "DeepSpeedStrategy": (
        ("DeepSpeed keeps the gradients in its own buffers (partitioned under ZeRO, and under ZeRO-3 the "
         "parameters too) and steps its own optimizer, so no parameter's .grad holds what the optimizer steps with"),
        "Watch with strategy='ddp', or shard with FSDP2 (ModelParallelStrategy), which the watch merges exactly."),
    "FSDPStrategy": (
        ("Lightning's FSDPStrategy shards with FSDP1, whose flat shards cut parameters at arbitrary offsets, so "
         "per-parameter statistics cannot be merged from them"),
        "Use ModelParallelStrategy (FSDP2, fully_shard), which the watch merges exactly, or strategy='ddp'."),
}


class WatchCallback(_Base):
    """Watch a Lightning training into a ``.gxw`` log (see the module docstring).

    Parameters
    ----------
    out : path
        The watch log; rank 0 writes it.
    every : int
        Watch optimizer steps 0, every, 2*every, ... (``trainer.global_step``).
    layers : None, str, iterable of str, or callable
        Modules of the LightningModule whose activations and output gradients are recorded
        (``None``: every leaf), as for ``gradexplorer.recording.watch.watch``.
    params, per_rank, grad_norms, tensorboard
        As for ``gradexplorer.recording.watch.watch``: ``tensorboard="tb/"`` also writes
        TensorBoard event files while training.
    """

    def __init__(self, out: str | os.PathLike = "run.gxw", every: int = 1, layers: LayerSpec = None, *,
                 params: bool = True, per_rank: bool = False, grad_norms: bool = True,
                 tensorboard: str | os.PathLike | None = None) -> None:
        super().__init__()
        self._run = TrainerWatch(out, every=every, layers=layers, params=params, per_rank=per_rank,
                                 grad_norms=grad_norms, tensorboard=tensorboard)
        self._global_step = 0

    @property
    def watch(self) -> Watch | None:
        """The ``gradexplorer.recording.watch.Watch`` while training runs (its ``reports``), else None."""
        return self._run.watch

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return  # validate, test and predict train nothing: the callback does nothing there
        for cls in type(trainer.strategy).__mro__:
            if cls.__name__ in _REFUSED:
                problem, fix = _REFUSED[cls.__name__]
                raise GradExplorerError(f"gradexplorer's WatchCallback cannot watch this training: {problem}.", fix)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)  # 16-mixed: output gradients unscaled
        self._global_step = trainer.global_step
        self._run.start(pl_module, trainer.optimizers, step=trainer.global_step, scaler=scaler)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._run.batch_start()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Lightning counts an optimizer step (also one a GradScaler skipped) before this hook.
        stepped = trainer.global_step != self._global_step
        self._global_step = trainer.global_step
        self._run.batch_end(outputs, stepped)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._run.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._run.close(exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._run.close()
