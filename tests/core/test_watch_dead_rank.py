"""A rank that dies during a watched training: the other ends within the process group's
timeout (not a hang), and the log opens with every finished step.

A plain model's first collective after the death is the watch's gather, which says so in
the watch's message. Under FSDP2 it is FSDP2's all-gather in the user's own forward, which
the watch does not own: torch's error goes on as it is, with a note from the watch (the
step, the timeout, what the log holds)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradexplorer.recording.watch_log import open_log
from tests.core.watch_dead_rank_worker import TIMEOUT_S

ROOT = Path(__file__).resolve().parents[2]


def two_ranks(tmp_path: Path, mode: str) -> tuple[list[subprocess.Popen], list[tuple[str, str]]]:
    log, store = tmp_path / "run.gxw", tmp_path / "store"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p))
    procs = [subprocess.Popen([sys.executable, "-m", "tests.core.watch_dead_rank_worker", str(log), str(store),
                               str(r), mode],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    # communicate's timeout is the guard against a hang: no wall-clock assert on a loaded machine.
    outs = [p.communicate(timeout=TIMEOUT_S + 120) for p in procs]
    return procs, outs


def logged_steps(log: Path) -> list[int]:
    con = open_log(log)
    try:
        return [r[0] for r in con.execute("SELECT step FROM steps ORDER BY step")]
    finally:
        con.close()


@pytest.mark.slow
def test_a_dead_rank_ends_the_other_with_a_message(tmp_path):
    procs, outs = two_ranks(tmp_path, "plain")
    assert procs[1].returncode == 3
    assert procs[0].returncode == 1, outs[0]
    message = outs[0][0]
    assert "could not gather watched step 1" in message and f"{TIMEOUT_S} s" in message, message
    assert "every step before step 1" in message
    assert logged_steps(tmp_path / "run.gxw") == [0]


@pytest.mark.slow
def test_a_dead_rank_under_fsdp2_ends_the_other_in_its_forward(tmp_path):
    procs, outs = two_ranks(tmp_path, "fsdp")
    assert procs[1].returncode == 3
    assert procs[0].returncode == 2, outs[0]  # torch's own error from the user's forward
    said = outs[0][0]
    assert "gradexplorer watch: rank 0 stopped in a collective of step 1" in said, said
    assert f"here {TIMEOUT_S} s" in said and "every watched step before step 1" in said, said
    assert logged_steps(tmp_path / "run.gxw") == [0]


def test_only_a_collective_is_taken_for_a_dead_rank():
    import torch
    import torch.distributed as dist
    from torch import nn

    from gradexplorer.recording.collective_failure import is_collective_failure

    try:
        nn.Linear(3, 2)(torch.zeros(1, 4))  # the model's own mistake
    except RuntimeError as exc:
        assert not is_collective_failure(exc)
    assert is_collective_failure(dist.DistBackendError("NCCL watchdog timeout"))
    assert not is_collective_failure(ValueError("not a collective"))
