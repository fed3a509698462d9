"""``gradexplorer devices``: the devices a capture can run on, with their memory.

The engine is imported inside the command, for start-up time: the parser of every
command is built at start.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gradexplorer_app.cli.common import EXIT_OK, UI, add_common
from gradexplorer_app.cli.format import human_size, table

if TYPE_CHECKING:
    from gradexplorer_app.cli.common import SubParsers


def register(sub: SubParsers) -> None:
    """Add the ``devices`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("devices", help="list the devices a capture can run on",
                       description="List the devices a capture can run on, with their memory.")
    add_common(p)
    p.set_defaults(func=cmd_devices)


def cmd_devices(args: argparse.Namespace, ui: UI) -> int:
    """Run ``gradexplorer devices``; returns the exit status."""
    from gradexplorer.base.devices import list_devices, resolve_device

    devices = list_devices()
    auto = str(resolve_device("auto"))
    rows = [
        [d.name + (" (auto)" if d.name == auto else ""), d.label, human_size(d.total_memory), human_size(d.free_memory)]
        for d in devices
    ]
    print(table(["DEVICE", "DESCRIPTION", "MEMORY", "FREE"], rows, "llrr"))
    return EXIT_OK
