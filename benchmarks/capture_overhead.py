"""Capture overhead: capture of every leaf layer vs a bare forward + backward.

    python -m benchmarks.capture_overhead [--models resnet50:8,vit_b_16:4] [--repeats 5]

Prints, per model, the median time of a bare forward + backward (the same
``torch.autograd.grad`` over the trainable parameters that capture runs), and the
median ratio to it of: gradexplorer statistics-only capture, full capture, and a naive
reference (a forward hook per leaf module computing each statistic separately on the
activation and, through a tensor hook, on its gradient: what a hand-written hook tool
does). Targets (issue 2): statistics-only <= 1.25x, full <= 1.5x. Random init, CPU,
eval mode, float32; the first run of each kind is a warm-up and is not counted.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torchvision

from core.capture import capture
from core.selection import leaf_names


def _params(model):
    return [p for p in model.parameters() if p.requires_grad]


def bare(model, x):
    out = model(x)
    torch.autograd.grad(out.max(dim=1).values.sum(), _params(model))


def naive(model, x):
    """A forward hook per leaf; every statistic computed separately, as in a tutorial."""
    records = []

    def stats(t):
        t = t.detach()
        return [t.numel(), t.min().item(), t.max().item(), t.mean().item(), t.std().item(),
                t.abs().mean().item(), t.norm().item(), (t == 0).float().mean().item(),
                torch.isnan(t).sum().item(), torch.isinf(t).sum().item(),
                torch.histc(t.float(), 64, t.min().item(), t.max().item())]

    def hook(module, inputs, output):
        if isinstance(output, torch.Tensor):
            records.append(stats(output))
            if output.requires_grad:
                output.register_hook(lambda g: records.append(stats(g)))

    names = set(leaf_names(model))
    handles = [m.register_forward_hook(hook) for n, m in model.named_modules() if n in names]
    try:
        bare(model, x)
    finally:
        for h in handles:
            h.remove()


def _median_seconds(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(name: str, batch: int, repeats: int) -> dict:
    torch.manual_seed(0)
    model = torchvision.models.get_model(name).eval()
    size = 224
    x = torch.randn(batch, 3, size, size)
    # Interleave the kinds so that drift in machine load hits them alike.
    kinds = {
        "bare": lambda: bare(model, x),
        "stats": lambda: capture(model, x, mode="stats"),
        "full": lambda: capture(model, x, mode="full"),
        "naive": lambda: naive(model, x),
    }
    times = {k: [] for k in kinds}
    for fn in kinds.values():
        fn()
    for _ in range(repeats):
        for k, fn in kinds.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "model": name, "batch": batch, "layers": len(leaf_names(model)),
        "bare_s": med["bare"], "stats_x": med["stats"] / med["bare"],
        "full_x": med["full"] / med["bare"], "naive_x": med["naive"] / med["bare"],
    }


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50:8,vit_b_16:4")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    print(f"{'model':<12} {'batch':>5} {'layers':>6} {'bare f+b':>9} {'stats-only':>10} {'full':>6} {'naive':>6}")
    rows = []
    for spec in args.models.split(","):
        name, _, b = spec.partition(":")
        r = measure(name, int(b or 1), args.repeats)
        rows.append(r)
        print(f"{r['model']:<12} {r['batch']:>5} {r['layers']:>6} {r['bare_s']:>8.2f}s "
              f"{r['stats_x']:>9.2f}x {r['full_x']:>5.2f}x {r['naive_x']:>5.2f}x", flush=True)
    print("targets: stats-only <= 1.25x, full <= 1.5x (median of repeats, ratio to bare forward+backward)")
    return rows


if __name__ == "__main__":
    main()
