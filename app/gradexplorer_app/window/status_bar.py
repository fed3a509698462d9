"""The main window's status bar: a message longer than the room left beside the permanent
widgets ends in "…" instead of being cut mid-word, and the whole of it is the bar's tooltip.

QStatusBar clips a message at the first permanent widget: at 960 pixels "layer2 is not
recorded itself: showing its last captured call, layer2.1.relu (call 2 of 2). To" lost the
sentence that says what to do. Elided here, re-elided when the bar is resized, and kept
whole where the mouse can read it.
"""

from __future__ import annotations

import time

from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent, QShowEvent
from PySide6.QtWidgets import QStatusBar, QWidget

# QStatusBar's own margins around the message (its left indent and the gap before the
# first permanent widget), and a little more so the ellipsis never touches the widget.
_MARGINS = 24


class ElidingStatusBar(QStatusBar):
    """``showMessage`` elides to the width left; ``full_message`` is what was asked for."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.full_message = ""
        self._until: float | None = None  # when a timed message goes (monotonic seconds)
        self.messageChanged.connect(self._message_changed)

    def room(self) -> int:
        """Pixels the message may take: the bar less its visible permanent widgets."""
        layout = self.layout()
        spacing = layout.spacing() if layout is not None else 0
        taken = sum(int(w.width()) + spacing for w in self.findChildren(QWidget)
                    if w.parent() is self and w.isVisible() and not w.isWindow())
        return max(0, self.width() - taken - _MARGINS)

    def showMessage(self, text: str, timeout: int | None = 0) -> None:
        self.full_message = text
        timeout = timeout or 0
        self._until = time.monotonic() + timeout / 1000 if timeout > 0 else None
        shown = self._elided(text)
        super().showMessage(shown, timeout)
        self.setToolTip(text if shown != text else "")

    def _elided(self, text: str) -> str:
        # A bar not yet laid out has no width to go by: the whole text, elided once shown.
        if not self.isVisible():
            return text
        return self.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight, self.room())

    def _message_changed(self, text: str) -> None:
        if not text:  # cleared, or its time ran out
            self.full_message = ""
            self.setToolTip("")

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._refresh()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self._refresh()

    def _refresh(self) -> None:
        """The message asked for, elided again to the width the bar has now."""
        if not (self.full_message and self.currentMessage()):
            return
        shown = self._elided(self.full_message)
        if shown == self.currentMessage():
            return
        # For the time it had left: a message shown for 8 s still goes after 8 s.
        left = 0 if self._until is None else int((self._until - time.monotonic()) * 1000)
        if self._until is not None and left <= 0:
            return
        QStatusBar.showMessage(self, shown, left)
        self.setToolTip(self.full_message if shown != self.full_message else "")
