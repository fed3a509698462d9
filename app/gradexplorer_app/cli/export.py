"""``gradexplorer export RUN.gxw``: a watch log as TensorBoard event files, CSV or Parquet.

``--tensorboard DIR`` writes one event file into DIR (``gradexplorer.recording.tensorboard``:
scalars per parameter and layer, the log's histograms); ``--csv FILE`` and ``--parquet FILE``
every row of the log in one table (``gradexplorer.recording.timeline.export_csv``,
``gradexplorer.recording.log_frame``). Several at once are fine.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gradexplorer.base.errors import GradExplorerError
from gradexplorer_app.cli.common import EXIT_OK, UI, UsageError, add_common

if TYPE_CHECKING:
    from gradexplorer_app.cli.common import SubParsers

# Engine modules are imported inside cmd_export (start-up time: every command's parser is
# built at start).


def register(sub: SubParsers) -> None:
    """Add the ``export`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("export", help="write a watch log as TensorBoard event files, CSV or Parquet",
                       description="Write a watch log (.gxw) for other tools: TensorBoard event files (scalars "
                                   "grouped per kind: grad_l2/, update_ratio/, activation_std/, ...; the log's "
                                   "histograms), or every row in one CSV or Parquet table.")
    p.add_argument("file", metavar="RUN.gxw")
    p.add_argument("--tensorboard", metavar="DIR", help="write one TensorBoard event file into this folder "
                                                        "(made when missing; exporting again replaces it)")
    p.add_argument("--csv", metavar="FILE", help="every row of the log (histograms as counts from hist_lo)")
    p.add_argument("--parquet", metavar="FILE", help="every row of the log (histograms as lists); needs pyarrow")
    add_common(p)
    p.set_defaults(func=cmd_export)


def _check_target(out: str, source: Path, flag: str) -> None:
    from gradexplorer.base.file_write import check_output_path

    folder = Path(out).expanduser().parent
    if not folder.is_dir():
        raise GradExplorerError(f"the folder '{folder}' of {flag} does not exist;",
                                "create it first or choose another path.")
    check_output_path(out, [source])


def cmd_export(args: argparse.Namespace, ui: UI) -> int:
    """Write what the flags ask for; returns the exit status."""
    if not (args.tensorboard or args.csv or args.parquet):
        raise UsageError("say what to write: --tensorboard DIR, --csv FILE or --parquet FILE")
    from gradexplorer.recording.watch_log import open_log

    source = Path(args.file).expanduser()
    open_log(source).close()  # a missing or damaged log is one message before anything is written
    for flag, out in (("--csv", args.csv), ("--parquet", args.parquet)):
        if out:
            _check_target(out, source, flag)
    if args.tensorboard:
        from gradexplorer.base.file_write import check_outside_model_caches

        tb = check_outside_model_caches(args.tensorboard)  # every output refused before any is written
        if tb.exists() and not tb.is_dir():
            raise GradExplorerError(f"--tensorboard {tb} exists and is not a folder;",
                                    "TensorBoard reads a folder of event files: pass a new or existing folder.")
    if args.tensorboard:
        from gradexplorer.recording.tensorboard import export_tensorboard

        written = export_tensorboard(source, args.tensorboard)
        print(f"wrote TensorBoard events to {written.resolve()}")
        ui.note(f"view them with: tensorboard --logdir {Path(args.tensorboard).expanduser()}")
    if args.csv:
        from gradexplorer.recording.timeline import export_csv

        print(f"wrote CSV to {export_csv(source, args.csv).resolve()}")
    if args.parquet:
        from gradexplorer.recording.log_frame import export_parquet

        print(f"wrote Parquet to {export_parquet(source, args.parquet).resolve()}")
    return EXIT_OK
