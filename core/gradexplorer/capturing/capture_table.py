"""A capture as a table: a pandas DataFrame (``Capture.to_pandas``) and the compact HTML a
notebook shows for it (``Capture._repr_html_``).

The DataFrame has a row per layer, call and kind: ``kind`` is ``activation``,
``grad_output`` or ``grad_input`` for each call of a layer (``call`` 0, 1, ...), and
``param_grad`` for each parameter gradient of a layer (``param`` names it; ``call`` is
empty), with the layer's ``type``, the call's output ``shape`` and ``dtype``, every scalar
statistic of ``gradexplorer.stats.record.TensorStats`` and the layer's flags, ``layer_flags``
(``gradexplorer.capturing.flags``). A tensor the capture has no statistics for (no
gradient reached the layer, an input that needed none) has no row.

The HTML table has one row per layer, in forward order: its type, its output's shape (and
how many calls), the L2 norm of its output gradient (over all its calls, as the
gradient-flow view aggregates them) with a bar on a log scale, and its flags.
"""

from __future__ import annotations

import math
from typing import Any

from gradexplorer.base import html_table
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.flags import layer_flags
from gradexplorer.stats.record import SCALAR_KEYS, TensorStats

# The capture is typed ``Any`` here: ``Capture``'s own methods call these functions, so this
# module must not import gradexplorer.capturing.data back (no import cycles).

#: Call kinds, in the order of a layer's rows.
CALL_KINDS = ("activation", "grad_output", "grad_input")
#: The HTML table shows at most this many layers (the DataFrame has them all).
HTML_ROWS = 60


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise GradExplorerError("A DataFrame needs pandas, which is not installed.", "pip install pandas.") from None
    return pd


def _stats_columns(stats: TensorStats) -> dict[str, Any]:
    return {k: (int(stats[k]) if k in ("numel", "nan_count", "inf_count") else float(stats[k])) for k in SCALAR_KEYS}


def capture_frame(cap: Any) -> Any:
    """The capture's statistics as a pandas DataFrame (see the module docstring)."""
    pd = _pandas()
    flags = layer_flags(cap)
    records = []
    for name, layer in cap.layers.items():
        flagged = ", ".join(flags.get(name, []))
        for call_index, call in enumerate(layer.calls):
            for kind in CALL_KINDS:
                stats = call.stats.get(kind)
                if stats:
                    records.append({"layer": name, "call": call_index, "kind": kind, "param": None,
                                    "type": layer.type, "shape": tuple(call.shape), "dtype": call.dtype,
                                    **_stats_columns(stats), "layer_flags": flagged})
        for pname, stats in layer.param_stats.items():
            if stats:
                records.append({"layer": name, "call": None, "kind": "param_grad", "param": pname,
                                "type": layer.type, "shape": None, "dtype": None,
                                **_stats_columns(stats), "layer_flags": flagged})
    columns = ["layer", "call", "kind", "param", "type", "shape", "dtype", *SCALAR_KEYS, "layer_flags"]
    frame = pd.DataFrame.from_records(records, columns=columns)
    frame["call"] = frame["call"].astype("Int64")
    return frame


def _gradient_l2(cap: Any, name: str) -> float:
    """The L2 of a layer's output gradient over all its calls (NaN without one)."""
    norms = [float(s["l2"]) for c in cap[name].calls if (s := c.stats.get("grad_output"))
             and s["numel"] > s["nan_count"] + s["inf_count"]]
    return math.hypot(*norms) if norms else math.nan


def capture_html(cap: Any) -> str:
    """The compact HTML table a notebook shows for a capture (module docstring)."""
    names = cap.layer_order
    flags = layer_flags(cap)
    norms = [_gradient_l2(cap, n) for n in names]
    fractions = html_table.log_fractions(norms)
    rows = []
    for name, l2, fraction in list(zip(names, norms, fractions))[:HTML_ROWS]:
        layer = cap[name]
        shape = "×".join(str(d) for d in layer.calls[0].shape) if layer.calls else ""
        if len(layer.calls) > 1:
            shape += f" ({len(layer.calls)} calls)"
        rows.append([html_table.escape(name), html_table.escape(layer.type), html_table.escape(shape),
                     html_table.bar(fraction, html_table.number(l2)), html_table.badges(flags.get(name, []))])
    meta = cap.meta
    title = (f"gradexplorer capture: {meta.get('model', 'model')}, {len(names)} layers, "
             f"target {meta.get('target', '?')}, {cap.mode}")
    flagged = sum(1 for f in flags.values() if f)
    note = f"{flagged} layer{'s' if flagged != 1 else ''} flagged. "
    if len(names) > HTML_ROWS:
        note += f"{len(names) - HTML_ROWS} more layers not shown. "
    note += "capture.to_pandas() has every call and statistic."
    return html_table.table(title, ["layer", "type", "output shape", "gradient L2", "flags"], rows, note=note,
                            right=(3,))
