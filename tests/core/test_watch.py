"""The watch inside a training loop: right numbers, nothing changed, hooks gone."""

from __future__ import annotations

import copy
import math
import sqlite3

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.recording.watch import watch
from gradexplorer.recording.watch_log import ALL_ROWS_QUERY, decode_hist, open_log, row_stats
from gradexplorer.stats.merge import MergeStats
from tests.core.test_stats_merge import reference, reference_hist


class Block(nn.Module):
    """A residual block with a shared activation called twice and an in-place residual."""

    def __init__(self, c: int, inplace: bool = True):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.act = nn.ReLU(inplace=inplace)
        self.inplace = inplace

    def forward(self, x):
        out = self.act(self.bn(self.conv1(x)))
        out = self.conv2(out)
        if self.inplace:
            out += x
        else:
            out = out + x
        return self.act(out)


class Net(nn.Module):
    def __init__(self, inplace: bool = True):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = Block(8, inplace)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        h = self.block(self.stem(x))
        return self.head(self.drop(h.mean(dim=(2, 3))))


def data(steps: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(6, 3, 8, 8, generator=g), torch.randint(0, 5, (6,), generator=g)) for _ in range(steps)]


def train(model, batches, w=None, opt_cls=torch.optim.SGD, **opt_kw):
    opt = opt_cls(model.parameters(), **(opt_kw or {"lr": 0.1, "momentum": 0.9}))
    torch.manual_seed(123)  # dropout
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if w is not None:
            w.step(loss=loss)
    return model


def no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
               and not m._backward_pre_hooks for m in model.modules())


def rows(path, **where) -> list[dict]:
    con = open_log(path)
    sql = "SELECT * FROM stats"
    if where:
        sql += " WHERE " + " AND ".join(f"{k} = ?" for k in where)
    out = [dict(r) for r in con.execute(sql + " ORDER BY step, layer, call, kind", tuple(where.values()))]
    con.close()
    return out


def test_watching_changes_nothing_bit_for_bit(tmp_path):
    torch.manual_seed(0)
    a = Net()
    b = copy.deepcopy(a)
    batches = data(7)
    train(a, batches)
    with watch(b, out=str(tmp_path / "run.gxw"), every=1) as w:
        train(b, batches, w)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
        assert torch.equal(pa.grad, pb.grad), name
    for (name, ba), bb in zip(a.named_buffers(), b.buffers()):
        assert torch.equal(ba, bb), name
    assert no_hooks(b)


def test_a_copy_of_the_model_made_in_a_watched_step_is_not_recorded(tmp_path):
    """``copy.deepcopy`` of the model during a watched step (an EMA or teacher copy) copies
    the watch's hook with it: the copy's calls are not the watched model's, and the log is
    the log of the same training without the copy."""
    logs = []
    for copies in (False, True):
        torch.manual_seed(0)
        model = Net().eval()
        batches = data(3, seed=5)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        path = tmp_path / f"run{copies}.gxw"
        with watch(model, out=str(path), every=1) as w:
            for x, y in batches:
                if copies:
                    twin = copy.deepcopy(model)
                    F.cross_entropy(twin(x), y).backward()  # its calls and gradients: not the model's
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                w.step(loss=loss)
        logs.append([{k: v for k, v in r.items() if k != "wall_time"} for r in rows(path)])
        assert no_hooks(model)
    assert len(logs[0]) > 0 and logs[1] == logs[0]


def test_adam_and_every_three(tmp_path):
    torch.manual_seed(1)
    a = Net()
    b = copy.deepcopy(a)
    batches = data(8, seed=4)
    train(a, batches, opt_cls=torch.optim.Adam, lr=1e-2)
    with watch(b, out=str(tmp_path / "run.gxw"), every=3, layers="block.*") as w:
        train(b, batches, w, opt_cls=torch.optim.Adam, lr=1e-2)
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters()))
    con = open_log(tmp_path / "run.gxw")
    steps = [r[0] for r in con.execute("SELECT step FROM steps ORDER BY step")]
    layers = {r[0] for r in con.execute("SELECT DISTINCT layer FROM stats WHERE kind = 'activation'")}
    con.close()
    assert steps == [0, 3, 6]
    assert layers == {"block.conv1", "block.bn", "block.conv2", "block.act"}


def test_hooks_only_during_watched_steps(tmp_path):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []
    with watch(model, out=str(tmp_path / "run.gxw"), every=2) as w:
        for i, (x, y) in enumerate(data(5)):
            seen.append((i, no_hooks(model)))
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.step(loss=loss)
    assert seen == [(0, False), (1, True), (2, False), (3, True), (4, False)]
    assert no_hooks(model)


def reference_step(model: Net, x, y):
    """Ground truth for one step: outputs kept by plain hooks, gradients by autograd.grad."""
    outs: dict[tuple[str, int], torch.Tensor] = {}
    handles = []
    counts: dict[str, int] = {}
    for name, m in model.named_modules():
        if name and not list(m.children()):
            def keep(mod, a, o, _n=name):
                i = counts.get(_n, 0)
                counts[_n] = i + 1
                outs[(_n, i)] = o
            handles.append(m.register_forward_hook(keep))
    torch.manual_seed(123)
    loss = F.cross_entropy(model(x), y)
    for h in handles:
        h.remove()
    keys = [k for k, t in outs.items() if t.requires_grad]
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, [outs[k] for k in keys] + list(params.values()))
    acts = {k: outs[k].detach().clone() for k in outs}
    out_grads = dict(zip(keys, grads[:len(keys)]))
    param_grads = dict(zip(params, grads[len(keys):]))
    return acts, out_grads, param_grads, float(loss.detach())


def assert_row_matches(row: dict, t: torch.Tensor):
    ref = reference(t.double().numpy().reshape(-1))
    s = row_stats(row).summary()
    assert row["numel"] == ref["numel"] and row["nan_count"] == ref["nan_count"]
    assert s["min"] == ref["min"] and s["max"] == ref["max"]
    assert s["mean"] == pytest.approx(ref["mean"], rel=1e-5, abs=1e-6 * (ref["std"] + abs(ref["mean"])))
    assert s["std"] == pytest.approx(ref["std"], rel=1e-5)
    expected = reference_hist(t.double().numpy().reshape(-1))
    np.testing.assert_array_equal(decode_hist(row["hist_lo"], row["hist"]), expected)


def test_logged_gradients_equal_autograd_grad(tmp_path):
    """Watched run: the model without in-place ops, so that autograd.grad can be taken with
    respect to every module output of a copy of the model at the same step."""
    torch.manual_seed(2)
    model = Net(inplace=False).eval()  # eval: dropout off, so the copy's forward is the same
    batches = data(4, seed=9)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = tmp_path / "run.gxw"
    expected = {}
    with watch(model, out=str(path), every=2) as w:
        for i, (x, y) in enumerate(batches):
            if w.watching:
                expected[i] = reference_step(copy.deepcopy(model), x, y)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.step(loss=loss)
    assert sorted(expected) == [0, 2]
    for step, (acts, out_grads, param_grads, loss) in expected.items():
        got = {(r["layer"], r["call"], r["kind"]): r for r in rows(path, step=step)}
        for (name, call), t in acts.items():
            assert_row_matches(got[(name, call, "activation")], t)
        for (name, call), g in out_grads.items():
            assert_row_matches(got[(name, call, "grad_output")], g)
            norms = g.reshape(g.shape[0], -1).double().norm(dim=1)
            assert row_stats(got[(name, call, "grad_norm")]).mean == pytest.approx(float(norms.mean()), rel=1e-5)
        for name, g in param_grads.items():
            assert_row_matches(got[(name, 0, "grad")], g)
        # block.act runs twice per forward: two calls, each recorded apart
        assert ("block.act", 1, "grad_output") in got
        con = open_log(path)
        (logged_loss,) = con.execute("SELECT loss FROM steps WHERE step = ?", (step,)).fetchone()
        con.close()
        assert logged_loss == pytest.approx(loss, rel=1e-6)


def test_in_place_model_gets_the_same_gradients_as_its_out_of_place_twin(tmp_path):
    torch.manual_seed(3)
    a = Net(inplace=True).eval()
    b = Net(inplace=False).eval()
    b.load_state_dict(a.state_dict())
    for model, name in ((a, "a.gxw"), (b, "b.gxw")):
        with watch(model, out=str(tmp_path / name), every=1) as w:
            train(model, data(2, seed=5), w, lr=0.01)
    ra = {(r["step"], r["layer"], r["call"], r["kind"]): r for r in rows(tmp_path / "a.gxw")}
    rb = {(r["step"], r["layer"], r["call"], r["kind"]): r for r in rows(tmp_path / "b.gxw")}
    assert ra.keys() == rb.keys()
    for key in ra:
        if key[3] == "activation" and key[1] == "block.act":
            continue  # the in-place ReLU's own output is overwritten by += afterwards: same stats anyway
        assert ra[key]["mean"] == pytest.approx(rb[key]["mean"], rel=1e-4, abs=1e-7), key
        assert ra[key]["std"] == pytest.approx(rb[key]["std"], rel=1e-4, abs=1e-7), key


def test_update_ratio_and_weights(tmp_path):
    torch.manual_seed(4)
    model = Net().eval()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with watch(model, out=str(tmp_path / "run.gxw"), every=5) as w:
        train(model, data(1), w, lr=0.1, momentum=0.0)
    got = {r["layer"]: r for r in rows(tmp_path / "run.gxw", kind="weight")}
    assert got.keys() == before.keys()
    for name, p in model.named_parameters():
        expected = float((p.detach().double() - before[name].double()).norm() / before[name].double().norm())
        assert got[name]["update_ratio"] == pytest.approx(expected, rel=1e-9)
        assert_row_matches(got[name], before[name])


def test_log_reads_with_one_pandas_query(tmp_path):
    pd = pytest.importorskip("pandas")
    model = Net()
    with watch(model, out=str(tmp_path / "run.gxw"), every=1, layers=["stem", "head"]) as w:
        train(model, data(3), w)
    con = sqlite3.connect(tmp_path / "run.gxw")
    df = pd.read_sql(ALL_ROWS_QUERY, con)
    con.close()
    assert set(df["step"]) == {0, 1, 2}
    assert {"layer", "call", "kind", "rank", "mean", "std", "hist", "loss", "update_ratio"} <= set(df.columns)
    assert df["loss"].notna().all()
    assert set(df[df.kind == "activation"]["layer"]) == {"stem", "head"}


def test_nan_is_counted_and_training_left_alone(tmp_path):
    model = Net().eval()
    with torch.no_grad():
        model.stem.weight[0, 0, 0, 0] = float("nan")
    with watch(model, out=str(tmp_path / "run.gxw"), every=1, layers="stem") as w:
        train(model, data(1), w)
    got = {(r["layer"], r["kind"]): r for r in rows(tmp_path / "run.gxw")}
    assert got[("stem", "activation")]["nan_count"] > 0
    assert got[("stem.weight", "weight")]["nan_count"] == 1


def test_compiled_module_is_reported_not_skipped_silently(tmp_path):
    model = Net()
    model.block = torch.compile(model.block, backend="eager")
    with watch(model, out=str(tmp_path / "run.gxw"), every=1) as w:
        train(model, data(1), w)
    assert any(layer == "block" and "torch.compile" in msg for _s, layer, msg in w.reports)
    con = open_log(tmp_path / "run.gxw")
    reports = con.execute("SELECT layer, message FROM reports").fetchall()
    acts = {r[0] for r in con.execute("SELECT layer FROM stats WHERE kind = 'activation'")}
    grads = {r[0] for r in con.execute("SELECT layer FROM stats WHERE kind = 'grad'")}
    con.close()
    assert any(r[0] == "block" for r in reports)
    assert "stem" in acts and not any(a.startswith("block.") for a in acts)
    assert "block._orig_mod.conv1.weight" in grads  # parameters are still recorded
    assert no_hooks(model)


def test_bad_arguments_say_what_to_do(tmp_path):
    with pytest.raises(GradExplorerError, match="every"):
        watch(Net(), out=str(tmp_path / "x.gxw"), every=0)
    with pytest.raises(GradExplorerError, match="No module"):
        watch(Net(), out=str(tmp_path / "x.gxw"), layers="layer9.*")
    w = watch(Net(), out=str(tmp_path / "x.gxw"))
    with pytest.raises(GradExplorerError, match="with"):
        w.step()
    (tmp_path / "not_a_log.gxw").write_bytes(b"hello")
    with pytest.raises(GradExplorerError):
        open_log(tmp_path / "not_a_log.gxw")


def test_exception_inside_the_loop_removes_hooks(tmp_path):
    model = Net()
    with pytest.raises(RuntimeError), watch(model, out=str(tmp_path / "run.gxw"), every=1):
        model(torch.randn(2, 4))  # wrong shape: forward raises
    assert no_hooks(model)
    assert all(not math.isnan(float(p.detach().sum())) for p in model.parameters())


def test_grad_scaler_scale_is_divided_out(tmp_path):
    torch.manual_seed(6)
    model = Net().eval()
    twin = copy.deepcopy(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = data(1)[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, out=str(tmp_path / "amp.gxw"), every=1, layers="head", scaler=scaler) as w:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        w.step(loss=loss)
    with watch(twin, out=str(tmp_path / "plain.gxw"), every=1, layers="head") as w2:
        train(twin, [(x, y)], w2, lr=0.01, momentum=0.0)
    a = {(r["layer"], r["kind"]): r for r in rows(tmp_path / "amp.gxw")}
    b = {(r["layer"], r["kind"]): r for r in rows(tmp_path / "plain.gxw")}
    for key in (("head", "grad_output"), ("head.weight", "grad")):
        assert a[key]["mean"] == pytest.approx(b[key]["mean"], rel=1e-5), key
        assert a[key]["std"] == pytest.approx(b[key]["std"], rel=1e-5), key


def test_merge_stats_from_rows_round_trip(tmp_path):
    model = Net()
    with watch(model, out=str(tmp_path / "run.gxw"), every=1, layers="stem") as w:
        train(model, data(2), w)
    r = rows(tmp_path / "run.gxw", kind="activation")
    merged = MergeStats.merge_all(row_stats(x) for x in r)
    assert merged.numel == sum(x["numel"] for x in r)


def test_pause_merges_the_micro_batches_of_a_step_and_record_gradients_keeps_what_the_optimizer_used(tmp_path):
    """Two micro-batches per step with ``w.pause(); w.resume()`` between them: one row per
    layer and call, the statistics of both micro-batches' tensors together (float64 NumPy);
    a forward while paused (an evaluation) is not recorded; the gradients read by
    ``record_gradients()`` are logged, not the ``.grad`` that is cleared before ``step()``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    micro = [(torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(4)]
    path = tmp_path / "acc.gxw"
    acts: list[torch.Tensor] = []
    used: list[torch.Tensor] = []
    with watch(model, out=str(path), every=1) as w:
        for i, (x, y) in enumerate(micro):
            w.resume()
            h = model[0](x)
            acts.append(h.detach().clone())
            F.cross_entropy(model[2](model[1](h)), y).backward()
            w.pause()
            model(torch.randn(7, 4))  # an evaluation between batches: not recorded
            if i % 2 == 1:
                w.record_gradients()
                used.append(model[0].weight.grad.detach().clone())
                opt.step()
                opt.zero_grad(set_to_none=True)  # .grad is gone when step() comes
                w.step()
    for step in (0, 1):
        (act,) = rows(path, step=step, layer="0", kind="activation")
        assert act["call"] == 0
        assert_row_matches(act, torch.cat(acts[2 * step: 2 * step + 2]))
        (grad,) = rows(path, step=step, layer="0.weight", kind="grad")
        assert_row_matches(grad, used[step])
    assert no_hooks(model)
