"""Model files people really have: a capture given as the model, a pickled model whose
class lives in the user's own module (found by the console script too), a script's
``__main__`` class, and messages in CLI words."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gradexplorer.base.errors import ModelLoadError
from gradexplorer.models import load_model
from gradexplorer_app.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = Path(sys.executable).parent / "gradexplorer"


def test_capture_file_given_as_the_model_says_what_to_do(tmp_path, capsys):
    out = tmp_path / "cap.pt"
    assert main(["capture", "--model", "demo:seed-mlp", "--random", "2x10", "--out", str(out), "-q"]) == 0
    capsys.readouterr()
    with pytest.raises(ModelLoadError) as info:
        load_model(str(out))
    assert "capture file, not a model" in info.value.problem
    assert "gradexplorer inspect" in info.value.fix and "Open capture" in info.value.fix
    assert f"'gradexplorer {out}'" in info.value.fix  # the command that opens it in the window
    code = main(["capture", "--model", str(out), "--random", "2x10", "--out", str(tmp_path / "b.pt")])
    err = capsys.readouterr().err
    assert code == 1 and "capture file, not a model" in err


MODULE = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)
"""


@pytest.mark.slow
@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="the console script is not installed here")
def test_console_script_finds_the_users_module_in_the_current_folder(tmp_path):
    (tmp_path / "mynets.py").write_text(MODULE)
    save = "import torch, mynets; torch.save(mynets.Net(), 'net.pt')"
    subprocess.run([sys.executable, "-c", save], cwd=tmp_path, check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["QT_QPA_PLATFORM"] = "offscreen"
    result = subprocess.run(
        [str(CONSOLE_SCRIPT), "capture", "--model", "net.pt", "--trust", "--random", "2x4",
         "--out", "cap.pt", "-q"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "cap.pt").is_file()


@pytest.mark.slow
def test_module_not_importable_gives_the_fix_that_works(tmp_path, monkeypatch):
    (tmp_path / "lost_nets.py").write_text(MODULE)
    save = "import torch, lost_nets; torch.save(lost_nets.Net(), 'net.pt')"
    subprocess.run([sys.executable, "-c", save], cwd=tmp_path, check=True)
    (tmp_path / "lost_nets.py").unlink()
    monkeypatch.chdir(ROOT)
    with pytest.raises(ModelLoadError) as info:
        load_model(str(tmp_path / "net.pt"), trust=True)
    assert "lost_nets" in info.value.problem
    assert "Run gradexplorer from the folder that holds lost_nets" in info.value.fix


@pytest.mark.slow
def test_class_from_a_scripts_main_says_to_move_it_into_a_module(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(MODULE + "\ntorch.save(Net(), 'net.pt')\n")
    subprocess.run([sys.executable, str(script)], cwd=tmp_path, check=True)
    with pytest.raises(ModelLoadError) as info:
        load_model(str(tmp_path / "net.pt"), trust=True)
    assert "__main__" in info.value.problem
    assert "module file" in info.value.fix


def test_messages_speak_cli_words(tmp_path):
    torch.save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "w.pth")
    with pytest.raises(ModelLoadError) as info:
        load_model(str(tmp_path / "w.pth"))
    assert "--arch resnet18" in info.value.fix and "arch=" not in str(info.value)
    with pytest.raises(ModelLoadError) as info:
        load_model("zzzqqq")
    assert "list_models" not in str(info.value)
    with pytest.raises(ModelLoadError) as info:
        load_model("demo:shapes", weights="DEFAULT")
    assert "--weights" in info.value.fix


def test_detection_model_is_refused_before_download_build_or_forward(tmp_path, capsys, monkeypatch):
    import torchvision

    import gradexplorer.models.weights

    def no(*args, **kwargs):
        raise AssertionError("a detection model was downloaded or built")

    monkeypatch.setattr(gradexplorer.models.weights, "fetch_weights", no)
    monkeypatch.setattr(torchvision.models.detection, "fasterrcnn_resnet50_fpn", no)
    code = main(["capture", "--model", "fasterrcnn_resnet50_fpn", "--weights", "DEFAULT",
                 "--random", "1x3x64x64", "--out", str(tmp_path / "d.pt")])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "detection model" in err and "one number" in err and "--task classification" in err
    assert "Traceback" not in err and not (tmp_path / "d.pt").exists()
