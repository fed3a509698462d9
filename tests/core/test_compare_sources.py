"""Compare with...: B is A's options with one change, run through the capture job."""

from __future__ import annotations

import pytest
import torch
import torchvision

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.capture import capture
from gradexplorer.comparison.compare import compare
from gradexplorer.pipeline.compare_sources import Variant, compare_variant
from gradexplorer.pipeline.options import BatchSpec, CaptureOptions
from tests.conftest import assert_no_hooks


@pytest.fixture
def base():
    return CaptureOptions(model="demo:seed-mlp", batch=BatchSpec(random="3x10"), device="cpu")


def test_autocast_variant_runs_the_same_batch_under_bf16(base):
    runs = compare_variant(base, Variant(autocast="bf16"))
    assert runs.options_b.autocast == "bf16" and runs.a.meta["autocast"] is None
    assert runs.b.meta["autocast"] == "bf16"
    assert runs.result.input.max_abs == 0.0  # the very same batch
    assert not runs.result.within and runs.result.first_divergent_activation is not None
    # A and B named by what tells them apart
    assert (runs.result.label_a, runs.result.label_b) == ("demo:seed-mlp, no autocast", "demo:seed-mlp, autocast bf16")
    # the same figures as comparing the two captures directly
    direct = compare(runs.a, runs.b)
    assert [c.divergence for c in direct.calls] == [c.divergence for c in runs.result.calls]


def test_reference_capture_is_reused_and_progress_is_staged(base):
    from gradexplorer.pipeline.job import CaptureJob

    job = CaptureJob(base)
    a = job.run()
    stages = []
    runs = compare_variant(base, Variant(target="mean"), reference=a, loaded=job.loaded, batch=job.batch,
                           progress=lambda s, d, t: stages.append(s))
    assert runs.a is a
    assert stages and all(s.startswith("B: ") for s in stages)
    assert runs.b.meta["target"] == "mean"  # 1 output: top1 is the sum, mean divides by 3
    # the forward is the same: activations identical, gradients differ
    r = runs.result
    assert all(c.kinds["activation"].tensor.max_abs == 0.0 for c in r.calls)
    assert r.first_divergent_activation is None and r.first_divergent_gradient is not None
    assert_no_hooks(job.loaded.module)


@pytest.mark.slow
def test_other_weights_from_a_checkpoint_file(tmp_path):
    torch.manual_seed(0)
    net = torchvision.models.resnet18()
    torch.save(net.state_dict(), tmp_path / "orig.pth")
    with torch.no_grad():
        net.fc.weight.mul_(2.0)
    torch.save(net.state_dict(), tmp_path / "tuned.pth")
    base = CaptureOptions(model="resnet18", weights=str(tmp_path / "orig.pth"), batch=BatchSpec(random="1x3x32x32"),
                          device="cpu", layers=("layer4.1.*", "fc"), target="sum")
    runs = compare_variant(base, Variant(weights=str(tmp_path / "tuned.pth")))
    r = runs.result
    assert runs.options_b.weights.endswith("tuned.pth") and r.input.max_abs == 0.0
    # only fc changed: the forward diverges there first, and every gradient below it
    # doubles (d sum / d fc-input = 2 W^T 1).
    assert r.first_divergent_activation.layer == "fc"
    assert all(c.kinds["activation"].tensor.max_abs == 0.0 for c in r.calls if c.layer != "fc")
    below = [c for c in r.calls if c.layer != "fc"]
    assert all(c.kinds["grad_output"].tensor.norm_ratio == pytest.approx(2.0, rel=1e-5) for c in below)
    # backward order: the block's last op (relu's second call) gets its gradient first
    first = r.first_divergent_gradient
    assert (first.layer, first.call) == ("layer4.1.relu", 1)


def test_train_mode_variant(base):
    dropout = CaptureOptions(model="demo:shapes", device="cpu", mode="stats")
    runs = compare_variant(dropout, Variant(train=True))
    assert runs.b.meta["train"] is True and runs.a.meta["train"] is False
    assert runs.result.by_statistics


def test_a_variant_that_changes_nothing_is_refused(base):
    with pytest.raises(GradExplorerError, match="same as the first"):
        compare_variant(base, Variant(device="cpu"))
    with pytest.raises(GradExplorerError, match="autocast"):
        Variant(autocast="fp8")


def test_autocast_off_against_an_autocast_reference():
    base = CaptureOptions(model="demo:seed-mlp", batch=BatchSpec(random="3x10"), device="cpu", autocast="bf16")
    v = Variant(autocast="off")
    assert v.apply(base).autocast is None and v.describe(base) == "no autocast"


def test_capture_autocast_matches_a_manual_autocast_context():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(3, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        manual = capture(model, x, target="sum")
    option = capture(model, x, target="sum", autocast="bf16")
    r = compare(manual, option)
    assert r.within and all(c.kinds["activation"].tensor.max_abs == 0.0 for c in r.calls)


def test_a_and_b_are_named_by_what_tells_them_apart(base):
    assert Variant(train=True).report_names(base) == ("demo:seed-mlp, eval mode", "demo:seed-mlp, train mode")
    assert Variant(weights="w.pth").report_names(base) == ("demo:seed-mlp, its own weights",
                                                           "demo:seed-mlp, weights w.pth")
    assert Variant(model="other.pt").report_names(base) == ("demo:seed-mlp", "other.pt")
    assert Variant(device="cuda:0").report_names(base) == ("demo:seed-mlp, device cpu", "demo:seed-mlp, device cuda:0")
