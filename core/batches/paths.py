"""How batch sources are named back to the user: paths, and what sources are accepted."""

from __future__ import annotations

import os
from pathlib import Path

from core.errors import BatchError

#: Every kind of input, for messages that must say what else would work.
SOURCES_HINT = (
    "give image files or a folder of images, one .pt tensor file, "
    "a random batch such as 'random:2x3x224x224', or 'demo'"
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


def few(names: list[str], limit: int = 3) -> str:
    """The first ``limit`` names and how many more, for messages."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
