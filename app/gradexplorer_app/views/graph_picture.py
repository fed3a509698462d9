"""PNG pictures of the model graph: the SVG of ``gradexplorer.model_graph.render`` drawn by Qt's SVG
renderer, so the CLI's PNG and the window's export look the same."""

from __future__ import annotations

import os
import sys

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QRectF
from PySide6.QtGui import QColor, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication


def _app() -> None:
    # A QApplication, not a bare QGuiApplication: in a process that later opens widgets (the
    # window after a PNG export, a test session) a QGuiApplication instance makes every
    # QWidget abort with "Must construct a QApplication before a QWidget".
    if QApplication.instance() is None:
        if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) or sys.platform == "win32":
            os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        QApplication([sys.argv[0] if sys.argv else "gradexplorer"])


def svg_to_png(svg: str, scale: float = 1.5, max_side: int = 16000) -> bytes:
    """PNG bytes of an SVG document, ``scale`` pixels per SVG unit (capped at ``max_side``)."""
    _app()
    renderer = QSvgRenderer(QByteArray(svg.encode()))
    size = renderer.defaultSize()
    scale = min(scale, max_side / max(1, size.width()), max_side / max(1, size.height()))
    w, h = max(1, int(size.width() * scale)), max(1, int(size.height() * scale))
    image = QImage(w, h, QImage.Format.Format_ARGB32)
    image.fill(QColor("white"))
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.TextAntialiasing)
    renderer.render(painter, QRectF(0, 0, w, h))
    painter.end()
    buf = QByteArray()
    dev = QBuffer(buf)
    dev.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(dev, "PNG")  # type: ignore[call-overload]  # PySide6 6.11 stubs: bytes; the binding takes str only
    dev.close()
    return bytes(buf.data())
