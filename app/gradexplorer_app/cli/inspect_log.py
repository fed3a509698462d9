"""``gradexplorer inspect RUN.gxw``: summarise a watch log (``gradexplorer.recording.watch_log``,
``gradexplorer.recording.timeline``)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gradexplorer.base.errors import GradExplorerError
from gradexplorer_app.cli.common import EXIT_OK
from gradexplorer_app.cli.format import fmt_num, human_size, table

# Engine modules are imported inside the functions that use them (start-up time): main builds
# every command's parser at start, and each command then loads only the engine parts it runs.


def _first_last(v: np.ndarray) -> tuple[float, float]:
    idx = np.flatnonzero(~np.isnan(v))
    return (v[idx[0]], v[idx[-1]]) if idx.size else (math.nan, math.nan)


def cmd_inspect_log(path: Path, csv_out: str | None) -> int:
    """Print the summary; with ``csv_out`` also export every row to CSV."""
    from gradexplorer.recording.timeline import export_csv, gradient_flags, nonfinite_onset, read_timeline
    from gradexplorer.recording.watch_log import open_log, read_meta

    con = open_log(path)
    try:
        meta = read_meta(con)
        steps = [s for (s,) in con.execute("SELECT DISTINCT step FROM steps ORDER BY step")]
        reports = con.execute("SELECT step, layer, message FROM reports ORDER BY rowid").fetchall()
        grads = read_timeline(con, "grad_output", "l2")
        acts = read_timeline(con, "activation", "std")
        ratios = read_timeline(con, "weight", "update_ratio")
        onset = nonfinite_onset(con)
    finally:
        con.close()
    loss = grads.loss if grads.steps.size else np.array([])
    first_loss, last_loss = _first_last(loss) if loss.size else (math.nan, math.nan)
    header = [
        ("file", f"{path} ({human_size(path.stat().st_size)})  {meta.get('format')} v{meta.get('version')}"),
        ("model", (f"{meta.get('model')}  every {meta.get('every')} steps  "
                   f"{meta.get('world_size', 1)} process{'es' if meta.get('world_size', 1) != 1 else ''}")),
        ("steps", f"{len(steps)} watched" + (f" ({steps[0]} .. {steps[-1]})" if steps else "")
                  + (f"  loss {fmt_num(first_loss)} -> {fmt_num(last_loss)}" if not math.isnan(first_loss) else "")),
        ("layers", (f"{len(grads.rows) or len(acts.rows)} with output gradients, "
                    f"{len(ratios.rows)} parameters")),
        ("NaN/Inf", f"first at step {onset.step} in {onset.layer} ({onset.kind})" if onset else "none"),
    ]
    flags = gradient_flags(grads)
    if flags:
        header.append(("flags", "; ".join(f"{f.layer} {f.what} since step {f.since}" for f in flags[:6])
                       + (" ..." if len(flags) > 6 else "")))
    else:
        header.append(("flags", "no layer vanishing or exploding at the last step"))
    for step, layer, message in reports[:5]:
        header.append(("report", f"{layer}: {message}" + (f" (step {step})" if step is not None else "")))
    width = max(len(k) for k, _ in header)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in header))
    print()
    rows = []
    act_index = {r: i for i, r in enumerate(acts.rows)}
    for i, name in enumerate(grads.rows):
        v = grads.values[i]
        first, last = _first_last(v)
        a = acts.values[act_index[name]] if name in act_index else np.array([math.nan])
        rows.append([name, fmt_num(first), fmt_num(last), fmt_num(np.nanmin(v) if np.isfinite(v).any() else None),
                     fmt_num(np.nanmax(v) if np.isfinite(v).any() else None), fmt_num(_first_last(a)[1]),
                     ", ".join(f.what for f in flags if f.layer == name)])
    if rows:
        print(table(["LAYER", "GRAD L2 FIRST", "LAST", "MIN", "MAX", "ACT STD LAST", "FLAGS"], rows, "lrrrrrl"))
    if csv_out:
        out = export_csv(path, csv_out)
        print(f"\nwrote CSV to {out.resolve()}")
    return EXIT_OK


def check_csv_target(csv_out: str, source: Path) -> None:
    """Refuse, before any work, a --csv path in a missing folder, a folder, a socket or disk,
    or the log itself (through a link or another spelling too)."""
    from gradexplorer.base.file_write import check_output_path

    folder = Path(csv_out).expanduser().parent
    if not folder.is_dir():
        raise GradExplorerError(f"the folder '{folder}' of --csv does not exist;",
                                "create it first or choose another path.")
    check_output_path(csv_out, [source])
