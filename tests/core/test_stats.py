"""Statistics at the extremes, against float64 NumPy: the fused CPU kernel (numba), the
torch fallback, and the fallback taken when numba is missing or fails. (The Triton kernels
run the same cases in tests/core/test_device_stats.py, in Triton's interpreter.)"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from gradexplorer.stats import cpu as cpu_stats
from gradexplorer.stats.moments import HIST_BINS, chan_merge, merge_moments, torch_stats
from gradexplorer.stats.tensor_stats import tensor_stats
from tests.conftest import ROOT

numba_missing = not cpu_stats.available()
if numba_missing:
    BLOCK = 2048  # only the torch path runs: any sizes make the same cases
else:
    # the fused kernel's block: its edges are cases below
    from gradexplorer.stats.cpu_kernels import BLOCK
#: A vector loop's length where its tail is summed apart (the kernel's loops unroll and
#: vectorise in multiples of it): sizes near it are cases too.
RUN = 128


def _randn(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g)


def _mixed():
    t = _randn(100_003, 1)
    t[::97] = float("nan")
    t[5::1009] = float("inf")
    t[7::2003] = -float("inf")
    return t


def _block_edges():
    """NaN and Inf on the first elements of the fused kernel's blocks (the value its fast
    loop shifts by), a block with nothing finite, and a partial last block."""
    block = BLOCK
    t = 1000 + 0.01 * _randn(5 * block + 3, 4)
    t[0] = float("nan")
    t[block] = float("inf")
    t[block + 1] = -float("inf")
    t[2 * block:3 * block] = float("nan")
    t[4 * block] = -float("inf")
    t[-1] = float("nan")
    return t


def _outlier_shifts():
    """Large mean, tiny spread, and each block's first value (the shift of the kernel's
    sums) an outlier a million spreads away: the shifted sums stay exact enough."""
    t = 1e4 + 1e-3 * _randn(300_000, 5).double()
    t[::BLOCK] = 1e4 + 1e3
    return t


def _blockwise(means: list[float], stds: list[float], seed: int) -> torch.Tensor:
    """float32 blocks of the fused kernel's size, each ``mean + std * N(0, 1)``, cycling
    through ``means`` and ``stds``, twelve blocks and a partial one."""
    g = torch.Generator().manual_seed(seed)
    parts = [means[i % len(means)] + stds[i % len(stds)] * torch.randn(BLOCK, generator=g, dtype=torch.float64)
             for i in range(12)]
    parts.append(means[0] + stds[0] * torch.randn(BLOCK // 3, generator=g, dtype=torch.float64))
    return torch.cat(parts).float()


#: name -> tensor. Large cases cross the serial/parallel limit and the histogram subsample.
ADVERSARIAL = {
    "constant_1e4": lambda: torch.full((1_000_000,), 1e4),
    "large_mean_tiny_std": lambda: 1000 + 0.01 * _randn(1_000_000),
    "large_mean_tiny_std_small": lambda: 1000 + 0.01 * _randn(5_000),
    "huge_1e30_float32": lambda: 1e30 * _randn(200_000),
    "near_float32_max": lambda: torch.tensor([3.4e38, -3.4e38, 1.0, 0.0] * 1000),
    "fp16_6e4": lambda: (6e4 * torch.rand(300_000, generator=torch.Generator().manual_seed(2))).half(),
    "fp16_mixed": lambda: torch.tensor([65504.0, -65504.0, 1e-7, 0.0, float("nan"), float("inf")]).half(),
    "bf16_1e30": lambda: (1e30 * _randn(70_000)).bfloat16(),
    "bf16_small": lambda: _randn(1000).bfloat16(),
    "denormal_float32": lambda: torch.tensor([1e-45, 3e-42, -2e-40, 0.0, 1e-39] * 20_000),
    "float64_1e200": lambda: 1e200 * _randn(100_000).double(),
    "float64_1e-300": lambda: 1e-300 * _randn(1000).double() + 5e-300,
    "nan_inf_mixed": _mixed,
    "all_nan": lambda: torch.full((10,), float("nan")),
    "all_inf": lambda: torch.tensor([float("inf"), -float("inf")]),
    "one_element": lambda: torch.tensor([3.5]),
    "empty": lambda: torch.empty(0, 4),
    "int32": lambda: torch.randint(-2**31, 2**31 - 1, (50_000,), dtype=torch.int32,
                                   generator=torch.Generator().manual_seed(3)),
    "int64_large": lambda: torch.tensor([2**53, -2**53, 7, 0] * 100, dtype=torch.int64),
    "uint8": lambda: torch.arange(256, dtype=torch.uint8).repeat(10),
    "bool": lambda: torch.tensor([True, False, True, True] * 50),
    "transposed": lambda: _randn(80 * 64).reshape(64, 80).t(),
    "expanded": lambda: _randn(7).expand(1000, 7),
    "relu_like_parallel": lambda: _randn(300_000).clamp_min(0),
    "nonfinite_at_block_edges": _block_edges,
    "nonfinite_at_block_edges_parallel": lambda: torch.cat([_block_edges()] * 20),
    "outlier_block_shifts_float64": _outlier_shifts,
    "outlier_block_shifts_float32": lambda: _outlier_shifts().float(),
    "float64_1e200_one_block": lambda: torch.cat([_randn(10_000).double(), 1e200 * _randn(100).double()]),
    "one_block_plus_one": lambda: _randn(BLOCK + 1) - 3.0,
    "two_blocks_plus_one": lambda: _randn(2 * BLOCK + 1) - 3.0,
    "signed_zeros": lambda: torch.tensor([-0.0, 0.0, -0.0, 2.5, -1e-30] * 30_000),
    "scale_1e20_float32": lambda: 1e20 * _randn(300_000, 6),
    "scale_1e-30_float32": lambda: 1e-30 * _randn(300_000, 7),
    "scale_1e-30_plus_offset_float32": lambda: 1e-30 * (3 + _randn(50_000, 8)),
    "fp16_large_mean_tiny_std": lambda: (1000 + 0.5 * _randn(100_000, 9)).half(),
    "bf16_large_mean_tiny_std": lambda: (1e4 + 40 * _randn(100_000, 10)).bfloat16(),
    "constant_1e4_block_edges": lambda: torch.cat([torch.full((3 * BLOCK - 1,), 1e4), torch.full((BLOCK + 2,), -1e4)]),
    "large_mean_tiny_std_parallel": lambda: 1000 + 0.01 * _randn(3_000_000, 11),
    "only_zeros_both_signs": lambda: torch.tensor([-0.0, 0.0] * 3000),
    # The float32 lanes take each block's deviations from the previous block's mean, scaled
    # by the previous block's spread: blocks whose mean or scale jump make that shift or
    # scale wrong (the second loop around the block's own mean, or the float64 loop).
    "block_means_jump_float32": lambda: _blockwise([1000.0, 0.0, -3.0e4, 0.5], [0.01, 0.01, 1.0, 1e-3], 12),
    "block_scales_jump_float32": lambda: _blockwise([0.0, 0.0, 0.0, 1e10], [1e-30, 1e20, 1e-35, 1.0], 13),
    "gradient_scale_1e-15_float32": lambda: 1e-15 * _randn(300_000, 14),
    "relu_gradient_1e-20_float32": lambda: 1e-20 * _randn(300_000, 15) * (_randn(300_000, 16) > 0.5),
    "ramp_1e7_float32": lambda: torch.arange(5 * BLOCK, dtype=torch.float32) + 1e7,
}


def numpy_reference(t: torch.Tensor) -> dict:
    """The statistics in float64 NumPy, scaled so that no square overflows."""
    a = t.detach().reshape(-1).to(torch.float64).numpy()
    fin = a[np.isfinite(a)]
    ref = {"numel": a.size, "nan_count": int(np.isnan(a).sum()), "inf_count": int(np.isinf(a).sum())}
    if fin.size == 0:
        return ref
    scale = float(np.abs(fin).max()) or 1.0
    s = fin / scale
    mean_s = s.mean()
    ref.update(
        min=float(fin.min()), max=float(fin.max()), mean=float(mean_s * scale),
        std=float(np.sqrt(((s - mean_s) ** 2).sum() / max(fin.size - 1, 1)) * scale),
        mean_abs=float(np.abs(s).mean() * scale),
        l2=float(np.sqrt((s * s).sum()) * scale),
        zero_fraction=float((fin == 0).sum() / a.size),
    )
    return ref


#: The accuracy contract: every statistic within this relative error of float64 on the same
#: tensor; the mean (which may be near zero) within this times the tensor's mean |x|.
CONTRACT = 1e-6


def contract_violations(got: dict, t: torch.Tensor) -> list[str]:
    """What in ``got`` breaks the accuracy contract against float64 NumPy on ``t`` (empty
    when nothing does): counts, min, max and the zero fraction exact; std, mean |x| and l2
    within ``CONTRACT`` relative; the mean within ``CONTRACT`` times mean |x|; nothing
    reported as overflow that is not."""
    ref = numpy_reference(t)
    bad = [key for key in ("numel", "nan_count", "inf_count") if got[key] != ref[key]]
    if "min" not in ref:  # nothing finite
        if not (math.isnan(got["mean"]) and math.isnan(got["std"])):
            bad.append("mean/std of nothing finite")
        if float(got["hist"].sum()) != 0:
            bad.append("hist of nothing finite")
        return bad
    bad += [key for key in ("min", "max", "zero_fraction") if got[key] != ref[key]]
    for key in ("std", "mean_abs", "l2"):
        if not abs(got[key] - ref[key]) <= CONTRACT * abs(ref[key]):
            bad.append(f"{key}: {got[key]!r} against {ref[key]!r}")
    if not abs(got["mean"] - ref["mean"]) <= CONTRACT * ref["mean_abs"]:
        bad.append(f"mean: {got['mean']!r} against {ref['mean']!r} (mean |x| {ref['mean_abs']!r})")
    if got["overflow"] != ():
        bad.append(f"overflow {got['overflow']}")
    finite = ref["numel"] - ref["nan_count"] - ref["inf_count"]
    if got["hist"].shape != (HIST_BINS,) or float(got["hist"].sum()) != pytest.approx(finite, rel=1e-4):
        bad.append("hist")
    return bad


def assert_matches_reference(got: dict, t: torch.Tensor) -> None:
    assert contract_violations(got, t) == []


@contextlib.contextmanager
def parallel_kernel():
    """The numba kernel's parallel path for every tensor over 65,536 values, whatever the
    number of cores (by default it runs only with four or more threads, and over a
    million values); yields the list of element counts it ran on."""
    ran: list[int] = []
    kernels = cpu_stats._state["kernels"]
    parallel = kernels["parallel"]

    def counted(x, *args):
        ran.append(x.size)
        return parallel(x, *args)

    saved = cpu_stats._SERIAL_LIMIT, cpu_stats._PARALLEL_MIN_THREADS
    cpu_stats._SERIAL_LIMIT, cpu_stats._PARALLEL_MIN_THREADS = 1 << 16, 1
    kernels["parallel"] = counted
    try:
        yield ran
    finally:
        cpu_stats._SERIAL_LIMIT, cpu_stats._PARALLEL_MIN_THREADS = saved
        kernels["parallel"] = parallel


def _parallel_stats(t):
    with parallel_kernel() as ran:
        got = tensor_stats(t)
    assert ran == ([t.numel()] if t.numel() > 1 << 16 else []), ran  # the parallel path did run
    return got


#: The statistics paths: the fused CPU pass as a capture runs it, cut into parallel chunks,
#: and the torch operations.
PATHS = {
    "default": tensor_stats,
    "torch": torch_stats,
}
if not numba_missing:
    PATHS["parallel"] = _parallel_stats


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
def test_statistics_equal_float64_numpy_on_adversarial_tensors(case, path):
    t = ADVERSARIAL[case]()
    before = t.clone()
    got = PATHS[path](t)
    assert_matches_reference(got, t)
    assert torch.equal(t, before) or torch.isnan(t).any()  # not modified


def _naive_float32_stats(t: torch.Tensor, pairwise: bool) -> dict:
    """The statistics by unshifted float32 sums of x and x^2 (E[x^2] - E[x]^2), sequential
    or torch's pairwise ones: what the contract exists to refuse."""
    x = t.detach().reshape(-1).float()
    fin = x[torch.isfinite(x)]
    n = fin.numel()
    if pairwise:
        s, q, a = (float(v) for v in (fin.sum(), (fin * fin).sum(), fin.abs().sum()))
    else:
        f = fin.numpy()
        with np.errstate(over="ignore"):  # float32 squares of 1e20 overflow: part of the naivety
            s, q, a = (float(np.cumsum(v, dtype=np.float32)[-1]) for v in (f, f * f, np.abs(f)))
    mean = np.float32(s / n)
    var = np.float32((q / n - float(mean) ** 2) * n / max(n - 1, 1))
    got = dict(tensor_stats(t))  # counts, extremes and histogram as they should be
    got.update(mean=float(mean), std=math.sqrt(max(float(var), 0.0)), mean_abs=a / n, l2=math.sqrt(q))
    return got


@pytest.mark.parametrize("pairwise", [False, True])
def test_the_contract_checker_rejects_a_naive_float32_accumulator(pairwise):
    """The checker of every statistics path, given unshifted float32 sums, refuses them on
    the cases the contract names: so a kernel that regressed to them fails these tests."""
    rejected = set()
    for case in ("constant_1e4", "large_mean_tiny_std", "large_mean_tiny_std_small", "scale_1e20_float32",
                 "scale_1e-30_float32", "outlier_block_shifts_float32", "relu_like_parallel"):
        t = ADVERSARIAL[case]()
        if contract_violations(_naive_float32_stats(t, pairwise), t):
            rejected.add(case)
    naive_fails = {"large_mean_tiny_std", "large_mean_tiny_std_small", "scale_1e20_float32", "scale_1e-30_float32"}
    assert naive_fails <= rejected, sorted(rejected)
    # and the checker is not refusing everything: the fused pass passes on the same cases
    t = ADVERSARIAL["large_mean_tiny_std"]()
    assert contract_violations(tensor_stats(t), t) == []


def _random_case(i: int) -> torch.Tensor:
    """Case ``i`` of a seeded mix: a size at or near an edge of the kernel's blocks or of a
    vector loop's run, float32 or a half type, a mean and a spread from 1e-30 to 1e20 (zero
    spread too), and sometimes NaN, Inf, signed zeros and outliers scattered in, or means
    that jump every 700 values."""
    rng = np.random.default_rng(i)
    edge = int(rng.choice([RUN, BLOCK, 2 * BLOCK, 3 * RUN]))
    n = max(1, edge + int(rng.integers(-3, 4))) if rng.random() < 0.7 else int(rng.integers(1, 5 * BLOCK))
    dtype = [torch.float32, torch.float32, torch.float16, torch.bfloat16][i % 4]
    mean = float(rng.choice([0.0, 1.0, 1e3, -1e4, 1e-20, 1e20]))
    spread = float(rng.choice([1.0, 1e-3, 1e-8, 0.0, 1e-30, 1e10])) * max(abs(mean), 1.0)
    t = mean + spread * torch.randn(n, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
    if rng.random() < 0.3:
        for at in rng.integers(0, n, 3):
            t[int(at)] = float(rng.choice([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e4 * (abs(mean) + 1)]))
    if rng.random() < 0.3:
        for b in range(0, n, 700):
            t[b:b + 700] += float(rng.choice([0.0, 5 * spread, -1e3 * spread, 1e2]))
    return t.to(dtype)


@pytest.mark.parametrize("path", ["default", "torch"])
def test_seeded_tensors_at_the_edges_of_runs_and_blocks_meet_the_contract(path):
    """600 seeded tensors, most of a size within three values of a run's or a block's edge
    (where a vector loop's tail is summed apart), against float64 NumPy."""
    for i in range(600):
        t = _random_case(i)
        try:
            assert_matches_reference(PATHS[path](t), t)
        except AssertionError as exc:
            raise AssertionError(f"case {i}: {t.numel()} values of {t.dtype}: {exc}") from exc


def test_the_cases_that_broke_the_naive_formulas():
    """The cases that broke naive formulas: a constant 1e4 over 1e6 values had std 80.6;
    1000 + 0.01·randn had 0; values of 1e20 had l2 = std = inf with inf_count 0."""
    assert tensor_stats(torch.full((1_000_000,), 1e4))["std"] == 0.0
    assert tensor_stats(1000 + 0.01 * _randn(1_000_000))["std"] == pytest.approx(0.01, rel=0.01)
    s = tensor_stats(torch.full((1000,), 1e20))
    assert s["l2"] == pytest.approx(1e20 * math.sqrt(1000)) and s["std"] == 0.0
    assert s["inf_count"] == 0 and s["overflow"] == ()


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_statistic_beyond_float64_is_reported_as_overflow_not_data_inf(path):
    t = torch.tensor([1.79e308, -1.79e308] * 8, dtype=torch.float64)
    s = PATHS[path](t)
    assert math.isinf(s["l2"]) and math.isinf(s["std"])
    assert s["overflow"] == ("std", "l2") and s["inf_count"] == 0 and s["nan_count"] == 0
    assert s["mean"] == 0.0 and s["mean_abs"] == 1.79e308 and s["max"] == 1.79e308


def test_chan_merge_equals_the_whole_and_ignores_empty_blocks():
    rng = np.random.default_rng(0)
    parts = [1e6 + rng.standard_normal(k) for k in (1, 7, 1000, 0, 33)]
    whole = np.concatenate(parts)
    count, mean, m2 = merge_moments(
        [p.size for p in parts], [p.mean() if p.size else 0.0 for p in parts],
        [((p - p.mean()) ** 2).sum() if p.size else 0.0 for p in parts])
    assert count == whole.size
    assert mean == pytest.approx(whole.mean(), rel=1e-15)
    assert m2 == pytest.approx(((whole - whole.mean()) ** 2).sum(), rel=1e-9)


def test_chan_merge_is_exact_for_equal_means_and_the_one_merge_of_moments():
    """The pairwise delta form: blocks of one constant merge to m2 = 0 exactly (the
    weighted-mean form gave 4.4e-16), an empty side is the identity, and the mergeable
    statistics of gradexplorer.stats.merge use the same function."""
    from gradexplorer.stats.merge import MergeStats

    n, mean, m2 = merge_moments([3, 999, 1, 0, 7], [3.25] * 5, [0.0] * 5)
    assert (n, mean, m2) == (1010, 3.25, 0.0)
    assert chan_merge(0, float("nan"), 0.0, 5, 1.5, 2.0) == (5, 1.5, 2.0)
    assert chan_merge(5, 1.5, 2.0, 0, float("nan"), 0.0) == (5, 1.5, 2.0)
    parts = [torch.full((k,), 3.25) for k in (999, 1, 37)]
    merged = MergeStats.merge_all(MergeStats.of_tensor(p) for p in parts)
    assert merged.m2 == 0.0 and merged.mean == 3.25 and merged.std == 0.0
    a, b = MergeStats.of_tensor(_randn(100) + 5), MergeStats.of_tensor(_randn(50, 1) - 2)
    assert ((a + b).count, (a + b).mean, (a + b).m2) == chan_merge(a.count, a.mean, a.m2, b.count, b.mean, b.m2)


@pytest.mark.skipif(numba_missing, reason="numba is not installed")
@pytest.mark.parametrize("case", ["randn", "half", "bf16", "transposed", "int", "empty", "float64",
                                  "strided", "transposed_half", "negated_view"])
def test_the_fused_copy_is_the_tensor_and_its_statistics_are_tensor_stats(case):
    """The copy holds the tensor's values in memory of its own, contiguous: written by the
    pass, or (a view that is read through a contiguous copy: strided, transposed, negated)
    that copy itself."""
    t = {"randn": lambda: _randn(200_000).reshape(400, 500), "half": lambda: _randn(3000).half(),
         "bf16": lambda: _randn(3000).bfloat16(), "transposed": lambda: _randn(6000).reshape(60, 100).t(),
         "int": lambda: torch.arange(-50, 50), "empty": lambda: torch.empty(3, 0),
         "float64": lambda: _randn(5000).double().reshape(50, 100),
         "strided": lambda: _randn(40_000).reshape(200, 200)[::2, 1::3],
         "transposed_half": lambda: _randn(6000).half().reshape(60, 100).t(),
         "negated_view": lambda: torch._neg_view(_randn(3000).reshape(30, 100))}[case]()
    stats, kept = cpu_stats.summarize(t, 1 << 14, copy=True)
    assert kept.dtype == t.dtype and kept.shape == t.shape and torch.equal(kept, t)
    assert kept.is_contiguous() and not kept.is_neg() and not kept.requires_grad
    if t.numel():
        assert kept.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
        before = kept.clone()
        t.mul_(-2) if not t.is_neg() else t.zero_()  # (a negated view can be written too)
        assert torch.equal(kept, before)  # nothing of t's memory is shared
        assert_matches_reference(stats, before)
    else:
        assert stats["numel"] == 0 and stats["hist"].sum() == 0


@pytest.mark.skipif(numba_missing, reason="numba is not installed")
def test_the_fused_histogram_is_torch_histc_of_the_same_sample():
    # float32, the subsample, NaN/Inf; float64 data and a range float32 cannot hold (the
    # kernel's float64 positions; 1e200 would leave float64 squares and the torch path).
    wide = torch.cat([1e-3 * _randn(3000), torch.tensor([3.0e38, -3.0e38])])
    for t in (_randn(5000), _randn(300_000), _mixed(), _mixed().double(), 1e30 * _randn(20_000).double(), wide):
        fused = tensor_stats(t)
        plain = torch_stats(t)
        assert fused["hist_range"] == plain["hist_range"] and fused["hist_exact"] == plain["hist_exact"]
        assert torch.allclose(fused["hist"], plain["hist"], rtol=1e-6)


def _tiny_ranges() -> dict[str, torch.Tensor]:
    """float32 (and bfloat16) tensors whose whole range lies within 2^-64, where the
    histogram's float32 differences can be subnormal: the kernel bins them from values
    scaled by 2^64 (cpu_kernels._positions_tiny)."""
    g = torch.Generator().manual_seed(21)
    steps = torch.randint(-2**23, 2**23, (5000,), generator=g, dtype=torch.int64)
    grid = torch.randint(0, 129, (3000,), generator=g, dtype=torch.int64)
    mixed = 1e-39 * torch.randn(4000, generator=g)
    mixed[::5] = 1e-25 * torch.randn(800, generator=g)
    edges = grid.double() * 2.0 ** -149  # values on the bin edges of [0, 128 * 2^-149]
    edges[:2] = torch.tensor([0.0, 128 * 2.0 ** -149], dtype=torch.float64)
    return {
        "every_subnormal_step": (steps.double() * 2.0 ** -149).float(),
        "on_bin_edges": edges.float(),
        "subnormal_and_1e-25": mixed,
        "vanishing_gradient_1e-42": 1e-42 * torch.randn(4096, generator=g),
        "with_nan_inf": torch.cat([1e-40 * torch.randn(700, generator=g), torch.tensor([float("nan"), float("inf")])]),
        "bf16_subnormal": (1e-39 * torch.randn(3000, generator=g)).bfloat16(),
    }


@pytest.mark.skipif(numba_missing, reason="numba is not installed")
@pytest.mark.parametrize("case", sorted(_tiny_ranges()))
def test_histograms_of_subnormal_ranges_are_torch_histc_of_the_same_values(case):
    # The per-tensor pass, the batch of tensors read where they lie, and the immediate
    # path of a capture's small outputs all bin through finish_into: each gives torch.histc's
    # float32 bins, count for count.
    from gradexplorer.stats import immediate

    t = _tiny_ranges()[case]
    fin = t[torch.isfinite(t)].double()
    assert 0 < float(fin.abs().max()) < 2.0 ** -64 and float(fin.max()) > float(fin.min())
    plain = torch_stats(t)
    many = cpu_stats.summarize_many([_randn(300), t, _randn(64)], 1 << 20)
    got = [tensor_stats(t), many[1]]
    if immediate.available():
        now = immediate.ImmediateStats(1 << 20)
        record = now.add(t)
        now.fill()
        got.append(record)
    for stats in got:
        assert stats["hist_range"] == plain["hist_range"] and stats["hist_exact"]
        assert torch.equal(stats["hist"], plain["hist"]), (stats["hist"], plain["hist"])
        assert_matches_reference(stats, t)


@pytest.mark.skipif(numba_missing, reason="numba is not installed")
def test_scaled_positions_equal_the_float32_formula_bit_for_bit():
    # The bins of the scaled loop against torch.histc's float32 formula evaluated by NumPy's
    # IEEE float32 arithmetic (each difference rounded once, times HIST_BINS, over the
    # width), on random tiny ranges of every kind.
    from gradexplorer.stats import cpu_kernels as k

    rng = np.random.default_rng(5)
    for trial in range(400):
        n = int(rng.integers(2, 700))
        kind = trial % 3
        if kind == 0:
            x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-45, -20)).astype(np.float32)
        elif kind == 1:
            x = (rng.integers(-2**23, 2**23, n).astype(np.float64) * 2.0 ** -149).astype(np.float32)
        else:
            x = (rng.integers(0, 200, n) * 2.0 ** -149).astype(np.float32)
        lo, hi = float(x.min()), float(x.max())
        if not hi > lo:
            continue
        lo32 = np.float32(lo)
        width32 = np.float32(np.float32(hi) - lo32)
        plain = np.clip(((x - lo32) * np.float32(HIST_BINS) / width32).astype(np.int32), 0, HIST_BINS - 1)
        scaled = np.empty(n, np.int32)
        k._positions_tiny(x, float(lo32), np.float32((hi - float(lo32)) * 2.0 ** 64), scaled)
        np.testing.assert_array_equal(scaled, plain)


def test_a_numba_failure_falls_back_to_torch_operations_for_good(monkeypatch, caplog):
    if numba_missing:
        pytest.skip("numba is not installed")
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("LLVM ERROR: out of memory")

    kernels = dict(cpu_stats._state["kernels"], serial=broken, parallel=broken)
    monkeypatch.setitem(cpu_stats._state, "kernels", kernels)
    t = ADVERSARIAL["large_mean_tiny_std_small"]()
    with caplog.at_level(logging.WARNING, logger="gradexplorer.stats.cpu"):
        got = tensor_stats(t)
    assert "fused CPU statistics failed" in caplog.text and "LLVM ERROR" in caplog.text
    assert_matches_reference(got, t)
    assert not cpu_stats.available()
    tensor_stats(t)
    assert len(calls) == 1  # not tried again


@pytest.mark.slow
def test_without_numba_the_torch_operations_do_the_work():
    """A fresh interpreter in which ``import numba`` fails: statistics still right."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name == "numba" or name.startswith("numba."):
                    raise ImportError("no numba here")
        sys.meta_path.insert(0, Refuse())
        from gradexplorer.stats import cpu as cpu_stats
        from gradexplorer.stats.tensor_stats import tensor_stats
        from tests.core.test_stats import ADVERSARIAL, assert_matches_reference
        assert not cpu_stats.available()
        for name in ("large_mean_tiny_std", "huge_1e30_float32", "nan_inf_mixed", "bf16_1e30", "int32"):
            assert_matches_reference(tensor_stats(ADVERSARIAL[name]()), ADVERSARIAL[name]())
        assert "numba" not in sys.modules
        print("fallback ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0 and "fallback ok" in done.stdout, done.stderr[-3000:]


def test_the_environment_switch_turns_the_cpu_kernel_off(monkeypatch):
    monkeypatch.setenv("GRADEXPLORER_CPU_KERNEL", "0")
    monkeypatch.setattr(cpu_stats, "summarize", lambda *a, **k: pytest.fail("kernel used"))
    assert_matches_reference(tensor_stats(_randn(100)), _randn(100))


@pytest.mark.skipif(numba_missing, reason="numba is not installed")
def test_statistics_from_several_threads_at_once_are_right():
    """The window's histogram can run while a capture summarises tensors: numba's
    workqueue pool takes one parallel launch at a time (a second one would abort the
    process); the other thread runs the serial kernel."""
    import threading

    tensors = [1000 + 0.01 * _randn(300_000, seed=i) for i in range(4)]
    results: dict[int, list] = {}
    errors = []

    def work(i):
        try:
            results[i] = [tensor_stats(tensors[i]) for _ in range(5)]
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    with parallel_kernel() as ran:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors
    assert ran  # some launches were parallel (the others, serial meanwhile)
    for i, runs in results.items():
        for got in runs:
            assert_matches_reference(got, tensors[i])


@pytest.mark.slow
@pytest.mark.skipif(numba_missing, reason="numba is not installed")
def test_the_kernels_compile_from_an_empty_cache_and_are_used(tmp_path):
    """A compile failure falls back quietly (a log line), and a stale on-disk cache can hide
    one: compile every kernel afresh in a new process and check the fused path ran."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import torch
        from gradexplorer.stats import cpu as cpu_stats
        from tests.core.test_stats import ADVERSARIAL, assert_matches_reference
        for name in ("large_mean_tiny_std", "bf16_small", "int32", "nan_inf_mixed"):
            t = ADVERSARIAL[name]()
            got = cpu_stats.summarize(t, 1 << 14)
            assert got is not None, name
            assert_matches_reference(got, t)
            stats, kept = cpu_stats.summarize(t, 1 << 14, copy=True)
            assert torch.equal(kept, t) or name == "nan_inf_mixed"
        assert cpu_stats.available()
        print("compiled ok", sorted(cpu_stats.compile_seconds))
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                          cwd=ROOT, timeout=900, env=env)
    assert done.returncode == 0 and "compiled ok" in done.stdout, (done.stdout + done.stderr)[-3000:]
    assert "fused CPU statistics failed" not in done.stderr


#: How close the CPU pass, summing in float64, comes to float64 NumPy: float64's roundings
#: over blocks merged by Chan's formula, amplified at most by |mean| / std (1e5 below).
FLOAT64_CLOSE = 1e-9


@pytest.mark.skipif(numba_missing, reason="numba is not installed")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_cpu_pass_sums_in_float64(dtype):
    """float32 and half tensors are summed in float64 (float32 lanes were no faster inside
    captures: docs/benchmarks.md): their moments are within float64's roundings of float64
    NumPy, a thousand times inside the contract, where float32 sums are not."""
    g = torch.Generator().manual_seed(21)
    for mean, spread, n in ((0.3, 1.0, 500_000), (1000.0, 0.01, 300_000), (-2.0, 1e-3, 3 * BLOCK + 7),
                            (0.0, 1e-20, 100_003), (5.0, 5.0, 77)):
        t = (mean + spread * torch.randn(n, generator=g, dtype=torch.float64)).to(dtype)
        got, ref = tensor_stats(t), numpy_reference(t)
        for key in ("std", "mean_abs", "l2"):
            assert abs(got[key] - ref[key]) <= FLOAT64_CLOSE * abs(ref[key]), (mean, spread, key, got[key], ref[key])
        assert abs(got["mean"] - ref["mean"]) <= FLOAT64_CLOSE * ref["mean_abs"], (mean, spread, "mean")
