"""Running long work (captures, model and batch loads, file export) off the GUI thread.

A :class:`TaskRunner` runs one kind of task at a time in a thread pool. Every task gets a
generation number; starting a new one cancels the one before (its cancel flag is set),
and results, errors and progress of an old generation are dropped on arrival, so what
the user sees always comes from the last thing they asked for.

The task is a plain function ``fn(progress, cancel)``: ``progress(stage, done, total)``
may be called from the worker thread (it is delivered to the GUI thread), and
``cancel.is_set()`` says whether to stop (``core`` raises ``CaptureCancelled``).
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QRunnable, QThreadPool, Signal, Slot

from gradexplorer.base.errors import CaptureCancelled

#: ``progress(stage, done, total)``, callable from the worker thread.
Progress = Callable[[str, int, int], None]
#: A task: ``fn(progress, cancel)``, run in a worker thread.
Task = Callable[[Progress, threading.Event], Any]

_pool: QThreadPool | None = None
#: Every task started and not yet returned, whichever runner started it: (cancel, ended).
_running: set[tuple[threading.Event, threading.Event]] = set()
_running_lock = threading.Lock()
#: How long the interpreter's exit waits for tasks still running (a layout or a load that
#: cannot stop mid-call); past it, exit goes on as before.
EXIT_WAIT_S = 30.0


def thread_pool() -> QThreadPool:
    """The pool every runner uses (a few threads: captures, loads and exports can overlap)."""
    global _pool
    if _pool is None:
        _pool = QThreadPool()
        _pool.setMaxThreadCount(4)
        # At exit Qt's pool waits for the tasks still running (the window closed during a
        # graph layout, a kernel shut down during a capture): one that stops only when
        # cancelled held the exit for ever. Cancel them, and wait while the interpreter is
        # still whole rather than during its teardown.
        atexit.register(shutdown_all, EXIT_WAIT_S)
    return _pool


def shutdown_all(timeout_s: float = 10.0) -> bool:
    """Cancel every task of every runner and wait until each has returned (at exit, and
    after each GUI test). True when none is left running."""
    with _running_lock:
        running = list(_running)
    for cancel, _ in running:
        cancel.set()
    end = time.monotonic() + timeout_s
    return all(ended.wait(max(0.0, end - time.monotonic())) for _, ended in running)


def running_tasks() -> int:
    """How many tasks have started (or are queued) and not yet returned, in all runners."""
    with _running_lock:
        return len(_running)


class _JobSignals(QObject):
    progress = Signal(int, str, int, int)
    done = Signal(int, object, float)
    error = Signal(int, object)


class _Job(QRunnable):
    def __init__(self, generation: int, fn: Task, cancel: threading.Event, signals: _JobSignals,
                 ended: threading.Event):
        super().__init__()
        self.generation = generation
        self.fn = fn
        self.cancel = cancel
        self.signals = signals
        self.ended = ended
        self.setAutoDelete(True)

    def run(self) -> None:
        gen = self.generation
        signals = self.signals

        def progress(stage: str, done: int, total: int) -> None:
            _emit(signals.progress, gen, str(stage), int(done), int(total))

        start = time.perf_counter()
        try:
            if self.cancel.is_set():
                raise CaptureCancelled()
            result = self.fn(progress, self.cancel)
        except BaseException as exc:  # noqa: BLE001 - every failure is reported to the GUI
            _emit(signals.error, gen, exc)
        else:
            _emit(signals.done, gen, result, time.perf_counter() - start)
        finally:
            with _running_lock:
                _running.discard((self.cancel, self.ended))
            self.ended.set()


def _emit(signal: Any, *args: object) -> None:
    """Emit from the worker thread unless the receiving side is gone: a window closed (and
    its runner deleted with the signals it owned) while this task still ran has nobody
    left to tell, and the task's end must not print a traceback on the way out."""
    try:
        signal.emit(*args)
    except RuntimeError as exc:  # "Signal source has been deleted"
        if "deleted" not in str(exc):
            raise


class TaskRunner(QObject):
    """Runs one task at a time; the newest wins.

    Signals
    -------
    started(int)
        Generation of the task that began.
    progress(int, str, int, int)
        generation, stage, done, total (current generation only).
    finished(int, object, float)
        generation, result, seconds (current generation only).
    failed(int, object)
        generation, exception (current generation only; not for cancellation).
    cancelled(int)
        The current task stopped because it was cancelled.
    busy_changed(bool)
    """

    started = Signal(int)
    progress = Signal(int, str, int, int)
    finished = Signal(int, object, float)
    failed = Signal(int, object)
    cancelled = Signal(int)
    busy_changed = Signal(bool)

    def __init__(self, name: str = "task", parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.name = name
        self._generation = 0
        self._live: dict[int, tuple[threading.Event, _JobSignals]] = {}
        # Set by each task's thread when it returns: shutdown waits for this runner's own
        # tasks only, never for another runner's (the pool is shared).
        self._ended: dict[int, threading.Event] = {}
        self._busy = False

    @property
    def generation(self) -> int:
        return self._generation

    def is_busy(self) -> bool:
        return self._busy

    def start(self, fn: Task, generation: int | None = None) -> int:
        """Cancel the running task, if any, and start ``fn``. Returns its generation."""
        self.cancel()
        self._generation = generation if generation is not None and generation > self._generation \
            else self._generation + 1
        gen = self._generation
        cancel = threading.Event()
        # Parented to the runner (so dropping the Python reference never deletes it) and
        # deleted later, never inside one of its own signals' slots.
        signals = _JobSignals(self)
        signals.progress.connect(self._on_progress)
        signals.done.connect(self._on_done)
        signals.error.connect(self._on_error)
        self._live[gen] = (cancel, signals)
        ended = self._ended[gen] = threading.Event()
        self._set_busy(True)
        self.started.emit(gen)
        with _running_lock:
            _running.add((cancel, ended))
        thread_pool().start(_Job(gen, fn, cancel, signals, ended))
        return gen

    def cancel(self) -> None:
        """Ask every running task of this runner to stop."""
        for cancel, _ in self._live.values():
            cancel.set()

    def shutdown(self, timeout_ms: int = 10000) -> bool:
        """Cancel this runner's tasks and wait until each has returned (on close and in
        tests). Another runner's tasks are not waited for: waiting on the shared pool
        would wait for work nobody has cancelled yet (a capture, while a window closes)."""
        self.cancel()
        self._generation += 1
        end = time.monotonic() + timeout_ms / 1000
        for gen, ended in list(self._ended.items()):
            if not ended.wait(max(0.0, end - time.monotonic())):
                return False
            self._ended.pop(gen, None)
        return True

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait until no task of this runner is alive (processing queued events)."""
        end = time.monotonic() + timeout_s
        while self._live and time.monotonic() < end:
            QCoreApplication.processEvents()
            time.sleep(0.005)
        return not self._live

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            self.busy_changed.emit(busy)

    def _settle(self, gen: int) -> bool:
        self._ended.pop(gen, None)
        live = self._live.pop(gen, None)
        if live is not None:
            live[1].deleteLater()
        current = gen == self._generation
        if current:
            self._set_busy(False)
        return current

    @Slot(int, str, int, int)
    def _on_progress(self, gen: int, stage: str, done: int, total: int) -> None:
        if gen == self._generation and gen in self._live:
            self.progress.emit(gen, stage, done, total)

    @Slot(int, object, float)
    def _on_done(self, gen: int, result: object, seconds: float) -> None:
        if self._settle(gen):
            self.finished.emit(gen, result, seconds)

    @Slot(int, object)
    def _on_error(self, gen: int, exc: object) -> None:
        if self._settle(gen):
            if isinstance(exc, CaptureCancelled):
                self.cancelled.emit(gen)
            else:
                self.failed.emit(gen, exc)
