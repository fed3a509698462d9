"""``benchmarks/call_breakdown.py``: each what-if patch removes the part it names while it
is on, and leaves the capture as it was once it is off (a patch left behind would corrupt
every later capture in the process)."""

from __future__ import annotations

import math

import torch
from torch import nn

import gradexplorer.capturing.capture as capture_module
from benchmarks import call_breakdown as cb
from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.nonfinite import OnsetTracker


class Divide(nn.Module):
    def forward(self, x):
        return x / (x - x)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), Divide(), nn.Linear(4, 2)).eval()


def _full_record(stats):
    return {"mean", "std", "hist", "hist_range", "nan_count", "inf_count"} <= set(stats)


def test_each_patch_removes_its_part_and_is_undone():
    model, x = _model(), torch.rand(3, 4) + 0.5
    before = capture(model, x, mode="stats", target="sum")
    assert before.nonfinite_onset["forward"]["layer"] == "1"
    assert _full_record(before["0"].calls[0].stats["activation"])
    assert before["0"].param_stats["weight"] is not None
    originals = (OnsetTracker.enter, OnsetTracker.result, capture_module._layer_record)

    with cb.no_onset_notes():
        cap = capture(model, x, mode="stats", target="sum")
    assert cap.nonfinite_onset is None  # the NaN is there; nothing took note of it
    assert _full_record(cap["0"].calls[0].stats["activation"])

    with cb.no_parameter_statistics():
        cap = capture(model, x, mode="stats", target="sum")
    assert cap["0"].param_stats["weight"] is None and cap["0"].param_absent["weight"]
    assert _full_record(cap["0"].calls[0].stats["activation"])

    with cb.WHAT_IF["both"]():
        cap = capture(model, x, mode="stats", target="sum")
    assert cap.nonfinite_onset is None and cap["0"].param_stats["weight"] is None

    assert (OnsetTracker.enter, OnsetTracker.result, capture_module._layer_record) == originals
    after = capture(model, x, mode="stats", target="sum")
    assert after.nonfinite_onset == before.nonfinite_onset
    for name in ("0", "2"):
        for kind in ("activation", "grad_output"):
            a, b = after[name].calls[0].stats[kind], before[name].calls[0].stats[kind]
            assert _full_record(a)
            assert torch.equal(a["hist"], b["hist"])
            assert all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k]))
                       for k in ("mean", "std", "min", "max", "nan_count", "inf_count"))
        a, b = after[name].param_stats["weight"], before[name].param_stats["weight"]
        assert _full_record(a) and (a["numel"], a["nan_count"], a["inf_count"]) == (
            b["numel"], b["nan_count"], b["inf_count"])


def test_the_phases_add_up_to_the_capture():
    model, x = _model(), torch.rand(3, 4) + 0.5
    done, total, fwd, bwd, read = cb.phases(model, x, passes=3)
    labels = [label for _owner, _name, label in cb.PHASES]
    assert set(done) <= set(labels) and labels[0] in done and labels[1] in done
    assert all(v >= 0 for v in done.values()) and fwd > 0 and bwd > 0 and read >= 0
    # Disjoint phases, except the batch after backward's own flush: their sum fits the whole.
    assert sum(v for k, v in done.items() if k != cb._FLUSHES) <= total


def test_the_floor_row_computes_every_statistic_the_capture_does():
    """``notes_only`` (the design's floor) does the statistics' work, not less: each output's,
    parameter gradient's and output gradient's record, once filled, holds the float64 NumPy
    moments of the tensor, which a plain forward and ``torch.autograd.grad`` give; and its
    hooks are gone afterwards."""
    from benchmarks.call_overhead import mlp

    model, x = mlp(depth=3, width=8), torch.randn(4, 8)
    outs, grads, later = cb.notes_only(model, x)
    assert len(later) > 0 and not outs[0]  # computed, not yet written
    later.fill()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())

    seen: list[torch.Tensor] = []
    handles = [m.register_forward_hook(lambda m, a, y: seen.append(y)) for m in model]
    try:
        out = model(x)
    finally:
        for h in handles:
            h.remove()
    params = list(model.parameters())
    truth = torch.autograd.grad(out.max(dim=1).values.sum(), params + seen)
    assert len(outs) == len(seen) == 6 and len(grads) == len(truth) == 12
    for record, t in zip(outs + grads, seen + list(truth)):
        v = t.detach().double().numpy().ravel()
        assert record["numel"] == v.size
        assert math.isclose(record["mean"], v.mean(), rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(record["std"], v.std(ddof=1), rel_tol=1e-9, abs_tol=1e-12)
        assert (record["min"], record["max"]) == (v.min(), v.max())
