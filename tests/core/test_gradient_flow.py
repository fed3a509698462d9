"""gradexplorer.analysis.gradient_flow: per-layer series and flags, on hand-made and real captures."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gradexplorer.analysis.gradient_flow import aggregate, flow_series, layer_flags
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.data import CallRecord, Capture, LayerRecord
from gradexplorer.stats.tensor_stats import tensor_stats


def _call(grad: torch.Tensor | None, act: torch.Tensor | None = None) -> CallRecord:
    act = torch.ones(4) if act is None else act
    return CallRecord(
        activation=act,
        grad_output=grad,
        stats={"activation": tensor_stats(act), "grad_output": None if grad is None else tensor_stats(grad),
               "grad_input": None},
        shape=tuple(act.shape),
        dtype="float32",
    )


def _capture(layers: dict[str, list[torch.Tensor | None]], params: dict | None = None) -> Capture:
    recs = {}
    for name, grads in layers.items():
        rec = LayerRecord("Linear", [_call(g) for g in grads])
        for pname, pg in (params or {}).get(name, {}).items():
            rec.param_grads[pname] = pg
            rec.param_stats[pname] = tensor_stats(pg)
        recs[name] = rec
    return Capture({"mode": "full", "layer_order": list(recs)}, None, None, None, recs)


def _scaled(scale: float, n: int = 16) -> torch.Tensor:
    g = torch.randn(n)
    return g / g.norm() * scale * math.sqrt(n)  # RMS == scale


def test_series_in_forward_order_aggregating_calls():
    a = torch.tensor([3.0, -4.0])
    b1, b2 = torch.tensor([1.0, 2.0, -2.0]), torch.tensor([0.0, -6.0])
    cap = _capture({"a": [a], "b": [b1, b2]})
    names, l2 = flow_series(cap, "l2")
    assert names == ["a", "b"]
    assert l2[0] == pytest.approx(5.0)
    assert l2[1] == pytest.approx(torch.cat([b1, b2]).norm().item())
    _, mean_abs = flow_series(cap, "mean_abs")
    assert mean_abs[1] == pytest.approx(torch.cat([b1, b2]).abs().mean().item())
    _, max_abs = flow_series(cap, "max_abs")
    assert max_abs == pytest.approx([4.0, 6.0])


def test_missing_gradients_are_nan_and_params_series():
    w = torch.tensor([[1.0, -2.0], [2.0, 0.0]])
    cap = _capture({"a": [None], "b": [torch.ones(3)]}, params={"b": {"weight": w, "bias": torch.tensor([2.0])}})
    _, values = flow_series(cap)
    assert math.isnan(values[0]) and values[1] == pytest.approx(math.sqrt(3))
    _, params = flow_series(cap, "l2", kind="param")
    assert math.isnan(params[0]) and params[1] == pytest.approx(math.sqrt(9 + 4))
    _, acts = flow_series(cap, "max_abs", kind="activation")
    assert acts == [1.0, 1.0]


def test_unknown_metric_or_kind():
    cap = _capture({"a": [torch.ones(2)]})
    with pytest.raises(GradExplorerError):
        flow_series(cap, "median")
    with pytest.raises(GradExplorerError):
        flow_series(cap, kind="weights")
    with pytest.raises(GradExplorerError):
        aggregate([], "median")


def test_flags():
    torch.manual_seed(0)
    nan_grad = _scaled(1.0)
    nan_grad[3] = float("nan")
    layers = {
        "l0": [_scaled(1.0)],
        "l1": [_scaled(2.0)],
        "dead": [torch.zeros(16)],
        "l3": [_scaled(0.5)],
        "tiny": [_scaled(1e-5)],
        "l5": [_scaled(1.0)],
        "huge": [_scaled(1e4)],
        "l7": [_scaled(3.0)],
        "cut": [None],
        "nan": [nan_grad],
        "l10": [_scaled(1.0)],
        "small_but_ok": [_scaled(5e-3)],
    }
    flags = layer_flags(_capture(layers))
    assert list(flags) == list(layers)
    assert flags["dead"] == ["zero"]
    assert flags["tiny"] == ["vanishing"]
    assert flags["huge"] == ["exploding"]
    assert flags["cut"] == ["no gradient"]
    assert flags["nan"] == ["nan/inf"]
    for ok in ("l0", "l1", "l3", "l5", "l7", "l10", "small_but_ok"):
        assert flags[ok] == [], ok


def test_flags_use_rms_not_size():
    # A 10-element layer among 100k-element ones is not vanishing just for being small.
    cap = _capture({"big1": [_scaled(1.0, 100_000)], "big2": [_scaled(1.0, 100_000)],
                    "small": [_scaled(1.0, 10)], "big3": [_scaled(1.0, 100_000)]})
    assert all(f == [] for f in layer_flags(cap).values())


def test_one_call_without_gradient_is_not_no_gradient():
    cap = _capture({"a": [torch.ones(3), None]})
    assert layer_flags(cap)["a"] == []


def test_thresholds_are_parameters():
    cap = _capture({"a": [_scaled(1.0)], "b": [_scaled(0.05)], "c": [_scaled(1.0)]})
    assert layer_flags(cap)["b"] == []
    assert layer_flags(cap, vanishing=0.1)["b"] == ["vanishing"]


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(8, 8)
        self.unused = nn.Linear(8, 1)
        self.fc3 = nn.Linear(8, 3)

    def forward(self, x):
        h = self.relu(self.fc1(x))
        h = self.relu(self.fc2(h))  # relu is called twice
        self.unused(h)  # does not reach the output
        return self.fc3(h)


def test_real_capture_full_and_stats_modes_agree():
    torch.manual_seed(0)
    net = _Net().eval()
    x = torch.randn(4, 6)
    full = capture(net, x)
    stats = capture(net, x, mode="stats")
    names, values = flow_series(full)
    names_s, values_s = flow_series(stats)
    assert names == names_s == full.layer_order
    assert values == pytest.approx(values_s, rel=1e-5, nan_ok=True)
    # The reused ReLU gets one bar aggregating both calls.
    relu = full["relu"].calls
    assert len(relu) == 2
    expected = torch.cat([c.grad_output.flatten() for c in relu]).norm().item()
    assert values[names.index("relu")] == pytest.approx(expected, rel=1e-5)
    flags = layer_flags(stats)
    assert flags["unused"] == ["no gradient"]
    assert flags == layer_flags(full)
