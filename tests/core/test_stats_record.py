"""The statistics record (core/gradexplorer/stats/record.py): ``TensorStats`` declares exactly the keys
that every statistics path writes, with the value types they write, so that the type
cannot drift from the code; the capture file's schema requires what the record always
holds."""

from __future__ import annotations

import typing

import pytest
import torch

from gradexplorer.files.schema import STATS
from gradexplorer.stats import cpu as cpu_stats
from gradexplorer.stats.batched import batched_stats
from gradexplorer.stats.device import DeferredStats, stats_from_row
from gradexplorer.stats.merge import SUMMARY_KEYS, DatasetTensorStats, MergeStats, MergeSummary
from gradexplorer.stats.moments import HIST_BINS, empty_stats, no_finite_stats, torch_stats
from gradexplorer.stats.record import SCALAR_KEYS, STAT_KEYS, ScalarKey, StatKey, TensorStats
from gradexplorer.stats.tensor_stats import tensor_stats
from tests.core.test_device_stats import reference_row

HINTS = typing.get_type_hints(TensorStats)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


CASES = {
    "float32": lambda: _randn(3, 1000),
    "float64": lambda: _randn(500).double(),
    "float64_huge": lambda: _randn(500).double() * 1e300,  # the scaled path; l2 beyond float64
    "float16": lambda: _randn(2000).half(),
    "bfloat16": lambda: _randn(2000).bfloat16(),
    "int64": lambda: torch.arange(-50, 50),
    "int8": lambda: torch.arange(-5, 5, dtype=torch.int8),
    "uint8": lambda: torch.arange(0, 200, dtype=torch.uint8),
    "bool": lambda: torch.tensor([True, False, True]),
    "complex64": lambda: torch.complex(_randn(100), _randn(100)),
    "subsampled": lambda: _randn(100_000),
    "nan_and_inf": lambda: torch.tensor([1.0, float("nan"), -2.0, float("inf"), 0.0]),
    "all_nan": lambda: torch.full((7,), float("nan")),
    "empty": lambda: torch.zeros(0),
    "scalar": lambda: torch.tensor(3.0),
    "transposed": lambda: _randn(40, 30).t(),
}


def assert_is_tensor_stats(stats: object) -> None:
    """``stats`` is a plain dict with exactly ``STAT_KEYS``, in order, each value of the
    type ``TensorStats`` declares for it."""
    assert type(stats) is dict
    assert tuple(stats) == STAT_KEYS
    for key, value in stats.items():
        hint = HINTS[key]
        if hint is int:
            assert type(value) is int, (key, value)
        elif hint is float:
            assert type(value) is float, (key, value)
        elif hint is bool:
            assert type(value) is bool, (key, value)
        elif hint is torch.Tensor:
            assert isinstance(value, torch.Tensor) and value.dtype == torch.float32, (key, value)
            assert value.device.type == "cpu" and tuple(value.shape) == (HIST_BINS,), key
        elif typing.get_origin(hint) is tuple and typing.get_args(hint) == (float, float):
            assert type(value) is tuple and len(value) == 2, (key, value)
            assert all(type(v) is float for v in value), (key, value)
        elif typing.get_origin(hint) is tuple and typing.get_args(hint) == (str, ...):
            assert type(value) is tuple and all(type(v) is str for v in value), (key, value)
        else:
            raise AssertionError(f"TensorStats declares {key} as {hint}: teach this test that type")


def test_the_record_declares_the_stat_keys_in_order():
    assert tuple(TensorStats.__annotations__) == STAT_KEYS
    assert TensorStats.__required_keys__ | TensorStats.__optional_keys__ == set(STAT_KEYS)
    assert typing.get_args(ScalarKey) == SCALAR_KEYS
    assert typing.get_args(StatKey) == STAT_KEYS  # a Literal of Literals flattens
    assert STAT_KEYS[:len(SCALAR_KEYS)] == SCALAR_KEYS


def test_what_every_file_holds_is_what_the_schema_requires():
    # Only hist_exact and overflow may be missing from a record read from a file (files
    # from before they existed, and dataset captures' records for overflow).
    assert TensorStats.__optional_keys__ == {"hist_exact", "overflow"}
    assert set(STATS.required) == set(TensorStats.__required_keys__)
    assert TensorStats.__optional_keys__ <= set(STATS.optional)
    # What a dataset capture's record adds beyond them is in the schema too, or plain data.
    assert "hist_kind" in STATS.optional
    assert set(DatasetTensorStats.__annotations__) - set(STAT_KEYS) == {"hist_kind", "merged"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tensor_stats_writes_exactly_the_declared_keys_and_types(case):
    t = CASES[case]()
    assert_is_tensor_stats(tensor_stats(t))
    assert_is_tensor_stats(tensor_stats(t, hist_exact_limit=None))
    assert_is_tensor_stats(torch_stats(t))


@pytest.mark.skipif(not cpu_stats.available(), reason="numba is not installed")
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fused_cpu_pass_writes_the_declared_record(case):
    t = CASES[case]()
    got = cpu_stats.summarize(t, None)
    if got is None:  # a tensor this path does not take (complex)
        assert t.is_complex()
        return
    assert_is_tensor_stats(got)
    copied = cpu_stats.summarize(t, None, copy=True)
    assert copied is not None
    assert_is_tensor_stats(copied[0])


def test_batched_and_deferred_statistics_write_the_declared_record():
    tensors = [CASES[c]() for c in sorted(CASES)]
    for stats in batched_stats(tensors):
        assert_is_tensor_stats(stats)
    deferred = DeferredStats(None, fused=False)
    records = [deferred.summarize(t) for t in tensors] + [deferred.summarize_copy(t)[0] for t in tensors]
    deferred.resolve()
    for stats in records:
        assert_is_tensor_stats(stats)


@pytest.mark.parametrize("case", ["float32", "float16", "subsampled", "nan_and_inf", "all_nan"])
def test_a_kernel_row_resolves_to_the_declared_record(case):
    t = CASES[case]()
    assert_is_tensor_stats(stats_from_row(*reference_row(t, 1 << 14)))


def test_the_records_without_a_tensor_are_declared_records():
    assert_is_tensor_stats(empty_stats())
    assert_is_tensor_stats(no_finite_stats(5, 3, 2))


def test_merge_summary_declares_the_summary_keys():
    assert tuple(MergeSummary.__annotations__) == SUMMARY_KEYS
    summary = MergeStats.of_tensor(_randn(100)).summary()
    assert tuple(summary) == SUMMARY_KEYS
    hints = typing.get_type_hints(MergeSummary)
    for key, value in summary.items():
        assert type(value) is hints[key], (key, value)
