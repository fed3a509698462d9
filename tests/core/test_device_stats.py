"""Deferred statistics (core/gradexplorer/stats/device.py): the CPU path, the resolution of a kernel row,
the fallback when the kernels fail, and the Triton kernels themselves in Triton's
interpreter (on the CPU: the GPU tests run them compiled)."""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gradexplorer.stats import device as device_stats
from gradexplorer.stats.device import DeferredStats, stats_from_row
from gradexplorer.stats.moments import HIST_BINS, histogram_range, histogram_sample
from gradexplorer.stats.tensor_stats import tensor_stats
from tests.conftest import ROOT

CASES = {
    "randn": lambda: torch.randn(3, 1000),
    "relu_subsampled": lambda: torch.randn(200_000).clamp_min(0),
    "half": lambda: torch.randn(5000).half(),
    "flat": lambda: torch.full((100,), 2.5),
    "nan_and_inf": lambda: torch.tensor([1.0, float("nan"), -2.0, float("inf"), 0.0, 3.0]),
    "all_nan": lambda: torch.full((10,), float("nan")),
    "transposed": lambda: torch.randn(64, 80).t(),
}


def assert_stats_close(got: dict, ref: dict, numel: int) -> None:
    assert set(got) == set(ref)
    for key in ("numel", "nan_count", "inf_count", "hist_exact", "hist_range"):
        if key == "hist_range":
            assert got[key] == pytest.approx(ref[key], rel=1e-6), key
        else:
            assert got[key] == ref[key], key
    for key in ("min", "max", "mean", "std", "mean_abs", "l2", "zero_fraction"):
        assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7, nan_ok=True), key
    # Values on a bin edge may land one bin over (float rounding): a handful at most.
    assert float((got["hist"] - ref["hist"]).abs().sum()) <= max(2, 1e-3 * numel)


def reference_row(t: torch.Tensor, hist_limit: int | None) -> tuple[list[float], int, bool]:
    """What the kernels compute, by plain torch operations in float64."""
    x = t.detach().reshape(-1).double()
    n = x.numel()
    finite = x[torch.isfinite(x)]
    lo = float(finite.min()) if finite.numel() else math.inf
    hi = float(finite.max()) if finite.numel() else -math.inf
    mean = float(finite.mean()) if finite.numel() else 0.0
    offset, step, count = histogram_sample(n, hist_limit)
    sample = x[offset::step][:count]
    sample = sample[torch.isfinite(sample)]
    hlo, hhi = histogram_range(lo, hi)
    counts = torch.histc(sample.float(), HIST_BINS, hlo, hhi) if sample.numel() else torch.zeros(HIST_BINS)
    row = [lo, hi, mean, float(((finite - mean) ** 2).sum()), float((finite * finite).sum()),
           float(finite.abs().sum()), float((finite != 0).sum()), float(torch.isnan(x).sum()),
           float(torch.isinf(x).sum()), float(counts.sum()), *counts.tolist()]
    return row, n, step == 1


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_kernel_row_resolves_to_the_statistics_of_tensor_stats(case):
    t = CASES[case]()
    row, n, exact = reference_row(t, 1 << 14)
    assert_stats_close(stats_from_row(row, n, exact), tensor_stats(t), t.numel())


def test_the_sample_count_is_what_slicing_takes():
    """The kernels get (offset, step, count); the CPU path slices x[offset::step]."""
    for n in (10, 1 << 14, (1 << 14) + 1, 200_000, 10_000_019):
        offset, step, count = histogram_sample(n, 1 << 14)
        assert count == len(range(n)[offset::step])
        assert count <= 1 << 14 or step == 1


def test_large_cpu_tensors_are_summarised_at_once_and_small_ones_together_at_resolve():
    """A CPU tensor over ``SMALL_VALUES`` is summarised at once; a small one is copied and
    summarised with the others at ``resolve`` (or ``flush``), as it was when handed over,
    whatever is done to it afterwards."""
    summaries = DeferredStats(1 << 14)
    big = torch.randn(4, device_stats.SMALL_VALUES)
    stats = summaries.summarize(big)
    assert len(summaries) == 0
    assert_stats_close(stats, tensor_stats(big), big.numel())
    small = torch.randn(4, 500)
    before = small.clone()
    held = summaries.summarize(small)
    assert len(summaries) == 1 and held == {}
    small.mul_(-3)  # an in-place op after the module returned it
    summaries.resolve()
    assert len(summaries) == 0
    assert_stats_close(held, tensor_stats(before), before.numel())
    assert_stats_close(stats, tensor_stats(big), big.numel())


def test_histograms_of_tensors_summarised_one_by_one_stay_their_own():
    """The histograms of the large CPU tensors of a capture are rows of tables its records
    share (one allocation per ``HIST_TABLE_ROWS`` records, not one per record): each record
    still holds its own tensor's histogram, ``torch.histc`` of all its values, after
    hundreds more were written, across two tables, with and without the pass's copy."""
    summaries = DeferredStats(None)  # every value counted: torch.histc is the truth
    g = torch.Generator().manual_seed(5)
    n = device_stats.SMALL_VALUES + 1  # above the small batch: summarised at once
    tensors = [torch.randn(n, generator=g) * (i + 1) + i for i in range(device_stats.HIST_TABLE_ROWS + 20)]
    got = [summaries.summarize_copy(t)[0] if i % 2 else summaries.summarize(t) for i, t in enumerate(tensors)]
    for t, stats in zip(tensors, got):
        expected = torch.histc(t, HIST_BINS, t.min().item(), t.max().item())
        assert torch.allclose(stats["hist"], expected, rtol=1e-6), (stats["hist"], expected)
        assert stats["hist"].sum().item() == n
    assert len({stats["hist"].untyped_storage().data_ptr() for stats in got}) == 2


def test_a_kernel_failure_falls_back_to_torch_operations_for_good(monkeypatch, caplog):
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("PTX JIT compilation failed")

    monkeypatch.setattr(device_stats, "_kernels", (broken, broken))
    monkeypatch.setattr(device_stats, "launch", broken)
    summaries = DeferredStats(1 << 14, fused=True)
    t = torch.randn(1000)
    with caplog.at_level(logging.WARNING, logger="gradexplorer.stats.device"):
        stats = summaries.summarize(t)
    assert "fused GPU statistics failed" in caplog.text and "PTX JIT" in caplog.text
    assert_stats_close(stats, tensor_stats(t), t.numel())
    assert device_stats._kernels is False and not device_stats.fused_available()
    summaries.summarize(t)
    assert len(calls) == 1  # not tried again


def test_the_environment_switch_turns_the_kernels_off(monkeypatch):
    monkeypatch.setenv("GRADEXPLORER_FUSED_STATS", "0")
    assert not device_stats.fused_available()
    assert DeferredStats(None).fused is False


def _interpreter_runs_runtime_loops() -> bool:
    """Triton's interpreter before 3.8 fails on a loop whose bound is a kernel argument
    (``TypeError: only 0-dimensional arrays...``); compiled kernels are not affected."""
    if importlib.util.find_spec("triton") is None:
        return False
    from importlib.metadata import version

    major, minor = (int(p) for p in version("triton").split(".")[:2])
    return (major, minor) >= (3, 8)


@pytest.mark.slow
@pytest.mark.skipif(not _interpreter_runs_runtime_loops(), reason="needs Triton >= 3.8 (its interpreter)")
def test_the_kernels_in_tritons_interpreter_equal_tensor_stats_and_capture():
    """The Triton kernels, run by Triton's interpreter on CPU tensors, against float64
    NumPy on the adversarial tensors of test_stats.py and against tensor_stats, and a
    capture whose every statistic went through them against a plain capture. (The
    interpreter is chosen when Triton is imported: a fresh process.)"""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import torch
        from torch import nn
        from gradexplorer.stats import device as device_stats
        from gradexplorer.capturing.capture import capture
        from gradexplorer.stats.tensor_stats import tensor_stats
        from tests.core.test_device_stats import CASES, assert_stats_close

        assert device_stats.fused_available()
        from tests.core.test_stats import ADVERSARIAL, contract_violations
        for name, make in ADVERSARIAL.items():
            t = make()
            if t.dtype not in device_stats._DTYPES or not 0 < t.numel() <= 300_000:
                continue  # what the kernels take (the interpreter is slow on large tensors)
            summaries = device_stats.DeferredStats(1 << 14, fused=True)
            got = summaries.summarize(t)
            assert got == {{}}, name
            summaries.resolve()
            bad = contract_violations(got, t)
            assert bad == [], (name, bad)
            print("adversarial", name)
        for name, make in CASES.items():
            t = make()
            summaries = device_stats.DeferredStats(1 << 14, fused=True)
            got = summaries.summarize(t)
            assert got == {{}} and len(summaries) == 1, name
            summaries.resolve()
            assert_stats_close(got, tensor_stats(t), t.numel())
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                              nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 5)).eval()
        x = torch.randn(2, 3, 8, 8)
        plain = capture(model, x, mode="stats", input_grad=True)
        import os
        os.environ["GRADEXPLORER_FUSED_STATS"] = "all"  # read by each capture's DeferredStats
        fused = capture(model, x, mode="stats", input_grad=True)
        for name, i, call in plain.iter_calls():
            for kind, ref in call.stats.items():
                got = fused[name].calls[i].stats[kind]
                assert (got is None) == (ref is None), (name, kind)
                if ref is not None:
                    assert_stats_close(got, ref, ref["numel"])
            for p, ref in plain[name].param_stats.items():
                assert_stats_close(fused[name].param_stats[p], ref, ref["numel"])
        print("interpreter ok")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop("GRADEXPLORER_FUSED_STATS", None)
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0 and "interpreter ok" in done.stdout, done.stderr[-3000:]
