"""What a model file is, told from its name and its first bytes, before anything is loaded."""

from __future__ import annotations

import contextlib
import os
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

from gradexplorer.base.errors import ModelLoadError

#: Endings that mark a ``--model`` or ``--weights`` value as a file even before it exists.
FILE_SUFFIXES = frozenset(
    {".pth", ".pt", ".pt2", ".ckpt", ".bin", ".pkl", ".pickle", ".tar", ".zip"}
)


def looks_like_path(text: str, *, check_disk: bool = True) -> bool:
    """Whether the user's text names a file rather than a model name or a factory."""
    return (
        Path(text).suffix.lower() in FILE_SUFFIXES
        or "/" in text
        or os.sep in text
        or text.startswith("~")
        or (check_disk and os.path.exists(text))
    )


def check_file(path: Path, what: str) -> None:
    """Refuse a missing, non-regular or empty file, naming it as ``what``."""
    if not path.exists():
        raise ModelLoadError(f"The {what} '{path}' does not exist.", "Check the path.")
    if not path.is_file():
        raise ModelLoadError(f"'{path}' is not a file.", f"Choose a {what}.")
    if path.stat().st_size == 0:
        raise ModelLoadError(
            f"The {what} '{path}' is empty.", "It was probably not saved completely."
        )


def zip_members(path: Path) -> list[str] | None:
    """The member names of a zip archive (every ``torch.save`` file), or None for others."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return None


def is_torchscript(members: list[str]) -> bool:
    """Whether archive members are those of a ``torch.jit.save`` file."""
    return any(m.endswith("/constants.pkl") or "/code/" in m for m in members)


def is_export_archive(path: Path, members: list[str] | None) -> bool:
    """Whether the file is a ``torch.export.save`` archive (``.pt2``)."""
    return path.suffix.lower() == ".pt2" or bool(
        members and any(m.endswith("/archive_format") for m in members)
    )


def torchscript_error(path: Path) -> ModelLoadError:
    """The refusal of a TorchScript archive: its modules cannot be hooked."""
    return ModelLoadError(
        f"'{path}' is a TorchScript archive: gradexplorer cannot hook TorchScript modules "
        "(forward hooks are refused, and hooks on their children never fire).",
        "Save the eager model's weights instead, torch.save(model.state_dict(), 'model.pth'), "
        "and load them with the architecture (--arch resnet18), or save the eager model itself.",
    )


@contextlib.contextmanager
def import_path(folder: Path | None) -> Iterator[None]:
    """``folder`` at the front of the import path while the user's code runs (a factory
    file's neighbours, a pickled model's module in the current folder)."""
    entry = str(folder.resolve()) if folder is not None else None
    if entry is None or entry in sys.path:
        yield
        return
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)
