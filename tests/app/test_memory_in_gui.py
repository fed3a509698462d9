"""The memory estimate beside Run, and what Run does over the budget."""

from __future__ import annotations

import pytest
import torch

import gradexplorer.capturing.memory_estimate
from gradexplorer.base.devices import DeviceInfo
from gradexplorer_app import dialogs
from gradexplorer_app.window.main_window import MainWindow

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_over_budget_run_can_be_declined_before_anything_runs(qtbot, demo, monkeypatch):
    monkeypatch.setattr(gradexplorer.capturing.memory_estimate, "budget_bytes", lambda device="cpu": 1000)
    demo.run_panel.update_estimate()  # the panel reads the free memory, and shows the budget
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


def test_the_budget_question_names_the_budget_the_panel_shows(qtbot, demo, monkeypatch):
    """The free memory moves between a look at the Run panel and a click on Run: the
    question names the budget the panel showed (9.8 GiB had faced the panel's 9.2 GiB)."""
    memory = gradexplorer.capturing.memory_estimate
    panel = demo.run_panel
    monkeypatch.setattr(memory, "budget_bytes", lambda device="cpu": 1000)
    panel.update_estimate()
    shown = panel.budget_message
    assert "the budget is 1000 B" in shown and "1000 B" in panel.budget_label.text()
    monkeypatch.setattr(memory, "budget_bytes", lambda device="cpu": 1500)  # more free memory now
    asked = []
    monkeypatch.setattr(dialogs, "ask_item", lambda parent, title, label, items, editable=True:
                        asked.append(label))
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT):
        demo.run()
    assert len(asked) == 1 and shown in asked[0] and "1500 B" not in asked[0]
    assert panel.budget_message == shown and "1000 B" in panel.budget_label.text()


def test_a_long_question_wraps_inside_the_screen(qtbot):
    """The over-budget question (one long line had made it 1,459 px wide, its OK button off
    a 1280 px screen) wraps, and the dialog fits the screen it opens on."""
    from PySide6.QtWidgets import QLabel

    message = ("This capture needs 9.8 GiB of memory (≈ 4.1 MiB kept, plus 9.8 GiB while forward and "
               "backward run) but the budget is 9.2 GiB (half of the free RAM). Switch to statistics-only "
               "capture (about 4.1 MiB), or tick fewer layers.\n\nWhat would you like to do? (Cancel: don't run)")
    dialog = dialogs.wrap_question(dialogs.input_dialog(None, "gradexplorer: over the memory budget", message))
    dialog.setComboBoxItems([MainWindow.STATS_ONLY, MainWindow.RUN_ANYWAY])
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    room = dialog.screen().availableGeometry()
    assert dialog.width() <= min(room.width(), 720), dialog.width()
    assert room.contains(dialog.frameGeometry())
    label = next(w for w in dialog.findChildren(QLabel) if "budget" in w.text())
    assert label.wordWrap() and label.height() > 2 * label.fontMetrics().height()  # several lines
    dialog.close()


@pytest.mark.slow
def test_the_memory_a_run_freed_is_given_back(qtbot, demo, monkeypatch, tmp_path):
    """After each run (and after a capture file replaces the capture shown), once the capture
    it replaced is gone, the window gives the freed memory back to the system, off the UI
    thread."""
    import gc
    import threading
    import weakref

    from gradexplorer.base import devices

    calls = []
    watched = {"old": lambda: None}

    def release() -> None:
        gc.collect()
        calls.append((threading.current_thread() is threading.main_thread(), watched["old"]() is None))

    monkeypatch.setattr(devices, "release_host_memory", release)
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT):
        demo.run()
    qtbot.waitUntil(lambda: len(calls) == 1, timeout=5000)
    first = demo.session.capture
    watched["old"] = weakref.ref(first)
    del first
    with qtbot.waitSignal(demo.run_done, timeout=TIMEOUT):
        demo.run()
    qtbot.waitUntil(lambda: len(calls) == 2, timeout=5000)
    assert calls[-1] == (False, True)  # in a thread of its own, the first capture gone
    path = tmp_path / "c.pt"
    with qtbot.waitSignal(demo.file_done, timeout=TIMEOUT):
        demo.export_capture(str(path))
    n = len(calls)
    with qtbot.waitSignal(demo.file_done, timeout=TIMEOUT):
        demo.open_capture(str(path))
    qtbot.waitUntil(lambda: len(calls) > n, timeout=5000)
