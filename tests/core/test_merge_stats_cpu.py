"""The compiled MergeStats path (gradexplorer.stats.merge_cpu) against float64 NumPy and the torch path."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gradexplorer.stats.merge_cpu as fast
from gradexplorer.stats.merge import _FOLD, HIST_BINS, MergeStats, log2_histogram
from tests.core.test_stats_merge import reference, reference_hist

pytestmark = pytest.mark.skipif(not fast._kernels(), reason="numba kernels unavailable")


def adversarial() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    edges = [2.0 ** k for k in (-126, -64, -63, -1, 0, 1, 63, 64)]
    special = [0.0, -0.0, 1e-40, -1e-41, 1.4e-45, float("nan"), float("inf"), -float("inf"), 3.4e38, -3.4e38]
    return [
        torch.randn(16, 64, 7, 9, generator=g),
        torch.tensor(special + edges + [-e for e in edges], dtype=torch.float32),
        torch.randn(33, 7, generator=g).t(),  # not contiguous
        torch.randn(41, generator=g)[::3],  # a strided view
        torch.randn(9, generator=g).neg(),  # a lazy negation
        torch.full((1001,), 1e4) + torch.randn(1001, generator=g) * 1e-3,
        torch.zeros(0),
        torch.randn(3, generator=g),  # fewer than the four interleaved tables
    ]


@pytest.mark.parametrize("i", range(len(adversarial())))
def test_counts_equal_the_documented_bins_and_the_torch_path(i, monkeypatch):
    t = adversarial()[i]
    got = fast.fold_counts(t.reshape(-1), _FOLD, HIST_BINS)
    assert got is not None and got.dtype == torch.long
    np.testing.assert_array_equal(got.numpy(), reference_hist(t.double().numpy().reshape(-1)))
    np.testing.assert_array_equal(log2_histogram(t).numpy(), got.numpy())  # the dispatch
    monkeypatch.setitem(fast._state, "kernels", False)  # the torch path
    np.testing.assert_array_equal(log2_histogram(t.contiguous()).numpy(), got.numpy())


def test_other_dtypes_and_devices_take_the_torch_path():
    assert fast.fold_counts(torch.randn(5, dtype=torch.float64), _FOLD, HIST_BINS) is None
    assert fast.fold_counts(torch.randn(5).half(), _FOLD, HIST_BINS) is None
    assert fast.fold_counts(torch.randn(5, device="meta"), _FOLD, HIST_BINS) is None
    x = torch.randn(100).bfloat16()
    np.testing.assert_array_equal(log2_histogram(x).numpy(), reference_hist(x.double().numpy()))


@pytest.mark.parametrize("i", range(len(adversarial())))
def test_merge_stats_equal_float64_numpy(i, monkeypatch):
    t = adversarial()[i]
    s = MergeStats.of_tensor(t)
    ref = reference(t.double().numpy().reshape(-1))
    summ = s.summary()
    for key in ("numel", "count", "nan_count", "inf_count"):
        assert summ[key] == ref[key], key
    np.testing.assert_array_equal(s.hist, ref["hist"])
    if ref["count"]:
        assert summ["min"] == ref["min"] and summ["max"] == ref["max"]
        scale = max(abs(ref["mean"]), ref["std"] if math.isfinite(ref["std"]) else 0.0, 1e-30)
        assert summ["mean"] == pytest.approx(ref["mean"], rel=1e-12, abs=1e-12 * scale)
        if ref["count"] > 1:
            assert summ["std"] == pytest.approx(ref["std"], rel=1e-9)
        assert summ["mean_abs"] == pytest.approx(ref["mean_abs"], rel=1e-12)
        assert summ["sum"] == pytest.approx(ref["sum"], rel=1e-12, abs=1e-12 * scale * ref["count"])
    # The torch path agrees to its own (float32) precision, and merges with this one.
    monkeypatch.setitem(fast._state, "kernels", False)
    slow = MergeStats.of_tensor(t.contiguous())
    assert (slow.count, slow.nan_count, slow.inf_count, slow.zero_count) == (s.count, s.nan_count, s.inf_count,
                                                                            s.zero_count)
    np.testing.assert_array_equal(slow.hist, s.hist)
    if s.count > 1:
        assert slow.summary()["std"] == pytest.approx(summ["std"], rel=1e-4)


def test_merge_stats_zero_count_and_histogram_follow():
    x = torch.tensor([0.0, 0.0, 1e-40, 1.0, float("nan")])
    s = MergeStats.of_tensor(x)
    assert s.zero_count == 3 and s.hist.sum() == 4 and s.nan_count == 1


def test_distance_and_row_norms_equal_float64():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(64, 3, 5, 5, generator=g) * 100
    b = a + torch.randn(a.shape, generator=g) * 1e-5  # a tiny update of large weights
    ref = float((b.double() - a.double()).norm())
    assert fast.distances([(a, b)]) == [pytest.approx(ref, rel=1e-12)]
    assert fast.distances([(a, a)]) == [0.0]
    assert fast.distances([(a.double(), b.double())]) == [None]
    x = torch.randn(6, 4, 7, generator=g)
    x[2] = 0.0
    want = x.double().reshape(6, -1).norm(dim=1).float()
    got = fast.row_norms(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    from gradexplorer.stats.merge import per_sample_norms

    torch.testing.assert_close(per_sample_norms(x.permute(0, 2, 1)), want, rtol=0, atol=0)  # not contiguous
    assert fast.row_norms(torch.randn(3).double()) is None


def test_distances_of_many_pairs_equal_float64_numpy():
    """The update norms of a watched step in one call: each pair's ||a - b|| against float64
    NumPy, whatever the layout of either tensor; pairs the compiled path cannot take
    (another dtype, another shape) are left to the caller as None."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(64, 64, generator=g)
    pairs = [
        (w, w + 1e-7 * torch.randn(64, 64, generator=g)),  # a tiny update of a large weight
        (torch.randn(33, 7, generator=g).t(), torch.randn(7, 33, generator=g)),  # transposed
        (torch.randn(41, generator=g)[::3], torch.randn(14, generator=g).neg()),  # strided, lazily negated
        (torch.full((1000,), 3e38), torch.full((1000,), -3e38)),  # squares beyond float32
        (torch.zeros(0), torch.zeros(0)),
        (torch.randn(5, dtype=torch.float64, generator=g), torch.randn(5, dtype=torch.float64, generator=g)),
        (torch.randn(4, generator=g), torch.randn(2, 2, generator=g)),
        (torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0])),
    ]
    got = fast.distances(pairs)
    assert got is not None and len(got) == len(pairs)
    for i, ((a, b), d) in enumerate(zip(pairs, got)):
        if a.dtype != torch.float32 or a.shape != b.shape:
            assert d is None, i
            continue
        ref = float(np.sqrt(((a.double().numpy() - b.double().numpy()) ** 2).sum()))
        if math.isnan(ref):
            assert math.isnan(d), i
        else:
            assert d == pytest.approx(ref, rel=1e-13, abs=0.0), i
        (alone,) = fast.distances([(a, b)])  # the same as in the batch
        assert alone == d or (math.isnan(d) and math.isnan(alone)), i
    assert got[0] > 0.0  # not rounded away
    assert fast.distances([]) is None
