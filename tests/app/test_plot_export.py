"""Exports worth sending: a plot drawn again at twice the screen's resolution under a title
line (model, view, layer and call, sample, target), as PNG or SVG, named by default after
the model, the layer and the view."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from gradexplorer_app import dialogs


@pytest.mark.slow
def test_the_heatmap_exports_at_twice_the_resolution_under_a_title(qtbot, demo, tmp_path, monkeypatch):
    views = demo.views
    demo.show()
    views.set_layer("features.5.relu")
    views.set_call(1)
    views.show_view("Heatmap")
    views.heatmap_view.ensure_drawn()
    offered = []

    def save(parent, caption, suggested, filter_):
        offered.append((suggested, filter_))
        return str(tmp_path / suggested)

    monkeypatch.setattr(dialogs, "ask_save_file", save)
    demo.export_png_action.trigger()
    (name, filter_), = offered
    assert name == "shapes-CNN-demo_features.5.relu_heatmap.png"  # it had been plot.png
    assert "SVG" in filter_ and "PNG" in filter_
    widget = views.heatmap_view.export_widget()
    with Image.open(tmp_path / name) as img:
        width, height = img.size
        pixels = np.asarray(img.convert("L"))
    assert width == 2 * widget.width() and height > 2 * widget.height()  # a title line above the plot
    title_rows = pixels[: height - 2 * widget.height()]
    assert (title_rows < 100).any()  # dark text in the title band
    title = views.export_title()
    assert title == ("shapes CNN (demo) · Heatmap: gradient, top 16 channels · features.5.relu, call 2 of 2 · "
                     f"sample 0 ({demo.session.batch.names[0]}) · target top1")


@pytest.mark.slow
def test_svg_and_the_flow_chart(qtbot, demo, tmp_path):
    views = demo.views
    demo.show()
    views.show_view("Histogram")
    path = views.export_png(tmp_path / "h.svg")
    text = path.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert "Histogram: gradient" in text  # the title line, as text
    flow = views.export_png(tmp_path / "f.png", which="flow")
    with Image.open(flow) as img:
        assert img.size[0] == 2 * views.flow_view.export_widget().width()
    assert views.export_title("flow").startswith("shapes CNN (demo) · gradient flow: L2 norm of output gradient")
    assert views.export_file_name("flow") == "shapes-CNN-demo_flow.png"


def test_the_top_k_tiles_fill_the_heatmaps_plot(qtbot, demo):
    """At 1280×800 the heatmap's plot is wider than tall: the top-k grid takes its shape and
    covers most of the plot (a square grid had used ~40% of its width)."""
    from tests.app.test_window_fit import SCREEN

    demo.show()
    demo.resize(*SCREEN)
    views = demo.views
    views.set_layer("features.5.conv1")
    views.show_view("Heatmap")
    heat = views.heatmap_view
    qtbot.wait(100)
    heat.ensure_drawn()
    vb = heat.plot.vb
    assert vb.width() > 1.3 * vb.height()  # the case this is about
    rows, cols = heat.image.image.shape[:2]
    (x0, x1), (y0, y1) = vb.viewRange()
    assert (rows * cols) / ((x1 - x0) * (y1 - y0)) > 0.6
    assert heat.current_heatmap().tile_cols > 4  # wider than the square 4 × 4
