"""``gradexplorer timeline``: a watch log or a dataset capture over steps, in a window.

The only command that opens a window: the window is imported inside the command, so that
no other command loads Qt (an import-linter contract allows this one import).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gradexplorer_app.cli.common import UI, add_common, check_screenshot_target

if TYPE_CHECKING:
    from gradexplorer_app.cli.common import SubParsers


def register(sub: SubParsers) -> None:
    """Add the ``timeline`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("timeline", help="open the timeline of a watch log or a dataset capture",
                       description="Layers x steps of a watch log (.gxw, followed live while it grows) or of a "
                                   "dataset capture's per-batch series, in a window.")
    p.add_argument("file", metavar="RUN.gxw|DATASET.pt")
    p.add_argument("--layer", metavar="NAME", help="the layer whose histograms to show first")
    p.add_argument("--screenshot", metavar="PNG", help="save the window once drawn, then quit")
    add_common(p)
    p.set_defaults(func=cmd_timeline)


def cmd_timeline(args: argparse.Namespace, ui: UI) -> int:
    """Open the timeline window; returns its exit status.

    A watch log is checked (``gradexplorer.recording.watch_log.open_log``: its tables,
    types, blobs and JSON) before the window opens, so that a damaged one is one message
    and exit 1, as ``inspect`` says it."""
    if args.screenshot:
        check_screenshot_target(args.screenshot, [args.file])
    from gradexplorer.recording.watch_log import is_watch_log, open_log

    path = Path(args.file).expanduser()
    if path.is_file() and (path.suffix == ".gxw" or is_watch_log(path)):
        open_log(path).close()
    from gradexplorer_app.window.timeline_window import launch_timeline  # Qt: this command only

    return launch_timeline(args.file, args.screenshot, args.layer)
