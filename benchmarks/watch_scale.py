"""What the watch costs at scale: the log's write throughput and the bytes of one statistics record.

    python -m benchmarks.watch_scale [--rows 1550] [--steps 40] [--repeats 5]

Writes ``--steps`` watched steps of ``--rows`` rows each (a 7B decoder's merged rows by
default, see docs/scale.md) into a fresh watch log (SQLite WAL, ``synchronous=NORMAL``), as
the watch writes them: one transaction per step, realistic gradient statistics with a full
histogram. Prints, as the median of ``--repeats`` runs (the machine is shared), rows per
second, seconds per step (overall, and the median step of the first and of the last tenth of
the steps: whether a step costs more as the log grows) and the log's bytes per row; then the
bytes one tensor's statistics take on the wire (the pickled record that ``gather_object``
sends). Figures only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import tempfile
import time

import torch

from gradexplorer.recording.watch_log import WatchLogWriter, stats_row
from gradexplorer.stats.merge import MergeStats


def records(rows: int) -> list[MergeStats]:
    g = torch.Generator().manual_seed(0)
    return [MergeStats.of_tensor(torch.randn(4096, generator=g) * 10.0 ** (i % 7 - 4)) for i in range(rows)]


def write_once(stats: list[MergeStats], steps: int) -> tuple[float, float, list[float]]:
    """(seconds of writing, bytes of the log per row, seconds of each step's write) for
    ``steps`` steps of ``stats``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.gxw")
        writer = WatchLogWriter(path, meta={"every": 1})
        each = []
        t0 = time.perf_counter()
        for step in range(steps):
            table = [stats_row(step, f"layers.{i // 10}.m{i % 10}", 0, "grad", -1, s) for i, s in enumerate(stats)]
            t = time.perf_counter()
            writer.write_step(step, -1, 1.0, time.time(), 0.0, table)
            each.append(time.perf_counter() - t)
        seconds = time.perf_counter() - t0
        writer.close()
        size = os.path.getsize(path)
    return seconds, size / (steps * len(stats)), each


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1550)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    stats = records(args.rows)
    runs = [write_once(stats, args.steps) for _ in range(args.repeats)]
    secs = statistics.median(r[0] for r in runs)
    per_row = statistics.median(r[1] for r in runs)
    total = args.rows * args.steps
    print(f"watch log (SQLite WAL): {args.steps} steps of {args.rows} rows, median of {args.repeats} runs")
    print(f"  rows per second       {total / secs:,.0f}")
    print(f"  seconds per step      {secs / args.steps:.4f}")
    tenth = max(1, args.steps // 10)
    first = statistics.median(statistics.median(r[2][:tenth]) for r in runs)
    last = statistics.median(statistics.median(r[2][-tenth:]) for r in runs)
    print(f"  seconds per step's write, first and last tenth of the steps (median step) {first:.4f} {last:.4f}")
    print(f"  bytes per row on disk {per_row:,.0f}")
    wire = statistics.median(len(pickle.dumps(s.to_dict())) for s in stats[:100])
    print(f"  bytes per tensor record gathered (pickled MergeStats.to_dict, median) {wire:,.0f}")


if __name__ == "__main__":
    main()
