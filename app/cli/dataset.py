"""``gradexplorer capture --batch-size N``: statistics over a whole dataset (gradexplorer.recording.dataset).

Also under ``torchrun --nproc-per-node K -m gradexplorer capture ...``: the process group is
detected from torchrun's environment, each rank captures its share of the batches on its
own device, and rank 0 merges (a collective) and writes the file. With ``--shard fsdp``
the model is sharded over the ranks with FSDP2 (``gradexplorer.recording.shard_blocks``,
``gradexplorer.recording.sharded_dataset``) instead of replicated on each.

Before the batches run, one sample through the model tells the memory the capture will
hold and need while it runs, per rank and with the shard when sharded
(``gradexplorer.recording.dataset_memory``), checked against ``--memory-budget``.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gradexplorer.app.cli.common import EXIT_OK, UI, capture_options, check_out_path, job_progress
from gradexplorer.app.cli.format import fmt_seconds, human_size
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.units import counted

# Engine modules are imported inside the functions that use them (start-up time): main builds
# every command's parser at start, and each command then loads only the engine parts it runs.

if TYPE_CHECKING:
    from gradexplorer.capturing.data import Capture
    from gradexplorer.capturing.memory_estimate import MemoryEstimate
    from gradexplorer.models.loaded_model import LoadedModel
    from gradexplorer.pipeline.job import CaptureJob
    from gradexplorer.recording.dataset import DatasetSource, DatasetStats
    from gradexplorer.recording.shard_blocks import ShardPlan


def _dist_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) without it."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise GradExplorerError("WORLD_SIZE, RANK or LOCAL_RANK is not a number;",
                                "start the command with torchrun, or unset these variables.") from None
    return rank, world, local


def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def _check_args(args: argparse.Namespace) -> None:
    if args.batch_size < 1:
        raise GradExplorerError(f"--batch-size {args.batch_size} is not a positive number;",
                                "give the number of samples per batch, e.g. --batch-size 32.")
    if args.max_samples is not None and args.max_samples < 1:
        raise GradExplorerError(f"--max-samples {args.max_samples} is not a positive number;",
                                "give how many samples to use at most, or leave it out for all.")
    shard = getattr(args, "shard", None)
    if not args.stats_only:
        flags = "--batch-size, --shard" if shard else "--batch-size"
        raise GradExplorerError(f"a capture over a dataset ({flags}) keeps statistics only;", "add --stats-only.")
    if shard and not _under_torchrun():
        raise GradExplorerError("--shard splits the model over the processes of torchrun, and this command "
                                "was not started by torchrun;",
                                "run it as torchrun --nproc-per-node K -m gradexplorer capture ... --shard fsdp "
                                "(K processes, one per GPU, or gloo on the CPU), or leave out --shard.")
    if getattr(args, "shard_blocks", None) and not shard:
        raise GradExplorerError("--shard-blocks chooses the blocks of a sharded capture;",
                                "add --shard fsdp, or leave out --shard-blocks.")
    if not args.input:
        raise GradExplorerError("a capture over a dataset (--batch-size) needs --input;",
                                "give a folder of images or one .pt tensor file with --input.")
    if args.input_grad:
        raise GradExplorerError("--input-grad is not available with --batch-size;", "leave out --input-grad.")
    if args.train:
        raise GradExplorerError("--train is not available with --batch-size (batch statistics would differ "
                                "from one batch size to another);", "leave out --train.")


def cmd_capture_dataset(args: argparse.Namespace, ui: UI) -> int:
    """Run the dataset capture the arguments describe (see the module docstring)."""
    from gradexplorer.capturing.selection import resolve_layers
    from gradexplorer.pipeline.job import CaptureJob

    _check_args(args)
    sharded = getattr(args, "shard", None) == "fsdp"
    rank, world, local_rank = _dist_env()
    out = check_out_path(args) if rank == 0 else None
    options = capture_options(args)  # checks --target and the other settings' spelling
    job = CaptureJob(options, job_progress(ui))
    device = job.resolve_device()
    if (world > 1 or sharded) and device.type == "cuda":
        device = torch.device("cuda", local_rank)  # one GPU per rank
        torch.cuda.set_device(device)
    if rank != 0:
        ui.quiet = True
        ui.bar.enabled = False
    t_start = time.perf_counter()

    import torch.distributed as dist

    own_group = False
    loaded: LoadedModel | None = None
    if (world > 1 or sharded) and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        own_group = True
    finished = False
    try:
        loaded = job.load_model()
        selected = resolve_layers(loaded.module, args.layers or None)
        ui.bar.update("reading inputs")
        from gradexplorer.recording.dataset import DatasetSource

        source = DatasetSource(list(args.input), loaded, args.batch_size, args.max_samples)
        merged, shard_meta = _run(args, ui, job, loaded, selected, source, device, rank, world, sharded)
        if rank != 0 or merged is None:
            finished = True
            return EXIT_OK
        from gradexplorer.recording.dataset import dataset_meta, to_capture

        meta = dataset_meta(loaded, options, source, selected, device, world, time.perf_counter() - t_start)
        if shard_meta is not None:
            meta["shard"] = shard_meta
        cap = to_capture(merged, loaded.module, selected, meta)
        from gradexplorer.files.capture_file import save_capture

        ui.bar.update("saving")
        assert out is not None
        path = save_capture(cap, out)
        ui.bar.close()
        _print_summary(cap, merged, path, time.perf_counter() - t_start)
        finished = True
        return EXIT_OK
    finally:
        if own_group:
            if finished:
                # Every rank leaves together: a rank that destroyed the group while rank 0
                # still received its statistics aborted at exit, about one run in fifteen
                # ("terminate called without an active exception"). Not after a failure:
                # the other ranks may never arrive.
                dist.barrier()
            # A sharded model holds the process group (its device mesh): dropped first.
            job.loaded = None
            loaded = None
            gc.collect()
            dist.destroy_process_group()


def _run(args: argparse.Namespace, ui: UI, job: CaptureJob, loaded: LoadedModel, selected: list[str],
         source: DatasetSource, device: torch.device, rank: int, world: int, sharded: bool
         ) -> tuple[DatasetStats | None, dict | None]:
    """The batches of this rank, merged on rank 0: (totals on rank 0 else None, the
    capture's ``meta["shard"]`` when sharded)."""
    from gradexplorer.recording.dataset import capture_dataset, eta_text, gather_to_rank0, shard

    n, total = source.samples, source.total
    mine = shard(range(total), rank, world)
    passes = -(-total // world) if sharded else len(mine)
    plan = None
    if sharded:
        from gradexplorer.recording.shard_blocks import ShardPlan, choose_blocks

        plan = ShardPlan.of(loaded.module, choose_blocks(loaded.module, args.shard_blocks), world)
    estimate = _estimate(job, loaded, selected, source, device, args, plan)
    what = (f"sharded over {counted(world, 'process', 'processes')} in {counted(len(plan.blocks), 'block')} "
            "and the root" if plan is not None
            else f"{world} processes" if world > 1 else "")
    ui.note(f"capturing {len(selected)} layers of {loaded.name} over {n} samples "
            f"({total} batches of {args.batch_size}) on {device}" + (f", {what}" if what else "")
            + f", statistics only: {estimate.describe()}")
    started = time.monotonic()

    def on_progress(done: int, _total: int, _samples: int) -> None:
        # Rank 0 shows its own share; the ranks move at about the same pace.
        text = eta_text(done, passes, started).split(", ETA ")
        ui.bar.update("batches", done, passes, "batches" + (f"  ETA {text[1]}" if len(text) > 1 else ""))

    shard_meta = None
    if plan is not None:
        import torch.distributed as dist

        from gradexplorer.recording.shard_blocks import local_param_bytes, shard_model
        from gradexplorer.recording.sharded_dataset import capture_dataset_sharded

        whole = sum(p.numel() * p.element_size() for p in loaded.module.parameters())
        shard_model(loaded.module, plan.blocks, device)
        held: list = [None] * world
        dist.all_gather_object(held, local_param_bytes(loaded.module))
        shard_meta = {"kind": "fsdp", "blocks": list(plan.blocks), "world_size": world,
                      "param_bytes": whole, "rank_param_bytes": [int(h) for h in held]}
        stats = capture_dataset_sharded(loaded.module, source.batch, total, layers=args.layers or None,
                                        target=job.options.target, device=device, progress=on_progress)
    else:
        stats = capture_dataset(loaded.module, source.batches(mine), layers=args.layers or None,
                                target=job.options.target, device=device, total_batches=len(mine),
                                progress=on_progress)
    if world == 1:
        return stats, shard_meta
    ui.bar.update("merging ranks")
    return gather_to_rank0(stats), shard_meta


def _estimate(job: CaptureJob, loaded: LoadedModel, selected: list[str], source: DatasetSource,
              device: torch.device, args: argparse.Namespace, plan: ShardPlan | None) -> MemoryEstimate:
    """One sample through the whole model (before any sharding): the memory estimate,
    checked against the budget (``--memory-budget``, else half the free memory)."""
    from gradexplorer.capturing.memory_estimate import budget_shortfall
    from gradexplorer.pipeline.job import probe_model
    from gradexplorer.recording.dataset import recorded_params
    from gradexplorer.recording.dataset_memory import estimate_dataset_memory

    first, _labels = source.batch(0)
    prepared = probe_model(loaded, first)
    if prepared.probe_error is not None:
        raise prepared.probe_error
    params = recorded_params(loaded.module, args.layers or None, selected)
    estimate = estimate_dataset_memory(prepared.tree, selected, first, loaded.module, params,
                                       batches=source.total, plan=plan, device=device)
    short = budget_shortfall(estimate, device, budget=job.options.memory_budget)
    if short is not None and not job.options.force:
        from gradexplorer.base.units import format_bytes

        where = "of memory" if short.device.type == "cpu" else f"on {short.device}"
        source_of = "set by --memory-budget" if short.set_by_user else "half of the free memory"
        fix = ("shard the model over more processes, " if plan is not None else
               "shard the model with --shard fsdp under torchrun, " if short.device.type != "cpu" else "")
        raise GradExplorerError(
            f"this capture needs about {format_bytes(short.need)} {where} per process ({estimate.describe()}) "
            f"but the budget is {format_bytes(short.budget)} ({source_of});",
            f"{fix}use a smaller --batch-size or fewer --layers, a --memory-budget above "
            f"{format_bytes(short.need)}, or --force to run anyway.")
    return estimate


def _print_summary(cap: Capture, stats: DatasetStats, path: Path, elapsed: float) -> None:
    from gradexplorer.stats.moments import has_nonfinite

    flagged = [n for n, rec in cap.layers.items()
               if any(has_nonfinite(s) for c in rec.calls for s in c.stats.values() if s)]
    snr = sorted(((v["snr"], k) for k, v in cap.meta["dataset"]["snr"].items() if v["snr"] == v["snr"]))
    lines = [
        f"model     {cap.meta.get('model_name')}" + (f"  weights {cap.meta['weights']}" if cap.meta.get("weights")
                                                      else "  (random init)"),
        f"dataset   {stats.samples} samples in {stats.batches} batches  target {cap.meta.get('target')}"
        f"  device {cap.meta.get('device')}" + (f"  {cap.meta['world_size']} processes"
                                               if cap.meta.get("world_size", 1) > 1 else ""),
        f"captured  {len(cap.layers)} layers in {fmt_seconds(elapsed)}",
    ]
    sharded = cap.meta.get("shard")
    if sharded:
        held = max(sharded["rank_param_bytes"])
        lines.append(f"sharded   FSDP2 over {counted(sharded['world_size'], 'process', 'processes')}, "
                     f"{counted(len(sharded['blocks']), 'block')} and the root: at most {human_size(held)} "
                     f"of the {human_size(sharded['param_bytes'])} of parameters on one process")
    if snr:
        low = ", ".join(f"{k} {v:.3g}" for v, k in snr[:3])
        lines.append(f"grad SNR  lowest: {low}")
    if flagged:
        more = " ..." if len(flagged) > 5 else ""
        lines.append(f"NaN/Inf   in {len(flagged)} layers: {', '.join(flagged[:5])}{more}")
    lines.append(f"wrote     {human_size(path.stat().st_size)} to {path.resolve()}")
    print("\n".join(lines), flush=True)
