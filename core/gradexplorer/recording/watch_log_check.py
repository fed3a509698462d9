"""The watch log's schema, checked before any reader trusts a row of it.

A ``.gxw`` file is an SQLite database anyone can edit, truncate or forge. Before
``gradexplorer inspect``, ``gradexplorer timeline`` and the window read one, :func:`check_log`
asserts, in a fixed number of SQL scans (no Python loop over rows):

- the database is sound (SQLite's ``quick_check``, on the first look at a file);
- the tables ``meta``, ``steps``, ``stats`` and ``reports`` exist, with their columns;
- every value has its column's type: integers where counts, steps and ranks are, numbers
  (or NULL) where statistics are, text where names are, blobs where histograms are;
- each histogram blob is whole, non-negative int64 counts and fits the histogram's bins
  from ``hist_lo``;
- ``meta`` values are text of bounded size, and JSON nested no deeper than
  :data:`MAX_JSON_DEPTH` (measured without recursion; a 100,000-deep value would otherwise
  exhaust Python's stack when it is decoded).

A failure is a :class:`WatchLogError` that names the table, the column and how many rows are
wrong. A log that grows while it is watched is checked once in full, then only in its new
rows (the ``stats`` rowids past those already checked, while the main file is unchanged),
so that following a live training costs no more than reading it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.stats.merge import HIST_BINS

__all__ = ["MAX_JSON_DEPTH", "MAX_META_BYTES", "WatchLogError", "check_log", "json_depth"]

#: The deepest JSON a ``meta`` value may hold (the watch writes depth 2 at most).
MAX_JSON_DEPTH = 32
#: The largest ``meta`` value, in bytes (the layer list of a 100,000-layer model fits).
MAX_META_BYTES = 64 << 20

_INTEGER = ("integer",)
_NUMBER = ("integer", "real")
_TEXT = ("text",)
_BLOB = ("blob",)

#: Each table's columns and the SQLite types a value may have (NULL is always allowed
#: where the column allows it; ``NOT NULL`` columns are listed in ``_REQUIRED``).
COLUMNS: dict[str, dict[str, tuple[str, ...]]] = {
    "meta": {"key": _TEXT, "value": _TEXT},
    "steps": {"step": _INTEGER, "rank": _INTEGER, "loss": _NUMBER, "wall_time": _NUMBER, "seconds": _NUMBER},
    "stats": {
        "step": _INTEGER, "layer": _TEXT, "call": _INTEGER, "kind": _TEXT, "rank": _INTEGER,
        **dict.fromkeys(("numel", "count", "nan_count", "inf_count", "zero_count"), _INTEGER),
        **dict.fromkeys(("min", "max", "mean", "std", "sum", "sum_abs", "m2", "l2", "mean_abs",
                         "update_ratio"), _NUMBER),
        "hist_lo": _INTEGER, "hist": _BLOB,
    },
    "reports": {"step": _INTEGER, "layer": _TEXT, "message": _TEXT},
}
_REQUIRED = {"meta": ("key",), "steps": ("step", "rank"), "stats": ("step", "layer", "call", "kind", "rank")}
# Integers a reader turns into sizes or indices: bounded, so that no count overflows an int64 sum.
_BOUNDED = {"numel": (0, 1 << 62), "count": (0, 1 << 62), "nan_count": (0, 1 << 62), "inf_count": (0, 1 << 62),
            "zero_count": (0, 1 << 62), "call": (0, 1 << 31), "rank": (-1, 1 << 31), "hist_lo": (0, HIST_BINS)}

_FIX = "The log is damaged or was not written by gradexplorer's watch: watch the training again into a new file."


class WatchLogError(GradExplorerError):
    """A watch log that fails its schema check; the message names the table and column."""


# (device, inode, mtime, size) of a log's main file -> the last stats rowid checked. A log
# being written in WAL mode keeps its main file as it is between checkpoints (new rows go
# to the -wal file): only those rows are new. Any change to the main file checks it anew.
_checked: dict[tuple[int, int, int, int], int] = {}
_checked_lock = threading.Lock()


def json_depth(text: str) -> int:
    """How deeply ``text``'s JSON arrays and objects nest (strings skipped), without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _fail(path: str, problem: str) -> WatchLogError:
    return WatchLogError(f"{path} is not a readable watch log: {problem}.", _FIX)


def _check_tables(con: sqlite3.Connection, path: str) -> None:
    names = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for table, columns in COLUMNS.items():
        if table not in names:
            raise _fail(path, f"its table '{table}' is missing")
        have = {row[1] for row in con.execute(f"PRAGMA table_info('{table}')")}
        missing = [c for c in columns if c not in have]
        if missing:
            raise _fail(path, f"its table '{table}' has no column '{missing[0]}'")


def _type_clauses(table: str, columns: dict[str, tuple[str, ...]]) -> list[tuple[str, str]]:
    """(column, an SQL expression true for a row whose value in it is wrong)."""
    out = []
    for column, types in columns.items():
        allowed = ", ".join(f"'{t}'" for t in types)
        nullable = column not in _REQUIRED.get(table, ())
        bad = f"typeof(\"{column}\") NOT IN ({allowed}{', ' + repr('null') if nullable else ''})"
        if column in _BOUNDED:
            lo, hi = _BOUNDED[column]
            bad = f"({bad} OR (typeof(\"{column}\") = 'integer' AND (\"{column}\" < {lo} OR \"{column}\" > {hi})))"
        out.append((column, bad))
    if table == "stats":
        # A count is negative when the last byte of its little-endian int64 is 0x80 or more:
        # one look per bin (the ``bins`` table of _check_rows), in SQL, whatever the rows.
        negative = ("EXISTS (SELECT 1 FROM bins WHERE i < length(hist) / 8 "
                    "AND substr(hist, i * 8 + 8, 1) >= X'80')")
        out.append(("hist", ("(typeof(hist) = 'blob' AND (length(hist) % 8 != 0 OR "
                             f"coalesce(hist_lo, 0) + length(hist) / 8 > {HIST_BINS} OR {negative}))")))
    return out


def _explain(column: str, table: str) -> str:
    types = COLUMNS[table].get(column, ())
    if column == "hist":
        return (f"histogram blobs that are not whole, non-negative int64 counts within the {HIST_BINS} "
                "bins from 'hist_lo'")
    if column in _BOUNDED:
        lo, hi = _BOUNDED[column]
        return f"values that are not integers from {lo} to {hi}"
    if types == _NUMBER:
        return "values that are not numbers"
    if types == _INTEGER:
        return "values that are not integers"
    return f"values that are not {types[0]}"


def _check_rows(con: sqlite3.Connection, path: str, table: str, where: str = "1") -> None:
    clauses = _type_clauses(table, COLUMNS[table])
    sums = ", ".join(f"sum({bad})" for _c, bad in clauses)
    bins = f"WITH RECURSIVE bins(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM bins WHERE i < {HIST_BINS - 1}) "
    counts = con.execute(f"{bins}SELECT {sums} FROM \"{table}\" WHERE {where}").fetchone()
    for (column, _bad), count in zip(clauses, counts):
        if count:
            raise _fail(path, f"its table '{table}', column '{column}', holds {_explain(column, table)} "
                              f"in {count} row{'s' if count != 1 else ''}")


def _check_meta(con: sqlite3.Connection, path: str) -> None:
    for key, value in con.execute(
            "SELECT key, value FROM meta WHERE typeof(value) = 'text' "
            f"AND length(CAST(value AS BLOB)) <= {MAX_META_BYTES}"):
        if json_depth(value) > MAX_JSON_DEPTH:
            raise _fail(path, f"its table 'meta', column 'value', holds JSON nested deeper than "
                              f"{MAX_JSON_DEPTH} levels (key '{str(key)[:40]}')")
    _check_meta_types(con, path)
    (big,) = con.execute(f"SELECT count(*) FROM meta WHERE length(CAST(value AS BLOB)) > {MAX_META_BYTES}").fetchone()
    if big:
        raise _fail(path, f"its table 'meta', column 'value', holds values larger than {MAX_META_BYTES >> 20} MiB")


def _names(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31


#: What the readers take each known ``meta`` key to be, once JSON-decoded.
META_TYPES = {"layers": (_names, "a list of layer names"), "params": (_names, "a list of parameter names"),
              "every": (_count, "a whole number"), "world_size": (_count, "a whole number"),
              "per_rank": (lambda v: isinstance(v, bool), "true or false"),
              "module_rows": (lambda v: v in ("merged", "per_rank"), '"merged" or "per_rank"'),
              "tensor_parallel": (lambda v: isinstance(v, str), "text"),
              "layer_types": (lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(t, str)
                                                                    for k, t in v.items()),
                              "a mapping of layer names to class names")}


def _check_meta_types(con: sqlite3.Connection, path: str) -> None:
    keys = ", ".join(f"'{k}'" for k in META_TYPES)
    for key, value in con.execute(f"SELECT key, value FROM meta WHERE key IN ({keys})"):
        fits, words = META_TYPES[key]
        try:
            decoded = json.loads(value) if isinstance(value, str) and json_depth(value) <= MAX_JSON_DEPTH else None
        except ValueError:
            decoded = None
        if not fits(decoded):
            raise _fail(path, f"its table 'meta', column 'value', holds for key '{key}' something that is not "
                              f"{words}")


def check_log(con: sqlite3.Connection, path: str | os.PathLike) -> None:
    """Check an open watch log before it is read; rows already checked are not checked again.

    Parameters
    ----------
    con : sqlite3.Connection
        The log, open for reading.
    path : str or os.PathLike
        Its path (named in messages; its inode remembers what was checked).

    Raises
    ------
    WatchLogError
        The database is damaged, a table or column is missing, a value has the wrong type,
        a histogram blob is malformed, or a ``meta`` value is too large or too deeply nested.
    """
    shown = os.fspath(path)
    try:
        info = os.stat(shown)
        key: tuple[int, int, int, int] | None = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)
    except OSError:
        key = None
    with _checked_lock:
        last_rowid = _checked.get(key, -1) if key is not None else -1
    try:
        if last_rowid < 0:
            (verdict,) = con.execute("PRAGMA quick_check(1)").fetchone()
            if verdict != "ok":
                raise _fail(shown, f"SQLite finds it damaged ({str(verdict)[:120]})")
        _check_tables(con, shown)
        _check_meta(con, shown)
        _check_rows(con, shown, "meta")
        _check_rows(con, shown, "steps")
        _check_rows(con, shown, "reports")
        (top,) = con.execute("SELECT coalesce(max(rowid), -1) FROM stats").fetchone()
        if top < last_rowid:
            last_rowid = -1
        _check_rows(con, shown, "stats", f"rowid > {int(last_rowid)}")
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        raise _fail(shown, f"SQLite cannot read it ({str(exc)[:160]})") from None
    except RecursionError:
        raise _fail(shown, "its contents nest too deeply to read") from None
    if key is not None:
        with _checked_lock:
            if len(_checked) > 1000:
                _checked.clear()
            _checked[key] = int(top)
