"""How sizes read to people: the one byte formatter of the window, the CLI and the messages."""

from __future__ import annotations

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
