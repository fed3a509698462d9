"""The window's controller: the session, the view state, the workers, and the decisions
between them (what to load, when to run, which layer and view to open on).

``WindowController`` owns no widget. The window hands it the collaborators it asks
questions of (a parent for dialogs, the run settings that know the memory estimate) and
listens to its signals to update panels: busy states, progress, status messages, the
capture to show, the view to bring forward. Every long step runs in a ``TaskRunner``
worker; the UI thread never runs forward, backward, ``torch.load`` or ``torch.save``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QWidget

from gradexplorer import models  # lazy: models.loading (torchvision) on first use
from gradexplorer.analysis.capture_summary import block_call, input_shape_of, summarize
from gradexplorer.analysis.gradcam import cam_supported
from gradexplorer.base import devices
from gradexplorer.base.errors import (
    CaptureCancelled,
    GradExplorerError,
    TrustRequired,
    UnreadableImages,
    WeightsUnavailable,
)
from gradexplorer.base.file_write import check_output_path
from gradexplorer.capturing.data import Capture
from gradexplorer.capturing.inputs import Batch
from gradexplorer.capturing.memory_estimate import MemoryEstimate
from gradexplorer.capturing.module_tree import ModuleTree
from gradexplorer.capturing.targets import class_axis_note
from gradexplorer.files.capture_file import load_capture, save_capture
from gradexplorer.models.loaded_model import LoadedModel as Model
from gradexplorer.models.tokenizer import takes_a_tokenizer
from gradexplorer.pipeline.job import STAGE_PROBE, CaptureJob, default_batch_spec, probe_model
from gradexplorer.pipeline.live import is_live
from gradexplorer.pipeline.options import TEXT_SOURCE, BatchSpec, CaptureOptions
from gradexplorer.pipeline.session import PreparedModel, Session, probe_failed_message
from gradexplorer.pipeline.view_state import ViewState, clamp
from gradexplorer_app import dialogs
from gradexplorer_app.listeners import listen
from gradexplorer_app.run_worker import Progress, Task, TaskRunner
from gradexplorer_app.window import error_dialog
from gradexplorer_app.window.model_panel import ModelRequest
from gradexplorer_app.window.settings import AppSettings

if TYPE_CHECKING:  # annotations only: torchvision is imported in the workers that need it
    from gradexplorer.models.weights import ModelInfo

#: What the file worker hands back: ``("open", capture, path)`` or ``("save", written file, path)``.
FileDone: TypeAlias = tuple[str, Capture | Path, str]


class RunSettings(Protocol):
    """What the controller asks the run settings widgets before a run."""

    def apply_target(self) -> None:
        """Write the target widgets to the session (raises ``GradExplorerError``)."""

    #: Over the budget, keeping statistics only would fit.
    stats_only_fits: bool

    def budget_check(self) -> tuple[MemoryEstimate | None, str | None]:
        """The estimate, and the over-budget warning or ``None``."""


@dataclass
class LoadedModel:
    """What a model load hands back to the UI thread."""

    prepared: PreparedModel
    batch: Batch | None
    sources: list[str]
    batch_error: GradExplorerError | None


def load_model_task(request: ModelRequest, sources: list[str] | None, reuse: list[str],
                    labels: str | None = None) -> Task:
    """The worker's job for loading a model: download weights when needed (cancellable),
    load, pick a batch that fits (the given sources, else the current images, else a
    default), and probe the tree."""

    def task(progress: Progress, cancel: threading.Event) -> LoadedModel:
        # Imported on first use: reading inputs is not needed to start the window.
        from gradexplorer.batches import load_batch

        options = CaptureOptions(request.spec, weights=request.weights, arch=request.arch, trust=request.trust,
                                 batch=BatchSpec.from_sources(sources), labels=labels, hf_class=request.hf_class,
                                 tokenizer=request.tokenizer)
        job = CaptureJob(options, progress, cancel)
        loaded = job.load_model()  # downloads (cancellable, with progress), then loads
        batch, used, error = None, [], None
        if sources:
            try:
                batch, used = job.load_batch(), list(sources)
            except GradExplorerError as exc:
                error = exc
        elif reuse and reuse != ["demo"] and not reuse[0].startswith("random"):
            try:  # the same pictures, preprocessed for the new model
                batch, used = load_batch(reuse, loaded), list(reuse)
            except GradExplorerError:
                batch = None
        if batch is None:
            default = default_batch_spec(loaded)  # core's rule, the CLI's too
            if default is not None:
                batch, used = load_batch(default.sources(), loaded), default.sources()
        progress(STAGE_PROBE, 0, 0)
        prepared = probe_model(loaded, batch.model_input if batch is not None else None,
                               memory_budget=options.memory_budget)
        prepared.options = options
        return LoadedModel(prepared, batch, used, error)

    return task


class WindowController(QObject):
    """Session, view state and workers of one window.

    Parameters
    ----------
    session : Session
    settings : AppSettings
        Recent models and inputs are recorded here.
    view_state : ViewState
        What the views show; the controller picks the layer a new capture opens on.
    dialog_parent : QWidget
        Parent of the questions the controller asks (trust, memory budget, file names).
    run_settings : RunSettings
        Applies the target and tells the memory estimate before a run.

    Signals
    -------
    model_loaded(str)
        A model finished loading (its spec).
    batch_loaded()
    run_done(str)
        ``"ok"``, ``"cancelled"``, ``"failed"`` or ``"stale"`` after each run.
    error_shown(str)
        A message was shown to the user (title: message).
    file_done(str)
        ``"open"``, ``"save"`` or ``"failed"`` after a capture file was read or written.
    status(str, int)
        A status-bar message and how long to show it (ms; 0: until replaced).
    model_busy(bool, str), model_progress(str, int, int)
        A model load started or ended (with a message); its progress.
    run_busy(bool, str), run_progress(str, int, int)
        A run started or ended (with the outcome in words); its progress.
    file_busy(bool)
    capture_shown(object, object)
        The capture (or None) and the batch the views should show.
    view_requested(str)
        The title of the view to bring to the front ("Grad-CAM").
    catalog_ready(object)
        The torchvision model catalog, read in a worker at start.
    block_shown(object)
        ``(block, layer, call)`` when a module that is not recorded itself is shown through
        the last captured call inside it (``shown_for``); ``None`` when that ends.
    """

    model_loaded = Signal(str)
    batch_loaded = Signal()
    run_done = Signal(str)
    error_shown = Signal(str)
    file_done = Signal(str)
    status = Signal(str, int)
    model_busy = Signal(bool, str)
    model_progress = Signal(str, int, int)
    run_busy = Signal(bool, str)
    run_progress = Signal(str, int, int)
    file_busy = Signal(bool)
    capture_shown = Signal(object, object)
    view_requested = Signal(str)
    catalog_ready = Signal(object)
    block_shown = Signal(object)

    STATS_ONLY = "Switch to statistics only"
    RUN_ANYWAY = "Run anyway"

    def __init__(self, session: Session, settings: AppSettings, view_state: ViewState,
                 dialog_parent: QWidget, run_settings: RunSettings) -> None:
        super().__init__(dialog_parent)
        self.session = session
        self.settings = settings
        self.view_state = view_state
        self.dialog_parent = dialog_parent
        self.run_settings = run_settings

        self.run_runner = TaskRunner("run", self)
        self.model_runner = TaskRunner("model", self)
        self.batch_runner = TaskRunner("batch", self)
        self.file_runner = TaskRunner("file", self)
        self.catalog_runner = TaskRunner("catalog", self)
        self._run_after_load = False
        self._pending_layers: list[str] | None = None
        self._pending_inputs: list[str] | None = None
        self._last_model_request: ModelRequest | None = None
        self._shown_first_capture = False
        self._catalog_asked = False
        self._last_inputs: tuple[list[str], str | None] = ([], None)
        #: ``(block, layer, call)``: the block the user picked, which the capture holds no
        #: record of, shown through the last captured call inside it; else None.
        self.shown_for: tuple[str, str, int] | None = None
        # True when nobody is there to answer (``--screenshot``): no question is asked
        # (trust, memory budget); each error is also printed on stderr.
        self.unattended = False

        self.run_runner.progress.connect(lambda g, st, d, t: self.run_progress.emit(st, d, t))
        self.run_runner.finished.connect(self._on_run_finished)
        self.run_runner.failed.connect(self._on_run_failed)
        self.run_runner.cancelled.connect(self._on_run_cancelled)
        self.model_runner.progress.connect(lambda g, st, d, t: self.model_progress.emit(st, d, t))
        self.model_runner.finished.connect(self._on_model_loaded)
        self.model_runner.failed.connect(self._on_model_failed)
        self.model_runner.cancelled.connect(self._on_model_cancelled)
        self.batch_runner.finished.connect(self._on_batch_loaded)
        self.batch_runner.failed.connect(self._on_batch_failed)
        self.file_runner.finished.connect(self._on_file_done)
        self.file_runner.failed.connect(self._on_file_failed)
        self.file_runner.busy_changed.connect(self.file_busy)
        self.catalog_runner.finished.connect(lambda g, catalog, _t: self.catalog_ready.emit(catalog))
        self.catalog_runner.failed.connect(lambda g, e: self.status.emit(
            f"The torchvision model list is not available: {error_dialog.one_line(e)}", 10000))
        listen(session.capture_changed, self._on_model_capture_changed)
        listen(session.batch_changed, self._on_model_batch_changed)
        listen(view_state.events.layer, self._on_model_selection_moved)
        listen(view_state.events.call, self._on_model_selection_moved)

    def start(self) -> None:
        """Read the model catalog in a worker (the model panel's list), once.

        The window asks when its model list is first shown, not at start: the catalog
        imports torchvision (seconds, hundreds of MiB), which the first window and the demo
        do not need."""
        if self._catalog_asked:
            return
        self._catalog_asked = True

        def task(progress: Progress, cancel: threading.Event) -> list[ModelInfo]:
            # Imported here, in the worker: torchvision takes seconds to import, and the
            # first window does not need it. Hugging Face and timm models join the list
            # when those libraries are installed.
            from gradexplorer.models.hf_models import hf_catalog
            from gradexplorer.models.timm_models import timm_catalog
            from gradexplorer.models.weights import model_catalog

            return model_catalog() + hf_catalog() + timm_catalog()

        self.catalog_runner.start(task)

    # -- errors ----------------------------------------------------------------------------
    def show_error(self, title: str, exc: BaseException, actions: Sequence[error_dialog.Action] = (),
                   words: tuple[str, str] | None = None) -> None:
        """Tell the user; the window stays usable (the dialog is not modal).

        ``actions`` are next steps offered as buttons, ``words`` the window's own message
        and fix (see ``error_dialog.show_error``)."""
        line = f"{words[0]} {words[1]}" if words is not None else error_dialog.one_line(exc)
        self.status.emit(f"{title}: {line}", 15000)
        if self.unattended:
            print(f"error: {title}: {error_dialog.one_line(exc)}", file=sys.stderr, flush=True)
        if actions or words is not None:
            error_dialog.show_error(self.dialog_parent, title, exc, actions=actions, words=words)
        else:
            error_dialog.show_error(self.dialog_parent, title, exc)
        self.error_shown.emit(f"{title}: {line}")

    # -- models ------------------------------------------------------------------------------
    def load_model(self, spec: str, weights: str | None = None, arch: str | None = None, trust: bool = False,
                   inputs: list[str] | None = None, layers: list[str] | None = None, run: bool = False,
                   labels: str | None = None, hf_class: str | None = None, tokenizer: str | None = None) -> int:
        """Load a model in a worker (with ``inputs`` as its batch, else a fitting one; with
        ``tokenizer``, a tokenizer for a model that came without one); select ``layers`` and
        run when asked. Returns the task's generation."""
        self._pending_layers = list(layers) if layers else None
        self._run_after_load = run
        return self._start_model_load(ModelRequest(spec, weights, arch, trust, hf_class, tokenizer), inputs, labels)

    def request_model(self, request: ModelRequest) -> int:
        """Load what the model panel asks for (no layer selection, no run)."""
        self._pending_layers = None
        self._run_after_load = False
        return self._start_model_load(request, None)

    def show_live(self, model: Model, batch: Batch | None, options: CaptureOptions, run: bool = False) -> int:
        """Show a model handed over in memory (``gradexplorer.explore``) with its batch:
        probed in a worker like a loaded one, then shown; run when asked. Nothing is
        loaded and no trust is asked. Returns the task's generation."""
        self._pending_layers = list(options.layers) or None
        self._run_after_load = run
        self._last_model_request = None  # a failure has no load to retry with trust
        self._pending_inputs = None

        def task(progress: Progress, cancel: threading.Event) -> LoadedModel:
            progress(STAGE_PROBE, 0, 0)
            prepared = probe_model(model, batch.model_input if batch is not None else None,
                                   memory_budget=options.memory_budget)
            prepared.options = options
            return LoadedModel(prepared, batch, [], None)

        self.model_busy.emit(True, f"preparing {model.name}…")
        self.status.emit(f"Preparing {model.name}…", 0)
        return self.model_runner.start(task)

    def show_capture(self, capture: Capture) -> None:
        """Show a capture object the caller holds (``gradexplorer.explore(capture)``)."""
        self.run_runner.cancel()
        self.session.open_capture(capture)
        self.status.emit(f"Showing the capture ({len(capture)} layers).", 8000)
        self.file_done.emit("open")

    def _start_model_load(self, request: ModelRequest, inputs: list[str] | None, labels: str | None = None) -> int:
        self._last_model_request = request
        self._pending_inputs = inputs
        self.model_busy.emit(True, f"loading {request.spec}…")
        self.status.emit(f"Loading {request.spec}…", 0)
        return self.model_runner.start(load_model_task(request, inputs, list(self.session.batch_sources), labels))

    def _on_model_loaded(self, _gen: int, result: LoadedModel, seconds: float) -> None:
        self.model_busy.emit(False, "")
        self.run_runner.cancel()
        s = self.session
        s.set_model(result.prepared, result.batch, result.sources)  # both in place before either is announced
        spec = result.prepared.loaded.spec
        if not spec.startswith("demo:") and not is_live(spec):  # nothing on disk to open again
            options = result.prepared.options
            self.settings.add_recent_model(spec, options.weights if options is not None else None,
                                           options.arch if options is not None else None)
        message = f"Loaded {result.prepared.loaded.name} in {seconds:.1f} s"
        if result.prepared.probe_error is not None:
            message += f". {probe_failed_message(result.prepared.probe_error)}"
        self.status.emit(message, 10000)
        if self._pending_layers:
            try:
                s.select_patterns(self._pending_layers)
            except GradExplorerError as exc:
                self.show_error("Layers not found", exc)
            self._pending_layers = None
        self.model_loaded.emit(spec)
        if result.batch_error is not None:
            run, self._run_after_load = self._run_after_load, False
            if not self._offer_tokenizer(result, run):
                self.show_error("The inputs cannot be used", result.batch_error)
            self.run_done.emit("failed")
            return
        if self._run_after_load:
            self._run_after_load = False
            self.run()

    def _on_model_failed(self, _gen: int, exc: BaseException) -> None:
        self.model_busy.emit(False, "")
        request = self._last_model_request
        if isinstance(exc, TrustRequired) and request is not None and not request.trust and not self.unattended:
            subject = exc.subject or models.trust_subject(request.spec)
            if dialogs.confirm_trust(self.dialog_parent, subject, exc.problem):
                self._start_model_load(replace(request, trust=True), self._pending_inputs)
                return
        if isinstance(exc, WeightsUnavailable) and request is not None and not self.unattended:
            self._offer_other_weights(request, exc)
            return
        self._run_after_load = False
        self.show_error("The model cannot be loaded", exc)
        self.run_done.emit("failed")

    CHOOSE_TOKENIZER = "Choose tokenizer folder…"

    def _offer_tokenizer(self, result: LoadedModel, run: bool) -> bool:
        """Text given to a model that came without a tokenizer (a factory, a checkpoint):
        say so, and offer to choose the tokenizer's folder; the model is then loaded again
        with it (``--tokenizer``), and the run asked for goes on. False when this is not
        that case."""
        request, inputs = self._last_model_request, self._pending_inputs
        loaded = result.prepared.loaded
        if (request is None or loaded.tokenizer is not None or not takes_a_tokenizer(request.spec)
                or not inputs or not any(s.startswith(TEXT_SOURCE) for s in inputs)):
            return False

        def choose() -> None:
            folder = dialogs.ask_folder(self.dialog_parent,
                                        "Choose the tokenizer's folder (written by tokenizer.save_pretrained)")
            if folder:
                self._run_after_load = run
                self._start_model_load(replace(request, tokenizer=folder), inputs)

        words = (f"{loaded.name} came without a tokenizer, so the text cannot be turned into its input.",
                 ("Choose the folder its tokenizer was saved in (tokenizer.save_pretrained), or give it a .pt "
                  "file of token ids instead of text."))
        self.show_error("The inputs cannot be used", result.batch_error or GradExplorerError(*words),
                        actions=[(self.CHOOSE_TOKENIZER, choose)], words=words)
        return True

    USE_RANDOM = "Use random weights"
    CHOOSE_WEIGHTS = "Choose file…"

    def _offer_other_weights(self, request: ModelRequest, exc: WeightsUnavailable) -> None:
        """Pretrained weights that cannot be had: say so plainly, and offer random weights
        or a file the user has (a run asked for goes on with either)."""
        inputs, run = self._pending_inputs, self._run_after_load
        self._run_after_load = False

        def load(weights: str | None) -> None:
            self._run_after_load = run
            self._start_model_load(replace(request, weights=weights), inputs)

        def choose() -> None:
            path = dialogs.ask_open_file(self.dialog_parent, "Choose the weights file", dialogs.WEIGHTS_FILTER)
            if path:
                load(path)

        name = Path(exc.cache_file).name if exc.cache_file else "the weights file"
        which = f" {exc.weights}" if exc.weights else ""
        message = f"The pretrained weights{which} are not on this computer, and they cannot be downloaded now."
        fix = (f"Use random weights to look at {request.spec} now, or choose {name} if you have it. "
               "With a connection, Load downloads them.")
        words = (message, fix)
        self.show_error("The pretrained weights are not available", exc,
                        actions=[(self.USE_RANDOM, lambda: load(None)), (self.CHOOSE_WEIGHTS, choose)],
                        words=words)
        self.run_done.emit("failed")

    def _on_model_cancelled(self, _gen: int) -> None:
        self.model_busy.emit(False, "Cancelled.")
        self._run_after_load = False
        self.status.emit("Loading cancelled; the previous model is still here.", 8000)

    # -- batches -----------------------------------------------------------------------------
    def load_inputs(self, sources: list[str], labels: str | None = None, skip_unreadable: bool = False) -> int:
        """Load a batch for the current model in a worker (pictures that cannot be read
        are left out with ``skip_unreadable``; without it the user is asked)."""
        model = self.session.model
        sources = [str(x) for x in sources]
        self._last_inputs = (sources, labels)

        lock = self.session.run_lock

        def task(progress: Progress, cancel: threading.Event) -> tuple[Batch, list[str], ModuleTree | None]:
            # Imported on first use: reading inputs is not needed to start the window.
            from gradexplorer import batches

            batch = batches.load_batch(sources, model, labels, skip_unreadable=skip_unreadable)
            # The tree's calls and shapes on this batch (one sample): a text of another
            # length or a picture of another size changes them (the Output column had kept
            # the first batch's 16 tokens over a batch of 12).
            probed = None
            if model is not None:
                progress(STAGE_PROBE, 0, 0)
                prepared = probe_model(model, batch.model_input, lock=lock)
                probed = prepared.tree if prepared.probe_error is None else None
            return batch, sources, probed

        self.status.emit(f"Reading {', '.join(sources)[:120]}…", 0)
        return self.batch_runner.start(task)

    def _on_batch_failed(self, _gen: int, exc: BaseException) -> None:
        if isinstance(exc, UnreadableImages) and exc.readable and not self.unattended:
            if dialogs.confirm_skip_unreadable(self.dialog_parent, [Path(p).name for p in exc.paths],
                                               exc.readable, exc.problem):
                sources, labels = self._last_inputs
                self.load_inputs(sources, labels, skip_unreadable=True)
                return
        self.show_error("The inputs cannot be used", exc)

    def _on_batch_loaded(self, _gen: int, result: tuple[Batch, list[str], ModuleTree | None],
                         seconds: float) -> None:
        batch, sources, probed = result
        if probed is not None:
            self.session.measure_tree(probed)
        self.session.set_batch(batch, sources)
        if sources and sources != ["demo"] and not sources[0].startswith("random"):
            self.settings.add_recent_input("\n".join(sources))
        self.status.emit(f"Loaded {len(batch)} samples in {seconds:.1f} s; press Run (Ctrl+R).", 8000)
        self.batch_loaded.emit()

    # -- runs ------------------------------------------------------------------------------------
    def run(self) -> int | None:
        """Start a capture with the session's settings (cancels one in flight)."""
        try:
            self.run_settings.apply_target()
            if not self._memory_fits():
                self.status.emit("Run cancelled: the capture would not fit in memory.", 8000)
                self.run_done.emit("cancelled")
                return None
            request = self.session.begin_run()
        except GradExplorerError as exc:
            self.show_error("Cannot run", exc)
            self.run_done.emit("failed")
            return None
        self.run_busy.emit(True, "")
        self.status.emit(f"Running {len(request.layers)} layers on {request.device}…", 0)
        return self.run_runner.start(request.run, generation=request.generation)

    def _memory_fits(self) -> bool:
        """Before anything is allocated: when the capture is over the memory budget, ask
        whether to switch to statistics-only, run anyway, or not run. False: don't run."""
        if not self.session.can_run():
            return True  # begin_run says what is missing
        estimate, message = self.run_settings.budget_check()
        if not message or estimate is None:
            return True
        if self.unattended:  # nobody to ask: refuse, as the CLI does without --force
            fix = ("Add --stats-only, tick fewer layers with --layers, or use a smaller batch."
                   if self.run_settings.stats_only_fits else "Or pass a larger --memory-budget.")
            self.show_error("Over the memory budget", GradExplorerError(message, fix))
            return False
        choices = ([self.STATS_ONLY] if self.run_settings.stats_only_fits else []) + [self.RUN_ANYWAY]
        choice = dialogs.ask_item(self.dialog_parent, "gradexplorer: over the memory budget",
                                  f"{message}\n\nWhat would you like to do? (Cancel: don't run)",
                                  choices, False)
        if choice == self.STATS_ONLY:
            self.session.set_mode("stats")
            return True
        return choice == self.RUN_ANYWAY

    def cancel(self) -> None:
        self.run_runner.cancel()
        self.model_runner.cancel()

    def cancel_model_load(self) -> None:
        self.model_runner.cancel()

    def release_memory(self) -> threading.Thread:
        """Give the memory a run freed (its working memory, the capture it replaced) back to
        the system, in a thread of its own (``gradexplorer.base.devices.release_host_memory``)."""
        thread = threading.Thread(target=devices.release_host_memory, name="release-memory", daemon=True)
        thread.start()
        return thread

    def _on_run_finished(self, gen: int, capture: Capture, seconds: float) -> None:
        outcome = self.session.finish_run(gen, capture, seconds)
        self.release_memory()  # the old capture is gone now, and the run's working memory
        self.run_busy.emit(False, f"done in {seconds:.2f} s" if outcome == "ok" else outcome)
        if outcome == "ok":
            # A class target on a 3-D output reads dim 1 as the classes: a guess, said in words.
            shape = tuple(capture.output.shape) if capture.output is not None else None
            note = class_axis_note(shape, capture.meta.get("target", ""), window=True)
            stop = summarize(capture).stop
            self.status.emit(f"Captured {len(capture)} layers in {seconds:.2f} s."
                             + (f" Note: {note[0].upper()}{note[1:]}" if note else "")
                             + (f" {stop.sentence()}" if stop is not None else ""),
                             30000 if note or stop else 8000)
        self.run_done.emit(outcome)

    def _on_run_failed(self, gen: int, exc: BaseException) -> None:
        outcome = self.session.finish_run(gen, exc)
        self.release_memory()
        self.run_busy.emit(False, "failed" if outcome == "failed" else outcome)
        if outcome == "failed":
            self.show_error("The run failed", exc)
        self.run_done.emit(outcome)

    def _on_run_cancelled(self, gen: int) -> None:
        outcome = self.session.finish_run(gen, CaptureCancelled())
        self.release_memory()
        self.run_busy.emit(False, "cancelled")
        self.status.emit("Run cancelled; the model is unchanged.", 8000)
        self.run_done.emit(outcome)

    # -- what the views show --------------------------------------------------------------------
    def _on_model_batch_changed(self, batch: Batch | None) -> None:
        # Without a capture the views name the batch's samples: a new batch (also one a new
        # model brings, after the capture was dropped with the old model) renames them. With
        # a capture, dropping it (capture_changed) shows the new batch.
        if self.session.capture is None:
            self.capture_shown.emit(None, batch)

    def _on_model_selection_moved(self, *_args: object) -> None:
        # Another layer or call than the block's stand-in: the block is no longer shown.
        shown = self.shown_for
        if shown is not None and (self.view_state.layer, self.view_state.call) != shown[1:]:
            self._set_shown_for(None)

    def _on_model_capture_changed(self, capture: Capture | None) -> None:
        self._set_shown_for(None)
        # The views keep the selected layer when the new capture has it, else open on
        # core's default layer (ViewState.fit).
        kept = capture is not None and self.view_state.layer in capture
        self.capture_shown.emit(capture, self.session.batch)
        if capture is None or kept:
            return
        first = summarize(capture).first_view
        if first is not None and not self._shown_first_capture:
            # The first look at a model: where it looks (Grad-CAM), when the layer has a map.
            name, call = first
            if cam_supported(tuple(capture[name].calls[call].shape), input_shape_of(capture)):
                self.view_requested.emit("Grad-CAM")
        self._shown_first_capture = True

    def select_layer(self, name: str) -> None:
        """The user picked a layer (a tree row, a graph node, a bar of the flow chart).

        A block that is not recorded itself but whose submodules are (``layer4`` ticked:
        its leaves are) is shown through the last captured call inside it
        (``gradexplorer.analysis.capture_summary.block_call``), and the status bar says so."""
        cap = self.session.capture
        if cap is None:
            return
        if name in cap.layers:
            self._set_shown_for(None)
            if name != self.view_state.layer:
                self.view_state.select(name, 0)
            calls = len(cap[name].calls)
            self.status.emit(f"{name or 'The model'}: {calls} call(s)" if calls else
                             f"{name or 'The model'} was not called: it never ran during forward (its parent used "
                             "its weights directly); its parameters' gradients are in the Statistics tab.", 6000)
            return
        stand_in = block_call(cap, name)
        if stand_in is None:
            self._set_shown_for(None)
            self.status.emit(f"{name or 'The model'} was not captured: tick it and run again.", 4000)
            return
        layer, call = stand_in
        self._set_shown_for((name, layer, call))
        self.view_state.select(layer, call)
        calls = len(cap[layer].calls)
        self.status.emit(f"{name or 'The model'} is not recorded itself: showing its last captured call, {layer}"
                         + (f" (call {call + 1} of {calls})" if calls > 1 else "")
                         + ". To record its own output, right-click its row: Capture this module's own output.",
                         12000)

    def _set_shown_for(self, shown: tuple[str, str, int] | None) -> None:
        if shown != self.shown_for:
            self.shown_for = shown
            self.block_shown.emit(shown)

    def select_sample(self, index: int) -> None:
        """The user picked a sample (a thumbnail of the batch)."""
        batch = self.session.batch
        cap = self.session.capture
        n = len(batch) if batch is not None else (len(cap.input) if cap is not None and cap.input is not None else 0)
        self.view_state.sample = clamp(index, n)

    # -- files --------------------------------------------------------------------------------------
    def open_capture(self, path: str | None = None) -> int | None:
        """Open a ``.pt`` capture (in a worker) and show it; the model is not needed."""
        path = path or dialogs.ask_open_file(self.dialog_parent, "Open a capture", dialogs.CAPTURE_FILTER)
        if not path:
            return None

        def task(progress: Progress, cancel: threading.Event) -> FileDone:
            return ("open", load_capture(path), path)

        self.status.emit(f"Opening {path}…", 0)
        return self.file_runner.start(task)

    def export_capture(self, path: str | None = None) -> int | None:
        """Save the capture as ``.pt`` (in a worker)."""
        cap = self.session.capture
        if cap is None:
            self.show_error("Nothing to export", GradExplorerError("There is no capture yet.", "Run first (Ctrl+R)."))
            return None
        suggested = f"{str(cap.meta.get('model', 'capture')).replace(':', '_').replace('/', '_')}_gradients.pt"
        path = path or dialogs.ask_save_file(self.dialog_parent, "Export capture", suggested, dialogs.CAPTURE_FILTER)
        if not path:
            return None
        # The files the session read: exporting over one of them would destroy it.
        read = self.session.files_read()

        def task(progress: Progress, cancel: threading.Event) -> FileDone:
            check_output_path(path, read)
            return ("save", save_capture(cap, path), path)

        self.status.emit(f"Saving {path}…", 0)
        return self.file_runner.start(task)

    def _on_file_done(self, _gen: int, result: FileDone, seconds: float) -> None:
        kind, value, path = result
        if kind == "open":
            assert isinstance(value, Capture)
            self.run_runner.cancel()
            self.session.open_capture(value, path)
            self.release_memory()  # the capture it replaced
            self.settings.add_recent_capture(str(Path(path).resolve()))
            self.status.emit(f"Opened {path} ({len(value)} layers).", 8000)
        else:
            self.settings.add_recent_capture(str(Path(path).resolve()))
            self.status.emit(f"Saved {path} in {seconds:.1f} s.", 8000)
        self.file_done.emit(kind)

    def _on_file_failed(self, _gen: int, exc: BaseException) -> None:
        self.show_error("The file operation failed", exc)
        self.file_done.emit("failed")

    # -- end ------------------------------------------------------------------------------------------
    def is_running(self) -> bool:
        """Whether a capture is in flight (closing the window asks first)."""
        return self.run_runner.is_busy()

    def shutdown(self) -> None:
        """Cancel every worker, then wait for each (on close, and at the end of tests).

        Everything is cancelled before anything is waited for: a capture stops at the next
        module it reaches, so closing during a run takes about as long as one module."""
        runners = (self.run_runner, self.model_runner, self.batch_runner, self.file_runner, self.catalog_runner)
        for runner in runners:
            runner.cancel()
        for runner in runners:
            runner.shutdown(30000)
