"""The documentation inside the repository stays true to the code: what the code cites
exists here, and the Layout of docs/ARCHITECTURE.md names every module (and nothing that
is gone)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE_FOLDERS = ("core", "app", "tests", "benchmarks", "scripts")


def _layout_block() -> str:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


_ENTRY = re.compile(r"^[\w.]+/?$")


def _layout_paths() -> set[str]:
    """The paths the layout names, read as a tree: two spaces of indent per folder level;
    a line starts with one or more names (``a.py, b.py``) and then, after two spaces, what
    they are for. Lines that start with no such name continue the line above."""
    paths: set[str] = set()
    folders: list[tuple[int, str]] = []
    for line in _layout_block().splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        names = [n.strip() for n in re.split(r"\s{2,}", line.strip(), maxsplit=1)[0].split(",")]
        names = [n.split(" ", 1)[0] for n in names]
        if not names or not all(_ENTRY.match(n) and n.endswith(("/", ".py")) for n in names):
            continue
        while folders and folders[-1][0] >= indent:
            folders.pop()
        prefix = "".join(f for _, f in folders)
        for name in names:
            paths.add(prefix + name)
        if len(names) == 1 and names[0].endswith("/"):
            folders.append((indent, names[0]))
    return paths


def _modules() -> list[str]:
    """Every module and package of core/ and app/ that the layout should name, as a path."""
    names = []
    for folder in ("core", "app"):
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if "__pycache__" in rel:
                continue
            if path.suffix == ".py" and path.stem != "__init__":
                names.append(rel)
            elif path.is_dir() and (path / "__init__.py").is_file():
                names.append(rel + "/")
    return names


def test_documents_cited_by_the_code_are_in_the_repository():
    cited = {}
    for folder in CODE_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            for name in re.findall(r"\b([A-Za-z][\w-]*\.md)\b", path.read_text(encoding="utf-8")):
                cited.setdefault(name, []).append(str(path.relative_to(ROOT)))
    present = {p.name for p in ROOT.glob("*.md")} | {p.name for p in (ROOT / "docs").glob("*.md")}
    missing = {name: files for name, files in cited.items() if name not in present}
    assert not missing, (
        f"code cites documents that are not in this repository: {missing}. Write what the code "
        "needs in its docstring, or in docs/ARCHITECTURE.md and cite that."
    )


def test_layout_names_every_module():
    named = _layout_paths()
    unnamed = [m for m in _modules() if m not in named]
    assert not unnamed, (
        f"docs/ARCHITECTURE.md's Layout does not name {unnamed}: add each under its folder, "
        "with a few words on what it is for"
    )


def test_layout_names_nothing_that_is_gone():
    gone = sorted(p for p in _layout_paths() if not (ROOT / p.rstrip("/")).exists())
    assert not gone, f"docs/ARCHITECTURE.md's Layout names files that do not exist: {gone}"
