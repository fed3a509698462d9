"""Input-gradient saliency: |d target / d input|, max over channels, next to the input;
for a sequence input, a bar per token (``gradexplorer.analysis.saliency``)."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
import torch
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from gradexplorer.analysis.heatmaps import display_image, saliency_map, symmetric_levels
from gradexplorer.analysis.saliency import is_sequence_input, token_saliency
from gradexplorer.capturing.data import Capture
from gradexplorer_app.views.plot_style import ScaleBar, image_plot, set_axis_title, style_plot, style_plot_widget
from gradexplorer_app.views.view_context import STATS_ONLY_NOTE, CaptureView


class SaliencyView(CaptureView):
    """The selected sample's input picture and its input-gradient saliency map, or for a
    sequence input the saliency of each token as a bar chart."""

    title = "Saliency"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._map: np.ndarray | None = None
        self._tick_texts: list[str] = []
        content = QWidget(self)
        self.info_label = QLabel()
        self.info_label.setWordWrap(True)
        self.plot_widget = pg.GraphicsLayoutWidget()
        style_plot_widget(self.plot_widget)
        self.input_plot, self.input_image = image_plot(self.plot_widget.ci, 0, 0, title="input")
        self.map_plot, self.map_image = image_plot(
            self.plot_widget.ci, 0, 1, title="|input gradient|, max over channels")
        for plot in (self.input_plot, self.map_plot):
            plot.hideAxis("left")
            plot.hideAxis("bottom")
        self.map_plot.setXLink(self.input_plot)
        self.map_plot.setYLink(self.input_plot)
        self.colorbar = ScaleBar("|∂L/∂x|, max over channels (loss per unit of input)", signed=False)
        self.colorbar.setImageItem(self.map_image, insert_in=self.map_plot)
        self.token_widget = pg.PlotWidget()
        style_plot_widget(self.token_widget)
        self.token_plot = style_plot(self.token_widget.getPlotItem())
        set_axis_title(self.token_plot, "bottom", "token")
        set_axis_title(self.token_plot, "left", "saliency (L2 norm of the gradient)")
        self.token_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush="#3b82c4", pen=None)
        self.token_plot.addItem(self.token_bars)
        self.token_widget.hide()
        v = QVBoxLayout(content)
        v.setContentsMargins(4, 4, 4, 4)
        v.addWidget(self.info_label)
        v.addWidget(self.plot_widget, 1)
        v.addWidget(self.token_widget, 1)
        self.set_content(content)

    def current_map(self) -> np.ndarray | None:
        self.ensure_drawn()
        return self._map

    def export_widget(self) -> QWidget:
        return self.token_widget if self.token_widget.isVisibleTo(self) else self.plot_widget

    def plot_widgets(self) -> list[QWidget]:
        return [self.plot_widget, self.token_widget]

    def refresh(self) -> None:
        self._map = None
        ctx = self.context
        cap = ctx.capture
        if cap is None:
            self.show_message("No capture yet: choose a model and a batch, then Run (Ctrl+R).")
            return
        shape = ctx.input_shape
        if shape is not None and is_sequence_input(shape):
            self._show_tokens(cap, shape)
            return
        self.token_widget.hide()
        self.plot_widget.show()
        if cap.input_grad is None:
            if ctx.stats_only:
                self.show_message(STATS_ONLY_NOTE.format(what="the input-gradient saliency map"))
            else:
                self.show_message("No input gradient in this capture: enable \"input gradient\" "
                                  "in the run options and run again to see which input values the target "
                                  "is most sensitive to.")
            return
        g = cap.input_grad
        s = min(max(ctx.sample, 0), g.shape[0] - 1) if g.dim() else 0
        sal = saliency_map(g[s] if g.dim() else g)
        self._map = sal
        lo, hi = symmetric_levels(sal, signed=False)
        self.map_image.setImage(sal, autoLevels=False, levels=(lo, hi))
        self.colorbar.set_range(lo, hi)
        picture = None
        if cap.input is not None and cap.input.dim() == g.dim():
            picture = display_image(cap.input[s])
        if picture is not None and picture.shape[:2] == sal.shape:
            self.input_image.setImage(picture, autoLevels=False, levels=(0, 255))
            self.input_plot.setVisible(True)
        else:
            self.input_image.clear()
            self.input_plot.setVisible(False)
        h, w = sal.shape
        self.map_plot.setRange(xRange=(0, w), yRange=(0, h), padding=0.02)
        self.info_label.setText(
            f"Input-gradient saliency of {ctx.sample_name()} for target <i>{cap.meta.get('target', '')}</i> · "
            f"input shape ({', '.join(map(str, g.shape))}) · brighter = the target changes more when that "
            f"input value changes"
        )
        self.show_content()

    def _show_tokens(self, cap: Capture, input_shape: tuple[int, ...]) -> None:
        ctx = self.context
        if ctx.stats_only:
            self.show_message(STATS_ONLY_NOTE.format(what="the saliency of each token"))
            return
        sal = token_saliency(cap, ctx.sample)
        x = cap.input
        if sal is None and isinstance(x, torch.Tensor) and x.dim() == 2 and x.is_floating_point():
            self.show_message("No input gradient in this capture: enable \"input gradient\" in the run options "
                              "and run again to see how much the target depends on each input feature.")
            return
        if sal is None:
            self.show_message("No gradient reached the tokens of this sequence input: capture the first "
                              "layer (the embedding) or enable \"input gradient\" and run again.")
            return
        self._map = sal.values[None, :]
        n = len(sal.values)
        self.token_bars.setOpts(x=np.arange(n), height=sal.values, width=0.8)
        # One bar per token or feature: whole-number ticks only (0.5 steps read as positions);
        # the token strings themselves for a batch of texts.
        tokens = ctx.tokens() if sal.unit == "token" else None
        if tokens is not None and len(tokens) != n:
            tokens = None
        step = max(1, int(np.ceil(n / (40 if tokens else 20))))
        ticks = [(i, _tick(tokens[i]) if tokens else str(i)) for i in range(0, n, step)]
        self.token_plot.getAxis("bottom").setTicks([ticks])
        self._tick_texts = [t for _, t in ticks]
        set_axis_title(self.token_plot, "bottom", sal.unit)
        set_axis_title(self.token_plot, "left", "saliency (L2 norm of the gradient)" if sal.unit == "token"
                       else "saliency (|gradient|)")
        top = float(np.nanmax(sal.values)) if n and np.isfinite(sal.values).any() else 1.0
        self.token_plot.setRange(xRange=(-0.5, n - 0.5), yRange=(0, top if top > 0 else 1.0), padding=0.02)
        self.plot_widget.hide()
        self.token_widget.show()
        strongest = int(np.nanargmax(sal.values)) if n and np.isfinite(sal.values).any() else None
        peak = f" · largest at {sal.unit} {strongest}" if strongest is not None else ""
        if strongest is not None and tokens:
            peak += f" ({tokens[strongest]!r})"
        predicted = cap.meta.get("predicted_tokens")
        if isinstance(predicted, list) and 0 <= ctx.sample < len(predicted):
            peak += f" · predicts {predicted[ctx.sample]!r} next"
        self.info_label.setText(
            f"Saliency of each {sal.unit} of {ctx.sample_name()} for target <i>{cap.meta.get('target', '')}</i>"
            f" · input shape ({', '.join(map(str, input_shape))}) · {sal.source}{peak}"
        )
        self.show_content()


def _tick(token: str, n: int = 10) -> str:
    """A token as a tick label: short, its spaces visible."""
    text = token.replace(" ", "·") if token.strip() != token else token
    return text if len(text) <= n else text[: n - 1] + "…"
