"""Arrays over steps from a watch log (or a dataset capture's per-batch series).

The timeline view and ``gradexplorer inspect run.gxw`` draw and print what these
functions compute: a layers × steps matrix of one statistic, one layer's histograms over
steps, the first NaN/Inf (step and layer), layers whose gradients vanish or explode and
since when, and a CSV export. Reading is incremental (``since_step``), so that a view can
follow a log while the training writes it.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import os
import sqlite3
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradexplorer.files.capture_file import atomic_save
from gradexplorer.recording.timeline_table import timeline_frame, timeline_html
from gradexplorer.recording.watch_log import (
    MODULE_KINDS,
    STAT_COLUMNS,
    STEP_BLOCK,
    decode_hist,
    open_log,
    read_meta,
)

#: Statistics a timeline can show (``stats`` table columns), and ``max_abs``.
TIMELINE_STATS = ("l2", "mean", "std", "mean_abs", "max_abs", "min", "max", "nonfinite", "zero_fraction",
                  "update_ratio")
KINDS = ("grad_output", "activation", "grad_norm", "grad", "weight")

#: A layer's gradient L2 below this (absolute) counts as vanished.
VANISH_ABS = 1e-12
#: Or below this fraction of the median layer's L2 at the same step.
VANISH_REL = 1e-6
#: A layer's gradient L2 above this many times the median layer's counts as exploding.
EXPLODE_REL = 1e6


def _expr(stat: str) -> str:
    if stat == "max_abs":
        return "MAX(ABS(min), ABS(max))"
    if stat == "nonfinite":
        return "(nan_count + inf_count)"
    if stat == "zero_fraction":
        return "(CAST(zero_count AS REAL) / NULLIF(numel, 0))"
    if stat in STAT_COLUMNS or stat == "update_ratio":
        return stat
    raise ValueError(f"unknown statistic {stat!r}; one of {', '.join(TIMELINE_STATS)}")


@dataclass
class Timeline:
    """One statistic of one kind of row, layers × steps.

    Attributes
    ----------
    steps : ndarray of int, shape (S,)
    rows : list of str
        ``layer`` or ``layer#call`` when a layer runs more than once, in forward order.
    values : ndarray of float64, shape (R, S)
        NaN where a row has no value at a step.
    loss : ndarray of float64, shape (S,)
    kind, stat : str
    """

    steps: np.ndarray
    rows: list[str]
    values: np.ndarray
    loss: np.ndarray
    kind: str
    stat: str
    meta: dict = field(default_factory=dict)

    def row_type(self, row: str) -> str:
        """The class of the module a row belongs to (``"Conv2d"``), or "" when the source
        does not record it (a log written before it did). A parameter's row
        (``features.0.weight``) is its module's."""
        types = self.meta.get("layer_types")
        if not isinstance(types, dict):
            return ""
        name = row.split("#", 1)[0]
        if self.kind not in MODULE_KINDS:
            name = name.rpartition(".")[0]
        return str(types.get(name, ""))

    def to_pandas(self) -> Any:
        """The matrix as a pandas DataFrame: a row per layer, a column per step
        (``gradexplorer.recording.timeline_table``)."""
        return timeline_frame(self)

    def _repr_html_(self) -> str:
        """The compact table a notebook shows (``gradexplorer.recording.timeline_table``)."""
        flags = gradient_flags(self) if self.kind == "grad_output" and self.stat == "l2" else []
        return timeline_html(self, flags)

    def extend(self, other: Timeline) -> Timeline:
        """This timeline followed by ``other``'s later steps (rows united, new ones last)."""
        rows = self.rows + [r for r in other.rows if r not in self.rows]
        new = other.steps > (self.steps.max() if self.steps.size else -1)
        steps = np.concatenate([self.steps, other.steps[new]])
        values = np.full((len(rows), steps.size), np.nan)
        values[: len(self.rows), : self.steps.size] = self.values
        index = {r: i for i, r in enumerate(rows)}
        for j, r in enumerate(other.rows):
            values[index[r], self.steps.size:] = other.values[j, new]
        loss = np.concatenate([self.loss, other.loss[new]])
        return Timeline(steps, rows, values, loss, self.kind, self.stat, other.meta or self.meta)


def _module_rows_per_rank(con: sqlite3.Connection) -> bool:
    """Whether the log keeps module rows per rank beside merged parameter rows (tensor
    parallelism: ``gradexplorer.recording.watch``)."""
    row = con.execute("SELECT value FROM meta WHERE key = 'module_rows'").fetchone()
    return row is not None and row[0] in ('"per_rank"', "per_rank")


def _rank_clause(con: sqlite3.Connection, rank: int | None, kind: str | None = None) -> tuple[str, int]:
    if rank is not None:
        return "rank = ?", rank
    if kind in MODULE_KINDS and _module_rows_per_rank(con):
        return "rank = ?", 0  # no merged module rows: rank 0's own
    # Merged rows (-1) when there are any, else rank 0.
    has_merged = con.execute("SELECT 1 FROM steps WHERE rank = -1 LIMIT 1").fetchone()
    return "rank = ?", (-1 if has_merged else 0)


def read_timeline(source: str | os.PathLike | sqlite3.Connection, kind: str = "grad_output",
                  stat: str = "l2", rank: int | None = None, since_step: int = -1) -> Timeline:
    """Read a layers × steps matrix from a watch log.

    Parameters
    ----------
    source : path or open connection (``gradexplorer.recording.watch_log.open_log``)
    kind : str
        ``grad_output``, ``activation``, ``grad_norm``, ``grad`` or ``weight``.
    stat : str
        One of :data:`TIMELINE_STATS`.
    rank : int, optional
        A rank's own rows; by default the merged rows (or rank 0's, also for module rows
        kept per rank under tensor parallelism).
    since_step : int
        Only steps after this one (to follow a growing log).
    """
    con = open_log(source) if not isinstance(source, sqlite3.Connection) else source
    try:
        where, r = _rank_clause(con, rank, kind)
        meta = read_meta(con)
        steps = np.array([s for (s,) in con.execute(
            f"SELECT step FROM steps WHERE {where} AND step > ? ORDER BY step", (r, since_step))], dtype=np.int64)
        loss_of = dict(con.execute(f"SELECT step, loss FROM steps WHERE {where} AND step > ?", (r, since_step)))
        data = con.execute(
            f"SELECT step, layer, call, {_expr(stat)} FROM stats WHERE kind = ? AND {where} AND step > ? "
            "ORDER BY rowid", (kind, r, since_step)).fetchall()
    finally:
        if not isinstance(source, sqlite3.Connection):
            con.close()
    multi = {layer for _s, layer, call, _v in data if call > 0}
    order: dict[str, int] = {}
    for _s, layer, call, _v in data:
        label = f"{layer}#{call}" if layer in multi else layer
        order.setdefault(label, len(order))
    known = meta.get("layers") if kind in MODULE_KINDS else meta.get("params")
    if isinstance(known, list):
        # Forward (registration) order, whatever order backward wrote the rows in.
        rank_of = {name: i for i, name in enumerate(known)}
        # A layer's calls in their order (backward had written relu#1 before relu#0).
        labels = sorted(order, key=lambda lab: (rank_of.get(lab.split("#")[0], len(rank_of)),
                                                int(lab.partition("#")[2] or 0), order[lab]))
    else:
        labels = list(order)
    index = {lab: i for i, lab in enumerate(labels)}
    col = {int(s): j for j, s in enumerate(steps)}
    values = np.full((len(labels), steps.size), np.nan)
    for s, layer, call, v in data:
        j = col.get(int(s))
        if j is None or v is None:
            continue
        label = f"{layer}#{call}" if layer in multi else layer
        values[index[label], j] = v
    loss = np.array([np.nan if loss_of.get(int(s)) is None else loss_of[int(s)] for s in steps], dtype=np.float64)
    return Timeline(steps, labels, values, loss, kind, stat, meta)


def timeline_from_capture(cap: Any, kind: str = "grad_output", stat: str = "l2") -> Timeline:
    """The per-batch series of a dataset capture (``gradexplorer.recording.dataset_capture``) as a timeline:
    batches stand for steps. ``stat`` is one of its series fields."""
    series = cap.meta.get("dataset", {}).get("series")
    if not series:
        raise ValueError("not a dataset capture: it has no per-batch series")
    fields = list(series["fields"])
    if stat not in fields:
        raise ValueError(f"unknown statistic {stat!r} for a dataset capture; one of {', '.join(fields)}")
    col = fields.index(stat)
    rows, values = [], []
    for name, arr in series["rows"].items():
        layer, rest = name.split("#", 1)
        call, k = rest.split(":", 1)
        if k != kind:
            continue
        rows.append(layer if call == "0" else f"{layer}#{call}")
        values.append(np.asarray(arr)[:, col])
    order = list(cap.layers) if hasattr(cap, "layers") else []
    rank_of = {n: i for i, n in enumerate(order)}
    idx = sorted(range(len(rows)), key=lambda i: (rank_of.get(rows[i].split("#")[0], len(rank_of)), rows[i]))
    steps = np.asarray(series["batch"], dtype=np.int64)
    mat = np.array([values[i] for i in idx]) if idx else np.zeros((0, steps.size))
    types = {name: rec.type for name, rec in cap.layers.items()} if hasattr(cap, "layers") else {}
    return Timeline(steps, [rows[i] for i in idx], mat, np.full(steps.size, np.nan), kind, stat,
                    {"layer_types": types})


def layer_histograms(source: str | os.PathLike | sqlite3.Connection, layer: str, call: int = 0,
                     kind: str = "grad_output", rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(steps, counts of shape (S, HIST_BINS)) of one row over steps."""
    con = open_log(source) if not isinstance(source, sqlite3.Connection) else source
    try:
        where, r = _rank_clause(con, rank, kind)
        wanted = f"layer = ? AND call = ? AND kind = ? AND {where}"
        if con.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'stats_by_block'").fetchone():
            # The index by block of steps (watch_log.STEP_BLOCK): the layer's rows of each
            # block that holds a step, found by a lookup each rather than a scan of the log.
            # (Every step written has its row in ``steps``, as the timeline reads them.)
            data = con.execute(
                f"SELECT step, hist_lo, hist FROM stats WHERE step / {STEP_BLOCK} IN "
                f"(SELECT DISTINCT step / {STEP_BLOCK} FROM steps) AND {wanted} ORDER BY step",
                (layer, call, kind, r)).fetchall()
        else:  # a log of an earlier version (its index by layer), or one without an index
            data = con.execute(f"SELECT step, hist_lo, hist FROM stats WHERE {wanted} ORDER BY step",
                               (layer, call, kind, r)).fetchall()
    finally:
        if not isinstance(source, sqlite3.Connection):
            con.close()
    steps = np.array([d[0] for d in data], dtype=np.int64)
    counts = np.array([decode_hist(d[1], d[2]) for d in data]) if data else np.zeros((0, 0), dtype=np.int64)
    return steps, counts


@dataclass
class Onset:
    """The first NaN/Inf: at which step, in which layer (first in forward order) and row kind."""

    step: int
    layer: str
    kind: str


def histogram_rows(counts: np.ndarray, gap: int = 2) -> list[int | None]:
    """The bins a picture of ``counts`` (steps × ``HIST_BINS``) shows, bottom to top: every
    bin from the first used to the last, except that a run of more than ``2 * gap`` empty
    bins keeps ``gap`` on each side and stands for the rest as one ``None`` row. A gradient
    of both signs fills the octaves down to 2^-40 or so and leaves the fifty-odd bins
    between -2^-40 and +2^-40 empty: shown whole, they had taken most of the strip.

    Returns
    -------
    list of int or None
        Bin indices in increasing order of value, ``None`` where empty bins were left out.
    """
    if not counts.size:
        return []
    used = np.flatnonzero(np.asarray(counts).reshape(-1, counts.shape[-1]).sum(axis=0))
    if len(used) == 0:
        return []
    rows: list[int | None] = []
    for a, b in itertools.pairwise(int(u) for u in used):
        if b - a - 1 > 2 * gap:
            rows += list(range(a, a + gap + 1)) + [None] + list(range(b - gap, b))
        else:
            rows += list(range(a, b))
    rows.append(int(used[-1]))
    return rows


def nonfinite_onset(source: str | os.PathLike | sqlite3.Connection, rank: int | None = None) -> Onset | None:
    """The first step with a NaN or Inf anywhere, and its first layer in forward order
    (by default in the merged rows; in a log that keeps module rows per rank, in any rank's)."""
    con = open_log(source) if not isinstance(source, sqlite3.Connection) else source
    try:
        where, r = _rank_clause(con, rank)
        if rank is None and _module_rows_per_rank(con):
            where = f"(rank = ? OR kind IN ({', '.join(repr(k) for k in MODULE_KINDS)}))"
        first = con.execute(f"SELECT MIN(step) FROM stats WHERE {where} AND nan_count + inf_count > 0",
                            (r,)).fetchone()[0]
        if first is None:
            return None
        rows = con.execute(f"SELECT layer, kind FROM stats WHERE {where} AND step = ? AND nan_count + inf_count > 0 "
                           "ORDER BY rowid", (r, first)).fetchall()
        meta = read_meta(con)
    finally:
        if not isinstance(source, sqlite3.Connection):
            con.close()
    layers = meta.get("layers") or []
    params = meta.get("params") or []
    order = {n: i for i, n in enumerate(layers)}

    def position(row: tuple[str, str]) -> tuple:
        layer, kind = row
        if layer in order:
            return (order[layer], kind != "activation")
        # a parameter: place it with its module
        owner = layer.rsplit(".", 1)[0]
        return (order.get(owner, len(order) + (params.index(layer) if layer in params else 0)), True)

    layer, kind = min(rows, key=position)
    return Onset(int(first), layer, kind)


def capture_onset(cap: Any) -> Onset | None:
    """The first batch of a dataset capture (``gradexplorer.recording.dataset_capture``) with a NaN or Inf in
    its per-batch series, and the first layer in forward order where it is (an activation
    before a gradient; a parameter with its module). ``None`` when every value was finite.

    Parameters
    ----------
    cap : Capture
        Its ``meta["dataset"]["series"]`` is read; other captures have no onset.
    """
    series = (cap.meta.get("dataset") or {}).get("series")
    if not series or "nonfinite" not in series["fields"]:
        return None
    col = list(series["fields"]).index("nonfinite")
    batches = list(series["batch"])
    first: int | None = None
    hits: list[tuple[str, str]] = []
    for name, arr in series["rows"].items():
        counts = np.asarray(arr)[:, col]
        bad = np.flatnonzero(counts > 0)
        if bad.size == 0:
            continue
        at = int(batches[int(bad[0])])
        layer, rest = name.split("#", 1)
        kind = rest.split(":", 1)[1]
        if first is None or at < first:
            first, hits = at, [(layer, kind)]
        elif at == first:
            hits.append((layer, kind))
    if first is None:
        return None
    order = {n: i for i, n in enumerate(getattr(cap, "layer_order", None) or list(getattr(cap, "layers", {})))}

    def position(hit: tuple[str, str]) -> tuple:
        layer, kind = hit
        if layer in order:
            return (order[layer], kind != "activation", kind)
        owner = layer.rsplit(".", 1)[0]  # a parameter: with its module, after its rows
        return (order.get(owner, len(order)), True, kind)

    layer, kind = min(hits, key=position)
    return Onset(first, layer, kind)


@dataclass
class Flag:
    """A layer whose output gradient vanished or exploded, continuously since ``since``."""

    layer: str
    what: str  # "vanishing" or "exploding"
    since: int


def gradient_flags(t: Timeline) -> list[Flag]:
    """Layers whose values (meant for ``grad_output`` L2) are vanishing or exploding at the
    last step, and since which step without a break (thresholds: :data:`VANISH_ABS`,
    :data:`VANISH_REL`, :data:`EXPLODE_REL` against the median layer of the same step)."""
    if t.values.size == 0:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a step where every layer is NaN
        median = np.nanmedian(np.where(np.isfinite(t.values), t.values, np.nan), axis=0)
    flags = []
    for i, row in enumerate(t.rows):
        v = t.values[i]
        with np.errstate(invalid="ignore"):
            vanish = (v < VANISH_ABS) | (v < VANISH_REL * median)
            # Against a median of 0 (most layers dead) nothing counts as exploding.
            explode = (np.isinf(v)) | ((median > 0) & (v > EXPLODE_REL * median))
        for what, mask in (("vanishing", vanish), ("exploding", explode)):
            present = ~np.isnan(v) | (what == "exploding")
            idx = np.flatnonzero(present)
            if idx.size == 0 or not mask[idx[-1]]:
                continue
            start = idx[-1]
            for j in idx[::-1]:
                if not mask[j]:
                    break
                start = j
            flags.append(Flag(row, what, int(t.steps[start])))
    return flags


def export_csv(source: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Write every statistics row with its step's loss to CSV (histograms as space-separated
    counts from ``hist_lo``), atomically."""
    con = open_log(source)
    try:
        cur = con.execute("SELECT s.step, s.layer, s.call, s.kind, s.rank, "
                          + ", ".join(f"s.{c}" for c in STAT_COLUMNS)
                          + ", s.update_ratio, st.loss, s.hist_lo, s.hist FROM stats s "
                          "LEFT JOIN steps st USING (step, rank) ORDER BY s.step, s.rowid")
        header = [d[0] for d in cur.description]
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(header)
        for row in cur:
            row = list(row)
            blob = row[-1]
            row[-1] = " ".join(str(int(c)) for c in np.frombuffer(blob, dtype="<i8")) if blob else ""
            w.writerow(["" if (isinstance(v, float) and math.isnan(v)) else v for v in row])
    finally:
        con.close()
    data = buf.getvalue().encode()
    return atomic_save(data, path, saver=lambda obj, f: f.write(obj))


def timeline_csv(t: Timeline, path: str | os.PathLike) -> Path:
    """Write the matrix as shown: one row per layer, one column per step (and the loss
    as the last row), atomically."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([f"{t.kind}.{t.stat}"] + [int(s) for s in t.steps])
    for name, row in zip(t.rows, t.values):
        w.writerow([name] + ["" if math.isnan(v) else repr(float(v)) for v in row])
    w.writerow(["loss"] + ["" if math.isnan(v) else repr(float(v)) for v in t.loss])
    return atomic_save(buf.getvalue().encode(), path, saver=lambda obj, f: f.write(obj))


def log_colour(values: np.ndarray) -> np.ndarray:
    """log10 of |values| for a log colour scale; zeros, NaN and Inf become NaN (drawn apart)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log10(np.abs(values))
    out[~np.isfinite(out)] = np.nan
    return out
