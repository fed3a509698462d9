"""Tensors read from a file are measured by the elements they declare before anything makes
them dense (gradexplorer.base.tensor_memory): expanded, stride-0 views that a few bytes store
are refused with the figures; nothing here allocates more than a few kilobytes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gradexplorer.base.devices as devices
from gradexplorer.base.tensor_memory import TensorTooLarge, check_tensor_fits, declared_bytes
from gradexplorer.batches.tensor_files import load_tensor_file
from gradexplorer.files.capture_file import load_capture
from gradexplorer_app.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def free_8gib(monkeypatch):
    monkeypatch.setattr(devices, "free_memory", lambda device: 8 << 30)


def test_an_expanded_view_counts_every_element_it_declares():
    bomb = torch.zeros(1).expand(1, 3, 30000, 30000)
    assert bomb.untyped_storage().nbytes() == 4
    assert declared_bytes(bomb) == 3 * 30000 * 30000 * 4
    with pytest.raises(TensorTooLarge, match="expanded view") as info:
        check_tensor_fits(bomb, "the input", budget=1 << 30)
    assert "2,700,000,000 elements" in info.value.problem and "--memory-budget" in info.value.problem


def test_a_bomb_input_file_is_refused_before_the_model_runs(tmp_path, free_8gib, capsys):
    path = tmp_path / "e.pt"
    torch.save(torch.zeros(1).expand(1, 3, 30000, 30000), path)
    assert path.stat().st_size < 4096
    with pytest.raises(TensorTooLarge, match="1x3x30000x30000"):
        load_tensor_file(path)
    code = main(["capture", "--model", "demo:shapes", "--input", str(path), "--out", str(tmp_path / "o.pt"), "-q"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: ") and "10.1 GiB once dense" in err, err
    assert not (tmp_path / "o.pt").exists()


def test_memory_budget_is_honoured(tmp_path, free_8gib, capsys):
    path = tmp_path / "x.pt"
    torch.save(torch.zeros(1).expand(2, 3, 512, 512), path)  # 3 MiB dense, 48 MiB for one sample at work
    assert load_tensor_file(path).tensor.shape == (2, 3, 512, 512)
    with pytest.raises(TensorTooLarge, match="set by --memory-budget"):
        load_tensor_file(path, memory_budget=1 << 20)
    code = main(["capture", "--model", "demo:seed-mlp", "--input", str(path), "--memory-budget", "1MiB",
                 "--out", str(tmp_path / "o.pt"), "-q"])
    err = capsys.readouterr().err
    assert code == 1 and "memory budget" in err and "Traceback" not in err, err


def test_a_capture_whose_input_declares_1e12_elements_is_refused(tmp_path, free_8gib, mlp_capture_file):
    data = torch.load(mlp_capture_file, weights_only=True)
    data["input"] = torch.zeros(1).expand(1000, 1000, 1000, 1000)
    data["input_grad"] = torch.zeros(1).expand(1000, 1000, 1000, 1000)
    bomb = tmp_path / "bomb.pt"
    torch.save(data, bomb)
    with pytest.raises(TensorTooLarge, match="input"):
        load_capture(bomb)
    assert load_capture(mlp_capture_file).layers


@pytest.mark.slow
def test_the_bomb_capture_through_the_command_line_is_one_line(tmp_path, mlp_capture_file):
    data = torch.load(mlp_capture_file, weights_only=True)
    data["input"] = torch.zeros(1).expand(1000, 1000, 1000, 1000)
    bomb = tmp_path / "bomb.pt"
    torch.save(data, bomb)
    done = subprocess.run([sys.executable, "-m", "gradexplorer", "inspect", str(bomb)], capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1, done.stderr
    assert "elements" in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def mlp_capture_file(tmp_path, capsys):
    path = tmp_path / "mlp.pt"
    assert main(["capture", "--model", "demo:seed-mlp", "--random", "4x10", "--out", str(path), "-q"]) == 0
    capsys.readouterr()
    return path
