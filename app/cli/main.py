"""The ``gradexplorer`` command: headless subcommands, or the desktop app.

Subcommands (``capture``, ``models``, ``layers``, ``inspect``, ``devices``) call the same
``core`` functions as the GUI and never import Qt. Without a subcommand the desktop app
opens (``gradexplorer.app.window.launch.launch``), imported only on that path.

Exit codes: 0 success; 1 a problem with the user's input (one line on stderr,
``error: <problem> <fix>``); 2 a command-line usage error; 70 a bug in gradexplorer
(``error: internal error: ...``, the traceback with ``--debug``); 130 interrupted.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gradexplorer.app.cli.format import (
    ProgressBar,
    can_encode,
    fmt_num,
    fmt_seconds,
    fmt_shape,
    human_size,
    table,
)
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.units import counted

if TYPE_CHECKING:
    from gradexplorer.pipeline.options import CaptureOptions

PROG = "gradexplorer"
EXIT_OK = 0
EXIT_USER = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE
EXIT_INTERRUPTED = 130

SUBCOMMANDS = ("capture", "models", "layers", "inspect", "timeline", "devices", "diff", "graph")


class UsageError(Exception):
    """The command line itself is wrong (unknown option, missing value)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # argparse prints the usage and exits; the CLI's contract is one line on stderr.
        raise UsageError(f"{message}; see '{self.prog} --help'.")


class _UI:
    """What the running command shows: the progress bar and whether to be quiet."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.bar = ProgressBar(sys.stderr, enabled=not quiet)

    def note(self, text: str) -> None:
        """A line of information on stderr (not part of the command's output)."""
        if not self.quiet:
            self.bar.close()
            print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Argument parsing
# ---------------------------------------------------------------------------


def _add_model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument(
        "--model", required=required, metavar="NAME|PATH|SPEC",
        help="a torchvision name (resnet18), demo:shapes, demo:seed-mlp, a checkpoint file, "
             "or a factory pkg.mod:fn / file.py:fn (needs --trust)",
    )
    p.add_argument(
        "--weights", metavar="W",
        help="torchvision weights: DEFAULT, an enum name (IMAGENET1K_V1) or a local .pth file; "
             "default: random initialisation",
    )
    p.add_argument("--arch", metavar="A", help="torchvision architecture of a weights-only checkpoint file")
    p.add_argument(
        "--trust", action="store_true",
        help="allow running code from the model source (pickled modules, .pt2 archives, factories)",
    )


def _add_input_args(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--input", nargs="+", metavar="FILE",
                       help="image files or folders, or one .pt tensor file")
    group.add_argument(
        "--random", nargs="?", const="", metavar="SHAPE",
        help="a random batch (seed 0) of SHAPE, e.g. 2x3x224x224; without SHAPE two samples "
             "of the model's input shape",
    )
    group.add_argument("--demo-input", action="store_true", help="the demo model's own batch")


def _add_memory_budget(p) -> None:
    p.add_argument("--memory-budget", metavar="SIZE",
                   help="memory the capture may use, e.g. 2GiB or 500MB (KiB/MiB/GiB: powers of 1024, "
                        "kB/MB/GB: of 1000); default: half of the free memory")


def _add_common(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: a subcommand that does not see --debug must not reset the top-level one.
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the traceback of internal errors")
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                   help="no progress or notes on stderr")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``gradexplorer`` (GUI flags at the top, subcommands below)."""
    parser = _Parser(
        prog=PROG,
        description=(
            "See the gradients inside a PyTorch model. Without a subcommand the desktop app "
            "opens (on its built-in demo unless --model is given)."
        ),
        epilog="Run 'gradexplorer COMMAND --help' for the options of a subcommand.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.set_defaults(debug=False, quiet=False, func=None)
    _add_common(parser)

    gui = parser.add_argument_group("desktop app (no subcommand)")
    gui.add_argument("--model", metavar="NAME|PATH|SPEC", help="open this model (default: demo:shapes)")
    gui.add_argument("--weights", metavar="W", help="its weights (DEFAULT, an enum name, a .pth file)")
    gui.add_argument("--arch", metavar="A", help="architecture of a weights-only checkpoint file")
    gui.add_argument("--trust", action="store_true", help="allow running code from the model source")
    gui.add_argument("--input", nargs="+", metavar="FILE", help="image files, a folder or a .pt tensor")
    gui.add_argument("--random", metavar="SHAPE", help="a random batch of SHAPE, e.g. 2x3x224x224")
    gui.add_argument("--labels", metavar="LABELS", help="class indices or names for the batch, e.g. 3,1,0")
    gui.add_argument("--layers", nargs="+", metavar="PATTERN", help="layers to tick: names or globs ('layer4.*')")
    gui.add_argument("--target", metavar="T",
                     help="top1, class:N, sum, mean or cross_entropy, optionally ,dim=-1 (classes last) "
                          "and @key")
    gui.add_argument("--device", metavar="D", help="auto, cpu, cuda:0, mps")
    gui.add_argument("--stats-only", action="store_true", help="capture statistics only")
    _add_memory_budget(gui)
    gui.add_argument("--run", action="store_true", help="run a capture once the window is open")
    gui.add_argument("--screenshot", metavar="PNG", help="save the window once the run has rendered, then quit")
    gui.add_argument("--open", metavar="CAPTURE.pt",
                     help="open a capture file in the window (also: gradexplorer CAPTURE.pt)")

    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    # -- capture -----------------------------------------------------------------
    p = sub.add_parser(
        "capture", help="run one forward and backward pass and save the gradients to a .pt file",
        description="Run one forward and backward pass and save per-layer activations, gradients "
                    "and statistics to a .pt file that torch.load(path, weights_only=True) opens.",
    )
    _add_model_args(p)
    _add_input_args(p)
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
    _add_memory_budget(p)
    p.add_argument("--force", action="store_true",
                   help="run even when the full capture is estimated to exceed the memory budget")
    p.add_argument("--out", required=True, metavar="FILE.pt", help="where to write the capture")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help="capture a whole dataset (--input FOLDER or .pt), N samples per batch, and merge "
                        "the statistics exactly (needs --stats-only; works under torchrun)")
    p.add_argument("--max-samples", type=int, metavar="M", help="with --batch-size: use at most M samples")
    _add_common(p)
    p.set_defaults(func=cmd_capture)

    # -- models ------------------------------------------------------------------
    p = sub.add_parser("models", help="list torchvision models and which weights are cached",
                       description="List torchvision models, their weights and which are in the local cache.")
    p.add_argument("--task", metavar="TASK", help="only this task (classification, segmentation, video, ...)")
    p.add_argument("--cached", action="store_true", help="only models with weights in the cache")
    _add_common(p)
    p.set_defaults(func=cmd_models)

    # -- layers ------------------------------------------------------------------
    p = sub.add_parser("layers", help="show a model's module tree",
                       description="Show a model's module tree: names to use with --layers, types, "
                                   "parameters; with --probe also calls, output shapes and in-place modules.")
    _add_model_args(p)
    p.add_argument("--depth", type=int, metavar="N", help="show modules down to this depth (root = 0)")
    p.add_argument("--probe", action="store_true",
                   help="run one forward (no gradients) to learn calls, output shapes, in-place modules")
    _add_input_args(p)
    _add_common(p)
    p.set_defaults(func=cmd_layers)

    # -- inspect -----------------------------------------------------------------
    p = sub.add_parser("inspect", help="summarise a capture file or a watch log",
                       description="Show the metadata and per-layer statistics of a capture file, or "
                                   "summarise a watch log (.gxw): steps, NaN/Inf onset, vanishing or "
                                   "exploding layers.")
    p.add_argument("file", metavar="FILE.pt|RUN.gxw")
    p.add_argument("--layer", metavar="NAME", help="details of one layer (a name or glob pattern)")
    p.add_argument("--csv", metavar="FILE", help="watch logs: also export every row to this CSV file")
    _add_common(p)
    p.set_defaults(func=cmd_inspect)

    # -- timeline ----------------------------------------------------------------
    p = sub.add_parser("timeline", help="open the timeline of a watch log or a dataset capture",
                       description="Layers x steps of a watch log (.gxw, followed live while it grows) or of a "
                                   "dataset capture's per-batch series, in a window.")
    p.add_argument("file", metavar="RUN.gxw|DATASET.pt")
    p.add_argument("--layer", metavar="NAME", help="the layer whose histograms to show first")
    p.add_argument("--screenshot", metavar="PNG", help="save the window once drawn, then quit")
    _add_common(p)
    p.set_defaults(func=cmd_timeline)

    # -- devices -----------------------------------------------------------------
    p = sub.add_parser("devices", help="list the devices a capture can run on",
                       description="List the devices a capture can run on, with their memory.")
    _add_common(p)
    p.set_defaults(func=cmd_devices)

    # -- diff (app/cli/diff.py) --------------------------------------------------
    from gradexplorer.app.cli.diff import add_parser as add_diff_parser

    add_diff_parser(sub, _add_common)

    # -- graph (app/cli/graph.py) ------------------------------------------------
    from gradexplorer.app.cli.graph import register as register_graph

    register_graph(sub, _add_model_args, _add_input_args, _add_common)
    return parser


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("gradexplorer")
    except (ImportError, PackageNotFoundError):
        return "0.1.0 (source checkout)"


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``gradexplorer`` command; returns the exit status (never raises SystemExit)."""
    args_list = _open_shorthand(list(sys.argv[1:] if argv is None else argv))
    debug = "--debug" in args_list
    ui: _UI | None = None
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # --help, --version
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        debug = bool(args.debug)
        ui = _UI(quiet=bool(args.quiet))
        if args.func is None:
            return cmd_gui(args, parser, ui)
        return int(args.func(args, ui) or EXIT_OK)
    except UsageError as exc:
        _error(ui, str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _error(ui, "interrupted; nothing was saved.")
        return EXIT_INTERRUPTED
    except GradExplorerError as exc:
        _error(ui, f"{exc.problem} {exc.fix}")
        if debug:
            traceback.print_exc()
        return EXIT_USER
    except BrokenPipeError:
        # `gradexplorer models | head`: the reader went away; not an error of ours.
        _silence_stdout()
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - the last line of defence: a bug
        text = str(exc).strip().splitlines()
        detail = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
        hint = "" if debug else " (run again with --debug to see the traceback, and please report it)"
        _error(ui, f"internal error: {detail}{hint}")
        if debug:
            traceback.print_exc()
        return EXIT_INTERNAL


def _open_shorthand(args: list[str]) -> list[str]:
    """``gradexplorer CAPTURE.pt [flags]`` is ``gradexplorer --open CAPTURE.pt [flags]``: a
    first argument that is neither an option nor a subcommand names a capture file."""
    if args and not args[0].startswith("-") and args[0] not in SUBCOMMANDS:
        return ["--open", args[0], *args[1:]]
    return args


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error(ui: _UI | None, message: str) -> None:
    if ui is not None:
        ui.bar.clear()
    print(f"error: {_one_line(message)}", file=sys.stderr, flush=True)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


# ---------------------------------------------------------------------------
# Shared steps
# ---------------------------------------------------------------------------


def _options(args, **settings) -> CaptureOptions:
    """The capture options of a command line (model and input arguments, plus ``settings``)."""
    from gradexplorer.pipeline.options import BatchSpec, CaptureOptions

    batch = BatchSpec(inputs=tuple(args.input or ()), random=args.random,
                      demo=bool(getattr(args, "demo_input", False)))
    return CaptureOptions(model=args.model, weights=args.weights, arch=args.arch, trust=bool(args.trust),
                          batch=batch, **settings)


def _progress(ui: _UI):
    """The job's progress, drawn on the command's progress bar."""
    from gradexplorer.pipeline.job import STAGE_DOWNLOAD

    def on_progress(stage: str, done: int, total: int) -> None:
        if stage == STAGE_DOWNLOAD:
            ui.bar.update(stage, done, total or None, "B")
        elif stage in ("forward", "backward"):
            ui.bar.update(stage, done, total, "calls" if stage == "forward" else "grads")
        else:
            ui.bar.update(stage)

    return on_progress


def _check_out_path(args) -> Path:
    """``--out``, refused before anything runs when it cannot be written or is one of the
    files the capture reads (gradexplorer.base.file_write.check_output_path)."""
    from gradexplorer.base.file_write import check_output_path

    return check_output_path(args.out, [args.model, args.weights, args.labels, *(args.input or ())])


# ---------------------------------------------------------------------------
# capture
# ---------------------------------------------------------------------------


def capture_options(args) -> CaptureOptions:
    """The :class:`~gradexplorer.pipeline.options.CaptureOptions` of a ``capture`` command line, or of the
    desktop app's flags (``gradexplorer --model ... --run``: the same words give the same
    options; flags the app does not take keep their defaults).

    Raises
    ------
    GradExplorerError
        A setting that is not valid (a target that does not exist, a size that is not one...).
    """
    flag = vars(args).get
    return _options(
        args, labels=args.labels, layers=tuple(args.layers or ()), target=flag("target") or "top1",
        device=flag("device") or "auto", mode="stats" if args.stats_only else "full", train=bool(flag("train")),
        input_grad=bool(flag("input_grad")), autocast=flag("autocast"), memory_budget=_memory_budget(args),
        force=bool(flag("force")),
    )


def _memory_budget(args) -> int | None:
    from gradexplorer.base.units import parse_size

    text = getattr(args, "memory_budget", None)
    if text is None:
        return None
    try:
        return parse_size(text)
    except GradExplorerError as exc:
        raise GradExplorerError(f"--memory-budget {exc.problem}", exc.fix) from None


def cmd_capture(args, ui: _UI) -> int:
    from gradexplorer.pipeline.job import CaptureJob, OverBudget

    if getattr(args, "batch_size", None) is not None:
        from gradexplorer.app.cli.dataset import cmd_capture_dataset

        return cmd_capture_dataset(args, ui)

    # Cheap checks first: a typo in --out or --target should not cost a model load.
    out = _check_out_path(args)
    options = capture_options(args)
    job = CaptureJob(options, _progress(ui))
    job.resolve_device()
    mode = options.mode
    t_start = time.perf_counter()

    loaded = job.load_model()
    batch = job.load_batch()
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

    from gradexplorer.analysis.summary import summarize
    from gradexplorer.files.capture_file import save_capture

    ui.bar.update("saving")
    path = save_capture(cap, out)
    ui.bar.close()
    elapsed = time.perf_counter() - t_start
    n_calls = sum(len(rec.calls) for rec in cap.layers.values())
    size = path.stat().st_size
    flagged = summarize(cap).layers_with("nan/inf")
    lines = [
        f"model     {loaded.name}" + (f"  weights {loaded.weights}" if loaded.weights else "  (random init)"),
        (f"batch     {fmt_shape(tuple(batch.tensor.shape))} ({len(batch)}{' random' if made_up else ''} "
         f"sample{'s' if len(batch) != 1 else ''}{', no --input given' if made_up else ''})"
         f"  target {cap.meta.get('target')}  device {cap.meta.get('device')}  mode {mode}"),
        (f"captured  {counted(len(cap.layers), 'layer')}, {counted(n_calls, 'call')} in "
         f"{fmt_seconds(cap.meta.get('seconds', 0.0))}"
         f" (total {fmt_seconds(elapsed)})"),
    ]
    if cap.meta.get("not_called"):
        lines.append(f"not run   {', '.join(cap.meta['not_called'][:5])}"
                     + (" ..." if len(cap.meta["not_called"]) > 5 else "")
                     + " (selected but not called in forward)")
    lines += _onset_lines(cap, flagged)
    from gradexplorer.capturing.targets import class_axis_note

    axis = class_axis_note(tuple(cap.output.shape) if cap.output is not None else None, cap.meta.get("target", ""))
    if axis:
        ui.note(f"note: {axis}")
    lines.append(f"wrote     {human_size(size)} to {path.resolve()}")
    print("\n".join(lines), flush=True)
    return EXIT_OK


def _onset_lines(cap, flagged: list[str]) -> list[str]:
    """Where NaN/Inf began (forward, then backward), then how far it spread."""
    from gradexplorer.capturing.nonfinite import describe_onset

    onset = describe_onset(cap.nonfinite_onset)
    if not onset and not flagged:
        return []
    lines = [f"{'NaN/Inf' if i == 0 else '':<9} {text}" for i, text in enumerate(onset)]
    if flagged:
        spread = f"{len(flagged)} layer{'s' if len(flagged) != 1 else ''} hold NaN/Inf in all"
        lines.append(f"{'' if lines else 'NaN/Inf':<9} {spread}: {', '.join(flagged[:5])}"
                     + (" ..." if len(flagged) > 5 else ""))
    return lines


def _note_estimate(ui: _UI, job, estimate) -> None:
    ui.note(
        f"capturing {counted(len(job.selected_layers()), 'layer')} ({counted(estimate.calls, 'call')}) of "
        f"{job.loaded.name} on "
        f"{job.device}, {'full tensors' if job.options.mode == 'full' else 'statistics only'}: "
        f"{estimate.describe()}"
    )


# ---------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------


def cmd_models(args, ui: _UI) -> int:
    from gradexplorer.models.weights import cache_dir, model_catalog

    catalog = model_catalog()
    tasks = sorted({info.task for info in catalog})
    if args.task:
        wanted = args.task.strip().lower()
        if wanted not in tasks:
            near = difflib.get_close_matches(wanted, tasks, n=1)
            hint = f"did you mean '{near[0]}'? " if near else ""
            raise GradExplorerError(f"there is no task '{args.task}';", f"{hint}choose one of: {', '.join(tasks)}.")
        catalog = [info for info in catalog if info.task == wanted]
    if args.cached:
        catalog = [info for info in catalog if info.cached]
    check = "✓" if can_encode("✓") else "yes"
    rows = []
    for info in catalog:
        names = [
            _member(w) + ("*" if w == info.default_weights else "")
            for w in info.weights
        ]
        cached = ", ".join(_member(w) for w in info.cached)
        rows.append([info.name, info.task, ", ".join(names) or "-", f"{check} {cached}" if cached else ""])
    if rows:
        print(table(["MODEL", "TASK", "WEIGHTS", "CACHED"], rows))
    n_cached = sum(1 for info in catalog if info.cached)
    print(f"\n{len(catalog)} models, {n_cached} with cached weights. * default weights. "
          f"Cache folder: {cache_dir()}")
    return EXIT_OK


def _member(weights_name: str) -> str:
    return weights_name.rpartition(".")[2]


# ---------------------------------------------------------------------------
# layers
# ---------------------------------------------------------------------------


def cmd_layers(args, ui: _UI) -> int:
    from gradexplorer.capturing.module_tree import ModuleTree

    if args.depth is not None and args.depth < 0:
        raise GradExplorerError(f"--depth {args.depth} is negative;", "give 0 (the model only) or more.")
    from dataclasses import replace

    from gradexplorer.pipeline.job import STAGE_PROBE, CaptureJob, default_batch_spec

    options = _options(args)
    job = CaptureJob(options, _progress(ui))
    loaded = job.load_model()
    tree = ModuleTree.build(loaded.module)
    if args.probe:
        default = default_batch_spec(loaded, n=1) if options.batch.is_default else None
        if default is not None:  # one sample: the OUTPUT column reads per sample
            job = CaptureJob(replace(options, batch=default), _progress(ui), loaded=loaded)
        batch = job.load_batch()
        ui.bar.update(STAGE_PROBE)
        tree.probe(loaded.module, batch.model_input)
    elif args.input or args.random is not None or args.demo_input:
        raise GradExplorerError("an input only matters with --probe;", "add --probe, or leave out the input.")
    ui.bar.close()

    headers = ["MODULE", "TYPE", "PARAMS", "TOTAL", "TRAINABLE"]
    align = "llrrl"
    if tree.probed:
        headers += ["CALLS", "OUTPUT", "NOTES"]
        align += "rll"
    rows = []
    for node in tree:
        if args.depth is not None and node.depth > args.depth:
            continue
        label = ("  " * node.depth) + (node.name or "(model)")
        trainable = "-" if node.trainable is None else ("yes" if node.trainable else "no")
        row = [label, node.type, f"{node.own_params:,}", f"{node.total_params:,}", trainable]
        if tree.probed:
            shapes = list(dict.fromkeys(node.output_shapes))
            notes = []
            if node.inplace:
                notes.append("in-place")
            if node.reused:
                notes.append(f"reused x{node.calls}")
            row += [str(node.calls or 0), ", ".join(fmt_shape(s) for s in shapes) or "-", ", ".join(notes)]
        rows.append(row)
    print(table(headers, rows, align))
    root = tree.root
    trainable = sum(p.numel() for p in loaded.module.parameters() if p.requires_grad)
    summary = (f"\n{loaded.name} ({tree.model_type}): {counted(len(tree) - 1, 'module')}, "
               f"{counted(len(tree.leaves()), 'leaf', 'leaves')}, {counted(root.total_params, 'parameter')} "
               f"({trainable:,} trainable)")
    if tree.probed:
        inplace = sum(1 for n in tree if n.inplace)
        reused = sum(1 for n in tree if n.reused)
        summary += (f"; {counted(tree.expected_calls(), 'module call')} per forward, {inplace} in-place, "
                    f"{reused} reused")
    print(summary)
    return EXIT_OK


# ---------------------------------------------------------------------------
# inspect
# ---------------------------------------------------------------------------


def cmd_timeline(args, ui: _UI) -> int:
    from gradexplorer.app.window.timeline_window import launch_timeline

    return launch_timeline(args.file, args.screenshot, args.layer)


def cmd_inspect(args, ui: _UI) -> int:
    from gradexplorer.app.cli.watch import check_csv_target, cmd_inspect_log, is_watch_log
    from gradexplorer.files.capture_file import load_capture
    from gradexplorer.files.meta import capture_meta

    path = Path(args.file).expanduser()
    if getattr(args, "csv", None):
        check_csv_target(args.csv)
    if path.suffix == ".gxw" or is_watch_log(path):
        return cmd_inspect_log(path, getattr(args, "csv", None))
    if getattr(args, "csv", None):
        raise GradExplorerError("--csv exports watch logs (.gxw);", "leave out --csv for a capture file.")
    cap = load_capture(path)
    names = list(cap.layers)
    if args.layer:
        chosen = [n for n in names if n == args.layer or fnmatch.fnmatchcase(n, args.layer)]
        if not chosen:
            near = difflib.get_close_matches(args.layer, names, n=3)
            hint = f"near names: {', '.join(near)}; " if near else ""
            raise GradExplorerError(f"the capture has no layer '{args.layer}';",
                                    f"{hint}run 'gradexplorer inspect {args.file}' to list its layers.")
    else:
        chosen = names

    yes_no = {True: "yes", False: "no"}
    n_calls = sum(len(cap.layers[n].calls) for n in names)
    meta = capture_meta(cap)
    autocast = f"  autocast {meta.autocast}" if meta.autocast else ""
    header = [
        ("file", f"{path} ({human_size(path.stat().st_size)})"),
        ("model", f"{meta.model}  weights {meta.weights or 'random init'}"),
        ("target", (f"{meta.target}  device {meta.device}  dtype {meta.dtype}{autocast}  "
                    f"mode {meta.mode}  train {yes_no.get(meta.train, meta.train)}")),
        ("created", f"{meta.created}  torch {meta.torch_version}"),
        ("input", (f"{fmt_shape(tuple(cap.input.shape)) if cap.input is not None else '-'}"
                   f"  input grad {'yes' if cap.input_grad is not None else 'no'}"
                   + _all_inputs_text(cap.model_inputs))),
        ("layers", f"{len(names)} ({counted(n_calls, 'call')})"),
    ]
    if meta.batch:
        header.insert(4, ("batch", meta.batch))
    if meta.sample_names:
        shown = ", ".join(meta.sample_names[:6]) + (" ..." if len(meta.sample_names) > 6 else "")
        header.insert(5, ("samples", shown))
    if meta.labels is not None:
        header.insert(6, ("labels", ", ".join(_label_text(i, meta.categories) for i in meta.labels[:6])
                          + (" ..." if len(meta.labels) > 6 else "")))
    width = max(len(k) for k, _ in header)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in header))
    from gradexplorer.analysis.summary import summarize

    onset = _onset_lines(cap, summarize(cap).layers_with("nan/inf"))
    if onset:
        print("\n".join(onset))
    print()

    rows = []
    for name in chosen:
        rec = cap.layers[name]
        if not rec.calls:
            rows.append([name, "-", rec.type, "-", "-", "-", "-", "-", "-", "-", "not called"])
        for i, call in enumerate(rec.calls):
            act = call.stats.get("activation") or {}
            grad = call.stats.get("grad_output")
            flags = _flags(call.stats)
            g = grad or {}
            rows.append([
                name, str(i), rec.type, fmt_shape(call.shape),
                fmt_num(act.get("mean")), fmt_num(act.get("std")),
                fmt_num(g.get("l2")), fmt_num(g.get("mean_abs")), fmt_num(_max_abs(g) if grad else None),
                f"{g['zero_fraction'] * 100:.1f}" if grad else "-",
                flags,
            ])
    print(table(
        ["LAYER", "CALL", "TYPE", "SHAPE", "ACT MEAN", "ACT STD", "GRAD L2", "MEAN|G|", "MAX|G|", "G ZERO%", "FLAGS"],
        rows, "lrllrrrrrrl",
    ))
    if args.layer:
        for name in chosen:
            _print_layer_details(name, cap.layers[name])
    return EXIT_OK


def _all_inputs_text(model_inputs: dict | None) -> str:
    """``"  (all inputs: 2 positional 2x3x8x8, 2x3x8x8; mask 2x8)"`` for a model of several inputs."""
    if not model_inputs:
        return ""

    def shown(v) -> str:
        return fmt_shape(tuple(v.shape)) if hasattr(v, "shape") else type(v).__name__

    parts = []
    if model_inputs["args"]:
        parts.append(f"{len(model_inputs['args'])} positional " + ", ".join(shown(v) for v in model_inputs["args"]))
    parts += [f"{k} {shown(v)}" for k, v in model_inputs["kwargs"].items()]
    return f"  (all inputs: {'; '.join(parts)})"


def _label_text(index: int, categories) -> str:
    if categories and 0 <= index < len(categories):
        return f"{index} ({categories[index]})"
    return str(index)


def _max_abs(stats: dict) -> float:
    return max(abs(stats["min"]), abs(stats["max"]))


def _flags(stats: dict) -> str:
    from gradexplorer.analysis.gradient_flow import call_flags

    flags = []
    for kind, short in (("activation", "act"), ("grad_output", "grad"), ("grad_input", "grad in")):
        s = stats.get(kind)
        counts = [f"{s[key]} {word}" for key, word in (("nan_count", "NaN"), ("inf_count", "Inf")) if s and s[key]]
        if counts:
            flags.append(f"{short}: {' '.join(counts)}")
        if s and s.get("overflow"):  # the statistic is beyond float64, not the data
            flags.append(f"{short}: {'/'.join(s['overflow'])} beyond float64")
    words = {"no gradient": "no grad", "zero": "zero grad"}
    flags += [words[f] for f in call_flags(stats) if f in words]
    return "; ".join(flags)


def _stat_row(label: str, s: dict | None) -> list[str]:
    if not s:
        return [label] + ["-"] * 10
    return [
        label, str(s["numel"]), fmt_num(s["min"]), fmt_num(s["max"]), fmt_num(s["mean"]), fmt_num(s["std"]),
        fmt_num(s["mean_abs"]), fmt_num(s["l2"]), f"{s['zero_fraction'] * 100:.1f}",
        str(s["nan_count"]), str(s["inf_count"]),
    ]


def _print_layer_details(name: str, rec) -> None:
    headers = ["TENSOR", "NUMEL", "MIN", "MAX", "MEAN", "STD", "MEAN|X|", "L2", "ZERO%", "NaN", "Inf"]
    for i, call in enumerate(rec.calls):
        print(f"\n{name} ({rec.type}), call {i}: output {fmt_shape(call.shape)} {call.dtype}"
              + (f", output element '{call.output_key}'" if call.output_key else ""))
        rows = [_stat_row(kind, call.stats.get(kind)) for kind in ("activation", "grad_output", "grad_input")]
        print(table(headers, rows, "lrrrrrrrrrr"))
    if rec.param_stats:
        print(f"\n{name} parameter gradients:")
        rows = [_stat_row(pname, s) for pname, s in rec.param_stats.items()]
        print(table(headers, rows, "lrrrrrrrrrr"))


# ---------------------------------------------------------------------------
# devices
# ---------------------------------------------------------------------------


def cmd_devices(args, ui: _UI) -> int:
    from gradexplorer.base.devices import list_devices, resolve_device

    devices = list_devices()
    auto = str(resolve_device("auto"))
    rows = [
        [d.name + (" (auto)" if d.name == auto else ""), d.label, human_size(d.total_memory), human_size(d.free_memory)]
        for d in devices
    ]
    print(table(["DEVICE", "DESCRIPTION", "MEMORY", "FREE"], rows, "llrr"))
    return EXIT_OK


# ---------------------------------------------------------------------------
# The desktop app
# ---------------------------------------------------------------------------


def cmd_gui(args, parser: argparse.ArgumentParser, ui: _UI) -> int:
    if args.input and args.random:
        raise UsageError("--input and --random cannot be used together; see 'gradexplorer --help'.")
    if args.screenshot:
        folder = Path(args.screenshot).expanduser().parent
        if str(folder) and not folder.is_dir():
            raise GradExplorerError(f"the folder '{folder}' of --screenshot does not exist;",
                                    "create it first or choose another path.")
    model_only = [f for f, v in (("--weights", args.weights), ("--arch", args.arch)) if v]
    if model_only and not args.model:
        raise UsageError(f"{model_only[0]} needs --model; see 'gradexplorer --help'.")
    if args.open:
        _check_capture_to_open(args)
        options, run = None, False
    else:
        from gradexplorer.models.demos import WINDOW_DEMO

        # The capture command's options from the same words; without --model the demo, run at once.
        run = bool(args.run) or not args.model
        options = capture_options(argparse.Namespace(**{**vars(args), "model": args.model or WINDOW_DEMO}))
    _refuse_broken_pyside()
    try:
        from gradexplorer.app.window.launch import launch  # Qt is imported here and only here
    except ImportError as exc:
        raise GradExplorerError(
            f"the desktop app cannot start ({exc});",
            "install gradexplorer with its GUI dependencies (make run does), or use a subcommand: "
            "gradexplorer --help.",
        ) from exc
    capture = str(Path(args.open).expanduser()) if args.open else None
    return int(launch(options, run=run, screenshot=args.screenshot, capture=capture) or 0)


def _check_capture_to_open(args) -> None:
    """A capture file opens on its own: it needs no model, input or run, and must exist
    (whether it is a capture is told when the window reads it, off the UI thread)."""
    given = [flag for flag, value in (("--model", args.model), ("--input", args.input), ("--random", args.random),
                                      ("--run", args.run)) if value]
    if given:
        raise UsageError(f"a capture file ('{args.open}') opens without a model or a run; leave out "
                         f"{given[0]}, or run 'gradexplorer --model ...' to capture anew.")
    path = Path(args.open).expanduser()
    if not path.is_file():
        near = difflib.get_close_matches(args.open, SUBCOMMANDS, n=1)
        hint = f"did you mean the command '{near[0]}'? " if near else ""
        raise GradExplorerError(f"there is no file '{args.open}' to open;",
                                f"{hint}give a capture file (.pt) or a command: gradexplorer --help.")


def _refuse_broken_pyside() -> None:
    """PySide6 6.12.0 drops a reference to None on every Qt call that returns nothing; on
    Python < 3.12 (where None is not immortal) the app then crashes after a few thousand
    clicks. pyproject.toml excludes it; this catches an environment set up by hand."""
    from importlib import metadata

    try:
        version = metadata.version("PySide6-Essentials")
    except metadata.PackageNotFoundError:
        try:
            version = metadata.version("PySide6")
        except metadata.PackageNotFoundError:
            return
    if version == "6.12.0" and sys.version_info < (3, 12):
        raise GradExplorerError(
            f"PySide6 {version} has a reference-counting bug that crashes on Python "
            f"{sys.version_info[0]}.{sys.version_info[1]};",
            "install another release (pip install 'PySide6-Essentials!=6.12.0') or use Python 3.12+.",
        )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
