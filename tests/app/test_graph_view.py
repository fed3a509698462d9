"""The graph view: first paint, click <-> selection both ways, expand/collapse in place,
tick from the graph, search, hover text, export."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision
from PySide6.QtCore import Qt

from gradexplorer.model_graph.grads import graph_gradients
from gradexplorer.model_graph.graph import extract_graph
from gradexplorer.model_graph.render import tick_label
from gradexplorer_app.views.graph_view import GraphPanel

TIMEOUT = 60_000


@pytest.fixture(scope="module")
def r18_graph():
    return graph_gradients(torchvision.models.resnet18(), torch.randn(2, 3, 64, 64))


@pytest.fixture
def panel(qtbot, r18_graph):
    p = GraphPanel()
    qtbot.addWidget(p)
    p.resize(900, 900)
    p.show()
    with qtbot.waitSignal(p.layout_done, timeout=TIMEOUT):
        p.set_graph(r18_graph)
    yield p
    p.shutdown()


def _click(qtbot, panel, node_id, double=False):
    item = panel.items[node_id]
    panel.canvas.centerOn(item)
    pos = panel.canvas.mapFromScene(item.rect.center())
    if double:
        qtbot.mouseDClick(panel.canvas.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    else:
        qtbot.mouseClick(panel.canvas.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def test_default_view_shows_about_sixty_nodes_coloured(panel, r18_graph):
    view = r18_graph.view(r18_graph.expanded_to_depth(r18_graph.default_depth()))
    assert set(panel.items) == set(view.nodes)
    assert len(panel.items) <= 60
    fills = {item.fill.name() for item in panel.items.values()}
    assert len(fills) > 3  # coloured by gradient, not one flat colour
    assert "grad" in panel.scale_label.text()


def test_click_selects_the_layer_and_the_reverse(qtbot, panel):
    with qtbot.waitSignal(panel.layer_selected, timeout=5000) as sig:
        _click(qtbot, panel, "m:fc:0")
    assert sig.args == ["fc", 0]
    assert panel.selected == "m:fc:0" and panel.items["m:fc:0"].selected_
    # The other way: a layer hidden in a collapsed block selects that block.
    assert panel.select_layer("layer2.1.conv2")
    assert panel.selected == "m:layer2.1:0"
    assert not panel.items["m:fc:0"].selected_
    assert not panel.select_layer("no.such.layer")


def test_double_click_expands_in_place_and_a_frame_collapses(qtbot, panel, r18_graph):
    old = panel.items["m:layer2.0:0"].rect.center()
    with qtbot.waitSignal(panel.layout_done, timeout=TIMEOUT):
        _click(qtbot, panel, "m:layer2.0:0", double=True)
    assert "m:layer2.0:0" not in panel.items
    assert "m:layer2.0.conv1:0" in panel.items and "m:layer2.0.downsample:0" in panel.items
    first = panel.items["m:layer2.0.conv1:0"].rect.center()
    assert (first.x(), first.y()) == pytest.approx((old.x(), old.y()))
    # Edges stay consistent: one scene path per visible edge.
    from gradexplorer_app.views.graph_view import GraphEdgeItem

    edges = [i for i in panel.canvas.scene().items() if isinstance(i, GraphEdgeItem)]
    assert len(edges) == len(r18_graph.view(panel.expanded).edges)
    before = panel.items["m:layer2.0.conv1:0"].rect.center()
    with qtbot.waitSignal(panel.layout_done, timeout=TIMEOUT):
        panel.toggle("m:layer2.0:0")
    back = panel.items["m:layer2.0:0"].rect.center()
    assert (back.x(), back.y()) == pytest.approx((before.x(), before.y()))
    # A leaf is not a container: double-clicking it changes nothing.
    n = len(panel.items)
    panel.toggle("m:fc:0")
    assert len(panel.items) == n and not panel.layouts.is_busy()


def test_tick_and_untick_from_the_graph(qtbot, panel):
    menu = panel.build_node_menu("m:fc:0")
    tick = menu.actions()[0]
    assert tick.text() == "Capture this layer" and not tick.isChecked()
    with qtbot.waitSignal(panel.layer_check_requested, timeout=5000) as sig:
        tick.trigger()
    assert sig.args == ["fc", True]
    panel.set_checked_layers(["fc"])
    assert panel.items["m:fc:0"].checked and not panel.items["m:conv1:0"].checked
    tick = panel.build_node_menu("m:fc:0").actions()[0]
    assert tick.isChecked()
    with qtbot.waitSignal(panel.layer_check_requested, timeout=5000) as sig:
        tick.trigger()
    assert sig.args == ["fc", False]
    texts = [a.text() for a in panel.build_node_menu("m:layer1.0:0").actions()]
    assert "Expand" in texts and "Collapse layer1" in texts


def test_search_and_hover_text(panel):
    hits = panel.find_nodes("downsample")
    # Hidden inside collapsed blocks: the blocks that hold a match light up.
    assert set(hits) == {"m:layer2.0:0", "m:layer3.0:0", "m:layer4.0:0"}
    assert all(panel.items[h].hit for h in hits)
    assert panel.find_nodes("") == [] and not any(i.hit for i in panel.items.values())
    tip = panel.tooltip("m:fc:0")
    assert "fc" in tip and "Linear" in tip and "2×1000" in tip and "gradient L2 norm" in tip


def test_colour_by_another_statistic(panel):
    before = {n: i.fill.name() for n, i in panel.items.items()}
    panel.color_by.setCurrentIndex(panel.color_by.findData("activation_std"))
    after = {n: i.fill.name() for n, i in panel.items.items()}
    assert before != after and "activation std" in panel.scale_label.text()


def _coloured_values(panel, stat):
    values = [v for n in panel.items if (v := (panel.graph.nodes[n].stats or {}).get(stat)) is not None
              and not isinstance(v, bool) and v > 0 and math.isfinite(v)]
    assert values
    return min(values), max(values)


def test_log_colour_bar_follows_the_statistic(qtbot, panel):
    bar = panel.color_bar
    assert bar.isVisible()
    for stat in ("grad_l2", "activation_std", "grad_mean_abs"):
        panel.color_by.setCurrentIndex(panel.color_by.findData(stat))
        lo, hi = _coloured_values(panel, stat)
        assert (bar.lo, bar.hi) == (lo, hi)  # the bar spans exactly the coloured nodes
        powers = [10.0 ** k for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2)
                  if lo <= 10.0 ** k <= hi]
        majors = bar.scale.ticks(minor=False)
        assert [v for _t, v, _l in majors] == pytest.approx(powers)
        ticks = bar.scale.ticks()
        assert bar.tick_labels() == [tick_label(v) for _t, v, _l in ticks] and len(ticks) >= 2
        for t, v, _label in ticks:  # every tick is a power of ten (times 2 or 5 within one decade)
            assert lo <= v <= hi
            mantissa = v / 10.0 ** math.floor(math.log10(v) + 1e-9)
            assert min(abs(mantissa - m) for m in (1, 2, 5)) < 1e-6 and (len(powers) < 2 or mantissa == 1)
            assert t == pytest.approx(math.log10(v / lo) / math.log10(hi / lo))
    panel.color_by.setCurrentIndex(panel.color_by.findData("grad_l2"))
    image = bar.grab().toImage()
    left = image.pixelColor(int(bar.bar_rect().left()) + 2, int(bar.bar_rect().center().y()))
    right = image.pixelColor(int(bar.bar_rect().right()) - 2, int(bar.bar_rect().center().y()))
    assert left.name() != right.name()  # a gradient, not one flat colour
    panel.color_by.setCurrentIndex(panel.color_by.findData("flags"))
    assert not bar.isVisible() and "exploding" in panel.scale_label.text()


def test_export_svg_and_png(panel, tmp_path, monkeypatch):
    from gradexplorer_app import dialogs

    svg = panel.export(str(tmp_path / "g.svg"))
    text = (tmp_path / "g.svg").read_text()
    assert svg and text.startswith("<svg") and text.count("marker-end=") == len(panel._view.edges)
    monkeypatch.setattr(dialogs, "ask_save_file", lambda *a, **k: str(tmp_path / "g.png"))
    panel.export()
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setattr(dialogs, "ask_save_file", lambda *a, **k: None)
    assert panel.export() is None


def test_extraction_runs_in_a_worker(qtbot):
    p = GraphPanel()
    qtbot.addWidget(p)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with qtbot.waitSignal(p.layout_done, timeout=TIMEOUT):
        p.extract(model, torch.randn(1, 4))
    assert {"m:0:0", "m:1:0", "m:2:0", "in:input", "out:output"} <= set(p.items)
    with qtbot.waitSignal(p.failed, timeout=TIMEOUT) as sig:
        p.extract(model, torch.randn(1, 5))
    assert "forward failed" in sig.args[0]
    p.shutdown()


def test_capture_without_model_draws_the_graph_it_carries(qtbot):
    from gradexplorer.capturing.capture import capture

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    x = torch.randn(3, 4)
    cap = capture(model, x, mode="stats")
    cap.graph = extract_graph(model, x[:1]).to_dict()
    p = GraphPanel()
    qtbot.addWidget(p)
    with qtbot.waitSignal(p.layout_done, timeout=TIMEOUT):
        p.set_capture(cap)
    assert p.graph.nodes["m:2:0"].stats["grad_l2"] == pytest.approx(cap["2"].calls[0].stats["grad_output"]["l2"])
    p.shutdown()


@pytest.mark.slow
def test_in_the_window_selection_goes_both_ways_and_ticks_reach_the_session(qtbot, demo):
    w = demo
    panel = w.graph_panel
    w.module_tabs.setCurrentWidget(panel)
    # Not a wait for layout_done: the graph the run's capture carries may have been laid out
    # before the tab opened, its signal gone before anyone waited (a loaded CI machine timed
    # out so). Wait until the panel has drawn a graph and nothing is pending.
    qtbot.waitUntil(lambda: panel.graph is not None and bool(panel.items) and not panel.layouts.is_busy()
                    and not panel.extractions.is_busy(), timeout=TIMEOUT)
    assert panel.graph is not None and panel.graph.meta["model"]
    # Coloured by the run that the demo fixture made.
    assert any(n.stats for n in panel.graph if n.kind == "module")
    # The layer the views show is selected in the graph drawn after the run.
    shown = panel.graph.module_node(w.view_state.layer, w.view_state.call)
    assert panel.selected == panel.graph.representative(shown.id, panel.expanded)
    assert panel.items[panel.selected].selected_
    cap = w.session.capture
    name = next(n for n in cap.layers if panel.graph.module_node(n) is not None
                and panel.graph.representative(panel.graph.module_node(n).id, panel.expanded) in panel.items
                and n != w.view_state.layer)
    node_id = panel.graph.module_node(name).id
    if node_id not in panel.items:  # inside a collapsed container: open it first
        container = panel.graph.representative(node_id, panel.expanded)
        with qtbot.waitSignal(panel.layout_done, timeout=TIMEOUT):
            panel.toggle(container)
    with qtbot.waitSignal(panel.layer_selected, timeout=5000):
        _click(qtbot, panel, node_id)
    assert w.view_state.layer == name and w.tree_view.current_name() == name
    # The other way round: the tree picks a layer, the graph follows.
    other = next(n for n in cap.layers if n != name)
    w.tree_view.select_layer(other)
    qtbot.waitUntil(lambda: w.view_state.layer == other, timeout=5000)
    assert panel.selected == panel.graph.representative(panel.graph.module_node(other).id, panel.expanded)
    # Ticks from the graph reach the session, and the graph shows the session's ticks.
    leaf_node = next(n for n in panel.items if panel.graph.nodes[n].kind == "module"
                     and not panel.graph.is_container(n) and panel.graph.nodes[n].name)
    leaf = panel.graph.nodes[leaf_node].name
    panel.layer_check_requested.emit(leaf, False)
    assert leaf not in w.session.selection and not panel.items[leaf_node].checked
    panel.layer_check_requested.emit(leaf, True)
    assert leaf in w.session.selection and panel.items[leaf_node].checked


def test_nested_frames_enclose_each_other_and_their_names_never_overlap(qtbot, panel):
    """layer1 and its block layer1.0 both open: layer1's frame holds layer1.0's, and each
    name sits in a band of its own (they had been drawn over each other)."""
    from gradexplorer_app.views.graph_view import GraphFrameItem

    for container in ("m:layer1:0", "m:layer1.0:0"):
        if container not in panel.expanded:
            with qtbot.waitSignal(panel.layout_done, timeout=TIMEOUT):
                panel.toggle(container)
    frames = {i.node_id: i for i in panel.canvas.scene().items() if isinstance(i, GraphFrameItem)}
    outer, inner = frames["m:layer1:0"], frames["m:layer1.0:0"]
    assert outer.rect().contains(inner.rect())
    label = {k: f.childItems()[0].sceneBoundingRect() for k, f in frames.items()}
    assert not label["m:layer1:0"].intersects(label["m:layer1.0:0"])
    # Every name lies inside its own frame, above the boxes and frames it holds.
    for node_id, frame in frames.items():
        assert frame.rect().contains(label[node_id])
        for other_id, other in frames.items():
            if other_id != node_id and frame.rect().contains(other.rect()):
                assert not label[node_id].intersects(other.rect())
        for item in panel.items.values():
            assert not label[node_id].intersects(item.rect)


def test_the_status_line_says_what_is_shown_and_the_layout_time_is_in_its_tooltip(panel):
    """The status under the graph reads as words for the user ("N of M nodes shown, E
    edges", how to open and close boxes); how long the layout took, and by which engine,
    is for whoever tunes it: in the tooltip, never in the line ("layout igraph 0 ms")."""
    text = panel.status.text()
    assert text.startswith(f"{len(panel.items)} of ") and "nodes shown" in text
    assert "layout" not in text.lower() and " ms" not in text and "igraph" not in text
    tip = panel.status.toolTip()
    assert tip.startswith("laid out by ") and tip.endswith(" ms")


def test_a_graph_of_one_gradient_norm_says_constant(qtbot, tmp_path):
    """Every layer's gradient norm one value up to float rounding (identity layers, target
    sum): one colour for every node, and the bar says "constant 2.0" in the window and in
    the exported SVG (it had read "1.0000001 … 1.0000001")."""
    from gradexplorer.capturing.capture import capture

    layers = [torch.nn.Linear(4, 4) for _ in range(3)]
    with torch.no_grad():
        for i, layer in enumerate(layers):
            layer.weight.copy_(torch.eye(4) * (1 + i * 1e-8))  # 1 up to float32 rounding
            layer.bias.zero_()
    model = torch.nn.Sequential(*layers)
    x = torch.randn(1, 4)
    cap = capture(model, x, target="sum", mode="stats")
    norms = [cap[n].calls[0].stats["grad_output"]["l2"] for n in cap.layer_order]
    assert norms == pytest.approx([2.0] * 3, rel=1e-6)
    cap.graph = extract_graph(model, x).to_dict()
    p = GraphPanel()
    qtbot.addWidget(p)
    with qtbot.waitSignal(p.layout_done, timeout=TIMEOUT):
        p.set_capture(cap)
    assert p.color_bar.tick_labels() == ["constant 2.0"]
    fills = {p.items[n].fill.name() for n in p.items if p.graph.nodes[n].kind == "module"}
    assert len(fills) == 1
    path = p.export(str(tmp_path / "g.svg"))
    assert "constant 2.0" in (tmp_path / "g.svg").read_text() and path
    p.shutdown()
