"""Starting the desktop app: ``launch(...)`` is what ``gradexplorer`` (no subcommand) calls."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QTimer

from gradexplorer.pipeline.options import CaptureOptions
from gradexplorer_app.window.application import setup_application
from gradexplorer_app.window.main_window import MainWindow
from gradexplorer_app.window.screenshot import save_screenshot

SCREENSHOT_TIMEOUT_MS = 300_000


def launch(options: CaptureOptions | None = None, run: bool = False, screenshot: str | None = None,
           capture: str | None = None) -> int:
    """Open the window and run the event loop; returns the exit code.

    Parameters
    ----------
    options : CaptureOptions, optional
        What to load and how to run: the options the ``capture`` command builds from the
        same flags (``gradexplorer_app.cli.common.capture_options``). The window loads their model, batch
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
        # Imported on first use: the demos are not needed when options name a model.
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
                if not save_screenshot(window, shot_path, [capture]):
                    exit_code["code"] = 1
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
                             run=run, labels=options.labels, hf_class=options.hf_class, tokenizer=options.tokenizer)


def main() -> int:  # pragma: no cover - convenience for `python -m gradexplorer_app.window.launch`
    return launch()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
