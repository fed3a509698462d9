"""A rank that dies during a watched training: the other ends within the process group's
timeout with the watch's message (not a hang), and the log opens with every finished step."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradexplorer.recording.watch_log import open_log
from tests.core.watch_dead_rank_worker import TIMEOUT_S

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_dead_rank_ends_the_other_with_a_message(tmp_path):
    log, store = tmp_path / "run.gxw", tmp_path / "store"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "tests.core.watch_dead_rank_worker", str(log), str(store), str(r)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=TIMEOUT_S + 120) for p in procs]
    elapsed = time.monotonic() - start
    assert procs[1].returncode == 3
    assert procs[0].returncode == 1, outs[0]
    message = outs[0][0]
    assert "could not gather watched step 1" in message and f"{TIMEOUT_S} s" in message, message
    assert "every step before step 1" in message
    assert elapsed < TIMEOUT_S + 90  # the timeout, plus start-up on a loaded machine; never a hang
    con = open_log(log)
    steps = [r[0] for r in con.execute("SELECT step FROM steps ORDER BY step")]
    con.close()
    assert steps == [0]
