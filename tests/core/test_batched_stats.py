"""Statistics of many tensors together (core/batched_stats.py) equal float64 NumPy and
``tensor_stats`` tensor by tensor: the adversarial set of tests/core/test_stats.py at once."""

from __future__ import annotations

import pytest
import torch

from core.batched_stats import BLOCK, batched_stats
from core.stats import tensor_stats
from tests.core.test_stats import ADVERSARIAL, _randn, assert_matches_reference


def _all():
    names = sorted(ADVERSARIAL)
    return names, [ADVERSARIAL[n]() for n in names]


@pytest.mark.parametrize("limit", [1 << 14, None])
def test_every_adversarial_tensor_at_once_equals_float64_numpy(limit):
    names, tensors = _all()
    got = batched_stats(tensors, limit)
    assert len(got) == len(tensors)
    for name, t, s in zip(names, tensors, got):
        try:
            assert_matches_reference(s, t)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


def test_histograms_and_ranges_are_tensor_stats_ones():
    names, tensors = _all()
    for name, t, s in zip(names, tensors, batched_stats(tensors)):
        ref = tensor_stats(t)
        assert s["hist_range"] == ref["hist_range"], name
        assert s["hist_exact"] == ref["hist_exact"], name
        assert torch.allclose(s["hist"], ref["hist"], rtol=1e-5), name


def test_block_edges_constants_and_all_nan_tensors_side_by_side():
    """Tensors that end mid-block sit next to each other: padding never leaks between them."""
    tensors = [torch.full((BLOCK + 1,), 3.25), torch.full((7,), float("nan")), _randn(1),
               1e4 + 1e-3 * _randn(3 * BLOCK - 1), torch.full((BLOCK,), -2.0).half()]
    got = batched_stats(tensors)
    assert got[0]["std"] == 0.0 and got[0]["mean"] == 3.25  # Chan's shifted form: exact
    assert got[1]["nan_count"] == 7 and got[1]["numel"] == 7
    for t, s in zip(tensors, got):
        assert_matches_reference(s, t)
