"""Text output of the command-line interface: tables, sizes, numbers and a progress bar.

Plain text only, no Qt, no third-party packages: the CLI must start fast and run on a
headless machine.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from typing import TextIO

# The CLI's name for core's one byte formatter.
from gradexplorer.base.units import format_bytes as human_size

__all__ = ["human_size", "fmt_num", "fmt_shape", "fmt_seconds", "table", "can_encode", "ProgressBar"]

def fmt_num(x: float | int | None, digits: int = 3) -> str:
    """A compact number for tables: ``0.000123`` -> ``"1.23e-04"``, ``None`` -> ``"-"``."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.{digits}g}"
    return f"{x:.{max(digits - 1, 0)}e}"


def fmt_shape(shape: Sequence[int] | None) -> str:
    """``(2, 64, 56, 56)`` -> ``"2x64x56x56"``; empty -> ``"-"``."""
    if not shape:
        return "-"
    return "x".join(str(d) for d in shape)


def fmt_seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.2f} s"
    return f"{int(s // 60)} min {s % 60:.0f} s"


def can_encode(text: str, stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (stdout by default) can print ``text`` (a ✓ on a cp1252 console cannot)."""
    stream = stream or sys.stdout
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    align: str | None = None,
    gap: int = 2,
) -> str:
    """Rows as aligned text columns under a header line.

    Parameters
    ----------
    headers : sequence of str
    rows : sequence of sequences
        Cells are converted with ``str``.
    align : str, optional
        One letter per column, ``l`` or ``r``; numbers read best right-aligned.
        Default: all left.
    gap : int
        Spaces between columns.

    Returns
    -------
    str
        Without a trailing newline; trailing spaces are stripped from every line.
    """
    cells = [[str(c) for c in row] for row in rows]
    ncol = len(headers)
    align = (align or "l" * ncol).ljust(ncol, "l")
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row[:ncol]):
            widths[i] = max(widths[i], len(c))
    sep = " " * gap

    def line(values: Sequence[str]) -> str:
        parts = []
        for i in range(ncol):
            v = values[i] if i < len(values) else ""
            parts.append(v.rjust(widths[i]) if align[i] == "r" else v.ljust(widths[i]))
        return sep.join(parts).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out.extend(line(row) for row in cells)
    return "\n".join(out)


class ProgressBar:
    """A one-line progress display on stderr for the stages of a CLI command.

    On a terminal the line is redrawn in place with ``\\r``; elsewhere (a log file, a
    pipe, a test) a plain line is written when a stage starts and at most every
    ``interval`` seconds after, so logs stay short, and the stage's last state is written
    when it ends (``6/6 calls``, not the ``1/6`` of its first line).

    Parameters
    ----------
    stream : text stream, optional
        Default ``sys.stderr``.
    enabled : bool
        ``False`` prints nothing (``--quiet``).
    interval : float
        Seconds between lines when not on a terminal.
    """

    WIDTH = 24

    def __init__(self, stream: TextIO | None = None, enabled: bool = True, interval: float = 2.0):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.interval = interval
        isatty = getattr(self.stream, "isatty", None)
        try:
            self.tty = bool(isatty and isatty())
        except (ValueError, OSError):  # a closed stream
            self.tty = False
        self.stage: str | None = None
        self.stage_start = 0.0
        self.last_line = 0.0
        self.drawn = 0  # characters of the current terminal line
        self.unwritten: str | None = None  # off a terminal: the stage's latest line, not yet written
        self.fill = "█" if can_encode("█░", self.stream) else "#"
        self.empty = "░" if self.fill == "█" else "."

    def update(self, stage: str, done: float | None = None, total: float | None = None,
               unit: str = "") -> None:
        """Show ``stage`` with ``done`` of ``total`` (a bar when ``total`` is known)."""
        if not self.enabled:
            return
        now = time.monotonic()
        new_stage = stage != self.stage
        if new_stage:
            if self.tty and self.stage is not None:
                self._finish_line()
            self._write_unwritten()
            self.stage = stage
            self.stage_start = now
        text = self._render(stage, done, total, unit)
        if self.tty:
            pad = max(self.drawn - len(text), 0)
            self._write("\r" + text + " " * pad)
            self.drawn = len(text)
        elif new_stage or now - self.last_line >= self.interval:
            self._write(text + "\n")
            self.last_line = now
            self.unwritten = None
        else:
            self.unwritten = text

    def close(self) -> None:
        """End the display (call before printing anything else on stderr)."""
        if self.enabled and self.tty and self.drawn:
            self._finish_line()
        self._write_unwritten()
        self.stage = None

    def clear(self) -> None:
        """Erase the terminal line (before an error message)."""
        if self.enabled and self.tty and self.drawn:
            self._write("\r" + " " * self.drawn + "\r")
            self.drawn = 0
        self._write_unwritten()  # off a terminal: how far it got, before the error
        self.stage = None

    # -- internals -----------------------------------------------------------------
    def _write_unwritten(self) -> None:
        if self.unwritten is not None:
            self._write(self.unwritten + "\n")
            self.unwritten = None

    def _finish_line(self) -> None:
        self._write("\n")
        self.drawn = 0

    def _render(self, stage: str, done: float | None, total: float | None, unit: str) -> str:
        elapsed = time.monotonic() - self.stage_start
        if total:
            frac = min(max(float(done or 0) / float(total), 0.0), 1.0)
            filled = int(round(frac * self.WIDTH))
            bar = self.fill * filled + self.empty * (self.WIDTH - filled)
            if unit == "B":
                amount = f"{human_size(done)} / {human_size(total)}"
            else:
                amount = f"{int(done or 0)}/{int(total)}{(' ' + unit) if unit else ''}"
            return f"{stage:<16} {bar} {frac * 100:5.1f}%  {amount}  {elapsed:.1f} s"
        if done is not None and unit == "B":
            return f"{stage:<16} {human_size(done)}  {elapsed:.1f} s"
        return f"{stage} ..."

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe must not turn into a crash
            self.enabled = False
