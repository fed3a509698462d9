"""Timeline of a watch log (or a dataset capture's per-batch series): a training dashboard.

The loss given to ``w.step(loss=...)`` over steps, above a heatmap of layers × steps of one
statistic (log colour; rows named with their module's class), the first NaN/Inf marked (a
line at its step and a marker on its first layer); a click on a cell shows that layer's
histograms over steps (TensorBoard's distribution view, on the fixed signed log2 bins, on
an ordered axis: values grow upwards, 0 in the middle, long empty runs left out), line
plots of the layers chosen in the list, PNG and CSV export. While a log grows, the view follows it: a timer
asks a worker thread for the steps after the last one shown, and the UI thread only draws.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QObject, QRunnable, Qt, QThreadPool, QTimer, Signal
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.file_write import check_output_path
from gradexplorer.capturing.data import Capture
from gradexplorer.files.capture_file import load_capture

# The readers are looked up on the module when a worker calls them (tests replace them).
from gradexplorer.recording import timeline as timelines
from gradexplorer.recording.timeline import Onset, Timeline, log_colour
from gradexplorer.recording.watch_log import MODULE_KINDS
from gradexplorer.stats.merge import HIST_BINS, MAG_LOW, ZERO_BIN
from gradexplorer_app import dialogs
from gradexplorer_app.views.context_menus import install_plot_menu
from gradexplorer_app.views.export import PLOT_FILTER, file_name, plot_bytes, write_export
from gradexplorer_app.views.label_fit import elide_name, wrap_label
from gradexplorer_app.views.plot_style import (
    FLAG_COLOURS,
    FOREGROUND,
    SELECTED_COLOUR,
    IntegerAxis,
    LayerAxis,
    ScaleBar,
    set_axis_title,
    set_title,
    style_plot,
    style_plot_widget,
)

KIND_LABELS = {
    "grad_output": "output gradient",
    "activation": "activation",
    "grad_norm": "per-sample gradient norm",
    "grad": "parameter gradient",
    "weight": "weight",
}
STAT_LABELS = {
    "l2": "L2 norm", "mean_abs": "mean |x|", "max_abs": "max |x|", "std": "std", "mean": "mean",
    "nonfinite": "NaN + Inf count", "zero_fraction": "zero fraction", "update_ratio": "update ratio |Δw|/|w|",
}
#: The series fields of dataset captures (gradexplorer.recording.dataset_capture.SERIES_FIELDS).
CAPTURE_STATS = ("l2", "mean", "std", "max_abs", "nonfinite")


#: Colour of cells with no finite value (NaN/Inf everywhere, or no value at that step).
_NAN_RGBA = (255, 43, 214, 150)


class _Bridge(QObject):
    done = Signal(int, object, object)  # generation, result, error


class _Job(QRunnable):
    def __init__(self, bridge: _Bridge, generation: int, fn: Callable[[], Any]) -> None:
        super().__init__()
        self.bridge, self.generation, self.fn = bridge, generation, fn

    def run(self) -> None:
        try:
            result, error = self.fn(), None
        except Exception as exc:  # noqa: BLE001 - shown in the view, never raised into Qt
            result, error = None, exc
        self.bridge.done.emit(self.generation, result, error)


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def bin_exponent(index: int) -> int | None:
    """The octave of a signed log2 bin: ``k`` for the values of magnitude in [2^k, 2^(k+1)),
    None for the zero, underflow ("tiny") and overflow ("huge") bins."""
    if index == ZERO_BIN:
        return None
    j = (ZERO_BIN - 1 - index) if index < ZERO_BIN else (index - ZERO_BIN - 1)
    if j == 0 or j == HIST_BINS // 2 - 1:
        return None
    return j - 1 + MAG_LOW


def bin_label(index: int) -> str:
    """A short label of a signed log2 bin, by its lower magnitude: ``0``, ``2⁻³``, ``−2⁵``,
    ``−tiny`` (below 2⁻⁶⁴), ``huge`` (2⁶⁴ and more)."""
    if index == ZERO_BIN:
        return "0"
    sign = "−" if index < ZERO_BIN else ""
    k = bin_exponent(index)
    if k is None:
        j = (ZERO_BIN - 1 - index) if index < ZERO_BIN else (index - ZERO_BIN - 1)
        return f"{sign}{'tiny' if j == 0 else 'huge'}"
    return f"{sign}2{str(k).translate(_SUPERSCRIPT)}"


class BinAxis(pg.AxisItem):
    """The left axis of the histograms over steps: one row per bin shown (``rows``, bin
    indices bottom to top, ``None`` for a run of empty bins left out, drawn "⋯"), values
    growing upwards. The labels never overlap, and the round ones come first: 0, then the
    octaves whose exponent is a multiple of 10, 5, 2, then any; so the axis reads 2⁻¹⁰,
    2⁻²⁰, 0, −2⁻²⁰, −2⁻¹⁰ from top to bottom rather than a scatter of bins."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[int | None] = []
        self._line = 12

    def set_rows(self, rows: list[int | None], metrics: QFontMetrics) -> None:
        self.rows = list(rows)
        self._line = metrics.height()
        self.picture = None
        self.update()

    def row_label(self, row: int) -> str:
        b = self.rows[row] if 0 <= row < len(self.rows) else None
        return "⋯" if b is None else bin_label(b)

    def labelled(self, minVal: float, maxVal: float, size: float) -> list[int]:
        """The rows labelled when ``minVal``..``maxVal`` spans ``size`` pixels."""
        lo, hi = min(minVal, maxVal), max(minVal, maxVal)
        if not self.rows or hi <= lo or size <= 0:
            return []
        first, last = max(0, math.ceil(lo - 0.5)), min(len(self.rows) - 1, math.floor(hi - 0.5))
        px = size / (hi - lo)
        need = (self._line + 2) / px  # rows between two labels

        def rank(row: int) -> int:
            b = self.rows[row]
            if b is None:
                return 9
            if b == ZERO_BIN:
                return 0
            k = bin_exponent(b)
            if k is None:
                return 6
            return next((i + 1 for i, m in enumerate((10, 5, 2)) if k % m == 0), 5)

        chosen: list[int] = []
        for row in sorted(range(first, last + 1), key=lambda r: (rank(r), r)):
            if self.rows[row] is None:
                continue
            if all(abs(row - other) >= need for other in chosen):
                chosen.append(row)
        return sorted(chosen)

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, list[float]]]:  # pyqtgraph's
        rows = self.labelled(minVal, maxVal, size)
        return [(-1.0, [r + 0.5 for r in rows])] if rows else []

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:  # pyqtgraph's
        return [self.row_label(int(round(v - 0.5))) for v in values]


class TimelineView(QWidget):
    """Layers × steps of a watch log or dataset capture; see the module docstring.

    Signals
    -------
    updated : emitted after new data was drawn (for tests and scripts).
    failed : emitted with the problem and its fix when reading fails.
    """

    updated = Signal()
    failed = Signal(str)

    def __init__(self, parent: QWidget | None = None, poll_ms: int = 1000) -> None:
        super().__init__(parent)
        self.source: str | None = None
        #: The file shown (a log or a dataset capture), which no export may replace.
        self.source_file: str | None = None
        self.source_kind = ""  # "log" or "capture"
        self.timeline: Timeline | None = None
        self.onset: Onset | None = None
        self.selected: list[str] = []
        self._capture: Any = None
        self._generation = 0
        self._busy = False
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(1)
        self._bridge = _Bridge()
        self._bridge.done.connect(self._on_done)
        self._handlers: dict[int, Callable[[Any], None]] = {}
        #: The steps and rows the heatmap was last framed on whole (``_frame``), or None.
        self._framed: tuple[tuple[float, float], tuple[float, float]] | None = None

        bar = self._build_bar()
        self._build_heatmap()
        self._build_lower_plots()
        self.layer_list = QListWidget()
        self.layer_list.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.layer_list.setMaximumWidth(260)
        self._lay_out(bar)
        self._fill_stats()
        self._connect(poll_ms)

    def _build_bar(self) -> QHBoxLayout:
        """Rows, statistic, Follow and the exports in one row; the status line."""
        self.kind_combo = QComboBox()
        for key, label in KIND_LABELS.items():
            self.kind_combo.addItem(label, key)
        self.stat_combo = QComboBox()
        self.follow_box = QCheckBox("Follow (live)")
        self.follow_box.setChecked(True)
        self.png_button = QPushButton("Export PNG…")
        self.csv_button = QPushButton("Export CSV…")
        self.status = wrap_label(QLabel("No log open."))
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        bar = QHBoxLayout()
        for w in (QLabel("Rows"), self.kind_combo, QLabel("Statistic"), self.stat_combo, self.follow_box):
            bar.addWidget(w)
        bar.addStretch(1)
        bar.addWidget(self.png_button)
        bar.addWidget(self.csv_button)
        return bar

    def _build_heatmap(self) -> None:
        """The loss over steps, above the heatmap and on its columns (the x axes are linked)."""
        self.heat_widget = pg.GraphicsLayoutWidget()
        style_plot_widget(self.heat_widget)
        self._build_loss_plot()
        # The rows' names: as many as fit the plot's height, all of them when zoomed in.
        self.row_axis = LayerAxis("left", offset=0.5)
        self.heat_plot = self.heat_widget.addPlot(row=1, col=0, axisItems={"left": self.row_axis})
        self.heat_plot.invertY(True)
        self.heat_plot.setMenuEnabled(False)
        self.heat_plot.hideButtons()
        self.loss_plot.setXLink(self.heat_plot)
        self.loss_plot.enableAutoRange(x=False)
        self.heat_image = pg.ImageItem(axisOrder="row-major")
        self.heat_plot.addItem(self.heat_image)
        # Cells with no finite value (every element NaN/Inf): an overlay of their own colour,
        # so that they do not read as "small" on the log scale.
        self.nan_image = pg.ImageItem(axisOrder="row-major")
        self.heat_plot.addItem(self.nan_image)
        self.colour_bar = ScaleBar("|value| (log scale)", signed=False, log10=True)
        self.colour_bar.setImageItem(self.heat_image)
        # In a column of its own beside the heatmap: the loss plot above keeps the same width,
        # so that a step's loss stands over its column.
        self.heat_widget.ci.addItem(self.colour_bar, row=1, col=1)
        self.heat_widget.ci.layout.setRowStretchFactor(0, 2)
        self.heat_widget.ci.layout.setRowStretchFactor(1, 5)
        self.loss_plot.setMinimumHeight(100)
        self._build_heat_marks()
        self.heat_plot.scene().sigMouseClicked.connect(self._on_heat_click)

    def _build_loss_plot(self) -> None:
        """The loss's curve, with a mark on the top edge for each step whose loss was not finite."""
        self.loss_axis = pg.AxisItem("left")
        self.loss_plot = self.heat_widget.addPlot(row=0, col=0, axisItems={"left": self.loss_axis})
        self.loss_plot.setMenuEnabled(False)
        self.loss_plot.hideButtons()
        self.loss_plot.showGrid(y=True, alpha=0.15)
        self.loss_plot.getAxis("bottom").setStyle(showValues=False)
        self.loss_axis.enableAutoSIPrefix(False)
        self.loss_curve = self.loss_plot.plot([], [], pen=pg.mkPen(FOREGROUND, width=2))
        # Steps whose loss was NaN or infinite: a mark of their own on the plot's top edge.
        self.loss_nonfinite = pg.ScatterPlotItem(symbol="x", size=10, pen=pg.mkPen(FLAG_COLOURS["nan/inf"], width=2),
                                                 brush=None)
        self.loss_plot.addItem(self.loss_nonfinite)

    def _build_heat_marks(self) -> None:
        """The onset's line, mark and text, and the selected cell's box: hidden until there is one."""
        self.onset_line = pg.InfiniteLine(angle=90, pen=pg.mkPen(FLAG_COLOURS["nan/inf"], width=2))
        self.onset_marker = pg.ScatterPlotItem(symbol="x", size=14, pen=pg.mkPen(FLAG_COLOURS["nan/inf"], width=2),
                                               brush=None)
        self.onset_text = pg.TextItem(color=FLAG_COLOURS["nan/inf"], anchor=(0, 1))
        self.select_box = pg.QtWidgets.QGraphicsRectItem(0, 0, 1, 1)
        self.select_box.setPen(pg.mkPen(SELECTED_COLOUR, width=2))
        for item in (self.onset_line, self.onset_marker, self.onset_text, self.select_box):
            item.setVisible(False)
            self.heat_plot.addItem(item)

    def _build_lower_plots(self) -> None:
        """A row's histograms over steps, and its lines."""
        self.hist_widget = pg.GraphicsLayoutWidget()
        style_plot_widget(self.hist_widget)
        # The bins, values growing upwards, labels at round octaves (BinAxis).
        self.bin_axis = BinAxis("left")
        self.hist_plot = self.hist_widget.addPlot(row=0, col=0, axisItems={"left": self.bin_axis})
        self.hist_plot.setMenuEnabled(False)
        self.hist_image = pg.ImageItem(axisOrder="row-major")
        self.hist_plot.addItem(self.hist_image)
        self.hist_bar = ScaleBar("count per bin (log)", signed=False, log10=True, plus_one=True)
        self.hist_bar.setImageItem(self.hist_image, insert_in=self.hist_plot)
        self.line_widget = pg.GraphicsLayoutWidget()
        style_plot_widget(self.line_widget)
        self.line_plot = self.line_widget.addPlot(row=0, col=0, axisItems={"bottom": IntegerAxis("bottom")})
        for plot in (self.loss_plot, self.heat_plot, self.hist_plot, self.line_plot):
            style_plot(plot)
        # A log axis with an SI factor in its title ("(x0.001)") reads as another scale.
        self.line_plot.getAxis("left").enableAutoSIPrefix(False)
        set_title(self.hist_plot, "histograms over steps")
        self.line_plot.addLegend(offset=(5, 5), labelTextColor=FOREGROUND)
        self.line_plot.setMenuEnabled(False)

    def _lay_out(self, bar: QHBoxLayout) -> None:
        """The bar over the heatmap, over (rows' list | histograms over lines), over the status."""
        # The histograms and the lines one above the other, each a plot of its own (the
        # histograms had shared one with the lines, ~60 px tall at 1280x800).
        plots = QSplitter(Qt.Orientation.Vertical)
        plots.addWidget(self.hist_widget)
        plots.addWidget(self.line_widget)
        plots.setStretchFactor(0, 3)
        plots.setStretchFactor(1, 2)
        plots.setChildrenCollapsible(False)
        lower = QSplitter(Qt.Orientation.Horizontal)
        lower.addWidget(self.layer_list)
        lower.addWidget(plots)
        lower.setStretchFactor(1, 1)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.heat_widget)
        split.addWidget(lower)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 1)
        split.setChildrenCollapsible(False)
        # Shares, not sizes: the splitters scale them to the room there is (the size hints
        # had left the heatmap a third).
        split.setSizes([900, 1000])
        plots.setSizes([650, 350])
        self.hist_widget.setMinimumHeight(160)

        layout = QVBoxLayout(self)
        layout.addLayout(bar)
        layout.addWidget(split, 1)
        layout.addWidget(self.status)

    def _connect(self, poll_ms: int) -> None:
        """The controls' signals, the plots' context menus, and the timer that follows a growing log."""
        self.kind_combo.currentIndexChanged.connect(self._on_choice_changed)
        self.stat_combo.currentIndexChanged.connect(self._on_choice_changed)
        self.layer_list.itemSelectionChanged.connect(self._on_list_selection)
        self.png_button.clicked.connect(lambda: self.export_png())
        self.csv_button.clicked.connect(lambda: self.export_csv())
        for widget in (self.heat_widget, self.hist_widget, self.line_widget):
            install_plot_menu(widget, self.export_title, lambda: self.export_png())
        self.timer = QTimer(self)
        self.timer.setInterval(poll_ms)
        self.timer.timeout.connect(self._poll)

    # -- opening -----------------------------------------------------------------------
    def open_log(self, path: str) -> None:
        """Show a watch log, and follow it while it grows."""
        self.source, self.source_kind = os.fspath(path), "log"
        self.source_file = self.source
        self._capture = None
        self._fill_stats()
        self._reload()
        self.timer.start()

    def open_capture(self, path: str) -> None:
        """Show a dataset capture's per-batch series (loaded in the worker)."""
        self.timer.stop()
        self.source, self.source_kind = os.fspath(path), "capture"
        self.source_file = self.source
        self._fill_stats()
        self.status.setText(f"Loading {path} …")

        def load() -> Capture:
            return load_capture(path)

        def loaded(cap: Capture) -> None:
            self._capture = cap
            self._reload()

        self._submit(load, loaded)

    def show_capture(self, cap: Any, name: str = "dataset capture") -> None:
        """Show the per-batch series of a dataset capture already in memory (a run over a
        folder in the main window); ``name`` stands for the file name in the status line."""
        self.timer.stop()
        self.source, self.source_kind = name, "capture"
        self.source_file = None  # in memory: no file to keep the exports off
        self._capture = cap
        self._fill_stats()
        self._reload()

    def shutdown(self) -> None:
        """Stop following and wait for the worker (before the widget goes away)."""
        self.timer.stop()
        self._generation += 1
        self._pool.waitForDone(5000)

    # -- reading (worker) -----------------------------------------------------------------
    def _submit(self, fn: Callable[[], Any], handler: Callable[[Any], None]) -> None:
        self._generation += 1
        self._busy = True
        self._handlers = {self._generation: handler}
        self._pool.start(_Job(self._bridge, self._generation, fn))

    def _on_done(self, generation: int, result: Any, error: Any) -> None:
        handler = self._handlers.pop(generation, None)
        if generation == self._generation:
            self._busy = False
        if handler is None:
            return  # a stale result: the choice changed meanwhile
        if error is not None:
            text = getattr(error, "problem", None) or f"{type(error).__name__}: {error}"
            self.status.setText(f"Cannot read {self.source}: {text}")
            fix = getattr(error, "fix", "")
            self.failed.emit(f"{text} {fix}".strip())
            return
        handler(result)

    def _reload(self) -> None:
        kind, stat = self.kind_combo.currentData(), self.stat_combo.currentData()
        self.timeline = None
        if self.source_kind == "capture":
            cap = self._capture
            if cap is None:
                return
            self._submit(lambda: (timelines.timeline_from_capture(cap, kind, stat), timelines.capture_onset(cap)),
                         self._on_full)
            return
        path = self.source
        assert path is not None  # a log is open

        def read() -> tuple[Timeline, Onset | None]:
            return timelines.read_timeline(path, kind, stat), timelines.nonfinite_onset(path)

        self._submit(read, self._on_full)

    def _poll(self) -> None:
        if not self.follow_box.isChecked() or self._busy or self.source_kind != "log" or self.timeline is None:
            return
        path, kind, stat = self.source, self.kind_combo.currentData(), self.stat_combo.currentData()
        last = int(self.timeline.steps[-1]) if self.timeline.steps.size else -1
        assert path is not None  # a log is open

        def read() -> tuple[Timeline, Onset | None]:
            return timelines.read_timeline(path, kind, stat, since_step=last), timelines.nonfinite_onset(path)

        def got(result: tuple[Timeline, Onset | None]) -> None:
            new, onset = result
            if self.timeline is None or new.steps.size == 0:
                return
            self.timeline = self.timeline.extend(new)
            self.onset = onset
            self._draw()

        self._submit(read, got)

    def _on_full(self, result: tuple[Timeline, Onset | None]) -> None:
        self.timeline, self.onset = result
        self._framed = None  # a new log or choice: shown whole
        self._fill_layer_list()
        self._draw()

    # -- choices --------------------------------------------------------------------------------
    def _fill_stats(self) -> None:
        self.follow_box.setVisible(self.source_kind != "capture")  # a capture does not grow
        keep = self.stat_combo.currentData()
        stats = CAPTURE_STATS if self.source_kind == "capture" else tuple(STAT_LABELS)
        self.stat_combo.blockSignals(True)
        self.stat_combo.clear()
        for key in stats:
            self.stat_combo.addItem(STAT_LABELS[key], key)
        self.stat_combo.setCurrentIndex(max(self.stat_combo.findData(keep), 0))
        self.stat_combo.blockSignals(False)

    def _on_choice_changed(self) -> None:
        if self.source is not None:
            self._reload()

    def row_name(self, row: str) -> str:
        """A row as the view names it: the layer (and call) with its module's class,
        ``"3 Conv2d"``, when the source records classes (rows had read "0…6")."""
        kind = self.timeline.row_type(row) if self.timeline is not None else ""
        return f"{row}  {kind}" if kind else row

    def _fill_layer_list(self) -> None:
        t = self.timeline
        self.layer_list.blockSignals(True)
        self.layer_list.clear()
        if t is not None:
            for r in t.rows:
                item = QListWidgetItem(self.row_name(r))
                item.setData(Qt.ItemDataRole.UserRole, r)
                item.setToolTip(self.row_name(r))
                self.layer_list.addItem(item)
            keep = [r for r in self.selected if r in t.rows] or t.rows[:1]
            self.selected = keep
            for i, r in enumerate(t.rows):
                self.layer_list.item(i).setSelected(r in keep)
        self.layer_list.blockSignals(False)

    def _on_list_selection(self) -> None:
        self.selected = [it.data(Qt.ItemDataRole.UserRole) for it in self.layer_list.selectedItems()]
        self._draw_selection()

    def _on_heat_click(self, event: Any) -> None:  # pyqtgraph's MouseClickEvent
        t = self.timeline
        if t is None or not t.rows:
            return
        pos = self.heat_plot.vb.mapSceneToView(event.scenePos())
        row, col = int(math.floor(pos.y())), int(math.floor(pos.x()))
        if 0 <= row < len(t.rows) and 0 <= col < t.steps.size:
            add = bool(event.modifiers() & Qt.KeyboardModifier.ControlModifier)
            self.select_layer(t.rows[row], add=add)

    def select_layer(self, name: str, add: bool = False) -> None:
        """Show ``name``'s histograms over steps, and add it to (or make it) the line plot."""
        t = self.timeline
        if t is None or name not in t.rows:
            return
        self.selected = (self.selected + [name]) if add and name not in self.selected else [name]
        self.layer_list.blockSignals(True)
        for i, r in enumerate(t.rows):
            self.layer_list.item(i).setSelected(r in self.selected)
        self.layer_list.blockSignals(False)
        self._draw_selection()

    # -- drawing (UI thread, arrays only) ------------------------------------------------------
    def _draw(self) -> None:
        t = self.timeline
        if t is None:
            return
        if self.layer_list.count() != len(t.rows):
            self._fill_layer_list()
        img = log_colour(t.values) if t.values.size else np.zeros((1, 1))
        finite = img[np.isfinite(img)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        if hi <= lo:
            hi = lo + 1.0
        self.heat_image.setImage(np.nan_to_num(img, nan=lo - 1.0), autoLevels=False)
        rect = (0, 0, max(t.steps.size, 1), max(len(t.rows), 1))
        self.heat_image.setRect(*rect)
        self._frame(t)
        overlay = np.zeros(img.shape + (4,), dtype=np.uint8)
        if t.values.size:
            nonfinite = np.isnan(t.values) | np.isinf(t.values)
            overlay[nonfinite] = _NAN_RGBA
        self.nan_image.setImage(overlay, autoLevels=False, levels=(0, 255))
        self.nan_image.setRect(*rect)
        self.colour_bar.set_range(lo, hi)
        self.colour_bar.set_title(f"{STAT_LABELS.get(t.stat, t.stat)} (log scale)")
        metrics = QFontMetrics(self.heat_widget.font())
        names = [self.row_name(r) for r in t.rows]
        # The names' column as wide as the longest, up to a limit: a longer name is cut in
        # its middle, keeping its distinguishing tail; the loss plot above keeps that width,
        # so that its steps stand over the heatmap's columns.
        width = min(max((metrics.horizontalAdvance(n) for n in names), default=40) + 16, self.NAMES_WIDTH)
        self.row_axis.set_names([elide_name(n, metrics, width - 16) for n in names], metrics)
        for axis in (self.row_axis, self.loss_axis):
            axis.setWidth(width)
        self._draw_loss(t)
        every = max(1, t.steps.size // 12)
        self.heat_plot.getAxis("bottom").setTicks(
            [[(j + 0.5, str(int(s))) for j, s in enumerate(t.steps) if j % every == 0]])
        set_axis_title(self.heat_plot, "bottom", "batch" if self.source_kind == "capture" else "step")
        self._draw_onset()
        self._draw_selection()
        where = os.path.basename(self.source or "")
        span = f"{int(t.steps[0])} .. {int(t.steps[-1])}" if t.steps.size else "none yet"
        unit_one = "batch" if self.source_kind == "capture" else "step"
        onset = (f"; NaN/Inf from {unit_one} {self.onset.step} in {self.onset.layer} ({self.onset.kind})"
                 if self.onset else "")
        unit = "batches" if self.source_kind == "capture" else "steps"
        # Module rows kept per rank (tensor parallelism) are read as rank 0's: say so.
        own = (t.kind in MODULE_KINDS and t.meta.get("module_rows") == "per_rank" and not t.meta.get("per_rank"))
        self.status.setText(f"{where}: {len(t.rows)} rows, {t.steps.size} {unit} ({span}){onset}"
                            + ("; rank 0's own rows (tensor parallelism: the ranks' are not merged)" if own else "")
                            + ("; magenta cells: no finite value" if np.isnan(t.values).any() else ""))
        self.updated.emit()

    #: The widest the rows' names may be, in pixels.
    NAMES_WIDTH = 240

    def _frame(self, t: Timeline) -> None:
        """Show every step and row, unless the user zoomed in: a log that grows keeps the
        user's zoom, and the loss plot above follows the heatmap's steps (linked x)."""
        whole = (0.0, float(max(t.steps.size, 1))), (0.0, float(max(len(t.rows), 1)))
        framed = self._framed
        now = [tuple(r) for r in self.heat_plot.vb.viewRange()]
        if framed is None or all(abs(a - b) < 1e-6 for got, want in zip(now, framed) for a, b in zip(got, want)):
            self.heat_plot.setXRange(*whole[0], padding=0)
            self.heat_plot.setYRange(*whole[1], padding=0)
            self._framed = whole

    def _draw_loss(self, t: Timeline) -> None:
        """The loss given to ``w.step(loss=...)``, one point per step over its column; NaN
        and infinite losses marked on the top edge; the plot says so when no loss was given."""
        loss = np.asarray(t.loss, dtype=np.float64)
        x = np.arange(t.steps.size, dtype=np.float64) + 0.5
        finite = np.isfinite(loss)
        has_loss = bool(finite.any()) or bool(np.isinf(loss).any())
        self.loss_plot.getAxis("left").setStyle(showValues=has_loss)
        if not has_loss:
            self.loss_curve.setData([], [])
            self.loss_nonfinite.setData([], [])
            what = ("a dataset capture has no loss" if self.source_kind == "capture"
                    else "no loss was given to w.step(loss=...)")
            set_title(self.loss_plot, f"loss: {what}")
            return
        positive = finite & (loss > 0)
        # Log when the loss spans more than two decades and stays positive (a training that
        # blows up), linear otherwise.
        log = bool(finite.any()) and bool(positive[finite].all()) and (
            float(loss[finite].max()) > 100 * float(loss[finite].min()))
        self.loss_plot.setLogMode(y=log)
        self.loss_curve.setData(x[finite], loss[finite], connect="finite")
        top = float(np.log10(loss[finite].max()) if log else loss[finite].max()) if finite.any() else 1.0
        bad = ~finite
        self.loss_nonfinite.setData(x[bad], np.full(int(bad.sum()), top))
        set_axis_title(self.loss_plot, "left", "loss" + (" (log)" if log else ""))
        last = next((float(v) for v in loss[::-1] if np.isfinite(v)), math.nan)
        nonfinite = f", NaN/Inf at {int(bad.sum())} steps from step {int(t.steps[bad][0])}" if bad.any() else ""
        set_title(self.loss_plot, f"loss given to w.step: last {last:.4g}{nonfinite}")

    def _draw_onset(self) -> None:
        t, onset = self.timeline, self.onset
        show = t is not None and onset is not None and t.steps.size > 0
        if show:
            assert t is not None and onset is not None
            cols = np.flatnonzero(t.steps == onset.step)
            show = cols.size > 0
        for item in (self.onset_line, self.onset_marker, self.onset_text):
            item.setVisible(bool(show))
        if not show:
            return
        assert t is not None and onset is not None
        col = int(cols[0])
        self.onset_line.setPos(col)
        rows = [i for i, r in enumerate(t.rows) if r.split("#")[0] == onset.layer]
        if rows:
            self.onset_marker.setData([col + 0.5], [rows[0] + 0.5])
        else:
            self.onset_marker.setData([], [])
        unit = "batch" if self.source_kind == "capture" else "step"
        self.onset_text.setText(f"NaN/Inf from {unit} {onset.step}: {onset.layer}")
        self.onset_text.setPos(col, 0)

    def _draw_selection(self) -> None:
        t = self.timeline
        self.line_plot.clear()
        if t is None or not self.selected:
            self.select_box.setVisible(False)
            return
        first = self.selected[0]
        row = t.rows.index(first) if first in t.rows else 0
        self.select_box.setRect(0, row, max(t.steps.size, 1), 1)
        self.select_box.setVisible(True)
        positive = bool(np.all(t.values[np.isfinite(t.values)] > 0)) if np.isfinite(t.values).any() else False
        self.line_plot.setLogMode(y=positive)
        for i, name in enumerate(self.selected):
            if name not in t.rows:
                continue
            v = t.values[t.rows.index(name)]
            ok = np.isfinite(v) & ((v > 0) if positive else True)
            self.line_plot.plot(t.steps[ok].astype(float), v[ok], name=self.row_name(name),
                                pen=pg.mkPen(pg.intColor(i, hues=max(len(self.selected), 3)), width=2))
        if t.steps.size:
            # Every step of the heatmap above, also where a line stops (its values NaN/Inf):
            # autorange framed only the finite ones, so the lines read as a shorter run.
            self.line_plot.setXRange(float(t.steps.min()), float(t.steps.max()), padding=0.02)
        set_axis_title(self.line_plot, "left", STAT_LABELS.get(t.stat, t.stat))
        set_axis_title(self.line_plot, "bottom", "batch" if self.source_kind == "capture" else "step")
        self._draw_histograms(first)

    def _draw_histograms(self, label: str) -> None:
        self.hist_image.clear()
        has_histograms = self.source_kind == "log"
        for axis in ("left", "bottom"):  # no empty axes under the message
            self.hist_plot.showAxis(axis, has_histograms)
        self.hist_bar.setVisible(False)  # until histograms are drawn
        if not has_histograms:
            set_title(self.hist_plot, "histograms over steps: only watch logs keep them per step")
            return
        layer, _, call = label.partition("#")
        kind, path = self.kind_combo.currentData(), self.source
        assert path is not None  # histograms over steps come from a log

        def read() -> tuple[np.ndarray, np.ndarray]:
            return timelines.layer_histograms(path, layer, int(call or 0), kind)

        def got(result: tuple[np.ndarray, np.ndarray]) -> None:
            steps, counts = result
            self.show_histograms(label, steps, counts)

        # A separate small job: the generation number drops it if the choice changes.
        self._submit(read, got)

    def show_histograms(self, label: str, steps: np.ndarray, counts: np.ndarray) -> None:
        """Draw ``counts`` (steps × bins) as bins × steps: the bins from the first used to
        the last, values growing upwards, long runs of empty bins left out
        (``gradexplorer.recording.timeline.histogram_rows``)."""
        rows = timelines.histogram_rows(counts) if counts.size else []
        if not rows:
            set_title(self.hist_plot, f"{label}: no histograms")
            return
        picked = np.zeros((counts.shape[0], len(rows)), dtype=np.float64)
        for i, b in enumerate(rows):
            if b is not None:
                picked[:, i] = counts[:, b]
        img = np.log10(1.0 + picked.T)
        shown = img[[i for i, b in enumerate(rows) if b is not None]]
        self.bin_axis.set_rows(rows, QFontMetrics(self.hist_widget.font()))
        self.hist_image.setImage(img, autoLevels=False)
        self.hist_image.setRect(0, 0, steps.size, len(rows))
        self.hist_plot.setYRange(0, len(rows), padding=0)
        self.hist_plot.setXRange(0, steps.size, padding=0)
        self.hist_bar.set_range(float(shown.min()), float(shown.max()))
        self.hist_bar.setVisible(True)
        step_every = max(1, steps.size // 10)
        self.hist_plot.getAxis("bottom").setTicks(
            [[(j + 0.5, str(int(s))) for j, s in enumerate(steps) if j % step_every == 0]])
        kind = KIND_LABELS.get(self.kind_combo.currentData(), "")
        set_title(self.hist_plot, f"{self.row_name(label)}: {kind} histograms over steps "
                                  "(signed log2 bins; ⋯: empty bins left out)")

    # -- export ---------------------------------------------------------------------------------
    def export_title(self) -> str:
        """The title line of an exported picture: the source, what the rows are, the statistic."""
        t = self.timeline
        what = (f"{KIND_LABELS.get(t.kind, t.kind)}, {STAT_LABELS.get(t.stat, t.stat)}" if t is not None else "")
        return " · ".join(p for p in (os.path.basename(self.source or ""), "timeline", what) if p)

    def export_png(self, path: str | None = None) -> str | None:
        """Save the view as it is drawn, at twice the screen's resolution under a title line
        (PNG, or SVG by the suffix; asks for a file when ``path`` is None)."""
        if path is None:
            suggested = file_name(os.path.splitext(os.path.basename(self.source or "timeline"))[0],
                                  self.kind_combo.currentData(), "timeline")
            path = dialogs.ask_save_file(self, "Export timeline", suggested, PLOT_FILTER)
            if not path:
                return None
        try:
            write_export(plot_bytes(self, path, self.export_title()), path, [self.source_file])
        except (GradExplorerError, OSError) as exc:
            self.status.setText(f"{exc.problem} {exc.fix}" if isinstance(exc, GradExplorerError)
                                else f"Cannot write {path}: {exc}.")
            return None
        return path

    def export_csv(self, path: str | None = None) -> str | None:
        """Save the matrix shown, layers × steps, with the loss (asks when ``path`` is None)."""
        if self.timeline is None:
            return None
        if path is None:
            path = dialogs.ask_save_file(self, "Export timeline as CSV", "timeline.csv", "CSV files (*.csv)")
            if not path:
                return None
        try:
            check_output_path(path, [self.source_file])
            timelines.timeline_csv(self.timeline, path)
        except GradExplorerError as exc:
            self.status.setText(f"{exc.problem} {exc.fix}")
            return None
        return path
