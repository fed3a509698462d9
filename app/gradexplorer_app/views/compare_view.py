"""Where two captures diverge: a table of the calls in model order (or largest difference
first), A | B heatmaps on one symmetric colour scale beside A − B on its own, and the
gradient flow of both with their ratio.

Everything drawn here is computed in ``gradexplorer.comparison.compare`` (the comparison, the heatmap triple,
the flow comparison); this view only lays it out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
import torch
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFontMetrics
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSpinBox,
    QSplitter,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gradexplorer.analysis.heatmaps import Heatmap, grid_columns, layout_of
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.data import Capture
from gradexplorer.comparison.compare import CallDiff, Comparison, HeatmapTriple, flow_comparison, heatmap_triple
from gradexplorer_app.views.context_menus import FULL_VALUE_ROLE, full_value, install_table_copy
from gradexplorer_app.views.label_fit import wrap_label
from gradexplorer_app.views.plot_style import (
    FOREGROUND,
    MUTED,
    SELECTED_COLOUR,
    LayerAxis,
    Log10Axis,
    ScaleBar,
    image_plot,
    set_axis_title,
    style_plot,
    style_plot_widget,
)

#: Table columns.
COLUMNS = ("Layer", "Call", "Type", "Act rel L2", "Grad rel L2", "Grad ‖B‖/‖A‖", "Status")
_TENSORS = (("activation", "activation"), ("grad_output", "gradient"))
_ORDERS = (("model", "model order"), ("divergence", "largest difference first"))
_DISPLAYS = (("topk", "top-k channels of A"), ("channel", "one channel"), ("reduce", "mean over channels"))
_FLOW_KINDS = (("grad_output", "output gradient"), ("activation", "activation"))
_A_COLOUR = "#4c8bd6"
_B_COLOUR = "#59c26b"
_RATIO_COLOUR = MUTED
#: The first diverging rows: a light red behind the table's dark text.
_FIRST_COLOUR = "#f8d0cc"


def _fmt(v: float | None) -> str:
    if v is None:
        return "—"
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf"
    return "0" if v == 0 else f"{v:.3g}"


def _fmt_ratio(v: float | None) -> str:
    # Ratios of norms sit near 1: three digits would show 1 for 0.9997.
    return _fmt(v) if v is None or not math.isfinite(v) or v == 0 else f"{v:.5g}"


def _rel(c: CallDiff, kind: str) -> float | None:
    kd = c.kinds.get(kind)
    return None if kd is None else kd.divergence


class CompareView(QWidget):
    """The comparison of capture B with reference A.

    Signals
    -------
    call_selected(str, int)
        A's layer name and call index of the row the user picked.
    """

    title = "Compare"
    call_selected = Signal(str, int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.a: Capture | None = None
        self.b: Capture | None = None
        self.result: Comparison | None = None
        self.mapping: dict[str, str] = {}
        self._rows: list[CallDiff] = []
        self._current: CallDiff | None = None
        self.triple: HeatmapTriple | None = None
        self.ratio_log = False

        self.summary_label = QLabel("No comparison yet: use Compare with… after a run, or open two captures.")
        self.summary_label.setWordWrap(True)
        self.summary_label.setTextFormat(Qt.TextFormat.RichText)
        self.summary_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._build_table()
        heat_box = self._build_heatmaps()
        flow_box = self._build_flow()
        self._lay_out(heat_box, flow_box)
        self._connect()
        self._update_controls()

    def _build_table(self) -> None:
        """The calls' table and the order of its rows."""
        self.order_combo = QComboBox()
        for key, label in _ORDERS:
            self.order_combo.addItem(label, key)
        self.order_combo.setToolTip("The calls in the order the model runs them, or the ones that differ "
                                    "most first (by the relative L2 difference of their gradient, else "
                                    "activation)")
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.table.itemSelectionChanged.connect(self._on_row_selected)
        install_table_copy(self.table)

    def _build_heatmaps(self) -> QWidget:
        """The heatmaps' controls over A | B | A − B; returns their box."""
        controls = self._build_heat_controls()
        self.heat_title = wrap_label(QLabel(" "))
        self._build_heat_plots()
        self.heat_note = QLabel()
        self.heat_note.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.heat_note.setWordWrap(True)
        self.heat_note.setStyleSheet("QLabel { color: palette(placeholder-text); font-size: 13px; padding: 24px; }")
        self.heat_stack = QStackedWidget()
        self.heat_stack.addWidget(self.heat_widget)
        self.heat_stack.addWidget(self.heat_note)
        heat_box = QWidget()
        hv = QVBoxLayout(heat_box)
        hv.setContentsMargins(0, 0, 0, 0)
        hv.addLayout(controls)
        hv.addWidget(self.heat_title)
        hv.addWidget(self.heat_stack, 1)
        return heat_box

    def _build_heat_controls(self) -> QHBoxLayout:
        """Tensor, display, channel, k, sample and the scale of A − B, in one row."""
        self.tensor_combo = QComboBox()
        for key, label in _TENSORS:
            self.tensor_combo.addItem(label, key)
        self.display_combo = QComboBox()
        for key, label in _DISPLAYS:
            self.display_combo.addItem(label, key)
        self.channel_spin = QSpinBox()
        self.channel_spin.setPrefix("channel ")
        self.k_spin = QSpinBox()
        self.k_spin.setRange(1, 64)
        self.k_spin.setValue(9)
        self.k_spin.setPrefix("k = ")
        self.sample_spin = QSpinBox()
        self.sample_spin.setPrefix("sample ")
        # A − B on its own symmetric scale by default: on A's scale a small difference (bf16
        # against float32) was a flat grey until "amplify" was ticked.
        self.same_scale_check = QCheckBox("A − B on A's scale")
        self.same_scale_check.setToolTip("Draw the difference on the scale of A and B (its size beside theirs) "
                                         "instead of its own scale (where it lies)")
        controls = QHBoxLayout()
        for w in (QLabel("Tensor"), self.tensor_combo, QLabel("Show"), self.display_combo, self.channel_spin,
                  self.k_spin, self.sample_spin, self.same_scale_check):
            controls.addWidget(w)
        controls.addStretch(1)
        return controls

    def _build_heat_plots(self) -> None:
        """A | B | their bar | A − B | its bar, the three pictures' views linked."""
        self.heat_widget = pg.GraphicsLayoutWidget()
        style_plot_widget(self.heat_widget)
        self.plots, self.images = [], []
        for col, title in enumerate(("A", "B", "A − B")):
            plot, image = image_plot(self.heat_widget.ci, 0, col, title=title)
            self.plots.append(plot)
            self.images.append(image)
            if col:
                # Zooming or panning one picture moves the others: same pixels side by side.
                plot.setXLink(self.plots[0])
                plot.setYLink(self.plots[0])
        for plot in self.plots:
            plot.vb.sigResized.connect(self._frame_pictures)
        # One colour bar for A and B (one symmetric scale), one for A − B (its own). Each in a
        # column of its own: inside a plot it made that plot narrower than the others, and the
        # linked, square-pixel views then framed every picture by the narrowest (small inside
        # axes from -300 to 500).
        self.colorbar = ScaleBar("A and B (the tensor's unit)", width=12)
        self.colorbar.setImageItem(self.images[:2])
        self.diff_bar = ScaleBar("A − B", width=12)
        self.diff_bar.setImageItem(self.images[2])
        layout = self.heat_widget.ci
        layout.removeItem(self.plots[2])  # A | B | their bar | A − B | its bar
        layout.addItem(self.colorbar, row=0, col=2)
        layout.addItem(self.plots[2], row=0, col=3)
        layout.addItem(self.diff_bar, row=0, col=4)
        for col in range(5):  # the three plots equally wide: their views are linked, pixels square
            layout.layout.setColumnStretchFactor(col, 1 if col in (0, 1, 3) else 0)

    def _build_flow(self) -> QWidget:
        """The gradient flow of A and B over their ratio B / A; returns its box."""
        self.flow_kind = QComboBox()
        for key, label in _FLOW_KINDS:
            self.flow_kind.addItem(label, key)
        self._build_flow_plots()
        self._build_flow_curves()
        flow_box = QWidget()
        fv = QVBoxLayout(flow_box)
        fv.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(QLabel("Gradient flow of"))
        row.addWidget(self.flow_kind)
        row.addWidget(QLabel(f"<span style='color:{_A_COLOUR}'>━ A</span>&nbsp;&nbsp;"
                             f"<span style='color:{_B_COLOUR}'>━ B</span>&nbsp;&nbsp;"
                             f"<span style='color:{_RATIO_COLOUR}'>━ B / A</span>"))
        row.addStretch(1)
        fv.addLayout(row)
        fv.addWidget(self.flow_widget, 1)
        return flow_box

    def _build_flow_plots(self) -> None:
        """The norms' plot over the ratio's, their x axes linked."""
        self.flow_widget = pg.GraphicsLayoutWidget()
        style_plot_widget(self.flow_widget)
        # Whole layer names, as many as fit at the present zoom (never overlapping).
        self.layer_axes = (LayerAxis("bottom"), LayerAxis("bottom"))
        self.flow_plot = self.flow_widget.ci.addPlot(row=0, col=0, axisItems={"left": Log10Axis("left"),
                                                                              "bottom": self.layer_axes[0]})
        self.ratio_axis = Log10Axis("left")
        self.ratio_plot = self.flow_widget.ci.addPlot(row=1, col=0, axisItems={"left": self.ratio_axis,
                                                                               "bottom": self.layer_axes[1]})
        for p in (self.flow_plot, self.ratio_plot):
            p.setMenuEnabled(False)
            p.hideButtons()
            p.showGrid(y=True, alpha=0.15)
            style_plot(p)
        self.ratio_plot.setXLink(self.flow_plot)
        set_axis_title(self.flow_plot, "left", "L2 norm")
        set_axis_title(self.ratio_plot, "left", "B / A")
        self.flow_widget.ci.layout.setRowStretchFactor(0, 3)
        self.flow_widget.ci.layout.setRowStretchFactor(1, 2)

    def _build_flow_curves(self) -> None:
        """A's and B's curves with their legend, the ratio's curve, its line at 1 and the call's marker."""
        legend = self.flow_plot.addLegend(offset=(-10, 10), labelTextColor=FOREGROUND)
        self.curve_a = self.flow_plot.plot([], [], pen=pg.mkPen(_A_COLOUR, width=4), symbol="o", symbolSize=5,
                                           symbolBrush=_A_COLOUR, symbolPen=None, name="A")
        # B dashed over A: where they agree both stay visible.
        dashed = pg.mkPen(_B_COLOUR, width=2, style=Qt.PenStyle.DashLine)
        self.curve_b = self.flow_plot.plot([], [], pen=dashed, symbol="o", symbolSize=5,
                                           symbolBrush=_B_COLOUR, symbolPen=None, name="B")
        legend.setParentItem(self.flow_plot.vb)
        self.ratio_curve = self.ratio_plot.plot([], [], pen=pg.mkPen(_RATIO_COLOUR, width=2), symbol="o",
                                                symbolSize=4, symbolBrush=_RATIO_COLOUR, symbolPen=None)
        self.ratio_one = pg.InfiniteLine(0.0, angle=0, pen=pg.mkPen("#777777", style=Qt.PenStyle.DashLine))
        self.ratio_plot.addItem(self.ratio_one)
        self.marker = pg.InfiniteLine(angle=90, pen=pg.mkPen(SELECTED_COLOUR, width=1.5))
        self.flow_plot.addItem(self.marker)

    def _lay_out(self, heat_box: QWidget, flow_box: QWidget) -> None:
        """The summary over (table | heatmaps) over the gradient flow, in splitters."""
        table_box = QWidget()
        tv = QVBoxLayout(table_box)
        tv.setContentsMargins(0, 0, 0, 0)
        order_row = QHBoxLayout()
        order_row.addWidget(QLabel("Rows in"))
        order_row.addWidget(self.order_combo)
        order_row.addStretch(1)
        tv.addLayout(order_row)
        tv.addWidget(self.table, 1)
        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(table_box)
        top.addWidget(heat_box)
        top.setStretchFactor(0, 2)
        top.setStretchFactor(1, 3)
        top.setSizes([600, 800])
        main = QSplitter(Qt.Orientation.Vertical)
        main.addWidget(top)
        main.addWidget(flow_box)
        main.setStretchFactor(0, 3)
        main.setStretchFactor(1, 2)
        v = QVBoxLayout(self)
        v.setContentsMargins(4, 4, 4, 4)
        v.addWidget(self.summary_label)
        v.addWidget(main, 1)

    def _connect(self) -> None:
        """Redraw on the controls' changes."""
        for w in (self.tensor_combo, self.display_combo):
            w.currentIndexChanged.connect(self._draw_heatmaps)
        self.same_scale_check.toggled.connect(self._draw_heatmaps)
        self.order_combo.currentIndexChanged.connect(self._on_order_changed)
        for s in (self.channel_spin, self.k_spin, self.sample_spin):
            s.valueChanged.connect(self._draw_heatmaps)
        self.flow_kind.currentIndexChanged.connect(self._draw_flow)

    # -- public API -------------------------------------------------------------------
    def set_comparison(self, a: Capture, b: Capture, result: Comparison,
                       mapping: dict[str, str] | None = None) -> None:
        """Show ``result`` (``gradexplorer.comparison.compare.compare(a, b)``); selects the first
        divergent call (else the top row)."""
        self.a, self.b, self.result, self.mapping = a, b, result, dict(mapping or {})
        self.summary_label.setText(self._summary_html())
        self._fill_table()
        self._draw_flow()
        # The first place they differ, at first sight: the first divergent activation (else
        # gradient, shown as such); the rows in model order had opened on an identical conv1.
        first = result.first_divergent_activation
        if first is None and result.first_divergent_gradient is not None:
            first = result.first_divergent_gradient
            self.tensor_combo.setCurrentIndex(self.tensor_combo.findData("grad_output"))
        if first is not None and first in self._rows:
            self.table.selectRow(self._rows.index(first))
            self.table.scrollTo(self.table.model().index(self._rows.index(first), 0))
        elif self._rows:
            self.table.selectRow(0)
        else:
            self._current = None
            self._draw_heatmaps()

    def select(self, layer: str, call: int = 0) -> bool:
        """Select A's ``layer`` / ``call`` in the table; False when it is not there."""
        for i, c in enumerate(self._rows):
            if c.layer == layer and c.call == call:
                self.table.selectRow(i)
                return True
        return False

    def current(self) -> CallDiff | None:
        return self._current

    def row_calls(self) -> list[CallDiff]:
        """The table's calls, top to bottom."""
        return list(self._rows)

    def flow_data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The plotted series (log10 of A, of B; B / A, in log10 when ``ratio_log``), for tests."""
        _, ya = self.curve_a.getData()
        _, yb = self.curve_b.getData()
        _, yr = self.ratio_curve.getData()
        return (np.asarray(ya if ya is not None else []), np.asarray(yb if yb is not None else []),
                np.asarray(yr if yr is not None else []))

    def heatmap_message(self) -> str:
        """The note shown instead of the heatmaps, or ""."""
        return self.heat_note.text() if self.heat_stack.currentWidget() is self.heat_note else ""

    # -- summary and table ------------------------------------------------------------
    def _summary_html(self) -> str:
        r = self.result
        assert r is not None
        fa, fg = r.first_divergent_activation, r.first_divergent_gradient
        verdict = ("<b style='color:#1e7b34'>within tolerance</b>" if r.within
                   else "<b style='color:#c0392b'>diverged</b>")
        by = " (by statistics)" if r.by_statistics else ""
        parts = [
            (f"<b style='color:{_A_COLOUR}'>A</b>&nbsp;{_escape(r.label_a)} &nbsp;&nbsp; "
             f"<b style='color:{_B_COLOUR}'>B</b>&nbsp;{_escape(r.label_b)} &nbsp;&nbsp; rtol {r.tolerance.rtol:g}, "
             f"atol {r.tolerance.atol:g}: {verdict}{by}"),
            "first divergent activation: " + (f"<b>{fa.label}</b> call {fa.call}" if fa else "none")
            + " &nbsp; first divergent gradient: " + (f"<b>{fg.label}</b> call {fg.call}" if fg else "none"),
        ]
        unmatched = len(r.only_a) + len(r.only_b)
        if unmatched:
            parts.append(f"unmatched: {', '.join((r.only_a + r.only_b)[:6])}{' …' if unmatched > 6 else ''}")
        return "<br>".join(parts)

    def _on_order_changed(self, _index: int) -> None:
        if self.result is None:
            return
        current = self._current
        self._fill_table()
        if current is not None and current in self._rows:
            self.table.selectRow(self._rows.index(current))

    def _fill_table(self) -> None:
        r = self.result
        assert r is not None
        # Model order by default: the calls as the model runs them (sorted by divergence,
        # equal rows had come in a puzzling order: conv1, layer4.1.bn2, relu, maxpool, bn1).
        self._rows = r.by_divergence() if self.order_combo.currentData() == "divergence" else list(r.calls)
        firsts = {id(r.first_divergent_activation): "first activation",
                  id(r.first_divergent_gradient): "first gradient"}
        self.table.blockSignals(True)
        self.table.setRowCount(len(self._rows))
        for i, c in enumerate(self._rows):
            grad = c.kinds.get("grad_output")
            ratio = None
            if grad is not None:
                ratio = grad.tensor.norm_ratio if grad.tensor is not None else (
                    grad.stats.norm_ratio if grad.stats is not None else None)
            status = c.note or ("ok" if c.within else "diverges")
            marks = [text for key, text in firsts.items() if key == id(c)]
            if c is r.first_divergent_activation and c is r.first_divergent_gradient:
                marks = ["first activation and gradient"]
            if marks:
                status = f"◀ {marks[0]}" if not c.note else f"{c.note}; {marks[0]}"
            cells = [c.label, str(c.call), c.type, _fmt(_rel(c, "activation")), _fmt(_rel(c, "grad_output")),
                     _fmt_ratio(ratio), status]
            values = {3: _rel(c, "activation"), 4: _rel(c, "grad_output"), 5: ratio}
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                value = values.get(j)
                if value is not None:  # Ctrl+C copies every digit
                    item.setData(FULL_VALUE_ROLE, full_value(float(value)))
                if j in (1, 3, 4, 5):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if marks:
                    item.setBackground(QBrush(QColor(_FIRST_COLOUR)))
                self.table.setItem(i, j, item)
        self.table.blockSignals(False)

    def _on_row_selected(self) -> None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return
        c = self._rows[rows[0].row()]
        self._current = c
        self._update_controls()
        self._draw_heatmaps()
        self._mark_flow()
        self.call_selected.emit(c.layer, c.call)

    # -- heatmaps ---------------------------------------------------------------------
    def _tensors(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        c = self._current
        if c is None or self.a is None or self.b is None:
            return None, None
        kind = self.tensor_combo.currentData()
        ta = self.a[c.layer].calls[c.call].tensor(kind)
        tb = self.b[c.layer_b].calls[c.call].tensor(kind)
        return ta, tb

    def _update_controls(self) -> None:
        ta, _ = self._tensors()
        display = self.display_combo.currentData()
        spatial = ta is not None and ta.dim() >= 2 and layout_of(ta.shape[1:]).has_channels
        self.display_combo.setEnabled(spatial)
        self.channel_spin.setVisible(spatial and display == "channel")
        self.k_spin.setVisible(spatial and display == "topk")
        if spatial and ta is not None:
            self.channel_spin.setMaximum(max(layout_of(ta.shape[1:]).channels - 1, 0))
        self.sample_spin.setMaximum(max((ta.shape[0] if ta is not None and ta.dim() else 1) - 1, 0))

    def _show_note(self, text: str) -> None:
        self.triple = None
        self.heat_note.setText(text)
        self.heat_stack.setCurrentWidget(self.heat_note)
        self.heat_title.setText(" ")

    def _draw_heatmaps(self, *_: object) -> None:
        self._update_controls()
        c = self._current
        if c is None:
            self._show_note("Pick a row of the table to see A, B and their difference.")
            return
        if c.note:
            self._show_note(f"{c.label} call {c.call}: {c.note}; there is no difference to picture.")
            return
        kind = self.tensor_combo.currentData()
        ta, tb = self._tensors()
        if ta is None or tb is None:
            which = "Both captures hold" if ta is None and tb is None else (
                "A holds" if ta is None else "B holds")
            stats_only = any(cap.mode == "stats" for cap in (self.a, self.b) if cap is not None)
            why = (f"{which} statistics only: heatmaps need full captures (the table and the flow chart "
                   "compare the statistics).") if stats_only else (
                f"No {self.tensor_combo.currentText()} was recorded at {c.label} call {c.call} in "
                f"{'A' if ta is None else 'B'}.")
            self._show_note(why)
            return
        s = min(self.sample_spin.value(), ta.shape[0] - 1) if ta.dim() else 0
        sa, sb = (ta[s], tb[s]) if ta.dim() else (ta, tb)
        display = self.display_combo.currentData()
        columns = None
        if display == "topk" and sa.dim() >= 2 and layout_of(sa.shape).has_channels:
            # The grid takes the plots' shape (a square grid in a tall plot had left most of it empty).
            lay = layout_of(sa.shape)
            vb = self.plots[0].vb
            aspect = vb.width() / vb.height() if vb.height() > 0 else 0.0
            columns = grid_columns(min(self.k_spin.value(), lay.channels), (lay.height, lay.width), aspect)
        try:
            triple = heatmap_triple(sa, sb, display, channel=self.channel_spin.value(), k=self.k_spin.value(),
                                    columns=columns)
        except GradExplorerError as exc:
            self._show_note(f"{exc.problem} {exc.fix}")
            return
        self.triple = triple
        self.heat_stack.setCurrentWidget(self.heat_widget)
        lo, hi = triple.levels
        a, b, diff = _pictures(triple)
        d_lo, d_hi = self.difference_levels()
        for image, arr, levels in zip(self.images, (a.array, b.array, diff.array), ((lo, hi), (lo, hi), (d_lo, d_hi))):
            image.setImage(arr, autoLevels=False, levels=levels)
        own = not self.same_scale_check.isChecked()
        what = dict(_TENSORS)[kind]
        self.colorbar.set_range(lo, hi)
        self.colorbar.set_title(f"{what}: A and B")
        self.diff_bar.set_range(d_lo, d_hi)
        # The plot's title stays short (a long one widens its plot beyond A's and B's): the
        # bar says which scale.
        self.diff_bar.set_title(f"{what}: A − B, " + ("its own scale" if own else "A's scale"))
        # The pictures' own extent, not autoRange: before the first layout (the window just
        # opened) autoRange framed them in a view of the default size, drawing them tiny.
        self._extent = a.array.shape[:2]
        self._frame_pictures()
        kd = c.kinds.get(kind)
        rel = f"rel L2 {_fmt(kd.divergence)}" if kd is not None else ""
        what = dict(_TENSORS)[kind]
        self.heat_title.setText(f"{c.label} call {c.call}: {what}, sample {s}; {rel}; A and B ±{_fmt(hi)}, "
                                f"A − B ±{_fmt(d_hi)}")

    def _frame_pictures(self, *_: object) -> None:
        """Frame A, B and A − B on their own extent. Called again when the plots change
        size: drawn before the window's first layout, the locked aspect of a tiny plot had
        stretched the range (pictures drawn small inside axes from -300 to 500)."""
        extent = getattr(self, "_extent", None)
        if extent is None:
            return
        rows, cols = extent
        for plot in self.plots:
            plot.vb.setRange(xRange=(0, cols), yRange=(0, rows), padding=0.02)

    def difference_levels(self) -> tuple[float, float]:
        """The levels A − B is drawn at: symmetric around 0 at its own largest |A − B| (so
        that the difference shows at first sight, however small beside A and B), or A and
        B's levels when "A − B on A's scale" is ticked."""
        t = self.triple
        if t is None:
            return -1.0, 1.0
        if self.same_scale_check.isChecked():
            return t.levels
        diff = _pictures(t)[2].array
        d = diff[np.isfinite(diff)]
        m = float(np.abs(d).max()) if d.size else 0.0
        if m == 0:
            return 0.0, 0.0  # identical: its bar says "constant 0"
        if not math.isfinite(m):
            return t.levels
        return -m, m

    # -- flow -------------------------------------------------------------------------
    def _draw_flow(self, *_: object) -> None:
        if self.a is None or self.b is None:
            return
        fc = flow_comparison(self.a, self.b, "l2", self.flow_kind.currentData(), self.mapping)
        self._flow_names = fc.names
        x = np.arange(len(fc.names), dtype=float)

        def logs(values: Sequence[float] | np.ndarray) -> np.ndarray:
            v = np.asarray(values, dtype=float)
            ok = np.isfinite(v) & (v > 0)
            return np.where(ok, np.log10(np.where(ok, v, 1.0)), np.nan)

        self.curve_a.setData(x, logs(fc.a), connect="finite")
        self.curve_b.setData(x, logs(fc.b), connect="finite")
        ratio_logs = logs(fc.ratio)
        finite = ratio_logs[np.isfinite(ratio_logs)]
        # Ratios within a factor of 2 read best as plain numbers (0.99, 1.01); wider ones
        # on a log scale.
        self.ratio_log = bool(finite.size) and float(np.abs(finite).max()) > math.log10(2)
        self.ratio_axis.set_log_labels(self.ratio_log)
        self.ratio_one.setValue(0.0 if self.ratio_log else 1.0)
        self.ratio_curve.setData(x, ratio_logs if self.ratio_log else np.asarray(fc.ratio, dtype=float),
                                 connect="finite")
        metrics = QFontMetrics(self.flow_widget.font())
        for axis in self.layer_axes:
            axis.set_names(fc.names, metrics)
        self.flow_plot.setXRange(-0.5, max(len(fc.names), 1) - 0.5, padding=0.01)
        set_axis_title(self.flow_plot, "left", "L2 norm")
        self._mark_flow()

    def _mark_flow(self) -> None:
        names = getattr(self, "_flow_names", [])
        c = self._current
        if c is not None and c.layer in names:
            self.marker.setValue(names.index(c.layer))
            self.marker.show()
        else:
            self.marker.hide()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _pictures(triple: HeatmapTriple) -> tuple[Heatmap, Heatmap, Heatmap]:
    """A's, B's and A − B's pictures (``HeatmapTriple`` holds them as plain objects)."""
    a, b, diff = triple.a, triple.b, triple.diff
    assert isinstance(a, Heatmap) and isinstance(b, Heatmap) and isinstance(diff, Heatmap)
    return a, b, diff
