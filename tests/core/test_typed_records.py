"""The typed records that cross modules besides ``TensorStats`` (tests/core/test_stats_record.py)
hold the keys their TypedDicts declare: where NaN/Inf began, the mergeable statistics'
summaries and fields, a dataset capture's statistics, and a graph node's statistics."""

from __future__ import annotations

import torch
from torch import nn

from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.nonfinite import BackwardOnset, ForwardOnset, NonfiniteOnset
from gradexplorer.comparison.compare import compare
from gradexplorer.model_graph.compare import divergence_values
from gradexplorer.model_graph.grads import graph_gradients
from gradexplorer.model_graph.graph import NodeStats, extract_graph, node_stats_from_calls
from gradexplorer.recording.dataset_capture import _stats_entry
from gradexplorer.stats.merge import (
    DatasetTensorStats,
    GradientMoments,
    GradientMomentsFields,
    GradientSummary,
    MergeStats,
    MergeStatsFields,
)
from tests.core.test_nonfinite import divide_module, sqrt_of_zero


def _keys(typed_dict: type) -> set[str]:
    return set(typed_dict.__annotations__)


def test_a_capture_writes_every_key_of_its_onset_records():
    torch.manual_seed(0)
    cap = capture(divide_module().eval(), torch.randn(3, 4), mode="stats", target="sum")
    onset = cap.nonfinite_onset
    assert onset is not None and set(onset) == _keys(NonfiniteOnset)
    assert onset["forward"] is not None and set(onset["forward"]) == _keys(ForwardOnset)
    cap = capture(sqrt_of_zero().eval(), torch.randn(3, 4), mode="stats", target="sum")
    onset = cap.nonfinite_onset
    assert onset is not None and onset["backward"] is not None
    assert set(onset["backward"]) == _keys(BackwardOnset)
    x = torch.randn(3, 4)
    x[0, 0] = float("nan")  # the input batch: the forward onset names no layer
    onset = capture(nn.Sequential(nn.Linear(4, 2)), x, mode="stats", target="sum").nonfinite_onset
    assert onset is not None and onset["forward"] is not None
    assert set(onset["forward"]) == _keys(ForwardOnset) and onset["forward"]["layer"] is None


def test_the_mergeable_statistics_records_hold_their_declared_keys():
    g = torch.Generator().manual_seed(0)
    s = MergeStats.of_tensor(torch.randn(500, generator=g))
    assert set(s.to_dict()) == _keys(MergeStatsFields)
    back = MergeStats.from_dict(s.to_dict())
    assert (back.numel, back.mean, back.m2, back.hist.tolist()) == (s.numel, s.mean, s.m2, s.hist.tolist())
    moments = GradientMoments()
    assert set(moments.summary()) == _keys(GradientSummary)
    for _ in range(3):
        moments.add(torch.randn(4, 5, generator=g))
    assert set(moments.summary()) == _keys(GradientSummary)
    assert set(moments.to_dict()) == _keys(GradientMomentsFields)
    # A dataset capture's record: TensorStats's keys but overflow, and its own two.
    assert set(_stats_entry(s)) == _keys(DatasetTensorStats) - {"overflow"}


def test_graph_nodes_hold_only_declared_statistics():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    declared = _keys(NodeStats)
    cap = capture(model, x, target="sum")
    from_calls = node_stats_from_calls(cap["0"].calls[0].stats)
    assert set(from_calls) == {"grad_l2", "grad_mean_abs", "grad_rms", "activation_std", "nonfinite", "zero"}
    graph = extract_graph(model, x)
    graph.attach_capture(cap)
    assert any(n.stats for n in graph.nodes.values())
    for n in graph.nodes.values():
        assert set(n.stats or {}) <= declared, n.id
    for n in graph_gradients(model, x, target="sum").nodes.values():
        assert set(n.stats or {}) <= declared, n.id
    result = compare(cap, capture(model, x, target="sum"))
    assert set(divergence_values(result.calls[0])) == {"div_grad", "div_activation", "grad_ratio"} <= declared
