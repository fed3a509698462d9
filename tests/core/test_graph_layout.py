"""Layout engines place every visible node, edges point downwards, nodes do not overlap;
colours and widths follow the statistics on a log scale."""

from __future__ import annotations

import math

import pytest
import torch

from core.errors import GradExplorerError
from core.graph import extract_graph
from core.graph_grads import graph_gradients
from core.graph_layout import ENGINES, available_engines, layout_view
from core.graph_render import NO_DATA, colormap, edge_widths, node_colors, to_dot, to_svg
from tests.core.test_graph import Attention, TwoBranch


def _overlap(layout, a, b) -> bool:
    (ax, ay), (aw, ah) = layout.pos[a], layout.size[a]
    (bx, by), (bw, bh) = layout.pos[b], layout.size[b]
    return abs(ax - bx) < (aw + bw) / 2 - 1e-6 and abs(ay - by) < (ah + bh) / 2 - 1e-6


@pytest.mark.parametrize("engine", ENGINES)
def test_engines_lay_out_every_node_downwards_without_overlap(engine):
    if engine not in available_engines():
        pytest.skip(f"{engine} is not installed here")
    g = extract_graph(Attention(), torch.randn(1, 5, 8))
    view = g.view(set(g.containers()))
    layout = layout_view(g, view, engine)
    assert set(layout.pos) == set(view.nodes) and layout.engine == engine
    for e in view.edges:
        assert layout.pos[e.src][1] < layout.pos[e.dst][1], (engine, e.src, e.dst)
        assert len(layout.routes[(e.src, e.dst)]) >= 2
    nodes = list(view.nodes)
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            assert not _overlap(layout, a, b), (engine, a, b)


def test_unknown_engine_is_a_clear_error():
    g = extract_graph(TwoBranch(), torch.randn(1, 4))
    with pytest.raises(GradExplorerError, match="Unknown layout engine"):
        layout_view(g, g.view(set()), "neato")


def test_colours_and_widths_follow_the_statistics_on_a_log_scale():
    g = graph_gradients(TwoBranch(), torch.randn(3, 4), target="sum")
    view = g.view(set(g.containers()))
    colors = node_colors(g, view.nodes, "grad_l2")
    values = {n: g.nodes[n].stats["grad_l2"] for n in view.nodes}
    positive = {n: v for n, v in values.items() if v and v > 0}
    lo = min(positive, key=positive.get)
    hi = max(positive, key=positive.get)
    assert colors[lo] == colormap(0.0) and colors[hi] == colormap(1.0)
    mid = math.sqrt(positive[lo] * positive[hi])  # the geometric middle is the colour's middle
    assert colormap(0.5) == colormap((math.log10(mid) - math.log10(positive[lo]))
                                     / (math.log10(positive[hi]) - math.log10(positive[lo])))
    widths = edge_widths(view)
    by_norm = sorted(view.edges, key=lambda e: e.grad_l2)
    assert [widths[(e.src, e.dst)] for e in by_norm] == sorted(widths[(e.src, e.dst)] for e in by_norm)
    # Without statistics nodes keep neutral fills, never the "no data" grey of a coloured view.
    plain = extract_graph(TwoBranch(), torch.randn(1, 4))
    assert NO_DATA not in node_colors(plain, plain.view(set()).nodes).values()


def test_svg_and_dot_show_exactly_the_visible_nodes():
    g = extract_graph(TwoBranch(), torch.randn(1, 4))
    view = g.view({"m::0"})
    layout = layout_view(g, view, "simple")
    svg = to_svg(g, view, layout)
    assert svg.count("<rect x=") + svg.count("<ellipse") == len(view.nodes)
    assert svg.count("marker-end=") == len(view.edges)
    dot = to_dot(g, view)
    assert dot.count(" -> ") == len(view.edges)
