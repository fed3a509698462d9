"""Writing the views' exports (PNG plots, CSV statistics) to disk.

Every export goes through core's one atomic writer, so a full disk, a read-only folder
or a missing folder is reported as the user's problem with its fix, and an interrupted
write never leaves a half-written file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice
from PySide6.QtWidgets import QWidget

from gradexplorer.base.file_write import atomic_write_bytes, check_output_path


def write_export(data: bytes, path: str | os.PathLike,
                 inputs: Iterable[str | os.PathLike | None] = ()) -> Path:
    """Write ``data`` to ``path`` atomically (raises ``GradExplorerError`` subclasses:
    never over a special file or one of ``inputs``, the files the window has open, a
    symlink written at its target, disk full said so)."""
    check_output_path(path, inputs)
    return atomic_write_bytes(path, data)


def png_bytes(widget: QWidget) -> bytes:
    """The widget as it is drawn now, encoded as PNG."""
    array = QByteArray()
    buffer = QBuffer(array)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    if not widget.grab().save(buffer, "PNG"):
        raise OSError("the plot could not be encoded as PNG")
    buffer.close()
    return bytes(array.data())
