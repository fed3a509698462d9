"""Heatmap of one sample's gradient, activation or gradient × activation at the selected layer."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
import torch
from PySide6.QtCore import QPointF, QSignalBlocker, Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from gradexplorer.analysis.heatmaps import (
    Heatmap,
    Layout,
    describe_layout,
    grid_columns,
    heatmap,
    is_signed,
    layout_of,
    symmetric_levels,
)
from gradexplorer.pipeline.view_state import ViewState
from gradexplorer_app.listeners import listen
from gradexplorer_app.views.label_fit import ElidedLabel, wrap_label
from gradexplorer_app.views.plot_style import ScaleBar, image_plot, set_axis_title, style_plot_widget
from gradexplorer_app.views.view_context import TENSOR_LABELS, CaptureView

_TENSORS = ("grad_output", "activation", "grad_x_activation")
_DISPLAYS = (
    ("channel", "one channel"), ("topk", "top-k channels"), ("reduce", "all channels reduced"),
)
#: What each choice shows, in full (the items stay short: the row of controls is narrow).
_DISPLAY_TIPS = {
    "channel": "one channel of the layer, chosen with the slider",
    "topk": "the k channels whose gradient has the largest L2 norm, strongest first (each tile named)",
    "reduce": "every channel reduced to one map (mean, mean |x| or L2 norm over channels)",
}
_REDUCTIONS = (("mean", "mean"), ("mean_abs", "mean |x|"), ("l2", "L2 norm"))


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    return f"{v:.4g}"


TILE_LABEL_COLOUR = "#111827"
TILE_LABEL_FILL = (255, 255, 255, 170)
#: The tile labels' font size: small, so that a label says which channel without hiding it.
TILE_LABEL_POINTS = 7
#: A tile is labelled only when, on screen, it is at least this many times as wide and as
#: tall as its label (which then covers at most a sixth of its corner); smaller tiles are
#: named by the hover text and the layout line above the plot.
TILE_LABEL_ROOM = (1.8, 3.5)


def scale_title(kind: str, display: str, reduce: str) -> str:
    """What the heatmap's colours measure, with its unit, for its colour bar."""
    quantity = {"grad_output": "gradient ∂L/∂y", "activation": "activation y",
                "grad_x_activation": "gradient × activation"}.get(kind, TENSOR_LABELS.get(kind, kind))
    unit = {"grad_output": "loss per unit of y", "activation": "layer output",
            "grad_x_activation": "loss units"}.get(kind, "")
    if display == "reduce":
        quantity = f"{dict(_REDUCTIONS)[reduce]} of {quantity}"
    return f"{quantity} ({unit})" if unit else quantity


class HeatmapView(CaptureView):
    """One sample's tensor at the selected layer and call, as a picture with a colour bar."""

    title = "Heatmap"

    def __init__(self, parent: QWidget | None = None, state: ViewState | None = None) -> None:
        super().__init__(parent)
        self.state = state if state is not None else ViewState()
        self._heatmap: Heatmap | None = None
        self._grid: int | None = None  # the top-k grid's columns, fitted to the plot
        self._tokens: tuple[str, ...] | None = None  # the rows of a text sample
        self._signed = False
        self._applying = False

        content = QWidget(self)
        controls = self._build_controls()
        self.layout_label = wrap_label(QLabel())
        self.layout_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.hover_label = ElidedLabel(" ")
        self.hover_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.hover_label.setStyleSheet("QLabel { font-family: monospace; }")
        self._build_plot()
        self._lay_out(content, controls)
        self._connect()
        self._on_model_tensor_changed(self.state.tensor)
        self._on_model_reduction_changed(self.state.reduction)
        self._on_model_channel_changed(self.state.channel)
        self._sync_visibility(None)

    def _build_controls(self) -> QHBoxLayout:
        """Tensor, display, channel, k, reduction and time, in one row."""
        self.tensor_combo = QComboBox()
        for kind in _TENSORS:
            self.tensor_combo.addItem(TENSOR_LABELS[kind], kind)
        self.display_combo = QComboBox()
        for key, label in _DISPLAYS:
            self.display_combo.addItem(label, key)
            self.display_combo.setItemData(self.display_combo.count() - 1, _DISPLAY_TIPS[key],
                                           Qt.ItemDataRole.ToolTipRole)
        # Channel 0 of a late layer is often flat (before global pooling the gradient is
        # constant over positions); the strongest channels show more on first look.
        self.display_combo.setCurrentIndex([d for d, _ in _DISPLAYS].index("topk"))
        self.channel_slider = QSlider(Qt.Orientation.Horizontal)
        self.channel_slider.setMinimumWidth(120)
        self.channel_spin = QSpinBox()
        self.channel_spin.setPrefix("channel ")
        self.k_spin = QSpinBox()
        self.k_spin.setRange(1, 256)
        self.k_spin.setValue(16)
        self.k_spin.setPrefix("k = ")
        self.reduce_combo = QComboBox()
        for key, label in _REDUCTIONS:
            self.reduce_combo.addItem(label, key)
        self.time_spin = QSpinBox()
        self.time_spin.setPrefix("t = ")
        self.time_mean = QCheckBox("mean over time")
        self.time_mean.setChecked(True)

        controls = self._controls = QHBoxLayout()
        controls.addWidget(QLabel("Tensor"))
        controls.addWidget(self.tensor_combo)
        controls.addSpacing(8)
        controls.addWidget(QLabel("Show"))
        controls.addWidget(self.display_combo)
        controls.addWidget(self.channel_slider, 1)
        controls.addWidget(self.channel_spin)
        controls.addWidget(self.k_spin)
        controls.addWidget(self.reduce_combo)
        controls.addWidget(self.time_spin)
        controls.addWidget(self.time_mean)
        controls.addStretch(0)
        return controls

    def _build_plot(self) -> None:
        """The picture with its colour bar; the top-k tiles' labels follow its zoom and size."""
        self.plot_widget = pg.GraphicsLayoutWidget()
        style_plot_widget(self.plot_widget)
        self.plot, self.image = image_plot(self.plot_widget.ci)
        self.colorbar = ScaleBar(scale_title("grad_output", "topk", "mean"))
        self.colorbar.setImageItem(self.image, insert_in=self.plot)
        self.plot_widget.scene().sigMouseMoved.connect(self._on_mouse_moved)
        #: "ch N" over each top-k tile, so that a tile says which channel it is.
        self.tile_labels: list[pg.TextItem] = []
        self._tile_size = (0, 0)
        self.plot.vb.sigTransformChanged.connect(self._show_labels_that_fit)
        self.plot.vb.sigResized.connect(self._show_labels_that_fit)
        self.plot.vb.sigResized.connect(self._refit_grid)

    def _lay_out(self, content: QWidget, controls: QHBoxLayout) -> None:
        """The controls over the layout line, the picture (or a note in its place) and the hover line."""
        v = QVBoxLayout(content)
        v.setContentsMargins(4, 4, 4, 4)
        v.addLayout(controls)
        v.addWidget(self.layout_label)
        # Problems with one tensor (no gradient reached this layer) keep the controls, so
        # the user can switch to the activation.
        self.plot_note = QLabel()
        self.plot_note.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.plot_note.setWordWrap(True)
        self.plot_note.setStyleSheet("QLabel { color: palette(placeholder-text); font-size: 13px; padding: 24px; }")
        self.plot_note.hide()
        v.addWidget(self.plot_widget, 1)
        v.addWidget(self.plot_note, 1)
        v.addWidget(self.hover_label)
        self.set_content(content)

    def _connect(self) -> None:
        """Controls -> view state and redraws; view state -> controls."""
        self.tensor_combo.currentIndexChanged.connect(self._on_tensor_combo_changed)
        self.display_combo.currentIndexChanged.connect(self._on_controls_changed)
        self.reduce_combo.currentIndexChanged.connect(self._on_reduce_combo_changed)
        self.k_spin.valueChanged.connect(self._on_controls_changed)
        self.time_spin.valueChanged.connect(self._on_controls_changed)
        self.time_mean.toggled.connect(self._on_controls_changed)
        self.channel_slider.valueChanged.connect(self._on_channel_slider_changed)
        self.channel_spin.valueChanged.connect(self._on_channel_spin_changed)
        events = self.state.events
        listen(events.tensor, self._on_model_tensor_changed)
        listen(events.reduction, self._on_model_reduction_changed)
        listen(events.channel, self._on_model_channel_changed)

    # -- public API -------------------------------------------------------------------
    def set_tensor(self, kind: str) -> None:
        self.state.tensor = _TENSORS[_TENSORS.index(kind)]

    def set_display(self, display: str, *, channel: int | None = None, k: int | None = None,
                    reduce: str | None = None) -> None:
        """Choose what to show (``channel``, ``topk``, ``reduce``) and its parameter."""
        index = [d for d, _ in _DISPLAYS].index(display)
        if reduce is not None:
            [r for r, _ in _REDUCTIONS].index(reduce)  # an unknown reduction raises here
        self._applying = True  # one redraw for all of it, at the end
        try:
            with QSignalBlocker(self.display_combo), QSignalBlocker(self.k_spin):
                self.display_combo.setCurrentIndex(index)
                if k is not None:
                    self.k_spin.setValue(k)
            if reduce is not None:
                self.state.reduction = reduce
            if channel is not None:
                self.state.channel = int(channel)
        finally:
            self._applying = False
        self._redraw()

    def current_heatmap(self) -> Heatmap | None:
        self.ensure_drawn()
        return self._heatmap

    def current_image_array(self) -> np.ndarray | None:
        """The 2-D array shown (NaN on tile separators), or None."""
        hm = self.current_heatmap()
        return None if hm is None else hm.array

    def current_levels(self) -> tuple[float, float]:
        lo, hi = self.colorbar.levels()
        return float(lo), float(hi)

    def export_widget(self) -> QWidget:
        return self.plot_widget

    def export_detail(self) -> str:
        display = self.display_combo.currentData()
        how = {"channel": f"channel {self.channel_spin.value()}", "topk": f"top {self.k_spin.value()} channels",
               "reduce": f"{self.reduce_combo.currentText()} over channels"}.get(display, "")
        tensor = self.tensor_combo.currentText()
        return f"{tensor}, {how}" if self.display_combo.isEnabled() else tensor

    # -- drawing ----------------------------------------------------------------------
    def refresh(self) -> None:
        self._redraw()

    def _kind(self) -> str:
        return self.state.tensor if self.state.tensor in _TENSORS else _TENSORS[0]

    def _sync_visibility(self, lay: Layout | None) -> None:
        display = self.display_combo.currentData()
        spatial = lay is not None and lay.has_channels
        self.display_combo.setEnabled(spatial)
        self.channel_slider.setVisible(spatial and display == "channel")
        self.channel_spin.setVisible(spatial and display == "channel")
        self.k_spin.setVisible(spatial and display == "topk")
        self.reduce_combo.setVisible(spatial and display == "reduce")
        video = lay is not None and lay.source == "video"
        self.time_spin.setVisible(video)
        self.time_mean.setVisible(video)
        self.time_spin.setEnabled(video and not self.time_mean.isChecked())
        # Hiding widgets of a window not shown yet leaves the layout's cached minimum stale.
        self._controls.invalidate()

    def _clear(self, message: str) -> None:
        self._heatmap = None
        self.image.clear()
        self.show_message(message)

    def _show_plot_note(self, text: str) -> None:
        """A problem with the chosen tensor only: keep the controls, replace the plot."""
        self._heatmap = None
        self.image.clear()
        self.plot_note.setText(text)
        self.plot_widget.hide()
        self.plot_note.show()
        self.hover_label.setText(" ")
        self.show_content()

    def plot_note_text(self) -> str:
        """The note shown instead of the plot, or "" (for tests)."""
        self.ensure_drawn()
        return self.plot_note.text() if self.plot_note.isVisibleTo(self) else ""

    def _redraw(self) -> None:
        problem = self.common_problem(needs_tensors="heatmaps")
        if problem:
            self._clear(problem)
            return
        ctx = self.context
        kind = self._kind()
        t = ctx.sample_tensor(kind)
        if t is None:
            self._show_missing(kind)
            return
        self.plot_note.hide()
        self.plot_widget.show()
        lay = layout_of(t.shape, ctx.input_shape)
        self._sync_visibility(lay)
        tokens = lay.kind == "matrix"  # a sequence: rows are tokens, columns channels
        set_axis_title(self.plot, "left", "token" if tokens else None)
        set_axis_title(self.plot, "bottom", "channel" if tokens else None)
        self._fit_ranges(lay)
        hm = self._heatmap = self._make_heatmap(t, lay)
        self._draw_image(hm, kind)
        self._label_tiles(hm)
        self._describe(hm, kind)
        self.hover_label.setText(" ")
        self.show_content()

    def _show_missing(self, kind: str) -> None:
        """Say why the selected call has no ``kind`` tensor, in the plot's place."""
        ctx = self.context
        if kind == "activation":
            why = f"No activation was recorded for '{ctx.layer}'."
        else:
            why = (f"No gradient reached '{ctx.layer}' (call {ctx.call + 1}): its output does not "
                   "affect the target. Show the activation instead.")
        self._sync_visibility(None)
        self.layout_label.setText(f"<b>{ctx.layer}</b> · {TENSOR_LABELS[kind]} · {ctx.sample_name()}")
        self._show_plot_note(why)

    def _fit_ranges(self, lay: Layout) -> None:
        """The channel, k and time controls' ranges for this layout, without signals."""
        if lay.has_channels:
            top = lay.channels - 1
            for w in (self.channel_slider, self.channel_spin):
                w.blockSignals(True)
                w.setRange(0, top)
                w.blockSignals(False)
            self.k_spin.blockSignals(True)
            self.k_spin.setMaximum(max(1, lay.channels))
            self.k_spin.blockSignals(False)
        if lay.source == "video":
            self.time_spin.blockSignals(True)
            self.time_spin.setRange(0, lay.time_steps - 1)
            self.time_spin.blockSignals(False)

    def _make_heatmap(self, t: torch.Tensor, lay: Layout) -> Heatmap:
        """The picture the controls ask for (top-k channels ranked by the gradient when there is one)."""
        ctx = self.context
        display = self.display_combo.currentData()
        time_index = None if (lay.source != "video" or self.time_mean.isChecked()) else self.time_spin.value()
        rank_by = ctx.sample_tensor("grad_output") if display == "topk" else None
        if rank_by is None:
            rank_by = t
        k = min(self.k_spin.value(), max(lay.channels, 1))
        self._grid = self._fitting_columns(k, lay) if display == "topk" else None
        return heatmap(t, display, channel=min(max(self.state.channel, 0), max(lay.channels - 1, 0)),
                       k=self.k_spin.value(), reduce=self.state.reduction, rank_by=rank_by, time_index=time_index,
                       input_shape=ctx.input_shape, columns=self._grid)

    def _draw_image(self, hm: Heatmap, kind: str) -> None:
        """The picture on its colour scale, framed, with a text's tokens naming its rows."""
        reduce = self.state.reduction
        magnitude = hm.display == "reduce" and reduce in ("mean_abs", "l2")
        if magnitude:
            signed = False
        elif kind in ("grad_output", "grad_x_activation"):
            signed = True  # gradients are signed by nature, even when one map happens not to be
        else:
            signed = is_signed(hm.array)
        self._signed = signed
        lo, hi = symmetric_levels(hm.array, signed=signed)
        self.image.setImage(hm.array, autoLevels=False, levels=(lo, hi))
        self.colorbar.set_range(lo, hi, signed=signed)
        self.colorbar.set_title(scale_title(kind, hm.display, reduce))
        rows, cols = hm.array.shape
        # Square cells for pictures; a tokens × channels matrix fills the plot instead (a 7×16
        # sequence drawn with square cells is a thin strip between empty margins).
        self.plot.setAspectLocked(hm.layout.kind != "matrix")
        self.plot.setRange(xRange=(0, cols), yRange=(0, rows), padding=0.02)
        # A batch of texts: each row is a token, named by its string.
        words = self.context.tokens() if hm.layout.kind == "matrix" else None
        self._tokens = words if words is not None and len(words) == rows else None
        left = self.plot.getAxis("left")
        if self._tokens is not None:
            step = max(1, int(np.ceil(rows / 30)))
            left.setTicks([[(r + 0.5, self._tokens[r][:12]) for r in range(0, rows, step)]])
        else:
            left.setTicks(None)

    def _describe(self, hm: Heatmap, kind: str) -> None:
        """The line above the plot: layer, call, tensor, sample, what is shown, and the layout."""
        ctx = self.context
        what = TENSOR_LABELS[kind]
        detail = {"channel": f"channel {hm.channels[0] if hm.channels else ''}",
                  "topk": f"top {len(hm.channels)} channels by gradient norm: {', '.join(map(str, hm.channels[:12]))}"
                          + ("…" if len(hm.channels) > 12 else ""),
                  "reduce": f"{dict(_REDUCTIONS)[self.state.reduction]} over channels",
                  "all": "whole tensor"}[hm.display]
        _cap, rec, call_record = ctx.selected()
        n_calls = len(rec.calls)
        call = f" · call {ctx.call + 1} of {n_calls}" if n_calls > 1 else ""
        self.layout_label.setText(
            f"<b>{ctx.layer}</b>{call} · {what} · {ctx.sample_name()} · {detail}<br>"
            f"<span style='color:gray'>{describe_layout(call_record.shape, input_shape=ctx.input_shape)}</span>"
        )

    def _label_tiles(self, hm: Heatmap) -> None:
        for item in self.tile_labels:
            self.plot.removeItem(item)
        self.tile_labels = []
        if hm.display != "topk":
            return
        font = QFont(self.plot_widget.font())
        font.setPointSizeF(TILE_LABEL_POINTS)
        self._tile_size = (hm.tile_width, hm.tile_height)
        for i, channel in enumerate(hm.channels):
            tr, tc = divmod(i, hm.tile_cols)
            item = pg.TextItem(f"ch {channel}", color=TILE_LABEL_COLOUR, fill=TILE_LABEL_FILL, anchor=(0, 0))
            item.setFont(font)
            item.textItem.document().setDocumentMargin(1)  # the fill hugs the text
            item.setPos(tc * (hm.tile_width + 1), tr * (hm.tile_height + 1))
            self.plot.addItem(item)
            self.tile_labels.append(item)
        self._show_labels_that_fit()

    def _fitting_columns(self, k: int, lay: Layout) -> int:
        """The top-k grid's width that fills the plot's present shape (tiles had used ~40%
        of a wide plot's width)."""
        vb = self.plot.vb
        aspect = vb.width() / vb.height() if vb.height() > 0 else 0.0
        return grid_columns(k, (lay.height, lay.width), aspect)

    def _refit_grid(self) -> None:
        # The plot changed shape: another grid may fill it better (redrawn once it changes).
        hm = self._heatmap
        if hm is None or hm.display != "topk" or self._grid is None:
            return
        if self._fitting_columns(len(hm.channels), hm.layout) != self._grid:
            self._dirty = True
            if self.isVisible():
                self.ensure_drawn()

    def tile_pixels(self) -> tuple[float, float] | None:
        """A top-k tile's width and height on screen, in pixels (None: not laid out yet)."""
        try:
            sx, sy = self.plot.vb.viewPixelSize()
        except Exception:  # noqa: BLE001 - pyqtgraph raises when the view has no size yet
            return None
        if not (sx > 0 and sy > 0 and math.isfinite(sx) and math.isfinite(sy)):
            return None
        return self._tile_size[0] / sx, self._tile_size[1] / sy

    def _show_labels_that_fit(self, *_: object) -> None:
        """Label a tile only where the label leaves most of it in sight."""
        tile = self.tile_pixels()
        for item in self.tile_labels:
            size = item.textItem.boundingRect()  # pixels: a TextItem keeps its size at every zoom
            fits = tile is None or (size.width() * TILE_LABEL_ROOM[0] <= tile[0]
                                    and size.height() * TILE_LABEL_ROOM[1] <= tile[1])
            if fits != item.isVisible():
                item.setVisible(fits)
                if fits:
                    item.updateTransform(force=True)  # pyqtgraph skips hidden items' transforms

    def tile_label_texts(self) -> list[str]:
        """The labels shown over the tiles, in tile order (for tests)."""
        self.ensure_drawn()
        return [item.toPlainText() for item in self.tile_labels if item.isVisible()]

    # -- widgets -> state -----------------------------------------------------------------
    def _on_controls_changed(self, *_: object) -> None:
        self._redraw()

    def _on_tensor_combo_changed(self, _index: int) -> None:
        self.state.tensor = self.tensor_combo.currentData()

    def _on_reduce_combo_changed(self, _index: int) -> None:
        self.state.reduction = self.reduce_combo.currentData()

    def _on_channel_slider_changed(self, value: int) -> None:
        self.state.channel = value

    def _on_channel_spin_changed(self, value: int) -> None:
        self.state.channel = value

    # -- state -> widgets (signals blocked, never writes back) --------------------------------
    def _on_model_tensor_changed(self, kind: str) -> None:
        i = self.tensor_combo.findData(kind)
        if i >= 0:
            with QSignalBlocker(self.tensor_combo):
                self.tensor_combo.setCurrentIndex(i)
        self._redraw_unless_applying()

    def _on_model_reduction_changed(self, reduction: str) -> None:
        with QSignalBlocker(self.reduce_combo):
            self.reduce_combo.setCurrentIndex(self.reduce_combo.findData(reduction))
        self._redraw_unless_applying()

    def _on_model_channel_changed(self, channel: int) -> None:
        for w in (self.channel_spin, self.channel_slider):
            with QSignalBlocker(w):
                # A channel beyond this layer's range is kept in the state for the next
                # layer; the controls show the last channel here.
                w.setMaximum(max(w.maximum(), channel))
                w.setValue(channel)
        self._redraw_unless_applying()

    def _redraw_unless_applying(self) -> None:
        if not self._applying:
            self.set_context(self.context)  # redraw now if visible, else when shown

    def hover_text(self, row: int, col: int) -> str:
        """What the hover label says for pixel ``(row, col)`` of the shown array."""
        hm = self._heatmap
        if hm is None:
            return " "
        where = hm.locate(row, col)
        if where is None:
            return " "
        channel, r, c, flat = where
        value = float(hm.array[row, col])
        if flat is not None:
            return f"index {flat}: {_fmt(value)}"
        lay = hm.layout
        if lay.kind == "matrix":
            tokens = self._tokens
            word = f" {tokens[r]!r}" if tokens is not None and 0 <= r < len(tokens) else ""
            return f"token {r}{word}, channel {c}: {_fmt(value)}"
        ch = f" channel {channel}" if channel is not None else ""
        return f"({r}, {c}){ch}: {_fmt(value)}"

    def _on_mouse_moved(self, pos: QPointF) -> None:
        if self._heatmap is None or not self.plot.vb.sceneBoundingRect().contains(pos):
            return
        p = self.image.mapFromScene(pos)
        row, col = int(math.floor(p.y())), int(math.floor(p.x()))
        self.hover_label.setText(self.hover_text(row, col))
