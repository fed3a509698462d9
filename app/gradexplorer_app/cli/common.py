"""What the commands of ``gradexplorer`` share: exit codes, the usage error, what a running
command shows, the arguments several commands take, and the steps from a command line to a
capture job.

Every command module imports this one (and the engine); this module imports no command.

Exit codes: ``EXIT_OK`` 0 success; ``EXIT_USER`` 1 a problem with the user's input (one
line on stderr, ``error: <problem> <fix>``); ``EXIT_USAGE`` 2 a command-line usage error;
``EXIT_INTERNAL`` 70 a bug in gradexplorer (``error: internal error: ...``, the traceback
with ``--debug``); ``EXIT_INTERRUPTED`` 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradexplorer.base.errors import GradExplorerError
from gradexplorer_app.cli.format import ProgressBar

# Engine modules are imported inside the functions that use them (start-up time): main builds
# every command's parser at start, and each command then loads only the engine parts it runs.

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TypeAlias

    from gradexplorer.capturing.capture import ProgressCallback
    from gradexplorer.capturing.data import Capture
    from gradexplorer.pipeline.options import CaptureOptions

    #: The ``sub.add_parser(...)`` object each command module registers its subcommand on.
    SubParsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = [
    "PROG", "SUBCOMMANDS", "EXIT_OK", "EXIT_USER", "EXIT_USAGE", "EXIT_INTERNAL", "EXIT_INTERRUPTED",
    "UsageError", "UI",
    "add_model_args", "add_input_args", "add_memory_budget", "add_common",
    "job_options", "capture_options", "job_progress", "files_read", "check_out_path", "check_screenshot_target",
    "onset_lines",
]

PROG = "gradexplorer"
#: The subcommands, in the order ``--help`` lists them; any other first word names a capture file.
SUBCOMMANDS = ("capture", "models", "layers", "inspect", "timeline", "export", "devices", "diff", "graph")

EXIT_OK = 0
EXIT_USER = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """The command line itself is wrong (unknown option, missing value): exit 2."""


class UI:
    """What the running command shows on stderr: the progress bar and notes, unless quiet.

    Parameters
    ----------
    quiet : bool
        ``--quiet``: no progress bar and no notes (errors are still printed).
    """

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.bar = ProgressBar(sys.stderr, enabled=not quiet)

    def note(self, text: str) -> None:
        """A line of information on stderr (not part of the command's output)."""
        if not self.quiet:
            self.bar.close()
            print(text, file=sys.stderr, flush=True)

    def warn(self, text: str) -> None:
        """A warning on stderr, also under ``--quiet`` (something was left out)."""
        self.bar.close()
        print(f"warning: {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Arguments several commands take
# ---------------------------------------------------------------------------


def add_model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    """``--model`` (required unless ``required`` is false), ``--weights``, ``--arch``, ``--trust``."""
    p.add_argument(
        "--model", required=required, metavar="NAME|PATH|SPEC",
        help="a torchvision name (resnet18), a timm name (timm:resnet18), demo:shapes, demo:seed-mlp, "
             "a Hugging Face model hf:ORG/NAME or hf:FOLDER (save_pretrained), a checkpoint file, "
             "or a factory pkg.mod:fn / file.py:fn (needs --trust)",
    )
    p.add_argument("--hf-class", metavar="CLASS",
                   help="for hf: models, the transformers class (GPT2LMHeadModel, AutoModelForCausalLM) or a "
                        "task word (causal-lm, sequence-classification, token-classification, masked-lm, base); "
                        "default: the config's architectures")
    p.add_argument(
        "--weights", metavar="W",
        help="torchvision weights: DEFAULT, an enum name (IMAGENET1K_V1) or a local .pth file; "
             "timm: DEFAULT (from the Hugging Face cache, else downloaded); "
             "default: random initialisation",
    )
    p.add_argument("--arch", metavar="A", help="torchvision architecture of a weights-only checkpoint file")
    p.add_argument("--tokenizer", metavar="FOLDER|hf:ORG/NAME",
                   help="a tokenizer for --text, for a model that came without one (a factory that builds a "
                        "transformers model): a folder tokenizer.save_pretrained wrote, or hf:ORG/NAME")
    p.add_argument(
        "--trust", action="store_true",
        help="allow running code from the model source (pickled modules, .pt2 archives, factories)",
    )


def add_input_args(p: argparse.ArgumentParser) -> None:
    """One of ``--input FILE...``, ``--random [SHAPE]`` or ``--demo-input``."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--input", nargs="+", metavar="FILE",
                       help="image files or folders, or one .pt tensor file")
    group.add_argument(
        "--random", nargs="?", const="", metavar="SHAPE",
        help="a random batch (seed 0) of SHAPE, e.g. 2x3x224x224; without SHAPE two samples "
             "of the model's input shape",
    )
    group.add_argument("--demo-input", action="store_true", help="the demo model's own batch")
    group.add_argument("--text", action="append", metavar="TEXT",
                       help="a text sample, tokenised with the model's tokenizer (repeat for a batch; a .txt "
                            "file gives one sample a line)")
    p.add_argument("--skip-unreadable", action="store_true",
                   help="leave out pictures that cannot be read (each named in a warning) "
                        "instead of refusing the batch")


def add_memory_budget(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--memory-budget SIZE`` (read by :func:`capture_options`)."""
    p.add_argument("--memory-budget", metavar="SIZE",
                   help="memory the capture may use, e.g. 2GiB or 500MB (KiB/MiB/GiB: powers of 1024, "
                        "kB/MB/GB: of 1000); default: half of the free memory")


def add_common(p: argparse.ArgumentParser) -> None:
    """``--debug`` and ``-q/--quiet``, which every subcommand takes as well as the top level."""
    # SUPPRESS: a subcommand that does not see --debug must not reset the top-level one.
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the traceback of internal errors")
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                   help="no progress or notes on stderr")


# ---------------------------------------------------------------------------
# From a command line to a capture job
# ---------------------------------------------------------------------------


def job_options(args: argparse.Namespace, **settings: Any) -> CaptureOptions:
    """The capture options of a command line's model and input arguments, plus ``settings``
    (any other field of :class:`~gradexplorer.pipeline.options.CaptureOptions`)."""
    from gradexplorer.pipeline.options import BatchSpec, CaptureOptions

    # The window's flags (gradexplorer --model ...) have no --demo-input or --skip-unreadable.
    flag = vars(args).get
    batch = BatchSpec(inputs=tuple(args.input or ()), random=args.random, demo=bool(flag("demo_input")),
                      texts=tuple(args.text or ()), skip_unreadable=bool(flag("skip_unreadable")))
    return CaptureOptions(model=args.model, weights=args.weights, arch=args.arch, trust=bool(args.trust),
                          batch=batch, hf_class=args.hf_class, tokenizer=args.tokenizer, **settings)


def capture_options(args: argparse.Namespace) -> CaptureOptions:
    """The :class:`~gradexplorer.pipeline.options.CaptureOptions` of a ``capture`` command line, or of the
    desktop app's flags (``gradexplorer --model ... --run``: the same words give the same
    options; flags the app does not take keep their defaults).

    Raises
    ------
    GradExplorerError
        A setting that is not valid (a target that does not exist, a size that is not one...).
    """
    flag = vars(args).get  # the window's flags have no --train, --autocast or --force
    return job_options(
        args, labels=args.labels, layers=tuple(args.layers or ()), target=args.target or "top1",
        device=args.device or "auto", mode="stats" if args.stats_only else "full", train=bool(flag("train")),
        input_grad=bool(flag("input_grad")), autocast=flag("autocast"), memory_budget=_memory_budget(args),
        force=bool(flag("force")),
    )


def _memory_budget(args: argparse.Namespace) -> int | None:
    from gradexplorer.base.units import parse_size

    text = args.memory_budget
    if text is None:
        return None
    try:
        return parse_size(text)
    except GradExplorerError as exc:
        raise GradExplorerError(f"--memory-budget {exc.problem}", exc.fix) from None


def job_progress(ui: UI) -> ProgressCallback:
    """The job's progress callback ``(stage, done, total)``, drawn on the command's progress bar."""
    from gradexplorer.pipeline.job import STAGE_DOWNLOAD

    def on_progress(stage: str, done: int, total: int) -> None:
        if stage == STAGE_DOWNLOAD:
            ui.bar.update(stage, done, total or None, "B")
        elif stage in ("forward", "backward"):
            ui.bar.update(stage, done, total, "calls" if stage == "forward" else "grads")
        else:
            ui.bar.update(stage)

    return on_progress


def files_read(args: argparse.Namespace) -> list[str | None]:
    """What a command's flags name that may be files it reads: the model (a file, a folder,
    ``hf:FOLDER``, a factory's file), ``--weights``, ``--labels``, ``--tokenizer`` (a folder:
    every file in it), ``--input`` and ``--text`` (a ``.txt`` file of samples); names that
    are no file are passed over by the check."""
    return [args.model, args.weights, args.labels, args.tokenizer, *(args.input or ()), *(args.text or ())]


def check_out_path(args: argparse.Namespace) -> Path:
    """``--out``, refused before anything runs when it cannot be written, lies in a model
    cache, or is one of the files the capture reads (gradexplorer.base.file_write.check_output_path)."""
    from gradexplorer.base.file_write import check_output_path

    return check_output_path(args.out, files_read(args))


def check_screenshot_target(path: str, inputs: Sequence[str | None]) -> Path:
    """``--screenshot``, refused before the window opens: a missing folder, a folder, a socket
    or disk, or one of the files the window reads (by inode: links and hard links too)."""
    from gradexplorer.base.file_write import check_output_path

    folder = Path(path).expanduser().parent
    if str(folder) and not folder.is_dir():
        raise GradExplorerError(f"the folder '{folder}' of --screenshot does not exist;",
                                "create it first or choose another path.")
    return check_output_path(path, inputs)


def onset_lines(cap: Capture, flagged: list[str]) -> list[str]:
    """Where NaN/Inf began (forward, then backward), then how far it spread: the lines that
    ``capture`` and ``inspect`` print under their summary (none when all is finite)."""
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
