"""The watch log survives SIGKILL and can be read while it is written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.recording.watch_log import (
    STAT_COLUMNS,
    WatchLogWriter,
    decode_hist,
    encode_hist,
    encode_hists,
    open_log,
    stats_row,
    stats_rows,
)
from gradexplorer.stats.merge import HIST_BINS, MergeStats

ROOT = Path(__file__).resolve().parents[2]


def start_writer(path: Path, steps: int, pause_s: float = 0.0, holds: tuple[int, ...] = ()) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "tests.core.watch_writer", str(path), str(steps), str(pause_s),
                             *map(str, holds)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_sigkill_leaves_every_completed_step(tmp_path):
    path = tmp_path / "run.gxw"
    proc = start_writer(path, 10**9)
    done = -1
    try:
        assert proc.stdout is not None
        while done < 5:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else "writer ended"
            done = int(line.split()[1])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        # Lines the writer printed before it died, not yet read by us.
        rest = proc.stdout.read()
        done = max([done] + [int(x.split()[1]) for x in rest.splitlines() if x.startswith("done")])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    con = open_log(path)
    steps = [r[0] for r in con.execute("SELECT step FROM steps ORDER BY step")]
    per_step = dict(con.execute("SELECT step, COUNT(*) FROM stats GROUP BY step").fetchall())
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    # Every step that was reported done is there, whole; at most the one in flight beyond.
    assert steps[: done + 1] == list(range(done + 1))
    assert len(steps) <= done + 2
    assert len({per_step[s] for s in steps}) == 1  # no half-written step


@pytest.mark.slow
def test_reader_sees_steps_while_the_writer_writes(tmp_path):
    path = tmp_path / "live.gxw"
    # A pause after each step: a writer that made all 40 between two polls (once the
    # reader's process was slower to start than the writer's) left one count seen mid-way.
    # The writer also waits after steps 9 and 24 until the reader has read: two counts
    # mid-way are seen however long the reader's process is paused between polls.
    proc = start_writer(path, 40, pause_s=0.05, holds=(9, 24))
    seen: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            held = list(tmp_path.glob("live.gxw.hold-*"))  # listed before the read: seen in it
            if path.exists():
                try:
                    con = open_log(path)
                except GradExplorerError:
                    time.sleep(0.05)  # created, meta not committed yet
                    continue
                n = con.execute("SELECT COUNT(*) FROM steps").fetchone()[0]
                rows = con.execute("SELECT COUNT(*) FROM stats").fetchone()[0]
                con.close()
                assert rows >= n  # a step is visible only with its rows
                if not seen or n != seen[-1]:
                    seen.append(n)
                for hold in held:
                    hold.unlink()
            if proc.poll() is not None:
                break
            time.sleep(0.02)
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert seen == sorted(seen)
    assert {10, 25} <= set(seen)  # read mid-way, at least at the writer's two holds
    con = open_log(path)
    assert con.execute("SELECT COUNT(*) FROM steps").fetchone()[0] == 40
    con.close()


def test_hist_encoding_round_trip():
    h = np.zeros(HIST_BINS, dtype=np.int64)
    h[[3, 100, 200]] = [5, 1, 2**40]
    lo, blob = encode_hist(h)
    assert lo == 3 and len(blob) == 8 * 198
    np.testing.assert_array_equal(decode_hist(lo, blob), h)
    assert decode_hist(*encode_hist(np.zeros(HIST_BINS, dtype=np.int64))).sum() == 0
    # Counts whose low or high bytes are zero (256, 2**40, 2**63 - 1) in the first and the
    # last non-zero bins: the blob runs from the first to the last non-zero bin, whole bins.
    rng = np.random.default_rng(0)
    hists: list[np.ndarray] = []
    expected: list[tuple[int, bytes]] = []
    for _ in range(2000):
        h = np.zeros(HIST_BINS, dtype=np.int64)
        at = rng.integers(0, HIST_BINS, rng.integers(1, 5))
        h[at] = rng.choice([1, 255, 256, 2**40, 2**56, 2**63 - 1], at.size)
        nz = np.flatnonzero(h)
        lo, blob = encode_hist(h)
        assert lo == nz[0] and blob == h[nz[0]:nz[-1] + 1].astype("<i8").tobytes()
        hists.append(h)
        expected.append((lo, blob))
    # All at once (a watched step's rows), empty histograms among them.
    hists[5] = hists[700] = np.zeros(HIST_BINS, dtype=np.int64)
    expected[5] = expected[700] = (0, b"")
    assert encode_hists(hists) == expected


def test_rows_of_many_statistics_are_float64_numpy_row_by_row():
    """``stats_rows`` (every row of a step at once) against float64 NumPy of each tensor:
    NaN and Inf left out of the moments and counted, a tensor without a finite value (or
    without values) written with NULLs where a statistic has no value, the histogram's
    blob decoding to the tensor's log2 bins."""
    import math

    import torch

    from tests.core.test_stats_merge import reference

    g = torch.Generator().manual_seed(3)
    tensors = [
        torch.randn(256, generator=g),
        torch.full((5,), float("nan")),
        torch.zeros(0),
        torch.tensor([1.5]),
        torch.tensor([float("inf"), 2.0, -0.0, float("nan"), -3.0]),
        torch.zeros(7),
        torch.tensor([-float("inf"), float("inf")]),
        torch.full((1001,), 1e4) + torch.randn(1001, generator=g) * 1e-3,
        torch.tensor([3e38, 3e38, -1e-45, 1e-40]),
        torch.randn(64, 64, generator=g).t(),
    ]
    stats = MergeStats.of_tensors(tensors)
    ratios = [None, float("nan"), 0.25, math.inf, None, 0.0, None, 1e-9, None, 2.0]
    entries = [(f"m{i}", i % 3, "weight", s, r) for i, (s, r) in enumerate(zip(stats, ratios))]
    rows = stats_rows(7, -1, entries)
    assert len(rows) == len(tensors)
    for i, (t, row) in enumerate(zip(tensors, rows)):
        assert row[:5] == (7, f"m{i}", i % 3, "weight", -1)
        got = dict(zip(STAT_COLUMNS, row[5:19]))
        ref = reference(t.double().numpy().reshape(-1))
        for key in ("numel", "count", "nan_count", "inf_count"):
            assert got[key] == ref[key], (i, key)
        fin = t.double().numpy().reshape(-1)
        fin = fin[np.isfinite(fin)]
        assert got["zero_count"] == int((np.abs(fin) < 2.0 ** -126).sum()), i
        if not fin.size:
            assert [got[k] for k in ("min", "max", "mean", "std", "mean_abs")] == [None] * 5, i
            assert got["l2"] == (None if t.numel() else 0.0), i
            assert got["sum"] == 0.0 and got["sum_abs"] == 0.0, i
        else:
            assert got["min"] == ref["min"] and got["max"] == ref["max"], i
            spread = ref["std"] if fin.size > 1 else 0.0
            assert got["mean"] == pytest.approx(ref["mean"], rel=1e-12, abs=1e-12 * spread), i
            assert got["std"] == pytest.approx(ref["std"], rel=1e-9, abs=1e-300), i
            assert got["sum"] == pytest.approx(ref["sum"], rel=1e-12, abs=1e-12 * spread * fin.size), i
            assert got["sum_abs"] == pytest.approx(np.abs(fin).sum(), rel=1e-12), i
            assert got["mean_abs"] == pytest.approx(ref["mean_abs"], rel=1e-12), i
            assert got["m2"] == pytest.approx(((fin - fin.mean()) ** 2).sum(), rel=1e-9, abs=1e-300), i
            assert got["l2"] == pytest.approx(math.sqrt((fin * fin).sum()), rel=1e-12), i
        ratio = ratios[i]
        assert row[19] == (None if ratio is None or math.isnan(ratio) else ratio), i
        np.testing.assert_array_equal(decode_hist(row[20], row[21]), ref["hist"])
        assert row == stats_row(7, f"m{i}", i % 3, "weight", -1, stats[i], ratio)  # one row alone: the same


def test_writer_refuses_other_files(tmp_path):
    import sqlite3

    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO meta VALUES ('format', 'something-else')")
    con.commit()
    con.close()
    with pytest.raises(GradExplorerError, match="not a gradexplorer watch log"):
        WatchLogWriter(other)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(GradExplorerError, match="not a regular file"):
        WatchLogWriter(fifo)
