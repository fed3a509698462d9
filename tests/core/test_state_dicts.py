"""Weights files as people have them: Lightning checkpoints, wrapper prefixes, the state
dict of any classification builder at its defaults, auxiliary classifiers."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torchvision
from torch import nn

from gradexplorer.base.errors import ModelLoadError
from gradexplorer.models import load_model
from gradexplorer.models.weights import model_task
from gradexplorer_app.cli.main import main

CLASSIFIERS = sorted(n for n in torchvision.models.list_models() if model_task(n) == "classification")
# Builders that need special handling, and small members of every other family: the
# default run covers these. The rest of the zoo holds billions of weights (13 minutes on a
# loaded 2-core machine): GRADEXPLORER_ZOO=1 pytest -m slow tests/core/test_state_dicts.py
ZOO = os.environ.get("GRADEXPLORER_ZOO") == "1"
QUICK = {
    "alexnet", "densenet121", "efficientnet_b0", "googlenet", "inception_v3", "mnasnet0_5",
    "mobilenet_v2", "mobilenet_v3_small", "regnet_x_400mf", "resnet18", "shufflenet_v2_x0_5",
    "squeezenet1_1",
}


def _reference(name: str) -> nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GoogLeNet/Inception warn about init_weights
        return torchvision.models.get_model(name)


def _same_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


_WHOLE_ZOO = [
    pytest.mark.slow,
    pytest.mark.skipif(not ZOO, reason="the whole zoo takes minutes: set GRADEXPLORER_ZOO=1"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [n if n in QUICK else pytest.param(n, marks=_WHOLE_ZOO) for n in CLASSIFIERS]
)
def test_state_dict_at_builder_defaults_loads_with_weights_file(tmp_path, name):
    reference = _reference(name)
    path = tmp_path / f"{name}.pth"
    torch.save(reference.state_dict(), path)
    del reference
    loaded = load_model(name, weights=str(path))
    _same_weights(loaded.module, _reference(name))
    assert loaded.weights == f"file:{path}"


def test_lightning_checkpoint_prefix_is_removed_and_said(tmp_path):
    model = torchvision.models.resnet18()
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    state["loss_fn.pos_weight"] = torch.ones(3)  # a LightningModule's own buffers
    torch.save({"epoch": 3, "global_step": 10, "state_dict": state}, tmp_path / "last.ckpt")
    loaded = load_model("resnet18", weights=str(tmp_path / "last.ckpt"))
    _same_weights(loaded.module, model)
    note = next(n for n in loaded.notes if "prefix" in n)
    assert "'model.'" in note and "last.ckpt" in note and "loss_fn.pos_weight" in note


def test_lightning_checkpoint_with_an_arch_and_with_a_factory(tmp_path):
    model = torchvision.models.resnet18(num_classes=7)
    state = {f"net.backbone.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state}, tmp_path / "run.ckpt")
    loaded = load_model(str(tmp_path / "run.ckpt"), arch="resnet18")
    _same_weights(loaded.module, model)
    assert any("'net.backbone.'" in n for n in loaded.notes)
    assert any("num_classes=7" in n for n in loaded.notes)

    factory = tmp_path / "nets.py"
    factory.write_text("import torchvision\ndef build():\n    return torchvision.models.resnet18(num_classes=7)\n")
    loaded = load_model(f"{factory}:build", weights=str(tmp_path / "run.ckpt"), trust=True)
    _same_weights(loaded.module, model)
    assert any("'net.backbone.'" in n for n in loaded.notes)


def test_mismatch_names_the_prefix_it_found(tmp_path):
    state = {f"model.{k}": v for k, v in torchvision.models.resnet34().state_dict().items()}
    torch.save({"state_dict": state}, tmp_path / "other.ckpt")
    with pytest.raises(ModelLoadError) as info:
        load_model("resnet18", weights=str(tmp_path / "other.ckpt"))
    assert "every key in the file starts with 'model.'" in info.value.problem


def test_dataparallel_prefix_still_removed(tmp_path):
    model = nn.DataParallel(torchvision.models.resnet18())
    torch.save(model.state_dict(), tmp_path / "dp.pth")
    loaded = load_model("resnet18", weights=str(tmp_path / "dp.pth"))
    _same_weights(loaded.module, model.module)


@pytest.mark.slow
def test_googlenet_aux_outputs_are_targets_in_train_mode(tmp_path, capsys):
    torch.save(_reference("googlenet").state_dict(), tmp_path / "g.pth")
    loaded = load_model("googlenet", weights=str(tmp_path / "g.pth"))
    assert loaded.module.aux1 is not None
    assert any("auxiliary classifiers" in n and "top1@aux_logits" in n for n in loaded.notes)
    out = tmp_path / "aux.pt"
    code = main(["capture", "--model", "googlenet", "--weights", str(tmp_path / "g.pth"),
                 "--random", "2x3x96x96", "--train", "--target", "top1@aux_logits1",
                 "--layers", "aux1.*", "--out", str(out), "-q"])
    assert code == 0, capsys.readouterr().err
    from gradexplorer.files.capture_file import load_capture

    capture = load_capture(out)
    assert any(name.startswith("aux1") for name in capture.layers)


@pytest.mark.slow
def test_readme_top1_at_aux_example_runs(tmp_path, capsys):
    # docs/command-line.md, the capture options: `@key` picks a dict/tuple output element (`top1@aux`).
    out = tmp_path / "seg.pt"
    code = main(["capture", "--model", "fcn_resnet50", "--random", "1x3x64x64",
                 "--target", "top1@aux", "--layers", "aux_classifier.*", "--out", str(out), "-q"])
    assert code == 0, capsys.readouterr().err


@pytest.mark.slow
def test_segmentation_state_dict_without_aux_still_loads(tmp_path):
    plain = torchvision.models.segmentation.lraspp_mobilenet_v3_large(weights_backbone=None)
    torch.save(plain.state_dict(), tmp_path / "l.pth")
    load_model("lraspp_mobilenet_v3_large", weights=str(tmp_path / "l.pth"))
    no_aux = torchvision.models.segmentation.fcn_resnet50(weights_backbone=None, aux_loss=False)
    torch.save(no_aux.state_dict(), tmp_path / "f.pth")
    loaded = load_model("fcn_resnet50", weights=str(tmp_path / "f.pth"))
    assert loaded.module.aux_classifier is None
    _same_weights(loaded.module, no_aux)


# -- files that are not weights, and weights that declare more than the memory ----------------


def _factory(tmp_path) -> str:
    (tmp_path / "mlp_factory.py").write_text(
        "from torch import nn\n\ndef make():\n    return nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 3))\n")
    return f"{tmp_path / 'mlp_factory.py'}:make"


def test_an_exported_program_given_as_weights_is_named_as_a_model(tmp_path, capsys):
    model = nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 3))
    program = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 10),)), program)
    code = main(["capture", "--model", _factory(tmp_path), "--trust", "--weights", str(program), "--random", "2x10",
                 "--out", str(tmp_path / "o.pt"), "-q"])
    err = capsys.readouterr().err
    assert code == 1 and "is a torch.export program (a whole model with its code), not a weights file" in err, err
    assert "--model FILE --trust" in err and "damaged" not in err and "improved" not in err, err


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")  # torch's own deprecation of TorchScript
def test_a_torchscript_archive_given_as_weights_is_named(tmp_path):
    model = nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 3))
    scripted = tmp_path / "mlp_script.pt"
    torch.jit.save(torch.jit.script(model), scripted)
    with pytest.raises(ModelLoadError, match="is a TorchScript archive"):
        load_model(_factory(tmp_path), weights=str(scripted), trust=True)


def test_weights_declaring_more_than_the_memory_are_refused_before_a_model_is_built(tmp_path, monkeypatch):
    """A fine-tuned classifier's head read off the file: an expanded view stored in a few
    bytes would have resnet18 rebuilt with 100,000 classes (200 MB here; a billion classes
    the same way)."""
    import gradexplorer.base.devices as devices
    from gradexplorer.base.tensor_memory import TensorTooLarge

    state = _reference("resnet18").state_dict()
    state["fc.weight"] = torch.zeros(1).expand(100_000, 512)
    state["fc.bias"] = torch.zeros(1).expand(100_000)
    path = tmp_path / "bomb.pth"
    torch.save(state, path)
    assert path.stat().st_size < 50 << 20  # the resnet's own weights; the head takes 8 bytes
    monkeypatch.setattr(devices, "free_memory", lambda device: 64 << 20)  # a budget of 32 MiB
    built = []
    real = torchvision.models.get_model
    monkeypatch.setattr(torchvision.models, "get_model", lambda *a, **k: built.append(k) or real(*a, **k))
    with pytest.raises(TensorTooLarge) as info:
        load_model("resnet18", weights=str(path))
    assert "'fc.weight'" in info.value.problem and "100000x512" in info.value.problem
    assert "51,200,000 elements" in info.value.problem and "expanded view" in info.value.problem
    assert all("num_classes" not in k for k in built)
