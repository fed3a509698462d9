"""A watch log is checked before it is read (gradexplorer.recording.watch_log_check), and the
watch writes only its own logs, one writer at a time (gradexplorer.recording.watch_log)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.recording.timeline import read_timeline
from gradexplorer.recording.watch_log import WatchLogWriter, is_watch_log, open_log, read_meta
from gradexplorer.recording.watch_log_check import WatchLogError, json_depth
from gradexplorer_app.cli import common
from gradexplorer_app.cli.main import main
from tests.app.test_cli_watch import make_log

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "run.gxw"
    make_log(path, nan_at=99, steps=3)
    return path


def edit(path: Path, *statements: str) -> None:
    con = sqlite3.connect(path)
    for sql in statements:
        con.execute(sql)
    con.commit()
    con.close()


def refused(capsys, log: Path, *words: str) -> None:
    """Refused by open_log with a WatchLogError naming ``words``, and by inspect with exit 1."""
    with pytest.raises(WatchLogError) as info:
        open_log(log)
    for word in words:
        assert word in info.value.problem, info.value.problem
    code = main(["inspect", str(log)])
    _out, err = capsys.readouterr()
    assert code == common.EXIT_USER, err
    assert err.startswith("error: ") and "Traceback" not in err and all(w in err for w in words), err


def test_a_dropped_steps_table_is_named(log, capsys):
    edit(log, "DROP TABLE steps")
    refused(capsys, log, "'steps'", "missing")


def test_text_in_a_numeric_column_is_named(log, capsys):
    edit(log, "UPDATE stats SET min = 'lots' WHERE rowid = 2")
    refused(capsys, log, "'stats'", "'min'", "not numbers", "1 row")


def test_text_in_a_step_column_is_named(log, capsys):
    edit(log, "UPDATE steps SET step = 'one' WHERE step = 1")
    refused(capsys, log, "'steps'", "'step'")


def test_a_count_beyond_int64_sums_is_named(log, capsys):
    edit(log, "UPDATE stats SET numel = 9223372036854775807 WHERE rowid = 1")
    refused(capsys, log, "'stats'", "'numel'")


def test_an_odd_length_histogram_blob_is_named(log, capsys):
    edit(log, "UPDATE stats SET hist = X'0102030405' WHERE rowid = 3")
    refused(capsys, log, "'stats'", "'hist'", "int64")


def test_a_negative_histogram_count_is_named(log, capsys):
    """The timeline draws log10(1 + count): a negative count drew NaN into the picture."""
    edit(log, "UPDATE stats SET hist = X'0500000000000000ffffffffffffffff', hist_lo = 3 WHERE rowid = 2")
    refused(capsys, log, "'stats'", "'hist'", "non-negative", "1 row")


def test_a_histogram_past_the_last_bin_is_named(log, capsys):
    edit(log, "UPDATE stats SET hist_lo = 60000 WHERE rowid = 3")
    refused(capsys, log, "'stats'", "'hist_lo'")


def test_deeply_nested_json_in_meta_is_refused_without_recursion(log, capsys):
    deep = "[" * 100_000 + "]" * 100_000
    edit(log, f"INSERT OR REPLACE INTO meta VALUES ('layers', '{deep}')")
    refused(capsys, log, "'meta'", "'value'", "nested deeper")
    assert json_depth('{"a": ["[[[", [1, [2]]]}') == 4


def test_a_malformed_database_is_a_message(log, capsys):
    data = bytearray(log.read_bytes())
    for offset in range(4096, len(data), 4096):  # every page after the first, scribbled over
        data[offset + 8: offset + 200] = b"\xa5" * 192
    log.write_bytes(bytes(data))
    with pytest.raises(GradExplorerError):
        open_log(log)
    code = main(["inspect", str(log)])
    _out, err = capsys.readouterr()
    assert code == common.EXIT_USER and err.startswith("error: ") and "Traceback" not in err, err


def test_a_sound_log_reads_and_a_growing_one_is_checked_in_its_new_rows(log):
    con = open_log(log)
    try:
        assert read_meta(con)["format"] == "gradexplorer-watch"
    finally:
        con.close()
    assert read_timeline(log).steps.tolist() == [0, 1, 2]


# -- the watch owns only its own files ---------------------------------------------------------


def test_another_programs_sqlite_database_is_refused_and_left_as_it_was(tmp_path):
    users = tmp_path / "users.db"
    edit(users, "CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT)", "INSERT INTO users VALUES (1, 'ada')")
    before = users.read_bytes()
    with pytest.raises(GradExplorerError, match="not a gradexplorer watch log") as info:
        WatchLogWriter(users)
    assert "users" in info.value.problem and "new file name" in info.value.fix
    assert users.read_bytes() == before
    con = sqlite3.connect(users)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert [n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["users"]
    con.close()


def test_a_file_that_is_not_sqlite_is_refused_and_kept(tmp_path):
    cap = tmp_path / "cap.pt"
    cap.write_bytes(b"PK\x03\x04 a capture")
    with pytest.raises(GradExplorerError, match="not an SQLite file"):
        WatchLogWriter(cap)
    assert cap.read_bytes() == b"PK\x03\x04 a capture"


def test_the_watch_appends_to_its_own_log(log):
    WatchLogWriter(log).close()
    assert read_timeline(log).steps.tolist() == [0, 1, 2]


def test_a_second_writer_on_a_log_being_written_is_refused(tmp_path):
    path = tmp_path / "run.gxw"
    first = WatchLogWriter(path)
    try:
        with pytest.raises(GradExplorerError, match="being written by another watch") as info:
            WatchLogWriter(path)
        assert f"process {os.getpid()}" in info.value.problem and "own file" in info.value.fix
    finally:
        first.close()
    WatchLogWriter(path).close()  # free again once the first one closed


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="advisory locks")
def test_a_second_process_watching_into_the_same_log_is_refused(tmp_path):
    path = tmp_path / "run.gxw"
    first = WatchLogWriter(path)
    try:
        code = ("import sys\nfrom gradexplorer.recording.watch_log import WatchLogWriter\n"
                "try:\n    WatchLogWriter(sys.argv[1])\nexcept Exception as e:\n    print(e.problem)\n")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                              timeout=120, env=env)
        assert "being written by another watch" in done.stdout, done.stdout + done.stderr
    finally:
        first.close()


# -- reading where nothing can be written --------------------------------------------------------


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` made read-only: by mode, or for root (whom modes do not stop) immutable."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a folder read-only for root here (chattr +i)")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(folder)], capture_output=True)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_a_wal_log_in_a_read_only_folder_opens(tmp_path, capsys):
    folder = tmp_path / "shared"
    folder.mkdir()
    log = folder / "run.gxw"
    make_log(log, nan_at=99, steps=3)
    assert not (folder / "run.gxw-shm").exists()
    with read_only(folder):
        with pytest.raises(OSError):
            (folder / "probe").write_text("x")
        assert read_timeline(log).steps.tolist() == [0, 1, 2]
        code = main(["inspect", str(log)])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "3 watched" in out


# -- sniffing a file ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="FIFOs")
def test_inspect_on_a_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    assert not is_watch_log(fifo)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "gradexplorer", "inspect", str(fifo)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode in (1, 2), done.stderr
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr


def test_a_full_disk_during_a_watch_is_one_message_and_the_log_keeps_every_step_before(tmp_path, capsys):
    """SQLite's own "database or disk is full" (its page limit stands for the disk): the step
    that did not fit is said, the steps before it read whole, the hooks are off the model.
    The rollback after it once raised "no transaction is active" over the real error."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from gradexplorer.recording.watch import watch

    path = tmp_path / "run.gxw"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    done = []
    with pytest.raises(GradExplorerError) as info, watch(model, out=str(path), every=1) as w:
        for step in range(200):
            loss = F.cross_entropy(model(torch.randn(4, 6)), torch.tensor([0, 1, 2, 0]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.step(loss=loss)
            done.append(step)
            if step == 2:  # the disk fills up: no page more than the log has now
                con = w._writer.con
                con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                con.execute(f"PRAGMA max_page_count = {con.execute('PRAGMA page_count').fetchone()[0]}")
    assert info.value.problem.startswith("The disk is full"), info.value.problem
    assert f"could not take step {len(done)}" in info.value.problem and "before it are in the log" in info.value.problem
    assert "another disk" in info.value.fix
    assert 3 <= len(done) < 200
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert read_timeline(path).steps.tolist() == done
    assert main(["inspect", str(path)]) == 0
    assert f"{len(done)} watched" in capsys.readouterr().out
