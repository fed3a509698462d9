"""``gradexplorer capture --batch-size N``: statistics over a whole dataset (gradexplorer.recording.dataset_capture).

Also under ``torchrun --nproc-per-node K -m gradexplorer capture ...``: the process group is
detected from torchrun's environment, each rank captures its share of the batches on its
own device, and rank 0 merges (a collective) and writes the file. With ``--shard fsdp``
the model is sharded over the ranks with FSDP2 (``gradexplorer.recording.shard_blocks``,
``gradexplorer.recording.sharded_dataset``) instead of replicated on each.

The steps the window's Run over folder… shares (the samples, the memory check, the batches
replicated in a process, the capture's metadata) are ``gradexplorer.pipeline.dataset_job.DatasetJob``'s;
what only torchrun has (each rank's share, the model sharded, the merge on rank 0) is here.
Before the batches run, one sample through the model tells the memory the capture will
hold and need while it runs, per rank and with the shard when sharded
(``gradexplorer.recording.dataset_memory``), checked against ``--memory-budget`` and refused
in the command line's words (``--batch-size``, ``--layers``, ``--memory-budget``, ``--force``).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.units import counted
from gradexplorer_app.cli.common import EXIT_OK, UI, capture_options, check_out_path, job_progress
from gradexplorer_app.cli.format import fmt_seconds, human_size

# Engine modules are imported inside the functions that use them (start-up time): main builds
# every command's parser at start, and each command then loads only the engine parts it runs.

if TYPE_CHECKING:
    from gradexplorer.capturing.data import Capture
    from gradexplorer.pipeline.dataset_job import DatasetJob
    from gradexplorer.recording.dataset_capture import DatasetStats


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
    shard = args.shard
    if not args.stats_only:
        flags = "--batch-size, --shard" if shard else "--batch-size"
        raise GradExplorerError(f"a capture over a dataset ({flags}) keeps statistics only;", "add --stats-only.")
    if shard and not _under_torchrun():
        raise GradExplorerError("--shard splits the model over the processes of torchrun, and this command "
                                "was not started by torchrun;",
                                "run it as torchrun --nproc-per-node K -m gradexplorer capture ... --shard fsdp "
                                "(K processes, one per GPU, or gloo on the CPU), or leave out --shard.")
    if args.shard_blocks and not shard:
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
    from gradexplorer.pipeline.dataset_job import DatasetJob
    from gradexplorer.pipeline.job import CaptureJob

    _check_args(args)
    sharded = args.shard == "fsdp"
    rank, world, local_rank = _dist_env()
    out = check_out_path(args) if rank == 0 else None
    options = capture_options(args)  # checks --target and the other settings' spelling
    job = CaptureJob(options, job_progress(ui))
    device = job.resolve_device()
    if (world > 1 or sharded) and device.type == "cuda":
        device = torch.device("cuda", local_rank)  # one GPU per rank
        torch.cuda.set_device(device)
    dataset = DatasetJob(job, args.batch_size, args.max_samples, device=device)
    if rank != 0:
        ui.quiet = True
        ui.bar.enabled = False
    t_start = time.perf_counter()

    import torch.distributed as dist

    own_group = False
    if (world > 1 or sharded) and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        own_group = True
    finished = False
    try:
        job.load_model()
        dataset.selected_layers()
        ui.bar.update("reading inputs")
        dataset.source()
        merged, shard_meta = _run(args, ui, dataset, rank, world, sharded)
        if rank != 0 or merged is None:
            finished = True
            return EXIT_OK
        cap = dataset.to_capture(merged, world=world, seconds=time.perf_counter() - t_start, shard=shard_meta)
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
            del dataset  # its samples hold the model too
            gc.collect()
            dist.destroy_process_group()


def _run(args: argparse.Namespace, ui: UI, dataset: DatasetJob, rank: int, world: int, sharded: bool
         ) -> tuple[DatasetStats | None, dict | None]:
    """The batches of this rank, merged on rank 0: (totals on rank 0 else None, the
    capture's ``meta["shard"]`` when sharded). The memory check is the dataset job's
    (``DatasetJob.estimate``), with the shard plan when sharded."""
    from gradexplorer.recording.dataset_capture import eta_text, gather_to_rank0, shard

    job, device = dataset.job, dataset.device
    loaded, selected, source = job.load_model(), dataset.selected_layers(), dataset.source()
    n, total = source.samples, source.total
    mine = shard(range(total), rank, world)
    passes = -(-total // world) if sharded else len(mine)
    plan = None
    if sharded:
        from gradexplorer.recording.shard_blocks import ShardPlan, choose_blocks

        plan = ShardPlan.of(loaded.module, choose_blocks(loaded.module, args.shard_blocks), world)
    estimate = dataset.estimate(plan)
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
        stats = capture_dataset_sharded(loaded.module, source.batch, total, layers=job.options.layer_spec(),
                                        target=job.options.target, device=device, progress=on_progress)
    else:
        stats = dataset.capture(mine, on_progress)
    if world == 1:
        return stats, shard_meta
    ui.bar.update("merging ranks")
    return gather_to_rank0(stats), shard_meta


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
