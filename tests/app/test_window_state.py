"""The window's panels follow one view state, and what a capture implies is derived once."""

from __future__ import annotations

import pytest

from gradexplorer.base.errors import GradExplorerError
from tests.app.conftest import TIMEOUT


@pytest.mark.slow
def test_tree_views_and_batch_follow_the_view_state(qtbot, demo):
    state = demo.view_state
    # model -> widgets
    state.select("features.2.conv", 0)
    assert demo.tree_view.current_name() == "features.2.conv"
    assert demo.views.selection()[0] == "features.2.conv"
    state.sample = 3
    assert demo.batch_panel.list.currentRow() == 3
    assert demo.views.sample_spin.value() == 3
    # widgets -> model
    demo.tree_view.select_layer("features.4.conv")
    assert state.layer == "features.4.conv"
    demo.batch_panel.list.setCurrentRow(5)
    assert state.sample == 5
    demo.views.show_view("Heatmap")
    heat = demo.views.heatmap_view
    heat.set_display("channel", channel=2)
    assert state.channel == 2
    heat.channel_slider.setValue(4)
    assert state.channel == 4 and heat.channel_spin.value() == 4
    state.channel = 1
    assert heat.channel_slider.value() == 1 and heat.current_heatmap().channels == [1]
    heat.tensor_combo.setCurrentIndex(heat.tensor_combo.findData("activation"))
    assert state.tensor == "activation"
    state.reduction = "l2"
    assert heat.reduce_combo.currentData() == "l2"


@pytest.mark.slow
def test_an_uncaptured_row_keeps_the_views(qtbot, window, monkeypatch):
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT):
        window.load_model("demo:shapes", layers=["features.5.*"], run=True)
    shown = window.view_state.layer
    window.tree_view.select_layer("classifier")
    assert window.view_state.layer == shown
    assert "was not captured" in window.statusBar().currentMessage()


def test_flags_and_norms_are_derived_once_per_capture(qtbot, window, monkeypatch):
    import gradexplorer.analysis.capture_summary as summary

    calls = []
    real = summary.layer_flags
    monkeypatch.setattr(summary, "layer_flags", lambda cap: calls.append(cap) or real(cap))
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT):
        window.load_model("demo:shapes", run=True)
    cap = window.session.capture
    assert [c is cap for c in calls] == [True]
    # Both the tree and the flow chart show that one result.
    flags = summary.summarize(cap).flags
    assert window.views.flow_view.flags() == flags


@pytest.mark.slow
def test_png_and_csv_exports_report_write_problems_as_the_users(qtbot, demo, tmp_path, shown_errors):
    demo.export_png(str(tmp_path / "missing" / "plot.png"))
    demo.export_csv(str(tmp_path / "missing" / "stats.csv"))
    assert [title for title, _ in shown_errors] == ["The plot cannot be exported",
                                                   "The statistics cannot be exported"]
    for _, exc in shown_errors:
        assert isinstance(exc, GradExplorerError) and "does not exist" in exc.problem
    demo.export_png(str(tmp_path / "plot.png"))
    demo.export_csv(str(tmp_path / "stats.csv"))
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "\ntensor,numel," in (tmp_path / "stats.csv").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png", "stats.csv"]  # no temp files left
