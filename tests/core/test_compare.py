"""gradexplorer.comparison.compare against hand computation, plain autograd and float64 NumPy."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from gradexplorer.analysis.gradient_flow import flow_series
from gradexplorer.capturing.capture import capture
from gradexplorer.comparison.compare import (
    CompareError,
    Tolerance,
    compare,
    csv_text,
    flow_comparison,
    heatmap_triple,
    histogram_distance,
    map_name,
    save_csv,
    stats_diff,
    tensor_diff,
)
from gradexplorer.files.capture_file import load_capture, save_capture
from gradexplorer.stats.moments import STAT_KEYS as ALL_STAT_KEYS
from gradexplorer.stats.tensor_stats import tensor_stats


def _np(t):
    return t.detach().double().numpy().reshape(-1)


def _expected(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> dict:
    """Independent float64 NumPy figures for two finite tensors."""
    x, y = _np(a), _np(b)
    d = y - x
    na, nb = np.linalg.norm(x), np.linalg.norm(y)
    return {
        "rel_l2": np.linalg.norm(d) / na,
        "cosine": float(x @ y) / (na * nb),
        "max_abs": np.abs(d).max(),
        "norm_ratio": nb / na,
        "outside": int((~np.isclose(y, x, rtol=rtol, atol=atol)).sum()),
    }


def _check(diff, expected, rel=1e-12):
    for k, v in expected.items():
        got = getattr(diff, k)
        if k == "outside":
            assert got == v, (k, got, v)
        else:
            assert got == pytest.approx(v, rel=rel, abs=1e-15), (k, got, v)


# -- tensors, by hand ---------------------------------------------------------------


def test_tensor_diff_by_hand():
    a = torch.tensor([3.0, 4.0])
    b = torch.tensor([3.0, 5.0])
    d = tensor_diff(a, b, Tolerance(rtol=0.0, atol=0.5))
    assert d.rel_l2 == pytest.approx(1 / 5)
    assert d.cosine == pytest.approx((9 + 20) / (5 * math.sqrt(34)))
    assert d.max_abs == 1.0
    assert d.norm_ratio == pytest.approx(math.sqrt(34) / 5)
    assert (d.outside, d.numel, d.within) == (1, 2, False)
    # |5 - 4| = 1 <= 0 + 0.25 * 4: within.
    assert tensor_diff(a, b, Tolerance(rtol=0.25, atol=0.0)).within


def test_tensor_diff_matches_numpy_on_adversarial_values():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(1000, generator=g) * torch.logspace(-20, 20, 1000)
    b = a * (1 + 1e-3 * torch.randn(1000, generator=g)) + 1e-7 * torch.randn(1000, generator=g)
    d = tensor_diff(a, b, Tolerance(1e-3, 1e-6))
    _check(d, _expected(a, b, 1e-3, 1e-6), rel=1e-9)


def test_tensor_diff_of_half_precision_is_taken_in_float64():
    a = torch.randn(64, 8).to(torch.bfloat16)
    b = (a.float() + 2 ** -7).to(torch.bfloat16)
    _check(tensor_diff(a, b), _expected(a.float(), b.float(), 1e-5, 1e-8))


def test_identical_tensors_are_exactly_zero_and_cosine_exactly_one():
    a = torch.randn(3, 17, 5) * 1e6
    d = tensor_diff(a, a.clone())
    assert (d.rel_l2, d.max_abs, d.cosine, d.norm_ratio, d.outside) == (0.0, 0.0, 1.0, 1.0, 0)


def test_zero_tensors():
    z = torch.zeros(4)
    d = tensor_diff(z, z)
    assert (d.rel_l2, d.cosine, d.norm_ratio, d.within) == (0.0, 1.0, 1.0, True)
    d = tensor_diff(z, torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert (d.rel_l2, d.cosine, d.norm_ratio, d.outside) == (math.inf, 0.0, math.inf, 1)


def test_nan_against_nan_is_equal_and_other_non_finite_mismatches_diverge():
    a = torch.tensor([math.nan, math.inf, 1.0, 2.0])
    same = tensor_diff(a, a.clone())
    assert same.within and same.rel_l2 == 0.0 and same.max_abs == 0.0
    d = tensor_diff(a, torch.tensor([math.nan, -math.inf, 1.0, 2.0]))
    assert d.outside == 1 and not d.within
    assert d.rel_l2 == math.inf and d.max_abs == math.inf and math.isnan(d.cosine)


def test_shapes_must_agree():
    with pytest.raises(CompareError, match="shape"):
        tensor_diff(torch.zeros(2, 3), torch.zeros(3, 2))


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_tolerance_is_refused(bad):
    with pytest.raises(CompareError, match="tolerance"):
        Tolerance(rtol=bad)


# -- statistics ----------------------------------------------------------------------


def test_stats_diff_by_hand():
    a = torch.tensor([1.0, -2.0, 0.0, 3.0])
    b = torch.tensor([1.0, -2.0, 0.5, 4.0])
    sa, sb = tensor_stats(a), tensor_stats(b)
    sd = stats_diff(sa, sb, Tolerance(0.0, 0.0))
    x, y = _np(a), _np(b)
    assert sd.differences["max"] == pytest.approx(1.0)
    assert sd.differences["mean"] == pytest.approx(y.mean() - x.mean())
    assert sd.differences["std"] == pytest.approx(y.std(ddof=1) - x.std(ddof=1), rel=1e-6)
    assert sd.differences["l2"] == pytest.approx(np.linalg.norm(y) - np.linalg.norm(x), rel=1e-6)
    assert sd.differences["zero_fraction"] == pytest.approx(-0.25)
    assert sd.norm_ratio == pytest.approx(np.linalg.norm(y) / np.linalg.norm(x), rel=1e-6)
    assert sd.rel_norm_diff == pytest.approx(abs(np.linalg.norm(y) - np.linalg.norm(x)) / np.linalg.norm(x),
                                             rel=1e-6)
    # the triangle inequality: a lower bound of the relative L2 difference
    assert sd.rel_norm_diff <= tensor_diff(a, b).rel_l2
    assert not sd.within
    assert stats_diff(sa, sb, Tolerance(rtol=0.5, atol=0.3)).within
    assert set(sd.differences) >= {"min", "max", "mean", "std", "mean_abs", "l2", "zero_fraction"}


def test_stats_diff_of_equal_statistics_is_zero():
    s = tensor_stats(torch.randn(10_000) * 1e3)
    sd = stats_diff(s, dict(s))
    assert all(v == 0.0 for v in sd.differences.values())
    assert (sd.norm_ratio, sd.rel_norm_diff, sd.hist_distance, sd.within) == (1.0, 0.0, 0.0, True)


def test_histogram_distance_by_hand():
    # Two uniform densities: [0, 1) and [0.5, 1.5) overlap on half their mass.
    a = {"hist": torch.tensor([1.0, 1.0]), "hist_range": (0.0, 1.0)}
    b = {"hist": torch.tensor([1.0, 1.0]), "hist_range": (0.5, 1.5)}
    assert histogram_distance(a, b) == pytest.approx(0.5)
    far = {"hist": torch.tensor([3.0]), "hist_range": (5.0, 6.0)}
    assert histogram_distance(a, far) == pytest.approx(1.0)
    assert histogram_distance(a, a) == 0.0


# -- captures ------------------------------------------------------------------------


class Chain(nn.Module):
    """Three linear layers, no non-linearity: gradients are plain matrix products."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 3)
        self.l3 = nn.Linear(3, 2)

    def forward(self, x):
        return self.l3(self.l2(self.l1(x)))


def _ground_truth(model, x, names):
    """Activations and output gradients of `target=sum` by plain autograd (no hooks)."""
    acts = {}
    h = x
    for n in names:
        h = getattr(model, n)(h)
        acts[n] = h
    grads = torch.autograd.grad(h.sum(), [acts[n] for n in names])
    return {n: a.detach() for n, a in acts.items()}, dict(zip(names, grads))


def test_two_models_against_autograd_and_numpy():
    torch.manual_seed(1)
    ma, mb = Chain(), Chain()
    mb.load_state_dict(ma.state_dict())
    with torch.no_grad():
        mb.l2.weight.mul_(1.5)
    x = torch.randn(6, 4)
    ca = capture(ma, x, target="sum")
    cb = capture(mb, x, target="sum")
    tol = Tolerance(1e-4, 1e-6)
    result = compare(ca, cb, tolerance=tol)
    names = ["l1", "l2", "l3"]
    acts_a, grads_a = _ground_truth(ma, x, names)
    acts_b, grads_b = _ground_truth(mb, x, names)
    assert [c.layer for c in result.calls] == names
    for c in result.calls:
        _check(c.kinds["activation"].tensor, _expected(acts_a[c.layer], acts_b[c.layer], 1e-4, 1e-6), rel=1e-9)
        if c.layer != "l3":  # l3's output gradient is ones in both: rel_l2 0, cosine 1
            _check(c.kinds["grad_output"].tensor, _expected(grads_a[c.layer], grads_b[c.layer], 1e-4, 1e-6),
                   rel=1e-9)
    # l1's activation is untouched; l2 is where the forward diverges first.
    assert result.calls[0].kinds["activation"].tensor.max_abs == 0.0
    assert result.first_divergent_activation.layer == "l2"
    # d(sum)/d(l3 out) = 1 and d/d(l2 out) = W3^T 1 are unchanged; d/d(l1 out) = W2^T W3^T 1
    # changes: the first gradient to diverge in backward order is l1's.
    assert result.calls[2].kinds["grad_output"].tensor.rel_l2 == 0.0
    assert result.calls[1].kinds["grad_output"].tensor.rel_l2 == 0.0
    assert result.first_divergent_gradient.layer == "l1"
    assert not result.within
    # parameter gradients: l2.weight's gradient is l2-input^T @ grad, unchanged; l1's changes.
    pd = {(p.layer, p.param): p for p in result.params}
    assert pd[("l3", "weight")].diff.tensor.rel_l2 > 0  # l3 sees l2's changed output
    assert pd[("l2", "weight")].diff.tensor.rel_l2 == 0.0
    assert pd[("l1", "weight")].diff.tensor.rel_l2 > 0
    # the table: first divergent activation on top, then the first divergent gradient.
    order = result.by_divergence()
    assert [c.layer for c in order[:2]] == ["l2", "l1"]
    assert result.output.rel_l2 > 0 and result.input.rel_l2 == 0.0


def _every_figure_is_zero(result):
    assert result.within and not result.only_a and not result.only_b
    assert result.calls and result.params
    for c in result.calls:
        assert c.kinds
        for kd in c.kinds.values():
            if kd.tensor is not None:
                t = kd.tensor
                assert (t.rel_l2, t.max_abs, t.cosine, t.norm_ratio, t.outside) == (0.0, 0.0, 1.0, 1.0, 0)
            s = kd.stats
            assert all(v == 0.0 for v in s.differences.values()), s.differences
            assert (s.rel_norm_diff, s.norm_ratio) == (0.0, 1.0)
            assert s.hist_distance == 0.0 or math.isnan(s.hist_distance)
    for p in result.params:
        if p.diff.tensor is not None:
            assert p.diff.tensor.rel_l2 == 0.0 and p.diff.tensor.max_abs == 0.0
        assert all(v == 0.0 for v in p.diff.stats.differences.values())


@pytest.mark.slow
def test_resnet18_compared_with_itself_is_exactly_zero(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    net = torchvision.models.resnet18(num_classes=10).eval()
    cap = capture(net, torch.randn(2, 3, 32, 32))
    _every_figure_is_zero(compare(cap, cap))
    # and through the file, against a second, independent run
    save_capture(cap, tmp_path / "a.pt")
    again = capture(net, cap.input)
    _every_figure_is_zero(compare(load_capture(tmp_path / "a.pt"), again))


def test_capture_with_nan_compared_with_itself_is_zero():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
    x = torch.randn(4, 3)
    x[1, 0] = math.nan
    cap = capture(model, x, target="sum")
    _every_figure_is_zero(compare(cap, cap))


def test_statistics_only_pair_compares_by_statistics():
    torch.manual_seed(2)
    ma = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    mb = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(5, 8)
    sa = capture(ma, x, target="sum", mode="stats")
    sb = capture(mb, x, target="sum", mode="stats")
    fa = capture(ma, x, target="sum")
    fb = capture(mb, x, target="sum")
    by_stats = compare(sa, sb)
    by_tensors = compare(fa, fb)
    assert by_stats.by_statistics and not by_tensors.by_statistics
    assert not by_stats.within
    for cs, ct in zip(by_stats.calls, by_tensors.calls):
        for kind, kd in cs.kinds.items():
            assert kd.by == "stats" and kd.tensor is None
            a_stats = sa[cs.layer].calls[cs.call].stats[kind]
            b_stats = sb[cs.layer].calls[cs.call].stats[kind]
            for key, v in kd.stats.differences.items():
                assert v == pytest.approx(float(b_stats[key]) - float(a_stats[key]), abs=1e-12)
            # statistics bound the tensor figures from below and agree on the norm ratio
            assert kd.divergence <= ct.kinds[kind].tensor.rel_l2 * (1 + 1e-5)
            assert kd.stats.norm_ratio == pytest.approx(ct.kinds[kind].tensor.norm_ratio, rel=1e-5)
    assert by_stats.first_divergent_activation is not None
    # a full capture against a statistics-only one: by statistics too
    mixed = compare(fa, sb)
    assert mixed.by_statistics
    assert [c.divergence for c in mixed.calls] == pytest.approx([c.divergence for c in by_stats.calls])
    _every_figure_is_zero(compare(sa, sa))


def test_unmatched_layers_are_listed_and_mapping_renames():
    torch.manual_seed(0)
    ma = nn.Sequential()
    ma.add_module("fc", nn.Linear(3, 4))
    ma.add_module("act", nn.ReLU())
    ma.add_module("out", nn.Linear(4, 2))
    mb = nn.Sequential()
    mb.add_module("fc", nn.Linear(3, 4))
    mb.add_module("act", nn.ReLU())
    mb.add_module("head", nn.Linear(4, 2))
    mb.load_state_dict({k.replace("out.", "head."): v for k, v in ma.state_dict().items()})
    x = torch.randn(2, 3)
    ca, cb = capture(ma, x, target="sum"), capture(mb, x, target="sum")
    plain = compare(ca, cb)
    assert plain.only_a == ["out"] and plain.only_b == ["head"]
    assert not plain.within  # a layer that disappeared fails a regression check
    assert all(c.within for c in plain.calls)
    mapped = compare(ca, cb, mapping={"out": "head"})
    assert mapped.within and not mapped.only_a and not mapped.only_b
    assert [c.label for c in mapped.calls][-1] == "out -> head"


def test_prefix_mapping():
    m = {"backbone.": "encoder.", "backbone.fc": "head", "module.": ""}
    assert map_name("backbone.layer1.conv", m) == "encoder.layer1.conv"
    assert map_name("backbone.fc", m) == "head"
    assert map_name("module.conv1", m) == "conv1"
    assert map_name("other", m) == "other"
    with pytest.raises(CompareError, match="prefix"):
        compare_mapping_error = {"backbone.": "encoder"}
        from gradexplorer.comparison.compare import check_mapping

        check_mapping(compare_mapping_error)


def test_no_layer_in_common_is_a_clear_error():
    a = capture(nn.Sequential(nn.Linear(3, 2)), torch.randn(2, 3), target="sum", meta={"model": "mlp"})
    conv = nn.Sequential()
    conv.add_module("conv", nn.Conv2d(3, 2, 3))
    b = capture(conv, torch.randn(1, 3, 5, 5), target="sum", meta={"model": "cnn"})
    with pytest.raises(CompareError) as info:
        compare(a, b)
    text = str(info.value)
    assert "no layer in common" in text and "mlp: 0" in text and "cnn: conv" in text


def test_shape_and_type_differences_are_divergent_not_crashes():
    a = capture(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1)), torch.randn(2, 3), target="sum")
    b = capture(nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 1)), torch.randn(2, 3), target="sum")
    r = compare(a, b)
    assert "shapes differ: 2x4 against 2x5" in r.calls[0].note
    assert not r.within and r.first_divergent_activation is r.calls[0]
    assert math.isinf(r.calls[0].divergence)
    assert any(row["note"].startswith("shapes differ") for row in r.rows())


class Reused(nn.Module):
    def __init__(self, times: int):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.Tanh()
        self.times = times

    def forward(self, x):
        for _ in range(self.times):
            x = self.act(self.lin(x))
        return x


def test_calls_are_matched_by_index():
    torch.manual_seed(0)
    m2, m3 = Reused(2), Reused(3)
    m3.load_state_dict(m2.state_dict())
    x = torch.randn(2, 4)
    r = compare(capture(m2, x, target="sum"), capture(m3, x, target="sum"))
    assert [(c.layer, c.call) for c in r.calls] == [("lin", 0), ("act", 0), ("lin", 1), ("act", 1)]
    assert all(c.kinds["activation"].tensor.rel_l2 == 0.0 for c in r.calls)
    assert sorted(r.only_b) == ["act#2", "lin#2"]
    assert not r.within


class TinySeq(nn.Module):
    """Tokens -> embedding -> LSTM (tuple output) -> linear per step."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.rnn = nn.LSTM(8, 6, batch_first=True)
        self.head = nn.Linear(6, 11)

    def forward(self, tokens):
        h, _ = self.rnn(self.emb(tokens))
        return self.head(h)


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(5, 6)
        self.cls = nn.Linear(6, 3)
        self.aux = nn.Linear(6, 2)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return {"out": self.cls(h), "aux": self.aux(h)}


@pytest.mark.parametrize("make, x, target", [
    (TinySeq, lambda: torch.randint(0, 11, (3, 7)), "sum"),
    (DictOut, lambda: torch.randn(4, 5), "top1@out"),
])
def test_sequence_and_dict_output_models(make, x, target):
    torch.manual_seed(0)
    ma = make()
    mb = make()
    mb.load_state_dict(ma.state_dict())
    with torch.no_grad():
        last = list(mb.parameters())[-3 if make is DictOut else -1]
        last.add_(0.1)
    inputs = x()
    ca, cb = capture(ma, inputs, target=target), capture(mb, inputs, target=target)
    _every_figure_is_zero(compare(ca, ca))
    r = compare(ca, cb)
    assert not r.within and not r.only_a and not r.only_b
    first = r.first_divergent_activation
    assert first is not None and first.layer in ("head", "cls")
    # every layer before the changed one is identical
    before = r.calls[: r.calls.index(first)]
    assert before and all(c.kinds["activation"].tensor.max_abs == 0.0 for c in before)


@pytest.mark.slow
def test_resnet18_float32_against_bf16_autocast_diverges_with_depth():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64)
    a = capture(net, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        b = capture(net, x)
    assert b["layer4.1.conv2"].calls[0].activation.dtype == torch.bfloat16
    r = compare(a, b, label_a="float32", label_b="bf16", rtol=1e-2, atol=1e-3)
    act = [c.kinds["activation"].tensor.rel_l2 for c in r.calls]
    grads = [c.kinds["grad_output"].tensor.rel_l2 for c in r.calls]
    # The forward's error accumulates layer after layer...
    assert np.mean(act[-10:]) > 1.5 * np.mean(act[:4])
    # ... and the gradient's along the backward pass, from the output to the input.
    assert np.mean(grads[:4]) > 2 * np.mean(grads[-12:-2]) > 0
    assert r.calls[-1].layer == "fc" and grads[-1] == 0.0  # d(top1)/d(logits): one-hot in both
    # bf16 rounds every conv1 output: the first layer diverges at any tight tolerance.
    assert r.first_divergent_activation.layer == "conv1"
    assert r.first_divergent_gradient is not None
    assert r.first_divergent_gradient.layer != "fc"
    assert not r.within


# -- export and pictures -------------------------------------------------------------


def test_csv_rows_and_atomic_write(tmp_path):
    torch.manual_seed(0)
    ma, mb = Chain(), Chain()
    x = torch.randn(3, 4)
    r = compare(capture(ma, x, target="sum"), capture(mb, x, target="sum"))
    path = save_csv(r, tmp_path / "diff.csv")
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == sum(len(c.kinds) for c in r.calls) + len(r.params)
    first = rows[0]
    assert (first["layer"], first["kind"], first["by"]) == ("l1", "activation", "tensor")
    assert float(first["rel_l2"]) == r.calls[0].kinds["activation"].tensor.rel_l2
    assert first["within"] == "no"
    assert csv_text(r) == path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["diff.csv"]


def test_heatmap_triple_shares_one_symmetric_scale():
    a = torch.zeros(3, 4, 4)
    a[1] = 2.0
    b = a.clone()
    b[1, 0, 0] = -5.0
    t = heatmap_triple(a, b, "channel", channel=1)
    assert t.levels == (-7.0, 7.0)  # a - b = 7 at (0, 0)
    assert t.diff.array[0, 0] == 7.0 and t.diff.array[1, 1] == 0.0
    np.testing.assert_array_equal(t.a.array - t.b.array, t.diff.array)
    # top-k: B and the difference show A's channels
    tk = heatmap_triple(a, b, "topk", k=2)
    assert tk.a.channels == tk.b.channels == tk.diff.channels
    with pytest.raises(CompareError):
        heatmap_triple(a, torch.zeros(2, 4, 4))


def test_flow_comparison_reuses_flow_series():
    torch.manual_seed(0)
    ma, mb = Chain(), Chain()
    x = torch.randn(3, 4)
    ca, cb = capture(ma, x, target="sum"), capture(mb, x, target="sum")
    fc = flow_comparison(ca, cb)
    assert fc.names == ["l1", "l2", "l3"]
    assert fc.a == flow_series(ca)[1] and fc.b == flow_series(cb)[1]
    assert fc.ratio == pytest.approx([y / v for v, y in zip(fc.a, fc.b)])


def test_statistics_keys_cover_core_stats():
    from gradexplorer.comparison.compare import STAT_KEYS

    scalar = [k for k in ALL_STAT_KEYS if k not in ("numel", "hist", "hist_range", "hist_exact", "overflow")]
    assert set(scalar) <= set(STAT_KEYS)


def test_forward_order_is_the_order_calls_returned():
    torchvision = pytest.importorskip("torchvision")
    net = torchvision.models.resnet18(num_classes=4).eval()
    cap = capture(net, torch.randn(1, 3, 32, 32), layers="layer1.0.*")
    from gradexplorer.comparison.compare import forward_order

    # BasicBlock: relu's second call comes after bn2 (and the residual sum), not before conv2.
    assert forward_order(cap) == [("layer1.0.conv1", 0), ("layer1.0.bn1", 0), ("layer1.0.relu", 0),
                                  ("layer1.0.conv2", 0), ("layer1.0.bn2", 0), ("layer1.0.relu", 1)]
    r = compare(cap, cap)
    assert [(c.layer, c.call) for c in r.calls] == forward_order(cap)
    # a file without call_order (older captures): layers by first call, then calls
    old = type(cap)({k: v for k, v in cap.meta.items() if k != "call_order"}, cap.input, cap.output,
                    cap.input_grad, cap.layers)
    assert forward_order(old)[3] == ("layer1.0.relu", 1)


def test_default_tolerance_follows_the_captures_dtypes():
    """A bf16 (autocast) capture is judged at bf16's precision by default, float32 at NumPy's;
    a tolerance the user gives wins."""
    from gradexplorer.comparison.compare import DEFAULT_ATOL, DEFAULT_RTOL, HALF_TOLERANCES, default_tolerance

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(4, 8)
    a = capture(net, x, target="sum")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        b = capture(net, x, target="sum")
    assert default_tolerance(a, a) == (DEFAULT_RTOL, DEFAULT_ATOL)
    assert default_tolerance(a, b) == HALF_TOLERANCES["bfloat16"] == default_tolerance(b, a)
    r = compare(a, b)
    assert (r.tolerance.rtol, r.tolerance.atol) == HALF_TOLERANCES["bfloat16"]
    assert compare(a, b, rtol=1e-5).tolerance.rtol == 1e-5
