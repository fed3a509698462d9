"""``gradexplorer capture --model timm:NAME --weights DEFAULT`` offline from a Hugging Face
cache, checked against autograd; a factory's model is not called randomly initialised."""

from __future__ import annotations

import textwrap

import pytest
import torch

from gradexplorer.batches.random_batches import random_batch
from gradexplorer.files.capture_file import load_capture
from gradexplorer.models import load_model
from gradexplorer_app.cli.main import main
from tests.core.test_timm_models import hf_home, plant_weights  # noqa: F401 (a fixture)
from tests.ground_truth import compare, reference

timm = pytest.importorskip("timm")
LAYERS = ["conv1", "layer1.0.conv2", "layer4.1.bn2", "fc"]


@pytest.mark.slow
def test_capture_timm_by_name_offline_from_the_cache_is_exact(hf_home, tmp_path, capsys):  # noqa: F811
    plant_weights(hf_home, "resnet18")
    out = tmp_path / "t.pt"
    code = main(["capture", "--model", "timm:resnet18", "--weights", "DEFAULT", "--random", "2x3x64x64",
                 "--layers", *LAYERS, "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "weights timm/resnet18.a1_in1k" in printed.out
    cap = load_capture(out)
    assert cap.meta["weights"] == "timm/resnet18.a1_in1k"
    model = load_model("timm:resnet18", weights="DEFAULT").module
    x = random_batch("2x3x64x64", seed=0).tensor
    assert compare(cap, reference(model, x, LAYERS), LAYERS) < 1e-5


def test_a_factory_that_loads_weights_is_not_labelled_random_init(tmp_path, capsys, monkeypatch):
    torch.manual_seed(0)
    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 2)).state_dict(), tmp_path / "w.pth")
    (tmp_path / "nets.py").write_text(textwrap.dedent("""
        import torch
        from pathlib import Path

        def build():
            model = torch.nn.Sequential(torch.nn.Linear(4, 2))
            model.load_state_dict(torch.load(Path(__file__).with_name("w.pth")))
            return model
    """))
    monkeypatch.chdir(tmp_path)
    code = main(["capture", "--model", "nets.py:build", "--trust", "--random", "2x4", "--out", "c.pt"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "random init" not in printed.out
    assert "as built by the factory" in printed.out
    assert load_capture(tmp_path / "c.pt").meta["weights"] == "as built by the factory"
