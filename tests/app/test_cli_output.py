"""`gradexplorer capture --out`: refused before anything runs when it would destroy a file or
cannot be written; special files are never replaced (gradexplorer.base.file_write)."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from gradexplorer_app.cli.main import main

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX special files")


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(code: int, err: str, *words: str) -> None:
    assert code == 1, err
    assert err.splitlines()[-1].startswith("error: ") and "Traceback" not in err, err
    for word in words:
        assert word in err, err


@pytest.fixture
def no_capture(monkeypatch):
    """Fails the test if a model is loaded: the refusals come before any work."""
    import gradexplorer.models

    def forbidden(*a, **k):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(gradexplorer.models, "load_model", forbidden)


def test_out_same_as_input_is_refused_and_the_input_kept(tmp_path, capsys, no_capture):
    x = tmp_path / "x.pt"
    torch.save(torch.randn(4, 10), x)
    before = x.read_bytes()
    link = tmp_path / "link.pt"
    link.symlink_to(x)
    for out in (x, link, tmp_path / "." / "x.pt"):
        code, _, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--input", x, "--out", out)
        assert_refused(code, err, "same file as the input", "another output")
    assert x.read_bytes() == before


def test_out_same_as_the_weights_or_the_model_is_refused(tmp_path, capsys, no_capture):
    weights = tmp_path / "w.pth"
    weights.write_bytes(b"not read")
    code, _, err = run(capsys, "capture", "--model", "resnet18", "--weights", weights, "--random",
                       "--out", weights)
    assert_refused(code, err, "same file")
    factory = tmp_path / "mine.py"
    factory.write_text("def build(): pass\n")
    code, _, err = run(capsys, "capture", "--model", f"{factory}:build", "--trust", "--random", "--out", factory)
    assert_refused(code, err, "same file")
    assert weights.read_bytes() == b"not read" and factory.read_text() == "def build(): pass\n"


def test_out_folder_and_long_name_are_refused_before_the_capture(tmp_path, capsys, no_capture):
    code, _, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--out", tmp_path)
    assert_refused(code, err, "is a folder")
    code, _, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--out", tmp_path / ("n" * 300 + ".pt"))
    assert_refused(code, err, "shorter name")
    assert list(tmp_path.iterdir()) == []


@posix_only
def test_out_fifo_without_reader_and_socket_are_refused_and_kept(tmp_path, capsys):
    fifo = tmp_path / "myfifo"
    os.mkfifo(fifo)
    code, _, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--out", fifo, "-q")
    assert_refused(code, err, "no program is reading")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@posix_only
def test_out_to_a_private_null_device_writes_through(tmp_path, capsys):
    null = tmp_path / "mynull"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    code, out, err = run(capsys, "capture", "--model", "demo:seed-mlp", "--out", null, "-q")
    assert code == 0, err
    assert stat.S_ISCHR(os.lstat(null).st_mode) and os.lstat(null).st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mynull"]


def test_an_estimate_larger_than_the_free_space_stops_before_the_capture(tmp_path, capsys, monkeypatch):
    import gradexplorer.capturing.capture

    def forbidden(*a, **k):
        raise AssertionError("the capture ran")

    monkeypatch.setattr(gradexplorer.capturing.capture, "capture", forbidden)
    monkeypatch.setattr(gradexplorer.base.file_write, "_free_bytes", lambda folder: 1000)
    code, _, err = run(capsys, "capture", "--model", "demo:shapes", "--out", tmp_path / "c.pt")
    assert_refused(code, err, "needs about", "1000 B free", "disk")
    assert list(tmp_path.iterdir()) == []
