"""The advice given when the model's forward raises matches the cause: the BatchNorm rule
for one sample in train mode, the shape hint only for shape errors, the dtype for dtype
errors, and otherwise that the model's own code failed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradexplorer.base.errors import CaptureError
from gradexplorer.base.forward_errors import SHAPE_FIX
from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.module_tree import ModuleTree
from gradexplorer_app.cli.main import main


class Boom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        raise RuntimeError("the model's own bug")


def fix_of(model: nn.Module, x: torch.Tensor, train: bool = False) -> str:
    with pytest.raises(CaptureError) as info:
        capture(model, x, train=train)
    return info.value.fix


def test_batchnorm_with_one_sample_in_train_mode_says_batch_of_two_or_eval():
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    fix = fix_of(model, torch.randn(1, 4), train=True)
    assert "use a batch of 2 or more, or eval mode" in fix and "--train" in fix
    assert "shape" not in fix
    assert len(capture(model.eval(), torch.randn(1, 4))) == 3  # eval mode runs one sample


def test_the_shape_hint_only_for_shape_errors():
    assert fix_of(nn.Sequential(nn.Linear(4, 3)), torch.randn(2, 5)) == SHAPE_FIX
    assert fix_of(nn.Sequential(nn.Conv2d(3, 4, 3)), torch.randn(2, 1, 8, 8)) == SHAPE_FIX
    other = fix_of(Boom(), torch.randn(2, 4))
    assert "shape" not in other and "model's own code" in other


def test_a_dtype_error_names_the_dtype():
    fix = fix_of(nn.Sequential(nn.Embedding(10, 4)), torch.rand(2, 3))
    assert "dtype" in fix and "shape" not in fix


def test_the_probe_gives_the_same_advice():
    with pytest.raises(CaptureError) as info:
        ModuleTree.build(Boom()).probe(Boom(), torch.randn(2, 4))
    assert "shape" not in info.value.fix


def test_cli_batchnorm_batch_of_one_with_train(tmp_path, capsys):
    factory = tmp_path / "bn.py"
    factory.write_text("from torch import nn\n\ndef build():\n"
                       "    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))\n")
    code = main(["capture", "--model", f"{factory}:build", "--trust", "--random", "1x4", "--train",
                 "--out", str(tmp_path / "x.pt"), "-q"])
    err = capsys.readouterr().err
    assert code == 1 and "use a batch of 2 or more, or eval mode (leave out --train" in err
    assert err.count("error: ") == 1 and "Traceback" not in err
