"""``gradexplorer capture``: one forward and backward pass, saved to a .pt capture file.

With ``--batch-size N`` the statistics of a whole dataset instead (``gradexplorer_app.cli.capture_over_dataset``).
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.units import counted
from gradexplorer_app.cli.common import (
    EXIT_OK,
    UI,
    add_common,
    add_input_args,
    add_memory_budget,
    add_model_args,
    capture_options,
    check_out_path,
    job_progress,
    onset_lines,
)
from gradexplorer_app.cli.format import fmt_seconds, fmt_shape, human_size

# Engine modules are imported inside the functions that use them (start-up time): main builds
# every command's parser at start, and each command then loads only the engine parts it runs.

if TYPE_CHECKING:
    from gradexplorer.capturing.memory_estimate import MemoryEstimate
    from gradexplorer.pipeline.job import CaptureJob
    from gradexplorer_app.cli.common import SubParsers


def register(sub: SubParsers) -> None:
    """Add the ``capture`` subcommand to the CLI's subparsers."""
    p = sub.add_parser(
        "capture", help="run one forward and backward pass and save the gradients to a .pt file",
        description="Run one forward and backward pass and save per-layer activations, gradients "
                    "and statistics to a .pt file that torch.load(path, weights_only=True) opens.",
    )
    add_model_args(p)
    add_input_args(p)
    p.add_argument("--labels", metavar="LABELS", help="class indices or names, e.g. 3,1,0 or 'tabby'")
    p.add_argument("--layers", nargs="+", metavar="PATTERN",
                   help="module names or glob patterns ('layer4.*'); default: every leaf module")
    p.add_argument("--target", default="top1", metavar="T",
                   help="top1 (default), class:N, sum, mean or cross_entropy; add ,dim=-1 when the "
                        "classes are the last dim (per-token logits (B, length, vocab)), @key to pick a "
                        "dict/tuple output element")
    p.add_argument("--device", default="auto", metavar="D", help="auto (default), cpu, cuda:0, mps")
    p.add_argument("--stats-only", action="store_true",
                   help="keep statistics only (bounded memory); tensors are None in the file")
    p.add_argument("--input-grad", action="store_true", help="also record the gradient w.r.t. the input")
    p.add_argument("--train", action="store_true",
                   help="run in train mode (dropout, batch statistics); eval by default")
    p.add_argument("--autocast", choices=("bf16", "fp16"), metavar="DTYPE",
                   help="run forward under torch.autocast with bf16 or fp16 on the capture device")
    add_memory_budget(p)
    p.add_argument("--force", action="store_true",
                   help="run even when the full capture is estimated to exceed the memory budget")
    p.add_argument("--out", required=True, metavar="FILE.pt", help="where to write the capture")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help="capture a whole dataset (--input FOLDER or .pt), N samples per batch, and merge "
                        "the statistics exactly (needs --stats-only; works under torchrun)")
    p.add_argument("--max-samples", type=int, metavar="M", help="with --batch-size: use at most M samples")
    p.add_argument("--shard", choices=("fsdp",),
                   help="with --batch-size under torchrun: shard the model over the ranks with FSDP2 "
                        "(fully_shard per block, then the root), so that no rank holds it whole")
    p.add_argument("--shard-blocks", nargs="+", metavar="PATTERN",
                   help="with --shard: the modules to shard as blocks, names or glob patterns ('layer*.*'); "
                        "default: the model's repeated blocks (torchvision's layerN.M, Hugging Face and timm "
                        "block lists), else its children that hold parameters")
    add_common(p)
    p.set_defaults(func=cmd_capture)


def cmd_capture(args: argparse.Namespace, ui: UI) -> int:
    """Run ``gradexplorer capture``; returns the exit status."""
    from gradexplorer.pipeline.job import CaptureJob, OverBudget

    if args.shard is None and args.shard_blocks:
        raise GradExplorerError("--shard-blocks chooses the blocks of a sharded capture;",
                                "add --shard fsdp (with --batch-size N --stats-only under torchrun), "
                                "or leave out --shard-blocks.")
    if args.shard is not None and args.batch_size is None:
        raise GradExplorerError("--shard runs a capture over a dataset, statistics only;",
                                "add --batch-size N and --stats-only, and start it with torchrun "
                                "--nproc-per-node K.")
    if args.batch_size is not None:
        # Deferred for start-up time: the dataset command imports torch at once.
        from gradexplorer_app.cli.capture_over_dataset import cmd_capture_dataset

        return cmd_capture_dataset(args, ui)

    # Cheap checks first: a typo in --out or --target should not cost a model load.
    out = check_out_path(args)
    options = capture_options(args)
    job = CaptureJob(options, job_progress(ui))
    job.resolve_device()
    mode = options.mode
    t_start = time.perf_counter()

    loaded = job.load_model()
    batch = job.load_batch()
    for step in batch.preprocessing.split("; "):
        if step.startswith("left out, unreadable:"):  # --skip-unreadable: say which
            ui.warn(f"{step[len('left out, unreadable:'):].strip()} cannot be read: left out of the batch.")
    made_up = options.batch.is_default and not loaded.spec.startswith("demo:")
    if made_up:
        ui.note(f"no input was given: {batch.source}, shape {fmt_shape(tuple(batch.tensor.shape))} "
                "(the model's); give --input FILES for real data.")
    # One sample through the model (no gradients) tells calls and output sizes: the
    # progress bar's total and the memory estimate (gradexplorer.capturing.memory_estimate, the same one the
    # GUI shows beside Run), before anything large is allocated.
    job.probe()
    try:
        estimate = job.estimate()
    except OverBudget as exc:
        _note_estimate(ui, job, exc.estimate)
        raise
    if estimate is not None:
        _note_estimate(ui, job, estimate)
        from gradexplorer.base.file_write import check_free_space

        check_free_space(out, estimate.total)  # a full disk is said now, not after the capture
    cap = job.capture()

    from gradexplorer.analysis.capture_summary import summarize
    from gradexplorer.files.capture_file import save_capture

    ui.bar.update("saving")
    path = save_capture(cap, out)
    ui.bar.close()
    elapsed = time.perf_counter() - t_start
    n_calls = sum(len(rec.calls) for rec in cap.layers.values())
    size = path.stat().st_size
    flagged = summarize(cap).layers_with("nan/inf")
    lines = [
        f"model     {loaded.name}"
        + (f"  weights {loaded.weights}" if loaded.weights else f"  ({loaded.weights_label})"),
        (f"batch     {fmt_shape(tuple(batch.tensor.shape))} ({len(batch)}{' random' if made_up else ''} "
         f"sample{'s' if len(batch) != 1 else ''}{', no --input given' if made_up else ''})"
         f"  target {cap.meta.get('target')}  device {cap.meta.get('device')}  mode {mode}"),
        (f"captured  {counted(len(cap.layers), 'layer')}, {counted(n_calls, 'call')} in "
         f"{fmt_seconds(cap.meta.get('seconds', 0.0))}"
         f" (total {fmt_seconds(elapsed)})"),
    ]
    if cap.meta.get("target_words"):
        lines.insert(2, f"          {cap.meta['target_words']}"
                     + (f": {', '.join(repr(t) for t in cap.meta['predicted_tokens'])}"
                        if cap.meta.get("predicted_tokens") else ""))
    if batch.tokens is not None:
        lines.insert(2, f"text      {batch.preprocessing}")
    if cap.meta.get("not_called"):
        lines.append(f"not run   {', '.join(cap.meta['not_called'][:5])}"
                     + (" ..." if len(cap.meta["not_called"]) > 5 else "")
                     + " (never called in forward)")
    lines += onset_lines(cap, flagged)
    from gradexplorer.capturing.targets import class_axis_note

    axis = class_axis_note(tuple(cap.output.shape) if cap.output is not None else None, cap.meta.get("target", ""))
    if axis:
        ui.note(f"note: {axis}")
    lines.append(f"wrote     {human_size(size)} to {path.resolve()}")
    print("\n".join(lines), flush=True)
    return EXIT_OK


def _note_estimate(ui: UI, job: CaptureJob, estimate: MemoryEstimate) -> None:
    assert job.loaded is not None  # the estimate comes after the model's load
    ui.note(
        f"capturing {counted(len(job.selected_layers()), 'layer')} ({counted(estimate.calls, 'call')}) of "
        f"{job.loaded.name} on "
        f"{job.device}, {'full tensors' if job.options.mode == 'full' else 'statistics only'}: "
        f"{estimate.describe()}"
    )
