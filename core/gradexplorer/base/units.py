"""How sizes read to people: the one byte formatter of the window, the CLI and the messages,
and the one parser of the sizes people write (``--memory-budget 2GiB``)."""

from __future__ import annotations

import math
import re

from gradexplorer.base.errors import GradExplorerError

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int | float | None) -> str:
    """A size in binary units with two or three significant figures.

    Parameters
    ----------
    n : int, float or None
        Bytes.

    Returns
    -------
    str
        ``1536`` -> ``"1.5 KiB"``, ``600 * 2**20`` -> ``"600 MiB"``, ``None`` -> ``"?"``.
    """
    if n is None:
        return "?"
    n = float(n)
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{int(n)} B"
            return f"{n:.1f} {unit}" if abs(n) < 100 else f"{n:.0f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``counted(1, "layer")`` -> ``"1 layer"``,
    ``counted(3, "call")`` -> ``"3 calls"``, ``counted(2, "leaf", "leaves")`` -> ``"2 leaves"``."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"


# Binary units take an "i" (KiB, Mi); without it a unit is decimal (kB, MB, G), as in
# IEC 80000-13. A bare number is bytes.
#: The largest size read (1 EiB): more than any machine has; Python floats lose integers past it.
MAX_SIZE = 1 << 60
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)
_SIZE_EXAMPLE = "write a size such as 2GiB, 500MiB or 4GB (KiB, MiB, GiB: powers of 1024; kB, MB, GB: of 1000)."


def parse_size(text: str) -> int:
    """A number of bytes the user wrote: ``"2GiB"``, ``"500 MB"``, ``"1.5G"``, ``"4096"``.

    Parameters
    ----------
    text : str
        A number and an optional unit: ``KiB``/``MiB``/``GiB``/``TiB`` (or ``Ki``, ``Mi``...)
        are powers of 1024; ``kB``/``MB``/``GB``/``TB`` (or ``k``, ``M``, ``G``, ``T``) are
        powers of 1000; ``B`` or nothing is bytes. Case does not matter.

    Returns
    -------
    int
        Bytes, rounded down; at least 1.

    Raises
    ------
    GradExplorerError
        Not a size, an unknown unit, or less than one byte.
    """
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise GradExplorerError(f"'{text}' is not a size;", _SIZE_EXAMPLE)
    value = float(match.group(1)) * _SIZE_UNITS[unit]
    if not math.isfinite(value) or value > MAX_SIZE:
        raise GradExplorerError(f"the size '{text[:40]}' is larger than any memory ({format_bytes(MAX_SIZE)} "
                                "at most);", _SIZE_EXAMPLE)
    size = int(value)
    if size < 1:
        raise GradExplorerError(f"the size '{text}' is less than one byte;", _SIZE_EXAMPLE)
    return size
