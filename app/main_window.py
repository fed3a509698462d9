"""The main window: module tree on the left, the capture views in the middle, model,
batch and run panels on the right; menus, shortcuts, status bar and the workers."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QGroupBox, QLabel, QMainWindow, QMessageBox, QProgressBar, QSplitter, QTabWidget, QVBoxLayout,
    QWidget,
)

from core.batch import Batch
from core.capture_data import Capture
from core.errors import CaptureCancelled, GradExplorerError, TrustRequired
from core.session import PreparedModel, Session, probe_failed_message
from app import dialogs, error_dialog
from app.batch_panel import BatchPanel
from app.model_panel import ModelPanel, ModelRequest
from app.module_tree import ModuleTreePanel
from app.run_panel import RunPanel
from app.run_worker import TaskRunner
from app.settings import AppSettings

DEFAULT_SIZE = QSize(1500, 950)


# ---------------------------------------------------------------------------
# The capture views (built in app/views; a plain placeholder until they exist)
# ---------------------------------------------------------------------------


class ViewsPlaceholder(QWidget):
    """Stands in for ``app.views.CaptureViews`` with the same interface."""

    layer_clicked = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._capture: Capture | None = None
        self._layer: str | None = None
        self._call = 0
        self._sample = 0
        self.label = QLabel(self)
        self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.label.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.label)
        self._update()

    def set_capture(self, capture: Capture | None, batch: Batch | None = None) -> None:
        self._capture = capture
        self._update()

    def set_layer(self, name: str) -> None:
        self._layer = name
        self._update()

    def set_call(self, i: int) -> None:
        self._call = i
        self._update()

    def set_sample(self, i: int) -> None:
        self._sample = i
        self._update()

    def export_png(self, path: str) -> None:
        self.grab().save(str(path))

    def export_csv(self, path: str) -> None:
        Path(path).write_text("layer\n" + "\n".join(self._capture.layer_order if self._capture else []))

    def _update(self) -> None:
        cap = self._capture
        if cap is None:
            self.label.setText("<i>No capture yet: press Run (Ctrl+R).</i>")
            return
        text = f"<b>{len(cap)} layers captured</b> ({cap.mode})"
        if self._layer in cap.layers:
            calls = cap[self._layer].calls
            call = calls[min(self._call, len(calls) - 1)] if calls else None
            if call is not None:
                text += f"<br><br>{self._layer}: {'×'.join(map(str, call.shape))} {call.dtype}"
        self.label.setText(text)


def _views_class():
    # The real views are imported when their package exists; an error inside them is a
    # bug to see, not a reason to fall back silently.
    if importlib.util.find_spec("app.views") is not None:
        from app.views import CaptureViews

        return CaptureViews
    return ViewsPlaceholder


ACTIVATION_TYPES = {"ReLU", "ReLU6", "SiLU", "GELU", "Hardswish", "LeakyReLU", "ELU", "Mish", "Tanh", "Sigmoid"}


def default_layer(capture: Capture) -> tuple[str, int] | None:
    """The layer (and call) to show first: where Grad-CAM is usually taken, else the
    first captured layer.

    That is the last spatial map (conv output at least 2×2, or ViT tokens) in forward
    order. Layers are ordered by their first call, so a block's shared activation
    (ResNet's ``layer4.1.relu``, called two or three times) comes before the block's last
    conv; its last call is the block's output, and it is preferred when it sits in the
    same block and its shape matches.
    """
    from core.gradcam import cam_supported

    def spatial(shape: tuple) -> bool:
        if not cam_supported(shape):
            return False
        return len(shape) != 4 or (shape[2] > 1 and shape[3] > 1)

    order = capture.layer_order
    last = None
    for name in reversed(order):
        calls = capture[name].calls
        if calls and spatial(tuple(calls[-1].shape)):
            last = name
            break
    if last is not None:
        shape = tuple(capture[last].calls[-1].shape)
        parent = last.rpartition(".")[0]
        for name in reversed(order[: order.index(last)]):
            layer = capture[name]
            if name.rpartition(".")[0] != parent or not layer.calls:
                continue
            # ResNet's Bottleneck registers its relu between bn1 and conv2: the scan must
            # pass the block's other layers (other shapes) to reach it.
            if (len(layer.calls) > 1 and layer.type in ACTIVATION_TYPES
                    and tuple(layer.calls[-1].shape) == shape):
                return name, len(layer.calls) - 1
        return last, len(capture[last].calls) - 1
    # No spatial map (an MLP): the first layer, whose gradient has travelled furthest.
    for name in order:
        if capture[name].calls:
            return name, len(capture[name].calls) - 1
    return None


@dataclass
class _Loaded:
    prepared: PreparedModel
    batch: Batch | None
    sources: list[str]
    batch_error: GradExplorerError | None


def _default_batch(loaded) -> tuple[Batch | None, list[str]]:
    from core.batches import random_batch

    if loaded.spec.startswith("demo:"):
        from core.demos import demo_batch

        return demo_batch(loaded.spec), ["demo"]
    shape = loaded.input_shape
    if shape is not None and all(isinstance(d, int) for d in shape):
        spec = "x".join(str(d) for d in (2, *shape))
        return random_batch(spec, seed=0), [f"random:{spec}"]
    return None, []


def load_model_task(request: ModelRequest, sources: list[str] | None, reuse: list[str], labels: str | None = None):
    """The worker's job for loading a model: download weights when needed (cancellable),
    load, pick a batch that fits (the given sources, else the current images, else a
    default), and probe the tree."""

    def task(progress, cancel) -> _Loaded:
        from core.batches import load_batch
        from core.job import STAGE_PROBE, CaptureJob, probe_model
        from core.options import BatchSpec, CaptureOptions

        options = CaptureOptions(request.spec, weights=request.weights, arch=request.arch, trust=request.trust,
                                 batch=BatchSpec.from_sources(sources), labels=labels)
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
            batch, used = _default_batch(loaded)
        progress(STAGE_PROBE, 0, 0)
        prepared = probe_model(loaded, batch.tensor if batch is not None else None)
        prepared.options = options
        return _Loaded(prepared, batch, used, error)

    return task


class MainWindow(QMainWindow):
    """gradexplorer's window.

    Signals
    -------
    model_loaded(str)
        A model finished loading (its spec).
    batch_loaded()
    run_done(str)
        ``"ok"``, ``"cancelled"``, ``"failed"`` or ``"stale"`` after each run.
    error_shown(str)
        A message was shown to the user (title: message).
    """

    model_loaded = Signal(str)
    batch_loaded = Signal()
    run_done = Signal(str)
    error_shown = Signal(str)
    file_done = Signal(str)

    def __init__(self, session: Session | None = None, settings: AppSettings | None = None,
                 devices: list | None = None, restore_geometry: bool = True) -> None:
        super().__init__()
        self.session = session or Session()
        self.settings = settings or AppSettings()
        if devices is None:
            from core.devices import list_devices

            devices = list_devices()
        self.devices = devices
        self.setWindowTitle("gradexplorer")
        self.resize(DEFAULT_SIZE)

        self.run_runner = TaskRunner("run", self)
        self.model_runner = TaskRunner("model", self)
        self.batch_runner = TaskRunner("batch", self)
        self.file_runner = TaskRunner("file", self)
        self.catalog_runner = TaskRunner("catalog", self)
        self._run_after_load = False
        self._pending_layers: list[str] | None = None
        self._last_model_request: ModelRequest | None = None
        self._shown_first_capture = False

        # -- widgets
        s = self.session
        self.tree_panel = ModuleTreePanel(s, self)
        self.tree_view = self.tree_panel.view
        self.views = _views_class()(self)
        # An explicit minimum: the views' own hint grows with long labels after a run,
        # which would squeeze the tree and panels of a 1500 px window.
        self.views.setMinimumWidth(520)
        self.model_panel = ModelPanel(s, self)
        self.batch_panel = BatchPanel(s, self)
        self.run_panel = RunPanel(s, devices, self)

        tree_box = QGroupBox("Modules", self)
        QVBoxLayout(tree_box).addWidget(self.tree_panel)
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self.batch_panel, "Input batch")
        self.tabs.addTab(self.model_panel, "Model")
        run_box = QGroupBox("Run", self)
        QVBoxLayout(run_box).addWidget(self.run_panel)
        right = QWidget(self)
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.setSpacing(8)
        right_layout.addWidget(self.tabs, 1)
        right_layout.addWidget(run_box, 0)

        self.splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.splitter.addWidget(tree_box)
        self.splitter.addWidget(self.views)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setStretchFactor(2, 0)
        self.splitter.setSizes([500, 640, 360])
        self.splitter.setChildrenCollapsible(False)
        container = QWidget(self)
        outer = QVBoxLayout(container)
        outer.setContentsMargins(8, 8, 8, 4)
        outer.addWidget(self.splitter)
        self.setCentralWidget(container)

        self._build_status_bar()
        self._build_menus()
        self._connect()
        if restore_geometry:
            self._restore_geometry()
        self._update_status()
        self.catalog_runner.start(lambda progress, cancel: __import__("core.weights", fromlist=["model_catalog"]).model_catalog())

    # -- construction ---------------------------------------------------------------------
    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.status_model = QLabel(self)
        self.status_device = QLabel(self)
        self.status_run = QLabel(self)
        self.file_progress = QProgressBar(self)
        self.file_progress.setMaximumWidth(160)
        self.file_progress.setRange(0, 0)
        self.file_progress.setVisible(False)
        for w in (self.file_progress, self.status_model, self.status_device, self.status_run):
            bar.addPermanentWidget(w)

    def _build_menus(self) -> None:
        def action(text: str, slot, shortcut=None, tip: str = "") -> QAction:
            a = QAction(text, self)
            if shortcut is not None:
                a.setShortcut(QKeySequence(shortcut))
                a.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
            if tip:
                a.setStatusTip(tip)
            a.triggered.connect(slot)
            return a

        self.open_images_action = action("Open &images…", self.batch_panel._on_open_images, "Ctrl+I")
        self.open_capture_action = action("&Open capture…", lambda: self.open_capture(), QKeySequence.StandardKey.Open,
                                          "Open a .pt capture and browse it without the model")
        self.export_capture_action = action("&Export capture…", lambda: self.export_capture(), QKeySequence.StandardKey.Save,
                                            "Save the captured gradients as .pt (torch.load(weights_only=True) opens it)")
        self.export_png_action = action("Export plot as &PNG…", lambda: self.export_png(), "Ctrl+Shift+P")
        self.export_csv_action = action("Export statistics as &CSV…", lambda: self.export_csv(), "Ctrl+Shift+C")
        self.quit_action = action("&Quit", self.close, QKeySequence.StandardKey.Quit)
        self.run_action = action("&Run", self.run, "Ctrl+R", "Run forward and backward, capture the checked layers")
        self.cancel_action = action("&Cancel", self.cancel, "Esc")
        self.compare_action = action("Compare &with…", lambda: self.compare_with(), "Ctrl+D",
                                     "Compare this capture with another run (bf16, weights, input...) or a file")
        self.cancel_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.filter_action = action("&Filter modules", lambda: self.tree_panel.filter_edit.setFocus(), QKeySequence.StandardKey.Find)
        self.model_tab_action = action("Choose &model…", self._show_model_tab, "Ctrl+M")

        menu = self.menuBar().addMenu("&File")
        menu.addAction(self.model_tab_action)
        menu.addAction(self.open_images_action)
        self.recent_menu = menu.addMenu("Recent models")
        self.recent_menu.aboutToShow.connect(self._fill_recent_menu)
        menu.addSeparator()
        menu.addAction(self.open_capture_action)
        menu.addAction(self.export_capture_action)
        menu.addAction(self.export_png_action)
        menu.addAction(self.export_csv_action)
        menu.addSeparator()
        menu.addAction(self.quit_action)
        menu = self.menuBar().addMenu("&Run")
        menu.addAction(self.run_action)
        menu.addAction(self.cancel_action)
        menu.addAction(self.compare_action)
        menu = self.menuBar().addMenu("&View")
        menu.addAction(self.filter_action)
        menu.addAction("Expand all modules", self.tree_view.expandAll)
        menu.addAction("Collapse modules", self.tree_view._collapse)
        menu = self.menuBar().addMenu("&Help")
        menu.addAction("About gradexplorer", self._about)
        self._update_actions()

    def _connect(self) -> None:
        s = self.session
        self.run_panel.run_requested.connect(self.run)
        self.run_panel.cancel_requested.connect(self.cancel)
        self.model_panel.load_requested.connect(self._on_model_requested)
        self.model_panel.cancel_requested.connect(self.model_runner.cancel)
        self.batch_panel.load_requested.connect(self.load_inputs)
        self.batch_panel.sample_selected.connect(self.views.set_sample)
        self.tree_view.layer_activated.connect(self._on_layer_activated)
        self.views.layer_clicked.connect(self.tree_view.select_layer)
        if hasattr(self.views, "selection_changed"):
            self.views.selection_changed.connect(self._on_views_selection_changed)

        self.run_runner.progress.connect(lambda g, st, d, t: self.run_panel.set_progress(st, d, t))
        self.run_runner.finished.connect(self._on_run_finished)
        self.run_runner.failed.connect(self._on_run_failed)
        self.run_runner.cancelled.connect(self._on_run_cancelled)
        self.model_runner.progress.connect(lambda g, st, d, t: self.model_panel.set_progress(st, d, t))
        self.model_runner.finished.connect(self._on_model_loaded)
        self.model_runner.failed.connect(self._on_model_failed)
        self.model_runner.cancelled.connect(self._on_model_cancelled)
        self.batch_runner.finished.connect(self._on_batch_loaded)
        self.batch_runner.failed.connect(lambda g, e: self._on_batch_failed(e))
        self.file_runner.finished.connect(self._on_file_done)
        self.file_runner.failed.connect(self._on_file_failed)
        self.file_runner.busy_changed.connect(self.file_progress.setVisible)
        self.catalog_runner.finished.connect(lambda g, catalog, _t: self.model_panel.set_catalog(catalog))
        self.catalog_runner.failed.connect(lambda g, e: self.statusBar().showMessage(
            f"The torchvision model list is not available: {error_dialog.one_line(e)}", 10000))

        s.capture_changed.connect(self._on_model_capture_changed)
        s.batch_changed.connect(lambda _b: self._update_status())
        s.model_changed.connect(lambda _m: self._update_status())
        s.settings_changed.connect(lambda _n: self._update_status())
        s.selection_changed.connect(lambda _n: self._update_actions())

    def _restore_geometry(self) -> None:
        geometry = self.settings.geometry()
        if geometry is not None:
            self.restoreGeometry(geometry)
        sizes = self.settings.value("window/splitter", list, [])
        try:
            if len(sizes) == 3:
                self.splitter.setSizes([int(v) for v in sizes])
        except ValueError:
            pass

    # -- status --------------------------------------------------------------------------
    def _update_status(self) -> None:
        s = self.session
        if s.model is not None:
            self.status_model.setText(f"  {s.model.name}  ")
            self.setWindowTitle(f"gradexplorer — {s.model.name}")
        elif s.capture is not None:
            name = s.capture.meta.get("model_name") or s.capture.meta.get("model") or "capture"
            self.status_model.setText(f"  {name} (from file, no model)  ")
            self.setWindowTitle(f"gradexplorer — {Path(s.capture_path).name if s.capture_path else name}")
        else:
            self.status_model.setText("  no model  ")
        self.status_device.setText(f"  device: {s.device}  ")
        if s.capture is not None and s.last_run_seconds is not None and s.capture_path is None:
            self.status_run.setText(f"  last run: {s.last_run_seconds:.2f} s, {len(s.capture)} layers  ")
        elif s.capture is not None and s.capture_path:
            self.status_run.setText(f"  opened {Path(s.capture_path).name}  ")
        else:
            self.status_run.setText("  not run yet  ")
        self._update_actions()

    def _update_actions(self) -> None:
        has_capture = self.session.capture is not None
        for a in (getattr(self, "export_capture_action", None), getattr(self, "export_png_action", None),
                  getattr(self, "export_csv_action", None), getattr(self, "compare_action", None)):
            if a is not None:
                a.setEnabled(has_capture)
        if hasattr(self, "run_action"):
            self.run_action.setEnabled(self.session.can_run())

    def compare_with(self):
        """Compare with…: ask for B (another run or a file) and open a compare window."""
        from app.compare_window import compare_with

        self.compare_window = compare_with(self, self.session, [d.name for d in self.devices])
        return self.compare_window

    def show_error(self, title: str, exc: BaseException) -> None:
        """Tell the user; the window stays usable (the dialog is not modal)."""
        self.statusBar().showMessage(f"{title}: {error_dialog.one_line(exc)}", 15000)
        error_dialog.show_error(self, title, exc)
        self.error_shown.emit(f"{title}: {error_dialog.one_line(exc)}")

    # -- models ------------------------------------------------------------------------------
    def load_model(self, spec: str, weights: str | None = None, arch: str | None = None, trust: bool = False,
                   inputs: list[str] | None = None, layers: list[str] | None = None, run: bool = False,
                   labels: str | None = None) -> int:
        """Load a model in a worker (with ``inputs`` as its batch, else a fitting one);
        select ``layers`` and run when asked. Returns the task's generation."""
        self._pending_layers = list(layers) if layers else None
        self._run_after_load = run
        return self._start_model_load(ModelRequest(spec, weights, arch, trust), inputs, labels)

    def _on_model_requested(self, request: ModelRequest) -> None:
        self._pending_layers = None
        self._run_after_load = False
        self._start_model_load(request, None)

    def _start_model_load(self, request: ModelRequest, inputs: list[str] | None, labels: str | None = None) -> int:
        self._last_model_request = request
        self._pending_inputs = inputs
        self.model_panel.set_busy(True, f"loading {request.spec}…")
        self.statusBar().showMessage(f"Loading {request.spec}…")
        return self.model_runner.start(load_model_task(request, inputs, list(self.session.batch_sources), labels))

    def _on_model_loaded(self, _gen: int, result: _Loaded, seconds: float) -> None:
        self.model_panel.set_busy(False)
        self.run_runner.cancel()
        s = self.session
        s.set_model(result.prepared)
        s.set_batch(result.batch, result.sources)
        spec = result.prepared.loaded.spec
        if not spec.startswith("demo:"):
            self.settings.add_recent_model(spec)
        message = f"Loaded {result.prepared.loaded.name} in {seconds:.1f} s"
        if result.prepared.probe_error is not None:
            message += f". {probe_failed_message(result.prepared.probe_error)}"
        self.statusBar().showMessage(message, 10000)
        if self._pending_layers:
            try:
                s.select_patterns(self._pending_layers)
            except GradExplorerError as exc:
                self.show_error("Layers not found", exc)
            self._pending_layers = None
        self.model_loaded.emit(spec)
        if result.batch_error is not None:
            self._run_after_load = False
            self.show_error("The inputs cannot be used", result.batch_error)
            self.run_done.emit("failed")
            return
        if self._run_after_load:
            self._run_after_load = False
            self.run()

    def _on_model_failed(self, _gen: int, exc: BaseException) -> None:
        self.model_panel.set_busy(False)
        request = self._last_model_request
        if isinstance(exc, TrustRequired) and request is not None and not request.trust:
            if dialogs.confirm_trust(self, f"'{request.spec}'", exc.problem):
                self._start_model_load(ModelRequest(request.spec, request.weights, request.arch, True),
                                       self._pending_inputs)
                return
        self._run_after_load = False
        self.show_error("The model cannot be loaded", exc)
        self.run_done.emit("failed")

    def _on_model_cancelled(self, _gen: int) -> None:
        self.model_panel.set_busy(False, "Cancelled.")
        self._run_after_load = False
        self.statusBar().showMessage("Loading cancelled; the previous model is still here.", 8000)

    # -- batches -----------------------------------------------------------------------------
    def load_inputs(self, sources: list[str], labels: str | None = None) -> int:
        """Load a batch for the current model in a worker."""
        model = self.session.model
        sources = [str(x) for x in sources]

        def task(progress, cancel):
            from core.batches import load_batch

            return load_batch(sources, model, labels), sources

        self.statusBar().showMessage(f"Reading {', '.join(sources)[:120]}…")
        return self.batch_runner.start(task)

    def _on_batch_loaded(self, _gen: int, result, seconds: float) -> None:
        batch, sources = result
        self.session.set_batch(batch, sources)
        if sources and sources != ["demo"] and not sources[0].startswith("random"):
            self.settings.add_recent_input("\n".join(sources))
        self.statusBar().showMessage(f"Loaded {len(batch)} samples in {seconds:.1f} s; press Run (Ctrl+R).", 8000)
        self.tabs.setCurrentWidget(self.batch_panel)
        self.batch_loaded.emit()

    def _on_batch_failed(self, exc: BaseException) -> None:
        self.show_error("The inputs cannot be used", exc)

    # -- runs ------------------------------------------------------------------------------------
    def run(self) -> int | None:
        """Start a capture with the session's settings (cancels one in flight)."""
        try:
            self.run_panel.apply_target()
            if not self._memory_fits():
                self.statusBar().showMessage("Run cancelled: the capture would not fit in memory.", 8000)
                self.run_done.emit("cancelled")
                return None
            request = self.session.begin_run()
        except GradExplorerError as exc:
            self.show_error("Cannot run", exc)
            self.run_done.emit("failed")
            return None
        self.run_panel.set_running(True)
        self.statusBar().showMessage(f"Running {len(request.layers)} layers on {request.device}…")
        return self.run_runner.start(request.run, generation=request.generation)

    STATS_ONLY = "Switch to statistics only"
    RUN_ANYWAY = "Run anyway"

    def _memory_fits(self) -> bool:
        """Before anything is allocated: when the capture is over the memory budget, ask
        whether to switch to statistics-only, run anyway, or not run. False: don't run."""
        if not self.session.can_run():
            return True  # begin_run says what is missing
        self.run_panel.update_estimate()
        message, estimate = self.run_panel.budget_message, self.run_panel.estimate
        if not message or estimate is None:
            return True
        choices = ([self.STATS_ONLY] if estimate.mode == "full" else []) + [self.RUN_ANYWAY]
        choice = dialogs.ask_item(self, "gradexplorer: over the memory budget",
                                  f"{message}\n\nWhat would you like to do? (Cancel: don't run)",
                                  choices, False)
        if choice == self.STATS_ONLY:
            self.session.set_mode("stats")
            return True
        return choice == self.RUN_ANYWAY

    def cancel(self) -> None:
        self.run_runner.cancel()
        self.model_runner.cancel()

    def _on_run_finished(self, gen: int, capture: Capture, seconds: float) -> None:
        outcome = self.session.finish_run(gen, capture, seconds)
        self.run_panel.set_running(False, f"done in {seconds:.2f} s" if outcome == "ok" else outcome)
        if outcome == "ok":
            self.statusBar().showMessage(f"Captured {len(capture)} layers in {seconds:.2f} s.", 8000)
        self._update_status()
        self.run_done.emit(outcome)

    def _on_run_failed(self, gen: int, exc: BaseException) -> None:
        outcome = self.session.finish_run(gen, exc)
        self.run_panel.set_running(False, "failed" if outcome == "failed" else outcome)
        if outcome == "failed":
            self.show_error("The run failed", exc)
        self.run_done.emit(outcome)

    def _on_run_cancelled(self, gen: int) -> None:
        outcome = self.session.finish_run(gen, CaptureCancelled())
        self.run_panel.set_running(False, "cancelled")
        self.statusBar().showMessage("Run cancelled; the model is unchanged.", 8000)
        self.run_done.emit(outcome)

    def _on_model_capture_changed(self, capture: Capture | None) -> None:
        # The row the user had chosen, before the views announce their own default.
        current = self.tree_view.current_name()
        self.views.set_capture(capture, self.session.batch)
        self._update_status()
        if capture is None:
            return
        if current in capture.layers:
            self.tree_view.select_layer(current)
            self.views.set_layer(current)
            return
        first = default_layer(capture)
        if first is not None:
            name, call = first
            if not self.tree_view.select_layer(name):
                self.views.set_layer(name)
            self.views.set_call(call)
            if not self._shown_first_capture and hasattr(self.views, "show_view"):
                # The first look at a model: where it looks (Grad-CAM), when it has a map.
                from core.gradcam import cam_supported

                if cam_supported(tuple(capture[name].calls[call].shape)):
                    self.views.show_view("Grad-CAM")
        self._shown_first_capture = True

    def _on_views_selection_changed(self, layer: str, _call: int, sample: int) -> None:
        # The views' own controls changed the layer or sample: follow them (never write back).
        if layer and layer != self.tree_view.current_name():
            self.tree_view.select_layer(layer)
        rows = self.batch_panel.list
        if 0 <= sample < rows.count() and rows.currentRow() != sample:
            rows.blockSignals(True)
            rows.setCurrentRow(sample)
            rows.blockSignals(False)

    def _on_layer_activated(self, name: str) -> None:
        cap = self.session.capture
        if cap is not None and name in cap.layers:
            self.views.set_layer(name)
            self.statusBar().showMessage(f"{name}: {len(cap[name].calls)} call(s)", 4000)
        elif cap is not None:
            self.statusBar().showMessage(f"{name} was not captured: tick it and run again.", 4000)

    # -- files --------------------------------------------------------------------------------------
    def open_capture(self, path: str | None = None) -> int | None:
        """Open a ``.pt`` capture (in a worker) and show it; the model is not needed."""
        path = path or dialogs.ask_open_file(self, "Open a capture", dialogs.CAPTURE_FILTER)
        if not path:
            return None

        def task(progress, cancel):
            from core.capture_file import load_capture

            return ("open", load_capture(path), path)

        self.statusBar().showMessage(f"Opening {path}…")
        return self.file_runner.start(task)

    def export_capture(self, path: str | None = None) -> int | None:
        """Save the capture as ``.pt`` (in a worker)."""
        cap = self.session.capture
        if cap is None:
            self.show_error("Nothing to export", GradExplorerError("There is no capture yet.", "Run first (Ctrl+R)."))
            return None
        suggested = f"{str(cap.meta.get('model', 'capture')).replace(':', '_').replace('/', '_')}_gradients.pt"
        path = path or dialogs.ask_save_file(self, "Export capture", suggested, dialogs.CAPTURE_FILTER)
        if not path:
            return None

        def task(progress, cancel):
            from core.capture_file import save_capture

            return ("save", save_capture(cap, path), path)

        self.statusBar().showMessage(f"Saving {path}…")
        return self.file_runner.start(task)

    def _on_file_done(self, _gen: int, result, seconds: float) -> None:
        kind, value, path = result
        if kind == "open":
            self.run_runner.cancel()
            self.session.open_capture(value, path)
            self.statusBar().showMessage(f"Opened {path} ({len(value)} layers).", 8000)
        else:
            self.statusBar().showMessage(f"Saved {path} in {seconds:.1f} s.", 8000)
        self._update_status()
        self.file_done.emit(kind)

    def _on_file_failed(self, _gen: int, exc: BaseException) -> None:
        self.show_error("The file operation failed", exc)
        self.file_done.emit("failed")

    def export_png(self, path: str | None = None) -> None:
        path = path or dialogs.ask_save_file(self, "Export plot as PNG", "plot.png", "PNG images (*.png)")
        if path:
            try:
                self.views.export_png(path)
                self.statusBar().showMessage(f"Saved {path}.", 8000)
            except Exception as exc:  # noqa: BLE001 - shown to the user, window stays usable
                self.show_error("The plot cannot be exported", exc)

    def export_csv(self, path: str | None = None) -> None:
        path = path or dialogs.ask_save_file(self, "Export statistics as CSV", "statistics.csv", "CSV files (*.csv)")
        if path:
            try:
                self.views.export_csv(path)
                self.statusBar().showMessage(f"Saved {path}.", 8000)
            except Exception as exc:  # noqa: BLE001
                self.show_error("The statistics cannot be exported", exc)

    # -- misc ------------------------------------------------------------------------------------------
    def _show_model_tab(self) -> None:
        self.tabs.setCurrentWidget(self.model_panel)
        self.model_panel.search.setFocus()

    def _fill_recent_menu(self) -> None:
        self.recent_menu.clear()
        for spec in self.settings.recent_models():
            self.recent_menu.addAction(spec, lambda s=spec: self._on_model_requested(ModelRequest(s)))
        if self.recent_menu.isEmpty():
            self.recent_menu.addAction("(none yet)").setEnabled(False)

    def _about(self) -> None:
        QMessageBox.about(self, "About gradexplorer",
                          "<b>gradexplorer</b><br>See the gradients inside a PyTorch model: per-layer capture, "
                          "heatmaps, histograms, gradient flow and Grad-CAM.")

    def shutdown(self) -> None:
        """Cancel every worker and wait for them (on close, and at the end of tests)."""
        for runner in (self.run_runner, self.model_runner, self.batch_runner, self.file_runner, self.catalog_runner):
            runner.cancel()
        self.run_runner.shutdown(30000)

    def closeEvent(self, event: QCloseEvent) -> None:
        self.settings.set_geometry(self.saveGeometry())
        self.settings.set_value("window/splitter", [str(v) for v in self.splitter.sizes()])
        self.settings.sync()
        self.shutdown()
        super().closeEvent(event)
