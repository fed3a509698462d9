"""A dataset capture over a model sharded with FSDP2: the same statistics, no rank holding the model.

``torchrun ... gradexplorer capture --shard fsdp --batch-size N --stats-only`` shards the
model over the ranks (``gradexplorer.recording.shard_blocks``) and runs
:func:`capture_dataset_sharded`. Rank ``r`` takes the batches ``b`` with ``b % world == r``,
as the replicated capture does, and rank 0 merges the ranks' totals
(``gradexplorer.recording.dataset_capture.gather_to_rank0``) into one file equal to the
single-process one up to the order of float64 additions.

Why it is built this way:

* **Every rank runs the same passes.** FSDP2's forward and backward are collectives (each
  block's parameters are all-gathered before it runs), so a rank with no batch left (the
  last round when the batches do not divide by the ranks) runs a padding pass on a batch
  it already has, with every hook's record thrown away.
* **Parameter gradients per batch, whole, never gathered.** During backward each rank
  holds, one block at a time, the whole (unsharded) gradient of its own batch: FSDP2 sets
  the gathered parameters on the modules before a block runs, and autograd accumulates
  into them. A post-accumulate hook on those parameters (put on when the block's forward
  starts) summarises that gradient (``MergeStats``, as the single process does on the
  ``torch.autograd.grad`` of the batch) and drops it, so FSDP2 finds no gradient to
  reduce-scatter and nothing accumulates across batches: the model's ``.grad`` stays None.
* **The gradient signal-to-noise ratio, sharded.** Its element-wise mean and variance
  across batches (``GradientMoments``, twice the parameters in float64 on one process)
  are kept for a part of each parameter's elements on each rank: in the same hook the
  ranks exchange their batch's gradient parts (one ``all_to_all`` per parameter, the
  volume of FSDP2's reduce-scatter), and each rank adds the batches of the round in batch
  order, the very updates the single process makes. Rank 0 adds the ranks' element sums
  (``MomentSums``).
* Activations and output gradients are recorded as in the replicated capture
  (``LayerRecorder``) and merged over ranks; every hook comes off after each pass.
* **A rank that dies** breaks the others' next collective, most often FSDP2's all-gather in
  forward: a collective that fails in forward or backward (``collective_failure``) ends
  the pass with one ``CaptureError`` naming the pass, torch's error and the process
  group's timeout, instead of the advice for a model's own forward errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gradexplorer.base.errors import CaptureError, GradExplorerError
from gradexplorer.capturing.inputs import ModelInputs
from gradexplorer.capturing.selection import LayerSpec, resolve_layers
from gradexplorer.capturing.sharded_params import fsdp_module_type, is_dtensor
from gradexplorer.capturing.targets import parse_target, target_scalar
from gradexplorer.hooks.installed import Hooks, hooks_installed, model_state_preserved
from gradexplorer.recording.collective_failure import collective_failed, is_collective_failure
from gradexplorer.recording.dataset_capture import DatasetProgress, DatasetStats, recorded_params, run_forward, shard
from gradexplorer.recording.layer_recorder import LayerRecorder, RowKey
from gradexplorer.stats.merge import GradientMoments, MergeStats

__all__ = ["capture_dataset_sharded"]

#: ``batch_of(index) -> (inputs, labels or None)``: one batch of the dataset.
BatchLoader = Callable[[int], tuple[torch.Tensor | ModelInputs, torch.Tensor | None]]


def _units(model: nn.Module) -> dict[str, nn.Module]:
    """The modules ``fully_shard`` wrapped, by qualified name (the root is ``""``)."""
    fsdp = fsdp_module_type()
    units: dict[str, nn.Module] = {}
    if fsdp is not None:
        for name, m in model.named_modules():
            if isinstance(m, fsdp):
                units[name] = m
    return units


class _ParamSlot:
    """Where one parameter lives: FSDP2 sets the sharded and the gathered parameter on the
    same module attribute in turn."""

    def __init__(self, name: str, module: nn.Module, attr: str, unit: str) -> None:
        self.name, self.module, self.attr, self.unit = name, module, attr, unit

    def current(self) -> torch.Tensor | None:
        return self.module._parameters.get(self.attr)


class _WholeGradients:
    """The post-accumulate hooks of one pass on the gathered parameters (module docstring).

    Parameters
    ----------
    model : nn.Module
        Sharded with ``fully_shard`` (the root and its blocks).
    recorded : set of str
        The parameters whose gradient statistics are recorded.
    snr : bool
        Keep the element-wise moments of the recorded parameters (exchanged over the ranks).
    rank, world : int
    """

    def __init__(self, model: nn.Module, recorded: set[str], snr: bool, rank: int, world: int) -> None:
        units = _units(model)
        if "" not in units:
            raise GradExplorerError("the model is not sharded with fully_shard (its root is not wrapped);",
                                    "shard it with gradexplorer.recording.shard_blocks.shard_model first.")
        unit_names = sorted(units, key=len, reverse=True)
        self.slots: dict[str, list[_ParamSlot]] = {u: [] for u in units}
        seen: set[int] = set()
        for mname, module in model.named_modules():
            unit = next(u for u in unit_names if u == "" or mname == u or mname.startswith(u + "."))
            for attr, p in module.named_parameters(recurse=False):
                if id(p) in seen or not p.requires_grad:
                    continue
                seen.add(id(p))
                qual = f"{mname}.{attr}" if mname else attr
                self.slots[unit].append(_ParamSlot(qual, module, attr, unit))
        self.units = units
        self.recorded = recorded
        self.snr = snr
        self.rank, self.world = rank, world
        #: Per parameter, the element-wise moments of this rank's part of it.
        self.moments: dict[str, GradientMoments] = {}
        self.rows: dict[RowKey, MergeStats] = {}
        self._real: list[bool] = []
        self._recording = False
        self._hooked: set[int] = set()
        self._fired: set[str] = set()
        self._hooks: Hooks | None = None

    def begin(self, hooks: Hooks, real: list[bool]) -> None:
        """Hook the pass to come; ``real[r]``: whether rank ``r`` runs a batch of the
        dataset in it (else a padding pass)."""
        self._hooks = hooks
        self._real = real
        self._recording = real[self.rank]
        self.rows = {}
        self._hooked = set()
        self._fired = set()
        for unit_name, unit in self.units.items():
            hooks.forward_pre(unit, lambda m, a, _u=unit_name: self._on_unit_forward(_u))

    def _on_unit_forward(self, unit: str) -> None:
        # FSDP2's own pre-forward hook (registered first, with prepend) has gathered the
        # unit's parameters and set them on its modules: those are the leaves autograd
        # accumulates this pass's gradients into.
        assert self._hooks is not None
        for slot in self.slots[unit]:
            p = slot.current()
            if p is None or id(p) in self._hooked or is_dtensor(p) or not p.requires_grad:
                continue
            self._hooked.add(id(p))

            def on_grad(param: torch.Tensor, _name: str = slot.name) -> None:
                self._on_grad(_name, param)

            self._hooks.post_accumulate(p, on_grad)

    @torch.no_grad()
    def _on_grad(self, name: str, param: torch.Tensor) -> None:
        grad = param.grad
        param.grad = None  # FSDP2 then reduces nothing, and nothing accumulates
        if grad is None:
            return
        if name in self._fired:
            raise CaptureError(
                f"the gradient of {name} arrived twice in one backward (reentrant activation checkpointing "
                "runs a backward per checkpointed region);",
                "use torch.utils.checkpoint with use_reentrant=False, or capture without --shard.")
        self._fired.add(name)
        if name not in self.recorded:
            return
        if self._recording:
            self.rows[(name, 0, "grad")] = MergeStats.of_tensor(grad)
        if self.snr:
            self._exchange(name, grad)

    def _exchange(self, name: str, grad: torch.Tensor) -> None:
        """Give every rank its part of each rank's gradient; add the real batches' parts."""
        import torch.distributed as dist

        flat = grad.detach().reshape(-1)
        if flat.dtype in (torch.float16, torch.bfloat16):
            flat = flat.float()  # exact; not every backend reduces half types
        n, world = flat.numel(), self.world
        part = -(-n // world)
        send = torch.zeros(part * world, dtype=flat.dtype, device=flat.device)
        send[:n] = flat
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        pieces = recv.view(world, part)
        lo = self.rank * part
        mine = max(0, min(n, lo + part) - lo)
        moments = self.moments.setdefault(name, GradientMoments())
        for r in range(world):  # rank order is batch order within a round
            if self._real[r]:
                moments.add(pieces[r, :mine])


def _collective(failed: str, error: BaseException) -> CaptureError:
    """A collective of a pass that a dead or stopped rank broke, in one line."""
    said = collective_failed(failed, error, "Nothing was saved.")
    return CaptureError(said.problem, said.fix)


def capture_dataset_sharded(
    model: nn.Module,
    batch_of: BatchLoader,
    total_batches: int,
    *,
    layers: LayerSpec = None,
    target: str = "top1",
    device: str | torch.device | None = None,
    snr: bool = True,
    progress: DatasetProgress | None = None,
) -> DatasetStats:
    """This rank's share of a dataset capture of a model sharded with FSDP2.

    A collective: every rank of the default process group calls it with the same
    arguments. Merge the ranks' totals with ``gradexplorer.recording.dataset_capture.gather_to_rank0``.

    Parameters
    ----------
    model : nn.Module
        Sharded with ``gradexplorer.recording.shard_blocks.shard_model``; run in eval
        mode, its modes put back afterwards, its ``.grad`` left None.
    batch_of : callable
        ``batch_of(index) -> (inputs, labels or None)`` for ``0 <= index < total_batches``.
    total_batches : int
        Batches in the whole dataset (this rank takes every ``world``-th from its rank).
    layers, target, snr
        As ``gradexplorer.recording.dataset_capture.capture_dataset``.
    device : str or torch.device, optional
        Where the inputs go (the shards' device); ``None``: the device of the parameters.
    progress : callable, optional
        ``progress(passes_done, passes, samples_done)`` after each pass of this rank.

    Returns
    -------
    DatasetStats
        This rank's totals: rows and series of its own batches; in ``moment_sums`` its
        part of every recorded parameter's moments over all the batches.

    Raises
    ------
    GradExplorerError
        No process group, a model not sharded, a model without trainable parameters, bad
        layers or target; ``CaptureError`` when forward or backward fails, also when one of
        their collectives fails (a rank that died or stopped: the message names the pass,
        torch's error and the process group's timeout).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise GradExplorerError("a sharded capture needs the ranks of torch.distributed;",
                                "start it with torchrun --nproc-per-node N.")
    rank, world = dist.get_rank(), dist.get_world_size()
    tgt = parse_target(target)
    selected = resolve_layers(model, layers)
    params = recorded_params(model, layers, selected)
    if not any(p.requires_grad for p in model.parameters()):
        raise GradExplorerError("the model has no trainable parameters, so there is nothing to shard;",
                                "capture it without --shard.")
    grads = _WholeGradients(model, set(params), snr, rank, world)
    recorder = LayerRecorder(model, selected)
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    stats = DatasetStats()
    mine = shard(range(total_batches), rank, world)
    rounds = -(-total_batches // world)
    last: tuple[int, Any, Any] | None = None
    with model_state_preserved(model, False):
        for k in range(rounds):
            real = [k * world + r < total_batches for r in range(world)]
            if real[rank]:
                index = k * world + rank
                inputs, labels = batch_of(index)
                last = (index, inputs, labels)
            else:  # a padding pass on a batch this rank already has (or the first one)
                index, inputs, labels = last if last is not None else (0, *batch_of(0))
            x = inputs.to(dev)
            primary = x.primary if isinstance(x, ModelInputs) else x
            if real[rank]:
                recorder.install()
            try:
                with hooks_installed() as hooks:
                    grads.begin(hooks, real)
                    try:
                        output = run_forward(model, x, primary, index)
                    except CaptureError as exc:
                        cause = exc.__cause__
                        if cause is not None and is_collective_failure(cause):
                            raise _collective(f"Rank {rank}'s forward on batch {index} failed in FSDP2's "
                                              "all-gather of a block's parameters", cause) from cause
                        raise
                    scalar = target_scalar(output, tgt, labels)
                    try:
                        scalar.backward()
                    except GradExplorerError:
                        raise
                    except Exception as exc:
                        if is_collective_failure(exc):
                            raise _collective(f"Rank {rank}'s backward on batch {index} failed in a collective "
                                              "(FSDP2's all-gather, or the exchange of a gradient)", exc) from exc
                        raise CaptureError(
                            f"The backward pass failed on batch {index}: {type(exc).__name__}: "
                            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
                            "Look at the other ranks' output for the cause (a rank that died ends the "
                            "collectives of the others after the process group's timeout).") from exc
            finally:
                recorder.remove()
            if real[rank]:
                stats.add_batch(index, len(inputs), {**recorder.rows, **grads.rows}, {}, snr=False)
            recorder.rows = {}
            grads.rows = {}
            del output, scalar, x, primary
            if progress is not None:
                progress(k + 1, rounds, stats.samples)
    assert stats.batches == len(mine)
    stats.moment_sums = {name: m.sums() for name, m in grads.moments.items()}
    return stats
