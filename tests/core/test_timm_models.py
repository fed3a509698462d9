"""timm models by name, offline: weights placed where timm's Hugging Face loader looks
(``hub/models--timm--NAME/snapshots/REV/model.safetensors`` and ``refs/main``), every
capture checked against ``torch.autograd.grad``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gradexplorer.base.errors import ModelLoadError, WeightsUnavailable
from gradexplorer.batches.random_batches import random_shape_for
from gradexplorer.models import load_model
from gradexplorer.models.input_size import declared_input_shape
from gradexplorer.pipeline.job import default_batch_spec
from tests.core.test_capture import check_against_reference

timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")

REVISION = "0123456789abcdef0123456789abcdef01234567"


def plant_weights(home: Path, name: str, seed: int = 123) -> dict[str, torch.Tensor]:
    """A random ``name`` saved as the Hugging Face cache holds timm's default weights."""
    repo = timm.models.get_pretrained_cfg(name).hf_hub_id
    torch.manual_seed(seed)
    state = {k: v.contiguous() for k, v in timm.create_model(name, pretrained=False).state_dict().items()}
    folder = home / "hub" / ("models--" + repo.replace("/", "--"))
    (folder / "snapshots" / REVISION).mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(REVISION)
    safetensors_torch.save_file(state, folder / "snapshots" / REVISION / "model.safetensors")
    return state


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    home.mkdir()
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args, **kwargs):
        raise AssertionError("the Hugging Face hub was called")

    # Cached weights must load without asking the hub anything.
    monkeypatch.setattr(timm.models._hub, "hf_hub_download", no_network)
    return home


def test_default_weights_load_offline_from_the_hf_cache_and_capture_exactly(hf_home):
    state = plant_weights(hf_home, "resnet18")
    loaded = load_model("timm:resnet18", weights="DEFAULT")
    assert loaded.weights == "timm/resnet18.a1_in1k"
    own = loaded.module.state_dict()
    assert all(torch.equal(own[k], v) for k, v in state.items())
    assert loaded.input_shape == (3, 224, 224)
    assert "crop 224×224" in loaded.preprocess_description and "bicubic" in loaded.preprocess_description
    assert loaded.categories is not None and len(loaded.categories) == 1000
    from PIL import Image

    assert loaded.preprocess(Image.new("RGB", (300, 260))).shape == (3, 224, 224)
    x = torch.randn(2, 3, 64, 64)
    check_against_reference(loaded.module, x, layers=["conv1", "layer1.0.bn2", "layer4.1", "fc"])


def test_default_weights_not_cached_while_offline_are_refused_in_words(hf_home):
    with pytest.raises(WeightsUnavailable, match="HF_HUB_OFFLINE"):
        load_model("timm:resnet18", weights="DEFAULT")


def test_random_init_is_seeded_said_and_leaves_the_callers_random_state(hf_home):
    torch.manual_seed(7)
    expected_next = torch.rand(1)
    torch.manual_seed(7)
    a = load_model("timm:resnet18")
    assert torch.equal(torch.rand(1), expected_next)
    b = load_model("timm:resnet18")
    assert a.weights is None and any("seed" in note for note in a.notes)
    assert all(torch.equal(v, b.module.state_dict()[k]) for k, v in a.module.state_dict().items())


def test_unknown_name_suggests_close_ones():
    with pytest.raises(ModelLoadError, match="timm:resnet18"):
        load_model("timm:resnet1B")


def test_convnext_and_vit_capture_exactly_with_their_declared_input(hf_home):
    loaded = load_model("timm:vit_tiny_patch16_224")
    assert loaded.input_shape == (3, 224, 224)
    x = torch.randn(1, 3, 224, 224)
    check_against_reference(loaded.module, x, layers=["patch_embed.proj", "blocks.0.attn", "head"])


def test_a_factory_model_gets_the_input_size_it_declares_not_a_guess(tmp_path):
    # timm's vit_tiny through a factory: its patch embedding takes 224×224 only.
    loaded = load_model("timm.models:vit_tiny_patch16_224", trust=True)
    assert loaded.input_shape == (3, 224, 224)
    spec = default_batch_spec(loaded)
    assert spec is not None and spec.random == "2x3x224x224"
    # A live module with no LoadedModel around it (explore, pickles) is asked too.
    assert random_shape_for(loaded.module, None) == (2, 3, 224, 224)


def test_declared_input_shape_of_a_hugging_face_vision_config():
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(image_size=48, patch_size=16, num_channels=3, hidden_size=32,
                                    num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    model = transformers.ViTModel(config)
    assert declared_input_shape(model) == (3, 48, 48)
    assert random_shape_for(model, None) == (2, 3, 48, 48)


def test_the_catalog_lists_timm_models_and_their_cache_state(hf_home):
    from gradexplorer.models.timm_models import timm_catalog

    plant_weights(hf_home, "resnet18")
    catalog = {info.name: info for info in timm_catalog()}
    assert catalog["timm:resnet18"].cached == ("timm/resnet18.a1_in1k",)
    assert catalog["timm:resnet34"].cached == ()
    assert catalog["timm:resnet34"].task == "timm"


@pytest.mark.slow
def test_default_weights_not_cached_download_into_the_cache_with_progress(tmp_path, monkeypatch):
    """The download path, against a Hub on the loopback address serving timm's repository:
    the weights land in the Hugging Face cache with their bytes reported, load into the
    model, and are read from the cache from then on."""
    from tests.hf_fake_hub import FakeHub

    repo = timm.models.get_pretrained_cfg("resnet18").hf_hub_id
    folder = tmp_path / "served"
    folder.mkdir()
    torch.manual_seed(5)
    state = {k: v.contiguous() for k, v in timm.create_model("resnet18", pretrained=False).state_dict().items()}
    safetensors_torch.save_file(state, folder / "model.safetensors")
    home = tmp_path / "hf"
    with FakeHub(folder, repo=repo) as hub:
        hub.point_hub_here(monkeypatch, home)
        reports: list[tuple[int, int]] = []
        loaded = load_model("timm:resnet18", weights="DEFAULT", progress=lambda d, t: reports.append((d, t)))
        size = (folder / "model.safetensors").stat().st_size
        assert reports and reports[-1] == (size, size) and len(reports) > 1
        assert [d for d, _ in reports] == sorted(d for d, _ in reports)
        own = loaded.module.state_dict()
        assert all(torch.equal(own[k], v) for k, v in state.items())
        from gradexplorer.models.timm_models import cached_weights_file

        assert cached_weights_file(timm.models.get_pretrained_cfg("resnet18")) is not None
        asked = len(hub.requests)
        load_model("timm:resnet18", weights="DEFAULT")
        assert len(hub.requests) == asked  # cached now: no request
