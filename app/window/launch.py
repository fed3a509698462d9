"""Starting the desktop app: ``launch(...)`` is what ``gradexplorer`` (no subcommand) calls."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtGui import QColor, QFont, QPalette
from PySide6.QtWidgets import QApplication

from gradexplorer.app.window.main_window import MainWindow
from gradexplorer.pipeline.options import CaptureOptions

SCREENSHOT_TIMEOUT_MS = 300_000

STYLE_SHEET = """
QGroupBox { font-weight: 600; border: 1px solid #d6dae1; border-radius: 6px; margin-top: 10px;
            padding: 6px 6px 4px 6px; background: #ffffff; }
QGroupBox::title { subcontrol-origin: margin; left: 10px; padding: 0 4px; color: #374151; }
QTabWidget::pane { border: 1px solid #d6dae1; border-radius: 6px; background: #ffffff; top: -1px; }
QTabBar::tab { padding: 6px 14px; border: 1px solid #d6dae1; border-bottom: none; background: #eef1f5;
               border-top-left-radius: 5px; border-top-right-radius: 5px; margin-right: 2px; color: #374151; }
QTabBar::tab:selected { background: #ffffff; color: #111827; font-weight: 600; }
QPushButton#runButton, QPushButton#primaryButton { background: #2563eb; color: white; border: 1px solid #1d4ed8;
               border-radius: 5px; font-weight: 600; padding: 5px 14px; }
QPushButton#runButton:hover, QPushButton#primaryButton:hover { background: #1d4ed8; }
QPushButton#runButton:disabled, QPushButton#primaryButton:disabled { background: #93b4ee; border-color: #93b4ee; }
QLabel#hint { color: #6b7280; font-size: 9pt; }
QLabel#treeSummary { color: #4b5563; font-size: 9pt; padding: 2px; }
QLabel#currentModel { padding: 4px 2px; }
QStatusBar { background: #eef1f5; border-top: 1px solid #d6dae1; }
QStatusBar QLabel { color: #374151; border-left: 1px solid #d6dae1; }
QTreeView, QListWidget, QTreeWidget { border: 1px solid #d6dae1; border-radius: 4px; background: #ffffff;
               alternate-background-color: #f7f9fb; }
QHeaderView::section { background: #f3f5f8; border: none; border-right: 1px solid #e3e6eb;
               border-bottom: 1px solid #d6dae1; padding: 4px 6px; color: #374151; font-weight: 600; }
QSplitter::handle { background: transparent; }
QProgressBar { border: 1px solid #d6dae1; border-radius: 4px; background: #f3f5f8; text-align: center; height: 16px; }
QProgressBar::chunk { background: #60a5fa; border-radius: 3px; }
"""


def _palette() -> QPalette:
    p = QPalette()
    window = QColor("#f4f6f9")
    p.setColor(QPalette.ColorRole.Window, window)
    p.setColor(QPalette.ColorRole.WindowText, QColor("#111827"))
    p.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.AlternateBase, QColor("#f7f9fb"))
    p.setColor(QPalette.ColorRole.Text, QColor("#111827"))
    p.setColor(QPalette.ColorRole.Button, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.ButtonText, QColor("#111827"))
    p.setColor(QPalette.ColorRole.Highlight, QColor("#cfe0fb"))
    p.setColor(QPalette.ColorRole.HighlightedText, QColor("#0b1f44"))
    p.setColor(QPalette.ColorRole.ToolTipBase, QColor("#ffffff"))
    p.setColor(QPalette.ColorRole.ToolTipText, QColor("#111827"))
    p.setColor(QPalette.ColorRole.PlaceholderText, QColor("#9ca3af"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, QColor("#9ca3af"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, QColor("#9ca3af"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.WindowText, QColor("#9ca3af"))
    return p


def setup_application(argv: list[str] | None = None) -> QApplication:
    """The QApplication with gradexplorer's look (created once; reused when it exists)."""
    import pyqtgraph as pg

    pg.setConfigOptions(imageAxisOrder="row-major", antialias=True, background="w", foreground="k")
    app = QApplication.instance()
    if app is None:
        app = QApplication(argv if argv is not None else [sys.argv[0]])
    app.setApplicationName("gradexplorer")
    app.setOrganizationName("gradexplorer")
    app.setStyle("Fusion")
    app.setPalette(_palette())
    font = QFont(app.font())
    if font.pointSizeF() < 9.5:
        font.setPointSizeF(9.5)
    app.setFont(font)
    app.setStyleSheet(STYLE_SHEET)
    return app


def launch(options: CaptureOptions | None = None, run: bool = False, screenshot: str | None = None,
           capture: str | None = None) -> int:
    """Open the window and run the event loop; returns the exit code.

    Parameters
    ----------
    options : CaptureOptions, optional
        What to load and how to run: the options the ``capture`` command builds from the
        same flags (``gradexplorer.app.cli.main.capture_options``). The window loads their model, batch
        (the default for the model when none is named: ``gradexplorer.pipeline.job.default_batch_spec``)
        and layers, and takes their run settings (``Session.apply_options``). Without
        options the built-in demo ``demo:shapes`` is loaded with its sample pictures and
        run once (offline).
    run : bool
        Run once the model is loaded.
    screenshot : str, optional
        Save the window as PNG once the run has rendered (or failed with a message
        shown), then quit. Exit code 0 when the run succeeded, 1 otherwise. Nobody is
        there to answer questions: each is refused, with its message on stderr.
    capture : str, optional
        Open this capture file instead of loading a model (``gradexplorer CAPTURE.pt``);
        ``options`` and ``run`` are then ignored.
    """
    if options is None and capture is None:
        from gradexplorer.models.demos import WINDOW_DEMO

        options, run = CaptureOptions(WINDOW_DEMO), True
    app = setup_application()
    window = MainWindow(restore_geometry=not screenshot)
    window.controller.unattended = bool(screenshot)  # never wait on a question nobody sees
    want_run = run
    if screenshot:
        window.resize(1500, 950)
    window.show()

    exit_code = {"code": 0}
    if screenshot:
        shot_path = str(Path(screenshot).expanduser())
        done = {"taken": False}

        def take(ok: bool) -> None:
            if done["taken"]:
                return
            done["taken"] = True
            exit_code["code"] = 0 if ok else 1

            def grab() -> None:
                app.processEvents()
                Path(shot_path).parent.mkdir(parents=True, exist_ok=True)
                window.grab().save(shot_path, "PNG")
                window.close()
                app.quit()

            # Let plots finish drawing before grabbing.
            QTimer.singleShot(600, grab)

        if capture is not None:
            window.file_done.connect(lambda kind: take(kind == "open"))
        elif want_run:
            window.run_done.connect(lambda outcome: take(outcome == "ok"))
        else:
            window.model_loaded.connect(lambda _spec: take(True))
            window.run_done.connect(lambda outcome: take(outcome == "ok"))
        QTimer.singleShot(SCREENSHOT_TIMEOUT_MS, lambda: take(False))

    if capture is not None:
        window.open_capture(capture)
    else:
        assert options is not None
        start(window, options, want_run)
    code = app.exec()
    window.shutdown()
    return exit_code["code"] if screenshot else code


def start(window: MainWindow, options: CaptureOptions, run: bool = False) -> int:
    """Give an open window the options: their run settings at once, then their model,
    batch and layers (loaded in a worker), and a run when asked. Returns the load's
    generation.

    A setting this machine refuses (a device that is not here) is shown in the window,
    which still opens.
    """
    try:
        window.session.apply_options(options)
    except Exception as exc:  # noqa: BLE001 - shown; the window stays usable
        window.show_error("A setting cannot be used", exc)
    window.run_panel.sync_from_session()
    return window.load_model(options.model, weights=options.weights, arch=options.arch, trust=options.trust,
                             inputs=options.batch.sources() or None, layers=list(options.layers) or None,
                             run=run, labels=options.labels)


def main() -> int:  # pragma: no cover - convenience for `python -m gradexplorer.app.window.launch`
    return launch()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
