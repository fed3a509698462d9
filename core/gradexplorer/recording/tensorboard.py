"""A watch log as TensorBoard event files: exported whole, or streamed while a watch runs.

``gradexplorer export run.gxw --tensorboard tb/`` (:func:`export_tensorboard`) and
``watch(..., tensorboard="tb/")`` (:class:`TensorBoardStream`) write the same events from
the same rows, one event per statistic per watched step:

* scalars, named so that TensorBoard groups them by what they are (the part before the
  first ``/`` is TensorBoard's group): ``loss``; per parameter ``grad_l2/NAME`` (the L2 of
  the gradient the optimizer stepped with), ``update_ratio/NAME`` (|Δw|/|w|) and
  ``weight_l2/NAME``; per layer ``grad_output_l2/LAYER``, ``activation_mean/LAYER``,
  ``activation_std/LAYER`` and ``activation_zero_fraction/LAYER`` (dead units);
* histograms: the log's fixed signed log2 bins (``gradexplorer.stats.merge``) of
  ``grad/NAME``, ``weight/NAME``, ``activation/LAYER``, ``grad_output/LAYER`` and
  ``grad_norm/LAYER`` (per-sample gradient norms), with their exact count, sum and sum of
  squares. TensorBoard draws a bin from the previous bin's right edge; the first starts at
  the row's minimum and an infinite edge stops at the row's maximum.

A layer's later calls in one forward are ``LAYER#1``, ``LAYER#2``, ... (its first call is
plain ``LAYER``). Of a log written under torch.distributed, each kind's merged rows
(rank -1) are written, else rank 0's, as ``gradexplorer.recording.timeline`` reads them.

Event files are TensorBoard's own record format (length, masked CRC32C, an ``Event``
protocol buffer, CRC), written with the ``tensorboard`` package's protocol buffers and
record writer; the package is an optional extra (``pip install gradexplorer[tensorboard]``).
An export is one file written atomically (``gradexplorer.base.file_write``), named after the
log so that exporting again replaces it rather than doubling every series; a stream is a
new file of its own, appended to and flushed at every watched step, as TensorBoard's
writers do (TensorBoard reads it while it grows).
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.file_write import atomic_write, check_outside_model_caches
from gradexplorer.recording.watch_log import STAT_COLUMNS, decode_hist, open_log, read_meta
from gradexplorer.stats.merge import hist_edges

#: The ``stats`` table's columns, in the order of its rows (``watch_log.stats_row``).
ROW_COLUMNS = ("step", "layer", "call", "kind", "rank", *STAT_COLUMNS, "update_ratio", "hist_lo", "hist")

#: Per kind of row: (scalar group, column) pairs written as scalars.
SCALARS: dict[str, tuple[tuple[str, str], ...]] = {
    "grad": (("grad_l2", "l2"),),
    "weight": (("update_ratio", "update_ratio"), ("weight_l2", "l2")),
    "grad_output": (("grad_output_l2", "l2"),),
    "activation": (("activation_mean", "mean"), ("activation_std", "std"),
                   ("activation_zero_fraction", "zero_fraction")),
}
#: Kinds of row written as histograms (the tag's group is the kind).
HISTOGRAMS = ("grad", "weight", "activation", "grad_output", "grad_norm")

_EDGES = hist_edges()


def _tensorboard() -> Any:
    """TensorBoard's protocol buffers and record writer, or the way to install them."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError:
        raise GradExplorerError("TensorBoard event files need the tensorboard package, which is not installed.",
                                "pip install tensorboard (or gradexplorer[tensorboard]).") from None
    return event_pb2, summary_pb2, RecordWriter


def tag(kind_group: str, layer: str, call: int) -> str:
    """The TensorBoard tag of one row's series: ``GROUP/LAYER`` (``LAYER#CALL`` for a later call)."""
    return f"{kind_group}/{layer}" if call == 0 else f"{kind_group}/{layer}#{call}"


def _value(row: dict, column: str) -> float | None:
    if column == "zero_fraction":
        numel = row.get("numel") or 0
        return None if numel == 0 else float(row.get("zero_count") or 0) / numel
    v = row.get(column)
    return None if v is None else float(v)


def chosen_rows(rows: Iterable[dict]) -> list[dict]:
    """Of one step's rows of several ranks, each kind's merged rows (rank -1), else the
    lowest rank's: the rows the timeline reads by default."""
    rows = list(rows)
    best: dict[str, int] = {}
    for r in rows:
        rank = int(r["rank"])
        have = best.get(r["kind"])
        if have is None or (rank == -1) or (have != -1 and rank < have):
            best[r["kind"]] = rank
    return [r for r in rows if int(r["rank"]) == best[r["kind"]]]


def _histogram(summary_pb2: Any, row: dict) -> Any | None:
    counts = decode_hist(row.get("hist_lo"), row.get("hist"))
    nz = np.flatnonzero(counts)
    if nz.size == 0:
        return None
    lo, hi = int(nz[0]), int(nz[-1]) + 1
    count = int(row.get("count") or 0)
    mean, m2 = float(row.get("mean") or 0.0), float(row.get("m2") or 0.0)
    vmin, vmax = float(row.get("min") or 0.0), float(row.get("max") or 0.0)
    limits = np.minimum(_EDGES[lo + 1: hi + 1], vmax)  # an infinite edge stops at the maximum
    limits = np.maximum(limits, vmin)
    return summary_pb2.HistogramProto(
        min=vmin, max=vmax, num=float(count), sum=float(row.get("sum") or 0.0),
        sum_squares=m2 + count * mean * mean, bucket_limit=[float(v) for v in limits],
        bucket=[float(c) for c in counts[lo:hi]])


def step_events(step: int, rows: Iterable[dict], loss: float | None, wall_time: float) -> Iterator[Any]:
    """The events of one watched step: its scalars and histograms (module docstring)."""
    event_pb2, summary_pb2, _ = _tensorboard()
    values = []
    if loss is not None and math.isfinite(loss):
        values.append(summary_pb2.Summary.Value(tag="loss", simple_value=loss))
    for row in chosen_rows(rows):
        layer, call, kind = str(row["layer"]), int(row["call"]), str(row["kind"])
        for group, column in SCALARS.get(kind, ()):
            v = _value(row, column)
            if v is not None:
                values.append(summary_pb2.Summary.Value(tag=tag(group, layer, call), simple_value=v))
        if kind in HISTOGRAMS:
            histo = _histogram(summary_pb2, row)
            if histo is not None:
                values.append(summary_pb2.Summary.Value(tag=tag(kind, layer, call), histo=histo))
    # One event per value, as TensorBoard's own writers do (a reader keeps one series per tag).
    for value in values:
        yield event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=[value]))


def _first_event(wall_time: float) -> Any:
    event_pb2, _, _ = _tensorboard()
    return event_pb2.Event(wall_time=wall_time, file_version="brain.Event:2")


def _folder(path: str | os.PathLike) -> Path:
    folder = check_outside_model_caches(path)  # before it is made: never a folder inside a model cache
    if folder.exists() and not folder.is_dir():
        raise GradExplorerError(f"{folder} exists and is not a folder: TensorBoard writes event files into a folder.",
                                "Pass a folder (new or existing) for the TensorBoard logs.")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GradExplorerError(f"Cannot make the TensorBoard folder {folder} ({exc.strerror}).",
                                "Pass a folder you can write to.") from None
    return folder


def _rows_of(con: Any, step: int) -> list[dict]:
    cur = con.execute(f"SELECT {', '.join(ROW_COLUMNS)} FROM stats WHERE step = ? ORDER BY rowid", (step,))
    return [dict(zip(ROW_COLUMNS, r)) for r in cur]


def export_tensorboard(log: str | os.PathLike, folder: str | os.PathLike) -> Path:
    """Write a watch log's steps as one TensorBoard event file in ``folder``.

    Parameters
    ----------
    log : path
        A watch log (``.gxw``); it may still be growing (the steps committed so far).
    folder : path
        Made when missing. The file is ``events.out.tfevents.<created>.gradexplorer.<log name>``:
        exporting the same log again replaces it.

    Returns
    -------
    Path
        The event file written.

    Raises
    ------
    GradExplorerError
        The log cannot be read, ``folder`` is not a folder, tensorboard is not installed,
        or the file cannot be written.
    """
    _, _, record_writer = _tensorboard()
    con = open_log(log)
    try:
        meta = read_meta(con)
        losses: dict[int, float | None] = {}
        for step, rank, loss in con.execute("SELECT step, rank, loss FROM steps ORDER BY step, rank"):
            if int(step) not in losses or rank == -1:  # the merged row, else the lowest rank's
                losses[int(step)] = loss
        walls = dict(con.execute("SELECT step, MAX(wall_time) FROM steps GROUP BY step").fetchall())
        created = float(meta.get("created") or time.time())
        out = _folder(folder) / f"events.out.tfevents.{int(created)}.gradexplorer.{Path(log).stem}"

        def write(fh: Any) -> None:
            # Step by step from the log: a long run's events are never all in memory.
            records = record_writer(fh)
            records.write(_first_event(created).SerializeToString())
            for step in sorted(losses):
                for event in step_events(step, _rows_of(con, step), losses[step], float(walls.get(step) or created)):
                    records.write(event.SerializeToString())

        return atomic_write(out, write)
    finally:
        con.close()


class TensorBoardStream:
    """Event files written while a watch runs: :meth:`write_step` per watched step.

    Parameters
    ----------
    folder : path
        Made when missing; a new event file of its own goes in it.
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        _, _, record_writer = _tensorboard()
        now = time.time()
        name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.gradexplorer"
        self.path = _folder(folder) / name
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as exc:
            raise GradExplorerError(f"Cannot write the TensorBoard event file {self.path} ({exc.strerror}).",
                                    "Pass a folder you can write to (tensorboard=...).") from None
        self._file = os.fdopen(fd, "wb")
        self._records = record_writer(self._file)
        self._write([_first_event(now)])

    def _write(self, events: Iterable[Any]) -> None:
        try:
            for event in events:
                self._records.write(event.SerializeToString())
            self._file.flush()
        except OSError as exc:
            raise GradExplorerError(f"The TensorBoard event file {self.path} could not take a step ({exc.strerror}).",
                                    "Free some space, or watch with tensorboard=None; the watch log is "
                                    "written apart from it.") from None

    def write_step(self, step: int, entries: Iterable[tuple[int, float | None, float]], table: Iterable[tuple],
                   wall_time: float) -> None:
        """One watched step: its ``steps`` entries ``(rank, loss, seconds)`` and ``stats`` rows."""
        losses = {rank: loss for rank, loss, _seconds in entries}
        loss = losses[-1] if -1 in losses else (losses[min(losses)] if losses else None)
        rows = [dict(zip(ROW_COLUMNS, r)) for r in table]
        self._write(step_events(step, rows, loss, wall_time))

    def close(self) -> None:
        """Close the event file."""
        self._file.close()
