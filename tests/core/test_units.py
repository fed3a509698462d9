"""Sizes people write (--memory-budget) and sizes people read: one parser, one formatter."""

from __future__ import annotations

import pytest

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.units import format_bytes, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2GiB", 2 * 1024**3), ("2 gib", 2 * 1024**3), ("500MiB", 500 * 1024**2), ("1.5Gi", 3 * 1024**3 // 2),
        ("500MB", 500 * 1000**2), ("4G", 4 * 1000**3), ("2kB", 2000), ("1TiB", 1024**4), ("4096", 4096),
        ("12B", 12), (".5KiB", 512),
    ],
)
def test_sizes_in_binary_and_decimal_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "2XB", "-1G", "1e9", "2 G B", "GiB"])
def test_what_is_not_a_size_is_refused_with_an_example(text):
    with pytest.raises(GradExplorerError) as info:
        parse_size(text)
    assert "is not a size" in info.value.problem and "2GiB" in info.value.fix


def test_less_than_a_byte_is_refused():
    with pytest.raises(GradExplorerError, match="less than one byte"):
        parse_size("0")


def test_a_formatted_size_reads_back_close_to_itself():
    for n in (1536, 600 * 2**20, 3 * 2**30):
        text = format_bytes(n).replace(" ", "")
        assert abs(parse_size(text) - n) <= 0.05 * n
