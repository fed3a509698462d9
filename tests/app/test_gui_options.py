"""`gradexplorer --model X ... --run` hands the window the capture command's options, and the
window's run uses them: its session gives back the same options, and the capture says so."""

from __future__ import annotations

import pytest

import gradexplorer_app.window.launch
from gradexplorer_app.cli import common, main as cli
from gradexplorer_app.window.launch import start
from tests.app.conftest import TIMEOUT

SETTINGS = ["--model", "demo:seed-mlp", "--random", "4x10", "--layers", "fc1", "fc3", "--target", "sum",
            "--device", "cpu", "--stats-only", "--memory-budget", "1GiB"]


@pytest.fixture
def fake_launch(monkeypatch):
    """The command line's hand-over, caught before a second window and event loop start."""
    calls = []
    def launch(options=None, run=False, screenshot=None, **others):
        calls.append((options, run, screenshot))
        return 0

    monkeypatch.setattr(gradexplorer_app.window.launch, "launch", launch)
    return calls


@pytest.mark.slow
def test_the_window_runs_with_the_options_the_cli_builds(qtbot, window, fake_launch):
    assert cli.main([*SETTINGS, "--run"]) == 0
    ((options, run, _shot),) = fake_launch
    assert options == common.capture_options(cli.build_parser().parse_args(["capture", *SETTINGS, "--out", "x.pt"]))
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        start(window, options, run)
    assert done.args == ["ok"]
    s = window.session
    # What the window would run again is what the command line asked for.
    assert s.capture_options(force=options.force) == options
    assert s.memory_budget == 2**30 and window.run_panel.stats_radio.isChecked()
    meta = s.capture.meta
    assert list(s.capture.layers) == ["fc1", "fc3"]
    assert (meta["target"], meta["mode"], meta["device"]) == ("sum", "stats", "cpu")
    assert tuple(s.capture.input.shape) == (4, 10)


def test_a_device_that_is_not_here_is_shown_and_the_window_still_loads(qtbot, window, shown_errors):
    from gradexplorer.pipeline.options import CaptureOptions

    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        start(window, CaptureOptions("demo:seed-mlp", device="cuda:7", target="sum"))
    assert [title for title, _exc in shown_errors] == ["A setting cannot be used"]
    assert "cuda:7" in str(shown_errors[0][1])
    assert window.session.target == "sum" and window.session.model.spec == "demo:seed-mlp"


@pytest.mark.slow
def test_the_command_line_opens_runs_and_saves_the_window(tmp_path):
    # The whole chain in a fresh interpreter (launch() styles the whole QApplication):
    # flags -> capture_options -> launch -> the window's run -> the screenshot.
    import os
    import subprocess
    import sys
    from pathlib import Path

    shot = tmp_path / "shot.png"
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", GRADEXPLORER_SETTINGS=str(tmp_path / "s.ini"),
               PYTHONPATH=str(root))
    result = subprocess.run([sys.executable, "-m", "gradexplorer", *SETTINGS, "--run", "--screenshot", str(shot)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.stat().st_size > 10_000
