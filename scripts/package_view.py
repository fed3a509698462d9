"""The package ``gradexplorer`` laid out as one folder, for the tools that read files.

setup.py maps three folders into the package (``core/`` is ``gradexplorer``, ``app/`` is
``gradexplorer.app``, ``resources/`` is ``gradexplorer.resources``). Python follows that
mapping through the editable install's import finder, but mypy and grimp (import-linter)
walk folders: they are pointed at ``build/package/gradexplorer``, a folder of links to
the three, made afresh by :func:`lay_out`. :func:`repository_path` turns a path in the view
back into the repository's, for what the tools report.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VIEW = ROOT / "build" / "package"
PACKAGE = VIEW / "gradexplorer"
#: Where each folder of the package comes from (the same mapping as setup.py's FOLDERS).
LINKED = {"app": ROOT / "app", "resources": ROOT / "resources"}


def lay_out() -> Path:
    """Make ``build/package/gradexplorer`` anew; return ``build/package`` (for sys.path)."""
    if PACKAGE.is_symlink() or PACKAGE.is_file():
        PACKAGE.unlink()
    elif PACKAGE.exists():
        shutil.rmtree(PACKAGE)
    PACKAGE.mkdir(parents=True)
    for entry in sorted((ROOT / "core").iterdir()):
        if entry.name == "__pycache__" or entry.name in LINKED:
            continue
        (PACKAGE / entry.name).symlink_to(os.path.relpath(entry, PACKAGE))
    for name, target in LINKED.items():
        (PACKAGE / name).symlink_to(os.path.relpath(target, PACKAGE))
    return VIEW


def repository_path(text: str) -> str:
    """``text`` with every path into the view replaced by the repository's path."""
    for name in LINKED:
        text = text.replace(f"build/package/gradexplorer/{name}/", f"{name}/")
    return text.replace("build/package/gradexplorer/", "core/")
