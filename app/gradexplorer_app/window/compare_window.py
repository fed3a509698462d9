"""The compare window: "Compare with…" after a run, or two capture files side by side.

The window owns a :class:`~gradexplorer_app.views.compare_view.CompareView` and a task runner: loading
files and running the second capture happen in a worker thread (``gradexplorer.pipeline.compare_sources``),
never on the GUI thread. The questions ("compare with what?") go through ``gradexplorer_app.dialogs``
so that tests answer them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TypeAlias

from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import QMainWindow, QProgressBar, QTabWidget, QWidget

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.file_write import check_output_path
from gradexplorer.capturing.data import Capture
from gradexplorer.capturing.inputs import Batch
from gradexplorer.comparison.compare import Comparison, compare, save_csv
from gradexplorer.files.capture_file import load_capture
from gradexplorer.model_graph.compare import attach_comparison
from gradexplorer.model_graph.graph import ModelGraph
from gradexplorer.model_graph.statistics import DIVERGENCE_BY
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.compare_sources import Variant, compare_variant, options_from_session
from gradexplorer.pipeline.options import BatchSpec, CaptureOptions
from gradexplorer.pipeline.session import Session
from gradexplorer_app import dialogs
from gradexplorer_app.run_worker import Progress, Task, TaskRunner
from gradexplorer_app.views.compare_view import CompareView
from gradexplorer_app.views.graph_view import GraphPanel
from gradexplorer_app.views.label_fit import ElidedLabel
from gradexplorer_app.window import error_dialog
from gradexplorer_app.window.screen_fit import keep_on_screen

#: What a comparison's worker hands back: A, B and their comparison.
Compared: TypeAlias = tuple[Capture, Capture, Comparison]

#: What "Compare with…" offers, in the order of the list.
CHOICES = (
    "a capture file…",
    "the same batch under autocast bf16",
    "the same batch under autocast fp16",
    "the same batch in train mode",
    "the same batch with other weights…",
    "another checkpoint…",
    "another input…",
    "another target…",
    "the same batch on another device…",
)


def ask_source(parent: QWidget | None, devices: list[str] | None = None) -> str | Variant | None:
    """Ask what to compare with. Returns a file path (str), a ``Variant``, or None."""
    choice = dialogs.ask_item(parent, "Compare with…", "Compare this capture (A) with (B):", list(CHOICES),
                              editable=False)
    if not choice:
        return None
    if choice == CHOICES[0]:
        return dialogs.ask_open_file(parent, "Capture to compare with", dialogs.CAPTURE_FILTER)
    if choice in CHOICES[1:3]:
        return Variant(autocast="bf16" if "bf16" in choice else "fp16")
    if choice == CHOICES[3]:
        return Variant(train=True)
    if choice == CHOICES[4]:
        path = dialogs.ask_open_file(parent, "Weights (a state dict)", dialogs.WEIGHTS_FILTER)
        return Variant(weights=path) if path else None
    if choice == CHOICES[5]:
        path = dialogs.ask_open_file(parent, "Checkpoint", dialogs.CHECKPOINT_FILTER)
        return Variant(model=path) if path else None
    if choice == CHOICES[6]:
        files = dialogs.ask_open_files(parent, "Input images or a .pt tensor", dialogs.IMAGE_FILTER)
        return Variant(batch=BatchSpec(inputs=tuple(files))) if files else None
    if choice == CHOICES[7]:
        text = dialogs.ask_text(parent, "Another target",
                               "Target (top1, class:N, sum, mean, cross_entropy; ,dim=-1 when the classes are last):")
        return Variant(target=text) if text else None
    device = dialogs.ask_item(parent, "Another device", "Device:", devices or ["cpu", "cuda:0", "mps"])
    return Variant(device=device) if device else None


class CompareWindow(QMainWindow):
    """A top-level window showing one comparison; ``runner`` does the heavy work."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("gradexplorer — compare")
        self.view = CompareView(self)
        # The layers (table, heatmaps, flow) and the model graph coloured by divergence.
        self.graph_panel = GraphPanel(self, statistics=DIVERGENCE_BY)
        #: The files A and B were read from (captures, models, weights, inputs): the exports
        #: never go over one of them.
        self.files_read: list[str] = []
        self.graph_panel.files_read = lambda: self.files_read
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self.view, "Layers")
        self.tabs.addTab(self.graph_panel, "Graph")
        self.setCentralWidget(self.tabs)
        self.graph_panel.layer_selected.connect(self.view.select)
        self.view.call_selected.connect(self.graph_panel.select_layer)
        self.runner = TaskRunner("compare", self)
        self.status_label = ElidedLabel("")
        self.progress_bar = QProgressBar()
        self.progress_bar.setMaximumWidth(220)
        self.progress_bar.hide()
        self.statusBar().addWidget(self.status_label, 1)
        self.statusBar().addPermanentWidget(self.progress_bar)
        self.export_action = QAction("Export comparison as &CSV…", self)
        self.export_action.setShortcut(QKeySequence("Ctrl+Shift+C"))
        self.export_action.setEnabled(False)
        self.export_action.triggered.connect(lambda: self.export_csv())
        menu = self.menuBar().addMenu("&File")
        menu.addAction(self.export_action)
        close = QAction("&Close", self)
        close.setShortcut(QKeySequence("Ctrl+W"))
        close.triggered.connect(self.close)
        menu.addAction(close)
        self.runner.progress.connect(self._on_progress)
        self.runner.finished.connect(self._on_finished)
        self.runner.failed.connect(self._on_failed)
        self.runner.cancelled.connect(lambda _g: self._done_status("cancelled"))
        self.resize(1400, 900)
        keep_on_screen(self)

    # -- starting work ------------------------------------------------------------------
    def compare_captures(self, a: Capture, b: Capture, label_a: str = "A", label_b: str = "B") -> int:
        """Compare two captures already in memory (off the GUI thread: it is all tensors)."""
        def task(progress: Progress, cancel: threading.Event) -> Compared:
            progress("comparing", 0, 0)
            return a, b, compare(a, b, label_a=label_a, label_b=label_b)

        return self._start(task, "comparing")

    def compare_files(self, path_a: str, path_b: str) -> int:
        """Load two capture files and compare them."""
        self.files_read = [path_a, path_b]
        def task(progress: Progress, cancel: threading.Event) -> Compared:
            progress("reading A", 0, 0)
            a = load_capture(path_a)
            progress("reading B", 0, 0)
            b = load_capture(path_b)
            progress("comparing", 0, 0)
            return a, b, compare(a, b, label_a=Path(path_a).name, label_b=Path(path_b).name)

        return self._start(task, "reading captures")

    def compare_with_file(self, reference: Capture, path: str, label_a: str = "the window's capture") -> int:
        """Compare a capture in memory (A) with a capture file (B)."""
        self.files_read.append(path)
        def task(progress: Progress, cancel: threading.Event) -> Compared:
            progress("reading B", 0, 0)
            b = load_capture(path)
            progress("comparing", 0, 0)
            return reference, b, compare(reference, b, label_a=label_a, label_b=Path(path).name)

        return self._start(task, "reading capture")

    def compare_variant(self, base: CaptureOptions, variant: Variant, *, reference: Capture | None = None,
                        loaded: LoadedModel | None = None, batch: Batch | None = None,
                        lock: threading.Lock | None = None) -> int:
        """Run B (``variant`` of the options ``base``) and compare it with A."""
        def task(progress: Progress, cancel: threading.Event) -> Compared:
            runs = compare_variant(base, variant, reference=reference, loaded=loaded, batch=batch, lock=lock,
                                   progress=progress, cancel=cancel)
            return runs.a, runs.b, runs.result

        return self._start(task, "capturing B")

    def _start(self, task: Task, what: str) -> int:
        self.status_label.setText(what + "…")
        self.progress_bar.setRange(0, 0)
        self.progress_bar.show()
        return self.runner.start(task)

    # -- results ------------------------------------------------------------------------
    def _on_progress(self, _gen: int, stage: str, done: int, total: int) -> None:
        self.status_label.setText(stage)
        if total:
            self.progress_bar.setRange(0, total)
            self.progress_bar.setValue(done)
        else:
            self.progress_bar.setRange(0, 0)

    def _on_finished(self, _gen: int, result: Compared, seconds: float) -> None:
        a, b, comparison = result
        self.view.set_comparison(a, b, comparison)
        self.show_graph(a, b, comparison)
        self.export_action.setEnabled(True)
        self._done_status(f"compared in {seconds:.2f} s")

    def show_graph(self, a: Capture, b: Capture, comparison: Comparison) -> bool:
        """Draw the graph a capture carries (A's, else B's), coloured by ``comparison``.
        Returns False (and says why in the graph tab) when neither carries one."""
        side, data = ("a", a.graph) if getattr(a, "graph", None) else ("b", getattr(b, "graph", None))
        graph = None
        if data:
            try:
                graph = ModelGraph.from_dict(data, source="the capture's graph")
            except GradExplorerError:
                graph = None
        if graph is None:
            self.graph_panel.set_graph(None)
            self.graph_panel.status.setText("Neither capture carries a model graph (captures from gradexplorer "
                                            "before the graph, or a model whose graph could not be found).")
            return False
        attach_comparison(graph, comparison, side=side)
        self.graph_panel.set_graph(graph)
        return True

    def _on_failed(self, _gen: int, exc: BaseException) -> None:
        self._done_status("failed")
        error_dialog.show_error(self, "Cannot compare", exc)

    def _done_status(self, text: str) -> None:
        self.progress_bar.hide()
        self.status_label.setText(text)

    def export_csv(self, path: str | None = None) -> Path | None:
        """Write the comparison's figures as CSV (asks where when no path is given)."""
        if self.view.result is None:
            return None
        path = path or dialogs.ask_save_file(self, "Export comparison as CSV", "comparison.csv", "CSV files (*.csv)")
        if not path:
            return None
        try:
            check_output_path(path, self.files_read)
            return save_csv(self.view.result, path)
        except GradExplorerError as exc:
            error_dialog.show_error(self, "Cannot export", exc)
            return None

    def shutdown(self) -> None:
        """Cancel this window's comparison and graph work and wait for it (on close, and
        when the main window shuts down)."""
        self.runner.shutdown()
        self.graph_panel.shutdown()

    def closeEvent(self, event: QCloseEvent) -> None:
        self.shutdown()
        super().closeEvent(event)


def compare_with(parent: QWidget | None, session: Session, devices: list[str] | None = None) -> CompareWindow | None:
    """The "Compare with…" action of the main window: ask, then open a compare window.

    ``session`` is the window's ``gradexplorer.pipeline.session.Session`` after a run; A is its capture.
    Returns the window (shown), or None when the user cancelled or there is no capture.
    """
    if session.capture is None:
        error_dialog.show_error(parent, "Nothing to compare", GradExplorerError(
            "There is no capture to compare yet.", "Run a capture first (Ctrl+R)."))
        return None
    source = ask_source(parent, devices)
    if source is None:
        return None
    window = CompareWindow(parent)
    window.files_read = session.files_read()
    if isinstance(source, Variant):
        try:
            base = options_from_session(session)
            b = source.apply(base)  # a variant that changes nothing fails here, not in the worker
            window.files_read += [f for f in (b.model, b.weights, b.labels, *b.batch.sources()) if f]
        except GradExplorerError as exc:
            error_dialog.show_error(parent, "Cannot compare", exc)
            window.deleteLater()
            return None
        request = session.run_request(new_generation=False)
        reuse_model = not source.new_model
        window.compare_variant(base, source, reference=session.capture,
                               loaded=request.loaded if reuse_model else None,
                               batch=request.batch, lock=request.lock)
    else:
        window.compare_with_file(session.capture, source, label_a=capture_name(session))
    window.show()
    return window


def capture_name(session: Session) -> str:
    """The window's capture named by its source, as A in a comparison: the file it was
    opened from, else the model it was run on ("this run" had named neither)."""
    if session.capture_path:
        return Path(session.capture_path).name
    cap = session.capture
    model = session.model.spec if session.model is not None else (
        str(cap.meta.get("model_name") or cap.meta.get("model") or "model") if cap is not None else "model")
    mode = cap.meta.get("mode") if cap is not None else None
    target = cap.meta.get("target") if cap is not None else None
    words = [model, "the window's run"]
    if target:
        words.append(f"target {target}")
    if mode == "stats":
        words.append("statistics only")
    return ", ".join(words)
