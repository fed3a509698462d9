"""Run ▸ Run over folder…: the window's dataset capture (``gradexplorer.pipeline.dataset_job``).

The user picks a folder and answers one small question (batch size, at most how many
samples); a worker runs a :class:`gradexplorer.pipeline.dataset_job.DatasetJob` over a
:class:`gradexplorer.pipeline.job.CaptureJob` of the session's options (its model, checked layers,
target, device and memory budget; statistics only), as the command line's
``capture --batch-size`` does, while the run panel shows the batches done and the ETA and
its Cancel stops the run between two module calls. The merged capture then opens in the
window like any capture, and its per-batch series in a timeline window on request.

Before the batches run, one sample through the model tells the memory the run needs; over
the budget, the run is refused in the window's words (:func:`window_budget_words`: the batch
size of the question, the checked layers), with "Run anyway" and "Smaller batch size…" as
next steps (none when nobody is there to press them), as a single Run over the budget asks.

A run that is cancelled, refused or fails leaves the previous capture shown. Starting a single
Run, loading a model or a batch makes a dataset run in flight stale (cancelled, its
result dropped): what the window shows always comes from the last thing the user asked.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QSpinBox,
    QStatusBar,
    QVBoxLayout,
    QWidget,
)

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.units import format_bytes
from gradexplorer.capturing.data import Capture
from gradexplorer.pipeline.job import CaptureJob
from gradexplorer.pipeline.options import BatchSpec, CaptureOptions
from gradexplorer.pipeline.session import Session
from gradexplorer_app import dialogs
from gradexplorer_app.listeners import listen
from gradexplorer_app.run_worker import Progress, TaskRunner
from gradexplorer_app.window.controller import WindowController
from gradexplorer_app.window.error_dialog import Action
from gradexplorer_app.window.run_panel import RunPanel

if TYPE_CHECKING:  # annotations only (imported on first use)
    from gradexplorer.capturing.memory_estimate import MemoryEstimate, Shortfall
    from gradexplorer.recording.dataset_capture import DatasetStats
    from gradexplorer.recording.shard_blocks import ShardPlan
    from gradexplorer_app.window.timeline_window import TimelineWindow


class RunHost(Protocol):
    """What a run over a folder uses of its window (the main window)."""

    session: Session
    controller: WindowController
    run_panel: RunPanel
    timeline_windows: list[TimelineWindow]

    def statusBar(self) -> QStatusBar: ...

#: The next steps a refusal over the memory budget offers.
RUN_ANYWAY = "Run anyway"
SMALLER_BATCH = "Smaller batch size…"
#: The batch size the question proposes first.
DEFAULT_BATCH_SIZE = 16
#: Largest values the question accepts.
MAX_BATCH_SIZE = 4096
MAX_SAMPLES = 100_000_000


def window_budget_words(estimate: MemoryEstimate, short: Shortfall, _plan: ShardPlan | None) -> tuple[str, str]:
    """The window's refusal of a run over a folder that is over the memory budget: its
    controls (the question's batch size, the checked layers, Run anyway), as the command
    line names its flags (``gradexplorer.pipeline.dataset_job.command_line_words``)."""
    cpu = short.device.type == "cpu"
    where = "of memory" if cpu else f"on {short.device}"
    share = ("the memory budget you set" if short.set_by_user
             else "half of the free RAM" if cpu else "half of its free memory")
    larger = (f", start gradexplorer with a --memory-budget above {format_bytes(short.need)}"
              if short.set_by_user else "")
    problem = (f"this run over the folder needs about {format_bytes(short.need)} {where} "
               f"({estimate.describe()}) but the budget is {format_bytes(short.budget)} ({share});")
    return problem, (f"choose a smaller batch size in the Run over folder question or tick fewer layers in "
                     f"the module tree{larger}, or Run anyway.")


class DatasetRunDialog(QDialog):
    """Batch size and at most how many samples (0: all) for a run over ``folder``."""

    def __init__(self, parent: QWidget | None, folder: str, batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        super().__init__(parent)
        self.setWindowTitle("gradexplorer: run over folder")
        self.batch_spin = QSpinBox(self)
        self.batch_spin.setRange(1, MAX_BATCH_SIZE)
        self.batch_spin.setValue(max(1, min(int(batch_size), MAX_BATCH_SIZE)))
        self.max_spin = QSpinBox(self)
        self.max_spin.setRange(0, MAX_SAMPLES)
        self.max_spin.setSpecialValueText("all")
        self.max_spin.setValue(0)
        note = QLabel("Statistics only: each batch's statistics are merged exactly into the totals "
                      "(mean, std, min, max, NaN/Inf counts, log2 histograms), so memory does not grow "
                      "with the folder. The checked layers, target and device of the Run panel are used.")
        note.setWordWrap(True)
        form = QFormLayout()
        form.addRow("Folder", QLabel(folder))
        form.addRow("Batch size", self.batch_spin)
        form.addRow("At most (samples)", self.max_spin)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Run")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(note)
        layout.addWidget(buttons)

    def values(self) -> tuple[int, int | None]:
        """``(batch_size, max_samples)``; ``None``: every sample."""
        return self.batch_spin.value(), (self.max_spin.value() or None)


def ask_dataset_run(parent: QWidget | None, folder: str, batch_size: int) -> tuple[int, int | None] | None:
    """Run over folder…: ``(batch_size, max_samples or None for all)``, or None when cancelled.

    Looked up on this module at call time, so tests replace it with ``monkeypatch``; the
    dialog itself is shown through :func:`gradexplorer_app.dialogs.run_modal`.
    """
    dialog = DatasetRunDialog(parent, folder, batch_size)
    return dialog.values() if dialogs.run_modal(dialog) else None


class DatasetRun(QObject):
    """The window's "Run over folder…" (see the module docstring).

    Parameters
    ----------
    window : RunHost
        Its session, controller (errors, status), run panel and status bar are used.
    parent : QWidget
        The parent of this object, its questions and its timeline windows (the window).

    Signals
    -------
    done(str)
        ``"ok"``, ``"cancelled"``, ``"failed"`` or ``"stale"`` after each run.

    Attributes
    ----------
    result : Capture or None
        The last dataset capture shown (its per-batch series is the timeline's).
    """

    done = Signal(str)

    def __init__(self, window: RunHost, parent: QWidget) -> None:
        super().__init__(parent)
        self.dialog_parent = parent
        self.window = window
        self.runner = TaskRunner("dataset", self)
        self.result: Capture | None = None
        self._generation = 0
        self._started = 0.0
        #: The folder, batch size and maximum of the last run started (for "Run anyway").
        self._request: tuple[str, int, int | None] | None = None
        self.runner.progress.connect(self._on_progress)
        self.runner.finished.connect(self._on_finished)
        self.runner.failed.connect(self._on_failed)
        self.runner.cancelled.connect(self._on_cancelled)
        s = window.session
        # A newer request wins: the run's hooks would otherwise hold the session's lock.
        s.run_started.connect(self._on_newer_request)
        listen(s.model_changed, self._on_newer_request)
        listen(s.batch_changed, self._on_newer_request)

    # -- starting -----------------------------------------------------------------------
    def run_over_folder(self, folder: str | None = None, batch_size: int | None = None,
                        max_samples: int | None = None, *, force: bool = False,
                        propose: int = DEFAULT_BATCH_SIZE) -> int | None:
        """Ask for a folder and the batch size (unless given), then start the run.

        ``force`` runs even over the memory budget (the refusal's "Run anyway");
        ``propose`` is the batch size the question proposes.
        Returns the task's generation, or ``None`` when nothing was started.
        """
        w = self.window
        s = w.session
        if s.model is None:
            self._refuse(GradExplorerError("no model is loaded;", "choose a model in the Model panel first."))
            return None
        if not s.selection:
            self._refuse(GradExplorerError("no layers are checked;", "tick at least one layer in the module tree."))
            return None
        folder = folder or dialogs.ask_folder(self.dialog_parent, "Run over folder: a folder of images")
        if not folder:
            return None
        if batch_size is None:
            answer = ask_dataset_run(self.dialog_parent, folder, propose)
            if answer is None:
                return None
            batch_size, max_samples = answer
        try:
            w.run_panel.apply_target()
            options = dataclasses.replace(s.capture_options(force=force), batch=BatchSpec(inputs=(str(folder),)),
                                          mode="stats", train=False, input_grad=False)
        except GradExplorerError as exc:
            self._refuse(exc)
            return None
        size, most = int(batch_size), max_samples
        self._request = (str(folder), size, most)
        task = self._task(options, size, most)
        self._generation = s.generation  # a later model, batch or run makes the result stale
        self._started = time.monotonic()
        w.run_panel.set_running(True, "")
        w.statusBar().showMessage(f"Running over {folder} in batches of {size} (statistics only)…")
        return self.runner.start(task)

    def _task(self, options: CaptureOptions, size: int, most: int | None
              ) -> Callable[[Progress, threading.Event], tuple[Capture, DatasetStats]]:
        s = self.window.session
        loaded, lock = s.model, s.run_lock

        def task(progress: Progress, cancel: threading.Event) -> tuple[Capture, DatasetStats]:
            # Imported on first use: a dataset run is not needed to start the window.
            from gradexplorer.pipeline.dataset_job import DatasetJob

            job = CaptureJob(options, progress, cancel, loaded=loaded, lock=lock)
            return DatasetJob(job, size, most, words=window_budget_words).run()

        return task

    def cancel(self) -> None:
        """Stop the run in flight (between two module calls); the capture shown stays."""
        self.runner.cancel()

    def is_busy(self) -> bool:
        return self.runner.is_busy()

    def _refuse(self, exc: GradExplorerError) -> None:
        self.window.controller.show_error("Cannot run over a folder", exc)
        self.done.emit("failed")

    # -- following the worker ----------------------------------------------------------------
    def _on_newer_request(self, *_args: object) -> None:
        if self.runner.is_busy():
            self.runner.cancel()

    def _on_progress(self, _gen: int, _stage: str, done: int, total: int) -> None:
        # Imported on first use: a dataset run is not needed to start the window.
        from gradexplorer.recording.dataset_capture import eta_text

        self.window.run_panel.show_progress(done, total, eta_text(done, total, self._started))

    def _idle(self, message: str) -> None:
        # A single Run that made this one stale owns the run panel now.
        if not self.window.controller.run_runner.is_busy():
            self.window.run_panel.set_running(False, message)

    def _on_finished(self, _gen: int, result: tuple[Capture, DatasetStats], seconds: float) -> None:
        cap, stats = result
        s = self.window.session
        if s.generation != self._generation:
            self._idle("stale")
            self.done.emit("stale")
            return
        self.result = cap
        s.open_capture(cap, None)
        s.last_run_seconds = seconds
        self._idle(f"done in {seconds:.1f} s")
        self.window.statusBar().showMessage(
            f"Captured {stats.samples} samples in {stats.batches} batches in {seconds:.1f} s (statistics only). "
            "Run ▸ Timeline of the dataset run shows each batch.", 15000)
        self.done.emit("ok")

    def _on_failed(self, _gen: int, exc: BaseException) -> None:
        # Imported on first use: a dataset run is not needed to start the window.
        from gradexplorer.pipeline.dataset_job import DatasetOverBudget

        if isinstance(exc, DatasetOverBudget):
            self._idle("over the memory budget")
            self.window.controller.show_error("Over the memory budget", exc, actions=self._budget_actions())
        else:
            self._idle("failed")
            self.window.controller.show_error("The run over the folder failed", exc)
        self.done.emit("failed")

    def _budget_actions(self) -> list[Action]:
        """The next steps of a refusal over the budget: the same run forced, or the question
        again with half the batch size proposed; none when nobody is there to press them."""
        if self.window.controller.unattended or self._request is None:
            return []
        folder, size, most = self._request
        return [(RUN_ANYWAY, lambda: self.run_over_folder(folder, size, most, force=True)),
                (SMALLER_BATCH, lambda: self.run_over_folder(folder, propose=max(1, size // 2)))]

    def _on_cancelled(self, _gen: int) -> None:
        self._idle("cancelled")
        self.window.statusBar().showMessage("Run over the folder cancelled; the previous capture is still shown.",
                                            8000)
        self.done.emit("cancelled")

    # -- the timeline ----------------------------------------------------------------------------
    def open_timeline(self) -> TimelineWindow | None:
        """The per-batch series of the last dataset run, in a timeline window."""
        if self.result is None:
            return None
        # Imported on first use: the timeline's modules are not needed to start the window.
        from gradexplorer_app.window.timeline_window import TimelineWindow

        window = TimelineWindow.of_capture(self.result, "dataset run", self.dialog_parent)
        self.window.timeline_windows.append(window)
        window.show()
        return window

    def shutdown(self) -> None:
        self.runner.cancel()
