"""gradexplorer.base.file_write: no file of the user's is ever destroyed, whatever the output path is.

Special files are private nodes made in a temporary folder (never the real /dev): a
character device with /dev/null's numbers (1, 3) and one with /dev/full's (1, 7), a FIFO,
a UNIX socket.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import gradexplorer.base.file_write as fw
from gradexplorer.base.errors import CaptureFileError
from gradexplorer.base.file_write import (
    FileWriteError,
    SaveInterrupted,
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
    check_free_space,
    check_output_path,
)

ROOT = Path(__file__).resolve().parents[2]
TORCH_DISK_FULL = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX special files")


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if fw.TEMP_MARK in p.name)


def _char_device(path: Path, minor: int) -> Path:
    """A private character device with the numbers of /dev/null (minor 3) or /dev/full (7)."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    except (PermissionError, AttributeError):
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    return path


# -- regular files and links ------------------------------------------------------------------


def test_new_file_mode_follows_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write_bytes(tmp_path / "a.bin", b"abc")
    finally:
        os.umask(old)
    assert (tmp_path / "a.bin").read_bytes() == b"abc"
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == 0o640
    assert _temps(tmp_path) == []


def test_replacing_a_file_is_atomic_and_keeps_its_mode(tmp_path):
    path = tmp_path / "c.pt"
    path.write_bytes(b"old")
    path.chmod(0o604)
    inode = path.stat().st_ino
    atomic_write(path, lambda fh: torch.save({"x": torch.arange(3)}, fh))
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.arange(3))
    assert path.stat().st_ino != inode  # a new file renamed over the old one
    assert stat.S_IMODE(path.stat().st_mode) == 0o604
    assert _temps(tmp_path) == []


def test_a_symlink_writes_its_target_atomically_in_the_targets_folder(tmp_path):
    real_dir, link_dir = tmp_path / "real", tmp_path / "links"
    real_dir.mkdir()
    link_dir.mkdir()
    target = real_dir / "data.csv"
    target.write_text("old")
    link = link_dir / "out.csv"
    link.symlink_to(target)
    atomic_write_text(link, "a,b\n1,2\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "a,b\n1,2\n"
    assert _temps(real_dir) == [] and _temps(link_dir) == []
    dangling = link_dir / "new.csv"
    dangling.symlink_to(real_dir / "created.csv")
    atomic_write_text(dangling, "x")
    assert dangling.is_symlink() and (real_dir / "created.csv").read_text() == "x"


def test_a_folder_is_refused(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    for call in (lambda: atomic_write_bytes(folder, b"x"), lambda: check_output_path(folder)):
        with pytest.raises(FileWriteError, match="is a folder") as info:
            call()
        assert "file name" in info.value.fix
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_missing_folder_is_refused(tmp_path):
    with pytest.raises(FileWriteError, match="does not exist"):
        check_output_path(tmp_path / "nope" / "c.pt")
    with pytest.raises(CaptureFileError, match="does not exist"):
        atomic_write_bytes(tmp_path / "nope" / "c.pt", b"x", error=CaptureFileError)


# -- special files ------------------------------------------------------------------------------


@posix_only
def test_a_character_device_is_written_through_and_never_replaced(tmp_path):
    null = _char_device(tmp_path / "mynull", 3)
    assert check_output_path(null) == null
    atomic_write(null, lambda fh: torch.save({"x": torch.zeros(1000)}, fh))
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    assert os.lstat(null).st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mynull"]


@posix_only
def test_a_full_device_says_disk_full_and_stays_a_device(tmp_path):
    full = _char_device(tmp_path / "myfull", 7)
    with pytest.raises(FileWriteError, match="disk is full"):
        atomic_write(full, lambda fh: torch.save({"x": torch.zeros(100_000)}, fh))
    assert stat.S_ISCHR(os.lstat(full).st_mode)


@posix_only
def test_a_fifo_without_a_reader_is_refused_and_kept(tmp_path):
    fifo = tmp_path / "myfifo"
    os.mkfifo(fifo)
    with pytest.raises(FileWriteError, match="no program is reading") as info:
        atomic_write_bytes(fifo, b"x")
    assert "regular file" in info.value.fix
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["myfifo"]


@posix_only
def test_a_fifo_with_a_reader_gets_the_bytes(tmp_path):
    fifo = tmp_path / "myfifo"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as f:
            received.append(f.read())

    reader = threading.Thread(target=read)
    reader.start()
    while True:  # the reader must have the FIFO open before the write starts (pytest-timeout ends a hang)
        try:
            atomic_write_bytes(fifo, b"through the pipe")
            break
        except FileWriteError:
            assert reader.is_alive()
            time.sleep(0.01)
    reader.join(10)
    assert received == [b"through the pipe"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@posix_only
def test_a_socket_is_refused_and_kept(tmp_path):
    path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        for call in (lambda: atomic_write_bytes(path, b"x"), lambda: check_output_path(path)):
            with pytest.raises(FileWriteError, match="socket"):
                call()
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        server.close()


@posix_only
def test_a_symlink_to_a_device_writes_through(tmp_path):
    null = _char_device(tmp_path / "mynull", 3)
    link = tmp_path / "out.pt"
    link.symlink_to(null)
    atomic_write_bytes(link, b"discarded")
    assert link.is_symlink() and stat.S_ISCHR(os.lstat(null).st_mode)


# -- the output is one of the inputs ----------------------------------------------------------


def test_an_output_that_is_an_input_is_refused_by_inode(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    x = inputs / "x.pt"
    torch.save(torch.ones(3), x)
    before = x.read_bytes()
    other_spelling = tmp_path / "in" / ".." / "in" / "x.pt"
    hard = tmp_path / "hard.pt"
    os.link(x, hard)
    soft = tmp_path / "soft.pt"
    soft.symlink_to(x)
    for out in (x, other_spelling, hard, soft):
        with pytest.raises(FileWriteError, match="same file as the input") as info:
            check_output_path(out, ["resnet18", "DEFAULT", None, str(x)])
        assert "another output" in info.value.fix
    assert x.read_bytes() == before


def test_factory_and_weights_specs_name_their_files(tmp_path):
    factory = tmp_path / "models.py"
    factory.write_text("def build(): pass\n")
    weights = tmp_path / "w.pth"
    weights.write_bytes(b"w")
    with pytest.raises(FileWriteError, match="same file"):
        check_output_path(factory, [f"{factory}:build"])
    with pytest.raises(FileWriteError, match="same file"):
        check_output_path(weights, [f"file:{weights}"])
    other = tmp_path / "other.pt"
    other.write_bytes(b"o")
    assert check_output_path(other, [f"{factory}:build", str(weights), "resnet18"]) == other


# -- names too long -------------------------------------------------------------------------------


def test_a_name_too_long_is_refused_before_the_work(tmp_path):
    limit = fw._name_max(tmp_path)
    out = tmp_path / ("c" * (limit + 1) + ".pt")
    with pytest.raises(FileWriteError, match="shorter name") as info:
        check_output_path(out)
    assert str(limit) in info.value.problem
    with pytest.raises(FileWriteError, match="shorter name"):
        atomic_write_bytes(out, b"x")
    assert list(tmp_path.iterdir()) == []


def test_a_name_at_the_limit_is_written_with_a_shortened_temporary_name(tmp_path):
    limit = fw._name_max(tmp_path)
    out = tmp_path / ("é" * ((limit - 3) // 2) + ".pt")
    assert len(os.fsencode(out.name)) <= limit
    atomic_write_bytes(out, b"long name")
    assert out.read_bytes() == b"long name"
    assert len(os.fsencode(fw.temp_name(out.name, tmp_path))) <= limit
    assert _temps(tmp_path) == []


# -- temporary files ---------------------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@posix_only
def test_temporary_files_of_dead_processes_are_removed_by_the_next_save(tmp_path):
    stale = tmp_path / f".c.pt.gradexplorer-{_dead_pid()}-0123abcd.tmp"
    stale.write_bytes(b"left by a killed save")
    live = tmp_path / f".c.pt.gradexplorer-{os.getpid()}-89abcdef.tmp"
    live.write_bytes(b"another save, still running")
    unrelated = tmp_path / ".c.pt.other.tmp"
    unrelated.write_bytes(b"not ours")
    atomic_write_bytes(tmp_path / "c.pt", b"new")
    assert not stale.exists() and live.exists() and unrelated.exists()
    assert fw._TEMP_RE.match(fw.temp_name("c.pt", tmp_path))


# -- a full disk ------------------------------------------------------------------------------


def _keeps_the_old_file(tmp_path: Path, path: Path) -> None:
    assert path.read_bytes() == b"previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_disk_full_by_errno_says_how_much_was_needed(tmp_path):
    path = tmp_path / "c.pt"
    path.write_bytes(b"previous export")

    def write(fh):
        fh.write(b"x" * 5000)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(FileWriteError, match="disk is full") as info:
        atomic_write(path, write)
    assert "needs at least" in info.value.problem and "free" in info.value.problem
    _keeps_the_old_file(tmp_path, path)


class _FullAfter:
    """A file that fills up after ``room`` bytes, as a full disk does."""

    def __init__(self, fh, room: int) -> None:
        self.fh, self.room = fh, room

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if self.room < size:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= size
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def test_disk_full_inside_torch_save_is_recognised_by_errno(tmp_path):
    """torch's zip writer replaces the OSError with "unexpected pos N vs M"."""
    path = tmp_path / "c.pt"
    path.write_bytes(b"previous export")
    with pytest.raises(CaptureFileError, match="disk is full") as info:
        atomic_write(path, lambda fh: torch.save({"x": torch.zeros(100_000)}, _FullAfter(fh, 50_000)),
                     error=CaptureFileError)
    assert "needs at least" in info.value.problem
    _keeps_the_old_file(tmp_path, path)


def test_torchs_message_without_errno_is_recognised_by_free_space(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    path.write_bytes(b"previous export")

    def write(fh):
        fh.write(b"x" * 100)
        raise RuntimeError(TORCH_DISK_FULL)

    monkeypatch.setattr(fw, "_free_bytes", lambda folder: 4096)
    with pytest.raises(FileWriteError, match="disk is full"):
        atomic_write(path, write)
    _keeps_the_old_file(tmp_path, path)
    # The same message with room to spare is not called a full disk.
    monkeypatch.setattr(fw, "_free_bytes", lambda folder: 10 << 30)
    with pytest.raises(FileWriteError, match="Cannot write") as info:
        atomic_write(path, write)
    assert "disk is full" not in info.value.problem
    _keeps_the_old_file(tmp_path, path)


def test_an_output_larger_than_the_free_space_is_refused_before_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(fw, "_free_bytes", lambda folder: 1 << 20)
    with pytest.raises(FileWriteError, match=r"needs about 2\.0 MiB") as info:
        check_free_space(tmp_path / "c.pt", 2 << 20)
    assert "1.0 MiB free" in info.value.problem
    check_free_space(tmp_path / "c.pt", 1 << 19)
    written: list[int] = []
    with pytest.raises(FileWriteError, match="needs about"):
        atomic_write(tmp_path / "c.pt", lambda fh: written.append(1), expected_size=2 << 20)
    assert written == [] and list(tmp_path.iterdir()) == []


def test_permission_errors_name_the_folder(tmp_path, monkeypatch):
    def refuse(folder, name, slot=None):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(fw, "_open_temp", refuse)
    with pytest.raises(FileWriteError, match="permission denied"):
        atomic_write_bytes(tmp_path / "c.pt", b"x")


# -- interrupted saves --------------------------------------------------------------------------


def test_ctrl_c_inside_torch_save_is_an_interrupted_save(tmp_path):
    """torch wraps a KeyboardInterrupt raised by the file in a RuntimeError."""
    path = tmp_path / "c.pt"
    path.write_bytes(b"previous export")

    class Interrupted:
        def __init__(self, fh):
            self.fh, self.calls = fh, 0

        def write(self, data):
            self.calls += 1
            if self.calls == 3:
                raise KeyboardInterrupt
            return self.fh.write(data)

        def flush(self):
            self.fh.flush()

    with pytest.raises(SaveInterrupted, match="nothing was saved"):
        atomic_write(path, lambda fh: torch.save({"x": torch.zeros(1000)}, Interrupted(fh)))
    _keeps_the_old_file(tmp_path, path)


@posix_only
@pytest.mark.parametrize("signum", [pytest.param(2, id="SIGINT"), pytest.param(15, id="SIGTERM")])
def test_a_signal_whose_exception_the_writer_swallowed_still_saves_nothing(tmp_path, signum):
    """The handler's exception can be lost on its way out (an ``except BaseException`` in the
    writer, a finalizer running when the signal came): the write then ends normally, and
    must still not become a save."""
    path = tmp_path / "c.pt"
    path.write_bytes(b"previous export")

    def write(fh):
        fh.write(b"first half, ")
        try:
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the handler runs here (or in the line above) and raises
        except KeyboardInterrupt:
            pass
        fh.write(b"second half")

    with pytest.raises(SaveInterrupted, match="nothing was saved") as info:
        atomic_write(path, write)
    assert info.value.signal_name == signal.Signals(signum).name
    _keeps_the_old_file(tmp_path, path)


# A capture whose save holds at its third write of the file, for up to a minute, and says so
# on stdout: the test sends its signal then, while the file is being written. The save must
# not end by itself: on a loaded machine the test's process can pause for over a second
# between seeing the save start and sending the signal, a save that ended meanwhile exits 0,
# and Popen.send_signal skips a process that has exited. Waiting for the temporary file
# instead would let the signal land before the hold, and the cleanup's own writes then reach
# the hold with no signal to end it.
SLOW_CAPTURE = textwrap.dedent(
    """
    import sys, time, torch
    real_save = torch.save

    class Slow:
        def __init__(self, fh):
            self.fh = fh
            self.writes = 0
        def write(self, data):
            self.writes += 1
            if self.writes == 3:
                print("holding", flush=True)
                # Short sleeps: a signal delivered to another thread does not cut a sleep
                # short, and the main thread runs its handler only between them.
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    time.sleep(0.01)
            return self.fh.write(data)
        def flush(self):
            self.fh.flush()

    torch.save = lambda obj, fh, *a, **k: real_save(obj, Slow(fh), *a, **k)
    from gradexplorer_app.cli.main import main
    sys.exit(main(["capture", "--model", "demo:shapes", "--stats-only", "--out", sys.argv[1], "-q"]))
    """
)


def _start_slow_capture(out: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen([sys.executable, "-c", SLOW_CAPTURE, str(out)], cwd=out.parent, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_hold(proc: subprocess.Popen, folder: Path) -> list[str]:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "" when the process ended (pytest-timeout ends a hang)
    assert line == "holding\n", (line, proc.communicate())
    return _temps(folder)


@pytest.mark.slow
@posix_only
@pytest.mark.parametrize("signum", [pytest.param(2, id="SIGINT"), pytest.param(15, id="SIGTERM")])
def test_a_signal_during_the_save_leaves_nothing_and_exits_130(tmp_path, signum):
    out = tmp_path / "cap.pt"
    proc = _start_slow_capture(out)
    _wait_for_hold(proc, tmp_path)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "nothing was saved" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@posix_only
def test_a_killed_save_leaves_a_recognisable_temporary_file_that_the_next_save_removes(tmp_path):
    out = tmp_path / "cap.pt"
    proc = _start_slow_capture(out)
    (left,) = _wait_for_hold(proc, tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert fw._TEMP_RE.match(left) and left.startswith(".cap.pt.gradexplorer-")
    assert (tmp_path / left).exists() and not out.exists()
    atomic_write_bytes(tmp_path / "other.csv", b"a\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.csv"]


# torch.save's zip writer finishes its archive in its context's exit; when that never ran
# (Ctrl+C landing in the exit, before its call), the C++ destructor does it, when the
# exception's frames are freed, after atomic_write closed the file. An exception there was
# std::terminate: a CI run's Ctrl+C during a save exited -6 ("write to closed file"), not 130.
DESTRUCTOR_WRITE = """
import sys
import torch
import torch.serialization as ts
import gradexplorer.base.file_write as fw
from gradexplorer.base.file_write import SaveInterrupted, atomic_write

def interrupted_exit(self, *args):
    raise SaveInterrupted("SIGINT")  # the signal's handler, before write_end_of_file

ts._open_zipfile_writer_buffer.__exit__ = interrupted_exit
closed_writes = [0]
plain = fw._Sink.write

def write(self, data):
    closed_writes[0] += self._fh.closed
    return plain(self, data)

fw._Sink.write = write
try:
    atomic_write(sys.argv[1], lambda f: torch.save({"x": torch.zeros(100_000)}, f))
except SaveInterrupted:
    pass  # leaving this block frees the writer: its destructor writes the end of the archive
print("writes after the close:", closed_writes[0])
"""


@pytest.mark.slow
def test_torch_finishing_its_archive_after_an_interrupted_save_does_not_abort(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", DESTRUCTOR_WRITE, str(tmp_path / "cap.pt")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) > 0  # the destructor did write, into the closed file
    assert list(tmp_path.iterdir()) == []


# -- round three: folders as inputs, a signal while the temporary file is created, advice --------


def test_a_folder_input_stands_for_every_file_in_it(tmp_path):
    pictures = tmp_path / "imgs"
    pictures.mkdir()
    picture = pictures / "im1.png"
    picture.write_bytes(b"\x89PNG picture")
    linked = tmp_path / "elsewhere.png"
    os.link(picture, linked)
    for out in (picture, linked):
        with pytest.raises(FileWriteError, match="same file as the input") as info:
            check_output_path(out, [str(pictures)])
        assert "im1.png" in info.value.problem
    assert picture.read_bytes() == b"\x89PNG picture"
    (tmp_path / "new.png").write_bytes(b"other")
    assert check_output_path(tmp_path / "new.png", [str(pictures)]) == tmp_path / "new.png"


@posix_only
@pytest.mark.parametrize("signum", [pytest.param(2, id="SIGINT"), pytest.param(15, id="SIGTERM")])
def test_a_signal_right_after_the_temporary_file_is_created_leaves_nothing(tmp_path, monkeypatch, signum):
    """The signal arrives once os.open has created the file, before its path is returned."""
    import signal as signal_module

    real_open = os.open

    def open_then_signal(path, flags, *args):
        fd = real_open(path, flags, *args)
        if fw.TEMP_MARK in os.fspath(path):
            signal_module.raise_signal(signum)
        return fd

    monkeypatch.setattr(fw.os, "open", open_then_signal)
    out = tmp_path / "c.pt"
    out.write_bytes(b"previous")
    with pytest.raises(SaveInterrupted, match="nothing was saved"):
        atomic_write_bytes(out, b"new contents")
    assert out.read_bytes() == b"previous"
    assert _temps(tmp_path) == []


@pytest.mark.parametrize("name, capture_advice", [("table.csv", False), ("plot.png", False), ("c.pt", True)])
def test_disk_full_advice_fits_the_kind_of_output(tmp_path, monkeypatch, name, capture_advice):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fw.os, "fsync", full)
    with pytest.raises(FileWriteError, match="disk is full") as info:
        atomic_write_bytes(tmp_path / name, b"x" * 100)
    assert ("statistics-only capture" in info.value.fix) == capture_advice
    assert _temps(tmp_path) == []
