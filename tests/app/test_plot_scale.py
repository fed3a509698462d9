"""Every plot states its scale: colour bars with min, max and zero labelled and a title
saying what the colours measure; the flow chart's names at every zoom; the graph readable
at fit; one light theme."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from PySide6.QtGui import QFontMetrics, QImage, QPainter
from PySide6.QtWidgets import QApplication

from gradexplorer.capturing.capture import capture
from gradexplorer_app.views.capture_views import CaptureViews
from gradexplorer_app.views.flow_view import FLAG_RULE_SHORT, GradientFlowView
from gradexplorer_app.views.plot_style import BACKGROUND, FOREGROUND, ScaleBar, scale_number
from tests.app.test_views import TinyCNN, cnn  # noqa: F401 - the fixture


@pytest.fixture()
def views(qtbot, cnn):  # noqa: F811 - the fixture above
    w = CaptureViews()
    qtbot.addWidget(w)
    w.resize(1100, 800)
    full, _, batch = cnn
    w.set_capture(full, batch)
    return w


def test_signed_bar_labels_min_zero_and_max(qtbot):
    bar = ScaleBar("gradient ∂L/∂y (loss per unit of y)")
    bar.set_range(-2.5e-6, 2.5e-6)
    assert bar.tick_labels() == ["-2.50e-6", "0", "2.50e-6"]
    assert bar.levels() == (-2.5e-6, 2.5e-6)
    bar.set_range(0.2, 3.0, signed=False)  # the labels follow a new range, and zero leaves
    assert bar.tick_labels() == ["0.2", "3"]
    assert "∂L/∂y" in bar.axis.labelText


def test_log_bar_reads_as_the_quantity(qtbot):
    bar = ScaleBar("L2 norm (log scale)", signed=False, log10=True)
    bar.set_range(-6.0, 2.0)
    assert bar.tick_labels() == ["1.00e-6", "100"]


def test_heatmap_bar_states_the_range_of_the_picture(views, cnn):  # noqa: F811
    hv = views.heatmap_view
    views.set_layer("conv2")
    hv.set_display("channel", channel=3)
    arr = views.current_image_array()
    hi = float(np.nanmax(np.abs(arr)))
    labels = hv.colorbar.tick_labels()
    assert labels == [scale_number(-hi), "0", scale_number(hi)]
    assert "gradient" in hv.colorbar.title()
    hv.set_tensor("activation")
    views.set_layer("relu")
    arr = views.current_image_array()
    lo, hi = hv.current_levels()
    assert hv.colorbar.tick_labels()[0] == scale_number(lo) and hv.colorbar.tick_labels()[-1] == scale_number(hi)
    assert hv.colorbar.title().startswith("activation")


def test_gradcam_and_saliency_have_labelled_bars(views):
    views.set_layer("conv2")
    views.tabs.setCurrentWidget(views.gradcam_view)
    assert views.gradcam_view.current_cam() is not None
    assert views.gradcam_view.colorbar.tick_labels() == ["0", "1"]
    assert "Grad-CAM" in views.gradcam_view.colorbar.title()
    views.tabs.setCurrentWidget(views.saliency_view)
    sal = views.saliency_view.current_map()
    labels = views.saliency_view.colorbar.tick_labels()
    assert labels[-1] == scale_number(float(sal.max()))
    assert "∂L/∂x" in views.saliency_view.colorbar.title()


def test_axis_titles_use_the_theme_colour(views):
    views.tabs.setCurrentWidget(views.histogram_view)
    views.histogram_view.ensure_drawn()
    for name in ("left", "bottom"):
        axis = views.histogram_view.plot.getAxis(name)
        assert axis.labelStyle.get("color") == FOREGROUND, name
    assert BACKGROUND == "#ffffff"  # light plots on the light window


def _long_names_capture():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 4) for _ in range(60)]
    model = torch.nn.Sequential(torch.nn.Sequential(*layers))
    return capture(model, torch.randn(2, 4), target="sum")


@pytest.fixture(scope="module")
def deep_captures():
    """resnet18 (52 layers) and efficientnet_v2_l (963), random weights, one small picture."""
    import torchvision

    out = {}
    for name in ("resnet18", "efficientnet_v2_l"):
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(weights=None).eval()
        out[name] = capture(model, torch.randn(1, 3, 32, 32), mode="stats")
    return out


def _drawn_labels(view):
    """The flow chart's layer labels as pyqtgraph lays them out to draw them: (rectangle in
    the axis's coordinates, text)."""
    image = QImage(8, 8, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    try:
        specs = view.layer_axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return [(rect, text) for rect, _flags, text in (specs[2] if specs else []) if text]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "floor", "close"), [("resnet18", 20, 5), ("efficientnet_v2_l", 16, 2)])
def test_flow_names_are_whole_and_fit_at_every_zoom(qtbot, window, deep_captures, model, floor, close):
    """The flow chart in the main window at 1280×800: on a deep model it names at least
    ``floor`` bars at first sight (it had named 2 of resnet18's 52, 1 or 2 of
    efficientnet_v2_l's 963), names that never overlap, whole or (upright, longer than the
    band under the chart, which takes at most 40% of its height) cut in the middle keeping
    their distinguishing tail, at every zoom about as many as the axis has room for; zoomed
    to ``close`` bars (efficientnet's names are up to "features.5.10.block.2.scale_activation"
    long), every one is named."""
    from tests.app.test_window_fit import SCREEN

    window.show()
    window.resize(*SCREEN)
    with qtbot.waitSignal(window.file_done, timeout=60_000):
        window.controller.show_capture(deep_captures[model])
    view = window.views.flow_view
    qtbot.wait(50)
    names, _ = view.series()
    axis = view.layer_axis
    # The names take at most 40% of the chart: the bars keep the rest (~130 px of names had
    # stood over ~80 px of bars).
    assert axis.band() <= 0.4 * view.plot_widget.height()
    line = QFontMetrics(axis.style["tickFont"] or view.plot_widget.font()).height()
    n = len(names)
    zooms = ((-0.6, n - 0.4), (n / 4, 3 * n / 4), (n / 2, n / 2 + n / 8), (10 - 0.4, 14 + 0.4),
             (10 - 0.4, 10 + close - 0.6))
    for lo, hi in zooms:
        view.plot.setXRange(lo, hi, padding=0)
        QApplication.processEvents()
        drawn = _drawn_labels(view)
        texts = [t for _r, t in drawn]
        if (lo, hi) == (-0.6, n - 0.4):
            assert len(texts) >= floor, texts
        labelled = view.tick_names()
        assert len(labelled) == len(texts)  # what is drawn is what the axis chose
        for text, name in zip(texts, labelled):  # whole, or its head and tail around "…"
            head, cut, tail = text.partition("…")
            assert text == name or (cut and name.startswith(head) and name.endswith(tail) and len(tail) >= 4)
        rects = sorted((r for r, _t in drawn), key=lambda r: r.left())
        bounds = axis.boundingRect()
        assert all(bounds.contains(r) for r in rects)
        assert not any(a.intersects(b) for a, b in itertools.pairwise(rects))  # no two overlap
        shown = hi - lo
        room = min(shown, axis.width() / (line + 3))  # bars, and the text lines side by side
        assert len(texts) >= 0.5 * room, (lo, hi, len(texts), room)
    assert view.tick_names() == names[10:10 + close]  # zoomed in: every bar named
    assert "neighbouring layers" in FLAG_RULE_SHORT and FLAG_RULE_SHORT in view.hover_label.full_text()
    assert FLAG_RULE_SHORT in view.legend_label.toolTip()


def test_flow_names_of_a_chain_of_sixty(qtbot):
    """A small chart on its own: names whole, some but not all at first, all when zoomed in."""
    view = GradientFlowView()
    qtbot.addWidget(view)
    view.resize(900, 300)
    view.show()
    qtbot.waitExposed(view)
    cap = _long_names_capture()
    view.set_capture(cap)
    QApplication.processEvents()
    names, _ = view.series()
    shown = view.tick_names()
    assert 1 < len(shown) < len(names)  # not one or two of 60, and not all crammed
    assert all(n in names for n in shown)  # whole names ("0.12"), never cut
    view.plot.setXRange(10 - 0.4, 14 + 0.4, padding=0)
    QApplication.processEvents()
    assert view.tick_names() == names[10:15]  # zoomed in: every bar named


def test_graph_fit_keeps_names_readable(qtbot):
    from PySide6.QtWidgets import QGraphicsRectItem

    from gradexplorer_app.views.graph_view import GraphCanvas

    canvas = GraphCanvas()
    qtbot.addWidget(canvas)
    canvas.resize(500, 700)
    canvas.show()
    qtbot.waitExposed(canvas)
    # A tall, narrow graph (a deep chain): fitted whole it would be a thin column.
    for i in range(80):
        canvas.scene().addItem(QGraphicsRectItem(0, i * 60, 160, 40))
    canvas.fit()
    assert canvas.READABLE_SCALE <= canvas.transform().m11() <= canvas.TALL_FIT_SCALE == 1.0
    # A small graph is shown whole.
    canvas.scene().clear()
    canvas.scene().addItem(QGraphicsRectItem(0, 0, 200, 200))
    canvas.fit()
    rect = canvas.mapFromScene(canvas.scene().itemsBoundingRect()).boundingRect()
    assert canvas.viewport().rect().contains(rect)


def test_topk_tiles_are_labelled_with_their_channels(views):
    hv = views.heatmap_view
    views.set_layer("conv2")
    hv.set_display("topk", k=4)
    hm = hv.current_heatmap()
    assert hv.tile_label_texts() == [f"ch {c}" for c in hm.channels] and len(hm.channels) == 4
    hv.set_display("channel", channel=2)
    assert hv.tile_label_texts() == []


def test_topk_tile_labels_leave_small_tiles_in_sight(qtbot, views):
    """Sixteen tiles in a small plot: a "ch N" label is drawn small, and only on a tile
    that it covers at most a sixth of (it had covered about a third of each); in a large
    plot, four tiles are each labelled."""
    hv = views.heatmap_view
    views.show()
    views.tabs.setCurrentWidget(hv)
    views.set_layer("conv2")

    def covered() -> list[float]:
        QApplication.processEvents()
        hv.ensure_drawn()
        hm = hv.current_heatmap()
        sx, sy = hv.plot.vb.viewPixelSize()  # plot units per screen pixel
        tile = (hm.tile_width / sx, hm.tile_height / sy)
        out = []
        for item in hv.tile_labels:
            if item.isVisible():
                r = item.textItem.boundingRect()
                out.append(r.width() * r.height() / (tile[0] * tile[1]))
        return out

    views.resize(520, 420)
    hv.set_display("topk", k=16)
    assert all(share <= 1 / 6 for share in covered()), covered()
    views.resize(1200, 900)
    hv.set_display("topk", k=4)
    shares = covered()
    assert len(shares) == 4 and all(share <= 1 / 6 for share in shares)
    assert hv.tile_label_texts() == [f"ch {c}" for c in hv.current_heatmap().channels]


def test_timeline_histograms_have_a_bar_in_counts_and_bin_names_that_fit(qtbot, tmp_path):
    """The timeline's histograms over steps (colour = log10(1 + count)): a bar labelled
    with the counts themselves, from the emptiest to the fullest bin; the bins' names on
    the axis spaced by the plot's height, never overlapping."""
    from gradexplorer.stats.merge import MergeStats
    from gradexplorer_app.views.timeline_view import TimelineView, bin_label
    from tests.core.test_timeline import grad_of, write_log

    view = TimelineView(poll_ms=100)
    qtbot.addWidget(view)
    view.resize(1200, 800)
    view.show()
    path = tmp_path / "t.gxw"
    write_log(path)
    with qtbot.waitSignal(view.updated, timeout=60_000):
        view.open_log(str(path))
    view.select_layer("b")
    qtbot.waitUntil(lambda: view.hist_image.image is not None, timeout=60_000)
    counts = np.array([MergeStats.of_tensor(grad_of("b", s)).hist for s in range(10)])
    used = np.flatnonzero(counts.sum(axis=0))
    shown = counts[:, used[0]:used[-1] + 1]
    assert view.hist_bar.isVisible()
    assert view.hist_bar.tick_labels() == [scale_number(int(shown.min())), scale_number(int(shown.max()))]
    assert "count per bin" in view.hist_bar.title()
    assert view.hist_bar.levels() == pytest.approx((np.log10(1 + shown.min()), np.log10(1 + shown.max())))
    # The bin axis: labels one text line apart at least, each a bin's own name, in order of
    # value from the bottom up (it had read "2^-41, -2^-60, -2^-29" top to bottom).
    from gradexplorer.recording.timeline import histogram_rows
    from gradexplorer.stats.merge import hist_bin_centers

    rows = histogram_rows(counts)
    axis = view.hist_plot.getAxis("left")
    height = axis.geometry().height()
    assert height >= 120  # tall enough to read
    levels = axis.tickValues(0, len(rows), height)
    labelled = levels[0][1]
    px_per_row = height / len(rows)
    line = QFontMetrics(view.hist_widget.font()).height()
    assert len(labelled) >= 3
    assert all((b - a) * px_per_row >= line for a, b in itertools.pairwise(labelled))
    strings = axis.tickStrings(labelled, 1.0, levels[0][0])
    assert strings == [bin_label(rows[int(v - 0.5)]) for v in labelled]
    centers = hist_bin_centers()
    values = [centers[rows[int(v - 0.5)]] for v in labelled]
    assert values == sorted(values)
    view.shutdown()


def test_an_empty_flow_chart_shows_no_scale(qtbot, cnn):  # noqa: F811
    """Before a capture the flow chart has no values: its axis states none (it had read
    1e0 to 6e0 of nothing); with a capture the axis is labelled again."""
    view = GradientFlowView()
    qtbot.addWidget(view)
    view.set_capture(None)
    axis = view.plot.getAxis("left")
    assert axis.style["showValues"] is False
    view.set_capture(cnn[0])
    assert axis.style["showValues"] is True
    view.set_capture(None)
    assert axis.style["showValues"] is False


def test_scale_numbers_read_plainly():
    """End labels: written out from 0.001 to 9999 (a count of 1650 had read "1.65e+03",
    another notation than the bar's "2.67e+6" beside it), with an exponent beyond."""
    assert [scale_number(v) for v in (1650, 9090.0, 17.6, 0.03931, -0.0049, 1, 0.2)] == \
        ["1650", "9090", "17.6", "0.03931", "-0.0049", "1", "0.2"]
    assert [scale_number(v) for v in (2.67e6, -2.5e-6, 22800, 9999.7, 0.0009)] == \
        ["2.67e+6", "-2.50e-6", "2.28e+4", "1.00e+4", "9.00e-4"]
    assert scale_number(float("inf")) == "inf" and scale_number(0.0) == "0"


def test_a_colour_bar_title_longer_than_the_bar_wraps(qtbot):
    """A colour bar in a short plot (Grad-CAM's, under a taller flow chart): its title
    wraps onto a second line rather than being cut at the bar's ends."""
    import pyqtgraph as pg

    from gradexplorer_app.views.gradcam_view import CAM_TITLE

    widget = pg.GraphicsLayoutWidget()
    qtbot.addWidget(widget)
    bar = ScaleBar(CAM_TITLE, signed=False)
    widget.ci.addItem(bar)
    widget.resize(200, 240)
    widget.show()
    qtbot.waitExposed(widget)
    QApplication.processEvents()
    axis = bar.axis
    assert QFontMetrics(axis.label.font()).horizontalAdvance(CAM_TITLE) > axis.height()  # the case

    def shown():
        """The title's rectangle (upright) in the axis's coordinates; whether the widget shows it."""
        rect = axis.label.mapRectToParent(axis.label.boundingRect())
        on_screen = widget.mapFromScene(axis.label.sceneBoundingRect()).boundingRect()
        return rect, widget.viewport().rect().contains(on_screen)

    rect, held = shown()
    assert rect.top() >= 0 and rect.bottom() <= axis.height() and held, (rect, axis.height())
    widget.resize(200, 700)  # tall enough: one line again
    QApplication.processEvents()
    rect, held = shown()
    assert rect.top() >= 0 and rect.bottom() <= axis.height() and held
    assert rect.width() < 2 * QFontMetrics(axis.label.font()).height()


def test_a_constant_colour_bar_says_constant(qtbot):
    """A heatmap of one value (an all-zero gradient; a map of ones): the bar says "constant
    0" or "constant 1.0" once, not two equal ends."""
    from gradexplorer_app.views.plot_style import ScaleBar

    bar = ScaleBar("gradient")
    bar.set_range(0.0, 0.0)
    assert bar.tick_labels() == ["constant 0"]
    bar.set_range(1.0, 1.0 + 1e-9)
    assert bar.tick_labels() == ["constant 1.0"]
    bar.set_range(-1.0, 1.0)
    assert bar.tick_labels() == ["-1", "0", "1"]
