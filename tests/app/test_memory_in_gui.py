"""The memory estimate beside Run, and what Run does over the budget."""

from __future__ import annotations

import pytest
import torch

import gradexplorer.capturing.memory_estimate
from gradexplorer.app import dialogs
from gradexplorer.app.window.main_window import MainWindow
from gradexplorer.base.devices import DeviceInfo

TIMEOUT = 60_000
CPU = [DeviceInfo("cpu", "cpu - test", None, None)]


@pytest.fixture
def demo(qtbot, window):
    """The demo loaded but not run: the estimate is shown before any run."""
    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.load_model("demo:shapes")
    qtbot.waitUntil(lambda: window.run_panel.estimate is not None, timeout=5000)
    return window


def test_estimate_shown_beside_run_and_follows_the_selection(qtbot, demo):
    panel, s = demo.run_panel, demo.session
    full = panel.estimate
    assert panel.memory_label.text().startswith("≈ ") and "iB" in panel.memory_label.text()
    assert panel.memory_label.toolTip() == full.describe()
    assert not panel.budget_label.isVisible() and panel.budget_message is None

    s.set_selection(["features.0.conv"])
    qtbot.waitUntil(lambda: panel.estimate is not full, timeout=5000)
    fewer = panel.estimate
    assert fewer.layers == 1 and fewer.total < full.total
    assert panel.memory_label.toolTip() == fewer.describe()

    s.set_mode("stats")
    qtbot.waitUntil(lambda: panel.estimate is not fewer, timeout=5000)
    assert panel.estimate.mode == "stats" and "statistics only" in panel.memory_label.toolTip()


def test_estimate_follows_the_batch_size_and_shape(qtbot, demo, tmp_path):
    panel = demo.run_panel
    before = panel.estimate
    path = tmp_path / "big.pt"
    # Another sample shape than the probe saw: a probe in a worker, then the estimate.
    torch.save(torch.randn(24, 3, 96, 96), path)
    with qtbot.waitSignal(demo.batch_loaded, timeout=TIMEOUT):
        demo.load_inputs([str(path)])
    qtbot.waitUntil(lambda: panel.estimate is not None and panel.estimate is not before, timeout=TIMEOUT)
    assert panel.estimate.total > 3 * before.total


def test_over_budget_run_offers_statistics_only(qtbot, demo, monkeypatch):
    # 1000 bytes: statistics only would not fit either, so it is not offered
    monkeypatch.setattr(gradexplorer.capturing.memory_estimate, "budget_bytes", lambda device="cpu": 1000)
    panel = demo.run_panel
    panel.update_estimate()
    assert panel.budget_label.isVisibleTo(panel) and "budget" in panel.budget_message
    assert "c0392b" in panel.budget_label.text()
    assert "smaller batch" in panel.budget_message and "statistics-only" not in panel.budget_message
    offered = []
    monkeypatch.setattr(dialogs, "ask_item", lambda parent, title, label, items, editable=True:
                        offered.append(items))
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT):
        demo.run()
    assert offered == [[MainWindow.RUN_ANYWAY]]

    # a budget between what statistics only and a full capture need: the switch is offered
    est = panel.estimate
    transient = est.transient
    between = (est.io + est.stats + est.total) // 2 + transient
    monkeypatch.setattr(gradexplorer.capturing.memory_estimate, "budget_bytes", lambda device="cpu": between)
    panel.update_estimate()
    assert "statistics-only" in panel.budget_message
    asked = []

    def choose(parent, title, label, items, editable=True):
        asked.append(items)
        return MainWindow.STATS_ONLY

    monkeypatch.setattr(dialogs, "ask_item", choose)
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()
    assert done.args == ["ok"]
    assert asked and MainWindow.STATS_ONLY in asked[0] and MainWindow.RUN_ANYWAY in asked[0]
    assert demo.session.mode == "stats" and demo.session.capture.mode == "stats"
    assert demo.run_panel.stats_radio.isChecked()


def test_over_budget_run_can_be_declined_before_anything_runs(qtbot, demo, monkeypatch):
    monkeypatch.setattr(gradexplorer.capturing.memory_estimate, "budget_bytes", lambda device="cpu": 1000)
    monkeypatch.setattr(dialogs, "ask_item", lambda *a, **k: None)
    started = []
    demo.run_runner.started.connect(started.append)
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()
    assert done.args == ["cancelled"] and not started
    assert demo.session.mode == "full" and demo.session.capture is None
    monkeypatch.setattr(dialogs, "ask_item", lambda *a, **k: MainWindow.RUN_ANYWAY)
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT) as done:
        demo.run()
    assert done.args == ["ok"] and demo.session.capture.mode == "full"


def test_a_stage_of_unknown_length_is_named_on_the_bar(demo):
    from gradexplorer.pipeline.job import STAGE_KERNELS

    bar = demo.run_panel.progress
    demo.run_panel.set_progress(STAGE_KERNELS, 0, 0)  # the kernels' first compile: ~10 s, say what it is
    assert bar.maximum() == 0 and bar.format() == f"{STAGE_KERNELS}…"
    demo.run_panel.set_progress("forward", 3, 10)
    assert bar.maximum() == 2000 and bar.format() == "forward 3/10"
