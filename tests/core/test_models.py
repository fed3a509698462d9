"""load_model: torchvision names, demos, checkpoint files, factories, and trust."""

import pickle
import textwrap
import warnings
from pathlib import Path
from urllib.error import URLError

import pytest
import torch
import torchvision
from PIL import Image
from torch import nn

import gradexplorer.models.weights as weights_mod
from gradexplorer.base.errors import ModelLoadError, TrustRequired
from gradexplorer.models import load_model
from gradexplorer.models.loaded_model import LoadedModel


@pytest.fixture(autouse=True)
def offline_private_cache(tmp_path, monkeypatch):
    """No test may reach the network or the user's real torch hub cache."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))

    def offline(*args, **kwargs):
        raise URLError("network is unreachable (test)")

    monkeypatch.setattr(weights_mod, "urlopen", offline)

    def no_hub(*args, **kwargs):
        raise AssertionError("torch.hub's unsafe loader was called")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_hub)
    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", no_hub)


class _Hostile:
    """Unpickling this creates a marker file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _tiny() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


# --- torchvision names ---------------------------------------------------------------------


def test_random_resnet18():
    loaded = load_model("resnet18")
    assert isinstance(loaded, LoadedModel)
    assert isinstance(loaded.module, torchvision.models.ResNet)
    assert not any(m.training for m in loaded.module.modules())
    assert loaded.spec == loaded.name == "resnet18"
    assert loaded.weights is None
    # Random weights, ImageNet's class names: "Greater Swiss Mountain dog", not "class 238".
    assert len(loaded.categories) == 1000 and loaded.categories[238] == "Greater Swiss Mountain dog"
    assert "class names borrowed from ResNet18_Weights.IMAGENET1K_V1" in loaded.notes
    assert loaded.task == "classification"
    assert loaded.input_shape == (3, 224, 224)
    assert "crop_size=[224]" in loaded.preprocess_description
    assert "\n" not in loaded.preprocess_description
    x = loaded.preprocess(Image.new("RGB", (300, 260), (200, 30, 30)))
    assert x.shape == (3, 224, 224) and x.dtype == torch.float32


def test_names_are_case_insensitive():
    assert load_model(" SqueezeNet1_0 ").name == "squeezenet1_0"


def test_unknown_name_suggests_near_names():
    with pytest.raises(ModelLoadError) as info:
        load_model("resnt18")
    assert "resnet18" in info.value.fix
    assert "'resnt18'" in info.value.problem


def test_unknown_name_without_near_names():
    with pytest.raises(ModelLoadError, match="gradexplorer models"):
        load_model("zzzqqq")


def test_empty_spec():
    with pytest.raises(ModelLoadError, match="No model"):
        load_model("  ")


def test_unknown_weights_name_lists_choices():
    with pytest.raises(ModelLoadError, match="IMAGENET1K_V1"):
        load_model("resnet18", weights="IMAGENET1K_V7")


def test_arch_is_refused_with_a_torchvision_name():
    with pytest.raises(ModelLoadError, match="architecture"):
        load_model("resnet18", arch="resnet50")


@pytest.mark.slow
def test_googlenet_and_inception_build_quietly_without_aux_heads():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        googlenet = load_model("googlenet").module
        inception = load_model("inception_v3")
    assert googlenet.aux1 is None and googlenet.aux2 is None
    assert inception.module.AuxLogits is None
    assert inception.input_shape == (3, 299, 299)


@pytest.mark.slow
def test_every_torchvision_builder_builds_quietly_without_downloading():
    # On the meta device nothing is allocated, so all 121 builders take seconds, not minutes.
    # RegNet computes its widths with tensor ops that meta cannot run; one is built for real.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in torchvision.models.list_models():
            if name.startswith("regnet"):
                continue
            with torch.device("meta"):
                loaded = load_model(name)
            assert not loaded.module.training, name
            assert loaded.input_shape is not None, name
        assert load_model("regnet_x_400mf").task == "classification"


def test_random_detection_model_does_not_fetch_its_backbone():
    # The builder's default weights_backbone would download ImageNet weights (offline: fail;
    # the fixture also fails any use of torch.hub's loader).
    loaded = load_model("fasterrcnn_mobilenet_v3_large_320_fpn")
    assert loaded.task == "detection"
    assert loaded.input_shape == (3, 224, 224)
    assert loaded.categories is None


def test_segmentation_input_shape_follows_its_resize():
    loaded = load_model("lraspp_mobilenet_v3_large")
    assert loaded.task == "segmentation"
    assert loaded.input_shape == (3, 520, 520)


@pytest.mark.slow
def test_video_input_shape_is_channels_frames_height_width():
    loaded = load_model("r3d_18")
    assert loaded.task == "video"
    assert loaded.input_shape == (3, 16, 112, 112)
    out = loaded.module(torch.zeros(1, *loaded.input_shape))
    assert out.shape == (1, 400)


def test_random_quantized_model_stays_float_and_hookable():
    loaded = load_model("quantized_mobilenet_v3_large")
    assert loaded.task == "quantized"
    assert all(p.dtype == torch.float32 for p in loaded.module.parameters())


def test_weights_file_for_a_torchvision_model(tmp_path):
    state = torchvision.models.squeezenet1_0().state_dict()
    state["classifier.1.bias"][3] = 7.0
    path = tmp_path / "my_squeeze.pth"
    torch.save(state, path)
    loaded = load_model("squeezenet1_0", weights=str(path))
    assert loaded.module.classifier[1].bias[3].item() == 7.0
    assert loaded.weights == f"file:{path}"
    assert loaded.categories is None  # a user's file may hold any classes


def test_missing_weights_file(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model("resnet18", weights=str(tmp_path / "nope.pth"))


# --- demos -------------------------------------------------------------------------------


def test_demo_specs_delegate_to_core_demos():
    demos = pytest.importorskip("gradexplorer.models.demos")
    loaded = load_model("demo:seed-mlp")
    assert loaded.spec == "demo:seed-mlp"
    assert isinstance(loaded.module, demos.SeedMLP)


def test_weights_are_refused_for_demos():
    with pytest.raises(ModelLoadError, match="Weights cannot be chosen"):
        load_model("demo:shapes", weights="DEFAULT")


# --- checkpoint files: state dicts -------------------------------------------------------


@pytest.fixture
def squeeze_state():
    state = torchvision.models.squeezenet1_0().state_dict()
    state["features.0.bias"][0] = 42.0
    return state


@pytest.mark.parametrize(
    "wrap",
    [
        lambda s: s,
        lambda s: {"state_dict": s, "epoch": 3},
        lambda s: {"model_state_dict": s, "optimizer": {}, "loss": 0.5},
        lambda s: {"model": s},
        lambda s: {f"module.{k}": v for k, v in s.items()},  # saved from DataParallel
    ],
    ids=["plain", "state_dict", "model_state_dict", "model", "dataparallel"],
)
def test_state_dict_checkpoint_with_arch(tmp_path, squeeze_state, wrap):
    path = tmp_path / "ckpt.pth"
    torch.save(wrap(squeeze_state), path)
    loaded = load_model(str(path), arch="squeezenet1_0")
    assert loaded.module.features[0].bias[0].item() == 42.0
    assert not loaded.module.training
    assert loaded.weights == f"file:{path}"
    assert loaded.task == "classification"
    assert loaded.input_shape == (3, 224, 224)
    assert loaded.spec == str(path)


def test_state_dict_checkpoint_without_arch_says_to_pass_it(tmp_path, squeeze_state):
    path = tmp_path / "ckpt.pt"
    torch.save(squeeze_state, path)
    with pytest.raises(ModelLoadError) as info:
        load_model(str(path))
    assert "weights only" in info.value.problem
    assert "--arch" in info.value.fix


def test_state_dict_checkpoint_with_wrong_arch_names_the_keys(tmp_path, squeeze_state):
    path = tmp_path / "ckpt.pth"
    torch.save(squeeze_state, path)
    with pytest.raises(ModelLoadError) as info:
        load_model(str(path), arch="resnet18")
    message = str(info.value)
    assert "do not fit resnet18" in message
    assert "missing" in message and "unexpected" in message
    assert "conv1.weight" in message or "features.0.weight" in message


def test_state_dict_checkpoint_with_unknown_arch_suggests(tmp_path, squeeze_state):
    path = tmp_path / "ckpt.pth"
    torch.save(squeeze_state, path)
    with pytest.raises(ModelLoadError, match="squeezenet1_0"):
        load_model(str(path), arch="squeezenet10")


def test_fine_tuned_head_is_rebuilt_with_its_number_of_classes(tmp_path):
    model = torchvision.models.resnet18(num_classes=10)
    path = tmp_path / "finetuned.pth"
    torch.save(model.state_dict(), path)
    loaded = load_model(str(path), arch="resnet18")
    assert loaded.module.fc.out_features == 10
    assert torch.equal(loaded.module.fc.weight, model.fc.weight)
    assert any("num_classes=10" in note for note in loaded.notes)


# --- checkpoint files: whole modules, trust, hostile pickles ------------------------------


def test_pickled_module_needs_trust(tmp_path):
    model = _tiny()
    path = tmp_path / "whole.pt"
    torch.save(model, path)
    with pytest.raises(TrustRequired) as info:
        load_model(str(path))
    assert "torch.nn.modules.linear.Linear" in info.value.problem
    assert "trust" in info.value.fix

    loaded = load_model(str(path), trust=True)
    assert isinstance(loaded.module, nn.Sequential)
    assert not loaded.module.training
    assert torch.equal(loaded.module[0].weight, model[0].weight)
    assert loaded.task == "other"


def test_trusted_checkpoint_dict_holding_a_module(tmp_path):
    path = tmp_path / "whole.pt"
    torch.save({"model": _tiny(), "epoch": 1}, path)
    assert isinstance(load_model(str(path), trust=True).module, nn.Sequential)


@pytest.mark.parametrize("raw", [False, True], ids=["torch.save", "pickle.dump"])
def test_hostile_pickle_never_runs_without_trust(tmp_path, raw):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    if raw:
        with open(path, "wb") as f:
            pickle.dump({"weight": _Hostile(marker)}, f)
    else:
        torch.save({"weight": _Hostile(marker)}, path)
    with pytest.raises(TrustRequired) as info:
        load_model(str(path))
    assert "open" in info.value.problem  # the global it would have called is named
    assert not marker.exists()
    with pytest.raises(TrustRequired):
        load_model(str(path), arch="resnet18")
    assert not marker.exists()


def test_hostile_weights_file_for_a_torchvision_model_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    torch.save({"fc.bias": _Hostile(marker)}, path)
    # Refused outright: trust is for the model file or factory, so asking for it would not help.
    with pytest.raises(ModelLoadError) as info:
        load_model("resnet18", weights=str(path))
    assert not isinstance(info.value, TrustRequired)
    assert not marker.exists()


def test_torchscript_archive_is_refused_with_advice(tmp_path):
    path = tmp_path / "scripted.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated; we only need the archive
        torch.jit.save(torch.jit.script(_tiny()), path)
    with pytest.raises(ModelLoadError) as info:
        load_model(str(path), trust=True)
    assert "TorchScript" in info.value.problem and "hook" in info.value.problem
    assert "state_dict" in info.value.fix


@pytest.fixture
def exported(tmp_path):
    path = tmp_path / "model.pt2"
    program = torch.export.export(_tiny(), (torch.randn(2, 4),))
    torch.export.save(program, path)
    return path


def test_export_archive_needs_trust(exported):
    with pytest.raises(TrustRequired, match=r"torch\.export"):
        load_model(str(exported))


def test_export_archive_is_unflattened_so_child_hooks_fire(exported):
    loaded = load_model(str(exported), trust=True)
    assert loaded.input_shape == (4,)
    calls = []
    child = dict(loaded.module.named_children())["0"]
    handle = child.register_forward_hook(lambda m, i, o: calls.append(o.shape))
    try:
        x = torch.randn(2, 4, requires_grad=True)
        loaded.module(x).sum().backward()
    finally:
        handle.remove()
    assert calls == [torch.Size([2, 3])]
    assert x.grad is not None


def test_missing_checkpoint(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist") as info:
        load_model(str(tmp_path / "gone.pth"))
    assert "gone.pth" in info.value.problem


def test_empty_checkpoint(tmp_path):
    path = tmp_path / "empty.pth"
    path.touch()
    with pytest.raises(ModelLoadError, match="is empty"):
        load_model(str(path))


@pytest.mark.parametrize("content", [b"not a checkpoint at all" * 10, b"PK\x03\x04broken zip"])
def test_corrupt_checkpoint(tmp_path, content):
    path = tmp_path / "corrupt.pth"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError) as info:
        load_model(str(path), trust=True)
    assert not isinstance(info.value, TrustRequired)
    assert "corrupt.pth" in info.value.problem


def test_truncated_checkpoint(tmp_path, squeeze_state):
    path = tmp_path / "cut.pth"
    torch.save(squeeze_state, path)
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match=r"cut\.pth"):
        load_model(str(path), arch="squeezenet1_0")


def test_checkpoint_holding_something_else(tmp_path):
    path = tmp_path / "list.pth"
    torch.save([1, 2, 3], path)
    with pytest.raises(ModelLoadError, match="neither a model nor a state dict"):
        load_model(str(path))


# --- factories ---------------------------------------------------------------------------


@pytest.fixture
def factory_file(tmp_path):
    marker = tmp_path / "imported"
    path = tmp_path / "factories.py"
    path.write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path
            from torch import nn
            from helper import WIDTH  # a neighbour module: the file's folder is importable

            Path({str(marker)!r}).touch()

            def make():
                return nn.Linear(WIDTH, 2)

            def broken():
                raise ValueError("boom")

            def wrong():
                return {{"not": "a module"}}

            NOT_CALLABLE = 3
            """
        )
    )
    (tmp_path / "helper.py").write_text("WIDTH = 5\n")
    return path, marker


def test_factory_file_needs_trust_and_runs_nothing_without_it(factory_file):
    path, marker = factory_file
    with pytest.raises(TrustRequired) as info:
        load_model(f"{path}:make")
    assert "runs" in info.value.problem
    assert not marker.exists()


def test_factory_file_with_trust(factory_file):
    path, marker = factory_file
    loaded = load_model(f"{path}:make", trust=True)
    assert isinstance(loaded.module, nn.Linear) and loaded.module.in_features == 5
    assert not loaded.module.training
    assert loaded.name == f"{path.stem}.make" and loaded.spec == f"{path}:make"  # named by its file too
    assert marker.exists()
    assert str(path.parent) not in __import__("sys").path  # put back after the import


def test_factory_that_raises(factory_file):
    path, _ = factory_file
    with pytest.raises(ModelLoadError) as info:
        load_model(f"{path}:broken", trust=True)
    assert "ValueError" in info.value.problem and "boom" in info.value.problem


def test_factory_returning_a_non_module(factory_file):
    path, _ = factory_file
    with pytest.raises(ModelLoadError) as info:
        load_model(f"{path}:wrong", trust=True)
    assert "builtins.dict" in info.value.problem


def test_factory_attribute_missing_or_not_callable(factory_file):
    path, _ = factory_file
    with pytest.raises(ModelLoadError, match="no attribute 'nope'"):
        load_model(f"{path}:nope", trust=True)
    with pytest.raises(ModelLoadError, match="not a callable"):
        load_model(f"{path}:NOT_CALLABLE", trust=True)


def test_factory_file_missing(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(f"{tmp_path / 'nowhere.py'}:make")


def test_factory_from_an_importable_module():
    with pytest.raises(TrustRequired):
        load_model("torch.nn:Identity")
    assert isinstance(load_model("torch.nn:Identity", trust=True).module, nn.Identity)


def test_factory_module_that_cannot_be_imported():
    with pytest.raises(ModelLoadError, match="ModuleNotFoundError"):
        load_model("no_such_package_xyz.models:make", trust=True)


def test_factory_with_a_weights_file(factory_file, tmp_path):
    path, _ = factory_file
    weights = tmp_path / "linear.pth"
    state = nn.Linear(5, 2).state_dict()
    torch.save(state, weights)
    loaded = load_model(f"{path}:make", trust=True, weights=str(weights))
    assert torch.equal(loaded.module.weight, state["weight"])
    assert loaded.weights == f"file:{weights}"
