"""The dataset capture over a model sharded with FSDP2 (``--shard fsdp``): the blocks, the
shards each rank holds, the memory estimate, and the merged file against one process.

The truth for the statistics is the single-process dataset capture
(``capture_dataset``: one ``torch.autograd.grad`` per batch on the whole model) on the
same batches, with the same number of threads as each rank (CPU kernels sum in an order
that depends on it).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.module_tree import ModuleTree
from gradexplorer.capturing.selection import resolve_layers
from gradexplorer.recording.dataset_capture import DatasetStats, capture_dataset, recorded_params
from gradexplorer.recording.dataset_memory import estimate_dataset_memory
from gradexplorer.recording.shard_blocks import ShardPlan, choose_blocks, default_blocks
from gradexplorer.stats.merge import GradientMoments, MomentSums
from tests.core.sharded_dataset_worker import BATCH, batches, make_data, make_model

ROOT = Path(__file__).resolve().parents[2]


def one_process() -> DatasetStats:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs (OMP_NUM_THREADS=1)
    try:
        return capture_dataset(make_model(), batches(make_data()))
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("sharded") / "stats.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "tests.core.sharded_dataset_worker", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


@pytest.mark.slow
def test_sharded_capture_equals_one_process(two_ranks):
    two = DatasetStats.from_dict(two_ranks["stats"])
    one = one_process()
    assert (two.samples, two.batches) == (one.samples, one.batches) == (13, 5)  # the padding pass counts nothing
    assert one.rows.keys() == two.rows.keys()
    assert {k[0] for k in one.rows if k[2] == "grad"} == {n for n, _ in make_model().named_parameters()}
    for key, a in one.rows.items():
        da, db = a.to_dict(), two.rows[key].to_dict()
        for field in ("numel", "count", "nan_count", "inf_count", "zero_count", "min", "max"):
            assert da[field] == db[field], (key, field)
        assert np.array_equal(da["hist"], db["hist"]), key
        assert db["mean"] == pytest.approx(da["mean"], rel=1e-12, abs=1e-15), key
        assert db["m2"] == pytest.approx(da["m2"], rel=1e-10, abs=1e-20), key
    # per batch, every row (parameter gradients included) as the single process has it
    assert sorted(one.series) == sorted(two.series) == [0, 1, 2, 3, 4]
    for index, (samples, values) in one.series.items():
        assert two.series[index][0] == samples
        assert values.keys() == two.series[index][1].keys()
        for name, v in values.items():
            assert np.allclose(v, two.series[index][1][name], rtol=1e-12, atol=0, equal_nan=True), (index, name)
    # the gradient signal-to-noise ratio, from element moments kept a part per rank
    s1, s2 = one.snr(), two.snr()
    assert s1.keys() == s2.keys() and not two.moments and two.moment_sums.keys() == s1.keys()
    for name, v in s1.items():
        assert s2[name]["batches"] == v["batches"] == 5
        for field in ("mean_norm", "var_sum", "snr"):
            assert s2[name][field] == pytest.approx(v[field], rel=1e-12), (name, field)


@pytest.mark.slow
def test_each_rank_holds_only_its_shard(two_ranks):
    """The worker checked each rank's local tensors against the rows of the whole
    parameters; here the bytes: each rank holds the shards FSDP2 pads, as the plan says."""
    whole = two_ranks["whole"]
    assert two_ranks["blocks"] == ["blocks.0", "blocks.1", "blocks.2"]
    assert two_ranks["held"] == [two_ranks["plan_shard"]] * 2
    assert two_ranks["plan_shard"] < 0.6 * whole  # rows of 7 and 5 split 4/3 and 3/2: rank 0 pads
    rows_bytes = sum(math.ceil(p.shape[0] / 2) * p[0].numel() * 4 for p in make_model().parameters())
    assert two_ranks["plan_shard"] == rows_bytes


def test_default_blocks_are_the_repeated_blocks():
    import torchvision

    from tests.hf_tiny import gpt2

    resnet = torchvision.models.resnet18()
    assert default_blocks(resnet) == [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    vit = torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2,
                                               hidden_dim=8, mlp_dim=16)
    assert default_blocks(vit) == ["encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_1"]
    assert default_blocks(gpt2()) == ["transformer.h.0", "transformer.h.1"]
    assert default_blocks(make_model()) == ["blocks.0", "blocks.1", "blocks.2"]
    linears = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    assert default_blocks(linears) == ["0", "2", "4"]
    # nothing repeated: the root's children that hold parameters
    mixed = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4, 2))
    assert default_blocks(mixed) == ["0", "3"]


def test_chosen_blocks_are_the_outermost_matches():
    import torchvision

    resnet = torchvision.models.resnet18()
    # 'layer*.*' matches layer1.0 and everything inside it: the outermost are the blocks
    assert choose_blocks(resnet, ["layer*.*"]) == [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    assert choose_blocks(resnet, ["layer4", "fc"]) == ["layer4", "fc"]
    with pytest.raises(GradExplorerError, match="layr4") as info:
        choose_blocks(resnet, ["layr4"])
    assert "layer4" in str(info.value)  # near names


def test_the_estimate_accounts_for_the_shard():
    model = make_model()
    data = make_data()[:BATCH]
    tree = ModuleTree.build(model).probe(model, data[:1])
    selected = resolve_layers(model, None)
    params = recorded_params(model, None, selected)
    numel = sum(p.numel() for p in params.values())
    whole = estimate_dataset_memory(tree, selected, data, model, params, batches=5)
    plan = ShardPlan.of(model, default_blocks(model), 2)
    sharded = estimate_dataset_memory(tree, selected, data, model, params, batches=5, plan=plan)
    assert whole.moments == 16 * numel
    assert sharded.moments == 16 * sum(math.ceil(p.numel() / 2) for p in params.values())
    assert sharded.total < whole.total and sharded.stats == whole.stats
    # while running: the shards and the gathered blocks instead of every gradient at once
    grads = sum(p.numel() * 4 for p in model.parameters())
    units = plan.unit_bytes
    assert sum(units) == grads and len(units) == 4
    largest = sorted(units, reverse=True)
    biggest_param = max(p.numel() * 4 for p in params.values())
    assert sharded.shard_params == plan.shard_bytes
    assert sharded.gathered == largest[0] + largest[1] + largest[0] + 2 * biggest_param
    assert sharded.transient == whole.transient - grads + plan.shard_bytes + sharded.gathered
    assert "sharded over 2 ranks" in sharded.describe() and "gradient moments" in sharded.describe()
    # on a GPU the moments live with the gradients: the device's share, not RAM's
    gpu = estimate_dataset_memory(tree, selected, data, model, params, batches=5, plan=plan, device="cuda")
    assert gpu.total == sharded.total - sharded.moments
    assert gpu.transient == sharded.transient + sharded.moments


def test_moment_sums_of_parts_add_up_to_the_whole():
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(11, 3, generator=g) + 5 for _ in range(4)]
    whole, top, bottom = GradientMoments(), GradientMoments(), GradientMoments()
    for t in grads:
        whole.add(t)
        top.add(t[:6])
        bottom.add(t[6:])
    added = top.sums().add_part(bottom.sums()).summary()
    want = whole.summary()
    v = torch.stack([t.double() for t in grads])  # float64 truth: ||E[g]||^2 / sum Var[g]
    mean_sq, var_sum = float(v.mean(0).square().sum()), float(v.var(0, unbiased=True).sum())
    assert want["snr"] == pytest.approx(mean_sq / var_sum, rel=1e-12)
    for field in ("batches", "mean_norm", "var_sum", "snr"):
        assert added[field] == pytest.approx(want[field], rel=1e-12), field
    with pytest.raises(ValueError):
        MomentSums(3, 1.0, 1.0).add_part(MomentSums(4, 1.0, 1.0))


@pytest.mark.slow
def test_a_dead_rank_ends_the_other_with_a_message(tmp_path):
    from tests.core.sharded_dataset_dead_rank_worker import TIMEOUT_S

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p))
    procs = [subprocess.Popen([sys.executable, "-m", "tests.core.sharded_dataset_dead_rank_worker",
                               str(tmp_path / "store"), str(r)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=TIMEOUT_S + 120) for p in procs]
    # communicate's timeout is the guard against a hang: no wall-clock assert on a loaded machine.
    assert procs[1].returncode == 3
    assert procs[0].returncode == 1, outs[0]
    lines = [ln for ln in outs[0][0].splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, outs[0]
    said = lines[0]
    assert "Rank 0's forward on batch 2 failed in FSDP2's all-gather" in said, said
    assert f"here {TIMEOUT_S} s" in said and "init_process_group(timeout=...)" in said, said
