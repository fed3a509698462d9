"""The documentation inside the repository stays true to the code: what the code cites
exists here, and README's "Project layout" names every module (and nothing that is gone)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE_FOLDERS = ("core", "app", "tests", "benchmarks", "scripts")


def _layout_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Project layout", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


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


def _modules() -> list[str]:
    """Every module and package of core/ and app/ that the layout should name."""
    names = []
    for folder in ("core", "app"):
        for path in sorted((ROOT / folder).iterdir()):
            if path.suffix == ".py" and path.stem not in ("__init__", "__main__"):
                names.append(f"{folder}/{path.name}")
            elif path.is_dir() and (path / "__init__.py").is_file():
                names.append(f"{folder}/{path.name}/")
    return names


def test_readme_layout_names_every_module():
    block = _layout_block()
    words = set(re.findall(r"[\w.]+/?", block))
    unnamed = [m for m in _modules() if m.split("/", 1)[1] not in words]
    assert not unnamed, (
        f"README.md's Project layout does not name {unnamed}: add each with a few words on what it is for"
    )


def test_readme_layout_names_nothing_that_is_gone():
    block = _layout_block()
    named = set(re.findall(r"\b([a-z_]\w*\.py)\b", block))
    existing = {p.name for folder in CODE_FOLDERS for p in (ROOT / folder).rglob("*.py")}
    existing |= {p.name for p in ROOT.glob("*.py")}
    gone = sorted(named - existing)
    assert not gone, f"README.md's Project layout names files that do not exist: {gone}"
