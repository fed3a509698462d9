"""A watch log as one table: a pandas DataFrame, and the Parquet file of it.

One row per ``stats`` row of the log (``gradexplorer.recording.watch_log.ALL_ROWS_QUERY``),
with its step's loss and wall time: ``step, layer, call, kind, rank``, the statistics,
``update_ratio``, ``hist_lo``, ``hist`` (the row's fixed-bin histogram as a list of counts
from bin ``hist_lo``: the non-zero stretch, as the log stores it;
``gradexplorer.recording.watch_log.decode_hist`` restores all bins), ``loss`` and
``wall_time``. The CSV export of the same rows is ``gradexplorer.recording.timeline.export_csv``.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.base.file_write import atomic_write_bytes
from gradexplorer.recording.watch_log import ALL_ROWS_QUERY, open_log


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise GradExplorerError("A DataFrame needs pandas, which is not installed.", "pip install pandas.") from None
    return pd


def log_frame(log: str | os.PathLike) -> Any:
    """Every statistics row of a watch log, with its step's loss, as a pandas DataFrame.

    Parameters
    ----------
    log : path
        A watch log (``.gxw``); it may still be growing.

    Returns
    -------
    pandas.DataFrame
        One row per ``stats`` row (module docstring), in the log's order.
    """
    pd = _pandas()
    con = open_log(log)
    try:
        cur = con.execute(ALL_ROWS_QUERY + " ORDER BY s.step, s.rowid")
        columns = [d[0] for d in cur.description]
        rows = [tuple(r) for r in cur]
    finally:
        con.close()
    frame = pd.DataFrame.from_records(rows, columns=columns)
    frame["hist"] = [np.frombuffer(b, dtype="<i8").astype(np.int64).tolist() if b else [] for b in frame["hist"]]
    for column in ("step", "call", "rank", "numel", "count", "nan_count", "inf_count", "zero_count", "hist_lo"):
        frame[column] = frame[column].astype("int64")
    return frame


def export_parquet(log: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Write :func:`log_frame` to a Parquet file, atomically.

    Raises
    ------
    GradExplorerError
        pandas or a Parquet engine (pyarrow) is missing, or the file cannot be written.
    """
    frame = log_frame(log)
    buf = io.BytesIO()
    try:
        frame.to_parquet(buf, index=False)
    except ImportError:
        raise GradExplorerError("Writing Parquet needs pyarrow, which is not installed.",
                                "pip install pyarrow, or export CSV (--csv).") from None
    return atomic_write_bytes(path, buf.getvalue())
