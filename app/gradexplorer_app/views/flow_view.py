"""Gradient flow: a bar per captured layer, in forward order, on a log scale; click to select."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtGui import QFont, QFontMetrics, QResizeEvent
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from gradexplorer.analysis.capture_summary import summarize
from gradexplorer.analysis.gradient_flow import (
    EXPLODING_RATIO,
    FLAGS,
    METRIC_LABELS,
    NEIGHBOURS,
    NOT_CALLED,
    VANISHING_RATIO,
    flow_gaps,
    flow_series,
)
from gradexplorer.capturing.data import Capture, layer_label
from gradexplorer_app.views.label_fit import ElidedLabel, wrap_label
from gradexplorer_app.views.plot_style import (
    FLAG_COLOURS,
    MUTED,
    SELECTED_COLOUR,
    SELECTED_OUTLINE,
    LayerAxis,
    Log10Axis,
    set_axis_title,
    style_plot,
    style_plot_widget,
)

_KINDS = (("grad_output", "output gradient"), ("grad_input", "input gradient"),
          ("param", "parameter gradients"), ("activation", "activation"))
_BAR_WIDTH = 0.8


def _fmt(v: float) -> str:
    return f"{v:.3g}" if math.isfinite(v) else "—"


#: How the flags are judged (gradexplorer.analysis.gradient_flow), for the legend and its tooltip.
FLAG_RULE_SHORT = (f"vanishing / exploding: RMS gradient below {VANISHING_RATIO:g}× or above "
                   f"{EXPLODING_RATIO:g}× the median of the neighbouring layers ({NEIGHBOURS} on each side), "
                   "not an absolute size.")
FLAG_RULE = (FLAG_RULE_SHORT + " A layer whose gradients are all small, among neighbours equally small, is ok; "
             "zero: every gradient value is 0; no gradient: the layer ran and none reached it; not called: "
             "the layer never ran during forward (its parent used its weights directly), so it has no output "
             "to take a gradient at; nan/inf: a value is not finite.")
#: The line under the chart while no bar is under the mouse.
RULE_LINE = FLAG_RULE_SHORT + " Scroll or drag to zoom along the layers; every name shows when zoomed in."


class GradientFlowView(QWidget):
    """Bar chart of a per-layer gradient metric; emits ``layer_clicked(name)`` on a bar click."""

    title = "Gradient flow"
    layer_clicked = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._capture: Capture | None = None
        self._names: list[str] = []
        self._values = np.zeros(0)
        self._flags: dict[str, list[str]] = {}
        self._notes: dict[str, str] = {}
        #: Why a layer has no bar of this series (``flow_gaps``: not called, no gradient...).
        self._gaps: dict[str, str] = {}
        self._selected: str | None = None
        self._heights = np.zeros(0)
        self._base = 0.0

        self.metric_combo = QComboBox()
        for key, label in METRIC_LABELS.items():
            self.metric_combo.addItem(label, key)
        self.kind_combo = QComboBox()
        for key, label in _KINDS:
            self.kind_combo.addItem(label, key)
        self.legend_label = QLabel(self._legend_html())
        self.legend_label.setWordWrap(True)
        # One line under the chart: the flag rule (whole in its tooltip), and the bar under
        # the mouse while there is one. Two lines fewer than the rule wrapped, for the bars.
        self.hover_label = ElidedLabel(RULE_LINE)
        self.hover_label.setStyleSheet(f"QLabel {{ color: {MUTED}; }}")
        self.hover_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stop_label = wrap_label(QLabel())
        self.stop_label.setStyleSheet(f"QLabel {{ color: {FLAG_COLOURS['exploding']}; }}")
        self.stop_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stop_label.hide()

        # Names may stand upright: a deep model's chart names a bar every text line or so.
        self.layer_axis = LayerAxis("bottom", upright=True)
        self.name_font = QFont(self.font())
        self.name_font.setPointSizeF(max(7.0, self.name_font.pointSizeF() - 1))
        self.layer_axis.setStyle(tickFont=self.name_font)
        self.plot_widget = pg.PlotWidget(axisItems={"left": Log10Axis("left"), "bottom": self.layer_axis})
        style_plot_widget(self.plot_widget)
        self.plot = self.plot_widget.getPlotItem()
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.legend_label.setToolTip(FLAG_RULE)
        self.plot.showGrid(y=True, alpha=0.15)
        self.plot.vb.setMouseEnabled(x=True, y=False)
        style_plot(self.plot)
        self.bars = pg.BarGraphItem(x=[], height=[], width=_BAR_WIDTH)
        self.plot.addItem(self.bars)
        self.plot_widget.scene().sigMouseClicked.connect(self._on_scene_clicked)
        self.plot_widget.scene().sigMouseMoved.connect(self._on_mouse_moved)

        row = QHBoxLayout()
        row.addWidget(QLabel("Gradient flow:"))
        row.addWidget(self.metric_combo)
        row.addWidget(QLabel("of"))
        row.addWidget(self.kind_combo)
        row.addStretch(1)
        v = QVBoxLayout(self)
        v.setContentsMargins(4, 4, 4, 4)
        v.addLayout(row)
        v.addWidget(self.plot_widget, 1)
        v.addWidget(self.legend_label)
        v.addWidget(self.stop_label)
        v.addWidget(self.hover_label)

        self.metric_combo.currentIndexChanged.connect(self._rebuild)
        self.kind_combo.currentIndexChanged.connect(self._rebuild)
        self._rebuild()

    # -- public API -------------------------------------------------------------------
    def set_capture(self, capture: Capture | None) -> None:
        self._capture = capture
        summary = summarize(capture) if capture is not None else None
        self._flags = summary.flags if summary is not None else {}
        self._notes = dict(summary.notes) if summary is not None else {}
        # Where the gradient stops (every layer before it zero), whole and wrapped under the
        # chart: it is the first thing to know about such a capture.
        stop = summary.stop if summary is not None else None
        self.stop_label.setText(f"⚠ {stop.sentence()}" if stop is not None else "")
        self.stop_label.setVisible(stop is not None)
        self._rebuild()

    def stop_text(self) -> str:
        """The warning under the chart where the gradient stops, or ""."""
        return self.stop_label.text() if not self.stop_label.isHidden() else ""

    def set_selected(self, name: str | None) -> None:
        """Highlight a layer's bar (no signal)."""
        if name != self._selected:
            self._selected = name
            self._paint()

    def set_metric(self, metric: str, kind: str | None = None) -> None:
        self.metric_combo.setCurrentIndex(self.metric_combo.findData(metric))
        if kind is not None:
            self.kind_combo.setCurrentIndex(self.kind_combo.findData(kind))

    def series(self) -> tuple[list[str], np.ndarray]:
        return list(self._names), self._values.copy()

    def gaps(self) -> dict[str, str]:
        """Why layers have no bar of the series shown (``flow_gaps``)."""
        return dict(self._gaps)

    def flags(self) -> dict[str, list[str]]:
        return dict(self._flags)

    def bar_scene_pos(self, index: int) -> QPointF:
        """Scene position of the middle of bar ``index`` (for tests and tooltips)."""
        y = self._base + 0.5 * (self._heights[index] if index < len(self._heights) else 0.0)
        return self.plot.vb.mapViewToScene(QPointF(float(index), y))

    def index_at_scene_pos(self, scene_pos: QPointF) -> int | None:
        """The bar under a scene position (nearest bar centre along x), or None."""
        if not self._names or not self.plot.vb.sceneBoundingRect().contains(scene_pos):
            return None
        x = self.plot.vb.mapSceneToView(scene_pos).x()
        i = int(round(x))
        if 0 <= i < len(self._names) and abs(x - i) <= 0.5:
            return i
        return None

    def export_widget(self) -> QWidget:
        return self.plot_widget

    def export_detail(self) -> str:
        return f"{self.metric_combo.currentText()} of {self.kind_combo.currentText()}"

    # -- drawing ----------------------------------------------------------------------
    @staticmethod
    def _legend_html() -> str:
        items = [("ok", "ok")] + [(f, f) for f in FLAGS] + [(NOT_CALLED, NOT_CALLED), ("selected", "selected")]
        spans = []
        for key, label in items:
            colour = SELECTED_COLOUR if key == "selected" else FLAG_COLOURS[key]
            # An entry never breaks inside ("not" and "called" on two lines): only between entries.
            spans.append(f"<span style='color:{colour}'>■</span>&nbsp;{label.replace(' ', '&nbsp;')}")
        return "&nbsp; ".join(spans)

    def _rebuild(self, *_: object) -> None:
        cap = self._capture
        if cap is None or len(cap) == 0:
            self._names, self._values = [], np.zeros(0)
            self._gaps = {}
        else:
            names, values = flow_series(cap, self.metric_combo.currentData(), self.kind_combo.currentData())
            self._names, self._values = names, np.asarray(values, dtype=np.float64)
            self._gaps = flow_gaps(cap, self.kind_combo.currentData())
        vals = self._values
        ok = np.isfinite(vals) & (vals > 0)
        logs = np.where(ok, np.log10(np.where(ok, vals, 1.0)), np.nan)
        if ok.any():
            lo, hi = float(np.nanmin(logs)), float(np.nanmax(logs))
            base = math.floor(lo) - 0.5 if hi > lo else lo - 1.0
            top = max(hi, base + 1.0)
        else:
            base, top = 0.0, 1.0
        stub = 0.03 * (top - base)
        # Missing and zero values get a short grey stub, so that they can still be clicked.
        self._heights = np.where(ok, logs - base, stub)
        self._base = base
        self._set_ticks()
        self._paint()
        n = len(self._names)
        self.plot.setXRange(-0.6, max(n, 1) - 0.4, padding=0)
        self.plot.setYRange(base, top + 0.05 * (top - base), padding=0)
        # No values, no scale: an empty chart's axis would read 1e0 to 6e0 of nothing.
        self.plot.getAxis("left").setStyle(showValues=bool(ok.any()))
        set_axis_title(self.plot, "left", self.metric_combo.currentText())

    def _set_ticks(self) -> None:
        # The model's own record (layer "") is named as tables name it: "(model)".
        self.layer_axis.set_names([layer_label(n) for n in self._names], QFontMetrics(self.name_font))

    def tick_names(self) -> list[str]:
        """The layer names labelled on the axis at the present zoom (for tests)."""
        return [layer_label(self._names[i]) for i in self.layer_axis.labelled_now()]

    def _colour(self, i: int) -> str:
        name = self._names[i]
        if self._gaps.get(name) == NOT_CALLED:
            return FLAG_COLOURS[NOT_CALLED]
        for flag in FLAGS:
            if flag in self._flags.get(name, ()):
                return FLAG_COLOURS[flag]
        if not (math.isfinite(self._values[i]) and self._values[i] > 0):
            return FLAG_COLOURS["zero"]
        return FLAG_COLOURS["ok"]

    def _paint(self) -> None:
        n = len(self._names)
        brushes = [pg.mkBrush(self._colour(i)) for i in range(n)]
        pens = [pg.mkPen(None) for _ in range(n)]
        if self._selected in self._names:
            i = self._names.index(self._selected)
            brushes[i] = pg.mkBrush(SELECTED_COLOUR)
            pens[i] = pg.mkPen(SELECTED_OUTLINE, width=1.5)
        # pyqtgraph 0.14 fails on empty pen lists: no bars, no per-bar pens.
        self.bars.setOpts(x=np.arange(n, dtype=float), y0=np.full(n, self._base), height=self._heights,
                          width=_BAR_WIDTH, brushes=brushes or None, pens=pens or None)

    def describe_bar(self, i: int) -> str:
        name = self._names[i]
        assert self._capture is not None  # the bars are the capture's layers
        rec = self._capture[name]
        calls = f", {len(rec.calls)} calls" if len(rec.calls) > 1 else ""
        flags = self._flags.get(name, [])
        flag_text = f" · ⚠ {', '.join(flags)}" if flags else ""
        note = f" · {self._notes[name]}" if name in self._notes else ""
        gap = self._gaps.get(name)
        if gap == NOT_CALLED:
            value = ("not called: it never ran during forward (its parent used its weights directly), so it has "
                     "no output to take a gradient at")
        elif gap is not None:
            value = gap
        else:
            value = f"{self.metric_combo.currentText()} of {self.kind_combo.currentText()} = {_fmt(self._values[i])}"
        return f"{layer_label(name)} ({rec.type}{calls}) · {value}{flag_text}{note}"

    # -- events -----------------------------------------------------------------------
    def _on_scene_clicked(self, event: Any) -> None:  # pyqtgraph's MouseClickEvent
        """Map the click's x to the nearest bar and emit its layer name."""
        if event.button() != Qt.MouseButton.LeftButton:
            return
        i = self.index_at_scene_pos(event.scenePos())
        if i is None:
            return
        event.accept()
        name = self._names[i]
        self.set_selected(name)
        self.layer_clicked.emit(name)

    def _on_mouse_moved(self, pos: QPointF) -> None:
        i = self.index_at_scene_pos(pos)
        if i is None:
            self.plot_widget.setToolTip("")
            if self.hover_label.full_text() != RULE_LINE:
                self.hover_label.setText(RULE_LINE)
            return
        text = self.describe_bar(i)
        self.hover_label.setText(text)
        self.plot_widget.setToolTip(text)

    #: The most of the chart's height that the upright names under it may take.
    NAME_BAND_SHARE = 0.4

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.layer_axis.set_band_limit(int(self.plot_widget.height() * self.NAME_BAND_SHARE))
        self._set_ticks()
