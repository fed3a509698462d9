"""A wheel works: built from this tree, installed (not editable) into a fresh virtual
environment and run from another folder, the CLI and the window find the demo's weights and
pictures, which the wheel carries as the package ``core.resources``.

The fresh environment borrows torch, PySide6 and the other dependencies from the running
interpreter's site-packages through a ``.pth`` file (no download, and it works on a fresh
clone where ``.venv`` is the only environment); gradexplorer itself comes from the wheel
only: the checkout is neither on ``sys.path`` nor the working folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# What the build copies of the tree: everything but environments, caches and build output.
_NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "out", ".whl"
)


def _run(command: list, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, f"{command} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _site_dirs() -> list[str]:
    """The running interpreter's package folders, including those that its own .pth files add
    (a worktree's venv borrows the main venv's packages that way)."""
    dirs = [p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p) and Path(p).is_dir()]
    purelib = sysconfig.get_paths()["purelib"]
    return list(dict.fromkeys([purelib, *dirs]))


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A fresh venv with the wheel of this tree installed (no editable install, no checkout)."""
    base = tmp_path_factory.mktemp("wheel")
    # Build from a copy: setuptools' in-tree build/ folder could carry stale files into the wheel.
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCES)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(base / "dist"), str(source)], cwd=base)
    (wheel,) = (base / "dist").glob("gradexplorer-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "core/resources/demo_shapes/shapes_cnn.pt" in names, names
    assert "core/resources/demo_shapes/samples/labels.json" in names, names

    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / ("python.exe" if os.name == "nt" else "python")
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # After the venv's own site-packages, so the installed wheel wins over any other copy.
    (Path(purelib) / "_borrowed_packages.pth").write_text("\n".join(_site_dirs()) + "\n", encoding="utf-8")
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], cwd=base)
    return venv


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["QT_QPA_PLATFORM"] = "offscreen"
    env["OMP_NUM_THREADS"] = "1"
    return env


def _bin(venv: Path, name: str) -> str:
    return str(venv / ("Scripts" if os.name == "nt" else "bin") / name)


def test_installed_wheel_imports_from_itself(wheel_venv, tmp_path):
    proc = _run([_bin(wheel_venv, "python"), "-c",
                 "import core, core.demos; print(core.__file__); print(core.demos.SHAPES_CHECKPOINT)"],
                cwd=tmp_path, env=_env())
    core_file, checkpoint = proc.stdout.strip().splitlines()
    assert Path(core_file).is_relative_to(wheel_venv), core_file
    assert not Path(core_file).is_relative_to(ROOT), core_file
    assert Path(checkpoint).is_relative_to(wheel_venv) and Path(checkpoint).is_file(), checkpoint


def test_installed_cli_captures_the_shapes_demo(wheel_venv, tmp_path):
    proc = _run([_bin(wheel_venv, "gradexplorer"), "capture", "--model", "demo:shapes", "--out", "x.pt"],
                cwd=tmp_path, env=_env())
    assert "wrote" in proc.stdout, proc.stdout
    data = torch.load(tmp_path / "x.pt", weights_only=True)
    assert data["format"] == "gradexplorer.capture"
    assert data["meta"]["model"] == "demo:shapes"
    # The weights came from the wheel's copy, and the demo's own pictures were the batch.
    assert str(wheel_venv) in data["meta"]["weights"], data["meta"]["weights"]
    assert tuple(data["input"].shape) == (12, 3, 64, 64)


def test_installed_window_opens_on_the_demo(wheel_venv, tmp_path):
    shot = tmp_path / "shot.png"
    _run([_bin(wheel_venv, "gradexplorer"), "--run", "--screenshot", str(shot)], cwd=tmp_path, env=_env())
    assert shot.is_file() and shot.stat().st_size > 10_000
