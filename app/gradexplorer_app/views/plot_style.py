"""The one plot theme: how every view's plots look.

Light plots on the light window (chosen once, here): white background, dark grey axes,
ticks and titles, so no axis title is ever dark on dark. Colour maps, image plots, the
colour bar that states its scale (:class:`ScaleBar`), log-scale and integer axes, the
colours of flags. Views never pick a colour of their own for axes or text.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QFontMetrics

from gradexplorer.model_graph.render import constant_label
from gradexplorer_app.views.label_fit import elide_name

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
    # A layer that never ran during forward (its parent used its weights directly): not a flag,
    # a fact, drawn pale so that it does not read as a gradient that was lost.
    "not called": "#cfd4dc",
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
        constant = None if self._log10 else constant_label(lo, hi)
        if constant is not None:
            # One value: the image's levels around it, so that it takes the map's middle colour
            # (levels of one value would paint it the lowest), and the bar says it once.
            v = (lo + hi) / 2
            span = abs(v) or 1.0
            self.setLevels((v - span, v + span))
            self.axis.setTicks([[(v, constant)], []])
            return
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
    """A layer axis: whole layer names, as many as fit at the present zoom, never overlapping.

    Labels are chosen from the visible range each time the view changes, so zooming in
    names every bar (as TensorBoard's scalars do). Each name takes its own room along the
    axis (its width side by side, a text line stacked), not the widest name's: the short
    names of a deep model are not spaced as far apart as its longest one.

    ``upright=True`` (a bottom axis) may also draw the names upright, reading upwards and
    ending at the axis, where that names more bars: each takes one text line along the
    axis, so a chart of hundreds of bars names one every line or so. The band under the
    plot is as tall as the longest name, at most :meth:`set_band_limit`; upright, a name
    longer than the band is cut in its middle, keeping its distinguishing tail
    (``enc…layer_11.mlp.0``; ``label_fit.elide_name``), and shown whole where the zoom gives
    it room side by side.
    """

    #: The room between two labels along the axis, in pixels: side by side, and stacked or upright.
    GAP = 6
    LINE_GAP = 3
    #: The spacing that ``tickValues`` gives the labelled level (the other level: unlabelled bars).
    LABELLED = -1.0

    def __init__(self, *args: Any, offset: float = 0.0, upright: bool = False, **kwargs: Any) -> None:
        """``offset``: where name ``i`` sits is ``i + offset`` (0.5: cell centres of an image)."""
        super().__init__(*args, **kwargs)
        self.names: list[str] = []
        self._widths: list[int] = []
        #: The names as drawn upright (cut to the band), and their lengths.
        self._upright: list[str] = []
        self._upright_widths: list[int] = []
        self._metrics: QFontMetrics | None = None
        self._line = 12
        self._offset = offset
        self._may_stand = upright and self.orientation == "bottom"
        self._band_limit = 160
        self._band = 0
        #: The labelled indices of the last ``tickValues``, and whether they stand upright.
        self._last: tuple[list[int], bool] = ([], False)

    def set_names(self, names: list[str], metrics: QFontMetrics) -> None:
        """The names of the bars or points at 0, 1, 2...; ``metrics``: the font they are drawn in."""
        self.names = list(names)
        self._widths = [metrics.horizontalAdvance(n) for n in self.names]
        self._line = metrics.height()
        self._metrics = metrics
        self._fit_band()

    def set_band_limit(self, pixels: int) -> None:
        """The tallest the band of upright names may be."""
        self._band_limit = max(2 * self._line, int(pixels))
        self._fit_band()

    def band(self) -> int:
        """The height of the band of upright names, in pixels (0 when names never stand)."""
        return self._band

    def _fit_band(self) -> None:
        if self._may_stand:
            self._band = min(max(self._widths, default=0), self._band_limit) if self.names else 0
            metrics = self._metrics
            self._upright = [n if w <= self._band or metrics is None else elide_name(n, metrics, self._band)
                             for n, w in zip(self.names, self._widths)]
            self._upright_widths = [min(w, self._band) for w in self._widths]
            ticks = max(0, self.style["tickLength"]) + self.style["tickTextOffset"][1]
            self.setHeight(max(self._band, self._line) + ticks + 4 if self.names else None)
        self.picture = None
        self.update()

    def labelled(self, minVal: float, maxVal: float, size: float) -> list[int]:
        """The indices of the names labelled when ``minVal``..``maxVal`` spans ``size`` pixels:
        whole names inside the axis, never overlapping (upright or side by side, whichever
        names more)."""
        return self._choose(minVal, maxVal, size)[0]

    def labelled_now(self) -> list[int]:
        """The indices labelled at the axis's present range and length, as it draws them."""
        # pyqtgraph measures the axis from 1 px before its start to 1 px past its end.
        length = (self.width() if self.orientation in ("bottom", "top") else self.height()) + 2
        return self.labelled(self.range[0], self.range[1], length)

    def labels_stand(self) -> bool:
        """Whether the names last drawn stand upright."""
        return self._last[1]

    def _choose(self, minVal: float, maxVal: float, size: float) -> tuple[list[int], bool]:
        stacked = self.orientation in ("left", "right")
        flat = self._pack(minVal, maxVal, size, across=stacked)
        if not self._may_stand:
            return flat, False
        standing = self._pack(minVal, maxVal, size, across=True)
        return (standing, True) if len(standing) > len(flat) else (flat, False)

    def _pack(self, minVal: float, maxVal: float, size: float, across: bool) -> list[int]:
        """Pack labels along the axis, each taking its own width (``across``: one text line).
        The names at multiples of a step go first (so that panning keeps them in place);
        the gaps left are filled greedily, the label that ends first first."""
        n = len(self.names)
        minVal, maxVal = min(minVal, maxVal), max(minVal, maxVal)  # an inverted axis gives them reversed
        if n == 0 or maxVal <= minVal or size <= 0:
            return []
        off = self._offset
        first, last = max(0, math.ceil(minVal - off)), min(n - 1, math.floor(maxVal - off))
        if last < first:
            return []
        px_per_bar = size / (maxVal - minVal)
        spans = {}
        for i in range(first, last + 1):
            c = (i + off - minVal) * px_per_bar
            half = (self._line if across else self._widths[i]) / 2
            if c - half >= 0 and c + half <= size:
                spans[i] = (c - half, c + half)
        if not spans:
            return []
        gap = self.LINE_GAP if across else self.GAP
        step = max(1, math.ceil((min(r - left for left, r in spans.values()) + gap) / px_per_bar))
        taken: list[tuple[float, float]] = []  # sorted by left edge

        def take(i: int) -> bool:
            left, right = spans[i]
            k = bisect.bisect(taken, (left, right))
            if k > 0 and taken[k - 1][1] + gap > left:
                return False
            if k < len(taken) and right + gap > taken[k][0]:
                return False
            taken.insert(k, (left, right))
            return True

        chosen = [i for i in spans if i % step == 0 and take(i)]
        chosen += [i for i in sorted(spans, key=lambda i: spans[i][1]) if i % step and take(i)]
        return sorted(chosen)

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, list[float]]]:  # pyqtgraph's
        self._last = self._choose(minVal, maxVal, size)
        labelled = self._last[0]
        if not labelled:
            return []
        n, off = len(self.names), self._offset
        lo, hi = min(minVal, maxVal), max(minVal, maxVal)
        first, last = max(0, math.ceil(lo - off)), min(n - 1, math.floor(hi - off))
        major = [i + off for i in labelled]
        named = set(labelled)
        minor = [i + off for i in range(first, last + 1) if i not in named] if size / (hi - lo) >= 3 else []
        return [(self.LABELLED, major), (1.0, minor)] if minor else [(self.LABELLED, major)]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        if spacing != self.LABELLED or self._last[1]:
            return [""] * len(values)  # unlabelled bars; upright names are drawn by drawPicture
        index = [int(round(v - self._offset)) for v in values]
        return [self.names[i] if 0 <= i < len(self.names) else "" for i in index]

    def generateDrawSpecs(self, p: Any) -> Any:  # pyqtgraph's
        specs = super().generateDrawSpecs(p)
        if specs is None:
            return specs
        axis_spec, tick_specs, text_specs = specs
        if self._last[1] and self.style["showValues"]:
            bounds = self.mapRectFromParent(self.geometry())
            lo, hi = self.range[0], self.range[1]
            scale = bounds.width() / (hi - lo) if hi != lo else 1.0
            top = bounds.top() + max(0, self.style["tickLength"]) + self.style["tickTextOffset"][1]
            text_specs = []
            for i in self._last[0]:
                x = (i + self._offset - lo) * scale  # pyqtgraph's mapping of a tick
                rect = QRectF(x - self._line / 2, top, self._line, self._upright_widths[i])
                if bounds.left() <= rect.left() and rect.right() <= bounds.right():
                    text_specs.append((rect, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                                       self._upright[i]))
        return axis_spec, tick_specs, text_specs

    def drawPicture(self, p: Any, axisSpec: Any, tickSpecs: Any, textSpecs: Any) -> None:  # pyqtgraph's
        if not self._last[1]:
            super().drawPicture(p, axisSpec, tickSpecs, textSpecs)
            return
        super().drawPicture(p, axisSpec, tickSpecs, [])
        for rect, flags, text in textSpecs:
            p.save()
            p.translate(rect.center())
            p.rotate(-90)  # reading upwards, the name ends at the axis
            p.drawText(QRectF(-rect.height() / 2, -rect.width() / 2, rect.height(), rect.width()), int(flags), text)
            p.restore()


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
