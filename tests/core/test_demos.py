"""The built-in demos load offline, predict right, and their Grad-CAM points at the shape."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from gradexplorer.analysis.gradcam import grad_cam
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.inputs import Batch
from gradexplorer.models import demos, shape_pictures as shapes
from gradexplorer.models.loaded_model import LoadedModel

# Seeds never used by scripts/make_shapes_demo.py (training 1000-1009, validation 2, samples 3).
FRESH_SEED = 20_240_601
FRESH_SAMPLES = 200


@pytest.fixture(scope="module")
def shapes_demo() -> LoadedModel:
    return demos.load_demo("demo:shapes")


def _assert_no_hooks(model: nn.Module) -> None:
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks and not module._backward_hooks


def test_list_demos():
    listed = demos.list_demos()
    assert [spec for spec, _ in listed] == ["demo:shapes", "demo:seed-mlp"]
    assert all(isinstance(text, str) and text for _, text in listed)


@pytest.mark.parametrize("name", ["seed-mlp", "demo:seed-mlp", " demo:seed-mlp "])
def test_seed_mlp_loads_with_or_without_prefix(name):
    loaded = demos.load_demo(name)
    assert loaded.spec == "demo:seed-mlp"
    assert loaded.task == "demo" and loaded.input_shape == (10,)
    assert not loaded.module.training
    names = [n for n, _ in loaded.module.named_children()]
    assert names == ["fc1", "relu1", "fc2", "relu2", "fc3"]
    assert [(m.in_features, m.out_features) for m in (loaded.module.fc1, loaded.module.fc2, loaded.module.fc3)] \
        == [(10, 5), (5, 3), (3, 1)]


def test_seed_mlp_is_deterministic_and_leaves_the_global_rng_alone():
    torch.manual_seed(42)
    expected_next = torch.rand(3)
    torch.manual_seed(42)
    first = demos.load_demo("seed-mlp").module.state_dict()
    assert torch.equal(torch.rand(3), expected_next)
    second = demos.load_demo("seed-mlp").module.state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_seed_mlp_batch():
    batch = demos.demo_batch("demo:seed-mlp")
    assert isinstance(batch, Batch)
    assert batch.tensor.shape == (4, 10) and batch.labels is None and len(batch) == 4
    assert batch.names == [f"random[{i}]" for i in range(4)]
    assert torch.equal(batch.tensor, demos.demo_batch("seed-mlp").tensor)
    out = demos.load_demo("seed-mlp").module(batch.tensor)
    assert out.shape == (4, 1)


def test_unknown_demo_lists_the_demos():
    with pytest.raises(GradExplorerError) as info:
        demos.load_demo("demo:mnist")
    assert "demo:mnist" in info.value.problem
    assert "demo:shapes" in info.value.fix and "demo:seed-mlp" in info.value.fix
    with pytest.raises(GradExplorerError):
        demos.demo_batch("nope")


def test_shapes_demo_metadata(shapes_demo):
    assert shapes_demo.spec == "demo:shapes"
    assert shapes_demo.categories == list(shapes.SHAPE_CLASSES)
    assert shapes_demo.input_shape == (3, 64, 64)
    assert shapes_demo.task == "demo"
    assert not any(m.training for m in shapes_demo.module.modules())
    assert "normalise" in shapes_demo.preprocess_description
    assert demos.load_demo("shapes").spec == "demo:shapes"


def test_shapes_demo_exercises_the_hard_hook_cases(shapes_demo):
    model = shapes_demo.module
    inplace = [n for n, m in model.named_modules() if isinstance(m, nn.ReLU) and m.inplace]
    block_relu = f"{demos.SHAPES_CAM_LAYER}.relu"
    assert block_relu in inplace and "features.0.relu" in inplace
    assert isinstance(model.get_submodule(demos.SHAPES_CAM_LAYER), demos.ResidualBlock)
    calls = []
    handle = model.get_submodule(block_relu).register_forward_hook(lambda *a: calls.append(1))
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, 64, 64))
    finally:
        handle.remove()
    assert len(calls) == 2  # shared ReLU, like torchvision's BasicBlock


def test_cam_layer_is_32x32_at_64px(shapes_demo):
    seen = {}
    layer = shapes_demo.module.get_submodule(demos.SHAPES_CAM_LAYER)
    handle = layer.register_forward_hook(lambda m, i, o: seen.__setitem__("shape", tuple(o.shape)))
    try:
        with torch.no_grad():
            shapes_demo.module(torch.zeros(2, 3, 64, 64))
    finally:
        handle.remove()
    assert seen["shape"][0] == 2 and seen["shape"][2:] == (demos.SHAPES_CAM_GRID,) * 2 == (32, 32)


def test_checkpoint_is_small_float32_and_loads_weights_only():
    size = demos.SHAPES_CHECKPOINT.stat().st_size
    assert size < 1_000_000, f"shipped checkpoint is {size} bytes"
    state = torch.load(demos.SHAPES_CHECKPOINT, map_location="cpu", weights_only=True)
    assert set(state) == set(demos.ShapesCNN().state_dict())
    assert all(t.dtype == torch.float32 for t in state.values() if t.is_floating_point())


def test_preprocess_resizes_and_normalises(shapes_demo):
    picture = Image.new("RGB", (128, 96), (255, 0, 128))
    x = shapes_demo.preprocess(picture)
    assert x.shape == (3, 64, 64) and x.dtype == torch.float32
    expected = (torch.tensor([1.0, 0.0, 128 / 255]) - torch.tensor(shapes.MEAN)) / torch.tensor(shapes.STD)
    assert torch.allclose(x[:, 10, 10], expected, atol=1e-5)
    assert shapes_demo.preprocess(picture.convert("L")).shape == (3, 64, 64)


def test_shapes_batch_is_the_shipped_samples(shapes_demo):
    batch = demos.demo_batch("demo:shapes")
    labels = json.loads((demos.SHAPES_SAMPLES / "labels.json").read_text(encoding="utf-8"))
    assert batch.names == sorted(labels)
    assert len(batch) == len(labels) >= 8
    assert batch.source == f"{len(labels)} demo samples"
    assert batch.preprocessing == shapes_demo.preprocess_description
    assert [shapes.SHAPE_CLASSES[i] for i in batch.labels.tolist()] == [labels[n] for n in batch.names]
    assert set(batch.labels.tolist()) == set(range(len(shapes.SHAPE_CLASSES)))
    assert len(batch.images) == len(batch) and all(im.mode == "RGB" for im in batch.images)
    assert torch.equal(batch.tensor, torch.stack([shapes_demo.preprocess(im) for im in batch.images]))


def test_shipped_samples_are_predicted_right(shapes_demo):
    batch = demos.demo_batch("shapes")
    with torch.no_grad():
        predicted = shapes_demo.module(batch.tensor).argmax(1)
    right = (predicted == batch.labels).sum().item()
    assert right >= len(batch) - 1, f"{right}/{len(batch)} shipped samples predicted right"


@pytest.mark.slow
def test_grad_cam_from_captured_data_peaks_inside_the_shape(shapes_demo):
    """The demo's promise: on first launch Grad-CAM, from captured data, shows where the shape is."""
    model = shapes_demo.module
    layer = demos.SHAPES_CAM_LAYER
    rng = np.random.default_rng(FRESH_SEED)
    pictures, labels, masks = [], [], []
    for _ in range(FRESH_SAMPLES):
        picture, label, mask = shapes.draw_sample(rng)
        pictures.append(picture)
        labels.append(label)
        masks.append(torch.from_numpy(mask))
    x = torch.stack([shapes_demo.preprocess(p) for p in pictures])

    cap = capture(model, x, layers=[layer], target="top1")
    _assert_no_hooks(model)
    calls = cap[layer].calls
    assert len(calls) == 1  # the block runs once; its shared ReLU twice inside it
    call = calls[0]
    cams = grad_cam(call.activation, call.grad_output, out_size=(64, 64), layer=layer)

    accuracy = (cap.output.argmax(1) == torch.tensor(labels)).float().mean().item()
    assert accuracy >= 0.98, f"accuracy on fresh samples {accuracy:.3f}"

    # The block's output comes out of an in-place ReLU after `out += identity`: the captured
    # activation and gradient must still be what plain autograd sees there.
    kept = {}
    handle = model.get_submodule(layer).register_forward_hook(lambda m, i, o: kept.__setitem__("a", o))
    try:
        logits = model(x)
    finally:
        handle.remove()
    (gradient,) = torch.autograd.grad(logits.gather(1, logits.argmax(1, keepdim=True)).sum(), kept["a"])
    torch.testing.assert_close(call.activation, kept["a"].detach())
    torch.testing.assert_close(call.grad_output, gradient)

    # Strict: the peak pixel of the upsampled CAM must be one the shape was painted on.
    masks = torch.stack(masks)
    peaks = cams.reshape(len(cams), -1).argmax(1)
    hits = masks.reshape(len(cams), -1).gather(1, peaks[:, None])[:, 0]
    hit_rate = hits.float().mean().item()
    assert hit_rate >= 0.90, f"Grad-CAM peak inside the shape for only {hit_rate:.3f} of fresh samples"
