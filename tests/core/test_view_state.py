"""The view state, the per-capture summary and the small rules the views and the CLI share."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gradexplorer.analysis.capture_summary import default_layer, summarize
from gradexplorer.analysis.class_names import class_name, top_classes
from gradexplorer.analysis.gradient_flow import call_flags, layer_flags
from gradexplorer.analysis.token_grid import TokenGrid, token_grid
from gradexplorer.base.units import format_bytes
from gradexplorer.capturing.capture import capture
from gradexplorer.pipeline.view_state import ViewState


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.pool(self.act(self.conv(x))).flatten(1))


@pytest.fixture(scope="module")
def cap():
    torch.manual_seed(0)
    return capture(Net().eval(), torch.randn(2, 3, 6, 6))


def test_select_tells_layer_observers_the_new_call_once():
    state = ViewState(layer="a", call=1)
    seen = []
    state.events.layer.connect(lambda name: seen.append(("layer", name, state.call)))
    state.events.call.connect(lambda call: seen.append(("call", call)))
    state.select("b", 2)
    assert seen == [("layer", "b", 2)]
    state.select("b", 0)  # same layer: only the call changes
    assert seen[-1] == ("call", 0)
    state.select("b", 0)
    assert len(seen) == 2  # nothing changed, nothing said


def test_fit_keeps_a_captured_layer_and_clamps(cap):
    state = ViewState(layer="act", call=5, sample=9)
    assert not state.fit(cap, batch_size=2)
    assert (state.layer, state.call, state.sample) == ("act", 0, 1)
    state.layer = "not.there"
    assert state.fit(cap, batch_size=2)
    assert (state.layer, state.call) == default_layer(cap) == ("act", 0)
    assert state.fit(None, 0) and state.layer is None


def test_view_state_refuses_unknown_kinds():
    with pytest.raises(ValueError):
        ViewState(tensor="gradient")
    with pytest.raises(ValueError):
        ViewState(reduction="max")


def test_summary_is_computed_once_per_capture(cap, monkeypatch):
    import gradexplorer.analysis.capture_summary as cs

    calls = []
    real = cs.layer_flags
    monkeypatch.setattr(cs, "layer_flags", lambda c: calls.append(1) or real(c))
    other = capture(Net().eval(), torch.randn(1, 3, 6, 6))
    first = summarize(other)
    assert summarize(other) is first and len(calls) == 1
    assert first.flags == layer_flags(other)
    # The norm over calls, against float64 from the captured tensors.
    for name in other.layer_order:
        g = torch.cat([c.grad_output.double().flatten() for c in other[name].calls])
        assert math.isclose(first.grad_norms[name], float(g.norm()), rel_tol=1e-5)


def test_call_flags_name_nan_zero_and_missing_gradients():
    ok = {"numel": 4, "zero_fraction": 0.0, "nan_count": 0, "inf_count": 0}
    zero = dict(ok, zero_fraction=1.0)
    nan = dict(ok, nan_count=1)
    assert call_flags({"activation": ok, "grad_output": ok}) == []
    assert call_flags({"activation": ok, "grad_output": None}) == ["no gradient"]
    assert call_flags({"activation": nan, "grad_output": zero}) == ["nan/inf", "zero"]
    assert call_flags({"activation": ok, "grad_output": ok, "grad_input": nan}) == ["nan/inf"]


@pytest.mark.parametrize("tokens, grid", [(197, TokenGrid(14, True)), (196, TokenGrid(14, False)),
                                          (17, TokenGrid(4, True)), (10, TokenGrid(3, True)),
                                          (12, None), (0, None), (1, TokenGrid(1, False))])
def test_token_grid(tokens, grid):
    assert token_grid(tokens) == grid


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1536, 600 * 2**20, None)] == ["0 B", "1023 B", "1.5 KiB", "600 MiB", "?"]


def test_class_names_and_top_classes():
    assert class_name(1, ["cat", "dog"]) == "dog"
    assert class_name(5, ["cat", "dog"]) == "class 5" == class_name(5, None)
    top = top_classes(torch.tensor([[0.0, 2.0, 1.0]]), ["a", "b", "c"], k=2)
    p = torch.softmax(torch.tensor([0.0, 2.0, 1.0], dtype=torch.float64), 0)
    assert [n for n, _ in top[0]] == ["b", "c"]
    assert math.isclose(top[0][0][1], float(p[1]), rel_tol=1e-6)
    assert top_classes(torch.zeros(2, 1), None) == []


def test_top_classes_of_per_token_logits_read_the_target_axis():
    from gradexplorer.capturing.targets import class_dim_of

    torch.manual_seed(0)
    logits = torch.randn(2, 9, 5)  # (B, length, vocab)
    top = top_classes(logits, None, k=5, class_dim=class_dim_of("top1,dim=-1"))
    # Ground truth: the softmax of the logits averaged over the 9 positions, in float64.
    want = torch.softmax(logits.double().mean(1), dim=1)
    for s in range(2):
        assert len(top[s]) == 5  # five classes of the vocabulary, not of the 9 positions
        for name, p in top[s]:
            assert math.isclose(p, float(want[s, int(name.split()[1])]), rel_tol=1e-6)
    assert sum(p for _, p in top[0]) == pytest.approx(1.0, rel=1e-6)
    assert class_dim_of("sum") == 1 and class_dim_of("no such target") == 1 and class_dim_of(None) == 1
    assert top_classes(logits, None, class_dim=0) == [] and top_classes(logits, None, class_dim=3) == []


@pytest.mark.parametrize("tokens, input_shape, grid", [
    (197, (1, 3, 224, 224), TokenGrid(14, True)),   # vit_b_16
    (197, None, TokenGrid(14, True)),               # input unknown: the plain rule
    (10, (2, 10), None), (10, (2, 10, 32), None),   # sequences are never grids
    (16, (2, 16, 8), None),
    (10, (1, 3, 64, 64), None),                     # 3x3 does not divide 64 px
    (17, (1, 3, 64, 64), TokenGrid(4, True)),
])
def test_aligned_token_grid(tokens, input_shape, grid):
    from gradexplorer.analysis.token_grid import aligned_token_grid

    assert aligned_token_grid(tokens, input_shape) == grid


def test_grad_cam_is_offered_only_on_grids_of_a_picture():
    from gradexplorer.analysis.gradcam import cam_supported, cam_unavailable_reason
    from gradexplorer.analysis.heatmaps import layout_of

    assert cam_supported((2, 10, 32)) and not cam_supported((2, 10, 32), (2, 10, 32))
    assert cam_unavailable_reason((2, 10, 32), (2, 10, 32), "blk").startswith("Grad-CAM shows where")
    assert "3×3 grid of them does not divide the 64×64 input" in cam_unavailable_reason((1, 10, 8), (1, 3, 64, 64))
    assert cam_unavailable_reason((1, 197, 8), (1, 3, 224, 224)) is None
    assert cam_unavailable_reason((1, 8, 7, 7), (1, 3, 224, 224)) is None
    assert not cam_supported((2, 8, 5, 5), (2, 10))  # a conv map of a sequence has no picture
    assert layout_of((10, 32), (2, 10, 32)).kind == "matrix"
    assert layout_of((10, 32)).kind == "spatial"  # unknown input: as before
