"""Every output option besides ``--out`` (``inspect --csv``, ``--screenshot`` of the window and
of the timeline, the window's exports) is refused or written whole: never over its own
input (nor a symbolic or hard link to it), a folder, a FIFO without a reader; a full disk
leaves the existing file as it was. Special files are private nodes in a temporary folder."""

from __future__ import annotations

import errno
import os
import sys
import types

import pytest

import gradexplorer.base.file_write as fw
from gradexplorer_app.cli.main import main
from tests.app.test_cli_watch import make_log
from tests.picture_folders import write_pictures

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX special files")


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(code: int, err: str, *words: str) -> None:
    assert code == 1, err
    assert err.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def links_to(path, folder):
    """The path itself, another spelling, a symbolic link and a hard link to it."""
    soft = folder / f"soft{path.suffix}"
    soft.symlink_to(path)
    hard = folder / f"hard{path.suffix}"
    os.link(path, hard)
    return [path, folder / "." / path.name, soft, hard]


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "run.gxw"
    make_log(path, nan_at=99, steps=2)
    return path


@pytest.fixture
def fake_gui(monkeypatch):
    """The window replaced: a refusal must come before it opens."""
    calls = []
    module = types.ModuleType("gradexplorer_app.window.launch")
    module.launch = lambda options=None, **kwargs: calls.append(kwargs) or 0
    monkeypatch.setitem(sys.modules, "gradexplorer_app.window.launch", module)
    return calls


@pytest.fixture
def fake_timeline(monkeypatch):
    calls = []
    module = types.ModuleType("gradexplorer_app.window.timeline_window")
    module.launch_timeline = lambda *args: calls.append(args) or 0
    monkeypatch.setitem(sys.modules, "gradexplorer_app.window.timeline_window", module)
    return calls


# -- inspect --csv ------------------------------------------------------------------------------


def test_inspect_csv_onto_its_own_log_or_a_link_to_it_is_refused(tmp_path, capsys, log):
    before = log.read_bytes()
    for out in links_to(log, tmp_path):
        code, _out, err = run(capsys, "inspect", log, "--csv", out)
        assert_refused(code, err, "same file as the input", "another output")
    assert log.read_bytes() == before
    code, _out, err = run(capsys, "inspect", tmp_path / "hard.gxw", "--csv", log)
    assert_refused(code, err, "same file as the input")
    assert log.read_bytes() == before


def test_inspect_csv_onto_a_folder_is_refused(tmp_path, capsys, log):
    (tmp_path / "out").mkdir()
    code, _out, err = run(capsys, "inspect", log, "--csv", tmp_path / "out")
    assert_refused(code, err, "is a folder")


@posix_only
def test_inspect_csv_onto_a_fifo_without_a_reader_is_refused_and_kept(tmp_path, capsys, log):
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    code, _out, err = run(capsys, "inspect", log, "--csv", fifo)
    assert_refused(code, err, "no program is reading")
    assert fifo.is_fifo()


def test_inspect_csv_on_a_full_disk_keeps_the_old_csv(tmp_path, capsys, log, monkeypatch):
    csv = tmp_path / "run.csv"
    csv.write_text("the previous export\n")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fw.os, "fsync", full)
    code, _out, err = run(capsys, "inspect", log, "--csv", csv)
    assert_refused(code, err, "disk is full")
    assert "statistics-only" not in err
    assert csv.read_text() == "the previous export\n"
    assert [p.name for p in tmp_path.iterdir() if fw.TEMP_MARK in p.name] == []


# -- --screenshot, checked before the window opens ----------------------------------------------


def test_window_screenshot_onto_the_capture_it_opens_is_refused(tmp_path, capsys, fake_gui):
    cap = tmp_path / "cap.pt"
    assert main(["capture", "--model", "demo:seed-mlp", "--random", "2x10", "--stats-only", "--out",
                 str(cap), "-q"]) == 0
    capsys.readouterr()
    before = cap.read_bytes()
    for out in links_to(cap, tmp_path):
        code, _out, err = run(capsys, cap, "--screenshot", out)
        assert_refused(code, err, "same file as the input")
    assert fake_gui == [] and cap.read_bytes() == before


def test_window_screenshot_onto_an_input_picture_or_the_model_is_refused(tmp_path, capsys, fake_gui):
    (tmp_path / "imgs").mkdir()
    pictures = write_pictures(tmp_path / "imgs", 2)
    picture = pictures / "img0.png"
    before = picture.read_bytes()
    code, _out, err = run(capsys, "--model", "demo:shapes", "--input", pictures, "--screenshot", picture)
    assert_refused(code, err, "same file as the input", "img0.png")
    assert fake_gui == [] and picture.read_bytes() == before


def test_timeline_screenshot_onto_its_log_is_refused(tmp_path, capsys, log, fake_timeline):
    before = log.read_bytes()
    for out in links_to(log, tmp_path):
        code, _out, err = run(capsys, "timeline", log, "--screenshot", out)
        assert_refused(code, err, "same file as the input")
    (tmp_path / "shots").mkdir()
    code, _out, err = run(capsys, "timeline", log, "--screenshot", tmp_path / "shots")
    assert_refused(code, err, "is a folder")
    assert fake_timeline == [] and log.read_bytes() == before


# -- capture --input FOLDER --out a picture in it ----------------------------------------------


def test_capture_out_onto_a_picture_of_the_input_folder_is_refused(tmp_path, capsys):
    (tmp_path / "imgs").mkdir()
    pictures = write_pictures(tmp_path / "imgs", 2)
    picture = pictures / "img1.png"
    before = picture.read_bytes()
    hard = tmp_path / "hard.png"
    os.link(picture, hard)
    for out in (picture, hard):
        code, _out, err = run(capsys, "capture", "--model", "demo:shapes", "--input", pictures, "--out", out, "-q")
        assert_refused(code, err, "same file as the input", "img1.png")
    assert picture.read_bytes() == before


# -- the window's writer: the PNG itself --------------------------------------------------------


@pytest.fixture
def widget(qtbot):
    from PySide6.QtWidgets import QLabel

    label = QLabel("a plot")
    qtbot.addWidget(label)
    label.resize(120, 60)
    return label


def test_save_screenshot_writes_a_whole_png(tmp_path, widget):
    from gradexplorer_app.window.screenshot import save_screenshot

    out = tmp_path / "s.png"
    assert save_screenshot(widget, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@posix_only
def test_save_screenshot_onto_a_fifo_without_a_reader_is_refused_not_hung(tmp_path, widget, capsys):
    from gradexplorer_app.window.screenshot import save_screenshot

    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    assert not save_screenshot(widget, fifo)
    assert "no program is reading" in capsys.readouterr().err and fifo.is_fifo()


def test_save_screenshot_onto_a_folder_is_refused(tmp_path, widget, capsys):
    from gradexplorer_app.window.screenshot import save_screenshot

    assert not save_screenshot(widget, tmp_path)
    assert "is a folder" in capsys.readouterr().err


def test_save_screenshot_on_a_full_disk_keeps_the_old_png(tmp_path, widget, capsys, monkeypatch):
    from gradexplorer_app.window.screenshot import save_screenshot

    out = tmp_path / "s.png"
    out.write_bytes(b"the previous picture")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fw.os, "fsync", full)
    assert not save_screenshot(widget, out)
    assert "disk is full" in capsys.readouterr().err
    assert out.read_bytes() == b"the previous picture"


def test_save_screenshot_onto_the_file_shown_is_refused(tmp_path, widget, capsys, log):
    from gradexplorer_app.window.screenshot import save_screenshot

    before = log.read_bytes()
    assert not save_screenshot(widget, tmp_path / "." / log.name, [str(log)])
    assert "same file as the input" in capsys.readouterr().err and log.read_bytes() == before


# -- the window's exports: never over a file the window read ----------------------------------


@pytest.fixture
def opened(qtbot, window, shown_errors, tmp_path):
    """The window showing a capture opened from a file (with the model graph it carries)."""
    from tests.app.conftest import TIMEOUT
    from tests.capture_mutations import save, valid_capture_dict

    cap = save(valid_capture_dict(), tmp_path / "cap.pt")
    with qtbot.waitSignal(window.file_done, timeout=TIMEOUT) as done:
        window.open_capture(str(cap))
    assert done.args == ["open"]
    qtbot.waitUntil(lambda: window.graph_panel.graph_layout is not None, timeout=TIMEOUT)
    return window, cap


@pytest.mark.slow
def test_window_exports_onto_the_capture_it_opened_are_refused(qtbot, opened, shown_errors, tmp_path):
    from tests.app.conftest import TIMEOUT

    window, cap = opened
    before = cap.read_bytes()
    for out in links_to(cap, tmp_path):
        shown = len(shown_errors)
        window.export_png(str(out))
        window.export_csv(str(out))
        assert len(shown_errors) == shown + 2
        for _title, exc in shown_errors[shown:]:
            assert "same file as the input" in str(exc) and "cap.pt" in str(exc), str(exc)
        assert window.graph_panel.export(str(out)) is None
        assert "same file as the input" in window.graph_panel.status.text()
        with qtbot.waitSignal(window.file_done, timeout=TIMEOUT) as done:
            window.export_capture(str(out))
        assert done.args == ["failed"] and "same file as the input" in str(shown_errors[-1][1])
        assert cap.read_bytes() == before
    window.export_png(str(tmp_path / "plot.png"))  # and elsewhere, they are written
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert window.graph_panel.export(str(tmp_path / "graph.svg")) == str(tmp_path / "graph.svg")


@pytest.mark.slow
def test_window_exports_onto_an_input_picture_are_refused(qtbot, window, shown_errors, tmp_path):
    from tests.app.conftest import TIMEOUT

    (tmp_path / "imgs").mkdir()
    pictures = write_pictures(tmp_path / "imgs", 2)
    picture = pictures / "img0.png"
    before = picture.read_bytes()
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        window.load_model("demo:shapes", inputs=[str(pictures)], run=True)
    assert done.args == ["ok"], shown_errors
    hard = tmp_path / "hard.png"
    os.link(picture, hard)
    for out in (picture, hard):
        window.export_png(str(out))
        assert "same file as the input" in str(shown_errors[-1][1]) and "img0.png" in str(shown_errors[-1][1])
    assert picture.read_bytes() == before


@pytest.mark.slow
@posix_only
def test_window_export_onto_a_fifo_a_folder_or_a_full_disk_is_refused_and_kept(opened, shown_errors, tmp_path,
                                                                                 monkeypatch):
    window, _cap = opened
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    window.export_png(str(fifo))
    assert "no program is reading" in str(shown_errors[-1][1]) and fifo.is_fifo()
    window.export_csv(str(tmp_path))
    assert "is a folder" in str(shown_errors[-1][1])
    old = tmp_path / "stats.csv"
    old.write_text("the previous export\n")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fw.os, "fsync", full)
    window.export_csv(str(old))
    assert "disk is full" in str(shown_errors[-1][1]) and old.read_text() == "the previous export\n"
    assert [p.name for p in tmp_path.iterdir() if fw.TEMP_MARK in p.name] == []


def test_compare_window_export_onto_a_compared_capture_is_refused(qtbot, shown_errors, tmp_path):
    from gradexplorer_app.window.compare_window import CompareWindow
    from tests.app.conftest import TIMEOUT
    from tests.capture_mutations import save, valid_capture_dict

    a = save(valid_capture_dict(), tmp_path / "a.pt")
    b = tmp_path / "b.pt"
    b.write_bytes(a.read_bytes())
    w = CompareWindow(None)
    qtbot.addWidget(w)
    with qtbot.waitSignal(w.runner.finished, timeout=TIMEOUT):
        w.compare_files(str(a), str(b))
    before = b.read_bytes()
    for out in links_to(b, tmp_path):
        assert w.export_csv(str(out)) is None
        assert "same file as the input" in str(shown_errors[-1][1]), shown_errors[-1]
    qtbot.waitUntil(lambda: w.graph_panel.graph_layout is not None, timeout=TIMEOUT)
    assert w.graph_panel.export(str(a)) is None and "same file as the input" in w.graph_panel.status.text()
    assert b.read_bytes() == before and a.read_bytes() == before
    assert w.export_csv(str(tmp_path / "c.csv")) is not None


def test_timeline_exports_onto_the_file_shown_are_refused(qtbot, tmp_path, log):
    from gradexplorer_app.views.timeline_view import TimelineView
    from tests.app.conftest import TIMEOUT

    view = TimelineView(poll_ms=100)
    qtbot.addWidget(view)
    view.resize(1000, 700)
    with qtbot.waitSignal(view.updated, timeout=TIMEOUT):
        view.open_log(str(log))
    before = log.read_bytes()
    for out in links_to(log, tmp_path):
        assert view.export_png(str(out)) is None
        assert "same file as the input" in view.status.text()
        assert view.export_csv(str(out)) is None
        assert "same file as the input" in view.status.text()
    view.shutdown()
    assert log.read_bytes() == before
