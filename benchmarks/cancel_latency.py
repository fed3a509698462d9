"""Cancel latency: time from setting the cancel flag (from another thread, at a random
moment of the run) until ``CaptureCancelled`` arrives.

    python -m benchmarks.cancel_latency [--model resnet50] [--batch 8] [--repeats 10]
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

import torch
import torchvision

from gradexplorer.base.errors import CaptureCancelled
from gradexplorer.capturing.capture import capture


def measure(name: str = "resnet50", batch: int = 8, repeats: int = 10, size: int = 224, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = torchvision.models.get_model(name).eval()
    x = torch.randn(batch, 3, size, size)
    capture(model, x, mode="full")  # warm-up
    t0 = time.perf_counter()
    capture(model, x, mode="full")
    whole = time.perf_counter() - t0
    latencies = []
    for _ in range(repeats):
        flag = threading.Event()
        set_at: list[float] = []

        def fire():
            set_at.append(time.perf_counter())
            flag.set()

        timer = threading.Timer(rng.uniform(0.05, 0.95) * whole, fire)
        timer.start()
        try:
            capture(model, x, mode=rng.choice(["full", "stats"]), cancel=flag)
        except CaptureCancelled:
            latencies.append(time.perf_counter() - set_at[0])
        finally:
            timer.cancel()
            timer.join()
    return {"model": name, "batch": batch, "run_s": whole, "cancelled": len(latencies), "repeats": repeats,
            "median_ms": statistics.median(latencies) * 1000 if latencies else float("nan"),
            "max_ms": max(latencies) * 1000 if latencies else float("nan")}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    r = measure(args.model, args.batch, args.repeats)
    print(f"{r['model']} batch {r['batch']} (a run takes {r['run_s']:.1f} s): cancel latency median "
          f"{r['median_ms']:.0f} ms, max {r['max_ms']:.0f} ms over {r['cancelled']} cancelled runs")
    return r


if __name__ == "__main__":
    main()
