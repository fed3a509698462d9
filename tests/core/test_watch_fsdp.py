"""The watch under FSDP2 (``fully_shard`` over each Linear and the root; torchrun, 2 CPU
processes, gloo): every parameter's statistics are those of the whole unsharded tensor,
merged from the shards; activations and output gradients merged over ranks as under DDP.

Two truths: the full tensors the worker gathered for the test (``DTensor.full_tensor``),
summarised in float64 NumPy, which the merged statistics must equal to 1e-9; and one
unsharded process on the same data by plain autograd (loss averaged over ranks, as FSDP2's
reduce-scatter averages), whose gradients' and activations' statistics the log must equal
to 1e-9 too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gradexplorer.recording.timeline import read_timeline
from gradexplorer.recording.watch_log import open_log, read_meta
from tests.core.watch_fsdp_worker import STEPS, make_batches, make_model, make_tp_model

ROOT = Path(__file__).resolve().parents[2]
LINEARS = ("0", "2", "4")


def run_torchrun(out: Path, mode: str, dump: Path, processes: int = 2) -> str:
    """Run the worker; its stderr (every rank's)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(processes),
                           "-m", "tests.core.watch_fsdp_worker", str(out), mode, str(dump)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def rows_of(path: Path) -> dict:
    con = open_log(path)
    out = {(r["step"], r["layer"], r["kind"], r["rank"]): dict(r) for r in con.execute("SELECT * FROM stats")}
    con.close()
    return out


def float64_stats(t: torch.Tensor) -> dict:
    v = t.detach().double().numpy().reshape(-1)
    return {"l2": float(np.sqrt(np.sum(v * v))), "min": float(v.min()), "max": float(v.max()),
            "mean": float(v.mean()), "count": v.size}


def assert_stats(row: dict, values: torch.Tensor, rel: float) -> None:
    want = float64_stats(values)
    assert row["count"] == want["count"]
    for key in ("l2", "min", "max"):
        assert row[key] == pytest.approx(want[key], rel=rel, abs=1e-300), key
    # the mean may be near zero: within rel of the tensor's mean |x|
    scale = float(values.detach().double().abs().mean())
    assert abs(row["mean"] - want["mean"]) <= rel * max(scale, 1e-300)


def reference_run(bf16: bool = False) -> list[dict]:
    """One unsharded process, the same data and updates: per step the weights before it,
    the parameter gradients of the loss averaged over the 2 ranks' shards, and each
    Linear's activations and output gradients per shard (each shard's own loss).
    On one thread, as each rank runs (CPU kernels sum in an order that depends on it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _reference_run()
    finally:
        torch.set_num_threads(threads)


def _reference_run() -> list[dict]:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for x, y in make_batches():
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        acts: dict[str, list] = {n: [] for n in LINEARS}
        outgrads: dict[str, list] = {n: [] for n in LINEARS}
        for xs, ys in zip(x.chunk(2), y.chunk(2)):
            h = xs
            kept = {}
            for i, layer in enumerate(model):
                h = layer(h)
                if str(i) in LINEARS:
                    kept[str(i)] = h
            loss = F.mse_loss(h, ys)
            grads = torch.autograd.grad(loss, list(kept.values()))
            for (name, value), g in zip(kept.items(), grads):
                acts[name].append(value.detach())
                outgrads[name].append(g)
        loss = sum(F.mse_loss(model(xs), ys) for xs, ys in zip(x.chunk(2), y.chunk(2))) / 2
        opt.zero_grad()
        loss.backward()
        steps.append({"weights": weights, "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
                      "acts": {n: torch.cat(v) for n, v in acts.items()},
                      "outgrads": {n: torch.cat(v) for n, v in outgrads.items()}})
        opt.step()
    return steps


@pytest.fixture(scope="module")
def fp32_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fsdp")
    log, dump = folder / "fp32.gxw", folder / "fp32.pt"
    run_torchrun(log, "fp32", dump)
    return rows_of(log), torch.load(dump)


@pytest.mark.slow
def test_fsdp2_parameter_statistics_are_the_whole_tensors(fp32_run):
    rows, full = fp32_run
    ref = reference_run()
    for step in range(STEPS):
        for name, grad in full[step]["grads"].items():
            row = rows[(step, name, "grad", -1)]
            assert_stats(row, grad, rel=1e-9)  # merged from the shards: exact
            # ... and those of one unsharded process's gradient on the same data
            assert_stats(row, ref[step]["grads"][name], rel=1e-9)
            weight = full[step]["weights"][name]
            assert torch.equal(weight, ref[step]["weights"][name])
            assert_stats(rows[(step, name, "weight", -1)], weight, rel=1e-9)
        # the update ratio over the whole tensor: |lr * grad| / |w|
        for name, grad in full[step]["grads"].items():
            want = float(0.1 * grad.double().norm() / full[step]["weights"][name].double().norm())
            assert rows[(step, name, "weight", -1)]["update_ratio"] == pytest.approx(want, rel=1e-5)
    # names as the user's model has them, each parameter logged once per step
    assert {k[1] for k in rows if k[2] == "grad"} == {n for n, _ in make_model().named_parameters()}
    assert not any(k[3] != -1 for k in rows)


@pytest.mark.slow
def test_fsdp2_activation_statistics_merge_over_ranks(fp32_run):
    rows, _full = fp32_run
    ref = reference_run()
    for step in range(STEPS):
        for name in LINEARS:
            assert_stats(rows[(step, name, "activation", -1)], ref[step]["acts"][name], rel=1e-9)
            assert_stats(rows[(step, name, "grad_output", -1)], ref[step]["outgrads"][name], rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bf16", "keep", "per_rank"])
def test_fsdp2_policies_and_per_rank(tmp_path, mode):
    log, dump = tmp_path / "w.gxw", tmp_path / "w.pt"
    run_torchrun(log, mode, dump)
    rows, full = rows_of(log), torch.load(dump)
    ref = reference_run()
    rank = -1 if mode != "per_rank" else None
    for step in range(STEPS):
        for name, grad in full[step]["grads"].items():
            if rank is None:  # each rank's own shard: together, the whole tensor
                parts = [rows[(step, name, "grad", r)] for r in (0, 1) if (step, name, "grad", r) in rows]
                assert sum(p["count"] for p in parts) == grad.numel()
                assert max(p["max"] for p in parts if p["count"]) == pytest.approx(float(grad.max()), rel=1e-9)
                continue
            assert_stats(rows[(step, name, "grad", rank)], grad, rel=1e-9)
            # bf16 compute: the gradient of the policy, near the float32 one
            tolerance = 5e-2 if mode == "bf16" else 1e-5
            assert torch.allclose(grad, ref[step]["grads"][name], rtol=tolerance, atol=tolerance * 1e-1)
        if mode == "bf16":
            for name in LINEARS:
                row = rows[(step, name, "activation", -1)]
                acts = ref[step]["acts"][name].double()
                # bfloat16 keeps 8 bits: inputs, weights and outputs of each of up to three
                # layers are rounded to 2**-8 of their size, so 5% of the largest value bounds it.
                bound = 0.05 * float(acts.abs().max())
                assert row["count"] == acts.numel()
                for key, want in (("l2", acts.norm()), ("min", acts.min()), ("max", acts.max()),
                                  ("mean", acts.mean())):
                    assert abs(row[key] - float(want)) <= bound, key
                assert row["l2"] != pytest.approx(float(acts.norm()), rel=1e-6)  # computed in bf16 indeed


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tp")
    log, dump = folder / "tp.gxw", folder / "tp.pt"
    stderr = run_torchrun(log, "tp", dump)
    return log, rows_of(log), torch.load(dump), stderr


@pytest.mark.slow
def test_tensor_parallel_gradients_merge_by_the_same_rule(tp_run):
    """Tensor parallelism on a 1-D mesh: a column-wise Linear's weight and bias are
    ``Shard(0)`` DTensors, a row-wise one's weight ``Shard(1)`` and its bias ``Replicate()``
    (counted once, not once per rank), the last Linear plain. Every gradient and weight
    row of the log is the whole tensor's; the gradients are those of one process."""
    _log, rows, full, _stderr = tp_run
    model = make_tp_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(make_batches()):
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        for name, p in model.named_parameters():
            grad, weight = full[step]["grads"][name], full[step]["weights"][name]
            assert grad.shape == p.shape
            assert_stats(rows[(step, name, "grad", -1)], grad, rel=1e-9)
            assert_stats(rows[(step, name, "weight", -1)], weight, rel=1e-9)
            assert torch.allclose(grad, p.grad, rtol=1e-5, atol=1e-7), name
        opt.step()
    assert {k[1] for k in rows if k[2] == "grad"} == {n for n, _ in make_tp_model().named_parameters()}


def tp_reference(shares: int = 1) -> list[dict]:
    """One process, the same updates, the batch in ``shares`` parts (one per data-parallel
    group, the loss averaged over them): per step and part, every module's output and the
    gradient of that part's loss with respect to it (``torch.autograd.grad``), and the
    parameters' gradients."""
    model = make_tp_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for x, y in make_batches():
        parts, total = [], 0.0
        for xs, ys in zip(x.chunk(shares), y.chunk(shares)):
            h, outs = xs, {}
            for i, layer in enumerate(model):
                h = layer(h)
                outs[str(i)] = h
            loss = F.mse_loss(h, ys)
            grads = torch.autograd.grad(loss, list(outs.values()), retain_graph=True)
            parts.append({n: (v.detach(), g) for (n, v), g in zip(outs.items(), grads)})
            total = total + loss / shares
        opt.zero_grad()
        total.backward()
        steps.append({"parts": parts, "grads": {n: p.grad.clone() for n, p in model.named_parameters()}})
        opt.step()
    return steps


#: Which modules' local outputs are column shards on each rank (the column-wise Linear and the
#: ReLU after it, 8 features: 4 per rank); the others are replicated on both ranks.
TP_SHARDED = ("0", "1")


def rank_part(t: torch.Tensor, layer: str, rank: int) -> torch.Tensor:
    return t[:, rank * 4:(rank + 1) * 4] if layer in TP_SHARDED else t


def assert_near_stats(row: dict, values: torch.Tensor, rel: float = 1e-5) -> None:
    """The count exactly; L2, min, max and mean within ``rel`` of the tensor's largest |x|:
    the ranks sum the row-wise product in another order than one process, and the step
    after an update starts from weights that differ in their last bits."""
    want = float64_stats(values)
    assert row["count"] == want["count"]
    scale = float(values.detach().double().abs().max())
    for key in ("l2", "min", "max", "mean"):
        assert abs(row[key] - want[key]) <= rel * scale, key


def assert_module_rows_per_rank(rows: dict, ref: list[dict], skip: tuple = (), ranks: int = 2) -> None:
    """Rank r runs data-parallel part r // 2 (of one, or two on a 2 × 2 mesh) and holds
    tensor-parallel shard r % 2."""
    for step in range(STEPS):
        for rank in range(ranks):
            for layer, (act, grad) in ref[step]["parts"][rank // 2].items():
                act_part, grad_part = rank_part(act, layer, rank % 2), rank_part(grad, layer, rank % 2)
                if (layer, "activation") not in skip:
                    assert_near_stats(rows[(step, layer, "activation", rank)], act_part)
                assert_near_stats(rows[(step, layer, "grad_output", rank)], grad_part)
                assert_near_stats(rows[(step, layer, "grad_norm", rank)], grad_part.norm(dim=1))
    # never merged: a merge would count the replicated outputs twice
    assert not any(k[3] == -1 and k[2] in ("activation", "grad_output", "grad_norm") for k in rows)


@pytest.mark.slow
def test_tensor_parallel_module_rows_are_each_ranks_own(tp_run):
    """Under tensor parallelism both ranks run the whole batch: the row-wise Linear's output
    (and the Tanh and the last Linear after it) is replicated, the column-wise one's (and
    the ReLU's) is each rank's half of the features. Each rank's rows are that rank's own:
    the whole tensor of one process where it is replicated, the rank's columns where it is
    sharded; none is merged. The log says so in its meta, one report and one warning."""
    log, rows, _full, stderr = tp_run
    assert_module_rows_per_rank(rows, tp_reference())
    con = open_log(log)
    try:
        meta = read_meta(con)
        steps = con.execute("SELECT step, rank FROM steps ORDER BY step, rank").fetchall()
        reports = con.execute("SELECT step, layer, message FROM reports").fetchall()
    finally:
        con.close()
    assert meta["module_rows"] == "per_rank"
    assert "module 0 is parallelized" in meta["tensor_parallel"]
    assert [tuple(r) for r in steps] == [(s, r) for s in range(STEPS) for r in (-1, 0, 1)]
    assert len(reports) == 1 and reports[0][0] is None and "each rank's own" in reports[0][2]
    assert stderr.count("gradexplorer watch: tensor parallelism") == 1  # rank 0, once
    # Readers default to rank 0's module rows and the merged parameter rows.
    acts = read_timeline(log, "activation", "l2")
    want = float64_stats(tp_reference()[1]["parts"][0]["2"][0])["l2"]
    assert acts.values[acts.rows.index("2"), 1] == pytest.approx(want, rel=1e-5)
    grads = read_timeline(log, "grad", "l2")
    assert grads.values[grads.rows.index("2.bias"), 0] == rows[(0, "2.bias", "grad", -1)]["l2"]


@pytest.mark.slow
def test_tensor_parallel_dtensor_outputs(tmp_path):
    """Outputs left as DTensors (``use_local_output=False``): a ``Shard(-1)`` output and the
    ReLU's after it give each rank's columns, a replicated one the whole; the row-wise
    Linear's ``Partial()`` output (a summand on each rank) is reported, not recorded, while
    its output gradient (replicated) is."""
    log, dump = tmp_path / "tp.gxw", tmp_path / "tp.pt"
    run_torchrun(log, "tp_dtensor", dump)
    rows = rows_of(log)
    assert_module_rows_per_rank(rows, tp_reference(), skip=(("2", "activation"),))
    assert not any(k[1] == "2" and k[2] == "activation" for k in rows)
    con = open_log(log)
    try:
        reports = con.execute("SELECT step, layer, message FROM reports WHERE layer = '2'").fetchall()
    finally:
        con.close()
    assert {(r[0], r[2].split(":")[0]) for r in reports} == {(s, f"rank {r}") for s in range(STEPS) for r in (0, 1)}
    assert all("activation is not recorded" in r[2] and "pending reduction" in r[2] for r in reports)


def test_tensor_parallelism_is_told_from_data_parallelism(monkeypatch):
    """The placements rule, without processes: parameters marked as DTensors by hand."""
    from torch import nn
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard  # the placement FSDP2 gives over TP

    from gradexplorer.recording import sharded

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    assert sharded.tensor_parallelism(model) is None
    monkeypatch.setattr(sharded, "is_dtensor", lambda t: hasattr(t, "placements"))
    model[0].weight.placements = (Shard(0),)
    # a DTensor parameter that no FSDP2 module manages
    assert "0.weight is a DTensor (Shard(dim=0)) that FSDP2 does not shard" in sharded.tensor_parallelism(model)

    class Sharded(nn.Sequential):  # stands for FSDP2's FSDPModule mixed into the root
        pass

    model = Sharded(nn.Linear(4, 4), nn.Linear(4, 2))
    monkeypatch.setattr(sharded, "fsdp_module_type", lambda: Sharded)
    for placements, parallel in [((Shard(0),), False), ((Replicate(), Shard(0)), False), ((Replicate(),), False),
                                 ((Shard(0), Replicate()), True), ((Shard(0), Shard(1)), True),
                                 ((_StridedShard(0, split_factor=2), Shard(0)), True),
                                 ((Replicate(), Shard(0), Shard(0)), True)]:
        model[0].weight.placements = placements
        found = sharded.tensor_parallelism(model)
        assert (found is not None) == parallel, placements
        if parallel:
            assert "0.weight is sharded by FSDP2 over a mesh with a tensor-parallel dimension" in found
    # parallelize_module's mark on a module is enough, and names FSDP2 beside it
    del model[0].weight.placements
    model[1]._distribute_module_applied = True
    assert sharded.tensor_parallelism(model) == (
        "module 1 is parallelized over the ranks with torch.distributed.tensor (parallelize_module or "
        "distribute_module) (and FSDP2 over the data-parallel dimension)")


@pytest.mark.slow
def test_fsdp2_over_tensor_parallelism_on_a_2d_mesh(tmp_path):
    """FSDP2 over a tensor-parallel model, 4 processes on a 2 × 2 (dp, tp) mesh: ranks of one
    ``tp`` pair share their half of the batch. Parameters parallelized over ``tp`` are
    2-D DTensors (``_StridedShard``, ``Shard``, ``Replicate``); the last Linear, not
    parallelized, is sharded over ``dp`` alone, so both ranks of a ``tp`` pair hold the same
    shard of it, counted once. Every parameter row is the whole gradient (the loss averaged
    over the two halves, as FSDP2 averages); module rows are each rank's own, as under
    tensor parallelism alone."""
    log, dump = tmp_path / "w.gxw", tmp_path / "w.pt"
    stderr = run_torchrun(log, "fsdp_tp", dump, processes=4)
    rows, full = rows_of(log), torch.load(dump)
    ref = tp_reference(shares=2)
    for step in range(STEPS):
        for name, grad in full[step]["grads"].items():
            assert_stats(rows[(step, name, "grad", -1)], grad, rel=1e-9)  # each part counted once
            assert_stats(rows[(step, name, "weight", -1)], full[step]["weights"][name], rel=1e-9)
            assert torch.allclose(grad, ref[step]["grads"][name], rtol=1e-5, atol=1e-7), name
            want = float(0.1 * grad.double().norm() / full[step]["weights"][name].double().norm())
            assert rows[(step, name, "weight", -1)]["update_ratio"] == pytest.approx(want, rel=1e-5)
    assert_module_rows_per_rank(rows, ref, ranks=4)
    con = open_log(log)
    try:
        meta = read_meta(con)
    finally:
        con.close()
    assert meta["module_rows"] == "per_rank" and "and FSDP2" in meta["tensor_parallel"]
    assert stderr.count("gradexplorer watch: tensor parallelism") == 1


def test_fsdp1_is_refused_with_a_way_forward(tmp_path):
    """FSDP1 cannot be built on a CPU-only machine ("FSDP needs a non-CPU accelerator"), so
    the wrapper is made without its constructor: the refusal looks at the module types."""
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel

    from gradexplorer.base.errors import GradExplorerError
    from gradexplorer.recording.watch import watch

    wrapper = FullyShardedDataParallel.__new__(FullyShardedDataParallel)
    nn.Module.__init__(wrapper)
    model = nn.Sequential(nn.Linear(2, 2), wrapper)
    with pytest.raises(GradExplorerError, match="FSDP1") as info:
        watch(model, out=str(tmp_path / "w.gxw"))
    assert "fully_shard" in info.value.fix
    assert not (tmp_path / "w.gxw").exists()  # refused before the log was made
