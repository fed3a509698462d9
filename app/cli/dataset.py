"""``gradexplorer capture --batch-size N``: statistics over a whole dataset (gradexplorer.recording.dataset).

Also under ``torchrun --nproc-per-node K -m gradexplorer capture ...``: the process group is
detected from torchrun's environment, each rank captures its share of the batches on its
own device, and rank 0 merges (a collective) and writes the file.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gradexplorer.app.cli.common import EXIT_OK, UI, capture_options, check_out_path, job_progress
from gradexplorer.app.cli.format import fmt_seconds, human_size
from gradexplorer.base.errors import GradExplorerError

# Engine modules are imported inside the functions that use them (start-up time): main builds
# every command's parser at start, and each command then loads only the engine parts it runs.

if TYPE_CHECKING:
    from gradexplorer.capturing.data import Capture
    from gradexplorer.recording.dataset import DatasetStats


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


def _check_args(args: argparse.Namespace) -> None:
    if args.batch_size < 1:
        raise GradExplorerError(f"--batch-size {args.batch_size} is not a positive number;",
                                "give the number of samples per batch, e.g. --batch-size 32.")
    if args.max_samples is not None and args.max_samples < 1:
        raise GradExplorerError(f"--max-samples {args.max_samples} is not a positive number;",
                                "give how many samples to use at most, or leave it out for all.")
    if not args.stats_only:
        raise GradExplorerError("a capture over a dataset (--batch-size) keeps statistics only;",
                                "add --stats-only.")
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
    from gradexplorer.recording.dataset import (
        DatasetSource,
        capture_dataset,
        dataset_meta,
        eta_text,
        gather_to_rank0,
        shard,
        to_capture,
    )

    _check_args(args)
    rank, world, local_rank = _dist_env()
    out = check_out_path(args) if rank == 0 else None
    options = capture_options(args)  # checks --target and the other settings' spelling
    job = CaptureJob(options, job_progress(ui))
    target = options.target
    device = job.resolve_device()
    if world > 1 and device.type == "cuda":
        device = torch.device("cuda", local_rank)  # one GPU per rank
        torch.cuda.set_device(device)
    if rank != 0:
        ui.quiet = True
        ui.bar.enabled = False
    t_start = time.perf_counter()

    import torch.distributed as dist

    own_group = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        own_group = True
    finished = False
    try:
        loaded = job.load_model()
        selected = resolve_layers(loaded.module, args.layers or None)
        ui.bar.update("reading inputs")
        source = DatasetSource(list(args.input), loaded, args.batch_size, args.max_samples)
        n, total = source.samples, source.total
        mine = shard(range(total), rank, world)
        batches = source.batches(mine)
        ui.note(f"capturing {len(selected)} layers of {loaded.name} over {n} samples "
                f"({total} batches of {args.batch_size}) on {device}"
                + (f", {world} processes" if world > 1 else "") + ", statistics only")
        started = time.monotonic()

        def on_progress(done: int, _total: int, _samples: int) -> None:
            # Rank 0 shows its own share; the ranks move at about the same pace.
            share = len(mine)
            text = eta_text(done, share, started).split(", ETA ")
            ui.bar.update("batches", done, share, "batches" + (f"  ETA {text[1]}" if len(text) > 1 else ""))

        stats = capture_dataset(loaded.module, batches, layers=args.layers or None, target=target, device=device,
                                total_batches=len(mine), progress=on_progress)
        if world > 1:
            ui.bar.update("merging ranks")
            merged = gather_to_rank0(stats)
        else:
            merged = stats
        if rank != 0 or merged is None:
            finished = True
            return EXIT_OK
        meta = dataset_meta(loaded, options, source, selected, device, world, time.perf_counter() - t_start)
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
            dist.destroy_process_group()


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
    if snr:
        low = ", ".join(f"{k} {v:.3g}" for v, k in snr[:3])
        lines.append(f"grad SNR  lowest: {low}")
    if flagged:
        more = " ..." if len(flagged) > 5 else ""
        lines.append(f"NaN/Inf   in {len(flagged)} layers: {', '.join(flagged[:5])}{more}")
    lines.append(f"wrote     {human_size(path.stat().st_size)} to {path.resolve()}")
    print("\n".join(lines), flush=True)
