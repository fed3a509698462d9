"""The GPU path: GPU captures equal CPU captures (skipped without CUDA), and the prepared
check script (scripts/gpu_check.py) behaves where there is no CUDA."""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import torchvision
from torch import nn

from core.capture import capture
from tests.conftest import ROOT, assert_unchanged, snapshot

SCRIPT = ROOT / "scripts" / "gpu_check.py"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _small_net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    ).eval()


def test_check_script_without_cuda_says_so_and_exits_0():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "CUDA is not available: nothing to check" in done.stdout


def test_check_script_comparison_on_two_cpu_captures():
    """The comparison the script makes, on two CPU captures: equal ones pass, a changed
    tensor or statistic is caught."""
    gc = _gpu_check()
    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 32, 32)
    a = capture(model, x, input_grad=True)
    b = capture(copy.deepcopy(model), x, input_grad=True)
    t_err, s_err, _ = gc.compare_captures(a, b)
    assert t_err <= 1e-6 and s_err <= 1e-6
    stats = capture(model, x, mode="stats", input_grad=True)
    assert gc.compare_captures(stats, b, tensors=False)[1] <= 1e-6
    b["layer1.0.conv1"].calls[0].grad_output.mul_(1.01)
    t_err, _s, where = gc.compare_captures(a, b)
    assert t_err > gc.TENSOR_TOL and where == "layer1.0.conv1[0].grad_output"
    b["layer2.0.bn1"].calls[0].stats["activation"]["mean"] += 1.0
    assert gc.compare_captures(a, b, tensors=False)[1] > gc.STAT_TOL
    # The recomputation the synchronisation check uses agrees with capture.
    acts, grads = gc.recomputed_on_gpu(model, x, ["conv1", "layer1.0.relu"])
    assert gc.rel_error(a["conv1"].calls[0].activation, acts["conv1"]) < 1e-6
    assert gc.rel_error(a["layer1.0.relu"].calls[0].activation, acts["layer1.0.relu"]) < 1e-6
    assert gc.rel_error(a["fc"].param_grads["weight"], grads["fc.weight"]) < 1e-5


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["full", "stats"])
def test_gpu_capture_equals_cpu_capture(mode):
    gc = _gpu_check()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    cpu_model = _small_net()
    gpu_model = copy.deepcopy(cpu_model).cuda()
    x = torch.randn(4, 3, 16, 16)
    ref = capture(cpu_model, x, input_grad=True)
    got = capture(gpu_model, x.cuda(), mode=mode, input_grad=True)
    assert got.meta["device"] == "cuda:0"
    t_err, s_err, where = gc.compare_captures(got, ref, tensors=mode == "full")
    assert t_err <= 1e-4 and s_err <= 1e-4, where
    if mode == "full":
        for _n, _i, call in got.iter_calls():
            assert call.activation.device.type == "cpu" and call.grad_output.device.type == "cpu"


@needs_cuda
@pytest.mark.gpu
def test_device_argument_moves_the_model_and_back():
    model = _small_net()
    before = snapshot(model)
    cap = capture(model, torch.randn(2, 3, 16, 16), device="cuda:0")
    assert cap.meta["device"] == "cuda:0"
    assert next(model.parameters()).device.type == "cpu"
    assert_unchanged(model, before)


@needs_cuda
@pytest.mark.gpu
def test_gpu_out_of_memory_is_explained():
    from core.errors import CaptureError

    free, _total = torch.cuda.mem_get_info(0)
    side = int((free / 4 / 3 / 8 * 2) ** 0.5) + 64  # a batch whose conv outputs cannot fit
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU()).cuda()  # output: 5x the free memory
    before = snapshot(model)
    try:
        x = torch.randn(1, 3, side, side, device="cuda")
    except torch.OutOfMemoryError:
        pytest.skip("cannot even allocate the input")
    with pytest.raises(CaptureError, match="ran out of GPU"):
        capture(model, x, mode="full")
    assert_unchanged(model, before)
