"""Labels whose text changes never set a window's minimum width.

A ``QLabel`` that neither wraps nor elides asks for the width of its longest line, and a
layer's description or a graph's status line is as long as the model makes it: one such
label made the window wider than the screen. Every label whose text comes from data goes
through one of the two functions here, or is an :class:`ElidedLabel`.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFontMetrics, QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

#: What a label that fits asks for at least: room for a few words.
MIN_WIDTH = 60


def elide_name(name: str, metrics: QFontMetrics, width: int) -> str:
    """``name`` cut to ``width`` pixels keeping its distinguishing tail: the qualified name
    ``encoder.layers.encoder_layer_11.mlp.0`` becomes ``enc…layer_11.mlp.0``, not
    ``encoder.layers.enc…`` (which two dozen layers share). In a room of 16 characters or more a few characters of its
    start stay (a quarter of the room at most); the tail takes the rest."""
    if metrics.horizontalAdvance(name) <= width:
        return name
    ellipsis = "…"
    room = width - metrics.horizontalAdvance(ellipsis)
    if room <= 0:
        return ellipsis if width >= metrics.horizontalAdvance(ellipsis) else ""
    head = ""
    # A few characters of the start where there is room for them (a quarter of it at most);
    # in a short room the tail takes it all ("…1.0.conv1", not "la…0.conv1").
    for ch in name if room >= 16 * metrics.averageCharWidth() else "":
        if metrics.horizontalAdvance(head + ch) > room / 4:
            break
        head += ch
    left = room - metrics.horizontalAdvance(head)
    tail = ""
    for ch in reversed(name[len(head):]):
        if metrics.horizontalAdvance(ch + tail) > left:
            break
        tail = ch + tail
    return f"{head}{ellipsis}{tail}"


def wrap_label(label: QLabel) -> QLabel:
    """Let ``label`` wrap at word boundaries and take any width its layout gives it.

    Its height follows its width (``heightForWidth``), so a long text grows down, not
    sideways. Returns the label.
    """
    label.setWordWrap(True)
    label.setMinimumWidth(MIN_WIDTH)
    policy = label.sizePolicy()
    policy.setHorizontalPolicy(QSizePolicy.Policy.Ignored)
    policy.setHeightForWidth(True)
    label.setSizePolicy(policy)
    return label


class ElidedLabel(QLabel):
    """One line of plain text, cut with "…" where it would not fit; the whole text is its
    tooltip. For status lines, whose height must not change."""

    def __init__(self, text: str = "", parent: QWidget | None = None,
                 mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight) -> None:
        super().__init__(parent)
        self._full = ""
        self._mode = mode
        # Preferred: its whole text when there is room; minimumSizeHint lets it shrink.
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setMinimumWidth(MIN_WIDTH)
        self.setText(text)

    def setText(self, text: str) -> None:  # Qt's name
        self._full = text
        self.setToolTip(text if self.fontMetrics().horizontalAdvance(text) > self.width() else "")
        super().setText(text)
        self.update()

    def full_text(self) -> str:
        """The text before eliding."""
        return self._full

    def shown_text(self) -> str:
        """The text as drawn at the present width."""
        return self.fontMetrics().elidedText(self._full, self._mode, max(0, self.contentsRect().width()))

    def minimumSizeHint(self) -> QSize:
        return QSize(MIN_WIDTH, super().minimumSizeHint().height())

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        return QSize(min(hint.width(), 480), hint.height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.setToolTip(self._full if self.shown_text() != self._full else "")

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setPen(self.palette().windowText().color())
        painter.drawText(self.contentsRect(), int(self.alignment() | Qt.AlignmentFlag.AlignVCenter),
                         self.shown_text())
        painter.end()
