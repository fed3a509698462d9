"""Writing the views' exports (PNG and SVG plots, CSV statistics) to disk.

A plot is exported as something worth sending: drawn again at twice the resolution of the
screen (or more), under a title line that says what it shows (model, layer, call, sample,
target: a bare 510×297 grab said none of it), as PNG or, by the file's suffix, SVG.

Every export goes through core's one atomic writer, so a full disk, a read-only folder
or a missing folder is reported as the user's problem with its fix, and an interrupted
write never leaves a half-written file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QPoint, QRect, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QImage, QPaintDevice, QPainter
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import QWidget

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.file_write import atomic_write_bytes, check_output_path

#: The resolution of an exported PNG, in pixels per pixel on the screen.
PNG_SCALE = 2
#: What "Export plot…" offers.
PLOT_FILTER = "PNG images (*.png);;SVG drawings (*.svg)"


def write_export(data: bytes, path: str | os.PathLike,
                 inputs: Iterable[str | os.PathLike | None] = ()) -> Path:
    """Write ``data`` to ``path`` atomically (raises ``GradExplorerError`` subclasses:
    never over a special file or one of ``inputs``, the files the window has open, a
    symlink written at its target, disk full said so)."""
    check_output_path(path, inputs)
    return atomic_write_bytes(path, data)


def png_bytes(widget: QWidget) -> bytes:
    """The widget as it is drawn now, encoded as PNG (screen resolution, no title)."""
    return _encode(widget.grab().toImage())


def _encode(image: QImage) -> bytes:
    # Qt reports a picture it could not allocate (memory short, an address-space cap) as a
    # null image and a failed save, not as an exception: said here in the user's terms.
    size = f"{image.width()}×{image.height()} pixels"
    if image.isNull():
        raise GradExplorerError(f"the picture could not be made ({size}): the memory for it could not be had;",
                                "free memory (close other windows or programs) or make the window smaller, "
                                "then export again.")
    array = QByteArray()
    buffer = QBuffer(array)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    if not image.save(buffer, "PNG"):  # type: ignore[call-overload]  # PySide6 6.11 stubs: bytes; binding: str only
        raise GradExplorerError(f"the picture ({size}) could not be encoded as PNG;",
                                "free memory, or export as SVG (a .svg file name) instead.")
    buffer.close()
    return bytes(array.data())


_WRAP = int(Qt.TextFlag.TextWordWrap) | int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)


def _title_font(widget: QWidget) -> QFont:
    font = QFont(widget.font())
    font.setPointSizeF(max(font.pointSizeF(), 9.0) + 1)
    font.setWeight(QFont.Weight.DemiBold)
    return font


def _title_rect(widget: QWidget, title: str) -> QRect:
    """Where the title is drawn: the widget's width less a margin, as many lines as it wraps to."""
    if not title:
        return QRect()
    metrics = QFontMetrics(_title_font(widget))
    return metrics.boundingRect(QRect(8, 6, max(widget.width() - 16, 40), 10_000), _WRAP, title)


def _title_height(widget: QWidget, title: str) -> int:
    return _title_rect(widget, title).bottom() + 8 if title else 0


def _paint(device: QPaintDevice, widget: QWidget, title: str, size: QSize) -> None:
    """Draw ``title`` over ``widget`` onto ``device`` (in the widget's own pixels)."""
    painter = QPainter(device)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.TextAntialiasing)
    painter.fillRect(QRect(QPoint(0, 0), size), QColor("white"))
    top = _title_height(widget, title)
    if title:  # wrapped, never cut: the layer and sample are what the title is for
        painter.setFont(_title_font(widget))
        painter.setPen(QColor("#111827"))
        painter.drawText(QRectF(_title_rect(widget, title)), _WRAP, title)
    # QWidget's own render (pyqtgraph's views replace it with a scene render of their own):
    # the widget paints itself again through this painter, at the painter's resolution.
    QWidget.render(widget, painter, QPoint(0, top))
    painter.end()


def plot_png(widget: QWidget, title: str = "", scale: int = PNG_SCALE) -> bytes:
    """``widget`` drawn again at ``scale`` times its resolution under a ``title`` line, as PNG."""
    size = QSize(widget.width(), widget.height() + _title_height(widget, title))
    image = QImage(size * scale, QImage.Format.Format_ARGB32)
    image.setDevicePixelRatio(scale)
    _paint(image, widget, title, size)
    return _encode(image)


def plot_svg(widget: QWidget, title: str = "") -> bytes:
    """``widget`` drawn under a ``title`` line as an SVG document (plots' lines and text
    as vectors; pictures as embedded images)."""
    size = QSize(widget.width(), widget.height() + _title_height(widget, title))
    array = QByteArray()
    buffer = QBuffer(array)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    generator = QSvgGenerator()
    generator.setOutputDevice(buffer)
    generator.setSize(size)
    generator.setViewBox(QRect(QPoint(0, 0), size))
    generator.setTitle(title or "gradexplorer plot")
    generator.setDescription("Exported by gradexplorer")
    _paint(generator, widget, title, size)
    buffer.close()
    return bytes(array.data())


def plot_bytes(widget: QWidget, path: str | os.PathLike, title: str = "") -> bytes:
    """The plot encoded as the file's suffix says: ``.svg`` for SVG, else PNG."""
    return plot_svg(widget, title) if str(path).lower().endswith(".svg") else plot_png(widget, title)


def file_name(*parts: str | None, suffix: str = ".png") -> str:
    """A default file name from its parts (``resnet18``, ``layer4.1.relu``, ``heatmap``):
    ``resnet18_layer4.1.relu_heatmap.png``; characters a file name cannot hold replaced."""
    words = [re.sub(r"[^\w.+-]+", "-", str(p)).strip("-.") for p in parts if p]
    return "_".join(w for w in words if w)[:150] + suffix
