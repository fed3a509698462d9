"""Bad inputs and interruptions in the core engine (the bad-input matrix, the parts that
test_capture.py, test_batches.py, test_models.py, test_capture_file.py and test_devices.py
do not already cover): each ends in a readable message, or is captured and flagged, and
leaves the model, its hooks and its ``.grad`` as they were."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
import torchvision
from torch import nn

import gradexplorer.base.devices as devices
from gradexplorer.base.errors import CaptureCancelled, CaptureError, GradExplorerError
from gradexplorer.capturing.capture import capture
from gradexplorer.stats.moments import has_nonfinite
from tests.conftest import assert_no_hooks, assert_unchanged, snapshot


class Counted(nn.Module):
    """A Linear + ReLU that counts how often its forward and its backward ran."""

    def __init__(self, log: list, name: str, n: int = 6):
        super().__init__()
        self.fc = nn.Linear(n, n)
        self.log = log
        self.tag = name

    def forward(self, x):
        self.log.append(("forward", self.tag))
        return _LogBackward.apply(torch.relu(self.fc(x)), self.log, self.tag)


class _LogBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, log, tag):
        ctx.log, ctx.tag = log, tag
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append(("backward", ctx.tag))
        hook = getattr(ctx.log, "on_backward", None)
        if hook is not None:
            hook(ctx.tag)
        return grad, None, None


class _Log(list):
    on_backward = None


def _chain(n_blocks: int = 6):
    log = _Log()
    model = nn.Sequential(*[Counted(log, f"b{i}") for i in range(n_blocks)])
    return model, log


# -- forward that raises midway ------------------------------------------------------


def test_forward_that_raises_midway_names_the_layers_that_ran():
    class Exploding(nn.Module):
        def forward(self, x):
            raise ValueError("unsupported token")

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), Exploding(), nn.Linear(4, 2))
    model[0].weight.grad = torch.ones_like(model[0].weight)
    before = snapshot(model)
    with pytest.raises(CaptureError) as info:
        capture(model, torch.randn(3, 4))
    problem = info.value.problem
    assert "module '3' (Exploding)" in problem
    assert "ValueError: unsupported token" in problem
    assert "captured layers that ran: 0, 1, 2" in problem and "3 of 5" in problem
    assert info.value.fix
    assert_unchanged(model, before)
    # The model is still usable.
    model[3] = nn.Identity()
    assert capture(model, torch.randn(3, 4)).layer_order


# -- NaN and Inf ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["full", "stats"])
def test_nan_and_inf_in_the_input_are_captured_and_flagged(mode):
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 3))
    x = torch.randn(2, 4)
    x[0, 1] = float("nan")
    x[1, 2] = float("inf")
    before = snapshot(model)
    cap = capture(model, x, mode=mode, input_grad=True)
    assert_unchanged(model, before)
    first = cap["0"].calls[0].stats
    assert has_nonfinite(first["activation"])
    assert first["activation"]["nan_count"] >= 4  # both rows touch a NaN or an Inf
    assert torch.isnan(cap.input).sum() == 1 and torch.isinf(cap.input).sum() == 1
    flagged = [n for n, _i, c in cap.iter_calls() if has_nonfinite(c.stats["activation"])]
    assert flagged == ["0", "1", "2"]
    if mode == "full":
        assert torch.isnan(cap["0"].calls[0].activation).any()


@pytest.mark.parametrize("mode", ["full", "stats"])
def test_gradients_that_become_infinite_are_captured_and_flagged(mode):
    class Log(nn.Module):
        def forward(self, x):
            return torch.log(x)

    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), Log(), nn.Linear(3, 1))
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(3))
        model[0].bias.zero_()
        model[3].weight.fill_(1.0)
    x = torch.tensor([[1.0, -2.0, 3.0]])  # ReLU gives a zero; log(0) = -inf, d/dx = inf
    cap = capture(model, x, target="sum", mode=mode)
    assert cap["2"].calls[0].stats["activation"]["inf_count"] == 1
    grad_in = cap["2"].calls[0].stats["grad_input"]
    assert grad_in["inf_count"] + grad_in["nan_count"] >= 1
    assert has_nonfinite(cap["1"].calls[0].stats["grad_output"])  # 1/0 at the ReLU's output
    assert has_nonfinite(cap["3"].param_stats["weight"])  # -inf fed to the last Linear
    assert not has_nonfinite(cap["0"].param_stats["weight"])  # ReLU's backward zeroes it
    if mode == "full":
        assert not torch.isfinite(cap["2"].calls[0].grad_input).all()


# -- nothing selected ----------------------------------------------------------------


@pytest.mark.parametrize("layers", [lambda name, module: False, []])
def test_zero_layers_selected_says_so(layers):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    before = snapshot(model)
    with pytest.raises(GradExplorerError) as info:
        capture(model, torch.randn(2, 4), layers=layers)
    assert "No layers are selected" in info.value.problem
    assert "Tick at least one layer" in info.value.fix
    assert_unchanged(model, before)


# -- out of memory -------------------------------------------------------------------

OOM_TEXT = "CUDA out of memory. Tried to allocate 2.00 GiB"


def _assert_oom_message(err: CaptureError) -> None:
    assert "ran out of" in err.problem and "Tried to allocate 2.00 GiB" in err.problem
    assert "fewer layers" in err.fix and "statistics-only" in err.fix and "smaller batch" in err.fix


def test_out_of_memory_in_forward_is_explained(monkeypatch):
    model = torchvision.models.resnet18().eval()
    model.fc.weight.grad = torch.full_like(model.fc.weight, 0.5)
    before = snapshot(model)

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError(OOM_TEXT)

    monkeypatch.setattr(model.layer3[0].conv2, "forward", out_of_memory)
    with pytest.raises(CaptureError) as info:
        capture(model, torch.randn(1, 3, 32, 32))
    _assert_oom_message(info.value)
    monkeypatch.undo()
    assert_unchanged(model, before)


def test_out_of_memory_in_backward_is_explained():
    class OOMBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            raise torch.OutOfMemoryError(OOM_TEXT)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return OOMBackward.apply(self.fc(x))

    model = nn.Sequential(Block(), nn.Linear(4, 2))
    before = snapshot(model)
    for mode in ("full", "stats"):
        with pytest.raises(CaptureError) as info:
            capture(model, torch.randn(2, 4), mode=mode)
        _assert_oom_message(info.value)
        assert_unchanged(model, before)


# -- devices -------------------------------------------------------------------------


@pytest.fixture
def fake_gpus(monkeypatch):
    """Pretend there are two CUDA devices; ``state.count`` can drop to make one vanish."""
    state = SimpleNamespace(count=2)
    props = [SimpleNamespace(name="Fake GPU A", total_memory=80 * 2**30),
             SimpleNamespace(name="Fake GPU B", total_memory=24 * 2**30)]

    def get_props(index):
        if index >= state.count:
            raise RuntimeError("CUDA error: invalid device ordinal")
        return props[index]

    def mem_get_info(index=None):
        index = 0 if index is None else index
        if index >= state.count:
            raise RuntimeError("CUDA error: invalid device ordinal")
        return (props[index].total_memory // 2, props[index].total_memory)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: state.count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: state.count)
    monkeypatch.setattr(torch.cuda, "get_device_properties", get_props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    return state


def test_several_gpus_are_listed_with_their_names(fake_gpus):
    listed = devices.list_devices()
    assert [d.name for d in listed] == ["cuda:0", "cuda:1", "cpu"]
    assert listed[0].label == "cuda:0 - Fake GPU A, 80 GiB"
    assert listed[1].label == "cuda:1 - Fake GPU B, 24 GiB"
    assert listed[1].free_memory == 12 * 2**30
    assert devices.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert devices.resolve_device("auto") == torch.device("cuda", 0)


def test_gpu_that_vanishes_between_listing_and_running(fake_gpus):
    assert "cuda:1" in [d.name for d in devices.list_devices()]
    fake_gpus.count = 1  # unplugged, or taken by a driver reset
    with pytest.raises(GradExplorerError) as info:
        devices.resolve_device("cuda:1")
    assert "'cuda:1'" in info.value.problem and "not available" in info.value.problem
    assert "cuda:0" in info.value.fix and "cpu" in info.value.fix and "cuda:1" not in info.value.fix
    # A capture asked to run there fails the same way before touching the model.
    model = nn.Sequential(nn.Linear(4, 2))
    before = snapshot(model)
    with pytest.raises(GradExplorerError, match="not available"):
        capture(model, torch.randn(2, 4), device="cuda:1")
    assert_unchanged(model, before)
    fake_gpus.count = 0
    assert devices.free_memory("cuda:0") is None
    assert [d.name for d in devices.list_devices()] == ["cpu"]


# -- cancel --------------------------------------------------------------------------


def test_cancel_in_forward_stops_before_the_next_module_call():
    model, log = _chain(6)
    model[0].fc.weight.grad = torch.ones_like(model[0].fc.weight)
    before = snapshot(model)
    flag = threading.Event()
    original = model[2].forward

    def forward_then_cancel(x):
        out = original(x)
        flag.set()  # as if the user pressed Cancel while module 2 ran
        return out

    model[2].forward = forward_then_cancel
    with pytest.raises(CaptureCancelled):
        capture(model, torch.randn(2, 6), cancel=flag)
    del model[2].forward
    forwards = [tag for kind, tag in log if kind == "forward"]
    assert forwards == ["b0", "b1", "b2"]  # no module call after the flag was set
    assert not any(kind == "backward" for kind, _ in log)
    assert_unchanged(model, before)


@pytest.mark.parametrize("layers", [None, ["*fc"]])
def test_cancel_in_backward_stops_before_the_next_gradient(layers):
    model, log = _chain(6)
    before = snapshot(model)
    flag = threading.Event()

    def on_backward(tag):
        if tag == "b3":
            flag.set()

    log.on_backward = on_backward
    with pytest.raises(CaptureCancelled):
        capture(model, torch.randn(2, 6), layers=layers, cancel=flag)
    backwards = [tag for kind, tag in log if kind == "backward"]
    # Backward runs b5, b4, b3: the flag is set in b3's backward, and the gradient hook on
    # b3's fc output (the next gradient) stops the pass before b2's backward.
    assert backwards == ["b5", "b4", "b3"]
    assert_unchanged(model, before)


def _set_when_asked(asked: threading.Event, flag: threading.Event) -> None:
    asked.wait()
    flag.set()


@pytest.mark.slow
def test_cancel_from_another_thread_at_points_through_the_pass_leaves_the_model_as_it_was():
    """The cancel flag is set by another thread at chosen points of the pass: before it, at the
    first, a fifth, half and four fifths of the forward's module calls, and at its last (the
    capture then stops in its backward). A global forward hook (outside the model's own hook
    dicts) hands each point to the other thread and waits until the flag is set, so the point
    is exact, whatever the machine's load."""
    model = torchvision.models.resnet18().eval()
    model.fc.weight.grad = torch.ones_like(model.fc.weight)
    before = snapshot(model)
    x = torch.randn(2, 3, 64, 64)
    calls = 0

    def count(module, args, output):
        nonlocal calls
        calls += 1

    handle = nn.modules.module.register_module_forward_hook(count)
    try:
        capture(model, x)
    finally:
        handle.remove()
    whole = calls  # module calls of one forward as a capture runs it
    for point in (None, 1, whole // 5, whole // 2, 4 * whole // 5, whole):
        flag, asked = threading.Event(), threading.Event()
        setter = threading.Thread(target=_set_when_asked, args=(asked, flag))
        setter.start()
        seen = 0

        def at_point(module, args, output, point=point, flag=flag, asked=asked):
            nonlocal seen
            seen += 1
            if seen == point:
                asked.set()
                assert flag.wait(60), "the other thread never set the flag"

        if point is None:
            asked.set()
            assert flag.wait(60)
        handle = nn.modules.module.register_module_forward_hook(at_point)
        try:
            with pytest.raises(CaptureCancelled):
                capture(model, x, cancel=flag)
        finally:
            handle.remove()
            asked.set()
            setter.join()
        assert_unchanged(model, before)
        assert_no_hooks(model)
