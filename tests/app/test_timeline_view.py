"""The timeline view: heatmap, onset, click for histograms, lines, live following, export."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt

from gradexplorer.recording.timeline import histogram_rows, log_colour, read_timeline
from tests.core.test_timeline import grad_of, write_log, write_tensor_parallel_log

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60_000


@pytest.fixture
def view(qtbot):
    from gradexplorer_app.views.timeline_view import TimelineView

    v = TimelineView(poll_ms=100)
    qtbot.addWidget(v)
    v.resize(1200, 800)
    v.show()
    yield v
    v.shutdown()


def open_and_wait(qtbot, view, path):
    with qtbot.waitSignal(view.updated, timeout=TIMEOUT):
        view.open_log(str(path))


def test_heatmap_shows_the_log(qtbot, view, tmp_path):
    path = tmp_path / "t.gxw"
    write_log(path)
    open_and_wait(qtbot, view, path)
    t = view.timeline
    assert t.rows == ["a", "b", "c#0", "c#1", "d"] and list(t.steps) == list(range(10))
    img = view.heat_image.image
    assert img.shape == (5, 10)
    expected = log_colour(read_timeline(path).values)
    np.testing.assert_allclose(img[np.isfinite(expected)], expected[np.isfinite(expected)])
    # the onset: a line at step 6 and a marker on layer c
    assert view.onset_line.isVisible() and view.onset_line.value() == 6
    xs, ys = view.onset_marker.getData()
    assert list(xs) == [6.5] and list(ys) == [2.5]
    assert "NaN/Inf from step 6 in c" in view.status.text()
    assert [view.layer_list.item(i).text() for i in range(view.layer_list.count())] == t.rows


def test_click_a_cell_for_histograms_and_lines(qtbot, view, tmp_path):
    path = tmp_path / "t.gxw"
    write_log(path)
    open_and_wait(qtbot, view, path)
    scene_pos = view.heat_plot.vb.mapViewToScene(QPointF(3.5, 1.5))  # step 3, layer b
    widget_pos = view.heat_widget.mapFromScene(scene_pos)
    qtbot.mouseClick(view.heat_widget.viewport(), Qt.MouseButton.LeftButton, pos=widget_pos)
    qtbot.waitUntil(lambda: view.selected == ["b"], timeout=TIMEOUT)
    qtbot.waitUntil(lambda: view.hist_image.image is not None, timeout=TIMEOUT)
    from gradexplorer.stats.merge import MergeStats

    img = view.hist_image.image  # bins shown x steps
    assert img.shape[1] == 10
    counts = np.array([MergeStats.of_tensor(grad_of("b", s)).hist for s in range(10)])
    used = np.flatnonzero(counts.sum(axis=0))
    # Every used bin, in order of value, long empty runs between them left out.
    rows = histogram_rows(counts)
    assert [b for b in rows if b is not None] == [b for b in range(used[0], used[-1] + 1)
                                                  if b in rows]
    assert set(used) <= set(rows) and len(rows) < used[-1] - used[0] + 1
    expected = np.zeros((len(rows), 10))
    for i, b in enumerate(rows):
        if b is not None:
            expected[i] = np.log10(1 + counts[:, b])
    np.testing.assert_allclose(img, expected)
    # ctrl-click adds a second line
    view.select_layer("d", add=True)
    assert view.selected == ["b", "d"]
    assert len(view.line_plot.listDataItems()) == 2
    y = view.line_plot.listDataItems()[1].getData()[1]  # log10 of the values: the y axis is logarithmic
    assert 10 ** y[0] == pytest.approx(float(grad_of("d", 0).double().norm()), rel=1e-5)
    # steps are whole numbers: no tick at 2.5, however few steps fit
    axis = view.line_plot.getAxis("bottom")
    for lo, hi in ((0, 9), (2, 4), (3, 3.6)):
        values = [v for _spacing, level in axis.tickValues(lo, hi, 400) for v in level]
        assert values and all(float(v).is_integer() for v in values), (lo, hi, values)
    assert axis.labelText == "step"


def test_the_lines_span_every_step_where_a_layer_turns_nan(qtbot, view, tmp_path):
    """A layer whose gradient is all NaN from step 6 on: its line stops there, but the plot
    still spans the log's steps 0 to 9, as the heatmap above it does."""
    import torch

    from gradexplorer.recording.watch_log import WatchLogWriter, stats_row
    from gradexplorer.stats.merge import MergeStats

    path = tmp_path / "t.gxw"
    w = WatchLogWriter(path, meta={"layers": ["a"], "params": [], "every": 1})
    for step in range(10):
        g = torch.randn(64, generator=torch.Generator().manual_seed(step))
        if step >= 6:
            g = torch.full((64,), float("nan"))
        w.write_step(step, 0, 1.0, 1.0, 0.1, [stats_row(step, "a", 0, "grad_output", 0, MergeStats.of_tensor(g))])
    w.close()
    open_and_wait(qtbot, view, path)
    view.select_layer("a")
    (line,) = view.line_plot.listDataItems()
    assert line.getData()[0].max() == 5  # the finite values end before the onset
    lo, hi = view.line_plot.vb.viewRange()[0]
    assert lo <= 0 and hi >= 9


def test_statistic_and_kind_choices_reload(qtbot, view, tmp_path):
    path = tmp_path / "t.gxw"
    write_log(path)
    open_and_wait(qtbot, view, path)
    with qtbot.waitSignal(view.updated, timeout=TIMEOUT):
        view.stat_combo.setCurrentIndex(view.stat_combo.findData("max_abs"))
    assert view.timeline.stat == "max_abs"
    assert view.timeline.values[0, 0] == pytest.approx(float(grad_of("a", 0).abs().max()), rel=1e-6)


def test_module_rows_kept_per_rank_are_said_to_be_rank_0s(qtbot, view, tmp_path):
    path = tmp_path / "tp.gxw"
    write_tensor_parallel_log(path)
    view.kind_combo.setCurrentIndex(view.kind_combo.findData("activation"))
    open_and_wait(qtbot, view, path)
    assert view.timeline.rows == ["a", "b"]
    assert "rank 0's own rows (tensor parallelism" in view.status.text()
    with qtbot.waitSignal(view.updated, timeout=TIMEOUT):
        view.kind_combo.setCurrentIndex(view.kind_combo.findData("grad"))
    assert view.timeline.rows == ["a.weight"] and "rank 0" not in view.status.text()


def test_follows_a_growing_log_reading_off_the_ui_thread(qtbot, view, tmp_path, monkeypatch):
    import gradexplorer.recording.timeline as timeline

    threads = []
    real = timeline.read_timeline

    def spy(*args, **kwargs):
        threads.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(timeline, "read_timeline", spy)
    path = tmp_path / "t.gxw"
    write_log(path, range(4))
    open_and_wait(qtbot, view, path)
    assert list(view.timeline.steps) == [0, 1, 2, 3]
    write_log(path, range(4, 10))
    qtbot.waitUntil(lambda: view.timeline is not None and view.timeline.steps.size == 10, timeout=TIMEOUT)
    np.testing.assert_array_equal(view.timeline.values, read_timeline(path).values)
    assert threads and not any(threads)  # never on the UI thread


@pytest.mark.slow
def test_window_reads_while_a_writer_process_writes(qtbot, view, tmp_path):
    path = tmp_path / "live.gxw"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    # 0.1 s a step: 6 s of writing that the view (polling every 0.1 s here) must follow as it
    # grows; unpaced, the compiled watch wrote all 60 steps before the view's second poll.
    # After steps 19 and 39 the writer waits until the view shows them: three sizes are seen
    # however long this process is paused between two looks.
    proc = subprocess.Popen([sys.executable, "-m", "tests.core.watch_writer", str(path), "60", "0.1", "19", "39"],
                            cwd=ROOT,
                            env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        qtbot.waitUntil(lambda: path.exists() and proc.stdout.readline().startswith("done"), timeout=120_000)
        open_and_wait(qtbot, view, path)
        sizes = {view.timeline.steps.size}
        deadline = time.monotonic() + 240
        while view.timeline.steps.size < 60 and time.monotonic() < deadline:
            qtbot.wait(50)
            sizes.add(view.timeline.steps.size)
            for hold in tmp_path.glob("live.gxw.hold-*"):
                if view.timeline.steps.size == int(hold.name.rpartition("-")[2]) + 1:
                    hold.unlink()
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert view.timeline.steps.size == 60
    assert len(sizes) >= 3  # it grew in front of the view, not all at once


def test_export_png_and_csv(qtbot, view, tmp_path, monkeypatch):
    from gradexplorer_app import dialogs

    path = tmp_path / "t.gxw"
    write_log(path)
    open_and_wait(qtbot, view, path)
    monkeypatch.setattr(dialogs, "ask_save_file", lambda *a, **k: str(tmp_path / "shot.png"))
    view.png_button.click()
    from PySide6.QtGui import QImage

    img = QImage(str(tmp_path / "shot.png"))
    assert not img.isNull() and img.width() > 500
    monkeypatch.setattr(dialogs, "ask_save_file", lambda *a, **k: str(tmp_path / "t.csv"))
    view.csv_button.click()
    lines = (tmp_path / "t.csv").read_text().splitlines()
    assert lines[0].split(",")[1:] == [str(s) for s in range(10)]
    assert [ln.split(",")[0] for ln in lines[1:]] == ["a", "b", "c#0", "c#1", "d", "loss"]
    assert float(lines[1].split(",")[1]) == pytest.approx(float(grad_of("a", 0).double().norm()), rel=1e-5)
    monkeypatch.setattr(dialogs, "ask_save_file", lambda *a, **k: None)  # cancelled: nothing happens
    assert view.export_csv() is None


def test_dataset_capture_series(qtbot, view, tmp_path):
    import torch
    from torch import nn

    from gradexplorer.files.capture_file import save_capture
    from gradexplorer.recording.dataset_capture import capture_dataset, iter_tensor_batches, to_capture

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    stats = capture_dataset(model, iter_tensor_batches(torch.randn(10, 4), None, 3, range(4)))
    save_capture(to_capture(stats, model, ["0", "1", "2"], {}), tmp_path / "ds.pt")
    with qtbot.waitSignal(view.updated, timeout=TIMEOUT):
        view.open_capture(str(tmp_path / "ds.pt"))
    assert view.timeline.rows == ["0", "1", "2"] and list(view.timeline.steps) == [0, 1, 2, 3]
    assert view.heat_plot.getAxis("bottom").labelText == "batch"
    assert not view.onset_line.isVisible() and not view.follow_box.isVisibleTo(view)
    view.select_layer("1")
    # no per-batch histograms in a dataset capture: the message, without empty axes under it
    assert "only watch logs" in view.hist_plot.titleLabel.text
    assert not view.hist_plot.getAxis("left").isVisible() and not view.hist_plot.getAxis("bottom").isVisible()
    assert view.line_plot.getAxis("bottom").labelText == "batch"


def test_dataset_capture_onset_and_export(qtbot, view, tmp_path):
    import torch
    from torch import nn

    from gradexplorer.recording.dataset_capture import capture_dataset, iter_tensor_batches, to_capture

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    x = torch.randn(12, 4)
    x[7, 1] = float("inf")  # batch 2
    cap = to_capture(capture_dataset(model, iter_tensor_batches(x, None, 3, range(4))), model, ["0", "1", "2"], {})
    with qtbot.waitSignal(view.updated, timeout=TIMEOUT):
        view.show_capture(cap, "in memory")
    assert view.onset_line.isVisible() and view.onset_line.value() == 2
    xs, ys = view.onset_marker.getData()
    assert list(xs) == [2.5] and list(ys) == [0.5]  # on layer "0", the first in forward order
    assert "NaN/Inf from batch 2 in 0" in view.status.text()
    assert "NaN/Inf from batch 2: 0" in view.onset_text.toPlainText()
    assert view.export_png(str(tmp_path / "t.png")) and (tmp_path / "t.png").stat().st_size > 0
    assert view.export_csv(str(tmp_path / "t.csv"))
    lines = (tmp_path / "t.csv").read_text().splitlines()
    assert lines[0].split(",")[1:] == ["0", "1", "2", "3"]
    assert [ln.split(",")[0] for ln in lines[1:4]] == ["0", "1", "2"]


def test_unreadable_file_says_so(qtbot, view, tmp_path):
    bad = tmp_path / "bad.gxw"
    bad.write_bytes(b"not sqlite")
    with qtbot.waitSignal(view.failed, timeout=TIMEOUT):
        view.open_log(str(bad))
    assert "bad.gxw" in view.status.text()


def test_main_window_opens_a_timeline(qtbot, window, tmp_path, monkeypatch):
    from gradexplorer_app import dialogs

    path = tmp_path / "t.gxw"
    write_log(path)
    monkeypatch.setattr(dialogs, "ask_open_file", lambda *a, **k: str(path))
    file_menu = window.menuBar().actions()[0].menu()
    assert window.open_timeline_action in file_menu.actions()
    window.open_timeline_action.trigger()
    assert len(window.timeline_windows) == 1
    opened = window.timeline_windows[0]
    qtbot.waitUntil(lambda: opened.view.timeline is not None, timeout=TIMEOUT)
    assert opened.view.timeline.rows == ["a", "b", "c#0", "c#1", "d"]
    monkeypatch.setattr(dialogs, "ask_open_file", lambda *a, **k: None)  # cancelled: nothing opens
    assert window.open_timeline() is None and len(window.timeline_windows) == 1


def _dropped_steps(tmp_path) -> Path:
    import sqlite3

    from tests.app.test_cli_watch import make_log

    path = tmp_path / "run.gxw"
    make_log(path, nan_at=99, steps=2)
    con = sqlite3.connect(path)
    con.execute("DROP TABLE steps")
    con.commit()
    con.close()
    return path


def test_timeline_of_a_damaged_log_is_one_message_before_the_window_opens(tmp_path, capsys, monkeypatch):
    import types

    from gradexplorer_app.cli.main import main

    opened = []
    module = types.ModuleType("gradexplorer_app.window.timeline_window")
    module.launch_timeline = lambda *args: opened.append(args) or 0
    monkeypatch.setitem(sys.modules, "gradexplorer_app.window.timeline_window", module)
    path = _dropped_steps(tmp_path)
    for extra in ([], ["--screenshot", str(tmp_path / "shot.png")]):
        code = main(["timeline", str(path), *extra])
        err = capsys.readouterr().err
        assert code == 1 and err.startswith("error: ") and "table 'steps' is missing" in err, err
    assert opened == [] and not (tmp_path / "shot.png").exists()


@pytest.mark.slow
def test_timeline_screenshot_of_an_unreadable_capture_says_why(tmp_path):
    """The window meets the failure (a dataset capture is read in its worker): with nobody
    to see its status line, the reason is printed and the command exits 1."""
    bad = tmp_path / "data.pt"
    bad.write_bytes(b"PK\x03\x04 not a capture")
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT),
               GRADEXPLORER_SETTINGS=str(tmp_path / "s.ini"))
    done = subprocess.run([sys.executable, "-m", "gradexplorer", "timeline", str(bad), "--screenshot",
                           str(tmp_path / "shot.png")], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1, done.stderr
    said = [ln for ln in done.stderr.splitlines() if ln.startswith("error: ")]
    assert len(said) == 1 and "data.pt" in said[0] and "Traceback" not in done.stderr, done.stderr


def _training_log(path: Path, losses: list[float]) -> None:
    """A watched training of a small model, the loss of each step given to ``w.step``."""
    import torch
    from torch import nn

    import gradexplorer as gx

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    x = torch.randn(4, 3, 8, 8)
    with gx.watch(model, str(path), every=1) as w:
        for loss_value in losses:
            model.zero_grad()
            model(x).sum().backward()
            w.step(loss=loss_value)


def test_the_loss_given_to_step_is_plotted_over_the_heatmaps_columns(qtbot, view, tmp_path):
    """A training dashboard: the loss of each step stands over that step's column of the
    heatmap (same x, same width), a NaN loss is marked, and each row is named with its
    module's class ("0  Conv2d"; rows had read "0…3")."""
    losses = [2.0, 1.5, 1.2, float("nan"), 0.9, 0.8]
    path = tmp_path / "train.gxw"
    _training_log(path, losses)
    open_and_wait(qtbot, view, path)
    t = view.timeline
    assert list(t.steps) == list(range(6)) and t.rows == ["0", "1", "2", "3"]
    x, y = view.loss_curve.getData()
    finite = [i for i, v in enumerate(losses) if v == v]
    np.testing.assert_allclose(x, [i + 0.5 for i in finite])  # over the columns' centres
    np.testing.assert_allclose(y, [losses[i] for i in finite])
    bad_x, _ = view.loss_nonfinite.getData()
    assert list(bad_x) == [3.5]
    assert "NaN/Inf at 1 steps from step 3" in view.loss_plot.titleLabel.text
    # the two plots share their x range and their left edge: a step's loss over its column.
    # pyqtgraph links the ranges through the views' pixels, so they agree once the layout
    # has placed both plots (the next turns of the event loop after the log opens).
    qtbot.waitUntil(lambda: view.loss_plot.vb.viewRange()[0] == pytest.approx(view.heat_plot.vb.viewRange()[0]),
                    timeout=TIMEOUT)
    loss_box, heat_box = view.loss_plot.vb.sceneBoundingRect(), view.heat_plot.vb.sceneBoundingRect()
    assert loss_box.left() == pytest.approx(heat_box.left(), abs=1) and \
        loss_box.right() == pytest.approx(heat_box.right(), abs=1)
    assert loss_box.bottom() <= heat_box.top()  # above the layers
    names = ["0  Conv2d", "1  ReLU", "2  Flatten", "3  Linear"]
    assert [view.layer_list.item(i).text() for i in range(view.layer_list.count())] == names
    assert view.row_axis.names == names
    view.layer_list.item(3).setSelected(True)
    assert "3" in view.selected  # the list selects rows by their name, not their words


def test_a_log_without_a_loss_says_so(qtbot, view, tmp_path):
    path = tmp_path / "t.gxw"
    _training_log(path, [None, None, None])
    open_and_wait(qtbot, view, path)
    assert "no loss was given to w.step(loss=...)" in view.loss_plot.titleLabel.text
    assert view.loss_curve.getData()[0] is None or len(view.loss_curve.getData()[0]) == 0
