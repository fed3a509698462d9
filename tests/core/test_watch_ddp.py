"""The watch under DDP (torchrun, 2 CPU processes, gloo): rank-merged and per-rank rows
equal what one process computes for the same shards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gradexplorer.recording.watch_log import open_log, row_stats
from gradexplorer.stats.merge import MergeStats
from tests.core.watch_ddp_worker import make_batches, make_model

# Every test here takes a second or more (scripts/slow_tests.py): none is in make test-fast.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def run_torchrun(out: Path, mode: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "tests.core.watch_ddp_worker", str(out), mode],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def shard_reference():
    """Step 0 on each rank's shard, in one process: activations and output gradients."""
    model = make_model()
    x, y = make_batches()[0]
    per_shard = []
    for xs, ys in zip(x.chunk(2), y.chunk(2)):
        h0 = model[0](xs)
        h1 = model[1](h0)
        h2 = model[2](h1)
        loss = F.cross_entropy(h2, ys)
        grads = torch.autograd.grad(loss, [h0, h1, h2])
        per_shard.append({"module.0": (h0.detach(), grads[0]), "module.1": (h1.detach(), grads[1]),
                          "module.2": (h2.detach(), grads[2])})
    return per_shard


def rows_of(path: Path, step: int) -> dict:
    con = open_log(path)
    out = {(r["layer"], r["kind"], r["rank"]): dict(r)
           for r in con.execute("SELECT * FROM stats WHERE step = ?", (step,))}
    con.close()
    return out


def check(row: dict, values: torch.Tensor) -> None:
    ref = MergeStats.of_tensor(values.double())
    got = row_stats(row)
    assert got.count == ref.count
    assert got.min == ref.min and got.max == ref.max
    np.testing.assert_array_equal(got.hist, MergeStats.of_tensor(values).hist)
    assert got.mean == pytest.approx(ref.mean, rel=1e-5, abs=1e-7)
    assert got.std == pytest.approx(ref.std, rel=1e-5)


@pytest.mark.slow
def test_ddp_merged_and_per_rank(tmp_path):
    merged_path, per_rank_path = tmp_path / "merged.gxw", tmp_path / "per_rank.gxw"
    run_torchrun(merged_path, "merged")
    run_torchrun(per_rank_path, "per_rank")
    shards = shard_reference()
    merged = rows_of(merged_path, 0)
    per_rank = rows_of(per_rank_path, 0)
    for layer in ("module.0", "module.1", "module.2"):
        acts = torch.cat([s[layer][0] for s in shards])
        grads = torch.cat([s[layer][1] for s in shards])
        check(merged[(layer, "activation", -1)], acts)
        check(merged[(layer, "grad_output", -1)], grads)
        for rank in (0, 1):
            check(per_rank[(layer, "activation", rank)], shards[rank][layer][0])
            check(per_rank[(layer, "grad_output", rank)], shards[rank][layer][1])
    # parameter gradients: DDP's average of both shards' gradients, logged once
    model = make_model()
    x, y = make_batches()[0]
    loss = sum(F.cross_entropy(model(xs), ys) for xs, ys in zip(x.chunk(2), y.chunk(2))) / 2
    g0 = torch.autograd.grad(loss, model[0].weight)[0]
    assert merged[("module.0.weight", "grad", -1)]["mean"] == pytest.approx(float(g0.double().mean()), rel=1e-5)
    assert not any(k[0] == "module.0.weight" and k[2] == 1 for k in per_rank)
    con = open_log(merged_path)
    assert [r[0] for r in con.execute("SELECT step FROM steps WHERE rank = -1 ORDER BY step")] == [0, 1]
    con.close()
