"""Dataset capture: merged statistics equal the statistics over every sample at once."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch import nn

from gradexplorer.base.errors import CaptureCancelled
from gradexplorer.files.capture_file import load_capture, save_capture
from gradexplorer.recording.dataset_capture import (
    DatasetStats,
    batch_count,
    capture_dataset,
    eta_text,
    iter_tensor_batches,
    shard,
    to_capture,
)
from gradexplorer.stats.merge import MergeStats
from tests.core.test_stats_merge import reference, reference_hist


class SeqNet(nn.Module):
    """A small sequence model with a module called twice and an in-place activation."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 16)
        self.act = nn.ReLU(inplace=True)
        self.mix = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):  # x: (B, T, 6)
        h = self.act(self.embed(x))
        h = self.act(self.mix(h)) + h
        return self.head(h.mean(dim=1))


def dataset(n: int = 23, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, 6, generator=g)
    x[3] *= 1e3  # one loud sample
    return x


def reference_per_batch(model: nn.Module, x: torch.Tensor, batch_size: int):
    """Per batch: every module output and its gradient (plain hooks + autograd.grad), and
    the parameter gradients, for the top1 target. The ReLU runs out of place here (same
    values), so that autograd.grad can be taken with respect to each output."""
    model.act.inplace = False
    out = []
    for xb in x.split(batch_size):
        outs: dict[tuple[str, int], torch.Tensor] = {}
        counts: dict[str, int] = {}
        handles = []
        for name, m in model.named_modules():
            if name:
                def keep(mod, a, o, _n=name, counts=counts, outs=outs):
                    i = counts.get(_n, 0)
                    counts[_n] = i + 1
                    outs[(_n, i)] = o
                handles.append(m.register_forward_hook(keep))
        y = model(xb)
        for h in handles:
            h.remove()
        scalar = y.max(dim=1).values.sum()
        keys = list(outs)
        params = dict(model.named_parameters())
        grads = torch.autograd.grad(scalar, [outs[k] for k in keys] + list(params.values()))
        out.append(({k: outs[k].detach() for k in keys}, dict(zip(keys, grads[:len(keys)])),
                    dict(zip(params, grads[len(keys):]))))
    model.act.inplace = True
    return out


def check_merged(s: MergeStats, parts: list[torch.Tensor]) -> None:
    values = torch.cat([p.reshape(-1) for p in parts]).double().numpy()
    ref = reference(values)
    summ = s.summary()
    assert summ["numel"] == ref["numel"] and summ["nan_count"] == 0
    assert summ["min"] == ref["min"] and summ["max"] == ref["max"]
    assert summ["mean"] == pytest.approx(ref["mean"], rel=1e-5, abs=1e-6 * ref["std"])
    assert summ["std"] == pytest.approx(ref["std"], rel=1e-5)
    np.testing.assert_array_equal(s.hist, reference_hist(values))


def test_merged_dataset_statistics_equal_all_samples_at_once():
    torch.manual_seed(0)
    model = SeqNet().eval()
    x = dataset()
    total = batch_count(len(x), 5)
    stats = capture_dataset(model, iter_tensor_batches(x, None, 5, range(total)), total_batches=total)
    ref = reference_per_batch(model, x, 5)
    assert stats.samples == 23 and stats.batches == 5
    for name, call in [("embed", 0), ("act", 0), ("act", 1), ("mix", 0), ("head", 0)]:
        check_merged(stats.rows[(name, call, "activation")], [r[0][(name, call)] for r in ref])
        check_merged(stats.rows[(name, call, "grad_output")], [r[1][(name, call)] for r in ref])
        norms = [r[1][(name, call)].reshape(r[1][(name, call)].shape[0], -1).double().norm(dim=1).float()
                 for r in ref]  # float64 norms, rounded once
        check_merged(stats.rows[(name, call, "grad_norm")], norms)
    for pname in ("embed.weight", "mix.bias", "head.weight"):
        per_batch = [r[2][pname] for r in ref]
        check_merged(stats.rows[(pname, 0, "grad")], per_batch)
        stack = torch.stack(per_batch).double().numpy()
        snr = stats.snr()[pname]
        assert snr["batches"] == 5
        assert snr["snr"] == pytest.approx((stack.mean(0) ** 2).sum() / stack.var(0, ddof=1).sum(), rel=1e-6)
    # the per-batch series is each batch's own statistics
    for b, r in enumerate(ref):
        _n, values = stats.series[b]
        g = r[1][("mix", 0)].double()
        assert values["mix#0:grad_output"][2] == pytest.approx(float(g.norm()), rel=1e-5)
    assert all(p.grad is None for p in model.parameters())
    assert all(not m._forward_hooks for m in model.modules())


@pytest.mark.slow
def test_ranks_shards_merge_to_the_single_process_result():
    torch.manual_seed(1)
    model = SeqNet().eval()
    x = dataset(31, seed=2)
    total = batch_count(len(x), 4)
    single = capture_dataset(model, iter_tensor_batches(x, None, 4, range(total)))
    parts = [capture_dataset(model, iter_tensor_batches(x, None, 4, shard(range(total), r, 3))) for r in range(3)]
    merged = DatasetStats()
    for p in parts:
        merged = merged.merge(DatasetStats.from_dict(p.to_dict()))
    assert merged.rows.keys() == single.rows.keys()
    for key, s in single.rows.items():
        m = merged.rows[key]
        assert (m.count, m.nan_count, m.zero_count, m.min, m.max) == (s.count, s.nan_count, s.zero_count, s.min, s.max)
        np.testing.assert_array_equal(m.hist, s.hist)
        assert m.mean == pytest.approx(s.mean, rel=1e-12, abs=1e-15)
        assert m.m2 == pytest.approx(s.m2, rel=1e-10)
    assert merged.series == single.series
    for name, mo in single.moments.items():
        torch.testing.assert_close(merged.moments[name].mean, mo.mean, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(merged.moments[name].m2, mo.m2, rtol=1e-9, atol=1e-15)


@pytest.mark.slow
def test_memory_does_not_grow_with_batches_beyond_the_series():
    model = SeqNet().eval()
    small = capture_dataset(model, iter_tensor_batches(dataset(8), None, 4, range(2)))
    large = capture_dataset(model, iter_tensor_batches(dataset(80), None, 4, range(20)))
    assert small.rows.keys() == large.rows.keys()
    assert all(a.hist.shape == b.hist.shape for a, b in zip(small.rows.values(), large.rows.values()))
    assert len(large.series) == 20
    assert all(isinstance(v, float) for _n, vals in large.series.values() for row in vals.values() for v in row)


def test_cancel_between_batches_leaves_the_model_clean():
    model = SeqNet().eval()
    flag = threading.Event()

    def progress(done, total, samples):
        if done == 2:
            flag.set()

    with pytest.raises(CaptureCancelled):
        capture_dataset(model, iter_tensor_batches(dataset(40), None, 4, range(10)), progress=progress, cancel=flag)
    assert all(not m._forward_hooks for m in model.modules())
    assert all(p.grad is None for p in model.parameters())


def test_capture_file_round_trip(tmp_path):
    model = SeqNet().eval()
    stats = capture_dataset(model, iter_tensor_batches(dataset(12), None, 5, range(3)), layers=["mix", "head"])
    cap = to_capture(stats, model, ["mix", "head"], {"model": "seq"})
    path = save_capture(cap, tmp_path / "ds.pt")
    back = load_capture(path)
    assert back.mode == "stats"
    ds = back.meta["dataset"]
    assert ds["samples"] == 12 and ds["batches"] == 3
    assert ds["series"]["batch"] == [0, 1, 2]
    act = back["mix"].calls[0].stats["activation"]
    merged = MergeStats.from_dict({**act["merged"], "hist": act["merged"]["hist"].numpy()})
    assert merged.summary()["mean"] == pytest.approx(stats.rows[("mix", 0, "activation")].mean)
    assert act["hist_kind"] == "log2"
    assert back["mix"].param_stats["weight"]["numel"] == 3 * 16 * 16
    assert set(ds["snr"]) == {"mix.weight", "mix.bias", "head.weight", "head.bias"}


def test_eta_text():
    assert eta_text(0, 10, 0.0, 5.0) == "0/10 batches"
    assert eta_text(2, 10, 0.0, 30.0) == "2/10 batches, ETA 2m00s"
    assert eta_text(5, 10, 0.0, 5.0) == "5/10 batches, ETA 5s"


def test_a_force_field_and_an_lstm_on_h_n_over_a_dataset():
    """A model that takes forces = -dE/dpos in its forward: each batch's output gradients are
    those of the target's own backward (autograd through gradient edges), not the model's
    inner one's; an LSTM whose sequence output is unused gets no output gradient, and the
    capture runs."""
    from tests.core.test_capture_exactness import ForceField, LastState
    from tests.ground_truth import reference_by_edges

    torch.manual_seed(0)
    model, pos = ForceField().eval(), torch.randn(6, 3)
    stats = capture_dataset(model, iter_tensor_batches(pos, None, 6, range(1)), layers=["embed", "energy"])
    ref = reference_by_edges(model, (pos,), ["embed", "energy"], target="top1")
    want = ref["calls"]["embed"][0]["grad_output"]
    assert stats.rows[("embed", 0, "grad_output")].summary()["l2"] == pytest.approx(float(want.double().norm()),
                                                                                    rel=1e-5)
    assert ref["calls"]["energy"][0]["grad_output"] is None and ("energy", 0, "grad_output") not in stats.rows

    ids = torch.randint(0, 10, (8, 5))
    stats = capture_dataset(LastState(batch_first=False).eval(), iter_tensor_batches(ids, None, 4, range(2)))
    assert ("rnn", 0, "activation") in stats.rows and ("rnn", 0, "grad_output") not in stats.rows
    assert ("head", 0, "grad_output") in stats.rows
