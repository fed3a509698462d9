"""Folders of small random pictures for the dataset-capture tests (CLI, window, matrix)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_pictures(folder: Path, count: int, size: tuple[int, int] = (40, 48), seed: int = 0,
                   stem: str = "img", note: str | None = None) -> Path:
    """``count`` random RGB PNGs ``{stem}{i}.png`` of ``size`` (height, width) in ``folder``,
    and a text file named ``note`` beside them when given (a file that is not a picture)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(folder / f"{stem}{i}.png")
    if note:
        (folder / note).write_text("not an image")
    return folder
