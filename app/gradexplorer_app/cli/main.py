"""The ``gradexplorer`` command: the parser, the entry point :func:`main` and the dispatch.

Each subcommand lives in a module named for it (``capture``, ``models``, ``layers``,
``inspect``, ``timeline``, ``export``, ``devices``, ``diff``, ``graph``), which registers its parser
and runs it; without a subcommand the desktop app opens (``gui``). Subcommands call the
same engine functions as the window and never import Qt. What the commands share, the
exit codes among it, is ``gradexplorer_app.cli.common``.

Exit codes: 0 success; 1 a problem with the user's input (one line on stderr,
``error: <problem> <fix>``); 2 a command-line usage error; 70 a bug in gradexplorer
(``error: internal error: ...``, the traceback with ``--debug``); 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from gradexplorer.base.errors import GradExplorerError, plain_text
from gradexplorer_app.cli import capture, devices, diff, export, graph, gui, inspect, layers, models, timeline
from gradexplorer_app.cli.common import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_USER,
    PROG,
    SUBCOMMANDS,
    UI,
    UsageError,
    add_common,
)

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse prints the usage and exits; the CLI's contract is one line on stderr.
        raise UsageError(f"{message}; see '{self.prog} --help'.")


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
    add_common(parser)
    gui.add_arguments(parser)

    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    # In the order of SUBCOMMANDS, which --help lists.
    for command in (capture, models, layers, inspect, timeline, export, devices, diff, graph):
        command.register(sub)
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
    ui: UI | None = None
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # --help, --version
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        debug = bool(args.debug)
        ui = UI(quiet=bool(args.quiet))
        if args.func is None:
            return gui.cmd_gui(args, ui)
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
    # Plain text: an exception may quote a file's bytes or a library's coloured advice.
    return " ".join(plain_text(str(text)).split())


def _error(ui: UI | None, message: str) -> None:
    if ui is not None:
        ui.bar.clear()
    print(f"error: {_one_line(message)}", file=sys.stderr, flush=True)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
