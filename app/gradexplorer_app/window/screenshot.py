"""``--screenshot``: the window saved as a PNG through the one atomic writer, once it has drawn.

Never written over the file the window shows (by inode: a link or hard link to it too), a
folder, a device or a FIFO that no program reads; a full disk leaves an existing picture as
it was. A refusal is said on stderr, and the command exits 1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from PySide6.QtWidgets import QWidget

from gradexplorer.base.errors import GradExplorerError
from gradexplorer_app.views.export import png_bytes, write_export


def save_screenshot(window: QWidget, path: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = ()) -> bool:
    """Save ``window`` as drawn now to ``path``; False (the reason on stderr) when it cannot be."""
    try:
        write_export(png_bytes(window), path, inputs)
    except GradExplorerError as exc:
        print(f"error: {exc.problem} {exc.fix}", file=sys.stderr)
        return False
    except OSError as exc:
        print(f"error: cannot write the screenshot '{os.fspath(path)}': {exc}.", file=sys.stderr)
        return False
    return True
