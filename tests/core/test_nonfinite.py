"""Where NaN/Inf began (core/gradexplorer/capturing/nonfinite.py through capture): models that divide by zero
mid-forward, take sqrt(0) (an Inf gradient with a finite forward), overflow a Linear, or
get a NaN batch. The expected place is checked against plain forward hooks and
torch.autograd.grad on the same model, without gradexplorer."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.nonfinite import describe_onset, onset_location
from gradexplorer.files.capture_file import load_capture, save_capture
from tests.conftest import assert_no_hooks


class DivideInForward(nn.Module):
    """Divides by zero between its children: no module produces the NaN/Inf."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)

    def forward(self, x):
        h = self.act(self.fc1(x))
        return self.fc2(h / torch.zeros_like(h))


class Divide(nn.Module):
    def forward(self, x):
        return x / (x - x)


class Sqrt(nn.Module):
    def forward(self, x):
        return torch.sqrt(x)


def divide_module():
    return nn.Sequential(nn.Linear(4, 4), Divide(), nn.ReLU(), nn.Linear(4, 2))


def sqrt_of_zero():
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), Sqrt(), nn.Linear(4, 2))
    with torch.no_grad():
        m[0].weight[:2].zero_()
        m[0].bias[:2].zero_()  # two channels are exactly 0 after ReLU: sqrt'(0) = inf
    return m


def overflowing_linear():
    m = nn.Sequential(nn.Linear(4, 8), nn.Sigmoid(), nn.Linear(8, 8), nn.Linear(8, 2))
    with torch.no_grad():
        m[2].weight.fill_(1e38)  # 8 positive inputs times 1e38 > float32 max
    return m


def first_bad_forward_call(model, x):
    """Independent: the first module call (completion order) with finite inputs and a
    non-finite output, by plain forward hooks."""
    found = []

    def hook(name):
        def fn(module, args, output):
            ok_in = all(torch.isfinite(a).all() for a in args if isinstance(a, torch.Tensor))
            if ok_in and not torch.isfinite(output).all() and not found:
                found.append(name)
        return fn

    _run_hooked(model, x, lambda n, m: [m.register_forward_hook(hook(n))])
    return found[0] if found else None


def _run_hooked(model, x, register):
    """One forward of ``model`` with the hooks ``register(name, module)`` puts on each module."""
    handles = [h for n, m in model.named_modules() for h in register(n, m)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("mode", ["stats", "full"])
@pytest.mark.parametrize("make,expected", [
    (DivideInForward, ""), (divide_module, "1"), (overflowing_linear, "2"),
])
def test_the_forward_onset_is_the_first_call_that_broke_finite_inputs(make, expected, mode):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.rand(3, 4) + 0.5
    assert first_bad_forward_call(model, x) == expected  # the ground truth agrees with the design
    cap = capture(model, x, mode=mode, target="sum")
    assert_no_hooks(model)
    f = cap.nonfinite_onset["forward"]
    assert (f["layer"], f["call"]) == (expected, 0)
    assert f["own_code"] == (expected == "")  # the root divided between its children
    if expected:
        act = cap[expected].calls[0].stats["activation"]
        assert (f["nan_count"], f["inf_count"]) == (act["nan_count"], act["inf_count"])
        assert onset_location(cap.nonfinite_onset) == (expected, 0, "activation")
    # Every layer after the onset holds NaN/Inf too; the old summary led with the first of them.
    text = "\n".join(describe_onset(cap.nonfinite_onset))
    assert "forward: first at" in text and "inputs were finite" in text


@pytest.mark.parametrize("mode", ["stats", "full"])
def test_sqrt_of_zero_is_a_backward_onset_with_a_finite_forward(mode):
    torch.manual_seed(0)
    model = sqrt_of_zero().eval()
    x = torch.randn(3, 4)
    cap = capture(model, x, mode=mode, target="sum")
    # Ground truth: autograd on the same graph, without hooks.
    xs = x.clone()
    h = model[1](model[0](xs)).detach().requires_grad_(True)
    (g,) = torch.autograd.grad(model[3](model[2](h)).sum(), [h])
    assert not torch.isfinite(g).all() and torch.isfinite(model(x)).all()
    onset = cap.nonfinite_onset
    assert onset["forward"] is None
    b = onset["backward"]
    assert (b["layer"], b["call"], b["tensor"]) == ("2", 0, "grad_input")
    assert b["inf_count"] + b["nan_count"] == int((~torch.isfinite(g)).sum())
    assert onset_location(onset, "backward") == ("2", 0, "grad_input")
    # The gradient at Sqrt's own output was finite: it turned non-finite inside Sqrt.
    assert cap["2"].calls[0].stats["grad_output"]["inf_count"] == 0


def test_a_nan_in_the_batch_is_named_as_such():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    x[1, 2] = float("nan")
    cap = capture(model, x, mode="stats", target="sum")
    assert cap.nonfinite_onset["forward"]["layer"] is None
    assert onset_location(cap.nonfinite_onset) is None
    assert describe_onset(cap.nonfinite_onset)[0] == "forward: the input batch already holds NaN/Inf"


def test_a_finite_capture_has_no_onset_and_the_onset_survives_the_file(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    cap = capture(model, torch.randn(2, 4), mode="stats")
    assert cap.nonfinite_onset is None
    bad = capture(divide_module().eval(), torch.rand(2, 4) + 0.5, mode="stats", target="sum")
    path = save_capture(bad, tmp_path / "bad.pt")
    assert load_capture(path).nonfinite_onset == bad.nonfinite_onset
    raw = torch.load(path, weights_only=True)
    assert raw["nonfinite_onset"]["forward"]["layer"] == "1"
    del raw["nonfinite_onset"]  # a file from before the entry: still opens
    torch.save(raw, tmp_path / "old.pt")
    assert load_capture(tmp_path / "old.pt").nonfinite_onset is None


class ResidualOverflow(nn.Module):
    """``out += identity`` overflows in the module's own code, then an in-place ReLU takes
    the sum (the ResNet pattern): the ReLU did not break it."""

    def __init__(self):
        super().__init__()
        self.fc, self.relu = nn.Linear(4, 4), nn.ReLU(inplace=True)
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.bias.fill_(3e38)

    def forward(self, x):
        out = self.fc(x)
        out += torch.full_like(out, 3e38)  # 6e38: beyond float32
        return self.relu(out)


class Scaled(nn.Module):
    """A child fed a tensor that no module produced (``h * k`` in the parent's code)."""

    def __init__(self, k, child=None):
        super().__init__()
        self.k = k
        self.fc, self.child = nn.Linear(4, 4), child or Divide()

    def forward(self, x):
        return self.child(self.fc(x) * self.k)


@pytest.mark.parametrize("make,expected,own_code", [
    (lambda: nn.Sequential(ResidualOverflow(), nn.Linear(4, 2)), "0", True),
    (lambda: Scaled(2.0), "child", False),  # the input it got was finite: the Divide broke it
    (lambda: Scaled(float("inf")), "", True),  # the parent's h * inf broke it first
])
def test_inputs_no_module_produced_are_checked_when_the_output_broke(make, expected, own_code):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.rand(3, 4) + 0.5
    assert first_bad_forward_call(model, x) == expected
    cap = capture(model, x, mode="stats", target="sum")
    f = cap.nonfinite_onset["forward"]
    assert (f["layer"], f["own_code"]) == (expected, own_code)


def test_a_finite_capture_checks_no_large_input_that_no_module_produced(monkeypatch):
    """The finiteness checks of the tracker are spent only where an output broke, or where
    the output's statistics are not known yet (a small output, summarised later with the
    others: then its small input is checked, which costs what its summary costs)."""
    import gradexplorer.capturing.nonfinite as nonfinite
    from gradexplorer.stats.device import SMALL_VALUES

    calls = []
    real = nonfinite.all_finite
    monkeypatch.setattr(nonfinite, "all_finite", lambda t: calls.append(tuple(t.shape)) or real(t))
    rows = SMALL_VALUES // 4 + 1  # every tensor of the model over SMALL_VALUES: summarised at once
    cap = capture(Scaled(2.0, nn.Tanh()).eval(), torch.rand(rows, 4) + 0.5, mode="stats", target="sum")
    assert cap.nonfinite_onset is None
    assert calls == [(rows, 4)]  # the batch only (the root's input), not fc(x) * 2 entering the child
    # The root returns the output of a call whose input was a recorded output (Tanh after
    # Linear): that output's record is its source, found without a check of its own.
    calls.clear()
    cap = capture(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), torch.rand(rows, 4), mode="stats", target="sum")
    assert cap.nonfinite_onset is None
    assert calls == [(rows, 4)]


def test_the_finiteness_check_reads_a_sum_and_confirms_an_overflowed_one():
    """One read (a sum) for a finite tensor; a sum that overflowed (values near the float32
    or float16 maximum) is confirmed by the extremes, so finite values are never called
    broken, and NaN or Inf anywhere is always found."""
    from gradexplorer.capturing.nonfinite import all_finite

    big = torch.full((1000,), 3e38)
    assert not math.isfinite(float(big.sum()))  # the case: its sum overflows
    for t, expected in ((torch.randn(5000), True), (big, True), (torch.full((100,), 6e4).half(), True),
                        (torch.full((100,), 3e38).bfloat16(), True), (torch.tensor([1.0, float("nan")]), False),
                        (torch.tensor([float("inf"), -float("inf")]), False),
                        (torch.tensor([3e38, 3e38, float("nan")]), False),
                        (torch.tensor([1.0, -float("inf")], dtype=torch.float64), False),
                        (torch.tensor([float("nan")]).half(), False)):
        assert all_finite(t) is expected, t


class DivideInPlace(nn.Module):
    """Breaks its input in place: on entry it held the finite output of the Linear before."""

    def forward(self, x):
        return x.div_(x - x)


def first_bad_call_by_entry_values(model, x):
    """Independent: the first module call (completion order) whose inputs were finite when
    it started and whose output is not, by plain pre-hooks and forward hooks."""
    entry, found = {}, []

    def pre(name):
        def fn(module, args):
            entry[name] = all(bool(torch.isfinite(a).all()) for a in args if isinstance(a, torch.Tensor))
        return fn

    def post(name):
        def fn(module, args, output):
            if entry[name] and not torch.isfinite(output).all() and not found:
                found.append(name)
        return fn

    _run_hooked(model, x, lambda n, m: [m.register_forward_pre_hook(pre(n)), m.register_forward_hook(post(n))])
    return found[0] if found else None


@pytest.mark.parametrize("mode", ["stats", "full"])
def test_an_input_changed_in_place_is_judged_by_its_value_on_entry(mode):
    """The module that broke its input in place is the onset: the input's value when the
    call started was the earlier Linear's finite output (the version it had then names it)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), DivideInPlace(), nn.Linear(4, 2)).eval()
    x = torch.rand(3, 4) + 0.5
    assert first_bad_call_by_entry_values(model, x) == "1"
    cap = capture(model, x, mode=mode, target="sum")
    assert_no_hooks(model)
    f = cap.nonfinite_onset["forward"]
    assert (f["layer"], f["call"], f["own_code"]) == ("1", 0, False)
