"""Layout engines place every visible node, edges point downwards, nodes do not overlap;
colours and widths follow the statistics on a log scale."""

from __future__ import annotations

import math
import re

import pytest
import torch

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.model_graph.grads import graph_gradients
from gradexplorer.model_graph.graph import extract_graph
from gradexplorer.model_graph.layout import ENGINES, available_engines, layout_view
from gradexplorer.model_graph.render import (
    NO_DATA,
    color_scale,
    colormap,
    edge_widths,
    log_ticks,
    node_colors,
    range_labels,
    tick_label,
    to_dot,
    to_svg,
)
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


def test_log_ticks_are_the_powers_of_ten_inside_the_range():
    assert log_ticks(3e-5, 2.0) == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1, 1.0])
    assert log_ticks(0.1, 10.0) == pytest.approx([0.1, 1.0, 10.0])  # the ends count
    assert log_ticks(2.0, 9.0) == []  # inside one decade
    assert log_ticks(0.0, 1.0) == [] and log_ticks(1.0, math.inf) == []
    many = log_ticks(1e-30, 1e30)  # 61 decades: thinned to at most 7 labels, still powers of ten
    assert 2 <= len(many) <= 7
    assert all(abs(math.log10(v) - round(math.log10(v))) < 1e-9 and 1e-30 <= v <= 1e30 for v in many)
    assert [tick_label(v) for v in (1e-5, 1e-3, 1.0, 100.0, 1e4)] == ["1e-05", "0.001", "1", "100", "1e+04"]


class Decades(torch.nn.Module):
    """Each stage multiplies by 0.01: gradients grow by 100 per stage towards the input."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.c(self.b(self.a(x) * 0.01) * 0.01)


def test_svg_colour_bar_spans_the_coloured_nodes_with_power_of_ten_ticks():
    g = graph_gradients(Decades(), torch.randn(3, 4), target="sum")
    view = g.view(set(g.containers()))
    values = [v for n in view.nodes if (v := (g.nodes[n].stats or {}).get("grad_l2")) and v > 0]
    scale = color_scale(g, view.nodes, "grad_l2")
    assert (scale.lo, scale.hi) == (min(values), max(values))
    svg = to_svg(g, view, layout_view(g, view, "simple"))
    ticks = re.findall(r'<line class="tick" x1="([\d.]+)".*?text-anchor="middle">([^<]+)</text>', svg)
    assert len(log_ticks(scale.lo, scale.hi)) >= 3  # the range spans decades
    assert [label for _, label in ticks] == [tick_label(v) for v in log_ticks(scale.lo, scale.hi)]
    bar = re.search(r'class="legend colorbar" x="([\d.]+)" y="24" width="([\d.]+)"', svg)
    x0, width = float(bar.group(1)), float(bar.group(2))
    for (x, _), v in zip(ticks, log_ticks(scale.lo, scale.hi)):
        # Each tick sits where its value falls on the log scale between lo and hi.
        expected = (math.log10(v) - math.log10(scale.lo)) / (math.log10(scale.hi) - math.log10(scale.lo))
        assert float(x) == pytest.approx(x0 + expected * width, abs=0.06)
    assert f"{scale.lo:.3g} to {scale.hi:.3g}" in svg
    assert range_labels(1 / 1.003, 1.003) == ("0.997", "1.003") and range_labels(0.5, 2.0) == ("0.5", "2")
    assert range_labels(1.0, 1.0000001) == ("1", "1.0000001")


@pytest.mark.slow
def test_the_igraph_engine_survives_graphs_of_every_shape():
    """The installed igraph lays out 5,000 random directed acyclic graphs (the shape of a
    model's graph): separate components, isolated nodes, repeated edges, edges that span
    several layers. igraph 1.0's Sugiyama layout reads past the end of its layout matrix on
    such graphs (a component with a dummy vertex followed by other components) and crashed
    the window's process at random; this run crashes it every time, in a process of its own."""
    import subprocess
    import sys

    if "igraph" not in available_engines():
        pytest.skip("igraph is not installed here")
    code = (
        "import random, igraph\n"
        "random.seed(0)\n"
        "for _ in range(5000):\n"
        "    n = random.choice([3, 5, 10, 30, 100])\n"
        "    edges = [tuple(sorted(random.sample(range(n), 2)))\n"
        "             for _ in range(random.choice([1, n // 2, n, 2 * n]))]\n"
        "    layout = igraph.Graph(n=n, edges=edges, directed=True).layout_sugiyama(maxiter=50)\n"
        "    assert len(layout.coords) >= n\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])


@pytest.mark.slow
def test_a_dot_layout_does_not_import_igraph_and_preload_does():
    """igraph's import (0.3-1.2 s, holding the GIL) is kept out of the first paint: choosing
    an engine only looks igraph up; preload_engines imports it in a worker beforehand."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from gradexplorer.model_graph.graph import extract_graph\n"
        "from gradexplorer.model_graph.layout import available_engines, layout_view, preload_engines\n"
        "from tests.core.test_graph import TwoBranch\n"
        "g = extract_graph(TwoBranch(), torch.randn(1, 4))\n"
        "engines = available_engines()\n"
        "layout = layout_view(g, g.view(set(g.containers())), 'auto')\n"
        "before = 'igraph' in sys.modules\n"
        "loaded = preload_engines()\n"
        "print(layout.engine, 'igraph' in engines, before, loaded, 'igraph' in sys.modules, preload_engines())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    engine, listed, before, loaded, after, again = out.stdout.split(maxsplit=5)
    if engine == "dot" and listed == "True":
        assert before == "False" and loaded == "['igraph']" and after == "True"
    assert again.strip() == "[]"  # once imported, nothing more to do
