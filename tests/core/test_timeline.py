"""Timeline arrays, NaN/Inf onset, vanishing/exploding flags and CSV from a watch log."""

from __future__ import annotations

import csv
import math
import sqlite3

import numpy as np
import pytest
import torch

from gradexplorer.recording.timeline import (
    export_csv,
    gradient_flags,
    layer_histograms,
    nonfinite_onset,
    read_timeline,
    timeline_from_capture,
)
from gradexplorer.recording.watch_log import STEP_BLOCK, WatchLogWriter, decode_hist, stats_row
from gradexplorer.stats.merge import HIST_BINS, MergeStats

LAYERS = ["a", "b", "c", "d"]


def grad_of(layer: str, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step * 10 + LAYERS.index(layer))
    t = torch.randn(64, generator=g)
    if layer == "b" and step >= 4:
        t = t * 1e-15  # vanishes from step 4 on
    if layer == "d" and step in (2, 7, 8, 9):
        t = t * 1e9  # explodes at 2 (then recovers), and again from 7
    if layer == "c" and step >= 6:
        t[3] = float("nan")
    return t


def write_log(path, steps=range(10)):
    w = WatchLogWriter(path, meta={"layers": LAYERS, "params": [], "every": 1})
    for s in steps:
        rows = []
        # backward writes output gradients last layer first: the reader must restore forward order
        for layer in reversed(LAYERS):
            rows.append(stats_row(s, layer, 0, "grad_output", 0, MergeStats.of_tensor(grad_of(layer, s))))
        rows.append(stats_row(s, "c", 1, "grad_output", 0, MergeStats.of_tensor(grad_of("c", s) * 2)))
        w.write_step(s, 0, 1.0 / (s + 1), 1000.0 + s, 0.1, rows)
    w.close()


def test_matrix_equals_what_was_written(tmp_path):
    path = tmp_path / "t.gxw"
    write_log(path)
    t = read_timeline(path, "grad_output", "l2")
    assert t.rows == ["a", "b", "c#0", "c#1", "d"]
    assert list(t.steps) == list(range(10))
    for s in range(10):
        for i, layer in enumerate(["a", "b", "c", "c", "d"]):
            g = grad_of(layer, s).double() * (2 if i == 3 else 1)
            g = g[torch.isfinite(g)]
            assert t.values[i, s] == pytest.approx(float(g.norm()), rel=1e-5)
    np.testing.assert_allclose(t.loss, [1.0 / (s + 1) for s in range(10)])
    m = read_timeline(path, "grad_output", "max_abs")
    assert m.values[0, 0] == pytest.approx(float(grad_of("a", 0).abs().max()), rel=1e-6)
    n = read_timeline(path, "grad_output", "nonfinite")
    assert list(n.values[2]) == [0] * 6 + [1] * 4


def test_incremental_reading_extends_to_the_same_matrix(tmp_path):
    path = tmp_path / "t.gxw"
    write_log(path, range(5))
    first = read_timeline(path)
    write_log(path, range(5, 10))
    later = read_timeline(path, since_step=int(first.steps[-1]))
    assert list(later.steps) == [5, 6, 7, 8, 9]
    both = first.extend(later)
    whole = read_timeline(path)
    assert both.rows == whole.rows
    np.testing.assert_array_equal(both.values, whole.values)


def test_onset_and_flags(tmp_path):
    path = tmp_path / "t.gxw"
    write_log(path)
    onset = nonfinite_onset(path)
    assert (onset.step, onset.layer, onset.kind) == (6, "c", "grad_output")
    flags = {(f.layer, f.what): f.since for f in gradient_flags(read_timeline(path))}
    assert flags == {("b", "vanishing"): 4, ("d", "exploding"): 7}


def test_no_onset_in_a_clean_log(tmp_path):
    path = tmp_path / "t.gxw"
    write_log(path, range(3))
    assert nonfinite_onset(path) is None


def test_histograms_over_steps(tmp_path):
    path = tmp_path / "t.gxw"
    write_log(path)
    steps, counts = layer_histograms(path, "a")
    assert list(steps) == list(range(10)) and counts.shape == (10, HIST_BINS)
    for s in range(10):
        np.testing.assert_array_equal(counts[s], MergeStats.of_tensor(grad_of("a", s)).hist)


def _plain_rows(path, layer, call, kind, rank):
    """A layer's rows by a plain scan that ignores every index: the reader's truth."""
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT step, hist_lo, hist FROM stats NOT INDEXED WHERE layer = ? AND call = ? "
                           "AND kind = ? AND rank = ? ORDER BY step", (layer, call, kind, rank)).fetchall()
    finally:
        con.close()


def test_a_layers_histograms_are_found_block_by_block_through_the_index(tmp_path):
    """Steps spread over many blocks of the per-layer index (every third step, from 5; a
    block with one step, blocks with none): the rows read are those a scan finds, in step
    order, and the reader looks them up in the index rather than scanning the log."""
    path = tmp_path / "t.gxw"
    steps = list(range(5, 200, 3)) + [STEP_BLOCK * 40]
    write_log(path, steps)
    for layer, call in (("a", 0), ("c", 1), ("d", 0)):
        got_steps, counts = layer_histograms(path, layer, call)
        truth = _plain_rows(path, layer, call, "grad_output", 0)
        assert list(got_steps) == [r[0] for r in truth] == steps
        np.testing.assert_array_equal(counts, [decode_hist(r[1], r[2]) for r in truth])
    con = sqlite3.connect(path)
    try:
        assert con.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND name = 'stats_by_layer'"
                           ).fetchone() is None
        (sql,) = con.execute("SELECT sql FROM sqlite_master WHERE name = 'stats_by_block'").fetchone()
        assert f"step / {STEP_BLOCK}, layer, kind, step" in sql
        # The reader's own query, as it ran (parameters filled in), looked up in the index.
        ran: list[str] = []
        con.set_trace_callback(ran.append)
        layer_histograms(con, "a")
        con.set_trace_callback(None)
        (query,) = [q for q in ran if "hist_lo, hist FROM stats" in q]
        plan = " ".join(str(r[-1]) for r in con.execute("EXPLAIN QUERY PLAN " + query))
    finally:
        con.close()
    assert "USING INDEX stats_by_block" in plan and "layer=?" in plan and "kind=?" in plan, plan


def _old_version_log(path, steps):
    """A log as an earlier version wrote it: indexed by (layer, kind, step), no block index."""
    write_log(path, steps)
    con = sqlite3.connect(path)
    con.execute("DROP INDEX stats_by_block")
    con.execute("CREATE INDEX stats_by_layer ON stats(layer, kind, step)")
    con.commit()
    con.close()


def test_a_log_of_an_earlier_version_is_read_and_appended_to_with_the_block_index(tmp_path):
    path = tmp_path / "t.gxw"
    _old_version_log(path, range(6))
    steps, counts = layer_histograms(path, "b")  # (its index by layer: the plain query)
    assert list(steps) == list(range(6))
    np.testing.assert_array_equal(counts[5], MergeStats.of_tensor(grad_of("b", 5)).hist)
    write_log(path, range(6, 20))  # appended by this version
    con = sqlite3.connect(path)
    indexes = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    con.close()
    assert "stats_by_block" in indexes and "stats_by_layer" not in indexes
    steps, counts = layer_histograms(path, "b")
    assert list(steps) == list(range(20))
    for s in (0, 5, 6, 19):
        np.testing.assert_array_equal(counts[s], MergeStats.of_tensor(grad_of("b", s)).hist)


def test_csv_export(tmp_path):
    path = tmp_path / "t.gxw"
    write_log(path, range(3))
    out = export_csv(path, tmp_path / "t.csv")
    with open(out) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 * 5
    r = next(r for r in rows if r["step"] == "1" and r["layer"] == "a")
    assert float(r["l2"]) == pytest.approx(float(grad_of("a", 1).double().norm()), rel=1e-5)
    assert float(r["loss"]) == pytest.approx(0.5)
    counts = [int(c) for c in r["hist"].split()]
    assert sum(counts) == 64 and r["hist_lo"]


def test_timeline_from_dataset_capture():
    from torch import nn

    from gradexplorer.recording.dataset_capture import capture_dataset, iter_tensor_batches, to_capture

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    x = torch.randn(10, 4)
    stats = capture_dataset(model, iter_tensor_batches(x, None, 3, range(4)))
    cap = to_capture(stats, model, ["0", "1", "2"], {})
    t = timeline_from_capture(cap, "grad_output", "l2")
    assert t.rows == ["0", "1", "2"] and list(t.steps) == [0, 1, 2, 3]
    assert math.isclose(t.values[0, 0], stats.series[0][1]["0#0:grad_output"][2])


def test_onset_of_a_dataset_capture():
    import torch
    from torch import nn

    from gradexplorer.recording.dataset_capture import capture_dataset, iter_tensor_batches, to_capture
    from gradexplorer.recording.timeline import capture_onset

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    x = torch.randn(12, 4)
    clean = capture_dataset(model, iter_tensor_batches(x, None, 3, range(4)))
    assert capture_onset(to_capture(clean, model, ["0", "1", "2"], {})) is None
    x[7, 1] = float("nan")  # sample 7: batch 2 of 3 samples
    stats = capture_dataset(model, iter_tensor_batches(x, None, 3, range(4)))
    cap = to_capture(stats, model, ["0", "1", "2"], {})
    onset = capture_onset(cap)
    assert (onset.step, onset.layer, onset.kind) == (2, "0", "activation")
    # Batches merged out of order (ranks) keep their indices.
    stats = capture_dataset(model, iter_tensor_batches(x, None, 3, [3, 2, 1, 0]))
    assert capture_onset(to_capture(stats, model, ["0", "1", "2"], {})).step == 2


def write_tensor_parallel_log(path):
    """A log as the watch writes it under tensor parallelism: parameter rows merged (-1),
    module rows each rank's own (0, 1), a steps row for each; rank 1's output of "b" turns
    NaN at step 2."""
    import json

    w = WatchLogWriter(path, meta={"layers": ["a", "b"], "params": ["a.weight"], "every": 1, "world_size": 2,
                                   "module_rows": json.dumps("per_rank"),
                                   "tensor_parallel": json.dumps("module a is parallelized")})
    for s in range(3):
        rows = [stats_row(s, "a.weight", 0, "grad", -1, MergeStats.of_tensor(torch.full((4,), 1.0 + s)))]
        for rank in (0, 1):
            for layer in ("a", "b"):
                t = torch.full((6,), 10.0 * (rank + 1) + s)
                if layer == "b" and rank == 1 and s == 2:
                    t[0] = float("nan")
                rows.append(stats_row(s, layer, 0, "activation", rank, MergeStats.of_tensor(t)))
        w.write_step_ranks(s, [(-1, 1.0, 0.1), (0, 1.0, 0.1), (1, 1.0, 0.1)], 1000.0 + s, rows)
    w.close()


def test_module_rows_kept_per_rank_are_read_as_rank_0s(tmp_path):
    """No merged module rows in such a log: the module kinds read rank 0's by default (any
    rank's on request), the parameter kinds the merged ones, and the first NaN is found in
    whichever rank's rows it is."""
    path = tmp_path / "tp.gxw"
    write_tensor_parallel_log(path)
    acts = read_timeline(path, "activation", "max")
    assert acts.rows == ["a", "b"] and list(acts.steps) == [0, 1, 2]
    np.testing.assert_array_equal(acts.values, [[10.0, 11.0, 12.0], [10.0, 11.0, 12.0]])
    np.testing.assert_array_equal(read_timeline(path, "activation", "max", rank=1).values[0], [20.0, 21.0, 22.0])
    grads = read_timeline(path, "grad", "max")
    np.testing.assert_array_equal(grads.values, [[1.0, 2.0, 3.0]])
    assert grads.meta["module_rows"] == "per_rank"
    onset = nonfinite_onset(path)
    assert onset is not None and (onset.step, onset.layer, onset.kind) == (2, "b", "activation")
    steps, counts = layer_histograms(path, "a", kind="activation")
    assert list(steps) == [0, 1, 2] and counts.sum() == 18  # rank 0's six values a step


def test_a_layers_calls_are_rows_in_their_order(tmp_path):
    """A module called twice is watched as two rows, its first call first (backward writes
    the second call's gradient first)."""
    import torch
    from torch import nn

    import gradexplorer as gx
    from gradexplorer.recording.timeline import read_timeline

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.act, self.b = nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)

        def forward(self, x):
            return self.b(self.act(self.a(self.act(x))))

    model = Twice()
    with gx.watch(model, str(tmp_path / "t.gxw"), every=1) as w:
        model(torch.randn(3, 4, requires_grad=True)).sum().backward()  # the first call has a gradient too
        w.step()
    rows = read_timeline(tmp_path / "t.gxw").rows
    assert rows.index("act#0") < rows.index("act#1")
