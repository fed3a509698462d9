"""The compare view and window, headless: what is drawn is what gradexplorer.comparison.compare computed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from gradexplorer.capturing.capture import capture
from gradexplorer.comparison.compare import compare, flow_comparison, heatmap_triple
from gradexplorer.files.capture_file import save_capture
from gradexplorer_app import dialogs
from gradexplorer_app.views.compare_view import CompareView
from gradexplorer_app.views.plot_style import scale_number
from gradexplorer_app.window import compare_window, error_dialog
from gradexplorer_app.window.compare_window import CHOICES, CompareWindow, compare_with


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.ReLU()
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(self.pool(self.conv2(self.act(self.conv1(x)))).flatten(1))


@pytest.fixture
def pair():
    torch.manual_seed(0)
    ma, mb = Net(), Net()
    mb.load_state_dict(ma.state_dict())
    with torch.no_grad():
        mb.conv2.weight.mul_(1.1)
    x = torch.randn(2, 3, 8, 8)
    a, b = capture(ma, x, target="sum"), capture(mb, x, target="sum")
    return a, b, compare(a, b)


def test_table_lists_the_calls_in_model_order_and_draws_the_difference_on_its_own_scale(qtbot, pair):
    """Rows as the model runs them, the first divergent ones marked (largest difference first
    on request); A and B on one symmetric scale, A − B on its own (it had been a flat grey on
    A's scale until "amplify" was ticked)."""
    a, b, result = pair
    view = CompareView()
    qtbot.addWidget(view)
    view.resize(1200, 800)
    view.show()
    view.set_comparison(a, b, result)
    rows = view.row_calls()
    assert [(c.layer, c.call) for c in rows] == [(c.layer, c.call) for c in result.calls]
    assert [c.layer for c in rows] == [n for n in a.layer_order for _ in a[n].calls]  # the model's order
    first = result.first_divergent_activation
    assert first.layer == "conv2"
    row = rows.index(first)
    assert view.table.item(row, 0).text() == "conv2" and "first activation" in view.table.item(row, 6).text()
    assert view.table.rowCount() == len(result.calls)
    assert "first divergent activation: <b>conv2</b>" in view.summary_label.text()
    # largest difference first, on request; the selection stays on its call
    view.select("conv2", 0)
    view.order_combo.setCurrentIndex(view.order_combo.findData("divergence"))
    by = view.row_calls()
    assert by[0] is first and [c.divergence for c in by[2:]] == sorted((c.divergence for c in by[2:]), reverse=True)
    assert view.current() is first and view.table.currentRow() == 0
    view.order_combo.setCurrentIndex(view.order_combo.findData("model"))
    # A | B are core's heatmap triple on their one scale; A − B on its own symmetric scale
    view.display_combo.setCurrentIndex(view.display_combo.findData("channel"))
    view.channel_spin.setValue(2)
    view.sample_spin.setValue(1)
    expected = heatmap_triple(a["conv2"].calls[0].activation[1], b["conv2"].calls[0].activation[1], "channel",
                              channel=2)
    for image, hm in zip(view.images, (expected.a, expected.b, expected.diff)):
        np.testing.assert_array_equal(image.image, hm.array)
    lo, hi = expected.levels
    for image in view.images[:2]:
        assert tuple(image.levels) == expected.levels
    assert lo == -hi and tuple(view.colorbar.levels()) == (lo, hi)
    m = float(np.nanmax(np.abs(expected.diff.array)))
    assert 0 < m < hi  # a difference smaller than A and B: on their scale it is paler
    assert tuple(view.images[2].levels) == (-m, m) and tuple(view.diff_bar.levels()) == (-m, m)
    assert view.diff_bar.tick_labels()[-1] == scale_number(m)
    # on A's scale, when asked
    view.same_scale_check.setChecked(True)
    assert tuple(view.images[2].levels) == expected.levels and tuple(view.diff_bar.levels()) == (lo, hi)
    assert "A's scale" in view.diff_bar.title()


def test_selecting_rows_and_switching_to_gradients(qtbot, pair):
    a, b, result = pair
    view = CompareView()
    qtbot.addWidget(view)
    view.show()
    view.set_comparison(a, b, result)
    assert view.select("fc", 0)
    with qtbot.waitSignal(view.call_selected) as sig:
        assert view.select("conv1", 0)
    assert sig.args == ["conv1", 0]
    # conv1's activation is identical in both: A - B is all zero
    view.display_combo.setCurrentIndex(view.display_combo.findData("channel"))
    assert np.all(view.images[2].image == 0)
    assert view.diff_bar.tick_labels() == ["constant 0"]  # not A's ±max on a flat picture
    lo, hi = view.images[2].levels
    assert lo == -hi < 0  # zero takes the map's middle colour (levels of one value had painted it blue)
    view.tensor_combo.setCurrentIndex(view.tensor_combo.findData("grad_output"))
    # but its gradient differs (conv2's weights scaled)
    assert np.nanmax(np.abs(view.images[2].image)) > 0
    assert "gradient" in view.heat_title.text()
    assert not view.select("nope", 0)


def test_flow_chart_plots_both_series_and_their_ratio(qtbot, pair):
    a, b, result = pair
    view = CompareView()
    qtbot.addWidget(view)
    view.set_comparison(a, b, result)
    fc = flow_comparison(a, b)
    ya, yb, yr = view.flow_data()
    np.testing.assert_allclose(ya, np.log10(fc.a))
    np.testing.assert_allclose(yb, np.log10(fc.b))
    np.testing.assert_allclose(yr, np.log10(fc.ratio) if view.ratio_log else fc.ratio)
    assert view.ratio_log == bool(np.abs(np.log10(fc.ratio)).max() > np.log10(2))


def test_statistics_only_pair_shows_the_table_and_says_why_no_heatmaps(qtbot):
    torch.manual_seed(0)
    ma, mb = Net(), Net()
    x = torch.randn(2, 3, 8, 8)
    a, b = capture(ma, x, mode="stats"), capture(mb, x, mode="stats")
    view = CompareView()
    qtbot.addWidget(view)
    view.set_comparison(a, b, compare(a, b))
    assert view.table.rowCount() == 5
    assert "statistics only" in view.heatmap_message()
    assert "(by statistics)" in view.summary_label.text()
    assert len(view.flow_data()[0]) == 5


def test_window_compares_two_files_in_a_worker_and_exports_csv(qtbot, pair, tmp_path):
    a, b, _ = pair
    save_capture(a, tmp_path / "a.pt")
    save_capture(b, tmp_path / "b.pt")
    win = CompareWindow()
    qtbot.addWidget(win)
    with qtbot.waitSignal(win.runner.finished, timeout=30000):
        win.compare_files(str(tmp_path / "a.pt"), str(tmp_path / "b.pt"))
    assert win.view.result is not None and win.view.row_calls()[0].layer == "conv1"  # model order
    assert win.export_action.isEnabled()
    path = win.export_csv(str(tmp_path / "c.csv"))
    assert path.read_text().startswith("layer,call,type")


def test_window_reports_a_bad_file_without_a_traceback(qtbot, tmp_path, monkeypatch):
    shown = []
    monkeypatch.setattr(error_dialog, "show_error", lambda parent, title, exc: shown.append(exc))
    (tmp_path / "junk.pt").write_bytes(b"junk")
    win = CompareWindow()
    qtbot.addWidget(win)
    with qtbot.waitSignal(win.runner.failed, timeout=30000):
        win.compare_files(str(tmp_path / "junk.pt"), str(tmp_path / "junk.pt"))
    assert shown and "cannot be read" in str(shown[0])


@pytest.mark.slow
def test_compare_with_autocast_from_the_main_window(qtbot, demo, monkeypatch):
    # the demo window after its run: Compare with... -> autocast bf16
    window = demo
    monkeypatch.setattr(dialogs, "ask_item", lambda *a, **k: CHOICES[1])
    shown = []
    monkeypatch.setattr(error_dialog, "show_error", lambda parent, title, exc: shown.append(exc))
    assert window.compare_action.isEnabled()
    win = window.compare_with()
    assert win is not None and window.compare_window is win
    qtbot.addWidget(win)
    with qtbot.waitSignal(win.runner.finished, timeout=60000):
        pass
    assert not shown
    r = win.view.result
    assert r.meta_b["autocast"] == "bf16" and r.input.max_abs == 0.0
    assert (r.label_a, r.label_b) == ("demo:shapes, no autocast", "demo:shapes, autocast bf16")
    assert not r.within and win.view.row_calls()[0] is r.first_divergent_activation
    win.close()


@pytest.mark.slow
def test_compare_with_a_file_names_a_and_b_by_their_sources(qtbot, demo, monkeypatch, tmp_path):
    """A is the window's run (its model and target) or the file the window opened, B the file
    chosen; the header names both (A had been "this run")."""
    window = demo
    path = tmp_path / "other.pt"
    save_capture(window.session.capture, path)
    monkeypatch.setattr(compare_window, "ask_source", lambda parent, devices=None: str(path))
    win = window.compare_with()
    qtbot.addWidget(win)
    qtbot.waitUntil(lambda: win.view.result is not None, timeout=60000)
    r = win.view.result
    assert r.label_a.startswith("demo:shapes, the window's run, target top1") and r.label_b == "other.pt"
    assert "demo:shapes, the window's run" in win.view.summary_label.text() and "other.pt" in \
        win.view.summary_label.text()
    win.close()
    with qtbot.waitSignal(window.file_done, timeout=60000):
        window.open_capture(str(path))
    win = window.compare_with()
    qtbot.addWidget(win)
    qtbot.waitUntil(lambda: win.view.result is not None, timeout=60000)
    assert (win.view.result.label_a, win.view.result.label_b) == ("other.pt", "other.pt")
    win.close()


def test_compare_with_cancelled_or_without_capture(qtbot, window, monkeypatch):
    shown = []
    monkeypatch.setattr(error_dialog, "show_error", lambda parent, title, exc: shown.append(exc))
    window.session.capture = None
    assert compare_with(window, window.session) is None
    assert "no capture" in str(shown[0])
    window.session.capture = object()
    monkeypatch.setattr(dialogs, "ask_item", lambda *a, **k: None)
    assert compare_with(window, window.session) is None
    assert compare_window.ask_source(window) is None


def test_sequence_and_dict_output_models_draw(qtbot):
    from tests.core.test_compare import DictOut, TinySeq

    view = CompareView()
    qtbot.addWidget(view)
    view.show()
    for make, x, target, layer in ((TinySeq, torch.randint(0, 11, (3, 7)), "sum", "rnn"),
                                   (DictOut, torch.randn(4, 5), "top1@out", "body")):
        torch.manual_seed(0)
        ma, mb = make(), make()
        a, b = capture(ma, x, target=target), capture(mb, x, target=target)
        view.set_comparison(a, b, compare(a, b))
        assert view.select(layer, 0)
        for kind in ("activation", "grad_output"):
            view.tensor_combo.setCurrentIndex(view.tensor_combo.findData(kind))
            assert view.heatmap_message() == "", view.heatmap_message()
            sa = a[layer].calls[0].tensor(kind)[0]
            sb = b[layer].calls[0].tensor(kind)[0]
            expected = heatmap_triple(sa, sb, view.display_combo.currentData(), k=view.k_spin.value(),
                                      channel=view.channel_spin.value())
            np.testing.assert_array_equal(view.images[2].image, expected.diff.array)


def test_window_graph_tab_colours_nodes_by_divergence_and_follows_the_table(qtbot, pair):
    from gradexplorer.model_graph.compare import divergence_values
    from gradexplorer.model_graph.graph import graph_for_capture
    from gradexplorer.model_graph.render import color_scale
    from gradexplorer.model_graph.statistics import DIVERGENCE_BY

    a, b, result = pair
    torch.manual_seed(0)
    a.graph = graph_for_capture(Net(), torch.randn(2, 3, 8, 8), a).to_dict()  # Net() has A's weights (seed 0)
    win = CompareWindow()
    qtbot.addWidget(win)
    panel = win.graph_panel
    with qtbot.waitSignal(panel.layout_done, timeout=30000):
        win.compare_captures(a, b)
    assert [panel.color_by.itemData(i) for i in range(panel.color_by.count())] == list(DIVERGENCE_BY)
    for stat in DIVERGENCE_BY:
        panel.color_by.setCurrentIndex(panel.color_by.findData(stat))
        scale = color_scale(panel.graph, panel.items, stat)
        for c in result.calls:  # each node's colour is gradexplorer.comparison.compare's figure for that call
            nid = panel.graph.module_node(c.layer, c.call).id
            assert panel.items[nid].fill.name() == scale.color(divergence_values(c)[stat])
    # The ratio: a diverging bar symmetric around 1.
    panel.color_by.setCurrentIndex(panel.color_by.findData("grad_ratio"))
    bar = panel.color_bar.scale
    assert bar.diverging and bar.lo * bar.hi == pytest.approx(1.0)
    ratios = [divergence_values(c)["grad_ratio"] for c in result.calls]
    assert bar.hi == pytest.approx(max(max(ratios), 1 / min(ratios)))
    # A node click selects the table's row; a row selects the node.
    panel.on_node_clicked("m:conv1:0")
    assert win.view.current().layer == "conv1"
    win.view.select("fc", 0)
    assert panel.selected == "m:fc:0"


def test_window_graph_tab_says_why_when_no_capture_carries_a_graph(qtbot, pair):
    a, b, result = pair
    win = CompareWindow()
    qtbot.addWidget(win)
    assert not win.show_graph(a, b, result)
    assert "graph" in win.graph_panel.status.text()


def _luminance(colour) -> float:
    def channel(v: float) -> float:
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(colour.redF()) + 0.7152 * channel(colour.greenF()) + 0.0722 * channel(colour.blueF())


def _contrast(fg, bg) -> float:
    hi, lo = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_the_first_view_frames_a_b_and_a_minus_b_and_marks_rows_legibly(qtbot, pair, app_look):
    """The compare window as it first opens (no row clicked): A, B and A − B each fill
    their plot (they had been drawn small inside axes from -300 to 500 until another row
    was clicked), also after the window changes size; the first divergent rows are marked
    in a colour their text reads on (it had been dark on dark red), also when selected."""
    from PySide6.QtWidgets import QApplication

    from gradexplorer_app.window.application import setup_application

    setup_application()  # the window's own palette: the row and selection colours are its
    a, b, _ = pair
    w = CompareWindow()
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.runner.finished, timeout=60_000):
        w.compare_captures(a, b)
    QApplication.processEvents()
    view = w.view
    for size in (None, (1280, 800), (900, 650)):
        if size is not None:
            w.resize(*size)
            qtbot.wait(50)
        rows, cols = view.images[0].image.shape[:2]
        for plot in view.plots:
            (x0, x1), (y0, y1) = plot.vb.viewRange()
            assert x0 <= 0 and x1 >= cols and y0 <= 0 and y1 >= rows, (size, plot.vb.viewRange())
            # One side fits the picture (the other may be longer: square pixels in a plot
            # that is not of the picture's shape).
            assert min((x1 - x0) / cols, (y1 - y0) / rows) < 1.1, (size, plot.vb.viewRange())
    table = view.table
    text = table.palette().text().color()
    marked = [r for r in range(table.rowCount()) if "first" in table.item(r, 6).text()]
    assert marked
    for r in marked:
        item = table.item(r, 0)
        fg = item.foreground().color() if item.foreground().style() else text
        assert _contrast(fg, item.background().color()) >= 4.5
    selected = table.palette().highlight().color(), table.palette().highlightedText().color()
    assert _contrast(selected[1], selected[0]) >= 4.5


def test_the_comparison_opens_on_the_first_place_they_differ(qtbot, pair):
    """The rows in model order begin with identical layers (conv1, act): the view opens on the
    first divergent call, its A − B drawn on its own scale (not a flat first row)."""
    a, b, result = pair
    view = CompareView()
    qtbot.addWidget(view)
    view.show()
    view.set_comparison(a, b, result)
    first = result.first_divergent_activation
    assert view.row_calls()[0].layer == "conv1" and view.current() is first
    assert view.diff_bar.tick_labels() != ["constant 0"]
