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

from gradexplorer.capturing.capture import capture
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


@pytest.mark.slow
def test_check_script_without_cuda_says_so_and_exits_0():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "CUDA is not available: nothing to check" in done.stdout


@pytest.mark.slow
def test_check_script_comparison_on_two_cpu_captures():
    """The comparison the script makes, on two CPU captures: equal ones pass, a changed
    tensor or statistic is caught."""
    gc = _gpu_check()
    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 32, 32)
    target = f"class:{gc.TARGET_CLASS}"
    a = capture(model, x, input_grad=True, target=target)
    b = capture(copy.deepcopy(model), x, input_grad=True, target=target)
    t_err, s_err, _, _ = gc.compare_captures(a, b)
    assert t_err <= 1e-6 and s_err <= 1e-6
    stats = capture(model, x, mode="stats", input_grad=True, target=target)
    assert gc.compare_captures(stats, b, tensors=False)[1] <= 1e-6
    b["layer1.0.conv1"].calls[0].grad_output.mul_(1.01)
    t_err, _s, where, _ = gc.compare_captures(a, b)
    assert t_err > gc.TENSOR_TOL and where == "layer1.0.conv1[0].grad_output"
    b["layer2.0.bn1"].calls[0].stats["activation"]["mean"] += 1.0
    assert gc.compare_captures(a, b, tensors=False)[1] > gc.STAT_TOL
    # The recomputation the synchronisation check uses agrees with capture.
    acts, grads = gc.recomputed_on_gpu(model, x, ["conv1", "layer1.0.relu"])
    assert gc.rel_error(a["conv1"].calls[0].activation, acts["conv1"]) < 1e-6
    assert gc.rel_error(a["layer1.0.relu"].calls[0].activation, acts["layer1.0.relu"]) < 1e-6
    assert gc.rel_error(a["fc"].param_grads["weight"], grads["fc.weight"]) < 1e-5


@pytest.mark.slow
def test_check_script_runs_end_to_end_on_the_cpu(capsys):
    """Every step of the script's check (captures, comparisons, the device= run, the
    synchronisation check, timing) on the CPU against the CPU: what a GPU run executes,
    so that a mistake in the script shows here and not first on a GPU machine."""
    gc = _gpu_check()
    assert gc.check_model("resnet18", 2, 1, device="cpu", size=64, timing_batch=3)
    out = capsys.readouterr().out
    assert "resnet18 batch 2:" in out and "FAIL" not in out
    # 8 checks, then per timed batch (2 and 3): a capture with batched statistics against
    # one without, full capture kept on the device against the host copies, and the batched
    # statistics of the gradients against tensor_stats.
    assert out.count(" ok") == 14 and "overhead on cpu, batch 3" in out
    assert out.count("tensors stayed there") == 2
    assert out.count("with batched statistics") == 4
    assert out.count("gradients on cpu: one by one") == 2


def test_well_conditioned_measures_batchnorm_statistics():
    gc = _gpu_check()
    model = gc.well_conditioned(torchvision.models.resnet18(), 32, batches=2)
    assert not model.training
    assert float(model.bn1.running_var.mean()) != pytest.approx(1.0, abs=1e-3)
    # Measured statistics normalise: the stem's BatchNorm output has about unit variance.
    with torch.no_grad():
        y = model.bn1(model.conv1(torch.randn(8, 3, 32, 32)))
    assert 0.5 < float(y.var()) < 2.0


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
    t_err, s_err, t_at, s_at = gc.compare_captures(got, ref, tensors=mode == "full")
    assert t_err <= 1e-4 and s_err <= 1e-4, (t_at, s_at)
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
    from gradexplorer.base.errors import CaptureError

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


@needs_cuda
@pytest.mark.gpu
def test_fused_statistics_on_the_gpu_equal_tensor_stats():
    """The fused kernels (when Triton is there) against the CPU statistics, including NaN,
    Inf, half precision, a flat tensor and a subsampled histogram."""
    from gradexplorer.stats import device as device_stats
    from gradexplorer.stats.tensor_stats import tensor_stats

    if not device_stats.fused_available():
        pytest.skip("Triton is not available")
    cases = [torch.randn(3, 1000), torch.randn(300_000).clamp_min(0), torch.randn(5000).half(),
             torch.full((100,), 2.5), torch.tensor([1.0, float("nan"), -2.0, float("inf"), 0.0, 3.0]),
             torch.full((10,), float("nan")), torch.randn(64, 80).t()]
    summaries = device_stats.DeferredStats(1 << 14)
    got = [summaries.summarize(t.cuda()) for t in cases]
    assert len(summaries) == len(cases) and got[0] == {}  # filled later, not yet
    torch.cuda.synchronize()
    summaries.resolve()
    for t, g in zip(cases, got):
        ref = tensor_stats(t)
        for key in ("numel", "nan_count", "inf_count", "hist_exact"):
            assert g[key] == ref[key], key
        for key in ("min", "max", "mean", "std", "mean_abs", "l2", "zero_fraction"):
            assert g[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6, nan_ok=True), key
        assert (g["hist"] - ref["hist"]).abs().sum() <= 0.002 * max(t.numel(), 1000), "hist"


class _FakeCudaTensor:
    """Stands in for a CUDA tensor where there is none: records how it was copied."""

    is_cuda = True
    is_cpu = False
    device = torch.device("cuda", 0)

    def __init__(self, nbytes):
        self.nbytes = nbytes
        self.copied = None

    def detach(self):
        return self

    def clone(self):
        self.copied = "cloned on the device"
        return self

    def numel(self):
        return self.nbytes // 4

    def element_size(self):
        return 4

    def to(self, device, non_blocking=False, copy=False):
        assert device == "cpu"
        self.copied = "pinned, queued" if non_blocking else "synchronous"
        return self


def test_gpu_copies_are_queued_into_pinned_memory_within_the_budget(monkeypatch):
    from gradexplorer.capturing import capture as capture_module

    monkeypatch.setattr(capture_module, "_pinned_budget", lambda: 100 << 20)
    recorder = capture_module._Recorder(nn.Linear(2, 2), [], "full", torch.device("cuda", 0),
                                        None, None, 1, None)
    first, second, third = _FakeCudaTensor(60 << 20), _FakeCudaTensor(60 << 20), _FakeCudaTensor(40 << 20)
    for t in (first, second, third):
        recorder.to_host(t, copy=True)
    # 60 MiB fit; the next 60 do not (synchronous); 40 more still fit in what is left.
    assert [t.copied for t in (first, second, third)] == ["pinned, queued", "synchronous", "pinned, queued"]
    assert recorder.pinned_left == 0
    # CPU tensors: a copy when asked (a later in-place op must not reach it), else the same memory.
    cpu = torch.randn(3)
    copied, kept = recorder.to_host(cpu, copy=True), recorder.to_host(cpu, copy=False)
    assert torch.equal(copied, cpu) and copied.data_ptr() != cpu.data_ptr()
    assert kept.data_ptr() == cpu.data_ptr()


def test_keep_on_device_keeps_tensors_there_until_its_share_of_free_memory_is_used(monkeypatch):
    from gradexplorer.base import devices
    from gradexplorer.capturing import capture as capture_module

    monkeypatch.setattr(capture_module, "_pinned_budget", lambda: 1 << 30)
    monkeypatch.setattr(devices, "free_memory", lambda device: 200 << 20)  # KEEP_SHARE of it: 100 MiB
    recorder = capture_module._Recorder(nn.Linear(2, 2), [], "full", torch.device("cuda", 0),
                                        None, None, 1, None, keep_on_device=True)
    assert recorder.device_left == int((200 << 20) * capture_module.KEEP_SHARE)
    tensors = [_FakeCudaTensor(n << 20) for n in (50, 30, 40, 5)]
    kept = [recorder.keep(t, copy=c) for t, c in zip(tensors, (True, False, False, False))]
    assert all(k is t for k, t in zip(kept, tensors))
    # An activation a later in-place op may change is cloned on the device; a gradient is
    # kept as it is; 40 MiB do not fit in the 20 left: from there on, copies to the host
    # (in order, so the 5 MiB after it go too).
    assert [t.copied for t in tensors] == ["cloned on the device", None, "pinned, queued", "pinned, queued"]
    assert recorder.device_left == 0
    # Without the option, or in statistics-only mode, everything goes to the host as before.
    for mode, keep in (("full", False), ("stats", True)):
        plain = capture_module._Recorder(nn.Linear(2, 2), [], mode, torch.device("cuda", 0),
                                         None, None, 1, None, keep_on_device=keep)
        t = _FakeCudaTensor(1 << 20)
        plain.keep(t, copy=False)
        assert plain.device_left is None and t.copied == "pinned, queued"


def test_keep_on_device_on_the_cpu_is_the_plain_capture():
    """On the CPU the option changes nothing: the same tensors, still exact."""
    from tests.core.test_capture import check_against_reference

    model = _small_net()
    x = torch.randn(2, 3, 8, 8)
    kept, _ = check_against_reference(model, x, keep_on_device=True, input_grad=True)
    plain = capture(model, x, input_grad=True)
    assert kept.on_host() is kept
    pairs = list(zip(kept.tensors(), plain.tensors(), strict=True))
    # input, output, input gradient; 8 layers' activation and gradients at output and
    # input; weight and bias gradients of 2 convolutions, the BatchNorm and the Linear
    assert len(pairs) == 3 + 8 * 3 + 4 * 2
    for a, b in pairs:
        assert a.device.type == "cpu" and torch.equal(a, b)


def test_pinned_budget_is_a_share_of_the_machines_memory(monkeypatch):
    from gradexplorer.base import devices
    from gradexplorer.capturing import capture as capture_module

    monkeypatch.setattr(devices, "meminfo_bytes", lambda field: 16 << 30)
    assert capture_module._pinned_budget() == 4 << 30
    monkeypatch.setattr(devices, "meminfo_bytes", lambda field: None)  # not Linux
    assert capture_module._pinned_budget() == 4 << 30


@needs_cuda
@pytest.mark.gpu
def test_batched_statistics_on_the_gpu_equal_float64_numpy():
    """core/gradexplorer/stats/batched.py on CUDA tensors: the adversarial set, all at once."""
    from gradexplorer.stats.batched import batched_stats
    from tests.core.test_stats import ADVERSARIAL, assert_matches_reference

    tensors = [ADVERSARIAL[n]() for n in sorted(ADVERSARIAL)]
    for t, s in zip(tensors, batched_stats([t.cuda() for t in tensors])):
        assert_matches_reference(s, t)


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["stats", "full"])
def test_batched_capture_on_the_gpu_equals_the_cpu_capture(monkeypatch, mode):
    """GRADEXPLORER_BATCHED_STATS=1 on a GPU: a capture summarises the outputs in one batch at
    the end of forward, from copies taken when each module returned (the BatchNorm outputs
    that ReLU(inplace) changes later included); every statistic still equals the CPU capture's."""
    import gradexplorer.stats.batched as module

    gc = _gpu_check()
    torch.backends.cudnn.allow_tf32 = False
    cpu_model = _small_net()
    gpu_model = copy.deepcopy(cpu_model).cuda()
    x = torch.randn(4, 3, 16, 16)
    ref = capture(cpu_model, x, input_grad=True)
    sizes = []
    real = module.device_batched_stats
    monkeypatch.setattr(module, "device_batched_stats", lambda ts, limit: sizes.append(len(ts)) or real(ts, limit))
    monkeypatch.setenv("GRADEXPLORER_BATCHED_STATS", "1")
    capture(gpu_model, x.cuda(), mode=mode, input_grad=True)
    sizes.clear()
    got = capture(gpu_model, x.cuda(), mode=mode, input_grad=True, keep_on_device=mode == "full")
    assert len(sizes) == 2 and sizes[0] > 0, sizes
    t_err, s_err, t_at, s_at = gc.compare_captures(got.on_host(), ref, tensors=mode == "full")
    assert t_err <= 1e-4 and s_err <= 1e-4, (t_at, s_at)


@needs_cuda
def test_several_inputs_on_the_gpu_keep_one_host_copy_of_the_first():
    from gradexplorer.capturing.inputs import ModelInputs
    from tests.core.test_several_inputs import TwoFrames, _frames

    torch.manual_seed(0)
    model = TwoFrames().eval()
    f1, f2 = _frames()
    cap = capture(model, ModelInputs((f1, f2)), target="sum", device="cuda", mode="stats")
    assert cap.input.device.type == "cpu" and torch.equal(cap.input, f1)
    first = cap.model_inputs["args"][0]
    assert torch.equal(first, f1) and torch.equal(cap.model_inputs["args"][1], f2)
    # the file holds the first input once: "input" is the same host tensor
    assert cap.input.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()


class _InPlaceAfterLinear(nn.Module):
    """A Linear whose output a ReLU(inplace) changes: its kept activation must be a copy."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(16, 32), nn.ReLU(inplace=True), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keep_on_device_keeps_exact_tensors_on_the_gpu_and_saves_them_to_the_host(tmp_path, dtype):
    from gradexplorer.files.capture_file import load_capture, save_capture
    from tests.ground_truth import compare, reference

    torch.manual_seed(0)
    model = _InPlaceAfterLinear().cuda().to(dtype)
    x = torch.randn(8, 16, device="cuda", dtype=dtype)
    names = ["fc1", "act", "fc2"]
    ref = reference(model, x, names, input_grad=True)
    for run in range(2):  # the second run knows which outputs are modified in place
        cap = capture(model, x, layers=names, keep_on_device=True, input_grad=True)
        layer_tensors = [t for n in names for c in cap[n].calls for t in (c.activation, c.grad_output)]
        assert all(t.is_cuda for t in layer_tensors) and cap.input_grad.is_cuda, run
        assert all(g.is_cuda for n in names for g in cap[n].param_grads.values()), run
        assert compare(cap.on_host(), ref, names) < (1e-5 if dtype == torch.float32 else 1e-2), run
        # fc1's output was changed in place by the ReLU after the capture took it
        assert cap["fc1"].calls[0].activation.min() < 0
    saved = load_capture(save_capture(cap, tmp_path / "kept.pt"))
    assert all(t.device.type == "cpu" for t in saved.tensors())
    assert torch.equal(saved["fc1"].calls[0].activation, cap["fc1"].calls[0].activation.cpu())


@needs_cuda
@pytest.mark.gpu
def test_keep_on_device_past_its_budget_copies_the_rest_to_the_host(monkeypatch):
    from gradexplorer.capturing import capture as capture_module

    model = _small_net().cuda()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    plain = capture(model, x)
    free = torch.cuda.mem_get_info()[0]
    # room for two and a half of the 2x8x16x16 float32 activations: the convolution's and the
    # BatchNorm's fit, the in-place ReLU's (and everything after it) goes to the host
    monkeypatch.setattr(capture_module, "KEEP_SHARE", 2.5 * (2 * 8 * 16 * 16 * 4) / free)
    cap = capture(model, x, keep_on_device=True)
    devices = [c.activation.device.type for _n, _i, c in cap.iter_calls()]
    assert devices[:2] == ["cuda", "cuda"] and set(devices[2:]) == {"cpu"}, devices
    for (_n, _i, a), (_m, _j, b) in zip(cap.iter_calls(), plain.iter_calls(), strict=True):
        assert torch.allclose(a.activation.cpu(), b.activation, rtol=1e-5, atol=1e-6)
