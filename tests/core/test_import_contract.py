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
