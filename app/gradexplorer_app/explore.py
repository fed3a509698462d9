"""``gradexplorer.explore``: the window on the model and batch the caller already holds.

napari's habit (``napari.view_image(array)``) for gradients: a notebook or a script hands
over its live ``nn.Module`` and batch, and the same window the ``gradexplorer`` command
opens shows them, in the same process. Nothing is loaded and no trust is asked (the code
is the caller's own and has already run); the model is left as it was (every capture
removes its hooks and restores modes, BatchNorm statistics, ``.grad`` and device).

How it returns depends on who is running Qt's event loop, as napari decides it:

* from a script (no event loop running) it runs the loop and returns when the window is
  closed, like ``napari.run()``;
* from IPython or Jupyter it turns on the Qt event loop integration (``%gui qt``) when it
  is not on yet, and returns the window at once; the notebook stays usable and the window
  lives alongside it;
* called from inside a running Qt application (a slot, a pytest-qt test) it returns at once.

``block=True`` or ``block=False`` overrides the choice. With ``screenshot``, the window is
saved as PNG once the run has rendered (or failed with its message shown), closed, and the
call returns, in every case.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradexplorer.base.errors import GradExplorerError

if TYPE_CHECKING:
    from gradexplorer_app.window.main_window import MainWindow

__all__ = ["explore"]

#: Longest wait for a screenshot's run (a large model on the CPU), in milliseconds.
SCREENSHOT_TIMEOUT_MS = 300_000

# Windows opened without blocking: Python holds them here, or a notebook cell that drops
# the returned window would let it be collected and vanish from the screen.
_open_windows: list[MainWindow] = []


def _ipython_shell() -> Any:
    module = sys.modules.get("IPython")
    get = getattr(module, "get_ipython", None) if module is not None else None
    return get() if callable(get) else None


def _qt_integration_on(shell: Any) -> bool:
    """Whether IPython ``shell`` runs Qt's event loop between cells (``%gui qt``)."""
    return str(getattr(shell, "active_eventloop", None) or "").startswith("qt")


#: How often, in a Jupyter kernel, the Qt loop looks whether the kernel's own loop has work
#: waiting (milliseconds): the longest a notebook cell can wait behind Qt ("_hand_back").
KERNEL_HAND_BACK_MS = 100

# The timer that hands the Qt loop back to the kernel: one per process, made by the first
# ``explore`` in a Jupyter kernel. It ticks only while Qt's loop runs there.
_hand_back_timer: Any = None


def _asyncio_has_work(loop: Any) -> bool:
    """True when the asyncio ``loop`` has callbacks ready or a timer due, and when its queues
    cannot be read (a loop other than CPython's own, which keeps them in ``_ready`` and
    ``_scheduled``): then the Qt loop hands back at every tick."""
    ready, scheduled = getattr(loop, "_ready", None), getattr(loop, "_scheduled", None)
    if ready is None or scheduled is None or not hasattr(loop, "time"):
        return True
    return bool(ready) or (bool(scheduled) and scheduled[0].when() <= loop.time())


def _hand_back_to_kernel(shell: Any) -> None:
    """In a Jupyter kernel (ipykernel) whose Qt loop integration is on, have the Qt loop
    hand control back to the kernel's asyncio loop whenever that has work waiting, looked
    at every :data:`KERNEL_HAND_BACK_MS`.

    Why: ipykernel runs Qt's event loop from inside one of its asyncio tasks and leaves it
    only when a new message reaches the shell socket. A request that the kernel's asyncio
    side took off the socket just before the Qt loop was entered waits in asyncio's queue
    until then, and so does an asyncio task of the notebook's: the cell stays queued,
    neither busy nor answered, until another message comes (ipykernel 7.4 with pyzmq 27;
    reported upstream for asyncio tasks under ``%gui qt``). Measured with cells sent back
    to back and nothing else: without this, a cell stalled in eight kernels of ten (at the
    2nd to the 604th cell; six with a window open, two after it was closed); with it, none
    in four kernels of 1,500 cells each. The exit is ipykernel's own (``_schedule_exit``,
    which the kernel uses when asyncio has a timer due); the kernel enters the Qt loop
    again 1 ms later.

    ``explore`` turns the integration on and leaves it on, so this stays for the kernel's
    life; it ticks only while Qt's loop runs. Elsewhere (a terminal IPython, a script,
    another kernel or integration) nothing is installed.
    """
    global _hand_back_timer
    kernel = getattr(shell, "kernel", None)
    if kernel is None or _hand_back_timer is not None:
        return
    from PySide6.QtCore import QCoreApplication, QTimer

    def hand_back() -> None:
        schedule_exit = getattr(getattr(kernel, "eventloop", None), "_schedule_exit", None)
        if not callable(schedule_exit) or not getattr(getattr(kernel, "app", None), "_in_event_loop", False):
            return  # not in ipykernel's Qt loop now (a cell is running, or Qt is not the integration)
        if _asyncio_has_work(getattr(getattr(kernel, "io_loop", None), "asyncio_loop", None)):
            schedule_exit(0)

    timer = QTimer(QCoreApplication.instance())
    timer.setObjectName("gradexplorer-kernel-hand-back")
    timer.timeout.connect(hand_back)
    timer.start(KERNEL_HAND_BACK_MS)
    _hand_back_timer = timer


def _event_loop_running() -> bool:
    """True when the caller's process already runs Qt's event loop, or will between
    cells: IPython's ``%gui qt`` (turned on here when it is off, as napari does), or a
    Qt event loop that is running this very call (a slot, a test)."""
    from PySide6.QtCore import QThread

    shell = _ipython_shell()
    if shell is not None and hasattr(shell, "enable_gui"):
        if _qt_integration_on(shell):
            return True
        try:
            shell.enable_gui("qt")
        except Exception:  # noqa: BLE001 - no integration (a plain Python shell, no display): block instead
            return False
        return _qt_integration_on(shell)
    thread = QThread.currentThread()
    return thread is not None and thread.loopLevel() > 0


@dataclass
class _Outcome:
    """How a screenshot's run ended."""

    done: bool = False
    ok: bool = True
    error: GradExplorerError | None = None


def _keep_until_closed(window: MainWindow) -> None:
    """Hold ``window`` until the user closes it, then let it (and the model it shows) go."""
    from PySide6.QtCore import QEvent, QObject

    class _ForgetOnClose(QObject):
        def eventFilter(self, watched: QObject, event: QEvent) -> bool:
            if event.type() == QEvent.Type.Close and watched in _open_windows:
                _open_windows.remove(watched)
            return False

    watcher = _ForgetOnClose(window)
    window.installEventFilter(watcher)
    _open_windows.append(window)


def _check_screenshot(path: str | os.PathLike[str] | None, inputs: Sequence[str] = ()) -> str | None:
    if path is None:
        return None
    from gradexplorer.base.file_write import check_output_path

    target = str(Path(path).expanduser())
    # The capture file shown, a folder, a device, a FIFO: said now, before a window opens.
    check_output_path(target, list(inputs))
    return target


def _save_png(window: MainWindow, path: str, inputs: Sequence[str] = ()) -> None:
    """The window as PNG, through the writer every export uses (atomic; never over a file
    the window read, a folder, a device or a FIFO)."""
    from gradexplorer_app.views.export import png_bytes, write_export

    write_export(png_bytes(window), path, inputs)


def explore(model: Any = None, inputs: Any = None, *, layers: str | Sequence[str] | None = None,
            target: str = "top1", labels: Any = None, device: str | None = None, mode: str = "full",
            train: bool = False, input_grad: bool = False, autocast: str | None = None,
            memory_budget: int | None = None, name: str | None = None, categories: Sequence[str] | None = None,
            tokenizer: Any = None, run: bool = True, screenshot: str | os.PathLike[str] | None = None,
            block: bool | None = None) -> MainWindow:
    """Open the window on a live model and its batch (or on a capture).

    Parameters
    ----------
    model : nn.Module, Capture or path
        The model to explore, used as it is (not copied, not moved). A ``Capture``
        (``gradexplorer.capture(...)``, ``gradexplorer.load_capture(...)``) or the path of
        a ``.pt`` capture file opens that capture instead; ``inputs`` and the run options
        are then not used.
    inputs : Tensor, tuple, list, dict or text, optional
        What the model is called with: ``model(x)``, ``model(*inputs)`` or
        ``model(**inputs)`` (a tokenizer's output too), the batch first in every tensor;
        with a ``tokenizer``, also a string or a list of strings, one sample each. Without
        inputs the window opens on the model and its Input batch panel loads pictures or
        tensor files.
    layers, target, labels, device, mode, train, input_grad, autocast, memory_budget
        As the ``capture`` command's flags (``--layers``, ``--target``, ``--labels``,
        ``--device``, ``mode="stats"`` for ``--stats-only``, ``--train``,
        ``--input-grad``, ``--autocast``, ``--memory-budget``). ``labels`` may also be
        class indices, one per sample; ``device`` defaults to the model's own.
    name : str, optional
        The model's name in the window (its class name by default).
    categories : sequence of str, optional
        Class names, index-aligned with the logits (a Hugging Face classifier's own by
        default).
    tokenizer : optional
        The model's Hugging Face tokenizer: text is tokenised as ``--text`` is, the token
        strings are shown on the saliency bars and heatmap rows, and the batch panel
        takes text.
    run : bool
        Run a capture as soon as the model is ready (with ``inputs``).
    screenshot : str or path, optional
        Save the window as PNG once the run has rendered, close it and return (as
        ``gradexplorer --screenshot``). Nobody is there to answer questions: each is
        refused, with its message on stderr.
    block : bool, optional
        Run the event loop until the window closes (True) or return at once (False).
        By default: block from a script, return at once under IPython/Jupyter or inside
        a running Qt application.

    Returns
    -------
    MainWindow
        The window. ``window.session.capture`` is the last capture shown (also after the
        window was closed); ``window.run()`` runs again.

    Raises
    ------
    GradExplorerError
        A bad argument, before any window opens; with ``screenshot``, a run or a capture
        that failed (its message is on the saved window too).
    """
    from gradexplorer.pipeline.live import LiveOptions

    options = LiveOptions(layers=layers, target=target, labels=labels, device=device, mode=mode, train=train,
                          input_grad=input_grad, autocast=autocast, memory_budget=memory_budget)
    shown = _what_to_show(model, inputs, options, name=name, categories=categories, tokenizer=tokenizer)
    shot = _check_screenshot(screenshot, shown.read)

    # Qt is imported on first use: ``gradexplorer.explore`` is reachable from a bare
    # ``import gradexplorer``, which loads neither torch nor Qt.
    from gradexplorer_app.window.application import setup_application

    # Decided before the application exists: IPython's Qt integration makes its own
    # QApplication when it is turned on here, and it must be the one the window uses.
    nonblocking = (not block) if block is not None else _event_loop_running()
    app = setup_application()
    window = _new_window(shot)
    if shot is not None:
        return _screenshot(app, window, shown, shot, run)
    _show(window, shown, run)
    if nonblocking:
        _keep_until_closed(window)
        shell = _ipython_shell()
        if shell is not None and _qt_integration_on(shell):
            _hand_back_to_kernel(shell)
        return window
    app.exec()
    window.shutdown()
    return window


@dataclass
class _Shown:
    """What the window opens on: a capture, a capture file, or a live model (``request``)."""

    capture: Any = None  # a Capture
    capture_path: str | None = None
    request: Any = None  # a gradexplorer.pipeline.live.LiveRequest

    @property
    def read(self) -> list[str]:
        """The files the window reads (never a screenshot's path)."""
        return [self.capture_path] if self.capture_path is not None else []


def _what_to_show(model: Any, inputs: Any, options: Any, **about: Any) -> _Shown:
    """``model`` checked and told apart: a capture, a capture file that exists, or a live model
    with its batch and options (``about``: its name, categories and tokenizer)."""
    from gradexplorer.capturing.data import Capture
    from gradexplorer.pipeline.live import live_request

    if isinstance(model, Capture):
        return _Shown(capture=model)
    if isinstance(model, (str, os.PathLike)):
        capture_path = str(Path(model).expanduser())
        if not Path(capture_path).exists():
            raise GradExplorerError(
                f"there is no capture file '{capture_path}';",
                "pass the path of a .pt capture, a Capture object or the nn.Module itself; to open a model "
                f"by name, run `gradexplorer --model {model}` or load it with gradexplorer.load_model.")
        return _Shown(capture_path=capture_path)
    if model is None:
        raise GradExplorerError("gradexplorer.explore needs a model (or a capture) to show;",
                                "call gradexplorer.explore(model, x), gradexplorer.explore(capture) or "
                                "gradexplorer.explore('capture.pt').")
    return _Shown(request=live_request(model, inputs, options, **about))


def _new_window(shot: str | None) -> MainWindow:
    """The main window, shown; for a screenshot, at a fixed size and asking nobody anything."""
    from gradexplorer_app.window.main_window import MainWindow

    window = MainWindow(restore_geometry=shot is None)
    window.controller.unattended = shot is not None
    if shot is not None:
        window.resize(1500, 950)
    window.show()
    window.raise_()
    return window


def _show(window: MainWindow, shown: _Shown, run: bool) -> None:
    """Open the capture, the capture file, or the live model (running it when asked and a
    batch is there)."""
    if shown.capture is not None:
        window.controller.show_capture(shown.capture)
    elif shown.capture_path is not None:
        window.open_capture(shown.capture_path)
    else:
        request = shown.request
        assert request is not None
        try:
            window.session.apply_options(request.options)
        except GradExplorerError as exc:  # a device this machine lacks: said in the window
            window.show_error("A setting cannot be used", exc)
        window.run_panel.sync_from_session()
        window.controller.show_live(request.loaded, request.batch, request.options,
                                    run=run and request.batch is not None)


def _screenshot(app: Any, window: MainWindow, shown: _Shown, shot: str, run: bool) -> MainWindow:
    """Show, wait until the run has rendered (or failed, or timed out), save the window as
    PNG, close it; raise when it did not finish."""
    from PySide6.QtCore import QEventLoop, QTimer

    outcome = _Outcome()
    loop = QEventLoop()

    def finished(ok: bool) -> None:
        if outcome.done:
            return
        outcome.done, outcome.ok = True, ok

        def grab() -> None:
            # The loop is left whatever happens here: an exception in a timer's callback is
            # only printed by Qt, and a loop nobody quits waits forever.
            try:
                app.processEvents()
                _save_png(window, shot, shown.read)
            except GradExplorerError as exc:
                outcome.error = exc
            except Exception as exc:  # noqa: BLE001 - a bug, but the caller gets it, not a hang
                outcome.error = GradExplorerError(f"the window could not be saved to {shot}: {exc!r};",
                                                  "report this with the message; gradexplorer.capture(model, x) "
                                                  "gives the capture without the window.")
            finally:
                window.close()
                loop.quit()

        QTimer.singleShot(600, grab)  # let the plots finish drawing

    c = window.controller
    if shown.capture is not None or shown.capture_path is not None:
        c.file_done.connect(lambda kind: finished(kind == "open"))
    elif shown.request is not None and shown.request.batch is not None and run:
        c.run_done.connect(lambda result: finished(result == "ok"))
    else:
        c.model_loaded.connect(lambda _spec: finished(True))
        c.run_done.connect(lambda result: finished(result == "ok"))
    QTimer.singleShot(SCREENSHOT_TIMEOUT_MS, lambda: finished(False))
    _show(window, shown, run)
    if not outcome.done or window.isVisible():
        loop.exec()  # a local loop: returns in a script and inside a running app alike
    window.shutdown()
    if outcome.error is not None:
        raise outcome.error
    if not outcome.ok:
        raise GradExplorerError(f"the run did not finish (the window was saved to {shot} with its message);",
                                "see the message on stderr, or run gradexplorer.capture(model, x) for "
                                "the traceback.")
    return window
