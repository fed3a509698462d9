"""The watch log: an SQLite database in WAL mode (``.gxw``), written by ``gradexplorer.recording.watch``.

Why SQLite: one file, readable from any language and with one ``pandas.read_sql`` query,
transactions that a killed process cannot half-write, and WAL mode lets readers (the
timeline view, ``gradexplorer inspect``) open the file while the training writes it.
Each watched step is one transaction: a training killed with SIGKILL leaves a log with
every step whose ``step()`` returned.

Schema (version 1)::

    meta(key TEXT PRIMARY KEY, value TEXT)           -- format, version, every, layers, ...
    steps(step INTEGER, rank INTEGER, loss REAL, wall_time REAL, seconds REAL,
          PRIMARY KEY (step, rank))
    stats(step INTEGER, layer TEXT, call INTEGER, kind TEXT, rank INTEGER,
          numel, count, nan_count, inf_count, zero_count INTEGER,
          min, max, mean, std, sum, sum_abs, m2, l2, mean_abs REAL,
          update_ratio REAL,                           -- |Δw|/|w|, on kind 'weight' rows
          hist_lo INTEGER, hist BLOB)                  -- see below
    reports(step INTEGER, layer TEXT, message TEXT)  -- what could not be watched, and why

``kind`` is ``activation`` and ``grad_output`` (a module's output and the gradient with
respect to it, per ``call``), ``grad_norm`` (the per-sample L2 norms of that gradient: their
distribution), ``grad`` and ``weight`` (a parameter, ``layer`` is its qualified name,
``call`` 0). ``rank`` is the process rank, or -1 for statistics merged over all ranks. Under
tensor parallelism the module rows (``activation``, ``grad_output``, ``grad_norm``) are each
rank's own while the parameter rows are merged: ``meta`` then holds ``module_rows`` =
``"per_rank"`` and ``tensor_parallel`` (why, in words), and a step has a ``steps`` row for -1
and one per rank.
``hist`` holds the non-zero stretch of the signed log2 histogram of ``gradexplorer.stats.merge``:
little-endian int64 counts of bins ``hist_lo``, ``hist_lo + 1``, ... (:func:`decode_hist`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import sqlite3
import stat
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.file_write import check_output_path
from gradexplorer.base.units import format_bytes
from gradexplorer.recording.watch_log_check import MAX_JSON_DEPTH, check_log, json_depth
from gradexplorer.stats.merge import HIST_BINS, MergeStats

FORMAT = "gradexplorer-watch"
VERSION = 1

#: Steps per block of the per-layer index: its keys start with ``step / STEP_BLOCK``, so that a
#: step's rows go into the index next to those of the few steps before it, one place per
#: layer near the index's end. An index on ``(layer, kind, step)`` put each of a step's rows at
#: the end of that layer's run over the whole log: once the log was a few hundred steps long,
#: a step of 1,000 rows wrote about 1,000 index pages, and writing it took 33 ms instead of 5
#: (docs/benchmarks.md, "The watch log's per-layer index"). A layer's rows are read back one
#: block at a time (``gradexplorer.recording.timeline.layer_histograms``). Part of the log's
#: format: a log keeps the index it was written with, so another value needs another index name.
STEP_BLOCK = 8

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS steps(step INTEGER NOT NULL, rank INTEGER NOT NULL, loss REAL,
    wall_time REAL, seconds REAL, PRIMARY KEY (step, rank));
CREATE TABLE IF NOT EXISTS stats(step INTEGER NOT NULL, layer TEXT NOT NULL, call INTEGER NOT NULL,
    kind TEXT NOT NULL, rank INTEGER NOT NULL, numel INTEGER, count INTEGER, nan_count INTEGER,
    inf_count INTEGER, zero_count INTEGER, min REAL, max REAL, mean REAL, std REAL, sum REAL,
    sum_abs REAL, m2 REAL, l2 REAL, mean_abs REAL, update_ratio REAL, hist_lo INTEGER, hist BLOB);
CREATE INDEX IF NOT EXISTS stats_by_block ON stats(step / {STEP_BLOCK}, layer, kind, step);
CREATE INDEX IF NOT EXISTS stats_by_step ON stats(step);
CREATE TABLE IF NOT EXISTS reports(step INTEGER, layer TEXT, message TEXT);
"""

#: The kinds of row a module's calls give (a parameter's are ``grad`` and ``weight``).
MODULE_KINDS = ("activation", "grad_output", "grad_norm")

STAT_COLUMNS = ("numel", "count", "nan_count", "inf_count", "zero_count", "min", "max", "mean", "std",
                "sum", "sum_abs", "m2", "l2", "mean_abs")

#: One query that gives every statistic with its step's loss (docs/watch-and-timeline.md: the watch log).
ALL_ROWS_QUERY = "SELECT s.*, st.loss, st.wall_time FROM stats s LEFT JOIN steps st USING (step, rank)"


#: The first 16 bytes of every SQLite database file.
SQLITE_MAGIC = b"SQLite format 3\x00"


def is_watch_log(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an SQLite file: a watch log, or something to refuse as one (by its
    header, so that a log renamed away from ``.gxw`` is still told from a capture file).

    Only a regular file is opened: opening a FIFO would wait for a writer, a device could
    block or never end."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as fh:
            return fh.read(16) == SQLITE_MAGIC
    except (OSError, ValueError):
        return False


def encode_hist(hist: np.ndarray) -> tuple[int, bytes]:
    """(first bin, little-endian int64 counts up to the last non-zero bin)."""
    return encode_hists([hist])[0]


def encode_hists(hists: list[np.ndarray]) -> list[tuple[int, bytes]]:
    """``encode_hist`` of each of ``hists`` (histograms of one length), their non-zero
    stretches found for all at once: a watched step encodes a histogram per row."""
    h = np.asarray(np.stack(hists), dtype="<i8")
    nonzero = h != 0
    first = nonzero.argmax(axis=1).tolist()
    end = (h.shape[1] - nonzero[:, ::-1].argmax(axis=1)).tolist()
    return [(lo, h[i, lo:hi].tobytes()) if nonzero[i, lo] else (0, b"") for i, (lo, hi) in enumerate(zip(first, end))]


def decode_hist(hist_lo: int | None, blob: bytes | None) -> np.ndarray:
    """The full ``HIST_BINS`` counts from a row's ``hist_lo`` and ``hist``."""
    out = np.zeros(HIST_BINS, dtype=np.int64)
    if blob:
        # A checked log's blobs fit (watch_log_check); one that does not is cut to the bins.
        lo = min(max(int(hist_lo or 0), 0), HIST_BINS)
        counts = np.frombuffer(blob[: (len(blob) // 8) * 8], dtype="<i8")[: HIST_BINS - lo]
        out[lo: lo + counts.size] = counts
    return out


def _finite_or_none(v: float) -> float | None:
    # SQLite stores NaN as NULL anyway; say so explicitly, and keep ±inf.
    return None if isinstance(v, float) and math.isnan(v) else v


def stats_row(step: int, layer: str, call: int, kind: str, rank: int, s: MergeStats,
              update_ratio: float | None = None) -> tuple:
    """One ``stats`` table row."""
    return stats_rows(step, rank, [(layer, call, kind, s, update_ratio)])[0]


def stats_rows(step: int, rank: int, entries: list[tuple[str, int, str, MergeStats, float | None]]) -> list[tuple]:
    """The ``stats`` table rows of ``(layer, call, kind, statistics, update ratio)``
    entries of one step and rank.

    The numbers of ``MergeStats.summary``, computed for all the rows at once in the same
    float64 operations in the same order (each rounded once, as Python's floats are), and
    each histogram's non-zero stretch (``encode_hist``) found for all at once: a watched step
    writes a row per tensor, a thousand on a model of small layers, and row by row their
    Python cost nearly as much as their SQLite inserts (docs/benchmarks.md, "Watching a
    training run").
    """
    if not entries:
        return []
    stats = [e[3] for e in entries]
    f = np.array([(s.count, s.numel, s.min, s.max, s.mean, s.m2, s.sum, s.sum_abs) for s in stats], np.float64)
    m, numel, lo_v, hi_v, mean, m2, total, sum_abs = f.T
    some = m > 0
    with np.errstate(all="ignore"):  # (rows without a finite value: NaN, chosen below)
        var = np.where(m > 1, m2 / (m - 1.0), 0.0)
        l2 = np.sqrt(np.maximum(m2 + m * mean * mean, 0.0))
        cols = np.stack([np.where(some, lo_v, np.nan), np.where(some, hi_v, np.nan), np.where(some, mean, np.nan),
                         np.where(some, np.sqrt(var), np.nan), total, sum_abs, m2,
                         np.where(some, l2, np.where(numel > 0, np.nan, 0.0)),
                         np.where(some, sum_abs / m, np.nan)], axis=1)
    # NaN as None (SQLite would store it as NULL anyway; TensorBoard's export reads None).
    floats = cols.astype(object)
    floats[np.isnan(cols)] = None
    return [(step, layer, call, kind, rank, s.numel, s.count, s.nan_count, s.inf_count, s.zero_count, *values,
             None if ratio is None else _finite_or_none(ratio), *hist)
            for (layer, call, kind, s, ratio), values, hist
            in zip(entries, floats.tolist(), encode_hists([s.hist for s in stats]))]


def row_stats(row: dict) -> MergeStats:
    """The ``MergeStats`` back from a ``stats`` row (as a dict of column -> value)."""
    def num(key: str, default: float) -> float:
        v = row.get(key)
        return default if v is None else v
    return MergeStats(
        numel=int(num("numel", 0)), count=int(num("count", 0)), nan_count=int(num("nan_count", 0)),
        inf_count=int(num("inf_count", 0)), zero_count=int(num("zero_count", 0)),
        min=float(num("min", math.inf)), max=float(num("max", -math.inf)), sum=float(num("sum", 0.0)),
        sum_abs=float(num("sum_abs", 0.0)), mean=float(num("mean", 0.0)), m2=float(num("m2", 0.0)),
        hist=decode_hist(row.get("hist_lo"), row.get("hist")),
    )


class WatchLogWriter:
    """Appends watched steps to a log; each step is one committed transaction."""

    def __init__(self, path: str | os.PathLike, meta: dict | None = None) -> None:
        self.path = os.fspath(path)
        # The log's own check first (a folder, FIFO, device or link is "not a regular file", in
        # words about the watch log), then those of every output (gradexplorer.base.file_write):
        # never inside a model cache, a folder that exists and can be written.
        _refuse_special_file(self.path)
        check_output_path(self.path)
        _refuse_foreign_file(self.path)
        self._lock_fd = _lock_for_writing(self.path)
        try:
            # isolation_level=None: we open and commit transactions ourselves.
            self.con = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            _unlock(self._lock_fd)
            raise GradExplorerError(f"Cannot open the watch log {self.path} ({exc}).",
                                    "Choose a new file name for --out / out=.") from None
        try:
            self.con.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a committed step survives a killed process (not a power cut
            # before the next checkpoint), at no fsync per step.
            self.con.execute("PRAGMA synchronous=NORMAL")
            self.con.executescript(SCHEMA)
            # A log written by an earlier version, appended to: its rows are indexed by block
            # now (above); its index by layer would cost every new step as much as before.
            self.con.execute("DROP INDEX IF EXISTS stats_by_layer")
            existing = dict(self.con.execute("SELECT key, value FROM meta").fetchall())
            if existing and existing.get("format") != FORMAT:
                raise GradExplorerError(f"{self.path} is an SQLite file but not a gradexplorer watch log.",
                                        "Choose a new file name for --out / out=.")
            values = {"format": FORMAT, "version": str(VERSION), "created": str(time.time())}
            values.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in (meta or {}).items()})
            self.con.execute("BEGIN")
            self.con.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", values.items())
            self.con.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            self.con.close()
            _unlock(self._lock_fd)
            raise GradExplorerError(f"{self.path} cannot be written as a watch log ({exc}).",
                                    "Choose a new file name for --out / out=.") from None
        except BaseException:
            self.con.close()
            _unlock(self._lock_fd)
            raise

    def write_step(self, step: int, rank: int, loss: float | None, wall_time: float, seconds: float,
                   rows: Iterable[tuple], reports: Iterable[tuple[str, str]] = ()) -> None:
        """Write one step's rows and its ``steps`` row in one transaction.

        A step that was written before (a rerun into the same file) is replaced.

        Raises
        ------
        GradExplorerError
            The log cannot take the step (a full disk, a file that can no longer be
            written); the steps before it stay in the log, whole.
        """
        self.write_step_ranks(step, [(rank, loss, seconds)], wall_time, rows, reports)

    def write_step_ranks(self, step: int, ranks: Iterable[tuple[int, float | None, float]], wall_time: float,
                         rows: Iterable[tuple], reports: Iterable[tuple[str, str]] = ()) -> None:
        """Write one step's rows and a ``steps`` row per ``(rank, loss, seconds)`` in one
        transaction (a step whose rows are of several ranks: each rank's own, merged ones).

        A step that was written before (a rerun into the same file) is replaced.
        """
        con = self.con
        rows = list(rows)
        entries = list(ranks)
        written = {r for r, _loss, _seconds in entries} | {r[4] for r in rows}
        try:
            con.execute("BEGIN")
            con.executemany("DELETE FROM stats WHERE step = ? AND rank = ?", [(step, r) for r in written])
            con.executemany(f"INSERT INTO stats VALUES ({', '.join('?' * 22)})", rows)
            con.executemany("INSERT INTO reports VALUES (?, ?, ?)", [(step, layer, m) for layer, m in reports])
            con.executemany("INSERT OR REPLACE INTO steps VALUES (?, ?, ?, ?, ?)",
                            [(step, r, _finite_or_none(loss) if loss is not None else None, wall_time, seconds)
                             for r, loss, seconds in entries])
            con.execute("COMMIT")
        except BaseException as exc:
            self._roll_back()
            if isinstance(exc, sqlite3.Error):
                raise self._write_failed(exc, f"step {step}") from None
            raise

    def report(self, step: int | None, layer: str, message: str) -> None:
        """Record something that could not be watched (committed at once)."""
        try:
            self.con.execute("INSERT INTO reports VALUES (?, ?, ?)", (step, layer, message))
        except sqlite3.Error as exc:
            self._roll_back()
            raise self._write_failed(exc, "a report") from None

    def _roll_back(self) -> None:
        # SQLite ends the transaction itself on some errors (a full disk, an I/O error):
        # rolling back then would raise "no transaction is active" over the real error.
        if self.con.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self.con.execute("ROLLBACK")

    def _write_failed(self, exc: sqlite3.Error, what: str) -> GradExplorerError:
        """The message for a write the log could not take: a full disk by SQLite's code."""
        kept = "the steps before it are in the log, whole"
        if getattr(exc, "sqlite_errorcode", None) == getattr(sqlite3, "SQLITE_FULL", 13) or "is full" in str(exc):
            try:
                free = f" ({format_bytes(shutil.disk_usage(Path(self.path).resolve().parent).free)} free)"
            except OSError:
                free = ""
            return GradExplorerError(
                f"The disk is full{free}: the watch log {self.path} could not take {what}; {kept}.",
                "Free some space or watch into a log on another disk (out=...); "
                "'gradexplorer inspect' reads the log as it is.")
        return GradExplorerError(f"The watch log {self.path} could not take {what} ({exc}); {kept}.",
                                 "Check that its folder is still writable, or watch into a new file (out=...).")

    def close(self) -> None:
        """Checkpoint the WAL into the main file and close."""
        # A reader may hold the WAL: the data is committed all the same.
        with contextlib.suppress(sqlite3.Error):
            self.con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.con.close()
        _unlock(self._lock_fd)
        self._lock_fd = None


def _refuse_foreign_file(path: str) -> None:
    """Refuse a file that exists and is not a watch log (another program's SQLite database,
    a capture, a picture): the watch would add its tables to it and switch it to WAL mode.
    An empty file, or a watch log (to append to), is accepted."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return
    except OSError as exc:
        raise GradExplorerError(f"Cannot open the watch log {path} ({exc.strerror}).",
                                "Choose another path for the watch log.") from None
    if size == 0:
        return
    fix = "Choose a new file name for --out / out=; the watch writes only its own logs."
    if not is_watch_log(path):
        raise GradExplorerError(f"{path} exists and is not a watch log (not an SQLite file); it was left as it was.",
                                fix)
    try:
        uri = Path(path).resolve().as_uri() + "?mode=ro"
        con = sqlite3.connect(uri, uri=True, timeout=10)
        try:
            tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            meta = dict(con.execute("SELECT key, value FROM meta").fetchall()) if "meta" in tables else {}
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise GradExplorerError(f"{path} is an SQLite file that cannot be read as a watch log ({exc}); "
                                "it was left as it was.", fix) from None
    if meta.get("format") != FORMAT and tables:
        raise GradExplorerError(f"{path} is an SQLite file but not a gradexplorer watch log "
                                f"(tables: {', '.join(sorted(tables)[:5])}); it was left as it was.", fix)


def _lock_path(path: str) -> str:
    return path + ".lock"


def _lock_for_writing(path: str) -> int | None:
    """Hold an exclusive lock on ``PATH.lock`` for the writer's life: a second watch writing
    into the same log is refused rather than mixing its steps with the first one's. The lock
    goes with the process (a killed training leaves no stale lock behind); the file stays,
    empty, beside the log."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks here; SQLite still keeps each step whole
        return None
    try:
        fd = os.open(_lock_path(path), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None  # a read-only folder: SQLite will say it cannot write the log
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = os.pread(fd, 32, 0).decode().strip()
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            by = f" (process {holder})" if holder.isdigit() else ""
            raise GradExplorerError(
                f"{path} is being written by another watch{by}: two watches in one log would mix "
                "their steps.",
                "Give this run its own file (out=...), or wait for the other run to end.") from None
        return None
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _unlock(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _refuse_special_file(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise GradExplorerError(f"{path} exists and is not a regular file.",
                                "Choose another path for the watch log.")


def open_log(path: str | os.PathLike) -> sqlite3.Connection:
    """Open a watch log for reading (also while a training writes it).

    Raises
    ------
    GradExplorerError
        When the file is missing or is not a watch log.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise GradExplorerError(f"No watch log at {path}.", "Pass the file given to watch(out=...).")
    if not is_watch_log(path):
        raise GradExplorerError(f"{path} is not a watch log (not an SQLite file).",
                                "Open a .gxw file written by gradexplorer's watch.")
    con = None
    try:
        con = _connect_for_reading(path)
        meta = dict(con.execute("SELECT key, value FROM meta WHERE key = 'format'").fetchall())
        if meta.get("format") != FORMAT:
            raise GradExplorerError(f"{path} is not a watch log.", "Open a .gxw file written by gradexplorer's watch.")
        check_log(con, path)
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        # SQLite's message about a damaged schema can quote bytes that are not UTF-8.
        if con is not None:
            con.close()
        raise GradExplorerError(f"{path} is not a watch log ({exc}).",
                                "Open a .gxw file written by gradexplorer's watch.") from None
    except BaseException:
        if con is not None:
            con.close()
        raise
    return con


def _connect_for_reading(path: str) -> sqlite3.Connection:
    """A connection that reads ``path``, also where it cannot be written.

    First read-write at the SQLite level: a reader of a WAL database whose writer was
    killed must be able to recover the WAL index. A log in a read-only folder (or a
    read-only file) cannot get its ``-shm`` index created: it is then opened read-only, and
    where even that needs the index, as an immutable file (a finished log: its WAL was
    checkpointed into the main file when the watch closed it)."""
    uri = Path(path).resolve().as_uri()
    last: sqlite3.Error | None = None
    for query in ("", "?mode=ro", "?mode=ro&immutable=1"):
        con = sqlite3.connect(uri + query, uri=True, timeout=10, check_same_thread=False)
        con.row_factory = sqlite3.Row
        # SQLite never checks that TEXT is UTF-8: a damaged name is shown with U+FFFD.
        con.text_factory = lambda raw: raw.decode("utf-8", "replace")
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError as exc:
            con.close()
            last = exc
            if "unable to open" in str(exc) or "readonly" in str(exc) or "read-only" in str(exc):
                continue
            raise
        return con
    assert last is not None
    raise last


def read_meta(con: sqlite3.Connection) -> dict:
    """The meta table, JSON values decoded where they are JSON."""
    out = {}
    for key, value in con.execute("SELECT key, value FROM meta"):
        if isinstance(value, str) and json_depth(value) > MAX_JSON_DEPTH:
            out[key] = value  # never decoded: open_log refuses such a log; kept as text otherwise
            continue
        try:
            out[key] = json.loads(value)
        except (TypeError, ValueError, RecursionError):
            out[key] = value
    return out
