"""The package ``gradexplorer`` laid out as one folder, for the tools that read files.

setup.py maps three folders into the package (``core/`` is ``gradexplorer``, ``app/`` is
``gradexplorer.app``, ``resources/`` is ``gradexplorer.resources``). Python follows that
mapping through the editable install's import finder, but mypy and grimp (import-linter)
walk folders: they are pointed at ``build/package/gradexplorer``, a folder of links to
the three, made afresh by :func:`lay_out` (copies where the system refuses links, as
Windows does without Developer Mode). :func:`repository_path` turns a path in the view
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


def lay_out(view: Path = VIEW) -> Path:
    """Make ``VIEW/gradexplorer`` anew (``build/package`` unless told otherwise: a test lays
    out its own, so that it never races with a ``make lint``); return ``view`` (for
    sys.path)."""
    package = view / "gradexplorer"
    if package.is_symlink() or package.is_file():
        package.unlink()
    elif package.exists():
        shutil.rmtree(package)
    package.mkdir(parents=True)
    entries = [(entry.name, entry) for entry in sorted((ROOT / "core").iterdir())
               if entry.name != "__pycache__" and entry.name not in LINKED]
    for name, target in [*entries, *LINKED.items()]:
        _link(package / name, target)
    return view


def _link(path: Path, target: Path) -> None:
    try:
        path.symlink_to(os.path.relpath(target, path.parent), target_is_directory=target.is_dir())
    except OSError:  # no symbolic links here: a copy serves (it is laid out anew every run)
        if target.is_dir():
            shutil.copytree(target, path, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(target, path)


def repository_path(text: str) -> str:
    """``text`` with every path into the view replaced by the repository's path."""
    for name in LINKED:
        text = text.replace(f"build/package/gradexplorer/{name}/", f"{name}/")
    return text.replace("build/package/gradexplorer/", "core/")
