"""The documentation inside the repository stays true to the code: what the code cites
exists here; the Layout of docs/ARCHITECTURE.md names every module (and nothing that is
gone); every ```python block of README.md and docs/*.md runs (or says in its first line
why it is not run); every relative link, file path, module and public name the pages
cite exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import gradexplorer

ROOT = Path(__file__).resolve().parents[1]
CODE_FOLDERS = ("core", "app", "tests", "benchmarks", "scripts")
#: The user's pages: the front page and the guide.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: The first line of a ```python block that is shown but not run: ``# not run: <why>``.
NOT_RUN = re.compile(r"^#\s*not run:\s*(\S.*)$")
#: Fewer runnable examples than this means the reader of the blocks is broken.
MIN_BLOCKS_RUN = 5


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


# --- the pages: examples, links, paths, modules and public names ---------------------------


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str  # the comment just above the fence, "" if none

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page, in order."""
    blocks: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(`{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i])
            i += 1
        marker = lines[start - 1].strip() if start else ""
        blocks.append(Block(page, start + 1, lang, "\n".join(body) + "\n", marker))
        i += 1
    return blocks


def _python_blocks() -> list[Block]:
    return [b for page in PAGES for b in _blocks(page) if b.lang in ("python", "py")]


def _not_run_reason(block: Block) -> str | None:
    first = block.code.lstrip("\n").split("\n", 1)[0]
    m = NOT_RUN.match(first.strip())
    return m.group(1) if m else None


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory) -> dict[str, tuple[Block, subprocess.CompletedProcess]]:
    """Run every unmarked python block, each in a fresh interpreter, on the CPU, without a
    GPU. The blocks of one page run in order in one folder of their own, as a reader runs
    them in a notebook: a later block may read a file an earlier one wrote."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", QT_QPA_PLATFORM="offscreen",
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    runs: dict[str, tuple[Block, subprocess.CompletedProcess]] = {}
    folders: dict[Path, Path] = {}
    for n, block in enumerate(_python_blocks()):
        if _not_run_reason(block) is not None:
            continue
        folder = folders.setdefault(block.page, tmp_path_factory.mktemp(block.page.stem))
        script = folder / f"example_{n}.py"
        script.write_text(block.code, encoding="utf-8")
        runs[block.where] = (block, subprocess.run(
            [sys.executable, str(script)], cwd=folder, env=env, capture_output=True, text=True, timeout=600))
    return runs


def test_python_blocks_that_are_not_run_say_why_and_compile():
    for block in _python_blocks():
        first = block.code.lstrip("\n").split("\n", 1)[0]
        if re.match(r"^#\s*not run\b", first.strip()):
            assert _not_run_reason(block), f"{block.where}: say why it is not run: '# not run: <reason>'"
        compile(block.code, block.where, "exec")  # a block shown is at least Python


@pytest.mark.slow
def test_every_python_example_runs(example_runs):
    failed = [f"{where}:\n{proc.stderr[-2000:]}" for where, (_, proc) in example_runs.items() if proc.returncode]
    assert not failed, "these examples fail as printed (fix them, or mark them '# not run: <reason>'):\n" + \
        "\n\n".join(failed)
    assert len(example_runs) >= MIN_BLOCKS_RUN, (
        f"only {len(example_runs)} python examples ran: the pages or the reader of their blocks changed")


@pytest.mark.slow
def test_the_watch_example_watches_the_steps_and_layers_it_names(example_runs):
    """The watch example (marked ``<!-- watch-example -->``) is short, and records steps
    0, 10 and 20 of layer4's modules."""
    marked = [b for b in _python_blocks() if b.marker == "<!-- watch-example -->"]
    assert len(marked) == 1, "the guide lost its watch example (<!-- watch-example --> above a python block)"
    block, proc = example_runs[marked[0].where]
    assert len(block.code.strip().splitlines()) <= 20
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert {line.split()[0] for line in lines} == {"0", "10", "20"}
    assert any("layer4.1.conv2" in line for line in lines)


def _prose(page: Path) -> str:
    """The page without its fenced blocks (links inside code are not links)."""
    return re.sub(r"^(`{3,}).*?^\1\s*$", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", _prose(page), flags=re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_relative_links_point_at_files_and_headings_that_exist():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _prose(page)):
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_page_of_the_guide_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in PAGES[1:] if f"(docs/{p.name}" not in readme]
    assert not unlinked, f"README.md links to no {unlinked}"


_PATH = re.compile(r"(?<![\w./-])((?:core|app|benchmarks|scripts|tests|resources|docs)/[\w/.-]*\.(?:py|md|png))\b")


def test_files_the_pages_name_exist():
    gone = sorted({f"{page.relative_to(ROOT)}: {m}" for page in PAGES
                   for m in _PATH.findall(page.read_text(encoding="utf-8")) if not (ROOT / m).exists()})
    assert not gone, f"the pages name files that do not exist: {gone}"
    modules = sorted({f"{page.relative_to(ROOT)}: {m}" for page in PAGES
                      for m in re.findall(r"-m\s+((?:benchmarks|scripts)(?:\.\w+)*)", page.read_text(encoding="utf-8"))
                      if not (ROOT / (m.replace(".", "/") + ".py")).exists()
                      and not (ROOT / m.replace(".", "/") / "__main__.py").exists()})
    assert not modules, f"the pages run modules that do not exist: {modules}"


def _defines(source: Path, name: str) -> bool:
    text = source.read_text(encoding="utf-8")
    return bool(re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^\s*{name}\s*(?::[^=\n]*)?=|"
                          rf"^\s*from\s+\S+\s+import\s+.*\b{name}\b|[\"']{name}[\"']\s*:", text, flags=re.M))


def _resolves(dotted: str) -> bool:
    """Whether ``gradexplorer.a.b.name`` (or ``gradexplorer_app.…``) is a module of this
    repository, or a name one defines, read from the files of the two source roots."""
    package, *parts = dotted.split(".")
    base = ROOT / ("app" if package == "gradexplorer_app" else "core") / package
    while parts and (base / parts[0] / "__init__.py").is_file():
        base, parts = base / parts[0], parts[1:]
    if parts and (base / f"{parts[0]}.py").is_file():
        base, parts = base / f"{parts[0]}.py", parts[1:]
    if not parts:
        return True
    source = base if base.suffix == ".py" else base / "__init__.py"
    return source.is_file() and all(_defines(source, p) for p in parts[:2])


def test_modules_and_names_the_pages_cite_exist():
    cited = {(page.relative_to(ROOT).as_posix(), m) for page in PAGES
             for m in re.findall(r"\bgradexplorer(?:_app)?(?:\.\w+)+", page.read_text(encoding="utf-8"))}
    # ARCHITECTURE.md says why the engine is not ``gradexplorer.core``.
    gone = sorted(f"{page}: {name}" for page, name in cited if name != "gradexplorer.core" and not _resolves(name))
    assert not gone, f"the pages cite modules or names that do not exist: {gone}"
    public = set(gradexplorer.__all__) | {"__all__", "__version__"}
    unknown = sorted({f"{page.relative_to(ROOT)}: gx.{n}" for page in PAGES
                      for n in re.findall(r"\bgx\.(\w+)", page.read_text(encoding="utf-8")) if n not in public})
    assert not unknown, f"the pages use gx names the package does not export: {unknown}"
