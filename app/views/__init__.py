"""Views of a capture: heatmap, Grad-CAM, histogram, statistics, saliency, and gradient flow.

``CaptureViews`` puts them together: a selector bar (layer, call, sample), the views in
tabs, and the gradient-flow chart always visible underneath (clicking a bar selects
its layer). Only the visible tab draws; the others redraw when shown.
"""

from __future__ import annotations

import os
import tempfile
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

from app.views.flow_view import GradientFlowView
from app.views.gradcam_view import GradCamView
from app.views.heatmap_view import HeatmapView
from app.views.histogram_view import HistogramView
from app.views.saliency_view import SaliencyView
from app.views.stats_table import StatsTableView
from app.views.view_context import CaptureView, ViewContext
from core.batch import Batch
from core.capture_data import Capture
from core.gradcam import cam_supported

__all__ = [
    "CaptureView",
    "CaptureViews",
    "GradCamView",
    "GradientFlowView",
    "HeatmapView",
    "HistogramView",
    "SaliencyView",
    "StatsTableView",
    "ViewContext",
]


def default_layer(capture: Capture) -> str | None:
    """The layer to show first: the last one with a spatial map (at least 2×2, so Grad-CAM
    shows a place) whose gradient was captured, else the first captured layer."""
    best = None
    for name in capture.layer_order:
        calls = capture[name].calls
        if not calls or not calls[0].stats.get("grad_output") or not cam_supported(calls[0].shape):
            continue
        shape = calls[0].shape
        area = shape[2] * shape[3] if len(shape) == 4 else shape[1] - 1
        if area >= 4:
            best = name
    return best or (capture.layer_order[0] if len(capture) else None)


def _atomic_grab(widget: QWidget, path: str | os.PathLike) -> Path:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        if not widget.grab().save(tmp, "PNG"):
            raise OSError(f"could not write the picture to {path}")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class CaptureViews(QWidget):
    """All views of one capture, with a shared layer / call / sample selection.

    Signals
    -------
    layer_clicked(str)
        A bar of the gradient-flow chart was clicked (the widget also selects it).
    selection_changed(str, int, int)
        Layer, call and sample after any change (from the API or the widget's controls).
    """

    layer_clicked = Signal(str)
    selection_changed = Signal(str, int, int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._capture: Capture | None = None
        self._batch: Batch | None = None
        self._layer: str | None = None
        self._call = 0
        self._sample = 0

        self.layer_label = QLabel("no capture")
        self.layer_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.call_label = QLabel("Call")
        self.call_combo = QComboBox()
        self.sample_spin = QSpinBox()
        self.sample_spin.setPrefix("sample ")
        self.sample_name = QLabel()
        bar = QHBoxLayout()
        bar.setContentsMargins(4, 2, 4, 2)
        bar.addWidget(self.layer_label, 1)
        bar.addWidget(self.call_label)
        bar.addWidget(self.call_combo)
        bar.addWidget(self.sample_spin)
        bar.addWidget(self.sample_name)

        self.heatmap_view = HeatmapView()
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
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 1)
        splitter.setChildrenCollapsible(False)
        splitter.setSizes([620, 280])
        self.splitter = splitter

        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 0)
        v.addLayout(bar)
        v.addWidget(splitter, 1)

        self.flow_view.layer_clicked.connect(self._on_flow_layer_clicked)
        self.call_combo.currentIndexChanged.connect(self._on_call_combo_changed)
        self.sample_spin.valueChanged.connect(self._on_sample_spin_changed)
        self.tabs.currentChanged.connect(self._on_tab_changed)
        self._sync_controls()
        self._push_context()

    # -- public API -------------------------------------------------------------------
    def views(self) -> list[CaptureView]:
        """The tabbed views, in tab order."""
        return [self.heatmap_view, self.gradcam_view, self.histogram_view, self.stats_view, self.saliency_view]

    def set_capture(self, capture: Capture | None, batch: Batch | None = None) -> None:
        """Show a capture (None clears). Keeps the selected layer if the capture has it."""
        self._capture = capture
        self._batch = batch
        layer = self._layer
        if capture is None:
            layer = None
        elif layer not in capture:
            layer = default_layer(capture)
        self._layer = layer
        self._call = self._clamped_call(self._call)
        self._sample = self._clamped_sample(self._sample)
        self.flow_view.set_capture(capture)
        self.flow_view.set_selected(layer)
        self._sync_controls()
        self._push_context()
        if layer is not None:
            self.selection_changed.emit(layer, self._call, self._sample)

    def capture(self) -> Capture | None:
        return self._capture

    def selection(self) -> tuple[str | None, int, int]:
        return self._layer, self._call, self._sample

    def set_layer(self, name: str | None) -> None:
        """Select a layer (a name not in the capture shows a note in the views)."""
        if name == self._layer:
            return
        self._layer = name
        self._call = self._clamped_call(0)
        self.flow_view.set_selected(name)
        self._changed()

    def set_call(self, index: int) -> None:
        index = self._clamped_call(index)
        if index != self._call:
            self._call = index
            self._changed()

    def set_sample(self, index: int) -> None:
        index = self._clamped_sample(index)
        if index != self._sample:
            self._sample = index
            self._changed()

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

    def export_png(self, path: str | os.PathLike, which: str | None = None) -> Path:
        """Save the current tab's plot (or ``which="flow"``: the flow chart) as PNG, atomically."""
        if which == "flow":
            widget = self.flow_view.export_widget()
        else:
            view = self.tabs.currentWidget()
            view.ensure_drawn()
            widget = view.export_widget() if not view.message() else view
        return _atomic_grab(widget, path)

    def export_csv(self, path: str | os.PathLike) -> Path:
        """Save the statistics table of the selection as CSV, atomically."""
        return self.stats_view.export_csv(path)

    # -- internals --------------------------------------------------------------------
    def _n_calls(self) -> int:
        if self._capture is None or self._layer not in self._capture:
            return 0
        return len(self._capture[self._layer].calls)

    def _clamped_call(self, index: int) -> int:
        n = self._n_calls()
        return min(max(int(index), 0), max(n - 1, 0))

    def _batch_size(self) -> int:
        return ViewContext(self._capture, self._batch).batch_size

    def _clamped_sample(self, index: int) -> int:
        return min(max(int(index), 0), max(self._batch_size() - 1, 0))

    def _changed(self) -> None:
        self._sync_controls()
        self._push_context()
        if self._layer is not None:
            self.selection_changed.emit(self._layer, self._call, self._sample)

    def _push_context(self) -> None:
        ctx = ViewContext(self._capture, self._batch, self._layer, self._call, self._sample)
        for view in self.views():
            view.set_context(ctx)

    def _sync_controls(self) -> None:
        """Selection -> controls, signals blocked (never writes back)."""
        n = self._n_calls()
        self.call_combo.blockSignals(True)
        self.call_combo.clear()
        for i in range(n):
            self.call_combo.addItem(f"call {i + 1} of {n}", i)
        self.call_combo.setCurrentIndex(self._call if n else -1)
        self.call_combo.blockSignals(False)
        self.call_combo.setVisible(n > 1)
        self.call_label.setVisible(n > 1)

        b = self._batch_size()
        self.sample_spin.blockSignals(True)
        self.sample_spin.setRange(0, max(b - 1, 0))
        self.sample_spin.setValue(self._sample)
        self.sample_spin.blockSignals(False)
        self.sample_spin.setEnabled(b > 1)
        ctx = ViewContext(self._capture, self._batch, self._layer, self._call, self._sample)
        self.sample_name.setText(f"of {b}: {ctx.sample_name()}" if b else "")

        if self._capture is None:
            self.layer_label.setText("No capture")
        elif self._layer is None:
            self.layer_label.setText("No layer selected")
        else:
            rec = ctx.record
            kind = f" <span style='color:gray'>({rec.type})</span>" if rec else " (not captured)"
            mode = " · <i>statistics only</i>" if ctx.stats_only else ""
            self.layer_label.setText(f"<b>{self._layer}</b>{kind}{mode}")

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
