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


#: First bytes of files people mistake for checkpoints, and what each is in words.
_MAGIC = (
    (b"\x89PNG", "a PNG picture"),
    (b"\xff\xd8\xff", "a JPEG picture"),
    (b"GIF8", "a GIF picture"),
    (b"%PDF", "a PDF document"),
    (b"\x89HDF", "an HDF5 file (Keras and TensorFlow save models in it)"),
    (b"\x1f\x8b", "a gzip-compressed file"),
    (b"\x08", "an ONNX or other protobuf file"),
)

#: What a model or weights file should be, for messages about a file that is not one.
EXPECTED_CHECKPOINT = (
    "a file written by torch.save (a state dict, .pth, or a whole model, .pt) or by "
    "torch.export.save (.pt2)"
)


def file_kind(path: Path) -> str | None:
    """What ``path`` is, in words, when its first bytes show it is no PyTorch checkpoint
    ("a text file that begins 'hello world'", "a PNG picture"); ``None`` when it could be
    one (a zip archive or a pickle, which ``torch.load`` reads) or cannot be read."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return None
    if head[:2] == b"PK" or head[:1] == b"\x80":  # torch.save's zip; a pickle (protocol 2+)
        return None
    if len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100_000_000:
        return "a safetensors file"
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "binary data in no format gradexplorer knows"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not first:
        return "a text file of blank lines"
    shown = first if len(first) <= 40 else first[:37] + "..."
    return f"a text file that begins '{shown}'"


def weights_format(path: Path) -> str:
    """What a weights file is by its bytes, whatever its name says: ``"safetensors"`` (a
    header of tensors only), ``"pickle"`` (``torch.save``'s zip with its ``.pkl`` record, a
    legacy ``torch.save`` file or a plain pickle: unpickling either can run code), or what
    else it is in words (:func:`file_kind`; "missing or unreadable" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return "missing or unreadable"
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8:
        return "safetensors"
    if head[:1] == b"\x80":  # a pickle's PROTO opcode (protocol 2 and later; legacy torch.save too)
        return "pickle"
    if head[:4] == b"PK\x03\x04":
        members = zip_members(path)
        if members is None or any(m.endswith(".pkl") for m in members):
            return "pickle"  # a zip whose members cannot be listed is refused as one: it may well be
        return "a zip archive without a pickle"
    return file_kind(path) or "a file gradexplorer does not know"


def not_a_checkpoint(path: Path, what: str, reason: str) -> ModelLoadError:
    """The refusal of a file ``torch.load`` cannot read: what the file is, when its first
    bytes tell, and what was expected; else torch's ``reason``."""
    kind = file_kind(path)
    if kind is not None:
        return ModelLoadError(
            f"The {what} '{path}' is {kind}, not a PyTorch checkpoint.",
            f"Give {EXPECTED_CHECKPOINT}.",
        )
    return ModelLoadError(
        f"The {what} '{path}' cannot be read as a PyTorch checkpoint ({reason}): it looks like "
        "one but is damaged or cut short.",
        "Check that the file is complete and was written by torch.save.",
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


def checkpoint_kind(path: Path) -> str:
    """What a checkpoint file holds, told without loading it (its first bytes, its archive's
    members, the globals its pickle would import): ``"export"`` (a ``torch.export`` archive),
    ``"weights"`` (plain tensors and containers: a state dict, which needs its architecture)
    or ``"objects"`` (a whole pickled model or other Python objects, loaded with trust).

    The window asks for the architecture only of ``"weights"``, after this check: it had
    asked before finding the file was no checkpoint at all.

    Raises
    ------
    ModelLoadError
        A missing, empty or non-regular file, a file that is no checkpoint (a picture, a
        text), or a TorchScript archive.
    """
    check_file(path, "checkpoint")
    kind = file_kind(path)
    if kind is not None:
        raise ModelLoadError(f"The checkpoint '{path}' is {kind}, not a PyTorch checkpoint.",
                             f"Give {EXPECTED_CHECKPOINT}.")
    members = zip_members(path)
    if members is not None and is_torchscript(members):
        raise torchscript_error(path)
    if is_export_archive(path, members):
        return "export"
    # Imported here: the scan imports torch, which telling a file's kind by its bytes does not need.
    from gradexplorer.files.pickle_scan import unsafe_globals

    return "objects" if unsafe_globals(path) else "weights"


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
