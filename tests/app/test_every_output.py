"""Every output option of the command line, onto its own input (as given, through a
symbolic link, through a hard link), a FIFO without a reader, a folder, and a full disk:
refused with one message, or written whole; the input, the FIFO and an older output stay as
they were, and no temporary file is left. Special files are private nodes in a temporary
folder; the full disk is ENOSPC from ``fsync`` (the writer's last step before the rename).
``tests/app/test_output_paths.py`` holds the window's exports and screenshots."""

from __future__ import annotations

import errno
import os
import sys
import types
from pathlib import Path

import pytest
import torch

import gradexplorer.base.file_write as fw
from gradexplorer_app.cli.main import main
from tests.app.test_cli_watch import make_log
from tests.capture_mutations import save, valid_capture_dict
from tests.picture_folders import write_pictures

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX links and FIFOs")

#: (name, argv with {in} for the input file and {out} for the output, the output's suffix,
#: the kinds of target tried). {cap}, {log}, {x}, {imgs}, {b} are the inputs made below.
OPTIONS = [
    ("capture --out", ["capture", "--model", "demo:seed-mlp", "--input", "{x}", "--out", "{out}", "-q"], "{x}", ".pt"),
    ("dataset --out", ["capture", "--model", "demo:shapes", "--input", "{imgs}", "--batch-size", "1",
                       "--stats-only", "--out", "{out}", "-q"], "{imgs}/img0.png", ".pt"),
    ("graph --out", ["graph", "--capture", "{cap}", "--out", "{out}"], "{cap}", ".svg"),
    ("diff --csv", ["diff", "{cap}", "{b}", "--csv", "{out}", "-q"], "{b}", ".csv"),
    ("inspect LOG --csv", ["inspect", "{log}", "--csv", "{out}"], "{log}", ".csv"),
    ("inspect CAPTURE --csv", ["inspect", "{cap}", "--csv", "{out}"], "{cap}", ".csv"),
    ("--screenshot", ["{cap}", "--screenshot", "{out}"], "{cap}", ".png"),
    ("timeline --screenshot", ["timeline", "{log}", "--screenshot", "{out}"], "{log}", ".png"),
]
#: Outputs written at the end of the command's own work (the screenshots are written by the
#: window, tested with it; a capture's token CSV needs a text capture).
WRITTEN = {"capture --out", "dataset --out", "graph --out", "diff --csv", "inspect LOG --csv"}


@pytest.fixture(scope="module")
def valid() -> dict:
    return valid_capture_dict()


@pytest.fixture
def inputs(tmp_path, valid, monkeypatch):
    """The input files, and the windows replaced (a screenshot's refusal comes before one opens)."""
    folder = tmp_path / "in"
    folder.mkdir()
    x = folder / "x.pt"
    torch.save(torch.randn(2, 10), x)
    cap = save(valid, folder / "cap.pt")
    b = save(valid, folder / "b.pt")
    log = folder / "run.gxw"
    make_log(log, nan_at=99, steps=2)
    (folder / "imgs").mkdir()
    imgs = write_pictures(folder / "imgs", 2)
    for name, attr in (("launch", "launch"), ("timeline_window", "launch_timeline")):
        module = types.ModuleType(f"gradexplorer_app.window.{name}")
        setattr(module, attr, lambda *a, **k: pytest.fail("a window opened"))
        monkeypatch.setitem(sys.modules, f"gradexplorer_app.window.{name}", module)
    return {"x": x, "cap": cap, "b": b, "log": log, "imgs": imgs}


def _run(capsys, argv: list[str], files: dict, out: Path) -> tuple[int, str]:
    code = main([a.format(out=out, **files) for a in argv])
    return code, capsys.readouterr().err


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def _refused(code: int, err: str, *words: str) -> None:
    assert code in (1, 2), err
    said = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(said) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in said[0], err


def _no_temporary_files(folder: Path) -> None:
    assert [p.name for p in folder.rglob("*") if fw.TEMP_MARK in p.name] == []


@pytest.mark.parametrize("name, argv, target, suffix", OPTIONS, ids=[o[0] for o in OPTIONS])
def test_onto_its_own_input_or_a_link_to_it(tmp_path, capsys, inputs, name, argv, target, suffix):
    source = Path(target.format(**inputs))
    soft = tmp_path / f"soft{suffix}"
    soft.symlink_to(source)
    hard = tmp_path / f"hard{suffix}"
    os.link(source, hard)
    before = _snapshot(tmp_path / "in")
    for out in (source, soft, hard):
        code, err = _run(capsys, argv, inputs, out)
        _refused(code, err)
        assert "same file as the input" in err or (out == source and suffix != source.suffix), err
        assert _snapshot(tmp_path / "in") == before
    assert soft.is_symlink() and hard.read_bytes() == source.read_bytes()
    _no_temporary_files(tmp_path)


@pytest.mark.parametrize("name, argv, target, suffix", OPTIONS, ids=[o[0] for o in OPTIONS])
def test_onto_a_folder(tmp_path, capsys, inputs, name, argv, target, suffix):
    folder = tmp_path / f"out{suffix}"
    folder.mkdir()
    code, err = _run(capsys, argv, inputs, folder)
    _refused(code, err, "is a folder")
    assert folder.is_dir() and list(folder.iterdir()) == []


@pytest.mark.parametrize("name, argv, target, suffix", [o for o in OPTIONS if o[0] in WRITTEN],
                         ids=[o[0] for o in OPTIONS if o[0] in WRITTEN])
def test_onto_a_fifo_without_a_reader(tmp_path, capsys, inputs, name, argv, target, suffix):
    fifo = tmp_path / f"pipe{suffix}"
    os.mkfifo(fifo)
    code, err = _run(capsys, argv, inputs, fifo)
    _refused(code, err, "no program is reading")
    assert fifo.is_fifo()
    _no_temporary_files(tmp_path)


@pytest.mark.parametrize("name, argv, target, suffix", [o for o in OPTIONS if o[0] in WRITTEN],
                         ids=[o[0] for o in OPTIONS if o[0] in WRITTEN])
def test_on_a_full_disk_the_older_output_stays(tmp_path, capsys, inputs, monkeypatch, name, argv, target, suffix):
    old = tmp_path / f"old{suffix}"
    old.write_bytes(b"the previous output")
    before = _snapshot(tmp_path / "in")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fw.os, "fsync", full)
    code, err = _run(capsys, argv, inputs, old)
    _refused(code, err, "disk is full")
    assert old.read_bytes() == b"the previous output" and _snapshot(tmp_path / "in") == before
    _no_temporary_files(tmp_path)


@pytest.mark.parametrize("name, argv, target, suffix", [o for o in OPTIONS if o[0] in WRITTEN],
                         ids=[o[0] for o in OPTIONS if o[0] in WRITTEN])
def test_elsewhere_it_is_written_whole(tmp_path, capsys, inputs, name, argv, target, suffix):
    out = tmp_path / f"new{suffix}"
    code, err = _run(capsys, argv, inputs, out)
    assert code in (0, 1) and "error" not in err, err  # diff: 1 when the captures differ
    assert out.stat().st_size > 0
    _no_temporary_files(tmp_path)


def test_the_watch_log_onto_files_it_does_not_own(tmp_path, inputs):
    """``watch(out=...)`` writes only its own logs: a capture, a link to one, a symbolic link,
    a FIFO, a folder or a device is refused, and left as it was (a full disk: the watch's
    own test, tests/core/test_watch_log_check.py)."""
    import stat

    from gradexplorer.base.errors import GradExplorerError
    from gradexplorer.recording.watch_log import WatchLogWriter

    hard = tmp_path / "hard.gxw"
    os.link(inputs["cap"], hard)
    soft = tmp_path / "soft.gxw"
    soft.symlink_to(inputs["log"])
    fifo = tmp_path / "pipe.gxw"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.gxw"
    folder.mkdir()
    targets = [inputs["cap"], hard, soft, fifo, folder]
    null = tmp_path / "null.gxw"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        targets.append(null)
    except PermissionError:
        pass  # making a device node needs root (CAP_MKNOD)
    before = _snapshot(tmp_path / "in")
    for target in targets:
        with pytest.raises(GradExplorerError) as info:
            WatchLogWriter(target)
        assert "not a watch log" in info.value.problem or "not a regular file" in info.value.problem, target
    assert _snapshot(tmp_path / "in") == before
    assert soft.is_symlink() and fifo.is_fifo() and folder.is_dir()
    assert not null.exists() or stat.S_ISCHR(os.lstat(null).st_mode)
