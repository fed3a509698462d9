"""``gradexplorer timeline RUN.gxw|DATASET.pt``: the timeline view in a window of its own."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import QMainWindow, QWidget

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.data import Capture
from gradexplorer.recording.watch_log import is_watch_log
from gradexplorer_app.views.timeline_view import TimelineView
from gradexplorer_app.window.application import setup_application
from gradexplorer_app.window.screen_fit import keep_on_screen
from gradexplorer_app.window.screenshot import save_screenshot

#: The file filter of "Open timeline…".
TIMELINE_FILTER = "Watch logs and dataset captures (*.gxw *.pt);;All files (*)"


class TimelineWindow(QMainWindow):
    """A window holding one :class:`TimelineView` on a watch log or a dataset capture."""

    def __init__(self, path: str | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.view = TimelineView()
        self.setCentralWidget(self.view)
        self.resize(1400, 900)
        self._build_menu(standalone=parent is None)
        keep_on_screen(self)
        if path is None:
            return
        p = Path(path)
        self.setWindowTitle(f"gradexplorer timeline: {p.name}")
        if p.suffix == ".gxw" or is_watch_log(p):
            self.view.open_log(str(p))
        else:
            self.view.open_capture(str(p))

    @classmethod
    def of_capture(cls, cap: Capture, name: str, parent: QWidget | None = None) -> TimelineWindow:
        """A timeline window on a dataset capture in memory (no file)."""
        window = cls(None, parent)
        window.setWindowTitle(f"gradexplorer timeline: {name}")
        window.view.show_capture(cap, name)
        return window

    def _build_menu(self, standalone: bool) -> None:
        menu = self.menuBar().addMenu("&File")
        self.close_action = QAction("&Close", self)
        # Ctrl+W, and Esc: the window is a look at a log, with nothing to lose by closing it.
        self.close_action.setShortcuts([QKeySequence("Ctrl+W"), QKeySequence("Esc")])
        self.close_action.triggered.connect(self.close)
        menu.addAction(self.close_action)
        if standalone:
            # Opened from the main window, its Ctrl+Q (an application shortcut) quits; a
            # second Ctrl+Q here would make both ambiguous, and neither would fire.
            self.quit_action = QAction("&Quit", self)
            self.quit_action.setShortcut(QKeySequence("Ctrl+Q"))
            self.quit_action.triggered.connect(self.close)
            menu.addAction(self.quit_action)

    def closeEvent(self, event: QCloseEvent) -> None:
        self.view.shutdown()
        super().closeEvent(event)


def launch_timeline(path: str, screenshot: str | None = None, select: str | None = None) -> int:
    """Open the timeline of ``path`` (a watch log or a dataset capture) and run the event loop.

    With ``screenshot``, save the window once the data is drawn, then quit.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise GradExplorerError(f"'{path}' does not exist;", "give a watch log (.gxw) or a dataset capture (.pt).")
    app = setup_application()
    window = TimelineWindow(str(p))
    view = window.view
    status = {"code": 0}

    if screenshot:
        shots = {"n": 0}

        def on_update() -> None:
            shots["n"] += 1
            if shots["n"] == 1 and select:
                view.select_layer(select)

            def grab() -> None:
                if not save_screenshot(window, screenshot, [str(p)]):
                    status["code"] = 1
                view.shutdown()
                app.quit()

            # The histograms are read by the worker after the first draw: give them a moment.
            QTimer.singleShot(1500, grab)

        view.updated.connect(on_update)

    def on_failed(message: str) -> None:
        if screenshot:
            # Nobody sees the window's status line: the reason goes where the command's
            # messages go, and the command exits 1.
            print(f"error: {message}", file=sys.stderr)
            status["code"] = 1
            app.quit()

    view.failed.connect(on_failed)
    window.show()
    app.exec()
    view.shutdown()
    return status["code"]
