"""``gradexplorer layers``: a model's module tree, the names ``--layers`` takes; with
``--probe`` also calls, output shapes and in-place modules.

The engine is imported inside the command, for start-up time (``gradexplorer --help``
loads no torch).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.units import counted
from gradexplorer_app.cli.common import (
    EXIT_OK,
    UI,
    add_common,
    add_input_args,
    add_model_args,
    job_options,
    job_progress,
)
from gradexplorer_app.cli.format import fmt_shape, table

if TYPE_CHECKING:
    from gradexplorer_app.cli.common import SubParsers


def register(sub: SubParsers) -> None:
    """Add the ``layers`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("layers", help="show a model's module tree",
                       description="Show a model's module tree: names to use with --layers, types, "
                                   "parameters; with --probe also calls, output shapes and in-place modules.")
    add_model_args(p)
    p.add_argument("--depth", type=int, metavar="N", help="show modules down to this depth (root = 0)")
    p.add_argument("--probe", action="store_true",
                   help="run one forward (no gradients) to learn calls, output shapes, in-place modules")
    add_input_args(p)
    add_common(p)
    p.set_defaults(func=cmd_layers)


def cmd_layers(args: argparse.Namespace, ui: UI) -> int:
    """Run ``gradexplorer layers``; returns the exit status."""
    from gradexplorer.capturing.module_tree import ModuleTree

    if args.depth is not None and args.depth < 0:
        raise GradExplorerError(f"--depth {args.depth} is negative;", "give 0 (the model only) or more.")
    from dataclasses import replace

    from gradexplorer.pipeline.job import STAGE_PROBE, CaptureJob, default_batch_spec

    options = job_options(args)
    job = CaptureJob(options, job_progress(ui))
    loaded = job.load_model()
    tree = ModuleTree.build(loaded.module)
    if args.probe:
        default = default_batch_spec(loaded, n=1) if options.batch.is_default else None
        if default is not None:  # one sample: the OUTPUT column reads per sample
            job = CaptureJob(replace(options, batch=default), job_progress(ui), loaded=loaded)
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
    n_trainable = sum(p.numel() for p in loaded.module.parameters() if p.requires_grad)
    summary = (f"\n{loaded.name} ({tree.model_type}): {counted(len(tree) - 1, 'module')}, "
               f"{counted(len(tree.leaves()), 'leaf', 'leaves')}, {counted(root.total_params, 'parameter')} "
               f"({n_trainable:,} trainable)")
    if tree.probed:
        inplace = sum(1 for n in tree if n.inplace)
        reused = sum(1 for n in tree if n.reused)
        summary += (f"; {counted(tree.expected_calls() or 0, 'module call')} per forward, {inplace} in-place, "
                    f"{reused} reused")
    print(summary)
    return EXIT_OK
