"""A timeline (``gradexplorer.recording.timeline.Timeline``, what ``gx.read_timeline`` returns) as
a table: a pandas DataFrame (``Timeline.to_pandas``) and the compact HTML a notebook shows
for it (``Timeline._repr_html_``).

The DataFrame is the matrix as it is: a row per layer (``layer`` or ``layer#call``, in
forward order), a column per watched step, the statistic's values (NaN where a layer has
none at a step); ``frame.attrs`` holds the ``kind`` and ``stat``. The HTML table has a row
per layer: the first and last values, the smallest and largest, a line of its values over
the steps (log scale), the last value as a bar on a log scale across layers, and the
layer's flags (vanishing or exploding since a step, ``gradexplorer.recording.timeline
.gradient_flags``, for output-gradient norms).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gradexplorer.base import html_table
from gradexplorer.base.errors import GradExplorerError

# The timeline is typed ``Any`` here: ``Timeline``'s own methods call these functions, so this
# module must not import gradexplorer.recording.timeline back (no import cycles).

#: The HTML table shows at most this many rows (the DataFrame has them all).
HTML_ROWS = 60


def timeline_frame(t: Any) -> Any:
    """The layers × steps matrix as a pandas DataFrame (module docstring)."""
    try:
        import pandas as pd
    except ImportError:
        raise GradExplorerError("A DataFrame needs pandas, which is not installed.", "pip install pandas.") from None
    frame = pd.DataFrame(np.asarray(t.values, dtype=np.float64).reshape(len(t.rows), len(t.steps)),
                         index=pd.Index(list(t.rows), name="layer"),
                         columns=pd.Index([int(s) for s in t.steps], name="step"))
    frame.attrs.update({"kind": t.kind, "stat": t.stat})
    return frame


def _sparkline(values: np.ndarray, width: int = 90, height: int = 16) -> str:
    """An inline SVG line of ``values`` over the steps on a log scale (finite positive ones)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where((values > 0) & np.isfinite(values), np.log10(values), np.nan)
    present = np.flatnonzero(~np.isnan(logs))
    if present.size < 2:
        return ""
    lo, hi = float(np.nanmin(logs)), float(np.nanmax(logs))
    span = hi - lo or 1.0
    n = max(len(values) - 1, 1)
    points = " ".join(f"{i * (width - 2) / n + 1:.1f},{height - 1 - (logs[i] - lo) / span * (height - 2):.1f}"
                      for i in present)
    return (f'<svg width="{width}" height="{height}" style="vertical-align:middle">'
            f'<polyline points="{points}" fill="none" stroke="currentColor" stroke-width="1"/></svg>')


def _ends(v: np.ndarray) -> tuple[float, float]:
    idx = np.flatnonzero(~np.isnan(v))
    return (float(v[idx[0]]), float(v[idx[-1]])) if idx.size else (math.nan, math.nan)


def timeline_html(t: Any, flags: Sequence[Any] = ()) -> str:
    """The compact HTML table a notebook shows for a timeline (module docstring).

    Parameters
    ----------
    t : Timeline
    flags : sequence of ``gradexplorer.recording.timeline.Flag``
        The layers flagged at the last step (``layer``, ``what``, ``since``).
    """
    values = np.asarray(t.values, dtype=np.float64).reshape(len(t.rows), len(t.steps))
    ends = [_ends(row) for row in values]
    fractions = html_table.log_fractions([last for _first, last in ends])
    by_layer: dict[str, list[str]] = {}
    for f in flags:
        by_layer.setdefault(f.layer, []).append(f"{f.what} since {f.since}")
    rows = []
    for i, name in enumerate(t.rows[:HTML_ROWS]):
        row = values[i]
        finite = row[np.isfinite(row)]
        first, last = ends[i]
        rows.append([html_table.escape(name), html_table.number(first),
                     html_table.number(float(finite.min()) if finite.size else None),
                     html_table.number(float(finite.max()) if finite.size else None),
                     _sparkline(row), html_table.bar(fractions[i], html_table.number(last)),
                     html_table.badges(by_layer.get(name, []))])
    steps = [int(s) for s in t.steps]
    span = f"steps {steps[0]} .. {steps[-1]}" if steps else "no step yet"
    title = f"gradexplorer timeline: {t.kind} {t.stat}, {len(t.rows)} rows × {len(steps)} steps ({span})"
    note = f"{len(t.rows) - HTML_ROWS} more rows not shown. " if len(t.rows) > HTML_ROWS else ""
    note += "timeline.to_pandas() has the whole matrix."
    return html_table.table(title, ["layer", "first", "min", "max", "over the steps", "last", "flags"], rows,
                            note=note, right=(1, 2, 3, 5))
