"""Merged statistics equal the statistics of all values at once (float64 NumPy reference)."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import torch

from gradexplorer.stats.merge import (
    HIST_BINS,
    ZERO_BIN,
    GradientMoments,
    MergeStats,
    hist_edges,
    log2_histogram,
    per_sample_norms,
    per_sample_norms_many,
)


def reference_hist(values: np.ndarray) -> np.ndarray:
    """Counts in the documented bins, from the edges alone: positive octaves are
    [2^k, 2^(k+1)), negative ones (-2^(k+1), -2^k], the zero bin (-2^-126, 2^-126)."""
    edges = hist_edges()
    v = values[np.isfinite(values)]
    pos = v[v >= 0]
    neg = v[v < 0]
    idx = np.concatenate([np.searchsorted(edges, pos, side="right") - 1,
                          np.searchsorted(edges, neg, side="left") - 1])
    return np.bincount(idx, minlength=HIST_BINS)


def reference(values: np.ndarray) -> dict:
    v = values.astype(np.float64)
    fin = v[np.isfinite(v)]
    return {
        "numel": v.size, "count": fin.size, "nan_count": int(np.isnan(v).sum()),
        "inf_count": int(np.isinf(v).sum()),
        "min": fin.min() if fin.size else math.nan, "max": fin.max() if fin.size else math.nan,
        "mean": fin.mean() if fin.size else math.nan,
        "std": fin.std(ddof=1) if fin.size > 1 else (0.0 if fin.size else math.nan),
        "mean_abs": np.abs(fin).mean() if fin.size else math.nan,
        "sum": fin.sum(), "hist": reference_hist(v),
    }


def check(merged: MergeStats, ref: dict, rtol: float) -> None:
    s = merged.summary()
    for key in ("numel", "count", "nan_count", "inf_count"):
        assert s[key] == ref[key], key
    np.testing.assert_array_equal(merged.hist, ref["hist"])
    assert merged.hist.sum() == ref["count"]
    if ref["count"] == 0:
        assert math.isnan(s["mean"])
        return
    assert s["min"] == ref["min"] and s["max"] == ref["max"]
    scale = abs(ref["mean"]) + ref["std"]
    assert abs(s["mean"] - ref["mean"]) <= rtol * ref["std"] + 1e-14 * abs(ref["mean"]) + 1e-300, \
        (s["mean"], ref["mean"])
    assert s["std"] == pytest.approx(ref["std"], rel=rtol, abs=1e-300)
    assert s["mean_abs"] == pytest.approx(ref["mean_abs"], rel=rtol)
    assert abs(s["sum"] - ref["sum"]) <= rtol * scale * ref["count"]


def chunks(t: torch.Tensor, rng: random.Random) -> list[torch.Tensor]:
    """Split into uneven pieces, including empty ones and single elements."""
    flat = t.reshape(-1)
    cuts = sorted({0, min(1, flat.numel()), flat.numel(), *(rng.randrange(flat.numel() + 1) for _ in range(6))})
    parts = [flat[a:b] for a, b in itertools.pairwise(cuts)]
    parts.insert(rng.randrange(len(parts) + 1), flat[:0])
    return parts


def adversarial(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = 20_000
    powers = torch.tensor([2.0 ** k for k in range(-130, 70, 3)] + [-(2.0 ** k) for k in range(-130, 70, 7)])
    with_bad = torch.randn(n, generator=g)
    with_bad[::97] = float("nan")
    with_bad[::101] = float("inf")
    with_bad[::103] = -float("inf")
    return {
        "normal": torch.randn(n, generator=g),
        "offset_1e4": 1e4 + 1e-2 * torch.randn(n, generator=g),  # |mean| >> std
        "offset_1e6_tiny": 1e6 + torch.randn(n, generator=g).round(),
        "huge": 1e20 * torch.randn(n, generator=g),  # squares overflow float32
        "near_max": 3e38 * torch.rand(n, generator=g),
        "tiny": 1e-30 * torch.randn(n, generator=g),  # squares underflow float32
        "subnormal_and_zero": torch.tensor([0.0, -0.0, 1e-40, -1e-40, 1e-45, 2.0 ** -126, -(2.0 ** -126)] * 10),
        "powers_of_two": powers,  # values on bin edges
        "relu_like": torch.relu(torch.randn(n, generator=g)),
        "nan_inf": with_bad,
        "all_nan": torch.full((50,), float("nan")),
        "constant": torch.full((999,), 3.25),
        "single": torch.tensor([-7.5]),
    }


@pytest.mark.parametrize("name", list(adversarial()))
def test_merge_of_pieces_equals_all_at_once(name):
    t = adversarial()[name]
    rng = random.Random(name)
    parts = chunks(t, rng)
    merged = MergeStats.merge_all(MergeStats.of_tensor(p) for p in parts)
    check(merged, reference(t.double().numpy()), rtol=2e-6)
    whole = MergeStats.of_tensor(t)
    check(whole, reference(t.double().numpy()), rtol=2e-6)


@pytest.mark.parametrize("name", ["normal", "offset_1e4", "huge", "tiny", "nan_inf", "powers_of_two"])
def test_float64_values_merge_to_float64_precision(name):
    t = adversarial()[name].double() * (1 + 1e-9)  # values float32 cannot hold
    rng = random.Random(name)
    parts = chunks(t, rng)
    rng.shuffle(parts)
    merged = MergeStats.merge_all(MergeStats.of_tensor(p) for p in parts)
    check(merged, reference(t.numpy()), rtol=1e-11)


def test_merge_order_and_tree_shape_do_not_matter():
    t = adversarial()["offset_1e4"]
    parts = [MergeStats.of_tensor(p) for p in t.split(777)]
    left = MergeStats.merge_all(parts)
    right = MergeStats.merge_all(reversed(parts))
    half = len(parts) // 2
    tree = MergeStats.merge_all(parts[:half]) + MergeStats.merge_all(parts[half:])
    for other in (right, tree):
        assert other.count == left.count
        np.testing.assert_array_equal(other.hist, left.hist)
        assert other.mean == pytest.approx(left.mean, rel=1e-14)
        assert other.m2 == pytest.approx(left.m2, rel=1e-10)


def test_sum_of_squares_would_fail_where_chan_does_not():
    """The adversary is real: the naive float32 formula is far off on this data."""
    t = adversarial()["offset_1e4"]
    naive = math.sqrt(max(float((t * t).mean() - t.mean() ** 2), 0.0))
    ref = t.double().std().item()
    assert abs(naive - ref) > 10 * ref
    merged = MergeStats.merge_all(MergeStats.of_tensor(p) for p in t.split(1000))
    assert merged.std == pytest.approx(ref, rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_dtypes(dtype):
    t = (torch.randn(5000, generator=torch.Generator().manual_seed(3)) * 100).to(dtype)
    ref = reference(t.double().numpy())
    check(MergeStats.merge_all(MergeStats.of_tensor(p) for p in t.split(999)), ref, rtol=2e-6)


def test_histogram_bins_of_known_values():
    values = torch.tensor([1.0, 1.5, 1.99, 2.0, -1.0, -2.0, 0.0, 2.0 ** 70, -(2.0 ** -100), 1e-45])
    h = log2_histogram(values)
    assert h.sum() == 10
    assert h[ZERO_BIN] == 2  # 0.0 and the subnormal
    assert h[ZERO_BIN + 1 + 65] == 3  # [1, 2): octave k = 0
    assert h[ZERO_BIN + 1 + 66] == 1  # [2, 4)
    assert h[ZERO_BIN - 1 - 65] == 1  # [-2, -1] ... -1.0
    assert h[ZERO_BIN - 1 - 66] == 1  # -2.0
    assert h[-1] == 1 and h[ZERO_BIN - 1] == 1  # overflow, negative underflow
    np.testing.assert_array_equal(h.numpy(), reference_hist(values.double().numpy()))
    np.testing.assert_array_equal(log2_histogram(values.double()).numpy(), h.numpy())


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
def test_histogram_and_statistics_of_strided_views(compiled, monkeypatch):
    import gradexplorer.stats.merge_cpu

    if not compiled:  # the torch path (no numba, or a GPU tensor) must take views too
        monkeypatch.setattr(gradexplorer.stats.merge_cpu, "fold_counts", lambda *a: None)
        monkeypatch.setattr(gradexplorer.stats.merge_cpu, "moments_and_counts", lambda *a: None)
    base = torch.randn(2_000, generator=torch.Generator().manual_seed(3)) * 1e3
    for view in (base[::2], base.view(40, 50).t(), base.view(40, 50)[:, 1]):
        values = view.double().numpy().reshape(-1)
        np.testing.assert_array_equal(log2_histogram(view).numpy(), reference_hist(values))
        # The float32 tolerance of the other tests: the torch path sums deviations in float32.
        check(MergeStats.of_tensor(view), reference(values), rtol=2e-6)


def test_serialisation_round_trip():
    s = MergeStats.of_tensor(adversarial()["nan_inf"])
    back = MergeStats.from_dict(s.to_dict())
    assert back.summary() == s.summary()
    np.testing.assert_array_equal(back.hist, s.hist)


def test_per_sample_norms_match_numpy():
    g = torch.randn(6, 3, 4, 5, dtype=torch.float16)
    ref = np.sqrt((g.double().numpy().reshape(6, -1) ** 2).sum(axis=1))
    np.testing.assert_allclose(per_sample_norms(g).numpy(), ref, rtol=1e-6)
    parts = [MergeStats.of_tensor(per_sample_norms(b)) for b in g.split(2)]
    merged = MergeStats.merge_all(parts)
    check(merged, reference(per_sample_norms(g).double().numpy()), rtol=1e-6)


def test_per_sample_norms_of_many_gradients_together_equal_each_ones_own(monkeypatch):
    """``per_sample_norms_many`` (the watch's small gradients of a step) gives each gradient
    exactly what ``per_sample_norms`` gives it alone, bit for bit, and float64 NumPy's norms
    rounded to float32: adversarial values as batches of several widths, strided, 3-D, half
    and float64 among them; the gradients of one width in one compiled call."""
    from gradexplorer.stats import merge_cpu

    calls = []
    real = merge_cpu.row_norms

    def counted(x):
        calls.append(tuple(x.shape))
        return real(x)

    monkeypatch.setattr(merge_cpu, "row_norms", counted)
    grads = []
    for i, t in enumerate(adversarial(2).values()):
        width = (7, 64, 7, 3)[i % 4]
        rows = max(1, min(t.numel() // width, 5))
        grads.append(t[:rows * width].reshape(rows, width) if t.numel() >= width else t.reshape(-1, 1))
    grads.append(torch.randn(21, 64)[::3].t())  # strided, 7 values a sample
    grads.append(torch.randn(4, 2, 32) * 1e-30)  # 64 values a sample, 3-D
    grads.append(torch.randn(3, 7).half())
    grads.append(torch.randn(3, 7, dtype=torch.float64) * 1e200)
    got = per_sample_norms_many(grads)
    together = list(calls)
    for g, norms in zip(grads, got):
        alone = per_sample_norms(g)
        assert norms.dtype == alone.dtype and norms.shape == alone.shape
        assert torch.equal(norms.view(torch.int32), alone.view(torch.int32)) if norms.dtype == torch.float32 \
            else torch.equal(norms, alone)
        if g.dtype == torch.float32:
            values = g.double().numpy().reshape(g.shape[0], -1)
            with np.errstate(over="ignore"):  # float32 overflows to inf, as the norms do
                ref = np.sqrt((values * values).sum(axis=1)).astype(np.float32)
            np.testing.assert_allclose(norms.numpy(), ref, rtol=1e-6, equal_nan=True)
    if merge_cpu._kernels():  # float32: one call per number of values a sample; the others alone
        widths = {g.numel() // g.shape[0] for g in grads if g.dtype == torch.float32}
        alone = [g.numel() // g.shape[0] for g in grads if g.dtype != torch.float32]
        assert sorted(c[1] for c in together) == sorted([*widths, *alone])


def test_gradient_moments_match_numpy_and_merge():
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(4, 3, generator=gen) * 0.1 + 2.0 for _ in range(9)]
    stack = torch.stack(grads).double().numpy()
    a, b = GradientMoments(), GradientMoments()
    for g in grads[:4]:
        a.add(g)
    for g in grads[4:]:
        b.add(g)
    merged = a.merge(b)
    np.testing.assert_allclose(merged.mean.numpy(), stack.mean(axis=0), rtol=1e-12)
    var = stack.var(axis=0, ddof=1)
    np.testing.assert_allclose((merged.m2 / (merged.batches - 1)).numpy(), var, rtol=1e-10)
    s = merged.summary()
    assert s["batches"] == 9
    assert s["snr"] == pytest.approx((stack.mean(axis=0) ** 2).sum() / var.sum(), rel=1e-10)
    one = GradientMoments()
    one.add(grads[0])
    assert math.isnan(one.summary()["snr"])
    assert GradientMoments.from_dict(merged.to_dict()).summary() == s


def test_statistics_of_many_tensors_together_equal_each_tensors_own(monkeypatch):
    """``MergeStats.of_tensors`` (the watch's small tensors of a step, in one compiled call)
    gives each tensor exactly what ``of_tensor`` gives it alone, and holds against float64
    NumPy: the adversarial set side by side, strided and negated views, other dtypes, and
    empty tensors among them."""
    from gradexplorer.stats import merge, merge_cpu

    batches = []
    real = merge_cpu.moments_and_counts_many

    def counted(tensors, *args):
        got = real(tensors, *args)
        batches.append((len(tensors), got is not None))
        return got

    monkeypatch.setattr(merge_cpu, "moments_and_counts_many", counted)
    cases = dict(adversarial(1))
    cases["strided"] = torch.randn(64, 30)[:, ::3]
    # A few thousand values with every kind of bin (the kernel counts these one by one).
    small = torch.randn(3000) * 10.0 ** torch.randint(-40, 38, (3000,)).float()
    small[::7], small[1::11], small[2::13], small[3::17] = float("nan"), float("inf"), -float("inf"), 0.0
    small[4::19] = 1e-42  # subnormal
    cases["nan_inf_small"] = small
    cases["negated_view"] = torch.randn(500).neg()._neg_view()
    cases["float64"] = torch.randn(300, dtype=torch.float64) * 1e200
    cases["half"] = torch.randn(300).half()
    cases["empty"] = torch.empty(0, 3)
    names, tensors = list(cases), list(cases.values())
    together = MergeStats.of_tensors(tensors)
    assert len(together) == len(tensors)
    for name, t, got in zip(names, tensors, together):
        alone = MergeStats.of_tensor(t)
        assert got.to_dict().keys() == alone.to_dict().keys()
        for key, value in alone.to_dict().items():
            other = got.to_dict()[key]
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(other, value, err_msg=f"{name} {key}")
            else:
                assert other == value or (value != value and other != other), (name, key, other, value)
        if t.numel() and t.dtype != torch.float64:
            check(got, reference(t.detach().double().numpy()), 1e-5)
    if merge_cpu._kernels():
        # every non-empty float32 tensor in one call (all of them small here)
        assert batches == [(sum(t.dtype == torch.float32 and t.numel() > 0 for t in tensors), True)]
    # At most TOGETHER_BYTES in one call: the same numbers, in more calls.
    monkeypatch.setattr(merge, "TOGETHER_BYTES", 20_000 * 4)
    batches.clear()
    for got, few in zip(together, MergeStats.of_tensors(tensors)):
        assert few.to_dict().keys() == got.to_dict().keys()
        for key, value in got.to_dict().items():
            other = few.to_dict()[key]
            assert np.array_equal(other, value) if isinstance(value, np.ndarray) else \
                (other == value or (value != value and other != other)), key
    if merge_cpu._kernels():
        assert len(batches) > 1 and all(n >= 1 for n, _ in batches)
