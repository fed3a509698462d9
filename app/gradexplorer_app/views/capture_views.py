"""All views of one capture together: ``CaptureViews``, a selector bar (layer, call, sample),
the views in tabs, and the gradient-flow chart always visible underneath (clicking a bar
selects its layer). Only the visible tab draws; the others redraw when shown.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QSpinBox,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from gradexplorer.capturing.data import Capture, layer_label as shown_name
from gradexplorer.capturing.inputs import Batch
from gradexplorer.pipeline.view_state import ViewState, calls_of, clamp
from gradexplorer_app import dialogs
from gradexplorer_app.listeners import listen
from gradexplorer_app.views.context_menus import install_plot_menu
from gradexplorer_app.views.export import PLOT_FILTER, file_name, plot_bytes, write_export
from gradexplorer_app.views.flow_view import GradientFlowView
from gradexplorer_app.views.gradcam_view import GradCamView
from gradexplorer_app.views.heatmap_view import HeatmapView
from gradexplorer_app.views.histogram_view import HistogramView
from gradexplorer_app.views.label_fit import ElidedLabel, wrap_label
from gradexplorer_app.views.saliency_view import SaliencyView
from gradexplorer_app.views.stats_table import StatsTableView
from gradexplorer_app.views.view_context import CaptureView, ViewContext

__all__ = ["CaptureViews"]


class CaptureViews(QWidget):
    """All views of one capture, following one ``ViewState`` (layer, call, sample and
    the heatmap's channel, tensor and reduction).

    The state is passed in (the window shares it with the module tree and the batch
    panel) or made here for a views widget on its own. The selector bar writes to it;
    every view redraws from it.

    Signals
    -------
    layer_clicked(str)
        A bar of the gradient-flow chart was clicked (the state already selects it).
    selection_changed(str, int, int)
        Layer, call and sample after any change (from the state or the controls).
    """

    layer_clicked = Signal(str)
    selection_changed = Signal(str, int, int)

    def __init__(self, parent: QWidget | None = None, state: ViewState | None = None) -> None:
        super().__init__(parent)
        self.state = state if state is not None else ViewState()
        self._capture: Capture | None = None
        self._batch: Batch | None = None
        self._fitting = False
        #: ``(block, layer, call)``: the block the shown call stands for (``set_block``).
        self._block: tuple[str, str, int] | None = None

        self.layer_label = wrap_label(QLabel("no capture"))
        self.layer_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.call_label = QLabel("Call")
        self.call_combo = QComboBox()
        self.sample_spin = QSpinBox()
        self.sample_spin.setPrefix("sample ")
        self.sample_name = ElidedLabel()
        bar = QHBoxLayout()
        bar.setContentsMargins(4, 2, 4, 2)
        bar.addWidget(self.layer_label, 1)
        bar.addWidget(self.call_label)
        bar.addWidget(self.call_combo)
        bar.addWidget(self.sample_spin)
        bar.addWidget(self.sample_name)

        self.heatmap_view = HeatmapView(state=self.state)
        self.gradcam_view = GradCamView()
        self.histogram_view = HistogramView()
        self.stats_view = StatsTableView()
        self.saliency_view = SaliencyView()
        self.flow_view = GradientFlowView()
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        for view in self.views():
            self.tabs.addTab(view, view.title)

        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(self.tabs)
        splitter.addWidget(self.flow_view)
        # The flow chart has the room to name a deep model's layers under its bars.
        splitter.setStretchFactor(0, 4)
        splitter.setStretchFactor(1, 3)
        splitter.setChildrenCollapsible(False)
        splitter.setSizes([400, 300])
        self.splitter = splitter

        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 0)
        v.addLayout(bar)
        v.addWidget(splitter, 1)

        #: The files the window read (its owner sets it): an export never goes over one.
        self.files_read: Callable[[], Iterable[str | os.PathLike | None]] = lambda: ()
        # Right-click on a plot: copy its picture, or export it.
        for view in self.views():
            for widget in view.plot_widgets():
                install_plot_menu(widget, self.export_title, lambda: self.ask_export())
        install_plot_menu(self.flow_view.export_widget(), lambda: self.export_title("flow"),
                          lambda: self.ask_export("flow"))
        self.flow_view.layer_clicked.connect(self._on_flow_layer_clicked)
        self.call_combo.currentIndexChanged.connect(self._on_call_combo_changed)
        self.sample_spin.valueChanged.connect(self._on_sample_spin_changed)
        self.tabs.currentChanged.connect(self._on_tab_changed)
        events = self.state.events
        listen(events.layer, self._on_model_layer_changed)
        listen(events.call, self._on_model_selection_changed)
        listen(events.sample, self._on_model_selection_changed)
        self._sync_controls()
        self._push_context()

    # -- public API -------------------------------------------------------------------
    def views(self) -> list[CaptureView]:
        """The tabbed views, in tab order."""
        return [self.heatmap_view, self.gradcam_view, self.histogram_view, self.stats_view, self.saliency_view]

    def set_capture(self, capture: Capture | None, batch: Batch | None = None) -> None:
        """Show a capture (None clears). Keeps the selected layer if the capture has it,
        else opens on ``gradexplorer.analysis.capture_summary``'s default layer."""
        self._capture = capture
        # A dataset capture (gradexplorer.recording.dataset_capture) was not made from the batch on show:
        # its samples are the folder's, and their names are not that batch's.
        self._batch = None if capture is not None and capture.meta.get("dataset") else batch
        self.flow_view.set_capture(capture)
        # Other observers of the state (the module tree, the batch list) hear the new
        # selection; these views redraw once, below.
        self._fitting = True
        try:
            self.state.fit(capture, self._batch_size())
        finally:
            self._fitting = False
        self.flow_view.set_selected(self.state.layer)
        self._changed()

    def capture(self) -> Capture | None:
        return self._capture

    def set_block(self, shown: tuple[str, str, int] | None) -> None:
        """Name the block the selected call stands for in the header (a block the capture
        holds no record of, shown through the last captured call inside it), or None."""
        self._block = shown
        self._sync_controls()

    def selection(self) -> tuple[str | None, int, int]:
        return self.state.layer, self.state.call, self.state.sample

    def set_layer(self, name: str | None) -> None:
        """Select a layer, its first call (a name not in the capture shows a note)."""
        if name != self.state.layer:
            self.state.select(name, 0)

    def set_call(self, index: int) -> None:
        self.state.call = clamp(index, calls_of(self._capture, self.state.layer))

    def set_sample(self, index: int) -> None:
        self.state.sample = clamp(index, self._batch_size())

    def current_view(self) -> QWidget:
        return self.tabs.currentWidget()

    def show_view(self, title: str) -> CaptureView:
        """Bring a tab to the front by its title ("Heatmap", "Grad-CAM"...)."""
        for i, view in enumerate(self.views()):
            if view.title == title:
                self.tabs.setCurrentIndex(i)
                return view
        raise KeyError(title)

    def current_image_array(self) -> np.ndarray | None:
        """The 2-D array the heatmap shows (computed now if its tab is hidden)."""
        return self.heatmap_view.current_image_array()

    def export_png(self, path: str | os.PathLike, which: str | None = None,
                   inputs: Iterable[str | os.PathLike | None] = ()) -> Path:
        """Save the current tab's plot (or ``which="flow"``: the flow chart) atomically, as
        PNG at twice the screen's resolution or as SVG (by the suffix), under a title line
        (``export_title``); never over one of ``inputs``, the files the window read."""
        if which == "flow":
            widget = self.flow_view.export_widget()
        else:
            view = self.tabs.currentWidget()
            assert isinstance(view, CaptureView)  # every tab is a view of the capture
            view.ensure_drawn()
            widget = view.export_widget() if not view.message() else view
        return write_export(plot_bytes(widget, path, self.export_title(which)), path, inputs)

    def ask_export(self, which: str | None = None) -> Path | None:
        """Ask where to export the plot (named after the model, layer and view), then export it."""
        path = dialogs.ask_save_file(self, "Export plot", self.export_file_name(which), PLOT_FILTER)
        if not path:
            return None
        return self.export_png(path, which, inputs=self.files_read())

    def _model_name(self) -> str:
        cap = self._capture
        return str(cap.meta.get("model_name") or cap.meta.get("model") or "") if cap is not None else ""

    def export_title(self, which: str | None = None) -> str:
        """The title line of an exported plot: the model, the view and what it shows, the
        layer and its call, the sample, the target; "" without a capture."""
        cap = self._capture
        if cap is None:
            return ""
        view = self.tabs.currentWidget()
        if which == "flow":
            parts = [self._model_name(), f"gradient flow: {self.flow_view.export_detail()}"]
        else:
            assert isinstance(view, CaptureView)
            detail = view.export_detail()
            parts = [self._model_name(), view.title + (f": {detail}" if detail else "")]
            st = self.state
            if st.layer is not None:
                n = calls_of(cap, st.layer)
                parts.append(st.layer + (f", call {st.call + 1} of {n}" if n > 1 else ""))
                ctx = self._context()
                if not ctx.stats_only and view is not self.stats_view:
                    name = ctx.sample_name()
                    parts.append(f"sample {st.sample}" + (f" ({name})" if name != f"sample {st.sample}" else ""))
        target = cap.meta.get("target")
        if target:
            parts.append(f"target {target}")
        return " · ".join(p for p in parts if p)

    def export_file_name(self, which: str | None = None, suffix: str = ".png") -> str:
        """The file name an export suggests: model, layer and view
        (``resnet18_layer4.1.relu_heatmap.png``; it had been ``plot.png``)."""
        view = "flow" if which == "flow" else str(getattr(self.tabs.currentWidget(), "title", "plot")).lower()
        layer = None if which == "flow" else self.state.layer
        return file_name(self._model_name() or "capture", layer, view.replace(" ", "-"), suffix=suffix)

    def export_csv(self, path: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = ()) -> Path:
        """Save the statistics table of the selection as CSV, atomically; never over one of
        ``inputs``."""
        return self.stats_view.export_csv(path, inputs)

    # -- internals --------------------------------------------------------------------
    def _batch_size(self) -> int:
        return ViewContext(self._capture, self._batch).batch_size

    def _context(self) -> ViewContext:
        st = self.state
        return ViewContext(self._capture, self._batch, st.layer, st.call, st.sample)

    def _changed(self) -> None:
        self._sync_controls()
        self._push_context()
        if self.state.layer is not None:
            self.selection_changed.emit(*self.selection())

    def _push_context(self) -> None:
        ctx = self._context()
        for view in self.views():
            view.set_context(ctx)

    def _sync_controls(self) -> None:
        """Selection -> controls, signals blocked (never writes back)."""
        st = self.state
        n = calls_of(self._capture, st.layer)
        self.call_combo.blockSignals(True)
        self.call_combo.clear()
        for i in range(n):
            self.call_combo.addItem(f"call {i + 1} of {n}", i)
        self.call_combo.setCurrentIndex(st.call if n else -1)
        self.call_combo.blockSignals(False)
        self.call_combo.setVisible(n > 1)
        self.call_label.setVisible(n > 1)

        b = self._batch_size()
        self.sample_spin.blockSignals(True)
        self.sample_spin.setRange(0, max(b - 1, 0))
        self.sample_spin.setValue(st.sample)
        self.sample_spin.blockSignals(False)
        self.sample_spin.setEnabled(b > 1)
        ctx = self._context()
        self.sample_name.setText(f"of {b}: {ctx.sample_name()}" if b else "")
        # A statistics-only capture keeps no per-sample tensor: no sample to choose.
        self.sample_spin.setVisible(not ctx.stats_only)
        self.sample_name.setVisible(not ctx.stats_only)

        if self._capture is None:
            self.layer_label.setText("No capture")
        elif st.layer is None:
            self.layer_label.setText("No layer selected")
        else:
            rec = ctx.record
            kind = f" <span style='color:gray'>({rec.type})</span>" if rec else " (not captured)"
            if rec is not None and not rec.calls:
                kind += " · <i>not called</i>"
            mode = " · <i>statistics only</i>" if ctx.stats_only else ""
            block = self._block
            inside = ""
            if block is not None and block[1:] == (st.layer, st.call):
                inside = (f" · the last captured call inside <b>{block[0] or 'the model'}</b>, "
                          "which is not recorded itself")
            self.layer_label.setText(f"<b>{shown_name(st.layer)}</b>{kind}{inside}{mode}")

    # -- state -> widgets ---------------------------------------------------------------
    def _on_model_layer_changed(self, name: str | None) -> None:
        if self._fitting:
            return
        # A layer with fewer calls than the call index asked for shows its last call.
        with self.state.events.call.blocked():
            self.state.call = clamp(self.state.call, calls_of(self._capture, name))
        self.flow_view.set_selected(name)
        self._changed()

    def _on_model_selection_changed(self, _value: int) -> None:
        if not self._fitting:
            self._changed()

    # -- widgets -> state ---------------------------------------------------------------
    def _on_flow_layer_clicked(self, name: str) -> None:
        self.set_layer(name)
        self.layer_clicked.emit(name)

    def _on_call_combo_changed(self, index: int) -> None:
        if index >= 0:
            self.set_call(index)

    def _on_sample_spin_changed(self, value: int) -> None:
        self.set_sample(value)

    def _on_tab_changed(self, _index: int) -> None:
        view = self.tabs.currentWidget()
        if isinstance(view, CaptureView):
            view.ensure_drawn()
