"""Timeline of a watch log (or a dataset capture's per-batch series): layers × steps.

A heatmap of one statistic (log colour), the first NaN/Inf marked (a line at its step and
a marker on its first layer), a click on a cell shows that layer's histograms over steps
(TensorBoard's distribution view, on the fixed signed log2 bins), line plots of the layers
chosen in the list, PNG and CSV export. While a log grows, the view follows it: a timer
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
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from gradexplorer.app import dialogs
from gradexplorer.app.views.export import png_bytes, write_export
from gradexplorer.app.views.label_fit import wrap_label
from gradexplorer.app.views.plot_style import (
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
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.file_write import check_output_path
from gradexplorer.capturing.data import Capture
from gradexplorer.files.capture_file import load_capture

# The readers are looked up on the module when a worker calls them (tests replace them).
from gradexplorer.recording import timeline as timelines
from gradexplorer.recording.timeline import Onset, Timeline, log_colour
from gradexplorer.recording.watch_log import MODULE_KINDS
from gradexplorer.stats.merge import HIST_BINS, MAG_LOW, ZERO_BIN

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
#: The series fields of dataset captures (gradexplorer.recording.dataset.SERIES_FIELDS).
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


def bin_label(index: int) -> str:
    """A short label of a signed log2 bin: ``0``, ``2^-3``, ``-2^5``, ``<-2^63``..."""
    if index == ZERO_BIN:
        return "0"
    negative = index < ZERO_BIN
    j = (ZERO_BIN - 1 - index) if negative else (index - ZERO_BIN - 1)
    sign = "-" if negative else ""
    if j == 0:
        return f"{sign}tiny"
    if j == HIST_BINS // 2 - 1:
        return f"{sign}huge"
    return f"{sign}2^{j - 1 + MAG_LOW}"


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

        # heatmap
        self.heat_widget = pg.GraphicsLayoutWidget()
        style_plot_widget(self.heat_widget)
        # The rows' names: as many as fit the plot's height, all of them when zoomed in.
        self.row_axis = LayerAxis("left", offset=0.5)
        self.heat_plot = self.heat_widget.addPlot(row=0, col=0, axisItems={"left": self.row_axis})
        self.heat_plot.invertY(True)
        self.heat_plot.setMenuEnabled(False)
        self.heat_plot.hideButtons()
        self.heat_image = pg.ImageItem(axisOrder="row-major")
        self.heat_plot.addItem(self.heat_image)
        # Cells with no finite value (every element NaN/Inf): an overlay of their own colour,
        # so that they do not read as "small" on the log scale.
        self.nan_image = pg.ImageItem(axisOrder="row-major")
        self.heat_plot.addItem(self.nan_image)
        self.colour_bar = ScaleBar("|value| (log scale)", signed=False, log10=True)
        self.colour_bar.setImageItem(self.heat_image, insert_in=self.heat_plot)
        self.onset_line = pg.InfiniteLine(angle=90, pen=pg.mkPen(FLAG_COLOURS["nan/inf"], width=2))
        self.onset_marker = pg.ScatterPlotItem(symbol="x", size=14, pen=pg.mkPen(FLAG_COLOURS["nan/inf"], width=2),
                                               brush=None)
        self.onset_text = pg.TextItem(color=FLAG_COLOURS["nan/inf"], anchor=(0, 1))
        self.select_box = pg.QtWidgets.QGraphicsRectItem(0, 0, 1, 1)
        self.select_box.setPen(pg.mkPen(SELECTED_COLOUR, width=2))
        for item in (self.onset_line, self.onset_marker, self.onset_text, self.select_box):
            item.setVisible(False)
            self.heat_plot.addItem(item)
        self.heat_plot.scene().sigMouseClicked.connect(self._on_heat_click)

        # histograms over steps, and lines
        self.hist_widget = pg.GraphicsLayoutWidget()
        style_plot_widget(self.hist_widget)
        # The bins' names: as many as fit the plot's height (it is short), never overlapping.
        self.bin_axis = LayerAxis("left", offset=0.5)
        self.bin_axis.set_names([bin_label(b) for b in range(HIST_BINS)], QFontMetrics(self.hist_widget.font()))
        self.hist_plot = self.hist_widget.addPlot(row=0, col=0, axisItems={"left": self.bin_axis})
        self.hist_plot.setMenuEnabled(False)
        self.hist_image = pg.ImageItem(axisOrder="row-major")
        self.hist_plot.addItem(self.hist_image)
        self.hist_bar = ScaleBar("count per bin (log)", signed=False, log10=True, plus_one=True)
        self.hist_bar.setImageItem(self.hist_image, insert_in=self.hist_plot)
        self.line_plot = self.hist_widget.addPlot(row=1, col=0,
                                                  axisItems={"bottom": IntegerAxis("bottom")})
        # The histograms are a picture with a colour bar: they get the larger share.
        self.hist_widget.ci.layout.setRowStretchFactor(0, 3)
        self.hist_widget.ci.layout.setRowStretchFactor(1, 2)
        for plot in (self.heat_plot, self.hist_plot, self.line_plot):
            style_plot(plot)
        # A log axis with an SI factor in its title ("(x0.001)") reads as another scale.
        self.line_plot.getAxis("left").enableAutoSIPrefix(False)
        set_title(self.hist_plot, "histograms over steps")
        set_title(self.line_plot, "chosen layers")
        self.line_plot.addLegend(offset=(5, 5), labelTextColor=FOREGROUND)
        self.line_plot.setMenuEnabled(False)

        self.layer_list = QListWidget()
        self.layer_list.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.layer_list.setMaximumWidth(260)

        lower = QSplitter(Qt.Orientation.Horizontal)
        lower.addWidget(self.layer_list)
        lower.addWidget(self.hist_widget)
        lower.setStretchFactor(1, 1)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.heat_widget)
        split.addWidget(lower)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)

        layout = QVBoxLayout(self)
        layout.addLayout(bar)
        layout.addWidget(split, 1)
        layout.addWidget(self.status)

        self._fill_stats()
        self.kind_combo.currentIndexChanged.connect(self._on_choice_changed)
        self.stat_combo.currentIndexChanged.connect(self._on_choice_changed)
        self.layer_list.itemSelectionChanged.connect(self._on_list_selection)
        self.png_button.clicked.connect(lambda: self.export_png())
        self.csv_button.clicked.connect(lambda: self.export_csv())
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

    def _fill_layer_list(self) -> None:
        t = self.timeline
        self.layer_list.blockSignals(True)
        self.layer_list.clear()
        if t is not None:
            self.layer_list.addItems(t.rows)
            keep = [r for r in self.selected if r in t.rows] or t.rows[:1]
            self.selected = keep
            for i, r in enumerate(t.rows):
                self.layer_list.item(i).setSelected(r in keep)
        self.layer_list.blockSignals(False)

    def _on_list_selection(self) -> None:
        self.selected = [it.text() for it in self.layer_list.selectedItems()]
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
        overlay = np.zeros(img.shape + (4,), dtype=np.uint8)
        if t.values.size:
            nonfinite = np.isnan(t.values) | np.isinf(t.values)
            overlay[nonfinite] = _NAN_RGBA
        self.nan_image.setImage(overlay, autoLevels=False, levels=(0, 255))
        self.nan_image.setRect(*rect)
        self.colour_bar.set_range(lo, hi)
        self.colour_bar.set_title(f"{STAT_LABELS.get(t.stat, t.stat)} (log scale)")
        self.row_axis.set_names(list(t.rows), QFontMetrics(self.heat_widget.font()))
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
            self.line_plot.plot(t.steps[ok].astype(float), v[ok], name=name,
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
        """Draw ``counts`` (steps × bins) as bins (rows, cropped to those used) × steps."""
        if counts.size == 0:
            set_title(self.hist_plot, f"{label}: no histograms")
            return
        used = np.flatnonzero(counts.sum(axis=0))
        lo, hi = int(used[0]), int(used[-1]) + 1
        img = np.log10(1.0 + counts[:, lo:hi].T.astype(np.float64))
        self.hist_image.setImage(img, autoLevels=False)
        self.hist_image.setRect(0, lo, steps.size, hi - lo)
        self.hist_bar.set_range(float(img.min()), float(img.max()))
        self.hist_bar.setVisible(True)
        step_every = max(1, steps.size // 10)
        self.hist_plot.getAxis("bottom").setTicks(
            [[(j + 0.5, str(int(s))) for j, s in enumerate(steps) if j % step_every == 0]])
        kind = KIND_LABELS.get(self.kind_combo.currentData(), "")
        set_title(self.hist_plot, f"{label}: {kind} histograms over steps (signed log2 bins)")

    # -- export ---------------------------------------------------------------------------------
    def export_png(self, path: str | None = None) -> str | None:
        """Save the view as it is drawn (asks for a file when ``path`` is None)."""
        if path is None:
            path = dialogs.ask_save_file(self, "Export timeline as PNG", "timeline.png", "PNG images (*.png)")
            if not path:
                return None
        try:
            write_export(png_bytes(self), path, [self.source_file])
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
