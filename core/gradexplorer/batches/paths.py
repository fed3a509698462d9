"""How batch sources are named back to the user: paths, and what sources are accepted."""

from __future__ import annotations

import os
from pathlib import Path

from gradexplorer.base.errors import BatchError

#: Every kind of input, for messages that must say what else would work.
SOURCES_HINT = (
    "give image files or a folder of images, one .pt tensor file, "
    "a random batch of a shape such as 2x3x224x224, or the demo batch"
)


def display_path(path: Path) -> str:
    """``path`` with the home folder written as ``~``."""
    text = str(path)
    home = str(Path.home())
    if home not in ("", "/") and (text == home or text.startswith(home + os.sep)):
        return "~" + text[len(home):]
    return text


def missing_source(raw: object) -> BatchError:
    """The error for a source path that does not exist."""
    return BatchError(f"'{raw}' does not exist;", "check the path, or " + SOURCES_HINT + ".")
