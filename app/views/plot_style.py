"""The one plot theme: how every view's plots look.

Light plots on the light window (chosen once, here): white background, dark grey axes,
ticks and titles, so no axis title is ever dark on dark. Colour maps, image plots, the
colour bar that states its scale (:class:`ScaleBar`), log-scale and integer axes, the
colours of flags. Views never pick a colour of their own for axes or text.
"""

from __future__ import annotations

import math
from typing import Any

import pyqtgraph as pg
from PySide6.QtGui import QFontMetrics

#: Signed data (gradients): blue - white - red, symmetric levels around zero.
DIVERGING = "CET-D1"
#: Non-negative data (ReLU activations, magnitudes).
SEQUENTIAL = "viridis"

BACKGROUND = "#ffffff"
FOREGROUND = "#374151"
#: Secondary text and reference lines (ratio 1, zero).
MUTED = "#6b7280"
#: Text size of axis titles and plot titles.
TITLE_SIZE = "10pt"

#: Bar colours of the gradient-flow chart, by flag (first flag wins).
FLAG_COLOURS = {
    "ok": "#4c8bd6",
    "vanishing": "#a970ff",
    "exploding": "#ff5c5c",
    "nan/inf": "#ff2bd6",
    "zero": "#8a8a8a",
    "no gradient": "#555555",
}
SELECTED_COLOUR = "#ff9800"
#: The outline of the selected bar (dark on the light background).
SELECTED_OUTLINE = "#111827"


def colormap(signed: bool) -> pg.ColorMap:
    return pg.colormap.get(DIVERGING if signed else SEQUENTIAL)


def colormap_of(rgb: Any) -> pg.ColorMap:
    """A colour map from an ``(N, 3)`` uint8 table (Grad-CAM's Turbo, from ``core``)."""
    import numpy as np

    table = np.asarray(rgb, dtype=np.uint8).reshape(-1, 3)
    return pg.ColorMap(np.linspace(0.0, 1.0, len(table)), table)


def style_plot_widget(widget: pg.GraphicsView) -> None:
    widget.setBackground(BACKGROUND)


def style_plot(plot: pg.PlotItem) -> pg.PlotItem:
    """Axes, tick labels, axis titles and the plot title in the theme's colours."""
    for name in ("left", "bottom", "right", "top"):
        axis = plot.getAxis(name)
        axis.setPen(FOREGROUND)
        axis.setTextPen(FOREGROUND)
        axis.labelStyle = {"color": FOREGROUND, "font-size": TITLE_SIZE}
        axis._updateLabel()  # pyqtgraph applies labelStyle only when the label is redrawn
    plot.titleLabel.opts["color"] = FOREGROUND
    return plot


def set_axis_title(plot: pg.PlotItem, name: str, text: str | None) -> None:
    """An axis title in the theme's colour (``setLabel`` with no style would keep the
    default foreground)."""
    plot.setLabel(name, text, color=FOREGROUND, **{"font-size": TITLE_SIZE})


def set_title(plot: pg.PlotItem, text: str | None) -> None:
    plot.setTitle(text, color=FOREGROUND, size=TITLE_SIZE)


def scale_number(v: float) -> str:
    """A colour bar's end label: up to 4 significant digits written out from 0.001 to 9999
    ("0.03931", "1650"), else 3 with an exponent ("2.67e+6", "-2.50e-6")."""
    if not math.isfinite(v):
        return str(v)
    if v == 0:
        return "0"
    if 1e-3 <= abs(v) < 1e4:
        text = f"{v:.4g}"
        if "e" not in text:  # 9999.7 rounds to "1e+04": written with the exponent below
            return text
    return f"{v:.2e}".replace("e-0", "e-").replace("e+0", "e+")


class ScaleBar(pg.ColorBarItem):
    """A vertical colour bar that states its scale: the quantity (and unit) as its title,
    tick labels at its minimum and maximum, and at zero when zero lies inside.

    pyqtgraph's own bar picks "nice" ticks, and a symmetric signed bar then shows only
    "0"; here the ends are always labelled with the values the image's colours reach.
    """

    def __init__(self, title: str, signed: bool = True, width: int = 16,
                 cmap: pg.ColorMap | None = None, log10: bool = False, plus_one: bool = False) -> None:
        """``log10``: the image holds log10 of the quantity; the labels read as the
        quantity itself (10^-6.2 reads "6.31e-7"). ``plus_one`` (with ``log10``): it holds
        log10(1 + quantity), as counts that may be 0 are drawn; the labels read as counts."""
        self._log10 = log10
        self._plus_one = plus_one and log10
        super().__init__(values=(-1.0, 1.0) if signed else (0.0, 1.0),
                         colorMap=cmap if cmap is not None else colormap(signed),
                         interactive=False, width=width, pen=FOREGROUND, colorMapMenu=False)
        self._signed = signed
        self._fixed_cmap = cmap is not None
        axis = self.axis
        axis.setPen(FOREGROUND)
        axis.setTextPen(FOREGROUND)
        # The end labels sit at the bar's very ends: pyqtgraph would hide them as overlapping.
        axis.setStyle(hideOverlappingLabels=False, tickTextOffset=4)
        axis.setWidth(self.AXIS_WIDTH)
        # The end labels state the values; a "(x1e-06)" added to the title would rescale them.
        axis.enableAutoSIPrefix(False)
        self._title_lines = 1
        axis.geometryChanged.connect(self._fit_title)
        self.set_title(title)
        self.set_range(*self.values)

    #: The width of the bar's axis: its end labels and one line of title.
    AXIS_WIDTH = 78

    def _fit_title(self) -> None:
        """Wrap the title onto more lines when it is longer than the bar is tall (a short
        plot had cut "Grad-CAM, scaled per sample (0 = none, 1 = strongest)"), and widen
        the axis by those lines."""
        label = self.axis.label
        if label is None:
            return
        room = max(40.0, self.axis.height() - 4)
        label.setTextWidth(-1)
        one_line = label.boundingRect()
        if one_line.width() > room:
            label.setTextWidth(room)
        lines = max(1, round(label.boundingRect().height() / max(1.0, one_line.height())))
        if lines != self._title_lines:
            self._title_lines = lines
            self.axis.setWidth(self.AXIS_WIDTH + int((lines - 1) * one_line.height() * 0.8))
        self.axis.resizeEvent()  # the label placed for its new size

    def set_title(self, title: str) -> None:
        """What the colours measure, with its unit ("gradient ∂L/∂y", "log10 |grad|")."""
        self._title = title
        self.axis.setLabel(title, color=FOREGROUND, **{"font-size": "9pt"})
        self._fit_title()

    def title(self) -> str:
        return self._title

    def set_range(self, lo: float, hi: float, signed: bool | None = None) -> None:
        """The levels of the image(s) the bar colours, and its tick labels; ``signed``
        switches between the diverging and the sequential colour map."""
        if signed is not None and signed != self._signed and not self._fixed_cmap:
            self._signed = signed
            self.setColorMap(colormap(signed))
        lo, hi = float(lo), float(hi)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            lo, hi = 0.0, 1.0
        self.setLevels((lo, hi))
        def label(v: float) -> str:
            if not self._log10:
                return scale_number(v)
            x = 10.0 ** v - (1.0 if self._plus_one else 0.0)
            return scale_number(round(x) if self._plus_one else x)

        ticks = [(lo, label(lo))]
        if lo < 0 < hi and not self._log10:
            ticks.append((0.0, "0"))
        if hi != lo:
            ticks.append((hi, label(hi)))
        self.axis.setTicks([ticks, []])

    def tick_labels(self) -> list[str]:
        """The labels on the bar, bottom to top."""
        return [label for _v, label in (self.axis._tickLevels or [[]])[0]]


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
    style_plot(plot)
    if title:
        set_title(plot, title)
    image = pg.ImageItem(axisOrder="row-major")
    plot.addItem(image)
    return plot, image


class IntegerAxis(pg.AxisItem):
    """An axis of counts (steps, batches): ticks only at whole numbers, never "2.5"."""

    def tickSpacing(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, float]]:  # pyqtgraph's names
        whole = [(spacing, offset) for spacing, offset in super().tickSpacing(minVal, maxVal, size)
                 if spacing >= 1 and float(spacing).is_integer()]
        return whole or [(1.0, 0.0)]


class LayerAxis(pg.AxisItem):
    """The flow chart's layer axis: whole layer names, as many as fit at the present zoom.

    Labels are chosen from the visible range each time the view changes, so zooming in
    names every bar (as TensorBoard's scalars do) and no label is ever cut or overlaps.
    """

    def __init__(self, *args: Any, offset: float = 0.0, **kwargs: Any) -> None:
        """``offset``: where name ``i`` sits is ``i + offset`` (0.5: cell centres of an image)."""
        super().__init__(*args, **kwargs)
        self.names: list[str] = []
        self._widths: list[int] = []
        self._line = 12
        self._step = 1.0
        self._offset = offset

    def set_names(self, names: list[str], metrics: QFontMetrics) -> None:
        """The names of the bars or points at 0, 1, 2...; ``metrics``: the font they are drawn in."""
        self.names = list(names)
        self._widths = [metrics.horizontalAdvance(n) for n in self.names]
        self._line = metrics.height()
        self.picture = None
        self.update()

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, list[float]]]:  # pyqtgraph's
        n = len(self.names)
        minVal, maxVal = min(minVal, maxVal), max(minVal, maxVal)  # an inverted axis gives them reversed
        if n == 0 or maxVal <= minVal or size <= 0:
            return []
        off = self._offset
        first, last = max(0, math.ceil(minVal - off)), min(n - 1, math.floor(maxVal - off))
        if last < first:
            return []
        px_per_bar = size / (maxVal - minVal)
        # Names side by side need their width; stacked (a vertical axis), their height.
        need = max(self._widths[first:last + 1]) + 14 if self.orientation in ("bottom", "top") else self._line + 2
        step = max(1, math.ceil(need / px_per_bar))
        self._step = float(step)
        major = [i + off for i in range(first - first % step, last + 1, step) if i >= first]
        minor = [i + off for i in range(first, last + 1)] if step > 1 and px_per_bar >= 3 else []
        return [(float(step), major), (1.0, minor)] if minor else [(float(step), major)]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        if spacing != self._step:
            return [""] * len(values)  # the unlabelled ticks between labelled bars
        index = [int(round(v - self._offset)) for v in values]
        return [self.names[i] if 0 <= i < len(self.names) else "" for i in index]


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
