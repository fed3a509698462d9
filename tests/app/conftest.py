"""Fixtures for the GUI tests: a throwaway settings file, no real modal dialogs."""

from __future__ import annotations

import pytest

from gradexplorer.base.devices import DeviceInfo

TIMEOUT = 60_000
CPU = [DeviceInfo("cpu", "cpu - test", None, None)]


@pytest.fixture
def window(qtbot):
    """The main window on the CPU, not yet loaded, at 1500×950 (no saved geometry restored,
    nor clamped to the test platform's 800×800 screen when shown)."""
    from gradexplorer_app.window.main_window import MainWindow

    w = MainWindow(devices=CPU, restore_geometry=False)
    qtbot.addWidget(w)
    w.resize(1500, 950)
    yield w
    w.shutdown()


@pytest.fixture
def demo(qtbot, window):
    """The window with demo:shapes loaded and run once, through the real workers."""
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        window.load_model("demo:shapes", run=True)
    assert done.args == ["ok"]
    return window


@pytest.fixture(autouse=True)
def _no_task_outlives_its_test():
    """Whatever a test started in a worker thread is cancelled and waited for when it ends:
    a layout or load left running crosses into the next test, or holds up the process's exit."""
    yield
    from gradexplorer_app import run_worker

    assert run_worker.shutdown_all(60.0), "a task of this test was still running 60 s after it was cancelled"


@pytest.fixture(autouse=True)
def _throwaway_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADEXPLORER_SETTINGS", str(tmp_path / "settings.ini"))
    yield


@pytest.fixture
def shown_errors(monkeypatch):
    """Replace the error dialog: every error shown is appended here instead."""
    from gradexplorer_app.window import error_dialog

    errors = ShownErrors()

    def record(parent, title, exc, **offered):
        errors.append((title, exc))
        errors.offered.append(offered)

    monkeypatch.setattr(error_dialog, "show_error", record)
    return errors


class ShownErrors(list):
    """``(title, exception)`` of each error shown; ``offered``: the buttons and words with each."""

    def __init__(self) -> None:
        super().__init__()
        self.offered: list[dict] = []


@pytest.fixture(autouse=True)
def _no_modal_dialogs(monkeypatch):
    """A test that reaches a real modal dialog fails instead of hanging."""
    from gradexplorer_app import dialogs

    def refuse(*args, **kwargs):
        raise AssertionError("a modal dialog was opened in a test; monkeypatch gradexplorer_app.dialogs")

    for name in ("ask_open_files", "ask_open_file", "ask_folder", "ask_save_file", "ask_text",
                 "ask_item", "confirm_trust", "confirm_close_during_run", "ask_factory",
                 "confirm_skip_unreadable", "run_modal"):
        monkeypatch.setattr(dialogs, name, refuse)
    yield


@pytest.fixture
def app_look():
    """The application's own look (style sheet, font, palette, style), as ``launch`` sets it;
    the test application's again afterwards."""
    import pyqtgraph as pg
    from PySide6.QtGui import QFont, QPalette
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    options = ("background", "foreground", "antialias", "imageAxisOrder")
    saved = (app.styleSheet(), QFont(app.font()), QPalette(app.palette()), app.style().name(),
             {name: pg.getConfigOption(name) for name in options})
    yield
    app.setStyleSheet(saved[0])
    app.setFont(saved[1])
    app.setPalette(saved[2])
    app.setStyle(saved[3])
    pg.setConfigOptions(**saved[4])
