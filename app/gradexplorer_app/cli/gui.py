"""``gradexplorer`` without a subcommand: the desktop app, on the capture command's options.

``gradexplorer --model X --run`` opens the window and runs the capture the same words give
``gradexplorer capture``; ``gradexplorer CAPTURE.pt`` (or ``--open CAPTURE.pt``) opens a
capture file. The window (and so Qt) is imported inside :func:`cmd_gui` only, so that no
subcommand loads Qt (an import-linter contract allows this one import).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from gradexplorer.base.errors import GradExplorerError
from gradexplorer_app.cli.common import (
    SUBCOMMANDS,
    UI,
    UsageError,
    add_memory_budget,
    capture_options,
    check_screenshot_target,
    files_read,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the desktop app's flags to the top-level parser (those of ``capture`` that the
    window takes, and its own)."""
    gui = parser.add_argument_group("desktop app (no subcommand)")
    gui.add_argument("--model", metavar="NAME|PATH|SPEC", help="open this model (default: demo:shapes)")
    gui.add_argument("--weights", metavar="W", help="its weights (DEFAULT, an enum name, a .pth file)")
    gui.add_argument("--arch", metavar="A", help="architecture of a weights-only checkpoint file")
    gui.add_argument("--trust", action="store_true", help="allow running code from the model source")
    gui.add_argument("--hf-class", metavar="CLASS",
                     help="for hf: models, the transformers class or a task word (causal-lm, base...)")
    gui.add_argument("--tokenizer", metavar="FOLDER|hf:ORG/NAME",
                     help="a tokenizer for --text, for a model that came without one (a factory or checkpoint "
                          "that builds a transformers model): a folder tokenizer.save_pretrained wrote, or "
                          "hf:ORG/NAME")
    gui.add_argument("--input", nargs="+", metavar="FILE", help="image files, a folder or a .pt tensor")
    gui.add_argument("--random", metavar="SHAPE", help="a random batch of SHAPE, e.g. 2x3x224x224")
    gui.add_argument("--text", action="append", metavar="TEXT",
                     help="a text sample for a model with a tokenizer (repeat for a batch; a .txt file: one a line)")
    gui.add_argument("--labels", metavar="LABELS", help="class indices or names for the batch, e.g. 3,1,0")
    gui.add_argument("--layers", nargs="+", metavar="PATTERN", help="layers to tick: names or globs ('layer4.*')")
    gui.add_argument("--target", metavar="T",
                     help="top1, class:N, sum, mean or cross_entropy, optionally ,dim=-1 (classes last) "
                          "and @key")
    gui.add_argument("--device", metavar="D", help="auto, cpu, cuda:0, mps")
    gui.add_argument("--stats-only", action="store_true", help="capture statistics only")
    gui.add_argument("--input-grad", action="store_true",
                     help="also the gradient with respect to the input (saliency)")
    add_memory_budget(gui)
    gui.add_argument("--run", action="store_true", help="run a capture once the window is open")
    gui.add_argument("--screenshot", metavar="PNG", help="save the window once the run has rendered, then quit")
    gui.add_argument("--open", metavar="CAPTURE.pt",
                     help="open a capture file in the window (also: gradexplorer CAPTURE.pt)")


def cmd_gui(args: argparse.Namespace, ui: UI) -> int:
    """Check the desktop app's flags, then open the window; returns its exit status."""
    if sum(bool(v) for v in (args.input, args.random, args.text)) > 1:
        raise UsageError("--input, --random and --text cannot be used together; see 'gradexplorer --help'.")
    if args.screenshot:
        check_screenshot_target(args.screenshot, [args.open, *files_read(args)])
    model_only = [f for f, v in (("--weights", args.weights), ("--arch", args.arch),
                                 ("--hf-class", args.hf_class), ("--tokenizer", args.tokenizer)) if v]
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
        from gradexplorer_app.window.launch import launch  # Qt is imported here and only here
    except ImportError as exc:
        raise GradExplorerError(
            f"the desktop app cannot start ({exc});",
            "install gradexplorer with its GUI dependencies (make run does), or use a subcommand: "
            "gradexplorer --help.",
        ) from exc
    capture = str(Path(args.open).expanduser()) if args.open else None
    return int(launch(options, run=run, screenshot=args.screenshot, capture=capture) or 0)


def _check_capture_to_open(args: argparse.Namespace) -> None:
    """A capture file opens on its own: it needs no model, input or run, and must exist
    (whether it is a capture is told when the window reads it, off the UI thread)."""
    given = [flag for flag, value in (("--model", args.model), ("--input", args.input), ("--random", args.random),
                                      ("--text", args.text), ("--run", args.run)) if value]
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
