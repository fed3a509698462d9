"""The fused CPU statistics pass alone, beside plain reads of the same tensor.

    python -m benchmarks.stats_kernel [--numel 6422528] [--repeats 15]
    NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 python -m benchmarks.stats_kernel   # one thread

Prints nanoseconds per value (median of repeats) of ``gradexplorer.stats.cpu.summarize`` (what a
capture's hooks run on each CPU tensor, with the capture's histogram sample), of
``torch.sum``, ``torch.aminmax`` and ``Tensor.clone``, on a float32 tensor of ``--numel``
values (default: resnet50's 8×256×56×56 activations) in two states:

- ``fresh``: written just before, then 200 MB written elsewhere, so that it is read from
  memory, as a capture reads each new activation and gradient;
- ``hot``: the same tensor read again, from the cache.

The gap between ``summarize`` and ``torch.sum`` on fresh tensors is how far the kernel is
from running at memory bandwidth, its target; the statistics are float64 throughout (equal to
float64 NumPy), which ``torch.sum`` on float32 is not. Figures only.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from gradexplorer.stats import cpu as cpu_stats
from gradexplorer.stats.moments import HIST_EXACT_LIMIT


def ns_per_value(fn: Callable[[torch.Tensor], object], numel: int, repeats: int, fresh: bool) -> float:
    """Median nanoseconds per value of ``fn`` on a float32 tensor of ``numel`` values."""
    times = []
    x = torch.randn(numel)
    fn(x)  # compile or warm up
    for _ in range(repeats):
        if fresh:
            x = torch.randn(numel)
            evict = torch.randn(50_000_000)  # 200 MB: beyond this machine's share of the cache
            del evict
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e9 / numel


KINDS: dict[str, Callable[[torch.Tensor], object]] = {
    "summarize": lambda x: cpu_stats.summarize(x, HIST_EXACT_LIMIT),
    "torch.sum": lambda x: x.sum(),
    "torch.aminmax": lambda x: torch.aminmax(x),
    "clone": lambda x: x.clone(),
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numel", type=int, default=8 * 256 * 56 * 56)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    if not cpu_stats.available():
        print("numba kernels unavailable: nothing to measure")
        return {}
    import numba

    print(f"{args.numel:,} float32 values; torch {torch.get_num_threads()} threads, "
          f"numba {numba.get_num_threads()} threads; ns per value, median of {args.repeats}")
    out = {}
    for name, fn in KINDS.items():
        fresh = ns_per_value(fn, args.numel, args.repeats, fresh=True)
        hot = ns_per_value(fn, args.numel, args.repeats, fresh=False)
        out[name] = (fresh, hot)
        print(f"  {name:<14} fresh {fresh:6.3f}   hot {hot:6.3f}", flush=True)
    return out


if __name__ == "__main__":
    main()
