"""Compact HTML tables for notebooks (Jupyter's ``_repr_html_``): escaping, numbers, bars.

Self-contained markup with inline styles only (no scripts, no external CSS), so a table
looks the same in Jupyter, VS Code and a saved notebook, in light and dark themes (colours
are translucent over the page's own).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

#: Colours of the flag badges, by flag.
FLAG_COLOURS = {"nan/inf": "rgba(220,0,120,0.30)", "exploding": "rgba(230,80,0,0.30)",
                "vanishing": "rgba(0,110,230,0.25)", "zero": "rgba(128,128,128,0.30)",
                "no gradient": "rgba(128,128,128,0.20)"}


def escape(text: str) -> str:
    """``text`` with ``<``, ``>``, ``&`` and quotes escaped for HTML."""
    return html.escape(text)


def number(v: float | int | None) -> str:
    """A number in a few significant digits; an empty cell for None or NaN."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, int):
        return f"{v:,}"
    if v == 0 or math.isinf(v):
        return str(v)
    return f"{v:.3g}" if 1e-3 <= abs(v) < 1e5 else f"{v:.2e}"


def log_fractions(values: Sequence[float]) -> list[float | None]:
    """Each positive finite value's place between the smallest and the largest on a log
    scale (0..1; gradients span decades); None for the others."""
    logs = [math.log10(v) if v > 0 and math.isfinite(v) else None for v in values]
    present = [v for v in logs if v is not None]
    if not present:
        return [None] * len(values)
    lo, hi = min(present), max(present)
    return [None if v is None else (1.0 if hi == lo else 0.08 + 0.92 * (v - lo) / (hi - lo)) for v in logs]


def bar(fraction: float | None, text: str) -> str:
    """A cell with ``text`` over a bar ``fraction`` of the cell wide."""
    if fraction is None:
        return html.escape(text)
    width = max(0.0, min(1.0, fraction)) * 100
    return (f'<div style="position:relative;min-width:9em"><div style="position:absolute;left:0;top:0;bottom:0;'
            f'width:{width:.1f}%;background:rgba(60,130,220,0.35)"></div>'
            f'<span style="position:relative">{html.escape(text)}</span></div>')


def badges(flags: Sequence[str]) -> str:
    """The flags as small coloured labels."""
    return " ".join(f'<span style="background:{FLAG_COLOURS.get(f, "rgba(128,128,128,0.2)")};padding:0 0.4em;'
                    f'border-radius:0.3em;white-space:nowrap">{html.escape(f)}</span>' for f in flags)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], *, note: str = "",
          right: Sequence[int] = ()) -> str:
    """The whole table: a title line, the header, the rows (cells already HTML), a note.

    Parameters
    ----------
    right : sequence of int
        Columns aligned right (numbers).
    """
    align = ["text-align:right" if i in right else "text-align:left" for i in range(len(headers))]
    head = "".join(f'<th style="{a}">{html.escape(h)}</th>' for h, a in zip(headers, align))
    body = "".join("<tr>" + "".join(f'<td style="{a}">{c}</td>' for c, a in zip(r, align)) + "</tr>" for r in rows)
    foot = f'<div style="opacity:0.7">{html.escape(note)}</div>' if note else ""
    return (f'<div><div><b>{html.escape(title)}</b></div><table style="border-collapse:collapse">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{foot}</div>")
