"""torchvision weights: catalogue, cache, offline behaviour, safe loading, downloads."""

import hashlib
import io
import os
import re
import threading
import warnings
from pathlib import Path
from urllib.error import URLError

import pytest
import torch
import torchvision
from torchvision.models import ResNet18_Weights

import gradexplorer.models.weights as weights_mod
from gradexplorer.base.errors import CaptureCancelled, ModelLoadError, WeightsUnavailable
from gradexplorer.models import load_model
from gradexplorer.models.weights import (
    cache_dir,
    fetch_weights,
    is_cached,
    model_catalog,
    model_task,
    resolve_weights,
    weights_file,
)

RESNET18_FILE = os.path.basename(ResNet18_Weights.IMAGENET1K_V1.url)
MARKER_VALUE = 1234.5


@pytest.fixture(autouse=True)
def torch_home(tmp_path, monkeypatch):
    """A private, empty torch hub cache, and no network."""
    home = tmp_path / "torch_home"
    monkeypatch.setenv("TORCH_HOME", str(home))
    monkeypatch.delenv("TORCH_HUB", raising=False)

    def offline(*args, **kwargs):
        raise URLError("network is unreachable (test)")

    monkeypatch.setattr(weights_mod, "urlopen", offline)
    return home


def _marked_resnet18_state() -> dict:
    state = torchvision.models.resnet18().state_dict()
    state["fc.bias"][0] = MARKER_VALUE
    return state


def _plant(path: Path, obj: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)
    return path


class _Hostile:
    """Unpickling this creates a marker file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


# --- cache location ------------------------------------------------------------------------


def test_cache_dir_follows_torch_home(torch_home):
    assert cache_dir() == torch_home / "hub" / "checkpoints"
    assert weights_file(ResNet18_Weights.IMAGENET1K_V1) == cache_dir() / RESNET18_FILE
    assert RESNET18_FILE.startswith("resnet18-") and RESNET18_FILE.endswith(".pth")


def test_is_cached_sees_a_planted_file():
    w = ResNet18_Weights.IMAGENET1K_V1
    assert not is_cached(w)
    _plant(weights_file(w), {"x": torch.zeros(1)})
    assert is_cached(w)


# --- catalogue -----------------------------------------------------------------------------


def test_catalog_lists_every_model_quickly():
    _plant(cache_dir() / RESNET18_FILE, {"x": torch.zeros(1)})
    catalog = model_catalog()
    assert [info.name for info in catalog] == sorted(torchvision.models.list_models())
    by_name = {info.name: info for info in catalog}
    resnet = by_name["resnet18"]
    assert resnet.task == "classification"
    assert resnet.weights == ("ResNet18_Weights.IMAGENET1K_V1",)
    assert resnet.default_weights == "ResNet18_Weights.IMAGENET1K_V1"
    assert resnet.cached == ("ResNet18_Weights.IMAGENET1K_V1",)
    assert by_name["resnet50"].cached == ()
    assert len(by_name["resnet50"].weights) == 2  # V1 and V2; DEFAULT is an alias, not listed
    assert by_name["quantized_resnet18"].task == "quantized"


@pytest.mark.parametrize(
    ("name", "task"),
    [
        ("resnet18", "classification"),
        ("vit_b_16", "classification"),
        ("fcn_resnet50", "segmentation"),
        ("deeplabv3_mobilenet_v3_large", "segmentation"),
        ("r3d_18", "video"),
        ("mvit_v2_s", "video"),
        ("fasterrcnn_resnet50_fpn", "detection"),
        ("ssdlite320_mobilenet_v3_large", "detection"),
        ("raft_small", "optical_flow"),
        ("quantized_mobilenet_v3_large", "quantized"),
    ],
)
def test_model_task_from_module_path(name, task):
    assert model_task(name) == task


# --- resolving names -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["DEFAULT", "default", "IMAGENET1K_V1", "imagenet1k_v1", "ResNet18_Weights.IMAGENET1K_V1"],
)
def test_resolve_weights_accepts_every_spelling(text):
    assert resolve_weights("resnet18", text) is ResNet18_Weights.IMAGENET1K_V1


@pytest.mark.parametrize("text", [None, "", "none", "None"])
def test_resolve_weights_none_means_random(text):
    assert resolve_weights("resnet18", text) is None


def test_resolve_weights_default_of_quantized_model():
    w = resolve_weights("quantized_resnet18", "DEFAULT")
    assert type(w).__name__ == "ResNet18_QuantizedWeights"


def test_resolve_weights_unknown_member_lists_choices():
    with pytest.raises(ModelLoadError) as info:
        resolve_weights("resnet50", "IMAGENET1K_V9")
    assert "IMAGENET1K_V1" in str(info.value) and "IMAGENET1K_V2" in str(info.value)


def test_resolve_weights_of_another_model_is_refused():
    with pytest.raises(ModelLoadError, match="ResNet50_Weights"):
        resolve_weights("resnet18", "ResNet50_Weights.IMAGENET1K_V1")


# --- offline: cached weights, missing weights, planted files ------------------------------


def test_cached_weights_load_without_network():
    _plant(cache_dir() / RESNET18_FILE, _marked_resnet18_state())
    loaded = load_model("resnet18", weights="DEFAULT")
    assert loaded.module.fc.bias[0].item() == MARKER_VALUE
    assert loaded.weights == "ResNet18_Weights.IMAGENET1K_V1"
    assert loaded.categories is not None and len(loaded.categories) == 1000
    assert loaded.categories[0] == "tench"
    assert not loaded.module.training
    assert is_cached(ResNet18_Weights.IMAGENET1K_V1)


def test_missing_weights_offline_name_file_and_cache_folder():
    with pytest.raises(WeightsUnavailable) as info:
        load_model("resnet18", weights="IMAGENET1K_V1")
    message = str(info.value)
    assert RESNET18_FILE in message
    assert str(cache_dir()) in message
    assert "--weights" in message
    assert not cache_dir().exists() or not any(cache_dir().iterdir())


def test_fetch_weights_offline_raises_weights_unavailable():
    with pytest.raises(WeightsUnavailable) as info:
        fetch_weights(ResNet18_Weights.IMAGENET1K_V1)
    assert RESNET18_FILE in info.value.problem
    assert str(weights_file(ResNet18_Weights.IMAGENET1K_V1)) in info.value.fix


def test_a_copy_passed_with_weights_loads_as_the_torchvision_weights(tmp_path):
    copy = _plant(tmp_path / "elsewhere" / RESNET18_FILE, _marked_resnet18_state())
    loaded = load_model("resnet18", weights=str(copy))
    assert loaded.module.fc.bias[0].item() == MARKER_VALUE
    assert loaded.weights == "ResNet18_Weights.IMAGENET1K_V1"
    assert loaded.categories[0] == "tench"
    assert not is_cached(ResNet18_Weights.IMAGENET1K_V1)  # used in place, not copied


def test_a_planted_hostile_cache_file_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    _plant(cache_dir() / RESNET18_FILE, {"fc.bias": _Hostile(marker)})
    # Not even trust=True unpickles torchvision's cache: trust is for the user's own files.
    with pytest.raises(ModelLoadError) as info:
        load_model("resnet18", weights="DEFAULT", trust=True)
    assert not marker.exists()
    assert RESNET18_FILE in str(info.value)
    assert "safely" in str(info.value)


def test_a_cached_file_that_does_not_fit_says_so():
    _plant(cache_dir() / RESNET18_FILE, {"fc.bias": torch.zeros(3)})
    with pytest.raises(ModelLoadError, match="does not fit resnet18"):
        load_model("resnet18", weights="DEFAULT")


@pytest.mark.slow
def test_builder_adjustments_still_apply_to_safely_loaded_weights():
    # torchvision's GoogLeNet file has aux heads; the builder loads it with them, then drops
    # them and turns on transform_input. Loading through our safe path keeps all of that.
    w = resolve_weights("googlenet", "DEFAULT")
    source = torchvision.models.googlenet(aux_logits=True, init_weights=True)
    state = source.state_dict()
    state["fc.bias"][0] = MARKER_VALUE
    _plant(weights_file(w), state)
    module = load_model("googlenet", weights="DEFAULT").module
    assert module.aux1 is None and module.aux2 is None
    assert module.transform_input
    assert module.fc.bias[0].item() == MARKER_VALUE


@pytest.mark.slow
def test_quantized_weights_load_safely_and_quietly():
    name = "quantized_shufflenet_v2_x0_5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # making the fixture goes through deprecated torch.ao
        source = torchvision.models.get_model(name, weights=None, quantize=True)
    _plant(weights_file(resolve_weights(name, "DEFAULT")), source.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_model(name, weights="DEFAULT")
    assert loaded.task == "quantized"
    assert loaded.module(torch.rand(1, 3, 224, 224)).shape == (1, 1000)


# --- downloading ---------------------------------------------------------------------------


class _FakeWeights:
    """Stands in for a WeightsEnum member: fetch_weights needs only url and name."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.name = "TEST_V1"


class _FakeResponse(io.BytesIO):
    def __init__(self, payload: bytes, length: bool = True) -> None:
        super().__init__(payload)
        self.headers = {"Content-Length": str(len(payload))} if length else {}


def _serve(monkeypatch, payload: bytes, length: bool = True):
    requests = []

    def fake_urlopen(request, timeout=None):
        requests.append(request.full_url)
        return _FakeResponse(payload, length)

    monkeypatch.setattr(weights_mod, "urlopen", fake_urlopen)
    monkeypatch.setattr(weights_mod, "_CHUNK", 1000)
    return requests


def _payload_and_name(size: int = 4500) -> tuple[bytes, str]:
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    prefix = hashlib.sha256(payload).hexdigest()[:8]
    return payload, f"tiny-{prefix}.pth"


def test_fetch_weights_downloads_with_progress_and_hash_check(monkeypatch):
    payload, name = _payload_and_name()
    requests = _serve(monkeypatch, payload)
    weights = _FakeWeights(f"https://example.invalid/models/{name}")
    seen = []
    path = fetch_weights(weights, progress=lambda done, total: seen.append((done, total)))
    assert path == cache_dir() / name
    assert path.read_bytes() == payload
    assert requests == [weights.url]
    assert seen[0] == (0, len(payload)) and seen[-1] == (len(payload), len(payload))
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert sorted(os.listdir(cache_dir())) == [name]  # no partial file left
    # Cached now: a second call does not download again.
    assert fetch_weights(weights) == path and len(requests) == 1


def test_fetch_weights_without_content_length_reports_total_zero(monkeypatch):
    payload, name = _payload_and_name(2500)
    _serve(monkeypatch, payload, length=False)
    seen = []
    fetch_weights(_FakeWeights(f"https://x.invalid/{name}"), progress=lambda d, t: seen.append(t))
    assert set(seen) == {0}


def test_fetch_weights_rejects_a_damaged_download(monkeypatch):
    payload, name = _payload_and_name()
    _serve(monkeypatch, payload[:-1] + b"?")
    with pytest.raises(WeightsUnavailable, match="damaged"):
        fetch_weights(_FakeWeights(f"https://x.invalid/{name}"))
    assert os.listdir(cache_dir()) == []


def test_fetch_weights_can_be_cancelled(monkeypatch):
    payload, name = _payload_and_name()
    _serve(monkeypatch, payload)
    cancel = threading.Event()

    def progress(done, total):
        if done >= 2000:
            cancel.set()

    with pytest.raises(CaptureCancelled):
        fetch_weights(_FakeWeights(f"https://x.invalid/{name}"), progress=progress, cancel=cancel)
    assert os.listdir(cache_dir()) == []


def test_load_model_downloads_missing_weights_then_loads_them_safely(monkeypatch):
    buffer = io.BytesIO()
    torch.save(_marked_resnet18_state(), buffer)
    payload = buffer.getvalue()
    # The real file name carries the real hash prefix; this payload cannot match it.
    monkeypatch.setattr(weights_mod, "_HASH_PREFIX", re.compile(r"(?!)"))
    _serve(monkeypatch, payload)
    monkeypatch.setattr(weights_mod, "_CHUNK", 1 << 20)
    seen = []
    loaded = load_model("resnet18", weights="DEFAULT", progress=lambda d, t: seen.append(d))
    assert loaded.module.fc.bias[0].item() == MARKER_VALUE
    assert seen[-1] == len(payload)
    assert is_cached(ResNet18_Weights.IMAGENET1K_V1)
