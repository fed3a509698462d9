"""A horizontal colour bar for the graph view: the gradient of a ``gradexplorer.model_graph.render.ColorScale``
with a tick and a label at every power of ten, and the exact range at its ends.

The scale (its range, colours and ticks) is computed in ``core``; this widget only draws
it, so the window's bar and the exported SVG's bar agree.
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QLinearGradient, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from gradexplorer.model_graph.render import ColorScale, constant_label, range_labels


class ColorBarWidget(QWidget):
    """Draws one ``ColorScale``; ``set_scale(None)`` leaves it blank."""

    BAR_HEIGHT = 10

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.scale: ColorScale | None = None
        self.font_ = QFont()
        self.font_.setPointSizeF(7.5)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumWidth(160)

    def sizeHint(self) -> QSize:
        return QSize(320, self.BAR_HEIGHT + int(QFontMetricsF(self.font_).height()) + 8)

    def set_scale(self, scale: ColorScale | None) -> None:
        self.scale = scale if scale is not None and scale.lo is not None else None
        self.setToolTip("" if self.scale is None else
                        f"{self.scale.statistic}: {self.scale.lo:.4g} to {self.scale.hi:.4g}, log scale"
                        + (", 1 in the middle" if self.scale.diverging else ""))
        self.update()

    @property
    def lo(self) -> float | None:
        return self.scale.lo if self.scale is not None else None

    @property
    def hi(self) -> float | None:
        return self.scale.hi if self.scale is not None else None

    def constant(self) -> str | None:
        """``"constant 1.0"`` when every value in view is one value, else None."""
        if self.scale is None or self.scale.lo is None or self.scale.hi is None:
            return None
        return constant_label(self.scale.lo, self.scale.hi)

    def tick_labels(self) -> list[str]:
        """The labels drawn under the bar, left to right."""
        if self.scale is None:
            return []
        constant = self.constant()
        return [constant] if constant is not None else [label for _t, _v, label in self.scale.ticks()]

    def bar_rect(self) -> QRectF:
        fm = QFontMetricsF(self.font_)
        # Room at both ends for the end labels, which are drawn beside the bar.
        left = fm.horizontalAdvance(self._end_label(self.lo)) + 6 if self.scale is not None else 0
        right = fm.horizontalAdvance(self._end_label(self.hi)) + 6 if self.scale is not None else 0
        return QRectF(left + 2, 2, max(20.0, self.width() - left - right - 4), self.BAR_HEIGHT)

    def _end_label(self, v: float | None) -> str:
        if v is None or self.scale is None or self.scale.lo is None or self.scale.hi is None:
            return ""
        lo, hi = range_labels(self.scale.lo, self.scale.hi)
        return lo if v == self.scale.lo else hi

    def paintEvent(self, event: QPaintEvent) -> None:
        if self.scale is None:
            return
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setFont(self.font_)
        fm = QFontMetricsF(self.font_)
        constant = self.constant()
        if constant is not None:  # one colour, said in words (no two equal ends)
            painter.setPen(QPen(QColor("#555555"), 0.6))
            colour = self.scale.color(self.scale.lo)
            bar = QRectF(2, 2, max(20.0, fm.horizontalAdvance(constant) * 0.6), self.BAR_HEIGHT)
            painter.setBrush(QColor(colour))
            painter.drawRect(bar)
            painter.setPen(QPen(self.palette().windowText().color(), 1.0))
            painter.drawText(QPointF(bar.right() + 6, bar.center().y() + fm.ascent() / 2 - 1), constant)
            painter.end()
            return
        bar = self.bar_rect()
        gradient = QLinearGradient(bar.topLeft(), bar.topRight())
        for t, color in self.scale.gradient():
            gradient.setColorAt(t, QColor(color))
        painter.setPen(QPen(QColor("#555555"), 0.6))
        painter.setBrush(gradient)
        painter.drawRect(bar)
        text = self.palette().windowText().color()
        painter.setPen(QPen(text, 1.0))
        mid_y = bar.center().y() + fm.ascent() / 2 - 1
        painter.drawText(QPointF(0, mid_y), self._end_label(self.lo))
        hi = self._end_label(self.hi)
        painter.drawText(QPointF(self.width() - fm.horizontalAdvance(hi) - 1, mid_y), hi)
        last_right = -1e9
        for t, _v, label in self.scale.ticks():
            x = bar.left() + t * bar.width()
            painter.drawLine(QPointF(x, bar.top()), QPointF(x, bar.bottom() + 3))
            w = fm.horizontalAdvance(label)
            if x - w / 2 > last_right + 3:  # skip a label that would overlap the previous one
                painter.drawText(QRectF(x - w / 2 - 1, bar.bottom() + 3, w + 2, fm.height()),
                                 Qt.AlignmentFlag.AlignCenter, label)
                last_right = x + w / 2
        painter.end()
