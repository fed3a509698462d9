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


@pytest.mark.parametrize("budget", [1 << 30, 1])
def test_a_capture_with_batched_gradient_statistics_equals_one_without(monkeypatch, budget):
    """GRADEXPLORER_BATCHED_STATS=1: the gradients' statistics are kept and summarised
    together at the end of the capture (or whenever BATCH_BYTES are held: 1 byte flushes
    at every gradient), with the same numbers and the same NaN/Inf onset."""
    import torchvision

    from core import device_stats
    from core.capture import capture

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64)
    plain = capture(model, x, mode="stats")
    import core.batched_stats as module

    calls = []
    real = module.batched_stats
    monkeypatch.setattr(module, "batched_stats", lambda ts, limit: calls.append(len(ts)) or real(ts, limit))
    monkeypatch.setenv("GRADEXPLORER_BATCHED_STATS", "1")
    monkeypatch.setattr(device_stats, "BATCH_BYTES", budget)
    batched = capture(model, x, mode="stats")
    assert calls and (len(calls) == 1 if budget > 1 else max(calls) == 1)
    compared = 0
    for name, layer in plain.layers.items():
        for call, other in zip(layer.calls, batched.layers[name].calls):
            for kind in ("grad_output", "grad_input"):
                a, b = call.stats[kind], other.stats[kind]
                assert (a is None) == (b is None), (name, kind)
                if a is None:
                    continue
                compared += 1
                for key in ("numel", "nan_count", "inf_count", "min", "max", "zero_fraction", "hist_range"):
                    assert a[key] == b[key], (name, kind, key)
                for key in ("mean", "std", "mean_abs", "l2"):
                    assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12 * max(abs(a["min"]), abs(a["max"])))
                assert torch.allclose(a["hist"], b["hist"], rtol=1e-5)
    assert compared > 50
    assert batched.nonfinite_onset == plain.nonfinite_onset
