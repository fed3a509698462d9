"""Statistics of the selected layer and call: every tensor in one table, exportable as CSV."""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHeaderView, QLabel, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from gradexplorer.capturing.data import layer_label
from gradexplorer_app.views.context_menus import FULL_VALUE_ROLE, full_value, install_table_copy
from gradexplorer_app.views.export import write_export
from gradexplorer_app.views.view_context import TENSOR_LABELS, CaptureView

#: (header, stats key) of the columns after the tensor's name.
COLUMNS = (
    ("numel", "numel"),
    ("min", "min"),
    ("max", "max"),
    ("mean", "mean"),
    ("std", "std"),
    ("mean |x|", "mean_abs"),
    ("L2", "l2"),
    ("zero %", "zero_fraction"),
    ("NaN", "nan_count"),
    ("Inf", "inf_count"),
)
_CSV_HEADER = ["tensor", "numel", "min", "max", "mean", "std", "mean_abs", "l2", "zero_percent", "nan", "inf"]


def _cell(key: str, value: float) -> str:
    if key in ("numel", "nan_count", "inf_count"):
        return f"{int(value):,}"
    if key == "zero_fraction":
        return f"{100.0 * value:.2f}"
    v = float(value)
    return f"{v:.5g}" if math.isfinite(v) else str(v)


class StatsTableView(CaptureView):
    """One column per tensor (activation, output gradient, input gradient, each parameter
    gradient), one row per statistic.

    Tensors across and statistics down: ten statistics across made columns too narrow for
    their numbers ("393…") in the window's middle panel; three to six tensors fit, each
    column as wide as its numbers, and the table scrolls sideways for a layer with many
    parameters."""

    title = "Statistics"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._rows: list[tuple[str, Mapping[str, Any] | None]] = []
        content = QWidget(self)
        self.info_label = QLabel()
        self.info_label.setWordWrap(True)
        self.info_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.table = QTableWidget(len(COLUMNS), 0)
        self.table.setVerticalHeaderLabels([h for h, _ in COLUMNS])
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        header.setDefaultAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        v = QVBoxLayout(content)
        v.setContentsMargins(4, 4, 4, 4)
        v.addWidget(self.info_label)
        v.addWidget(self.table, 1)
        self.set_content(content)
        install_table_copy(self.table)

    # -- public API -------------------------------------------------------------------
    def rows(self) -> list[tuple[str, Mapping[str, Any] | None]]:
        """``(label, stats)`` per tensor (a column of the table), as shown (stats None: not
        captured)."""
        self.ensure_drawn()
        return list(self._rows)

    def csv_text(self) -> str:
        """The table as CSV, full precision (``repr`` of floats), zero as a percentage."""
        self.ensure_drawn()
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        ctx = self.context
        w.writerow(["# layer", ctx.layer or "", "call", ctx.call, "shape", self._shape_text(), "dtype",
                    self._dtype_text(), "device", self._device_text()])
        w.writerow(_CSV_HEADER)
        for label, s in self._rows:
            if s is None:
                w.writerow([label] + [""] * (len(_CSV_HEADER) - 1))
                continue
            w.writerow([label, int(s["numel"]), repr(float(s["min"])), repr(float(s["max"])),
                        repr(float(s["mean"])), repr(float(s["std"])), repr(float(s["mean_abs"])),
                        repr(float(s["l2"])), repr(100.0 * float(s["zero_fraction"])),
                        int(s["nan_count"]), int(s["inf_count"])])
        return buf.getvalue()

    def export_csv(self, path: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = ()) -> Path:
        """Write ``csv_text()`` to ``path`` atomically (a temporary file, then a rename), never
        over one of ``inputs`` (the files the window read)."""
        return write_export(self.csv_text().encode("utf-8"), path, inputs)

    def export_widget(self) -> QWidget:
        return self

    def plot_widgets(self) -> list[QWidget]:
        return []  # the table has a menu of its own (copy)

    # -- drawing ----------------------------------------------------------------------
    def _shape_text(self) -> str:
        call = self.context.call_record
        return "" if call is None else "(" + ", ".join(map(str, call.shape)) + ")"

    def _dtype_text(self) -> str:
        call = self.context.call_record
        return "" if call is None else call.dtype

    def _scope_text(self) -> str:
        ctx = self.context
        dataset = (ctx.capture.meta.get("dataset") if ctx.capture is not None else None) or {}
        if dataset:
            return (f"over the whole dataset ({dataset.get('samples')} samples in {dataset.get('batches')} "
                    "batches, merged); parameter gradients are each batch's sum, merged")
        n = ctx.batch_size
        return f"over the whole batch ({n} sample{'s' if n != 1 else ''}); parameter gradients are summed over it"

    def _device_text(self) -> str:
        cap = self.context.capture
        return "" if cap is None else str(cap.meta.get("device", "unknown"))

    def refresh(self) -> None:
        self._rows = []
        ctx = self.context
        problem = self.common_problem()
        never_ran = ctx.record is not None and ctx.call_record is None and any(ctx.record.param_stats.values())
        if problem and not never_ran:
            self.table.setColumnCount(0)
            self.show_message(problem)
            return
        rec = ctx.record
        assert rec is not None  # common_problem found it, or it never ran with parameter gradients
        call = ctx.call_record
        rows: list[tuple[str, Mapping[str, Any] | None]] = []
        if call is not None:
            rows += [(TENSOR_LABELS[k], call.stats.get(k)) for k in ("activation", "grad_output", "grad_input")]
        # A module that never ran still has its parameters' gradients (its parent used them):
        # those columns alone.
        rows += [(f"gradient of {p}", s) for p, s in rec.param_stats.items()]
        self._rows = rows
        self.table.setColumnCount(len(rows))
        self.table.setHorizontalHeaderLabels([label.replace("gradient of ", "∇ ") for label, _ in rows])
        for c, (label, _s) in enumerate(rows):
            header_item = self.table.horizontalHeaderItem(c)
            if header_item is not None:
                header_item.setToolTip(label)
        for c, (_label, s) in enumerate(rows):
            for r, (_, key) in enumerate(COLUMNS):
                text = "not captured" if s is None and r == 0 else ("" if s is None else _cell(key, s[key]))
                item = QTableWidgetItem(text)
                if s is not None:  # Ctrl+C copies every digit, not the five shown
                    value = 100.0 * float(s[key]) if key == "zero_fraction" else s[key]
                    item.setData(FULL_VALUE_ROLE, full_value(value))
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if s is not None and key in ("nan_count", "inf_count") and s[key]:
                    item.setForeground(Qt.GlobalColor.red)
                self.table.setItem(r, c, item)
        name = layer_label(ctx.layer or "")
        if call is None:
            self.info_label.setText(
                f"<b>{name}</b> ({rec.type}) · <i>not called</i>: it never ran during the forward pass (its "
                "parent used its weights directly), so it has no output nor output gradient; its parameters' "
                f"gradients below · computed on <b>{self._device_text()}</b> · "
                f"<span style='color:gray'>{self._scope_text()}</span>")
            self.show_content()
            return
        calls = f" · call {ctx.call + 1} of {len(rec.calls)}" if len(rec.calls) > 1 else ""
        key = f" · output element '{call.output_key}'" if call.output_key else ""
        self.info_label.setText(
            f"<b>{name}</b> ({rec.type}){calls}{key} · shape {self._shape_text()} · {call.dtype} · "
            f"computed on <b>{self._device_text()}</b> · "
            f"<span style='color:gray'>{self._scope_text()}</span>"
        )
        self.show_content()
