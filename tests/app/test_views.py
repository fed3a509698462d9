"""The views of a capture (app/gradexplorer_app/views), headless, on real captures of tiny models."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from PIL import Image
from PySide6.QtCore import QPoint, QPointF, Qt
from torch import nn

from gradexplorer.analysis.capture_summary import default_layer
from gradexplorer.analysis.gradcam import grad_cam
from gradexplorer.analysis.gradient_flow import flow_series
from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.inputs import Batch
from gradexplorer_app.views.capture_views import CaptureViews
from gradexplorer_app.views.flow_view import GradientFlowView


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))  # relu called twice
        return self.fc(self.pool(x).flatten(1))


class TinyViT(nn.Module):
    """Patch embedding to 14x14 tokens plus a class token: (B, 1+196, C) blocks."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, c, 4, stride=4)
        self.cls = nn.Parameter(torch.randn(1, 1, c))
        self.block = nn.Linear(c, c)
        self.act = nn.GELU()
        self.head = nn.Linear(c, 3)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(len(t), -1, -1), t], dim=1)
        t = self.act(self.block(t))
        return self.head(t[:, 0] + t[:, 1:].mean(1))


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    model = TinyCNN().eval()
    x = torch.randn(3, 3, 24, 20)
    full = capture(model, x, input_grad=True, meta={"categories": ["a", "b", "c", "d"]})
    stats = capture(model, x, mode="stats")
    images = [Image.fromarray((np.random.default_rng(i).random((24, 20, 3)) * 255).astype(np.uint8))
              for i in range(3)]
    batch = Batch(x, None, [f"img{i}.png" for i in range(3)], "3 test pictures", images=images)
    return full, stats, batch


@pytest.fixture()
def views(qtbot, cnn):
    w = CaptureViews()
    qtbot.addWidget(w)
    w.resize(1100, 800)
    full, _, batch = cnn
    w.set_capture(full, batch)
    # The single-channel view compares one-to-one with a tensor slice (default is top-k).
    w.heatmap_view.set_display("channel", channel=0)
    return w


def _wait_drawn(qtbot, w):
    w.show()
    qtbot.waitExposed(w)


# -- heatmap ------------------------------------------------------------------------------

def test_heatmap_single_channel_has_the_tensor_shape(views, cnn):
    full = cnn[0]
    views.set_layer("conv2")
    views.set_sample(2)
    views.heatmap_view.set_display("channel", channel=7)
    arr = views.current_image_array()
    g = full["conv2"].calls[0].grad_output
    assert arr.shape == tuple(g.shape[2:])
    np.testing.assert_array_equal(arr, g[2, 7].numpy())
    lo, hi = views.heatmap_view.current_levels()
    assert lo == pytest.approx(-hi) and hi == pytest.approx(float(g[2, 7].abs().max()))


def test_heatmap_activation_and_product(views, cnn):
    full = cnn[0]
    views.set_layer("conv1")
    hv = views.heatmap_view
    hv.set_tensor("activation")
    hv.set_display("channel", channel=3)
    call = full["conv1"].calls[0]
    np.testing.assert_array_equal(views.current_image_array(), call.activation[0, 3].numpy())
    hv.set_tensor("grad_x_activation")
    np.testing.assert_allclose(views.current_image_array(),
                               (call.activation[0, 3] * call.grad_output[0, 3]).numpy(), rtol=1e-6)
    lo, hi = hv.current_levels()
    assert lo == -hi


def test_topk_grid_picks_largest_gradient_norms(views, cnn):
    full = cnn[0]
    views.set_layer("conv2")
    views.set_sample(1)
    hv = views.heatmap_view
    hv.set_tensor("activation")
    hv.set_display("topk", k=6)
    g = full["conv2"].calls[0].grad_output[1]
    expected = torch.topk(g.flatten(1).norm(dim=1), 6).indices.tolist()
    assert hv.current_heatmap().channels == expected
    h, w = g.shape[1:]
    arr = views.current_image_array()
    assert arr.shape == (2 * h + 1, 3 * w + 2)
    a = full["conv2"].calls[0].activation[1]
    np.testing.assert_array_equal(arr[:h, :w], a[expected[0]].numpy())


def test_reduce_and_hover_text(views, cnn):
    full = cnn[0]
    views.set_layer("conv2")
    hv = views.heatmap_view
    hv.set_display("reduce", reduce="l2")
    g = full["conv2"].calls[0].grad_output[0]
    np.testing.assert_allclose(views.current_image_array(), g.norm(dim=0).numpy(), rtol=1e-5)
    lo, _ = hv.current_levels()
    assert lo == 0.0  # a magnitude: sequential colours from zero
    hv.set_display("channel", channel=2)
    text = hv.hover_text(1, 3)
    assert text.startswith("(1, 3) channel 2: ")
    assert float(text.split(": ")[1]) == pytest.approx(float(g[2, 1, 3]), rel=1e-3)


def test_hover_over_the_image_updates_the_label(qtbot, views):
    views.set_layer("conv2")
    _wait_drawn(qtbot, views)
    hv = views.heatmap_view
    hv.set_display("channel", channel=1)
    qtbot.wait(50)  # let the plot lay itself out
    scene_pos = hv.image.mapToScene(QPointF(1.5, 2.5))  # x = column, y = row
    hv._on_mouse_moved(scene_pos)
    assert hv.hover_label.text().startswith("(2, 1) channel 1: ")


def test_vit_tokens_show_a_14x14_grid(qtbot):
    torch.manual_seed(0)
    model = TinyViT().eval()
    cap = capture(model, torch.randn(2, 3, 56, 56))
    assert cap["block"].calls[0].shape == (2, 197, 8)
    w = CaptureViews()
    qtbot.addWidget(w)
    w.set_capture(cap, None)
    w.set_layer("block")
    w.heatmap_view.set_display("channel", channel=5)
    arr = w.current_image_array()
    g = cap["block"].calls[0].grad_output[0]
    assert arr.shape == (14, 14)
    np.testing.assert_array_equal(arr, g[1:, 5].reshape(14, 14).numpy())
    # Grad-CAM works on tokens too, over the input tensor when there are no pictures.
    cam = w.gradcam_view.current_cam()
    assert cam.shape == (56, 56)
    assert w.gradcam_view.message() == ""
    # The head's output is a vector: shown wrapped, no channel controls.
    w.set_layer("head")
    assert w.current_image_array().shape == (2, 2)
    assert not w.heatmap_view.display_combo.isEnabled()


def test_redraw_of_a_512x28x28_map_follows_display_and_sample(qtbot):
    act = torch.randn(2, 512, 28, 28)
    from gradexplorer.capturing.data import CallRecord, Capture, LayerRecord
    from gradexplorer.stats.tensor_stats import tensor_stats
    call = CallRecord(act, act.clone(), None,
                      {"activation": tensor_stats(act), "grad_output": tensor_stats(act), "grad_input": None},
                      "", tuple(act.shape), "float32")
    cap = Capture({"mode": "full", "device": "cpu"}, None, None, None, {"big": LayerRecord("Conv2d", [call])})
    w = CaptureViews()
    qtbot.addWidget(w)
    w.resize(1000, 700)
    w.set_capture(cap, None)
    _wait_drawn(qtbot, w)
    hv = w.heatmap_view
    # Redraw speed is a benchmark figure (benchmarks/ui_stall.py), not a test assertion.
    for display, kw in [("channel", {"channel": 300}), ("topk", {"k": 16}), ("reduce", {"reduce": "l2"}),
                        ("channel", {"channel": 5})]:
        hv.set_display(display, **kw)
        assert w.current_image_array() is not None
    w.set_sample(1)
    np.testing.assert_array_equal(w.current_image_array(), act[1, 5].numpy())


# -- histogram ------------------------------------------------------------------------------

def test_histogram_counts_equal_the_stats(views, cnn):
    full = cnn[0]
    views.set_layer("conv1")
    hv = views.histogram_view
    hv.set_tensor("grad_output")
    edges, counts = hv.current_counts()
    s = full["conv1"].calls[0].stats["grad_output"]
    np.testing.assert_array_equal(counts, s["hist"].numpy())
    assert edges[0] == s["hist_range"][0] and edges[-1] == pytest.approx(s["hist_range"][1])
    x, y = hv.curve.getData()
    np.testing.assert_array_equal(y, s["hist"].numpy())
    assert len(x) == len(y) + 1
    hv.log_check.setChecked(True)
    _, y = hv.curve.getData()
    np.testing.assert_allclose(y, np.log10(s["hist"].numpy() + 1.0), rtol=1e-6)
    assert "NaN 0 · Inf 0" in hv.info_label.text()
    assert f"[{s['min']:.4g}, {s['max']:.4g}]" in hv.info_label.text()


def test_histogram_of_one_sample_and_of_parameters(views, cnn):
    full = cnn[0]
    views.set_layer("conv2")
    views.set_sample(1)
    hv = views.histogram_view
    hv.set_tensor("activation")
    hv.set_scope("sample")
    a = full["conv2"].calls[0].activation[1]
    assert hv.current_stats()["numel"] == a.numel()
    assert hv.current_counts()[1].sum() == pytest.approx(a.numel())
    hv.set_tensor("param:weight")
    assert hv.current_stats() is full["conv2"].param_stats["weight"]


def test_histogram_annotates_nonfinite_and_subsampling(qtbot):
    from gradexplorer.capturing.data import CallRecord, Capture, LayerRecord
    from gradexplorer.stats.tensor_stats import tensor_stats
    g = torch.randn(1, 600_000)
    g[0, :5] = float("nan")
    g[0, 5] = float("inf")
    call = CallRecord(None, None, None, {"activation": tensor_stats(g), "grad_output": tensor_stats(g),
                                         "grad_input": None}, "", tuple(g.shape), "float32")
    cap = Capture({"mode": "stats"}, None, None, None, {"x": LayerRecord("Linear", [call])})
    w = CaptureViews()
    qtbot.addWidget(w)
    w.set_capture(cap, None)
    hv = w.histogram_view
    hv.ensure_drawn()
    text = hv.info_label.text()
    assert "NaN 5" in text and "Inf 1" in text and "approximate (subsampled)" in text
    assert "NaN: 5" in hv.note.textItem.toPlainText()


# -- gradient flow ------------------------------------------------------------------------------

def test_flow_series_matches_core(views, cnn):
    names, values = views.flow_view.series()
    exp_names, exp_values = flow_series(cnn[0], "l2")
    assert names == exp_names
    np.testing.assert_allclose(values, exp_values)
    views.flow_view.set_metric("max_abs", "param")
    names, values = views.flow_view.series()
    np.testing.assert_allclose(values, flow_series(cnn[0], "max_abs", "param")[1])


def test_clicking_a_flow_bar_selects_its_layer(qtbot, views, cnn):
    _wait_drawn(qtbot, views)
    flow = views.flow_view
    names, _ = flow.series()
    target = names.index("conv2")
    scene = flow.bar_scene_pos(target)
    assert flow.index_at_scene_pos(scene) == target
    viewport_pos = flow.plot_widget.mapFromScene(scene)
    with qtbot.waitSignal(views.layer_clicked, timeout=2000) as blocker:
        qtbot.mouseClick(flow.plot_widget.viewport(), Qt.MouseButton.LeftButton, pos=viewport_pos)
    assert blocker.args == ["conv2"]
    assert views.selection()[0] == "conv2"
    assert flow._selected == "conv2"


def test_flow_scene_click_handler(qtbot):
    """The handler itself, fed a synthesized event: nearest bar along x, nothing outside."""
    full = capture(TinyCNN().eval(), torch.randn(1, 3, 8, 8))
    flow = GradientFlowView()
    qtbot.addWidget(flow)
    flow.resize(800, 300)
    flow.show()
    qtbot.waitExposed(flow)
    flow.set_capture(full)

    class Event:
        def __init__(self, pos):
            self._pos = pos
            self.accepted = False

        def button(self):
            return Qt.MouseButton.LeftButton

        def scenePos(self):
            return self._pos

        def accept(self):
            self.accepted = True

    got = []
    flow.layer_clicked.connect(got.append)
    pos = flow.bar_scene_pos(3)
    # A little off the bar's centre still maps to it.
    pos.setX(pos.x() + 0.3 * (flow.bar_scene_pos(4).x() - pos.x()))
    flow._on_scene_clicked(Event(pos))
    assert got == [full.layer_order[3]]
    flow._on_scene_clicked(Event(flow.plot.vb.sceneBoundingRect().topLeft() - QPoint(5, 5)))
    assert got == [full.layer_order[3]]


def test_flow_flags_are_coloured():
    from gradexplorer.capturing.data import CallRecord, Capture, LayerRecord
    from gradexplorer.stats.tensor_stats import tensor_stats

    def rec(g):
        return LayerRecord("Linear", [CallRecord(None, None, None, {
            "activation": tensor_stats(torch.ones(3)),
            "grad_output": None if g is None else tensor_stats(g), "grad_input": None}, "", (1, 3), "float32")])

    cap = Capture({"mode": "stats"}, None, None, None,
                  {"a": rec(torch.ones(3)), "b": rec(torch.zeros(3)), "c": rec(None), "d": rec(torch.ones(3))})
    flow = GradientFlowView()
    flow.set_capture(cap)
    assert flow.flags()["b"] == ["zero"] and flow.flags()["c"] == ["no gradient"]
    assert flow._colour(0) != flow._colour(1) != flow._colour(2)
    flow.deleteLater()


# -- statistics table and CSV --------------------------------------------------------------------

def test_stats_table_and_csv_export(views, cnn, tmp_path):
    full = cnn[0]
    views.set_layer("conv2")
    rows = views.stats_view.rows()
    labels = [label for label, _ in rows]
    assert labels == ["activation", "gradient", "input gradient", "gradient of weight", "gradient of bias"]
    assert "computed on <b>cpu</b>" in views.stats_view.info_label.text()
    assert "(3, 16, 12, 10)" in views.stats_view.info_label.text()
    assert views.stats_view.table.item(0, 1).text() == f"{3 * 16 * 12 * 10:,}"  # numel of the gradient

    path = views.export_csv(tmp_path / "stats.csv")
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    assert lines[0][:2] == ["# layer", "conv2"]
    header, body = lines[1], lines[2:]
    assert header[:3] == ["tensor", "numel", "min"]
    call = full["conv2"].calls[0]
    expected = [call.stats["activation"], call.stats["grad_output"], call.stats["grad_input"],
                full["conv2"].param_stats["weight"], full["conv2"].param_stats["bias"]]
    for row, s in zip(body, expected):
        assert int(row[1]) == s["numel"]
        for col, key in (("min", "min"), ("max", "max"), ("mean", "mean"), ("std", "std"),
                         ("mean_abs", "mean_abs"), ("l2", "l2")):
            assert float(row[header.index(col)]) == s[key]
        assert float(row[header.index("zero_percent")]) == pytest.approx(100 * s["zero_fraction"])
        assert int(row[header.index("nan")]) == s["nan_count"]
    assert not [p for p in tmp_path.iterdir() if p.name != "stats.csv"]  # no temporary file left


def test_export_png(views, tmp_path):
    views.set_layer("conv2")
    for title in ("Heatmap", "Grad-CAM", "Histogram", "Statistics", "Saliency"):
        views.show_view(title)
        path = views.export_png(tmp_path / f"{title}.png")
        with Image.open(path) as img:
            assert img.size[0] > 10 and img.size[1] > 10
    views.export_png(tmp_path / "flow.png", which="flow")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["Heatmap.png", "Grad-CAM.png", "Histogram.png", "Statistics.png", "Saliency.png", "flow.png"])


# -- Grad-CAM and saliency ---------------------------------------------------------------------------

def test_gradcam_overlay_on_the_picture(views, cnn):
    full, _, batch = cnn
    views.set_layer("conv2")
    views.set_sample(1)
    gv = views.gradcam_view
    cam = gv.current_cam()
    call = full["conv2"].calls[0]
    expected = grad_cam(call.activation[1:2], call.grad_output[1:2], out_size=(24, 20))[0].numpy()
    np.testing.assert_allclose(cam, expected, atol=1e-6)
    gv.set_opacity(0.0)
    np.testing.assert_array_equal(gv.current_rgb(), np.asarray(batch.images[1]))
    gv.set_opacity(1.0)
    assert not np.array_equal(gv.current_rgb(), np.asarray(batch.images[1]))
    assert "predicted:" in gv.info_label.text()


def test_gradcam_needs_a_spatial_layer(views):
    views.set_layer("fc")
    assert views.gradcam_view.current_cam() is None
    assert views.gradcam_view.message().startswith("Grad-CAM needs a spatial layer")


def test_gradcam_without_pictures_uses_the_input_tensor(qtbot, cnn):
    w = CaptureViews()
    qtbot.addWidget(w)
    w.set_capture(cnn[0], None)
    w.set_layer("conv1")
    assert w.gradcam_view.current_cam().shape == (24, 20)
    assert "input tensor" in w.gradcam_view.info_label.text()


def test_saliency(views, cnn):
    full = cnn[0]
    views.set_sample(2)
    sal = views.saliency_view.current_map()
    np.testing.assert_array_equal(sal, full.input_grad[2].abs().amax(0).numpy())


def test_saliency_hint_without_input_gradient(qtbot):
    w = CaptureViews()
    qtbot.addWidget(w)
    w.set_capture(capture(TinyCNN().eval(), torch.randn(1, 3, 8, 8)), None)
    w.saliency_view.ensure_drawn()
    assert "input gradient" in w.saliency_view.message()


# -- selection --------------------------------------------------------------------------------------

def test_selection_controls_and_signals(qtbot, views, cnn):
    assert views.selection()[0] == default_layer(cnn[0])[0] == "conv2"
    with qtbot.waitSignal(views.selection_changed) as blocker:
        views.set_layer("relu")
    assert blocker.args == ["relu", 0, 0]
    assert not views.call_combo.isHidden()  # relu has two calls
    assert views.call_combo.count() == 2
    with qtbot.waitSignal(views.selection_changed) as blocker:
        views.call_combo.setCurrentIndex(1)
    assert blocker.args == ["relu", 1, 0]
    np.testing.assert_array_equal(views.current_image_array(),
                                  cnn[0]["relu"].calls[1].grad_output[0, 0].numpy())
    with qtbot.waitSignal(views.selection_changed) as blocker:
        views.sample_spin.setValue(2)
    assert blocker.args == ["relu", 1, 2]
    assert "img2.png" in views.sample_name.text()
    # Model -> widget, without echo.
    with qtbot.assertNotEmitted(views.selection_changed):
        views.set_sample(2)
    views.set_sample(99)
    assert views.selection()[2] == 2 and views.sample_spin.value() == 2
    views.set_layer("conv1")
    assert views.call_combo.isHidden()
    assert views.selection() == ("conv1", 0, 2)


def test_unknown_layer_and_no_capture(qtbot, views):
    views.set_layer("nope")
    views.heatmap_view.ensure_drawn()
    assert "was not captured" in views.heatmap_view.message()
    assert views.current_image_array() is None
    views.set_capture(None, None)
    for view in views.views():
        view.ensure_drawn()
        assert "No capture" in view.message()
    assert views.flow_view.series()[0] == []


def test_stats_only_capture_does_not_break_any_view(qtbot, cnn, tmp_path):
    _, stats, batch = cnn
    w = CaptureViews()
    qtbot.addWidget(w)
    w.resize(900, 700)
    w.set_capture(stats, batch)
    w.show()
    qtbot.waitExposed(w)
    for layer in stats.layer_order:
        w.set_layer(layer)
        for i in range(w.tabs.count()):
            w.tabs.setCurrentIndex(i)
            w.tabs.currentWidget().ensure_drawn()
    w.set_layer("conv2")
    assert w.current_image_array() is None
    assert "Statistics-only capture" in w.heatmap_view.message()
    assert "Statistics-only capture" in w.gradcam_view.message()
    assert "Statistics-only capture" in w.saliency_view.message()
    assert w.histogram_view.message() == ""
    np.testing.assert_array_equal(w.histogram_view.current_counts()[1],
                                  stats["conv2"].calls[0].stats["grad_output"]["hist"].numpy())
    assert not w.histogram_view.scope_combo.model().item(1).isEnabled()
    assert not w.sample_spin.isVisible() and not w.sample_name.isVisible()  # no per-sample tensor
    w.set_capture(cnn[0], batch)  # full capture: a sample to choose again
    assert w.sample_spin.isVisible() and w.sample_name.isVisible()
    w.set_capture(stats, batch)
    assert w.stats_view.message() == ""
    assert len(w.stats_view.rows()) == 5
    names, values = w.flow_view.series()
    assert names == stats.layer_order and np.isfinite(values).all()
    w.export_csv(tmp_path / "s.csv")
    w.export_png(tmp_path / "s.png")


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.side = nn.Conv2d(4, 2, 1)  # its output does not reach the target
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        h = self.conv(x)
        self.side(h)
        return self.fc(h.mean((2, 3)))


def test_layer_without_gradient_keeps_the_controls(qtbot):
    cap = capture(Branchy().eval(), torch.randn(2, 3, 6, 6))
    w = CaptureViews()
    qtbot.addWidget(w)
    w.set_capture(cap, None)
    w.set_layer("side")
    hv = w.heatmap_view
    hv.set_display("channel", channel=0)
    assert "No gradient reached 'side'" in hv.plot_note_text()
    assert hv.message() == "" and w.current_image_array() is None
    hv.set_tensor("activation")
    assert hv.plot_note_text() == ""
    np.testing.assert_array_equal(w.current_image_array(), cap["side"].calls[0].activation[0, 0].numpy())
    assert w.gradcam_view.current_cam() is None
    assert "No gradient reached 'side'" in w.gradcam_view.message()
    assert "no gradient" in w.flow_view.flags()["side"]


def test_heatmap_opens_on_the_top_k_channels(qtbot):
    w = CaptureViews()
    qtbot.addWidget(w)
    assert w.heatmap_view.display_combo.currentData() == "topk"
