"""Watch a model inside the user's own training loop, every N steps, into a watch log.

::

    from gradexplorer.recording.watch import watch
    with watch(model, out="run.gxw", every=10, layers="layer4.*") as w:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            w.step(loss=loss)

What it does, and why it is built this way:

* Hooks exist only during watched steps. ``w.step()`` ends a step; when the *next* step is
  watched, hooks go on right away, before its forward; the ``step()`` that ends it takes
  them all off. Unwatched steps run the user's model with no hook at all.
* Statistics only (``gradexplorer.stats.merge.MergeStats``: moments, counts and a fixed-bin
  histogram), computed inside the hooks, so nothing of the graph is kept alive.
* The user's training is left as it is: the hooks return nothing (the gradients flowing
  through are not changed), ``.grad``, the optimizer and an AMP ``GradScaler`` are only
  read. Parameter gradients are read from ``.grad`` at ``w.step()``: after
  ``scaler.step(opt)`` they are unscaled. The output gradients seen by the tensor hooks are
  scaled by the GradScaler's factor: pass ``scaler=`` and they are divided by it.
* Modules under ``torch.compile`` are not hooked: hooks added after compiling never fire
  or, depending on the backend, make dynamo recompile at every watched step, changing the
  user's speed. Each one is reported in the log's ``reports`` table and in ``w.reports``,
  and a selected layer that ran no call during a watched step is reported too.
* Per watched step: each selected module's activation and output gradient per call (and
  the distribution of per-sample gradient norms), each selected parameter's gradient and
  weight statistics and its update ratio |Δw|/|w| (weights copied when the step's hooks go
  on, compared at ``step()``), and the loss.
* Under ``torch.distributed`` (DDP), rank 0 writes: module statistics merged over ranks
  (rank -1 in the log), or every rank's own rows when ``per_rank=True``. Parameter
  gradients are the same on every rank after DDP's all-reduce: rank 0's are logged.
  Under FSDP2 each rank summarises its shard of every parameter and rank 0 merges them:
  the statistics of the whole tensor, never gathered (``gradexplorer.recording.sharded``).
* Under tensor parallelism (``parallelize_module``; also FSDP2 over a tensor-parallel model)
  the ranks run the same samples, and a module's local output may be a replica or a shard,
  which the hooks cannot tell apart: merging would count replicas once per rank. The
  activation, output-gradient and per-sample-norm rows are then each rank's own
  (``rank = r``), parameter rows still merged (``rank = -1``); the log's ``meta`` says so
  (``module_rows``, ``tensor_parallel``), and so do one report and one logged warning.
* Trainers that own the loop (``gradexplorer.integrations``) use three more calls:
  ``record_gradients()`` reads the parameter gradients when the optimizer is about to
  step (after the trainer's unscaling and clipping, from an optimizer step pre-hook),
  and ``step()`` logs those instead of reading ``.grad`` again; ``pause()`` and
  ``resume()`` take the hooks off between training batches (validation, evaluation) and
  put them back, the statistics recorded so far in the step kept and merged with what
  follows (under gradient accumulation, every micro-batch of the optimizer step).
* A rank that dies breaks the others' next collective. When that is the watch's gather,
  the watch raises its own message (the step, the process group's timeout); when it is
  the training's own (FSDP2's all-gather in the user's forward, DDP's all-reduce), torch's
  error goes on unchanged with a note from the watch (``collective_failure``). Either way
  the log holds every watched step before it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.file_write import check_outside_model_caches
from gradexplorer.capturing.selection import LayerSpec, resolve_layers
from gradexplorer.recording.collective_failure import collective_failed, group_timeout, is_collective_failure
from gradexplorer.recording.layer_recorder import LayerRecorder, RowKey
from gradexplorer.recording.sharded import local_part, refuse_flat_sharding, tensor_parallelism
from gradexplorer.recording.tensorboard import TensorBoardStream
from gradexplorer.recording.watch_log import MODULE_KINDS, WatchLogWriter, stats_rows
from gradexplorer.stats.merge import MergeStats
from gradexplorer.stats.merge_cpu import distances

log = logging.getLogger(__name__)

#: A parameter's gradient as read: its statistics, where its part sits on the mesh, why not recorded.
_GradientRow = tuple[MergeStats | None, tuple[int, ...] | None, str | None]


def _compiled_modules(model: nn.Module) -> list[str]:
    """Qualified names of the modules wrapped by ``torch.compile`` (the root is ``""``)."""
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:  # pragma: no cover - torch without dynamo
        return []
    return [name for name, m in model.named_modules() if isinstance(m, OptimizedModule)]


def _dist_info() -> tuple[int, int]:
    """(rank, world size) of the default process group, (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _loss_value(loss: Any) -> float | None:
    if loss is None:
        return None
    if isinstance(loss, torch.Tensor):
        return float(loss.detach().float().mean())
    return float(loss)


def check_watch_outputs(out: str | os.PathLike, tensorboard: str | os.PathLike | None = None) -> None:
    """Refuse, as a watch is made, a log or a TensorBoard folder inside a model cache
    (``gradexplorer.base.file_write.check_outside_model_caches``): a training would otherwise
    run until its first watched step to be told. Only the paths are read, so the check holds
    on every rank and before torch.distributed is set up (a trainer's callback is made before
    its training starts); the log's other checks come when rank 0 opens it
    (``gradexplorer.recording.watch_log.WatchLogWriter``).

    Raises
    ------
    GradExplorerError
        With the cache named and the fix.
    """
    check_outside_model_caches(out)
    if tensorboard is not None:
        check_outside_model_caches(tensorboard)


class Watch:
    """A watch on one model; use :func:`watch` to make one (see the module docstring)."""

    def __init__(self, model: nn.Module, out: str, *, every: int = 10, layers: LayerSpec = None,
                 params: bool = True, per_rank: bool = False, scaler: Any = None,
                 grad_norms: bool = True, tensorboard: str | os.PathLike | None = None) -> None:
        if not isinstance(every, int) or every < 1:
            raise GradExplorerError(f"every={every!r} is not a positive whole number of steps.",
                                    "Pass every=1 to watch every step, every=10 for one step in ten.")
        refuse_flat_sharding(model)
        check_watch_outputs(out, tensorboard)
        self.model = model
        self.out = out
        self.every = every
        self.per_rank = per_rank
        self.scaler = scaler
        self.grad_norms = grad_norms
        self.rank, self.world = _dist_info()
        # Ranks that run the same samples (tensor parallelism): module rows are kept per rank.
        self.tensor_parallel = tensor_parallelism(model) if self.world > 1 else None
        self.layers = resolve_layers(model, layers)
        self.modules = dict(model.named_modules())
        self.params = self._select_params(layers) if params else {}
        self.step_index = 0
        self.reports: list[tuple[int | None, str, str]] = []
        self._recorder: LayerRecorder | None = None
        self._weights_before: dict[str, torch.Tensor] = {}
        self._weights_valid = False
        self._started = 0.0
        self._writer: WatchLogWriter | None = None
        self._open = False
        self.tensorboard = None if tensorboard is None else os.fspath(tensorboard)
        self._board: TensorBoardStream | None = None
        self._hooked = False  # the recorder's hooks are on
        # What the step recorded before a pause (``pause``), merged with what follows.
        self._kept: dict[RowKey, MergeStats] = {}
        self._kept_called: set[str] = set()
        self._kept_unrecorded: dict[tuple[str, str], str] = {}
        # Parameter gradients read when the optimizer was about to step (``record_gradients``).
        self._grads: dict[str, _GradientRow] = {}

    def _select_params(self, layers: LayerSpec) -> dict[str, nn.Parameter]:
        if layers is None:
            return {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        chosen: dict[str, nn.Parameter] = {}
        for name in self.layers:
            for pname, p in self.modules[name].named_parameters(prefix=name):
                if p.requires_grad:
                    chosen[pname] = p
        return chosen

    # -- lifetime -----------------------------------------------------------------------
    def __enter__(self) -> Watch:
        if self.rank == 0:
            # The class of each watched module and of each module owning a watched parameter:
            # the timeline names its rows with them ("3 Conv2d", not "3").
            owners = {name.rpartition(".")[0] for name in self.params}
            types = {name: type(self.modules[name]).__name__
                     for name in (*self.layers, *sorted(owners)) if name in self.modules}
            meta = {
                "every": self.every, "layers": self.layers, "params": list(self.params),
                "layer_types": types,
                "model": type(self.model).__name__, "world_size": self.world,
                "per_rank": self.per_rank, "hist_bins": "signed log2 magnitude (gradexplorer.stats.merge)",
            }
            # JSON text, as the log's other meta values (the writer stores a str as it is).
            if self.world > 1:
                meta["module_rows"] = json.dumps("per_rank" if self.per_rank or self.tensor_parallel else "merged")
            if self.tensor_parallel:
                meta["tensor_parallel"] = json.dumps(self.tensor_parallel)
            self._writer = WatchLogWriter(self.out, meta=meta)
            if self.tensorboard is not None:
                try:
                    self._board = TensorBoardStream(self.tensorboard)
                except BaseException:
                    self._writer.close()
                    self._writer = None
                    raise
        self._open = True
        if self.tensor_parallel and self.rank == 0:
            message = (f"tensor parallelism: {self.tensor_parallel}. Its ranks run the same samples, and a "
                       "module's local output may be replicated on every rank or a shard of the whole, which "
                       "the hooks cannot tell apart, so activation, output-gradient and per-sample-norm rows "
                       "are each rank's own (rank = 0, 1, ...), not merged (a merge would count a replicated "
                       "output once per rank). Parameter rows are merged over the ranks (rank = -1): the "
                       "whole tensors'.")
            log.warning("gradexplorer watch: %s", message)
            self._report(None, "(model)", message)
        compiled = _compiled_modules(self.model)
        for name in compiled:
            self._report(None, name or "(model)",
                         "compiled with torch.compile: its layers' activations and output gradients are "
                         "not recorded (its parameters still are). Hooks inside compiled code either never "
                         "fire or force recompiles, which would change your training's speed. Watch the "
                         "model before compiling it, or compile only the parts you do not watch.")
        skip = {n for n in self.layers if any(n == c or n.startswith(c + ".") or c == "" for c in compiled)}
        scale = None
        if self.scaler is not None:
            scaler = self.scaler
            scale = lambda: scaler.get_scale() if scaler.is_enabled() else 1.0  # noqa: E731
        self._recorder = LayerRecorder(self.model, [n for n in self.layers if n not in skip],
                                       grad_norms=self.grad_norms, grad_scale=scale)
        self._begin_if_watched()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        step = self.step_index
        self.close()
        # A rank that died breaks the others' next collective, most often FSDP2's all-gather
        # in the user's own forward: torch's error goes on as it is, with what the log kept.
        if (exc is not None and self.world > 1 and not isinstance(exc, GradExplorerError)
                and is_collective_failure(exc)):
            note = (
                f"gradexplorer watch: rank {self.rank} stopped in a collective of step {step} (under FSDP2, "
                f"its all-gather in forward or reduce-scatter in backward): a rank has likely died or stopped. "
                f"Collectives give up after the process group's timeout, here {group_timeout()} "
                f"(init_process_group(timeout=...)). The watch log, written by rank 0, holds every watched "
                f"step before step {step}.")
            add_note = getattr(exc, "add_note", None)  # Python 3.11+: printed under torch's traceback
            if add_note is not None:
                add_note(note)
            else:
                log.error("%s", note)

    def close(self) -> None:
        """Remove every hook and close the log (a step not ended by ``step()`` is dropped)."""
        if self._recorder is not None:
            self._recorder.remove()
            self._recorder.rows = {}
        self._hooked = False
        self._forget_step()
        self._weights_before.clear()
        self._weights_valid = False
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._board is not None:
            self._board.close()
            self._board = None
        self._open = False

    @property
    def watching(self) -> bool:
        """Whether the current step is a watched one (hooks are on)."""
        return self.step_index % self.every == 0

    # -- hooks ------------------------------------------------------------------------------
    def _begin_if_watched(self) -> None:
        if not self.watching or self._recorder is None:
            return
        self._started = time.time()
        with torch.no_grad():
            # The buffers stay between watched steps: copying into them costs a third of
            # cloning fresh memory every time (the pages are already there).
            for n, p in self.params.items():
                buf = self._weights_before.get(n)
                if buf is None or buf.shape != p.shape or buf.dtype != p.dtype or buf.device != p.device:
                    self._weights_before[n] = p.detach().clone()
                else:
                    buf.copy_(p.detach())
        self._weights_valid = True
        self._recorder.install()
        self._hooked = True

    def pause(self) -> None:
        """Take the hooks off until :meth:`resume`; what they recorded in this step is kept.

        For forwards that are not training (a validation or evaluation between training
        batches), and between micro-batches: what the step's later micro-batches record is
        merged exactly with what the earlier ones did, row by row (a module's call ``k`` in
        every micro-batch is one row: the statistics over all their samples).
        """
        if not self._hooked or self._recorder is None:
            return
        self._recorder.remove()
        self._hooked = False
        recorder = self._recorder
        for key, stats in recorder.rows.items():
            kept = self._kept.get(key)
            self._kept[key] = stats if kept is None else kept.merge(stats)
        self._kept_called.update(n for n, calls in recorder.calls.items() if calls > 0)
        self._kept_unrecorded.update(recorder.unrecorded)
        recorder.rows = {}

    def resume(self) -> None:
        """Put the hooks back after :meth:`pause`, when the current step is watched."""
        if not self._open:
            raise GradExplorerError("w.resume() was called outside the watch's `with` block.",
                                    "Call it inside `with watch(...) as w:`.")
        if self.watching and not self._hooked and self._recorder is not None:
            self._recorder.install()
            self._hooked = True

    def record_gradients(self, params: Iterable[torch.Tensor] | None = None) -> None:
        """Read the parameter gradients now, as the optimizer is about to step with them.

        Call it when the optimizer is about to update the parameters: from an optimizer step
        pre-hook (``optimizer.register_step_pre_hook``), or, where ``step(closure)`` runs the
        backward itself, when that closure returns (``gradexplorer.integrations.trainer_watch``).
        Trainers unscale an AMP GradScaler's gradients and clip them before that moment and
        clear them after it. The ``step()`` that ends this step logs the gradients read here
        instead of reading ``.grad`` again (per parameter, the last reading counts).

        Parameters
        ----------
        params : iterable of tensors, optional
            The parameters one optimizer steps (its ``param_groups``); by default every
            watched parameter. Parameters that are not watched are left out.
        """
        if not self.watching or not self._open:
            return
        wanted = None if params is None else {id(p) for p in params}
        chosen = {n: p for n, p in self.params.items() if wanted is None or id(p) in wanted}
        self._grads.update(self._gradient_stats(chosen))

    def _gradient_stats(self, params: Mapping[str, torch.Tensor]) -> dict[str, _GradientRow]:
        """Per parameter: (statistics of this rank's part of its ``.grad``, its place on the
        mesh, why not recorded). The small float32 CPU ones are summarised together
        (``MergeStats.of_tensors``, the numbers of ``of_tensor``): one call per parameter
        was the largest part of a watched step's cost on a model of small layers."""
        out: dict[str, _GradientRow] = {}
        names: list[str] = []
        parts: list[torch.Tensor] = []
        with torch.no_grad():
            for name, p in params.items():
                out[name] = (None, None, None)
                if p.grad is None:
                    continue
                part = local_part(p.grad, self.rank)
                if part.problem is not None:
                    out[name] = (None, None, f"gradient not recorded: {part.problem}")
                elif part.tensor is not None:
                    names.append(name)
                    parts.append(part.tensor)
                    out[name] = (None, part.coordinate, None)
            for name, stats in zip(names, MergeStats.of_tensors(parts)):
                out[name] = (stats, out[name][1], None)
        return out

    def _forget_step(self) -> None:
        self._kept = {}
        self._kept_called = set()
        self._kept_unrecorded = {}
        self._grads = {}

    # -- the step -----------------------------------------------------------------------------
    def step(self, loss: Any = None) -> None:
        """End the current training step (call it after ``opt.step()``).

        On a watched step, records the parameters' gradients and weights and the update
        ratio, writes the step to the log and removes the hooks; then, when the next step is
        watched, puts them back on.
        """
        if not self._open:
            raise GradExplorerError("w.step() was called outside the watch's `with` block.",
                                    "Call w.step() inside `with watch(...) as w:`.")
        if self.watching:
            assert self._recorder is not None
            self._recorder.remove()
            self._hooked = False
            self._finish_step(_loss_value(loss))
        self.step_index += 1
        self._begin_if_watched()

    def _finish_step(self, loss: float | None) -> None:
        step = self.step_index
        assert self._recorder is not None
        recorder = self._recorder
        rows = recorder.rows
        called = self._kept_called | {n for n, calls in recorder.calls.items() if calls > 0}
        unrecorded = {**self._kept_unrecorded, **recorder.unrecorded}
        for key, stats in self._kept.items():  # what the step recorded before a pause
            rows[key] = stats if key not in rows else stats.merge(rows[key])
        grads, self._grads = self._grads, {}
        self._kept, self._kept_called, self._kept_unrecorded = {}, set(), {}
        # Per parameter, this rank's share of the update ratio's two norms, squared: the
        # ratio is taken once they are summed over the ranks (sharded parameters).
        norms: dict[str, tuple[float, float]] = {}
        # Per DTensor parameter, where this rank's part sits on its mesh: equal parts of
        # copies of a smaller mesh are counted once (``LocalPart.coordinate``).
        coordinates: dict[str, tuple[int, ...]] = {}
        reports = []
        # The tensors to summarise, summarised together (MergeStats.of_tensors: the small
        # ones of a step in one compiled call), and the weights whose update ratio is taken.
        keys: list[RowKey] = []
        tensors: list[torch.Tensor] = []
        updates: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        # The gradients the optimizer stepped with, when read then; else ``.grad`` now (the
        # user's own loop calls step() right after opt.step()).
        read = grads if grads else self._gradient_stats(self.params)
        with torch.no_grad():
            for pname, p in self.params.items():
                grad, coordinate, problem = read.get(pname, (None, None, None))
                if problem is not None:
                    reports.append((pname, problem))
                elif grad is not None:
                    rows[(pname, 0, "grad")] = grad
                    if coordinate is not None:
                        coordinates[pname] = coordinate
                before = self._weights_before.get(pname) if self._weights_valid else None
                if before is None:
                    continue
                before_part, now_part = local_part(before, self.rank), local_part(p.detach(), self.rank)
                if before_part.tensor is None or now_part.tensor is None:
                    continue
                if now_part.coordinate is not None:
                    coordinates[pname] = now_part.coordinate
                keys.append((pname, 0, "weight"))
                tensors.append(before_part.tensor)
                updates.append((pname, before_part.tensor, now_part.tensor))
            rows.update(zip(keys, MergeStats.of_tensors(tensors)))
            # The updates' norms: on the CPU one compiled call for all, no temporary.
            moved = distances([(now_local, before_local) for _n, before_local, now_local in updates])
            for (pname, before_local, now_local), d_norm in zip(updates, moved or [None] * len(updates)):
                weight = rows[(pname, 0, "weight")]
                # Norms accumulated in float64. The difference of two nearby float32 weights
                # is exact (Sterbenz), so a tiny update of large weights does not round to 0.
                if weight.count == weight.numel:  # all finite: the statistics hold the norm
                    w_norm = weight.summary()["l2"]
                else:
                    w_norm = float(torch.linalg.vector_norm(before_local, dtype=torch.float64))
                if d_norm is None:
                    d_norm = float(torch.linalg.vector_norm(now_local - before_local, dtype=torch.float64))
                norms[pname] = (d_norm * d_norm, w_norm * w_norm)
        self._weights_valid = False
        reports += [(n, "selected but not called during this step") for n in recorder.modules if n not in called]
        reports += [(n, message) for (n, _what), message in unrecorded.items()]
        seconds = time.time() - self._started
        recorder.rows = {}
        if self.world > 1:
            self._write_distributed(step, loss, seconds, rows, norms, reports, coordinates)
        else:
            self._write(step, 0, loss, seconds, rows, _ratios([norms]), reports)

    def _write(self, step: int, rank: int, loss: float | None, seconds: float, rows: dict[RowKey, MergeStats],
               ratios: dict[str, float], reports: list[tuple[str, str]]) -> None:
        self._write_rows(step, [(rank, loss, seconds)], self._table(step, rank, rows.items(), ratios), reports)

    def _write_distributed(self, step: int, loss: float | None, seconds: float, rows: dict[RowKey, MergeStats],
                           norms: dict[str, tuple[float, float]], reports: list[tuple[str, str]],
                           coordinates: dict[str, tuple[int, ...]]) -> None:
        import torch.distributed as dist

        # Each rank sends only what it counts (``local_part``): DDP's replicated parameters
        # from rank 0, a sharded parameter's shard from every rank. A few hundred bytes per
        # tensor, never a tensor.
        mine = {"rank": self.rank, "loss": loss, "seconds": seconds, "reports": reports,
                "rows": {k: v.to_dict() for k, v in rows.items()}, "norms": norms, "coordinates": coordinates}
        gathered: list | None = [None] * self.world if self.rank == 0 else None
        try:
            dist.gather_object(mine, gathered, dst=0)
        except (RuntimeError, OSError) as e:  # DistBackendError and gloo's peer errors
            raise collective_failed(
                f"Rank {self.rank} could not gather watched step {step}'s statistics from the other ranks", e,
                f"The watch log holds every step before step {step}.") from e
        if self.rank != 0:
            return
        assert gathered is not None
        _drop_copies(gathered, rows=not self.per_rank)  # per rank: each rank's rows, as it holds them
        ratios = _ratios([g["norms"] for g in gathered])
        losses = [g["loss"] for g in gathered if g["loss"] is not None]
        mean_loss = sum(losses) / len(losses) if losses else None
        all_reports = [(layer, f"rank {g['rank']}: {msg}") for g in gathered for layer, msg in g["reports"]]
        if self.per_rank:
            table = [row for g in gathered for row in self._table(step, g["rank"], g["rows"].items(), ratios)]
            self._write_rows(step, [(g["rank"], g["loss"], g["seconds"]) for g in gathered], table, all_reports)
            return
        # Under tensor parallelism the module rows stay each rank's own (see the module docstring).
        apart = bool(self.tensor_parallel)
        merged: dict[RowKey, MergeStats] = {}
        for g in gathered:
            for k, v in g["rows"].items():
                if apart and k[2] in MODULE_KINDS:
                    continue
                s = MergeStats.from_dict(v)
                merged[k] = merged[k].merge(s) if k in merged else s
        entries = [(-1, mean_loss, max(g["seconds"] for g in gathered))]
        table = self._table(step, -1, merged.items(), ratios)
        if apart:
            entries += [(g["rank"], g["loss"], g["seconds"]) for g in gathered]
            for g in gathered:
                own = [(k, v) for k, v in g["rows"].items() if k[2] in MODULE_KINDS]
                table += self._table(step, g["rank"], own, ratios)
        self._write_rows(step, entries, table, all_reports)

    @staticmethod
    def _table(step: int, rank: int, rows: Any, ratios: dict[str, float]) -> list[tuple]:
        """``stats`` rows of one rank (or -1) from ``(key, MergeStats or its dict)`` pairs."""
        return stats_rows(step, rank, [
            (layer, call, kind, s if isinstance(s, MergeStats) else MergeStats.from_dict(s),
             ratios.get(layer) if kind == "weight" else None)
            for (layer, call, kind), s in rows])

    def _write_rows(self, step: int, entries: list[tuple[int, float | None, float]], table: list[tuple],
                    reports: list[tuple[str, str]]) -> None:
        """One step of several ranks' rows, in one transaction."""
        assert self._writer is not None
        for layer, message in reports:
            self.reports.append((step, layer, message))
        wall_time = time.time()
        self._writer.write_step_ranks(step, entries, wall_time, table, reports)
        if self._board is not None:
            self._board.write_step(step, entries, table, wall_time)

    def report(self, layer: str, message: str) -> None:
        """Note, for the current step, something that could not be watched and why (the
        log's ``reports`` table and ``w.reports``); on rank 0 only under torch.distributed."""
        if self.rank == 0:
            self._report(self.step_index, layer, message)

    def _report(self, step: int | None, layer: str, message: str) -> None:
        self.reports.append((step, layer, message))
        if self._writer is not None:
            self._writer.report(step, layer, message)


def _drop_copies(gathered: list[dict], rows: bool = True) -> None:
    """Count once each parameter part held by several ranks, the copies of a mesh smaller
    than the world (``gradexplorer.recording.sharded``): the lowest rank's is kept in the
    update ratio's norms and, with ``rows``, in the statistics rows."""
    seen: set[tuple[str, tuple[int, ...]]] = set()
    for g in sorted(gathered, key=lambda g: g["rank"]):
        copies = {name for name, coordinate in g["coordinates"].items() if (name, coordinate) in seen}
        seen.update((name, coordinate) for name, coordinate in g["coordinates"].items())
        if copies:
            g["norms"] = {name: v for name, v in g["norms"].items() if name not in copies}
            if rows:
                g["rows"] = {k: v for k, v in g["rows"].items()
                             if not (k[0] in copies and k[2] in ("grad", "weight"))}


def _ratios(shares: list[dict[str, tuple[float, float]]]) -> dict[str, float]:
    """The update ratio |Δw|/|w| of each parameter from every rank's squared norms of
    its part (one share per rank; a replicated parameter has one share in all)."""
    totals: dict[str, list[float]] = {}
    for share in shares:
        for name, (d2, w2) in share.items():
            total = totals.setdefault(name, [0.0, 0.0])
            total[0] += d2
            total[1] += w2
    return {name: (math.sqrt(d2 / w2) if w2 > 0 else (math.inf if d2 > 0 else 0.0))
            for name, (d2, w2) in totals.items()}


def watch(model: nn.Module, out: str = "run.gxw", *, every: int = 10, layers: LayerSpec = None,
          params: bool = True, per_rank: bool = False, scaler: Any = None, grad_norms: bool = True,
          tensorboard: str | os.PathLike | None = None) -> Watch:
    """Watch ``model`` in a training loop; use as ``with watch(...) as w:`` and call
    ``w.step(loss=loss)`` once per training step.

    Parameters
    ----------
    model : nn.Module
        The model being trained (a DDP wrapper is fine). Not modified.
    out : str
        The watch log to write (SQLite, see ``gradexplorer.recording.watch_log``); rank 0 writes it.
    every : int
        Watch steps 0, every, 2*every, ...
    layers : None, str, iterable of str, or callable
        Modules whose activations and output gradients are recorded (``None``: every leaf
        module), as in ``gradexplorer.capturing.selection``. Their parameters are recorded too (all the
        model's trainable parameters when ``layers`` is None).
    params : bool
        Record parameter gradients, weights and update ratios.
    per_rank : bool
        Under torch.distributed, log each rank's statistics instead of their merge. Under
        tensor parallelism the module rows are each rank's own either way.
    scaler : torch.amp.GradScaler, optional
        Divide the output gradients seen in backward by its scale.
    grad_norms : bool
        Record the distribution of per-sample output-gradient norms.
    tensorboard : path, optional
        Also write every watched step to TensorBoard event files in this folder, as
        ``gradexplorer export LOG --tensorboard DIR`` would (``gradexplorer.recording.tensorboard``;
        needs the ``tensorboard`` package). Rank 0 writes.

    Raises
    ------
    GradExplorerError
        When ``every`` is not a positive integer or ``layers`` selects nothing.
    """
    return Watch(model, out, every=every, layers=layers, params=params, per_rank=per_rank,
                 scaler=scaler, grad_norms=grad_norms, tensorboard=tensorboard)
