"""Labels whose text changes never set a window's minimum width.

A ``QLabel`` that neither wraps nor elides asks for the width of its longest line, and a
layer's description or a graph's status line is as long as the model makes it: one such
label made the window wider than the screen. Every label whose text comes from data goes
through one of the two functions here, or is an :class:`ElidedLabel`.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

#: What a label that fits asks for at least: room for a few words.
MIN_WIDTH = 60


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
