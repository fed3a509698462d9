"""``gradexplorer models``: torchvision's models, their weights and which are in the local cache.

The engine is imported inside the command, for start-up time (``gradexplorer --help``
loads no torch).
"""

from __future__ import annotations

import argparse
import difflib
from typing import TYPE_CHECKING

from gradexplorer.base.errors import GradExplorerError
from gradexplorer_app.cli.common import EXIT_OK, UI, add_common
from gradexplorer_app.cli.format import can_encode, table

if TYPE_CHECKING:
    from gradexplorer_app.cli.common import SubParsers


def register(sub: SubParsers) -> None:
    """Add the ``models`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("models", help="list torchvision models and which weights are cached",
                       description="List torchvision models, their weights and which are in the local cache.")
    p.add_argument("--task", metavar="TASK", help="only this task (classification, segmentation, video, ...)")
    p.add_argument("--cached", action="store_true", help="only models with weights in the cache")
    add_common(p)
    p.set_defaults(func=cmd_models)


def cmd_models(args: argparse.Namespace, ui: UI) -> int:
    """Run ``gradexplorer models``; returns the exit status."""
    from gradexplorer.models.hub import hub_cache_dir
    from gradexplorer.models.timm_models import timm_available, timm_catalog
    from gradexplorer.models.weights import cache_dir, model_catalog

    catalog = model_catalog()
    tasks = sorted({info.task for info in catalog} | ({"timm"} if timm_available() else set()))
    # timm's ~1,300 names are listed only when asked for (--task timm).
    if args.task and args.task.strip().lower() == "timm":
        catalog = timm_catalog()
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
        ] or ([f"{info.default_weights}*"] if info.default_weights and info.task == "timm" else [])
        cached = ", ".join(_member(w) for w in info.cached)
        rows.append([info.name, info.task, ", ".join(names) or "-", f"{check} {cached}" if cached else ""])
    if rows:
        print(table(["MODEL", "TASK", "WEIGHTS", "CACHED"], rows))
    n_cached = sum(1 for info in catalog if info.cached)
    folder = hub_cache_dir() if args.task and args.task.strip().lower() == "timm" else cache_dir()
    more = " timm models: --task timm." if timm_available() and not args.task else ""
    print(f"\n{len(catalog)} models, {n_cached} with cached weights. * default weights. "
          f"Cache folder: {folder}{more}")
    return EXIT_OK


def _member(weights_name: str) -> str:
    return weights_name.rpartition(".")[2]
