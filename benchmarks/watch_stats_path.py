"""The watch's statistics on the CPU: the compiled path (``gradexplorer.stats.merge_cpu``) against
the torch path, in the same run.

    python -m benchmarks.watch_stats_path [--size 112] [--batch 16] [--steps 6]

One watch with ``every=2`` on a resnet18 training loop (SGD + momentum, a fixed random
batch): odd steps run with no hook at all (the unwatched reference), even steps are
watched, alternately with the numba kernels and with ``GRADEXPLORER_CPU_KERNEL=0``'s torch
operations. Each ratio is the mean watched step over the mean unwatched step, all of them
interleaved, so that a shared machine's load hits every configuration alike. Figures
only: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch


def measure(size: int = 112, batch: int = 16, steps: int = 6) -> dict[str, float]:
    """Ratios of the watched step, compiled and torch statistics, to the unwatched step."""
    import gradexplorer.stats.merge_cpu as fast
    from benchmarks.watch_overhead import resnet18_training
    from gradexplorer.recording.watch import watch

    model, step = resnet18_training(size, batch)

    times: dict[str, list[float]] = {"unwatched": [], "compiled": [], "torch": []}
    warm = 4  # the first watched steps compile (or load) the kernels
    with watch(model, out=os.path.join(tempfile.mkdtemp(prefix="gx-stats-path-"), "w.gxw"), every=2) as w:
        for i in range(4 * steps + warm):
            kind = "unwatched" if i % 2 else ("compiled" if i % 4 == 0 else "torch")
            fast._state["kernels"] = None if kind != "torch" else False  # None: built again on use
            start = time.perf_counter()
            loss = step()
            w.step(loss=loss)
            if i >= warm:
                times[kind].append(time.perf_counter() - start)
    fast._state["kernels"] = None
    base = sum(times["unwatched"]) / len(times["unwatched"])
    return {"unwatched_ms": base * 1000,
            "compiled": sum(times["compiled"]) / len(times["compiled"]) / base,
            "torch": sum(times["torch"]) / len(times["torch"]) / base}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=112)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=6, help="watched steps of each kind")
    args = p.parse_args()
    r = measure(args.size, args.batch, args.steps)
    print(f"resnet18 batch {args.batch} at {args.size} px, torch threads {torch.get_num_threads()}: "
          f"unwatched {r['unwatched_ms']:.0f} ms; watched step (every leaf, every parameter) "
          f"{r['compiled']:.3f}x with the compiled statistics, {r['torch']:.3f}x with torch's "
          f"({args.steps} steps of each, interleaved)", flush=True)


if __name__ == "__main__":
    main()
