"""The package's import rules (docs/ARCHITECTURE.md, "The shape").

- The engine (every subpackage of ``gradexplorer`` but ``gradexplorer_app``) imports no Qt,
  pyqtgraph or superqt; ``import gradexplorer`` alone imports neither torch nor Qt nor the
  numba kernels (the public API is lazy). Checked in a fresh interpreter, because this test
  process may already hold those modules.
- No two modules import each other, directly or through others: a cycle is a design bug,
  not something to hide in a function. grimp (import-linter's graph) sees imports inside
  functions too.
- import-linter's contracts (run by ``make test``) name every engine subpackage.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import gradexplorer

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("PySide6", "PySide2", "PyQt5", "PyQt6", "shiboken6", "shiboken2", "pyqtgraph", "superqt", "qtpy")
ENGINE = sorted(f"gradexplorer.{m.name}" for m in pkgutil.iter_modules(gradexplorer.__path__)
                if m.ispkg and m.name != "resources")

SCRIPT = """
import importlib, json, pkgutil, sys
import gradexplorer
after_init = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "numba", *sys.argv[1].split(",")})
names = []
for m in pkgutil.walk_packages(gradexplorer.__path__, "gradexplorer."):
    if m.name.startswith("gradexplorer.resources") or m.name == "gradexplorer.__main__":
        continue
    importlib.import_module(m.name)
    names.append(m.name)
forbidden = set(sys.argv[1].split(","))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
print(json.dumps({"after_init": after_init, "imported": names, "qt": loaded}))
"""


def _fresh(script: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=dict(os.environ),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_engine_modules_import_no_qt_and_the_package_imports_nothing_heavy():
    result = _fresh(SCRIPT, ",".join(FORBIDDEN))
    assert result["after_init"] == [], f"import gradexplorer loaded {result['after_init']}"
    assert len(result["imported"]) >= 60  # the walk found the subpackages' modules
    assert {"gradexplorer.capturing.capture", "gradexplorer.stats.tensor_stats"} <= set(result["imported"])
    assert result["qt"] == [], f"the engine imported Qt modules: {result['qt']}"


def test_public_api():
    assert gradexplorer.__all__ == [
        "capture", "Capture", "save_capture", "load_capture", "capture_dataset", "watch", "read_timeline",
        "compare", "graph", "load_model", "GradExplorerError", "explore", "__version__",
    ]
    from importlib import metadata

    assert gradexplorer.__version__ == metadata.version("gradexplorer")
    from gradexplorer.capturing.capture import capture
    from gradexplorer.model_graph.graph import extract_graph

    assert gradexplorer.capture is capture and gradexplorer.graph is extract_graph
    for name in gradexplorer.__all__[:-1]:
        assert getattr(gradexplorer, name).__doc__, f"gradexplorer.{name} has no docstring"
    assert set(gradexplorer.__all__) <= set(dir(gradexplorer))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = gradexplorer.nothing
    # No public name is also a subpackage: importing the subpackage would replace the name.
    assert not {m.name for m in pkgutil.iter_modules(gradexplorer.__path__)} & set(gradexplorer.__all__)


def test_explore_refuses_what_is_not_a_model():
    """``gx.explore`` is reachable from a bare import; a wrong argument is said in words
    before the window (and Qt) is loaded (the window itself: tests/app/test_explore.py)."""
    with pytest.raises(gradexplorer.GradExplorerError, match=r"torch\.nn\.Module") as info:
        gradexplorer.explore(object(), None)
    assert "Capture" in info.value.fix


CYCLES = """
import json, grimp
graph = grimp.build_graph("gradexplorer", "gradexplorer_app", cache_dir=None)
cycles = []
for importer in sorted(graph.modules):
    for imported in sorted(graph.find_modules_directly_imported_by(importer)):
        if graph.chain_exists(imported, importer):
            cycles.append([*graph.find_shortest_chain(imported, importer), imported])
print(json.dumps({"modules": sorted(graph.modules), "cycles": cycles}))
"""




def test_no_import_cycles():
    # In a fresh interpreter: grimp finds both packages through the import system, from their
    # source roots.
    proc = subprocess.run([sys.executable, "-c", CYCLES], cwd=ROOT, env=dict(os.environ), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"gradexplorer_app.window.main_window", "gradexplorer.capturing.capture"} <= set(result["modules"])
    cycles = result["cycles"]
    assert not cycles, "import cycles (each from the module back to itself):\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_contracts_name_every_engine_subpackage():
    """A new subpackage must join the layers and the no-Qt contract (import-linter checks
    only the modules its contracts name)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    engine = next(c for c in contracts if c["name"].startswith("the engine"))
    assert sorted(engine["source_modules"]) == ENGINE
    assert {"gradexplorer_app", *FORBIDDEN} <= set(engine["forbidden_modules"])
    cli = next(c for c in contracts if "command line" in c["name"])
    assert cli["source_modules"] == ["gradexplorer_app.cli"] and set(FORBIDDEN) <= set(cli["forbidden_modules"])
    layers = next(c for c in contracts if c["type"] == "layers")
    layered = {name.strip() for layer in layers["layers"] for name in layer.split("|")}
    assert layered == {m.split(".", 1)[1] for m in ENGINE}


def test_contracts_layer_every_part_of_the_app():
    """gradexplorer_app has its own layers (the command line, the window, the views, the
    pieces both share): a new module of app/ must join them."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    app = next(c for c in contracts if c["type"] == "layers" and c["containers"] == ["gradexplorer_app"])
    layered = {name.strip() for layer in app["layers"] for name in layer.split("|")}
    assert layered == {m.name for m in pkgutil.iter_modules([str(ROOT / "app" / "gradexplorer_app")])} - {"explore"}
    assert app["layers"].index("window") < app["layers"].index("views")  # views never import the window


def _packages() -> list[Path]:
    return sorted(p for folder in ("core", "app") for p in (ROOT / folder).rglob("__init__.py")
                  if "__pycache__" not in p.parts)


def test_every_package_says_what_it_owns_and_holds_no_logic():
    """Each ``__init__.py`` has a docstring and an ``__all__``, and only re-exports: no
    function or class is defined in one (the logic lives in a module named for it)."""
    import ast

    packages = _packages()
    assert len(packages) >= 16
    for path in packages:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(ROOT)
        assert ast.get_docstring(tree), f"{where} has no docstring saying what the package owns"
        names = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                 if isinstance(t, ast.Name)}
        assert "__all__" in names, f"{where} has no __all__"
        defined = [node.name for node in ast.walk(tree)
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        assert not defined, f"{where} defines {defined}: move them to a module of the package"
