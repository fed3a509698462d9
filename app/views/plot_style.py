"""How the views' plots look: colour maps, image plots, a log-scale axis, colours of flags."""

from __future__ import annotations

import math
from typing import Any

import pyqtgraph as pg

#: Signed data (gradients): blue - white - red, symmetric levels around zero.
DIVERGING = "CET-D1"
#: Non-negative data (ReLU activations, magnitudes).
SEQUENTIAL = "viridis"

BACKGROUND = "#1e1f22"
FOREGROUND = "#d0d0d0"

#: Bar colours of the gradient-flow chart, by flag (first flag wins).
FLAG_COLOURS = {
    "ok": "#4c8bd6",
    "vanishing": "#a970ff",
    "exploding": "#ff5c5c",
    "nan/inf": "#ff2bd6",
    "zero": "#8a8a8a",
    "no gradient": "#555555",
}
SELECTED_COLOUR = "#ffb000"


def colormap(signed: bool) -> pg.ColorMap:
    return pg.colormap.get(DIVERGING if signed else SEQUENTIAL)


def style_plot_widget(widget: pg.GraphicsView) -> None:
    widget.setBackground(BACKGROUND)


def image_plot(layout: pg.GraphicsLayout, row: int = 0, col: int = 0,
               title: str | None = None) -> tuple[pg.PlotItem, pg.ImageItem]:
    """A plot for pictures in ``layout``: row 0 at the top, square pixels.

    Returns
    -------
    (pg.PlotItem, pg.ImageItem)
    """
    plot = layout.addPlot(row=row, col=col, title=title)
    plot.invertY(True)
    plot.setAspectLocked(True)
    plot.setMenuEnabled(False)
    plot.hideButtons()
    for name in ("left", "bottom"):
        axis = plot.getAxis(name)
        axis.setTextPen(FOREGROUND)
        axis.setPen(FOREGROUND)
    image = pg.ImageItem(axisOrder="row-major")
    plot.addItem(image)
    return plot, image


class IntegerAxis(pg.AxisItem):
    """An axis of counts (steps, batches): ticks only at whole numbers, never "2.5"."""

    def tickSpacing(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, float]]:  # pyqtgraph's names
        whole = [(spacing, offset) for spacing, offset in super().tickSpacing(minVal, maxVal, size)
                 if spacing >= 1 and float(spacing).is_integer()]
        return whole or [(1.0, 0.0)]


class Log10Axis(pg.AxisItem):
    """An axis for data already in log10: ticks read as the original values.

    ``log_labels = False`` makes it an ordinary axis (for plots that toggle log scale).
    """

    log_labels = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # An SI prefix would rescale the exponents themselves ("x0.001").
        self.enableAutoSIPrefix(False)

    def set_log_labels(self, on: bool) -> None:
        self.log_labels = on
        self.picture = None
        self.update()

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        if not self.log_labels:
            return super().tickStrings(values, scale, spacing)
        out = []
        for v in values:
            try:
                x = 10.0 ** float(v)
            except OverflowError:
                x = math.inf
            out.append(f"{x:.0e}".replace("e-0", "e-").replace("e+0", "e").replace("e+", "e"))
        return out
