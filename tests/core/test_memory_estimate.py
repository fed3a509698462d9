"""The memory estimate against what real captures hold, and statistics-only staying bounded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torchvision

from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.memory_estimate import (
    STATS_BYTES,
    MemoryEstimate,
    check_budget,
    estimate_capture_memory,
    format_bytes,
    largest_tensor_bytes,
    measure_capture_memory,
)
from gradexplorer.capturing.module_tree import ModuleTree
from gradexplorer.capturing.selection import resolve_layers
from gradexplorer.stats.moments import HIST_BINS
from tests.conftest import ROOT

TOLERANCE = 0.15


def _segmentation():
    return torchvision.models.segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=5)


MODELS = {
    "resnet18": (torchvision.models.resnet18, ["*.bn2", "*relu"]),
    "efficientnet_b0": (torchvision.models.efficientnet_b0, ["features.4.*", "*.block.*.0"]),
    "vit_b_16": (lambda: torchvision.models.vit_b_16(image_size=64), ["*.mlp.*", "*ln*"]),
    "lraspp": (_segmentation, ["classifier.*", "backbone.1*"]),
}


def _held_without_params(cap) -> int:
    params = sum(g.untyped_storage().nbytes() for layer in cap.layers.values()
                 for g in layer.param_grads.values() if g is not None)
    return measure_capture_memory(cap) - params


def _close(estimated: int, measured: int) -> bool:
    return abs(estimated - measured) <= TOLERANCE * measured


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_estimate_is_within_15_percent_of_what_captures_hold(name):
    make, subsets = MODELS[name]
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(2, 3, 64, 64)
    target = "sum" if name == "lraspp" else "top1"
    tree = ModuleTree.build(model).probe(model, x)
    # The first full capture of a model copies every activation; later ones keep outputs
    # known to stay unmodified without a copy: the first two cases see both.
    cases = [(None, False), (None, True)] + [(layers, i % 2 == 1) for i, layers in enumerate(subsets)]
    for layers, input_grad in cases:
        selected = resolve_layers(model, layers)
        est = estimate_capture_memory(tree, selected, "full", x, input_grad, model)
        cap = capture(model, x, layers=selected, input_grad=input_grad, target=target)
        held = measure_capture_memory(cap)
        assert _close(est.total, held), (layers, input_grad, est, held)
        # Parameter gradients dominate at small inputs: check the rest on its own.
        rest = _held_without_params(cap)
        assert _close(est.total - est.param_grads, rest), (layers, input_grad, est, rest)
        del cap


def test_estimate_parts_and_description():
    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 32, 32)
    tree = ModuleTree.build(model).probe(model, x)
    leaves = tree.leaves()
    full = estimate_capture_memory(tree, leaves, "full", x, True, model)
    assert full.activations > 0 and full.grad_outputs > 0 and full.param_grads > 0
    assert full.param_grads == sum(p.numel() * 4 for p in model.parameters())
    assert full.total == full.activations + full.gradients + full.io + full.stats
    text = full.describe()
    assert text.startswith("≈ ") and "activations" in text and "gradients" in text
    stats = estimate_capture_memory(tree, leaves, "stats", x, False, model)
    assert stats.activations == stats.gradients == 0
    assert "statistics only" in stats.describe() and "bounded" in stats.describe()
    assert stats.total < full.total / 20


def test_statistics_only_estimate_does_not_grow_with_the_batch():
    model = torchvision.models.resnet18().eval()
    small = ModuleTree.build(model).probe(model, torch.randn(1, 3, 32, 32))
    big = ModuleTree.build(model).probe(model, torch.randn(8, 3, 64, 64))
    leaves = small.leaves()
    a = estimate_capture_memory(small, leaves, "stats", None, False, model)
    b = estimate_capture_memory(big, leaves, "stats", None, False, model)
    assert a.stats == b.stats == (a.stats // STATS_BYTES) * STATS_BYTES
    f_a = estimate_capture_memory(small, leaves, "full", None, False, model)
    f_b = estimate_capture_memory(big, leaves, "full", None, False, model)
    assert f_b.activations > 20 * f_a.activations


def test_estimate_needs_a_probe():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="probe"):
        estimate_capture_memory(ModuleTree.build(model), ["0"], model=model)


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(600 * 2**20) == "600 MiB"
    assert format_bytes(1.25 * 2**30) == "1.2 GiB"


def test_budget_check(monkeypatch):
    import gradexplorer.capturing.memory_estimate as me

    est = MemoryEstimate(activations=6 * 2**30, grad_outputs=2 * 2**30, io=2**20, stats=2**20)
    monkeypatch.setattr(me, "budget_bytes", lambda device="cpu": 4 * 2**30)
    msg = check_budget(est, "cpu")
    assert msg and "statistics-only" in msg and "fewer layers" in msg and "8.0 GiB" in msg
    small = MemoryEstimate(activations=2**20)
    assert check_budget(small, "cpu") is None
    # Unknown free memory: nothing to say.
    monkeypatch.setattr(me, "budget_bytes", lambda device="cpu": None)
    assert check_budget(est, "cpu") is None


def test_statistics_only_capture_holds_no_tensor_larger_than_a_histogram():
    model = torchvision.models.resnet18().eval()
    x = torch.randn(4, 3, 64, 64)
    cap = capture(model, x, mode="stats", input_grad=True)
    assert largest_tensor_bytes(cap) <= HIST_BINS * 4
    for _name, _i, call in cap.iter_calls():
        assert call.activation is None and call.grad_output is None and call.grad_input is None
    for layer in cap.layers.values():
        assert all(g is None for g in layer.param_grads.values())
    # The layers part is layers x calls x statistics, whatever the batch.
    held = measure_capture_memory(cap) - 3 * x.numel() * 4  # input, input grad
    assert held < 2 * STATS_BYTES * 3 * sum(len(layer.calls) + len(layer.param_stats) for layer in cap.layers.values())


_RSS_CHILD = textwrap.dedent("""
    import json, resource, sys, torch, torchvision
    sys.path.insert(0, {root!r})
    from gradexplorer.capturing.capture import capture
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(8, 3, 112, 112)
    # Warm-up: a bare forward and backward sets the high-water mark of the pass itself.
    for _ in range(2):
        out = model(x)
        torch.autograd.grad(out.max(dim=1).values.sum(), list(model.parameters()))
        del out
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cap = capture(model, x, mode={mode!r})
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({{"growth": (after - before) * 1024}}))
""")


def _peak_growth(mode: str) -> int:
    code = _RSS_CHILD.format(root=str(ROOT), mode=mode)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])["growth"]


@pytest.mark.slow
def test_statistics_only_peak_memory_is_far_below_a_full_capture():
    model = torchvision.models.resnet18().eval()
    x = torch.randn(8, 3, 112, 112)
    tree = ModuleTree.build(model).probe(model, x)
    full_needs = estimate_capture_memory(tree, tree.leaves(), "full", x, False, model).total
    stats_growth = _peak_growth("stats")
    assert stats_growth < 0.1 * full_needs, (stats_growth, full_needs)


def test_a_tree_probed_with_one_sample_scales_to_the_batch():
    model = torchvision.models.resnet18().eval()
    x = torch.randn(4, 3, 32, 32)
    one = ModuleTree.build(model).probe(model, x[:1])
    four = ModuleTree.build(model).probe(model, x)
    leaves = one.leaves()
    scaled = estimate_capture_memory(one, leaves, "full", x, True, model)
    exact = estimate_capture_memory(four, leaves, "full", x, True, model)
    assert scaled.total == pytest.approx(exact.total, rel=1e-3)
    assert scaled.activations == exact.activations
