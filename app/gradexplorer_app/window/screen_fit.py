"""Every window opens inside the screen it opens on.

A window asks for a comfortable size (the main window's default, or the geometry it
saved last time; 1400×900 for the compare and timeline windows); on a smaller screen, or
with a geometry saved on another one, that would put its panels out of reach. Each window
passes through :func:`keep_on_screen`: clamped at once, and again once it is shown, when
the window manager's frame (its title bar and borders) is known and counts too.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QWidget

__all__ = ["clamp_to_screen", "keep_on_screen"]


def keep_on_screen(window: QWidget) -> None:
    """Clamp ``window`` to its screen now and once more after it is first shown."""
    clamp_to_screen(window)
    window.installEventFilter(_ClampWhenShown(window))


class _ClampWhenShown(QObject):
    """Clamps its window once, just after the window is first shown (its frame known)."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # Qt's name
        if event.type() == QEvent.Type.Show and isinstance(watched, QWidget):
            watched.removeEventFilter(self)
            # After the show is done: the frame is there, and a move now is not undone.
            QTimer.singleShot(0, watched, lambda: clamp_to_screen(watched))
        return False


def clamp_to_screen(window: QWidget) -> None:
    """Shrink and move ``window`` to lie inside the screen's available area (never below
    the window's own minimum size, which Qt keeps): a default size larger than the screen,
    or a geometry saved on a larger or another screen (or while the window was too wide),
    would put its panels out of reach."""
    screen = window.screen() or QGuiApplication.primaryScreen()
    if screen is None or window.isMaximized() or window.isFullScreen():
        return
    room = screen.availableGeometry()
    frame = window.frameGeometry()
    extra_w, extra_h = frame.width() - window.width(), frame.height() - window.height()
    width = min(window.width(), room.width() - extra_w)
    height = min(window.height(), room.height() - extra_h)
    window.resize(max(width, 1), max(height, 1))
    frame = window.frameGeometry()
    x = min(max(frame.x(), room.left()), room.right() + 1 - frame.width())
    y = min(max(frame.y(), room.top()), room.bottom() + 1 - frame.height())
    window.move(max(x, room.left()), max(y, room.top()))
