"""A wheel works: built from this tree, installed (not editable) into a fresh virtual
environment and run from another folder, the CLI and the window find the demo's weights and
pictures, which the wheel carries inside the package as ``gradexplorer/resources``.

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

# Every test here takes a second or more (scripts/slow_tests.py): none is in make test-fast.
pytestmark = pytest.mark.slow

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
    top = {name.split("/", 1)[0] for name in names}
    (dist_info,) = (name for name in top if name.endswith(".dist-info"))
    # The engine and the front ends (docs/ARCHITECTURE.md, "Source roots"), nothing else.
    assert top == {"gradexplorer", "gradexplorer_app", dist_info}, f"the wheel's top-level names: {sorted(top)}"
    top_level = f"{dist_info}/top_level.txt"
    if top_level in names:
        assert sorted(zipfile.ZipFile(wheel).read(top_level).decode().split()) == ["gradexplorer", "gradexplorer_app"]
    assert "gradexplorer/resources/demo_shapes/shapes_cnn.pt" in names, names
    assert "gradexplorer/resources/demo_shapes/samples/labels.json" in names, names
    assert "gradexplorer_app/cli/main.py" in names and "gradexplorer/capturing/capture.py" in names
    assert {"gradexplorer/py.typed", "gradexplorer_app/py.typed"} <= set(names), (
        "the PEP 561 markers: a user's type checker reads the annotations")

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


@pytest.fixture()
def users_folder(tmp_path) -> Path:
    """A notebook's folder with modules of the user's own named ``core`` and ``app``: importing
    either is a failure (nothing of gradexplorer may be found under those names)."""
    for name in ("core", "app"):
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the user\\'s own {name}.py was imported')\n")
    return tmp_path


NOTEBOOK = """
import sys
import torch
import gradexplorer as gx
from gradexplorer.models.demos import SHAPES_CHECKPOINT

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
x = torch.randn(2, 5)
cap = gx.capture(model, x, target="top1")
# autograd on the same graph: the target top1 is the sum over the batch of each sample's top logit
a1 = model[1](model[0](x))
logits = model[2](a1)
score = logits.gather(1, logits.argmax(1, keepdim=True)).sum()
(g1,) = torch.autograd.grad(score, [a1])
assert torch.allclose(cap["1"].calls[0].grad_output, g1, atol=1e-6), "the gradient differs from autograd"
gx.save_capture(cap, "cap.pt")
back = gx.load_capture("cap.pt")
assert torch.equal(back["1"].calls[0].grad_output, cap["1"].calls[0].grad_output)
assert "core" not in sys.modules and "app" not in sys.modules
print(gx.__file__)
print(SHAPES_CHECKPOINT)
"""


def test_installed_wheel_imports_from_itself(wheel_venv, users_folder):
    proc = _run([_bin(wheel_venv, "python"), "-c", NOTEBOOK], cwd=users_folder, env=_env())
    package_file, checkpoint = proc.stdout.strip().splitlines()[-2:]
    assert Path(package_file).is_relative_to(wheel_venv), package_file
    assert not Path(package_file).is_relative_to(ROOT), package_file
    assert Path(checkpoint).is_relative_to(wheel_venv) and Path(checkpoint).is_file(), checkpoint
    assert (users_folder / "cap.pt").is_file()


def test_python_m_gradexplorer_beside_the_users_modules(wheel_venv, users_folder):
    proc = _run([_bin(wheel_venv, "python"), "-m", "gradexplorer", "capture", "--model", "demo:seed-mlp",
                 "--out", "m.pt"], cwd=users_folder, env=_env())
    assert "wrote" in proc.stdout, proc.stdout
    data = torch.load(users_folder / "m.pt", weights_only=True)
    assert data["format"] == "gradexplorer.capture" and data["meta"]["model"] == "demo:seed-mlp"


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
