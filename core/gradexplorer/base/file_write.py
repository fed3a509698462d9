"""Writing output files safely: one atomic writer, with its checks and its error messages.

Every file gradexplorer writes (capture ``.pt``, plot PNG, statistics CSV) goes through
:func:`atomic_write`, so that a file the user owns is never destroyed:

- A regular file, or a new path: written to a temporary file in the same folder, flushed,
  fsynced, then renamed over the target, so the target is either the old file or the whole
  new one. A new file's mode follows the umask (``0o666 & ~umask``); a replaced file keeps
  its mode.
- A symbolic link: its target is written, atomically, in the target's own folder; the link
  stays a link. A dangling link creates its target.
- A character device (``/dev/null``, a terminal): written through, never replaced (renaming
  a temporary file over ``/dev/null`` as root would break the machine).
- A FIFO: written through when a program reads from it, refused with a message otherwise
  (rather than hang until one does).
- A directory, a socket, a block device (a disk): refused with a message.
- Anything inside a model cache (the Hugging Face cache and folder, torch's hub cache), its
  links resolved first: refused with a message (``gradexplorer.base.model_caches``).

The temporary file is named ``.NAME.gradexplorer-PID-XXXXXXXX.tmp``. Ctrl+C or SIGTERM
during a write (in the main thread) removes it and raises :class:`SaveInterrupted`; one
left behind by a process that was killed outright (SIGKILL, a power cut) is removed by the
next write into that folder, once its process is gone.

A full disk is recognised by errno (``ENOSPC``, ``EDQUOT``) and, when torch's zip writer
hides the errno (torch 2.14 says ``unexpected pos N vs M``), by the free space left; the
message says how much was needed and how much was free. :func:`check_output_path` refuses,
before any work is done, an output that cannot be written or that is one of the inputs
(compared by inode, so a link or another spelling of the same file is caught), and
:func:`check_free_space` an output larger than the free space of its folder.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.model_caches import model_cache_holding
from gradexplorer.base.units import format_bytes

__all__ = [
    "BinaryWriter",
    "FileWriteError",
    "SaveInterrupted",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_free_space",
    "check_output_path",
    "check_outside_model_caches",
    "temp_name",
]

TEMP_MARK = ".gradexplorer-"
_TEMP_RE = re.compile(r"^\..*\.gradexplorer-(\d+)-[0-9a-f]{8}\.tmp$")
# A temporary file older than this is removed even when its process id is in use again
# (or lives on another machine sharing the folder).
_STALE_AFTER_S = 24 * 3600
# When torch hides the errno of a failed write, less free space than this means a full disk.
_NEARLY_FULL = 1 << 20
_DISK_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_DENIED_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}
_INTERRUPTED = "interrupted; nothing was saved."


class BinaryWriter(Protocol):
    """What ``write`` of :func:`atomic_write` gets: a binary file that can be written and flushed."""

    def write(self, data: Any, /) -> int: ...

    def flush(self) -> None: ...


class FileWriteError(GradExplorerError):
    """An output file cannot be written; nothing was written (an existing file is unchanged)."""


class SaveInterrupted(KeyboardInterrupt):
    """Ctrl+C or SIGTERM arrived during a write; the temporary file is removed, nothing was saved.

    A ``KeyboardInterrupt``, so that code which stops on Ctrl+C stops on it too (the CLI
    exits 130).
    """

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(_INTERRUPTED)
        self.signal_name = signal_name


# -- where to write ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """How a path will be written.

    ``kind`` is ``"replace"`` (a temporary file in ``target.parent`` renamed over
    ``target``), ``"device"`` or ``"fifo"`` (written through); ``mode`` is the permission
    bits the replaced file had (``None`` for a new file).
    """

    path: Path
    target: Path
    kind: str
    mode: int | None = None


def _name_max(folder: Path) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):  # Windows, or a file system that does not say
        return 255


def _plan(path: Path, error: type[GradExplorerError]) -> _Plan:
    """Classify ``path`` (following a symbolic link to its target) and refuse what must not be written."""
    shown = str(path)
    _refuse_model_cache(path, error)
    if path.parent.is_dir():
        _check_name_length(path, error)
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        link = None
    except NotADirectoryError:
        raise error(f"'{shown}' cannot be created: a part of its folder is a file, not a folder.",
                    "Choose another path.") from None
    except OSError as exc:
        raise _os_error(exc, path, error) from None
    target = path
    info = link
    if link is not None and stat.S_ISLNK(link.st_mode):
        target = Path(os.path.realpath(path))
        try:
            info = os.stat(path)
        except FileNotFoundError:
            info = None  # a dangling link: its target is created
        except OSError as exc:
            raise _os_error(exc, path, error) from None
    if info is None:
        folder = target.parent
        if not folder.is_dir():
            raise error(f"The folder '{folder}' does not exist.", "Create it first or choose another folder.")
        _check_name_length(target, error)
        return _Plan(path, target, "replace")
    mode = info.st_mode
    if stat.S_ISREG(mode):
        _check_name_length(target, error)
        return _Plan(path, target, "replace", stat.S_IMODE(mode))
    if stat.S_ISDIR(mode):
        raise error(f"'{shown}' is a folder.", f"Give a file name, e.g. '{Path(shown) / 'capture.pt'}'.")
    if stat.S_ISCHR(mode):
        return _Plan(path, target, "device")
    if stat.S_ISFIFO(mode):
        return _Plan(path, target, "fifo")
    if stat.S_ISSOCK(mode):
        raise error(f"'{shown}' is a socket, which cannot hold a file.", "Choose a regular file name.")
    if stat.S_ISBLK(mode):
        raise error(f"'{shown}' is a block device (a disk); gradexplorer does not write over disks.",
                    "Choose a regular file name.")
    raise error(f"'{shown}' is not a regular file.", "Choose a regular file name.")


def _refuse_model_cache(path: Path, error: type[GradExplorerError]) -> None:
    """Refuse a path inside a model cache, every link resolved first: a Hugging Face
    snapshot's ``model.safetensors`` is a link to a blob, and writing "through" it would
    replace the cached weights of every revision and every program that shares them."""
    try:
        found = model_cache_holding(path)
    except (OSError, ValueError):  # a path the system cannot resolve: the checks below say why
        return
    if found is not None:
        name, folder = found
        raise error(f"'{path}' is inside {name} ('{folder}'); writing there would replace the files of the "
                    "models it holds.", "Choose a path outside the model caches.")


def _check_name_length(target: Path, error: type[GradExplorerError]) -> None:
    limit = _name_max(target.parent)
    size = len(os.fsencode(target.name))
    if size > limit:
        raise error(f"The file name '{target.name[:40]}…' is {size} bytes long; this file system allows {limit}.",
                    "Choose a shorter name.")


def temp_name(name: str, folder: Path | None = None) -> str:
    """The temporary file name used while writing ``name``: ``.NAME.gradexplorer-PID-XXXXXXXX.tmp``.

    ``NAME`` is shortened when needed, so that the whole fits the file system's limit.

    Parameters
    ----------
    name : str
        The target's file name.
    folder : Path, optional
        The folder it is written in (its name length limit; 255 bytes without one).

    Returns
    -------
    str
    """
    suffix = f"{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}.tmp"
    room = (_name_max(folder) if folder is not None else 255) - 1 - len(suffix.encode())
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > room:
        name = encoded[:room].decode("utf-8", "ignore")
    return f".{name}{suffix}"


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) would send CTRL_C_EVENT on Windows
        return True
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, and belongs to someone else
        return True
    return True


def _remove_stale_temps(folder: Path) -> None:
    """Remove temporary files that a killed gradexplorer left in ``folder``."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    now = time.time()
    for name in names:
        found = _TEMP_RE.match(name)
        if found is None:
            continue
        path = folder / name
        try:
            age = now - os.lstat(path).st_mtime
            if not _pid_alive(int(found.group(1))) or age > _STALE_AFTER_S:
                os.unlink(path)
        except OSError:
            continue  # gone already, or not ours to remove


# -- errors ----------------------------------------------------------------------------------


def _free_bytes(folder: Path) -> int | None:
    try:
        return int(shutil.disk_usage(folder).free)
    except OSError:
        return None


def _room_advice(path: Path) -> str:
    """What frees room, for this kind of output: only a capture has a smaller variant."""
    if path.suffix.lower() in {".pt", ".pth"}:
        return "Free some space or choose another disk; a statistics-only capture is far smaller."
    return "Free some space or choose another disk."


def _disk_full(path: Path, error: type[GradExplorerError], needed: int | None, free: int | None) -> GradExplorerError:
    need = f" needs at least {format_bytes(needed)}" if needed else " needs more room"
    room = f" and {format_bytes(free)} was free" if free is not None else ""
    return error(
        f"The disk is full: writing '{path.name}'{need}{room}; nothing was written.",
        _room_advice(path),
    )


def _os_error(exc: OSError, path: Path, error: type[GradExplorerError]) -> GradExplorerError:
    folder = path.parent
    if exc.errno in _DENIED_ERRNOS:
        return error(f"Cannot write to '{folder}': permission denied.", "Choose a folder you can write to.")
    if exc.errno in _DISK_FULL_ERRNOS:
        return _disk_full(path, error, None, _free_bytes(folder))
    if exc.errno == errno.ENAMETOOLONG:
        return error(f"The path '{str(path)[:60]}…' is too long for this file system.", "Choose a shorter name.")
    if exc.errno == errno.ENOENT:
        return error(f"The folder '{folder}' does not exist.", "Create it first or choose another folder.")
    if exc.errno == errno.EISDIR:
        return error(f"'{path}' is a folder.", "Give a file name.")
    return error(f"Cannot write '{path}': {exc.strerror or exc}.", "Choose another file name or folder.")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during (torch wraps them)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


# -- the writer --------------------------------------------------------------------------


class _Sink:
    """The file object handed to ``write``: counts bytes and remembers the first failure
    (torch's zip writer replaces a Python exception raised in ``write`` with its own)."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self.written = 0
        self.attempted = 0
        self.failure: BaseException | None = None

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        if self._fh.closed:
            # After a failed or interrupted save, torch's zip writer still finishes the
            # archive from its destructor, into the file closed meanwhile: an exception
            # there aborts the process (std::terminate, exit -6 instead of 130 on Ctrl+C).
            # Nothing of it is kept (the temporary file is removed): discard it.
            return size
        self.attempted = self.written + size
        try:
            count = self._fh.write(data)
        except BaseException as exc:
            if self.failure is None:
                self.failure = exc
            raise
        self.written += size if count is None else count
        return size if count is None else count

    def flush(self) -> None:
        if not self._fh.closed:
            self._fh.flush()

    def writable(self) -> bool:
        return True


class _SignalGuard:
    """During a write in the main thread, Ctrl+C and SIGTERM raise :class:`SaveInterrupted`
    (once; the cleanup that follows is not interrupted again). Once the rename has begun they
    are held back and delivered when the write is over: the file is complete by then."""

    def __init__(self) -> None:
        self.committing = False
        self.received: str | None = None
        self._pending: list[int] = []
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.committing or self.received is not None:
            self._pending.append(signum)
            return
        self.received = name
        raise SaveInterrupted(name)

    def check(self) -> None:
        """Raise :class:`SaveInterrupted` if a signal came during the write, even when the
        exception its handler raised was swallowed on the way (by an ``except BaseException``
        in the writer, or a finalizer that ran when it came): it is never followed by a save."""
        if self.received is not None:
            raise SaveInterrupted(self.received)

    def __enter__(self) -> _SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, getattr(signal, "SIGTERM", None)):
                if signum is None:
                    continue
                try:
                    self._previous[signum] = signal.signal(signum, self._handle)
                except (ValueError, OSError):  # not settable here (an embedded interpreter)
                    continue
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if self.committing and exc[0] is None:
            # The file was saved. SIGTERM still ends the process, as asked; Ctrl+C that came
            # in the last instant of the save is dropped, the save being done.
            for signum in dict.fromkeys(self._pending):
                if signum != signal.SIGINT:
                    os.kill(os.getpid(), signum)


class _TempSlot:
    """The temporary file being created, named before ``os.open`` runs: a signal that
    arrives after the file exists but before its path is returned still finds it to remove."""

    def __init__(self) -> None:
        self.path: Path | None = None


def _open_temp(folder: Path, name: str, slot: _TempSlot | None = None) -> tuple[int, Path]:
    """Create the temporary file (mode 0o666 less the umask) and return its descriptor and path.

    ``slot.path`` names the file from just before it is created, so that the caller removes
    it whatever interrupts this function.
    """
    slot = slot if slot is not None else _TempSlot()
    for _ in range(100):
        tmp = folder / temp_name(name, folder)
        slot.path = tmp
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            # Not ours (names carry our process id and a random part, so this is another
            # life of this id): never removed by us.
            slot.path = None
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(folder))


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX; a no-op where folders cannot be opened)."""
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _open_through(plan: _Plan, error: type[GradExplorerError]) -> int:
    flags = os.O_WRONLY | getattr(os, "O_BINARY", 0)
    if plan.kind == "fifo":
        try:
            fd = os.open(plan.target, flags | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                raise error(f"'{plan.path}' is a named pipe (FIFO) and no program is reading from it.",
                            "Start the reader first, or choose a regular file name.") from None
            raise _os_error(exc, plan.path, error) from None
        import fcntl  # POSIX only, like FIFOs

        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return fd
    try:
        return os.open(plan.target, flags)
    except OSError as exc:
        raise _os_error(exc, plan.path, error) from None


def _failure(exc: BaseException, sink: _Sink | None, guard: _SignalGuard, plan: _Plan,
             error: type[GradExplorerError], needed: int | None, free: int | None) -> BaseException:
    """What to raise for ``exc``, raised while writing ``plan``."""
    causes = list(_chain(exc))
    if sink is not None and sink.failure is not None:
        causes.insert(0, sink.failure)
    if guard.received is not None or any(isinstance(c, SaveInterrupted) for c in causes):
        return SaveInterrupted(guard.received or "SIGINT")
    if any(isinstance(c, KeyboardInterrupt) for c in causes):
        return SaveInterrupted("SIGINT")
    if isinstance(exc, GradExplorerError):
        return exc
    attempted = sink.attempted if sink is not None else 0
    need = max(needed or 0, attempted) or None
    for cause in causes:
        if isinstance(cause, OSError) and cause.errno is not None:
            if cause.errno in _DISK_FULL_ERRNOS:
                return _disk_full(plan.target, error, need, free)
            return _os_error(cause, plan.target, error)
    if isinstance(exc, Exception) and plan.kind == "replace":
        # torch's zip writer reports a full disk as "unexpected pos N vs M", without errno:
        # look at the space left (the temporary file still holds what was written).
        left = _free_bytes(plan.target.parent)
        if left is not None and left < _NEARLY_FULL:
            return _disk_full(plan.target, error, need, free)
    if isinstance(exc, Exception):
        text = str(exc).strip().splitlines()
        return error(f"Cannot write '{plan.path}': {text[0] if text else type(exc).__name__}.",
                     "Choose another file name or folder.")
    return exc


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryWriter], object], *,
                 expected_size: int | None = None,
                 error: type[GradExplorerError] = FileWriteError) -> Path:
    """Write a file through ``write(file)`` so that no file of the user's is ever destroyed.

    See the module docstring for what each kind of path gets.

    Parameters
    ----------
    path : str or os.PathLike
        The output; ``~`` is expanded.
    write : callable
        Called once with a binary file object (``write`` and ``flush``) to write into,
        e.g. ``lambda f: torch.save(obj, f)``.
    expected_size : int, optional
        About how many bytes will be written: refused at once when the folder has less free.
    error : type
        The :class:`~gradexplorer.base.errors.GradExplorerError` subclass raised for failures
        (``CaptureFileError`` for captures).

    Returns
    -------
    Path
        The path written (as given, expanded; a symbolic link's target was written).

    Raises
    ------
    error
        The path is a folder, socket or block device, its folder is missing or read-only,
        the name is too long, the disk is full, or any other write failure; an existing
        file is left as it was and no temporary file is left behind.
    SaveInterrupted
        Ctrl+C or SIGTERM during the write (main thread only); nothing was saved.
    """
    path = Path(path).expanduser()
    plan = _plan(path, error)
    if plan.kind != "replace":
        return _write_through(plan, write, error)
    folder = plan.target.parent
    _remove_stale_temps(folder)
    free = _free_bytes(folder)
    if expected_size is not None:
        check_free_space(plan.target, expected_size, error=error)
    sink: _Sink | None = None
    slot = _TempSlot()
    guard = _SignalGuard()
    try:
        with guard:
            try:
                fd, _tmp = _open_temp(folder, plan.target.name, slot)
                with os.fdopen(fd, "wb") as fh:
                    if plan.mode is not None and hasattr(os, "fchmod"):
                        os.fchmod(fh.fileno(), plan.mode)
                    sink = _Sink(fh)
                    write(sink)
                    guard.check()
                    fh.flush()
                    os.fsync(fh.fileno())
                guard.committing = True
                os.replace(_tmp, plan.target)
                slot.path = None
            finally:
                if slot.path is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(slot.path)
    except BaseException as exc:  # noqa: BLE001 - every failure, Ctrl+C too, becomes one message
        raise _failure(exc, sink, guard, plan, error, expected_size, free) from None
    _fsync_folder(folder)
    return path


def _write_through(plan: _Plan, write: Callable[[BinaryWriter], object], error: type[GradExplorerError]) -> Path:
    """Write into an existing device or FIFO: it is never replaced."""
    fd = _open_through(plan, error)
    sink: _Sink | None = None
    guard = _SignalGuard()
    try:
        with guard, os.fdopen(fd, "wb") as fh:
            sink = _Sink(fh)
            write(sink)
            guard.check()
            fh.flush()
    except BaseException as exc:  # noqa: BLE001 - every failure, Ctrl+C too, becomes one message
        raise _failure(exc, sink, guard, plan, error, None, None) from None
    return plan.path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *,
                       error: type[GradExplorerError] = FileWriteError) -> Path:
    """:func:`atomic_write` of ``data`` (a PNG picture, say)."""
    return atomic_write(path, lambda fh: fh.write(data), expected_size=len(data), error=error)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8",
                      error: type[GradExplorerError] = FileWriteError) -> Path:
    """:func:`atomic_write` of ``text``, encoded (a CSV table, say); newlines are written as given."""
    return atomic_write_bytes(path, text.encode(encoding), error=error)


# -- checks before the work ------------------------------------------------------------------


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL: no file of the user's
        return False


def _input_candidates(inputs: Iterable[str | os.PathLike[str] | None]) -> Iterator[tuple[str, Path]]:
    for item in inputs:
        if item is None:
            continue
        text = os.fspath(item)
        yield text, Path(text).expanduser()
        if ":" in text and not _exists(Path(text)):
            # A factory, "file.py:build", reads file.py; "file:/path" names a weights file.
            head, _, tail = text.rpartition(":")
            for part in (head, tail):
                if part:
                    yield text, Path(part).expanduser()


def check_outside_model_caches(out: str | os.PathLike[str]) -> Path:
    """Refuse an output (a file or a folder of them, which need not exist yet) inside a model
    cache, every link resolved: the check :func:`atomic_write` and :func:`check_output_path`
    make, for outputs written otherwise (a watch log's database, TensorBoard's folder), and
    for a check that holds on every rank of a distributed training (it reads only the path).

    Returns
    -------
    Path
        ``out``, expanded.

    Raises
    ------
    FileWriteError
        ``out`` is inside the Hugging Face cache or folder, or torch's hub cache.
    """
    path = Path(out).expanduser()
    _refuse_model_cache(path, FileWriteError)
    return path


def check_output_path(out: str | os.PathLike[str],
                      inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Path:
    """Refuse an output path before any work is done: cheap checks, one message each.

    Parameters
    ----------
    out : str or os.PathLike
        Where the result will be written.
    inputs : iterable of str or os.PathLike
        Every file the work reads (model, weights, inputs, labels); specs that are not files
        (``resnet18``, ``DEFAULT``) are ignored, and ``file.py:build`` stands for ``file.py``.

    Returns
    -------
    Path
        ``out``, expanded.

    Raises
    ------
    FileWriteError
        ``out`` is a folder, socket or block device; its folder is missing or not writable;
        its name is too long; or it is the same file as one of ``inputs`` (by inode: a link,
        a hard link or another spelling is caught; a folder among ``inputs`` stands for every
        file in it), which writing would destroy.
    """
    path = Path(out).expanduser()
    plan = _plan(path, FileWriteError)
    if plan.kind == "replace" and not os.access(plan.target.parent, os.W_OK):
        raise FileWriteError(f"The folder '{plan.target.parent}' is not writable.",
                             "Choose a folder you can write to.")
    if plan.kind == "replace" and plan.mode is None:
        return path  # a new file cannot be one of the inputs
    try:
        out_info = os.stat(plan.target)
    except OSError:
        return path
    for spelled, candidate in _input_candidates(inputs):
        for shown, info in _input_files(spelled, candidate):
            if (info.st_dev, info.st_ino) == (out_info.st_dev, out_info.st_ino):
                raise FileWriteError(
                    f"The output '{path}' is the same file as the input '{shown}'; writing it would "
                    "destroy the input.",
                    "Choose another output file name.",
                )
    return path


# A folder given as an input is read file by file (pictures, a dataset): its entries are
# compared with the output, up to this many (a larger folder is compared as far as this).
_FOLDER_ENTRIES_COMPARED = 200_000


def _input_files(spelled: str, candidate: Path) -> Iterator[tuple[str, os.stat_result]]:
    """The stat of ``candidate`` and, for a folder, of each file in it (what a folder input reads)."""
    try:
        info = os.stat(candidate)
    except (OSError, ValueError):
        return
    yield spelled, info
    if not stat.S_ISDIR(info.st_mode):
        return
    try:
        with os.scandir(candidate) as entries:
            for count, entry in enumerate(entries):
                if count >= _FOLDER_ENTRIES_COMPARED:
                    return
                with contextlib.suppress(OSError):
                    yield str(Path(spelled) / entry.name), entry.stat()
    except OSError:
        return


def check_free_space(out: str | os.PathLike[str], needed: int, *,
                     error: type[GradExplorerError] = FileWriteError) -> None:
    """Refuse an output that will not fit in the free space of its folder's disk.

    Parameters
    ----------
    out : str or os.PathLike
        The output path (a symbolic link's target folder counts; devices and FIFOs always pass).
    needed : int
        About how many bytes will be written (a capture's memory estimate, say).
    error : type
        The :class:`~gradexplorer.base.errors.GradExplorerError` subclass to raise.

    Raises
    ------
    error
        When ``needed`` exceeds the free space.
    """
    path = Path(out).expanduser()
    plan = _plan(path, error)
    if plan.kind != "replace":
        return
    free = _free_bytes(plan.target.parent)
    if free is not None and needed > free:
        raise error(
            f"Not enough disk space: '{path.name}' needs about {format_bytes(needed)} and the disk of "
            f"'{plan.target.parent}' has {format_bytes(free)} free.",
            _room_advice(plan.target),
        )
