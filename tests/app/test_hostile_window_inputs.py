"""The window on hostile inputs: a batch that declares gigabytes in a few bytes (an expanded
view) gets its thumbnails from a strided view, never a dense copy; a watch log whose
statistics are all NULL opens, is drawn and saved, with no histogram to show."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import torch

from gradexplorer.capturing.inputs import Batch
from tests.memory_watch import LargestResult

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sample", [
    torch.zeros(1).expand(16384, 16384),          # 1 GiB declared, 4 bytes stored
    torch.zeros(1).expand(3, 16384, 16384),
    torch.zeros(1).expand(4096, 4096, 4096),       # 256 GiB declared
    torch.zeros(1, dtype=torch.int64).expand(8192, 8192),
])
def test_a_thumbnail_of_an_expanded_sample_copies_no_more_than_it_draws(qtbot, sample):
    from gradexplorer_app.window.batch_panel import tensor_to_pixmap

    with LargestResult() as seen:
        pix = tensor_to_pixmap(sample)
    assert not pix.isNull()
    assert seen.largest <= 64 * 256 * 256 * 4, seen.largest  # at most 64 channels of 256 x 256 floats


def test_a_thumbnail_still_shows_the_picture(qtbot):
    """A ramp from dark (top left) to bright (bottom right), drawn from every 64th pixel."""
    from gradexplorer_app.window.batch_panel import THUMB, tensor_to_pixmap

    ramp = torch.linspace(0, 1, 16384)
    sample = (ramp[:, None] + ramp[None, :]).expand(3, -1, -1)
    image = tensor_to_pixmap(sample).toImage()
    dark, bright = image.pixelColor(4, 4), image.pixelColor(THUMB - 5, THUMB - 5)
    assert dark.red() < 40 and bright.red() > 215


def test_the_batch_panel_of_a_64_sample_expanded_batch(qtbot, window):
    x = torch.zeros(1).expand(64, 16384, 16384)
    batch = Batch(tensor=x, labels=None, names=[f"s{i}" for i in range(64)], source="expanded")
    with LargestResult() as seen:
        window.batch_panel._on_model_batch_changed(batch)
    assert window.batch_panel.list.count() == 64
    assert seen.largest <= 64 * 256 * 256 * 4, seen.largest


def _null_statistics_log(path: Path) -> Path:
    from tests.log_mutations import valid_log

    valid_log(path)
    columns = ("numel", "count", "nan_count", "inf_count", "zero_count", "min", "max", "mean", "std", "sum",
               "sum_abs", "m2", "l2", "mean_abs", "update_ratio", "hist_lo", "hist")
    with sqlite3.connect(path) as con:
        con.execute("UPDATE stats SET " + ", ".join(f"{c} = NULL" for c in columns))
    return path


def test_a_log_whose_statistics_are_all_null_shows_no_histograms(qtbot, tmp_path):
    from gradexplorer_app.views.timeline_view import TimelineView

    path = _null_statistics_log(tmp_path / "null.gxw")
    view = TimelineView(poll_ms=100)
    qtbot.addWidget(view)
    view.resize(1200, 800)
    view.show()
    try:
        with qtbot.waitSignal(view.updated, timeout=60_000):
            view.open_log(str(path))
        import numpy as np

        view.show_histograms("0", np.arange(4), np.zeros((4, 64)))
        assert "no histograms" in view.hist_plot.titleLabel.text
    finally:
        view.shutdown()


@pytest.mark.slow
def test_timeline_screenshot_of_a_log_whose_statistics_are_all_null(tmp_path):
    import os
    import subprocess
    import sys

    path = _null_statistics_log(tmp_path / "null.gxw")
    png = tmp_path / "null.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT),
               GRADEXPLORER_SETTINGS=str(tmp_path / "settings.ini"))
    done = subprocess.run([sys.executable, "-m", "gradexplorer", "timeline", str(path), "--screenshot", str(png)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
