"""A Lightning checkpoint as --weights: its state dict is read as tensors, whatever Python
objects its hyper_parameters hold (made without lightning: the dict Lightning saves)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from gradexplorer.base.errors import ModelLoadError
from gradexplorer.models.state_dicts import read_weights


def lightning_checkpoint(path: Path, state: dict, **hyper: object) -> Path:
    torch.save({
        "epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.4.0",
        "state_dict": {f"model.{k}": v for k, v in state.items()},
        "optimizer_states": [], "lr_schedulers": [], "callbacks": {},
        "hyper_parameters": hyper,
    }, path)
    return path


def test_a_lightning_checkpoint_whose_hyper_parameters_hold_a_path_gives_its_state_dict(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    state = model.state_dict()
    ckpt = lightning_checkpoint(tmp_path / "epoch=3.ckpt", state, data_dir=Path("/data/cats"),
                                options=argparse.Namespace(lr=0.1), lr=0.1)
    read = read_weights(ckpt)
    assert set(read) == {f"model.{k}" for k in state}
    assert all(torch.equal(read[f"model.{k}"], v) for k, v in state.items())
    # And as --weights of a model by name, the prefix removed.
    timm = pytest.importorskip("timm")
    resnet = timm.create_model("resnet18", pretrained=False)
    ckpt = lightning_checkpoint(tmp_path / "resnet.ckpt", resnet.state_dict(), data_dir=Path("/data"))
    from gradexplorer.models import load_model

    loaded = load_model("timm:resnet18", weights=str(ckpt))
    assert torch.equal(loaded.module.state_dict()["fc.weight"], resnet.state_dict()["fc.weight"])


class RunsCommand:
    def __reduce__(self):
        return (os.system, ("true",))


def test_a_checkpoint_that_would_run_a_command_is_still_refused(tmp_path):
    state = nn.Linear(2, 2).state_dict()
    ckpt = lightning_checkpoint(tmp_path / "bad.ckpt", state, trap=RunsCommand())
    with pytest.raises(ModelLoadError, match="may be malicious"):
        read_weights(ckpt)


def test_a_state_dict_made_of_python_objects_is_not_taken(tmp_path):
    # Tensors are what a state dict holds: an entry that is an unreadable object is refused.
    torch.save({"state_dict": {"weight": Path("/x")}}, tmp_path / "odd.ckpt")
    with pytest.raises(ModelLoadError, match="pathlib"):
        read_weights(tmp_path / "odd.ckpt")
