"""The graph coloured by divergence: the numbers on the nodes are gradexplorer.comparison.compare's for the same
layer and call, and a hand-made difference (one weight scaled by 1.1) lands where it must."""

from __future__ import annotations

import math

import pytest
import torch

from gradexplorer.capturing.capture import capture
from gradexplorer.comparison.compare import compare
from gradexplorer.model_graph.compare import attach_comparison
from gradexplorer.model_graph.graph import extract_graph
from gradexplorer.model_graph.layout import layout_view
from gradexplorer.model_graph.render import NO_DATA, color_scale, colormap, diverging_colormap, node_colors, to_svg
from gradexplorer.model_graph.statistics import DIVERGENCE_BY
from tests.core.test_compare import Chain


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    ma, mb = Chain(), Chain()
    mb.load_state_dict(ma.state_dict())
    with torch.no_grad():
        mb.l2.weight.mul_(1.1)
    x = torch.randn(3, 4)
    a, b = capture(ma, x, target="sum"), capture(mb, x, target="sum")
    return ma, x, compare(a, b)


def test_nodes_carry_the_comparisons_per_call_values(pair):
    model, x, result = pair
    g = extract_graph(model, x[:1])
    assert attach_comparison(g, result) == len(result.calls) == 3
    for c in result.calls:
        stats = g.module_node(c.layer, c.call).stats
        grad, act = c.kinds["grad_output"], c.kinds["activation"]
        assert stats["div_grad"] == grad.divergence == grad.tensor.rel_l2
        assert stats["div_activation"] == act.divergence
        assert stats["grad_ratio"] == grad.tensor.norm_ratio
    # By hand: the target is the sum, so the gradient reaching l2's output (through l3,
    # unchanged) is the same in A and B; at l1's output it is W2ᵀ of it, 1.1 times A's
    # (to float32 rounding of the scaled weight).
    for name in ("l2", "l3"):
        assert g.module_node(name).stats["div_grad"] == 0.0
        assert g.module_node(name).stats["grad_ratio"] == 1.0
    assert g.module_node("l1").stats["grad_ratio"] == pytest.approx(1.1, rel=1e-6)
    assert g.module_node("l1").stats["div_grad"] == pytest.approx(0.1, rel=1e-5)
    # The activation diverges from l2 on, not before.
    assert g.module_node("l1").stats["div_activation"] == 0.0
    assert g.module_node("l2").stats["div_activation"] > 0


def test_divergence_colours_a_ratio_on_a_diverging_scale_and_zero_as_identical(pair):
    model, x, result = pair
    g = extract_graph(model, x[:1])
    attach_comparison(g, result)
    view = g.view(set(g.containers()))
    scale = color_scale(g, view.nodes, "grad_ratio")
    assert scale.diverging and scale.hi == pytest.approx(1.1) and scale.lo == pytest.approx(1 / 1.1)
    colors = node_colors(g, view.nodes, "grad_ratio")
    assert colors["m:l3:0"] == diverging_colormap(0.5)  # B equals A: the white middle
    assert colors["m:l1:0"] == diverging_colormap(1.0)  # B larger: the red end
    assert [label for _t, _v, label in scale.ticks(minor=False)] == ["1"]
    diff = node_colors(g, view.nodes, "div_grad")
    assert diff["m:l3:0"] == colormap(0.0) != NO_DATA  # an exact 0 is "identical", not "no data"
    assert diff["m:l1:0"] == colormap(1.0)
    svg = to_svg(g, view, layout_view(g, view, "simple"), "grad_ratio")
    assert DIVERGENCE_BY["grad_ratio"] in svg and "1 in the middle" in svg
    assert math.isclose(color_scale(g, view.nodes, "div_grad").hi, 0.1, rel_tol=1e-5)
