"""Histogram of the selected tensor, from the capture's statistics (so it works in stats mode).

Ordinary captures hold ``hist_bins`` equal-width bins over the tensor's range, drawn on a
linear value axis. Dataset captures (``hist_kind == "log2"``, ``gradexplorer.recording.dataset_capture``)
hold counts in fixed signed log2-magnitude bins (``gradexplorer.stats.merge``): one bar per power
of two, the zero bin in the middle. Those are drawn on their own bins: the x axis is the
bin index (every octave one unit wide, negatives to the left of zero), its ticks read as
the bins' edges (``2^-7``, ``-2^3``), and the counts are the exact integer ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent, QStandardItemModel
from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from gradexplorer.capturing.data import Capture
from gradexplorer.stats.record import TensorStats
from gradexplorer.stats.tensor_stats import tensor_stats
from gradexplorer_app.views.plot_style import FOREGROUND, Log10Axis, set_axis_title, style_plot, style_plot_widget
from gradexplorer_app.views.view_context import TENSOR_LABELS, CaptureView, ViewContext

_SCOPES = (("batch", "whole batch"), ("sample", "this sample"))


def edge_label(value: float) -> str:
    """A signed log2 bin edge as text: ``0``, ``2^-7``, ``-2^3``, ``inf``."""
    if value == 0:
        return "0"
    if math.isinf(value):
        return "-inf" if value < 0 else "inf"
    return f"{'-' if value < 0 else ''}2^{round(math.log2(abs(value)))}"


def log2_edges(capture: Capture | None) -> np.ndarray:
    """The signed log2 bins' edges of a dataset capture (its ``meta["dataset"]``, else
    ``gradexplorer.stats.merge``'s, which the capture's are)."""
    meta = getattr(capture, "meta", None) or {}
    edges = (meta.get("dataset") or {}).get("hist_edges")
    if edges is None:
        # Imported on first use: needed only for the log2 histograms of mergeable statistics.
        from gradexplorer.stats.merge import hist_edges

        return hist_edges()
    return np.asarray(edges.numpy() if hasattr(edges, "numpy") else edges, dtype=np.float64)


def _fmt(v: float) -> str:
    return f"{v:.4g}" if isinstance(v, float) and math.isfinite(v) else str(v)


class HistogramView(CaptureView):
    """Counts of the selected tensor's values in 64 bins, with NaN/Inf counts and range."""

    title = "Histogram"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._stats: TensorStats | None = None
        self._cache: dict = {}

        content = QWidget(self)
        self.tensor_combo = QComboBox()
        self.tensor_combo.setMinimumContentsLength(18)
        self.scope_combo = QComboBox()
        for key, label in _SCOPES:
            self.scope_combo.addItem(label, key)
        model = self.scope_combo.model()
        assert isinstance(model, QStandardItemModel)  # a combo box's own model: its items can be disabled
        self._scope_model = model
        # Never narrower than its longest item, also when an item is renamed ("whole dataset"
        # for a dataset capture): squeezed beside the tensor box it had read "whole datase".
        self.scope_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.scope_combo.setSizePolicy(QSizePolicy.Policy.Minimum, self.scope_combo.sizePolicy().verticalPolicy())
        self.log_check = QCheckBox("log counts")
        self.info_label = QLabel()
        self.info_label.setWordWrap(True)
        self.info_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.plot_widget = pg.PlotWidget(axisItems={"left": Log10Axis("left")})
        style_plot_widget(self.plot_widget)
        self.plot = self.plot_widget.getPlotItem()
        self.plot.setMenuEnabled(False)
        style_plot(self.plot)
        self.plot.showGrid(x=True, y=True, alpha=0.15)
        set_axis_title(self.plot, "bottom", "value")
        set_axis_title(self.plot, "left", "count")
        self.plot.getAxis("left").set_log_labels(False)
        self.curve = self.plot.plot([0, 1], [0], stepMode="center", fillLevel=0,
                                    pen=pg.mkPen("#4c8bd6", width=1.5), brush=pg.mkBrush(76, 139, 214, 110))
        self.zero_line = pg.InfiniteLine(0, angle=90, pen=pg.mkPen(FOREGROUND, style=Qt.PenStyle.DashLine))
        self.plot.addItem(self.zero_line)
        self.note = pg.TextItem(anchor=(1, 0), color="#ff5c5c")
        self.note.setParentItem(self.plot.vb)

        row = QHBoxLayout()
        row.addWidget(QLabel("Tensor"))
        row.addWidget(self.tensor_combo)
        row.addWidget(self.scope_combo)
        row.addWidget(self.log_check)
        row.addStretch(1)
        v = QVBoxLayout(content)
        v.setContentsMargins(4, 4, 4, 4)
        v.addLayout(row)
        v.addWidget(self.plot_widget, 1)
        v.addWidget(self.info_label)
        self.set_content(content)

        self.tensor_combo.currentIndexChanged.connect(self._on_controls_changed)
        self.scope_combo.currentIndexChanged.connect(self._on_controls_changed)
        # Until the user ticks or unticks it, log counts follow the bins: on for the log2 bins
        # of a dataset (their counts span many powers of ten, and the rare huge gradients
        # people look for would be invisible bars), off for value bins.
        self._log_chosen = False
        self.log_check.toggled.connect(self._on_log_chosen)
        self.log_check.toggled.connect(self._on_controls_changed)

    def set_context(self, context: ViewContext) -> None:
        if context.capture is not self.context.capture:
            self._cache.clear()
        super().set_context(context)

    # -- public API -------------------------------------------------------------------
    def set_tensor(self, key: str) -> None:
        """``activation``, ``grad_output``, ``grad_input``, ``grad_x_activation`` or ``param:<name>``."""
        self.ensure_drawn()
        i = self.tensor_combo.findData(key)
        if i < 0:
            raise KeyError(key)
        self.tensor_combo.setCurrentIndex(i)

    def set_scope(self, scope: str) -> None:
        self.scope_combo.setCurrentIndex([k for k, _ in _SCOPES].index(scope))

    def current_stats(self) -> TensorStats | None:
        self.ensure_drawn()
        return self._stats

    def current_counts(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(edges, counts)`` as plotted (counts before any log scaling): the value edges
        of the bars drawn (for log2 bins, the used ones, ``len(counts) + 1`` edges)."""
        self.ensure_drawn()
        if self._stats is None:
            return None
        edges, counts, _x = self._bars(self._stats)
        return edges, counts

    def _bars(self, s: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(value edges, counts, x edges on the plot)`` of the bars to draw (a dataset
        capture's records, ``DatasetTensorStats``, may hold log2 bins)."""
        if s.get("hist_kind") != "log2":
            counts = s["hist"].numpy().astype(np.float64)
            edges = np.linspace(s["hist_range"][0], s["hist_range"][1], len(counts) + 1)
            return edges, counts, edges
        # The exact integer counts (``hist`` is float32, exact only up to 2^24).
        merged = s.get("merged") or {}
        raw = merged.get("hist", s["hist"])
        counts = np.asarray(raw.numpy() if hasattr(raw, "numpy") else raw, dtype=np.float64)
        edges = log2_edges(self.context.capture)
        used = np.flatnonzero(counts)
        lo, hi = (int(used[0]), int(used[-1]) + 1) if used.size else (len(counts) // 2, len(counts) // 2 + 1)
        return edges[lo:hi + 1], counts[lo:hi], np.arange(lo, hi + 1, dtype=np.float64)

    def export_widget(self) -> QWidget:
        return self.plot_widget

    def export_detail(self) -> str:
        return f"{self.tensor_combo.currentText()}, {self.scope_combo.currentText()}"

    # -- drawing ----------------------------------------------------------------------
    def _fill_tensor_combo(self) -> None:
        ctx = self.context
        _cap, rec, call = ctx.selected()
        keep = self.tensor_combo.currentData() or "grad_output"
        items = [(k, TENSOR_LABELS[k]) for k in ("grad_output", "activation", "grad_input")
                 if call.stats.get(k)]
        if not ctx.stats_only and call.activation is not None and call.grad_output is not None:
            items.append(("grad_x_activation", TENSOR_LABELS["grad_x_activation"]))
        items += [(f"param:{p}", f"gradient of {p}") for p, s in rec.param_stats.items() if s]
        self.tensor_combo.blockSignals(True)
        self.tensor_combo.clear()
        for key, label in items:
            self.tensor_combo.addItem(label, key)
        i = self.tensor_combo.findData(keep)
        self.tensor_combo.setCurrentIndex(i if i >= 0 else 0)
        self.tensor_combo.blockSignals(False)
        sample_ok = not ctx.stats_only
        dataset = ctx.capture is not None and bool(ctx.capture.meta.get("dataset"))
        self.scope_combo.setItemText(0, "whole dataset" if dataset else _SCOPES[0][1])
        self._scope_model.item(1).setEnabled(sample_ok)
        if not sample_ok and self.scope_combo.currentIndex() == 1:
            self.scope_combo.blockSignals(True)
            self.scope_combo.setCurrentIndex(0)
            self.scope_combo.blockSignals(False)

    def _stats_for(self, key: str, scope: str) -> tuple[TensorStats | None, str]:
        ctx = self.context
        _cap, rec, call = ctx.selected()
        dataset = (ctx.capture.meta.get("dataset") if ctx.capture is not None else None) or {}
        if key.startswith("param:"):
            p = key.split(":", 1)[1]
            where = (f"each of the {dataset.get('batches')} batches' parameter gradients, merged" if dataset
                     else "the parameter gradient (summed over the batch)")
            return rec.param_stats.get(p), where
        cache_key = (ctx.layer, ctx.call, key, scope, ctx.sample if scope == "sample" else -1)
        if cache_key in self._cache:
            return self._cache[cache_key]
        if scope == "sample":
            t = ctx.sample_tensor(key)
            result = (None if t is None else tensor_stats(t, hist_exact_limit=None)), ctx.sample_name()
        elif key == "grad_x_activation":
            t = ctx.tensor(key)
            samples = f"{ctx.batch_size} sample{'s' if ctx.batch_size != 1 else ''}"
            result = (None if t is None else tensor_stats(t)), f"the whole batch ({samples})"
        elif dataset:
            result = call.stats.get(key), (f"the whole dataset ({dataset.get('samples')} samples in "
                                           f"{dataset.get('batches')} batches, merged statistics)")
        else:
            samples = f"{ctx.batch_size} sample{'s' if ctx.batch_size != 1 else ''}"
            result = call.stats.get(key), f"the whole batch ({samples}, captured statistics)"
        if len(self._cache) > 64:
            self._cache.clear()
        self._cache[cache_key] = result
        return result

    def refresh(self) -> None:
        self._stats = None
        problem = self.common_problem()
        if problem:
            self.show_message(problem)
            return
        self._fill_tensor_combo()
        key = self.tensor_combo.currentData()
        if key is None:
            self.show_message(f"No statistics were recorded for '{self.context.layer}'.")
            return
        stats, scope_text = self._stats_for(key, self.scope_combo.currentData())
        if stats is None:
            self.show_message(f"No {self.tensor_combo.currentText()} for this selection.")
            return
        self._stats = stats
        self._draw(stats, scope_text)
        self.show_content()

    def _on_log_chosen(self, _checked: bool) -> None:
        self._log_chosen = True  # the default's own change is made with signals blocked

    def _draw(self, s: TensorStats, scope_text: str) -> None:
        edges, counts, x = self._bars(s)
        if not self._log_chosen and self.log_check.isChecked() != (s.get("hist_kind") == "log2"):
            self.log_check.blockSignals(True)  # the default, not a change to redraw for
            self.log_check.setChecked(s.get("hist_kind") == "log2")
            self.log_check.blockSignals(False)
        log = self.log_check.isChecked()
        y = np.log10(counts + 1.0) if log else counts
        self.curve.setData(x, y)
        set_axis_title(self.plot, "left", "count + 1 (log)" if log else "count")
        left = self.plot.getAxis("left")
        left.set_log_labels(log)
        left.enableAutoSIPrefix(not log)
        bottom = self.plot.getAxis("bottom")
        if s.get("hist_kind") == "log2":
            # Imported on first use: needed only for the log2 histograms of mergeable statistics.
            from gradexplorer.stats.merge import ZERO_BIN

            # Ticks on the bins' edges, about seven of them; the zero bin (|x| < 2^-126) is
            # labelled 0 at its centre, and edges too near it are left out (they would overlap).
            every = max(1, len(edges) // 7)
            ticks = [(float(x[i]), edge_label(float(edges[i]))) for i in range(len(edges))
                     if i % every == 0 and not (ZERO_BIN - every / 2 < x[i] < ZERO_BIN + 1 + every / 2)]
            if x[0] <= ZERO_BIN and x[-1] >= ZERO_BIN + 1:
                ticks.append((ZERO_BIN + 0.5, "0"))
            bottom.setTicks([ticks])
            bottom.enableAutoSIPrefix(False)
            set_axis_title(self.plot, "bottom", "value (one bar per power of two)")
            self.zero_line.setPos(ZERO_BIN + 0.5)
            self.zero_line.setVisible(bool(x[0] <= ZERO_BIN and x[-1] >= ZERO_BIN + 1))
        else:
            bottom.setTicks(None)
            bottom.enableAutoSIPrefix(True)
            set_axis_title(self.plot, "bottom", "value")
            lo, hi = s["hist_range"]
            self.zero_line.setPos(0)
            self.zero_line.setVisible(bool(lo < 0 < hi))
        self.plot.enableAutoRange()

        bad = []
        if s["nan_count"]:
            bad.append(f"NaN: {s['nan_count']:,}")
        if s["inf_count"]:
            bad.append(f"Inf: {s['inf_count']:,}")
        self.note.setText("  ".join(bad) + (" (not in the bins)" if bad else ""))
        self.note.setPos(self.plot.vb.width() - 8, 4)

        ctx = self.context
        approx = "" if s["hist_exact"] else " · <i>approximate (subsampled)</i>"
        nonfinite = (f"NaN {s['nan_count']:,} · Inf {s['inf_count']:,}")
        colour = "#ff5c5c" if (s["nan_count"] or s["inf_count"]) else "gray"
        self.info_label.setText(
            f"<b>{ctx.layer}</b> · {self.tensor_combo.currentText()} · {scope_text}<br>"
            f"range [{_fmt(s['min'])}, {_fmt(s['max'])}] · {s['numel']:,} values · "
            f"mean {_fmt(s['mean'])} · std {_fmt(s['std'])} · zeros {100 * s['zero_fraction']:.1f} % · "
            f"<span style='color:{colour}'>{nonfinite}</span>{approx}"
        )

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.note.setPos(self.plot.vb.width() - 8, 4)

    def _on_controls_changed(self, *_: object) -> None:
        self.refresh()
