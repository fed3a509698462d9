"""The import contract (CONVENTIONS.md): ``core`` never imports Qt, pyqtgraph or superqt.

Checked in a fresh interpreter, because this test process may already hold Qt modules
imported by other tests.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import core

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("PySide6", "PySide2", "PyQt5", "PyQt6", "shiboken6", "shiboken2", "pyqtgraph", "superqt", "qtpy")

SCRIPT = """
import importlib, json, pkgutil, sys
import core
names = ["core"] + sorted("core." + m.name for m in pkgutil.iter_modules(core.__path__))
for name in names:
    importlib.import_module(name)
forbidden = set(sys.argv[1].split(","))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
print(json.dumps({"imported": names, "qt": loaded}))
"""


def test_core_modules_import_no_qt():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(FORBIDDEN)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = {"core." + m.name for m in pkgutil.iter_modules(core.__path__)}
    assert expected <= set(result["imported"])
    assert len(expected) >= 10  # the walk found the package's modules
    assert result["qt"] == [], f"core imported Qt modules: {result['qt']}"


def test_every_cli_module_is_under_the_no_qt_contract():
    """import-linter (run by `make test`) checks the modules that its contract names; a new
    `app/cli_*.py` must be named there too (import-linter's wildcards match whole names only)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    cli_contract = next(c for c in contracts if "command line" in c["name"])
    cli_modules = {f"app.{p.stem}" for p in (ROOT / "app").glob("cli*.py")}
    assert "app.cli" in cli_modules and "app.cli_format" in cli_modules
    missing = sorted(cli_modules - set(cli_contract["source_modules"]))
    assert not missing, (
        f"add {missing} to source_modules of the contract '{cli_contract['name']}' in pyproject.toml"
    )
    assert set(FORBIDDEN) <= set(cli_contract["forbidden_modules"])
    core_contract = next(c for c in contracts if c["source_modules"] == ["core"])
    assert {"app", *FORBIDDEN} <= set(core_contract["forbidden_modules"])
