"""``make bench``: one table of gradexplorer's figures.

    python -m benchmarks [--quick]

Rows: capture overhead per mode and model (ratio to a bare forward + backward, median of
repeats, beside its peers in the same run, with the peak resident memory of each in a fresh
process, and the statistics kernel's first-use compile time), the cost of each hooked module
call (``benchmarks/call_overhead.py``: microseconds above a bare pass, beside a bare hook
pair), the UI thread's longest stall during a run (when
``benchmarks/ui_stall.py`` exists), module tree build time for the largest torchvision
net (and its Qt model, offscreen), memory estimate vs actual, cancel latency, the redraw
time when the user switches layer, channel or sample (``benchmarks/redraw.py``), the soak's
memory growth (``scripts/soak.py`` in a subprocess), and the watch's overhead on a resnet18
training step and under FSDP2 on 2 gloo ranks (``benchmarks/watch_overhead_fsdp.py``). Figures only: nothing here
asserts a time. ``--quick`` uses fewer repeats, smaller inputs and a shorter soak.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


class Table:
    def __init__(self):
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, what: str, case: str, figure: str, target: str = "") -> None:
        self.rows.append((what, case, figure, target))
        print(f"  {what}: {case}: {figure}", file=sys.stderr, flush=True)

    def print(self) -> None:
        widths = [max(len(r[i]) for r in [*self.rows, self.header]) for i in range(4)]
        line = "  ".join("-" * w for w in widths)
        print(line)
        print("  ".join(h.ljust(w) for h, w in zip(self.header, widths)))
        print(line)
        for r in self.rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        print(line)

    header = ("measure", "case", "figure", "target")


def _guard(table: Table, what: str, fn) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - one broken row must not lose the others
        table.add(what, "error", f"{type(exc).__name__}: {str(exc)[:80]}")


def overhead(table: Table, quick: bool) -> None:
    from benchmarks.capture_overhead import KINDS, TARGETS, compile_seconds, measure, peak_rss_mib

    compiled = compile_seconds()
    table.add("statistics kernel first use (numba)", "fresh process",
              f"{compiled['cold']:.1f} s compiling, {compiled['cached']:.2f} s from the disk cache"
              if {"cold", "cached"} <= set(compiled) else "numba missing: torch operations")
    specs = [("resnet50", 8), ("vit_b_16", 4), ("efficientnet_b0", 8)]
    for name, batch in specs:
        r = measure(name, 2 if quick else batch, 2 if quick else 5)
        mem = {} if quick else {k: peak_rss_mib(name, r["batch"], k) for k in KINDS if k not in r["missing"]}
        case = f"{name} batch {r['batch']} ({r['layers']} leaves), bare {r['bare_s']:.2f} s"
        for k in KINDS:
            if k == "bare" or k in r["missing"]:
                continue
            peak = f", peak RSS {mem[k]:,.0f} MiB (bare {mem['bare']:,.0f})" if mem.get(k) else ""
            table.add(f"capture overhead: {k}", case, f"{r[k + '_x']:.2f}x{peak}",
                      f"<= {TARGETS[k]}x" if k in TARGETS else "peer")
        for k in r["missing"]:
            table.add(f"capture overhead: {k}", case, "not installed (pip install gradexplorer[bench])")


def call_overhead(table: Table, quick: bool) -> None:
    from benchmarks.call_overhead import KINDS, TARGETS, measure

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the figure is one thread's (the statistics' small batches are serial)
    try:
        for spec in ("mlp:4", "resnet50:1"):
            r = measure(spec, 10 if quick else 30, KINDS)
            floor = r["per_call_us"]["hook_pair"]
            case = f"{'200-leaf MLP, batch 4' if spec == 'mlp:4' else 'resnet50, batch 1'}, one thread, CPU time"
            for k in KINDS:
                us = r["per_call_us"][k]
                ratio = f" ({us / floor:.1f}x the hook pair)" if floor > 0 and k != "hook_pair" else ""
                table.add(f"per hooked call: {k}", case, f"{us:.1f} us above the bare pass{ratio}",
                          f"<= {TARGETS[k]:.0f}x hook pair" if k in TARGETS else "")
    finally:
        torch.set_num_threads(threads)


def ui_stall(table: Table, quick: bool) -> None:
    try:
        from benchmarks import ui_stall as ui
    except ImportError:
        table.add("UI longest stall during a run", "-", "n/a (benchmarks/ui_stall.py not present)")
        return
    result = ui.measure(quick=quick) if "quick" in ui.measure.__code__.co_varnames else ui.measure()
    if isinstance(result, dict):
        for case, figure in result.items():
            table.add("UI longest stall during a run", str(case),
                      f"{figure:.0f} ms" if isinstance(figure, (int, float)) else str(figure), "no visible pause")
    else:
        table.add("UI longest stall during a run", "-", f"{result:.0f} ms", "no visible pause")


def tree_build(table: Table, quick: bool) -> None:
    from benchmarks.tree_build import measure_all, measure_qt

    r = measure_all(1 if quick else 5)
    name, n, t = r["largest"]
    table.add("module tree build", f"largest: {name} ({n} modules)", f"{t * 1000:.1f} ms",
              "no visible pause")
    table.add("module tree build", f"all {r['models']} torchvision models", f"{r['total_s'] * 1000:.0f} ms")
    q = measure_qt(name)
    if q is None:
        table.add("Qt tree model", name, "n/a (gradexplorer_app.window.module_tree_view not available)")
    else:
        table.add("Qt tree model", f"{name}: construction + first full expansion",
                  f"{q['model_s'] * 1000:.0f} + {q['expand_s'] * 1000:.0f} ms", "no visible pause")


def memory(table: Table, quick: bool) -> None:
    from benchmarks.memory_estimate import measure
    from gradexplorer.capturing.memory_estimate import format_bytes

    for r in measure(quick):
        table.add("memory estimate vs actual", f"{r['model']} {r['shape']} {r['mode']}",
                  f"{format_bytes(r['estimate'])} vs {format_bytes(r['actual'])} ({r['error']:+.1%})", "+-15%")


def cancel(table: Table, quick: bool) -> None:
    from benchmarks.cancel_latency import measure

    r = measure("resnet50", 8, 4 if quick else 10, size=112 if quick else 224)
    table.add("cancel latency", f"resnet50 batch 8{' at 112 px' if quick else ''} (run {r['run_s']:.1f} s)",
              f"median {r['median_ms']:.0f} ms, max {r['max_ms']:.0f} ms ({r['cancelled']}/{r['repeats']} cancelled)",
              "< 1 s")


def redraw(table: Table, quick: bool) -> None:
    from benchmarks.redraw import measure

    r = measure(quick)
    table.add("redraw on switch", f"{r['model']} batch {r['batch']}, {r['leaves']} leaves: capture shown",
              f"{r['arrive_ms']:.0f} ms", "no visible pause")
    for row in r["rows"]:
        figure = f"median {row['median_ms']:.1f} ms, max {row['max_ms']:.1f} ms"
        if row["shown"] is None:  # the forced paint with no switch, which every figure above includes
            table.add("redraw on switch", f"{row['kind']}, {row['view']}: {row['case']}", figure)
        else:
            table.add("redraw on switch", f"{row['kind']}, {row['view']}: {row['case']}",
                      f"{figure} ({row['shown']}/{row['switches']} shown)", "no visible pause")


def soak(table: Table, quick: bool) -> None:
    captures = 60 if quick else 100
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "soak.py"), "--captures", str(captures), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=3600)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for f in figures:
        table.add("soak", f"{f['runs']} {f['kind']} captures in one process",
                  f"RSS {f['growth_pct']:+.1f}% after warm-up, hooks left {f['hooks_left']}, threads "
                  f"{f['threads_before']}->{f['threads_after']}, fds {f['fds_before']}->{f['fds_after']}",
                  "< 5%, 0 left")


def watch_overhead(table: Table, quick: bool) -> None:
    from benchmarks.watch_overhead import measure

    size = 112 if quick else 224
    for r in measure(size=size, batch=16, quick=quick):
        target = {"watch every 1, all layers": "<= 1.3x", "watch every 10, all layers": "<= 1.05x",
                  "watch every 100, all layers": "<= 1.01x"}.get(r["config"], "")
        table.add("watch overhead", f"resnet18 train batch 16 at {size} px, CPU: {r['config']}",
                  f"{r['ratio']:.3f}x ({r['ms']:.0f} vs {r['bare_ms']:.0f} ms/step, {r['steps']} steps)", target)
    _guard(table, "watch overhead under FSDP2", lambda: watch_overhead_fsdp(table, quick))


def watch_overhead_fsdp(table: Table, quick: bool) -> None:
    from benchmarks.watch_overhead_fsdp import measure

    r = measure(steps=10 if quick else 20, repeats=2 if quick else 3)
    bare = r["figures"]["unwatched"]["ms"]
    for config in ("every 1", "every 10"):
        f = r["figures"][config]
        table.add("watch overhead", f"FSDP2 on 2 gloo ranks, MLP 4 x Linear({r['width']}), CPU: watch {config}",
                  f"{f['ratio']:.2f}x ({f['ms']:.1f} vs {bare:.1f} ms/step, {r['steps']} steps)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, smaller inputs, shorter soak")
    ap.add_argument("--only", default="",
                    help="comma-separated: overhead,calls,ui,tree,memory,cancel,redraw,soak,watch")
    args = ap.parse_args(argv)
    parts = {"overhead": overhead, "calls": call_overhead, "ui": ui_stall, "tree": tree_build, "memory": memory,
             "cancel": cancel, "redraw": redraw, "soak": soak, "watch": watch_overhead}
    chosen = [p for p in args.only.split(",") if p] or list(parts)
    t0 = time.perf_counter()
    print(f"gradexplorer benchmarks: torch {torch.__version__}, {torch.get_num_threads()} CPU threads"
          f"{', quick' if args.quick else ''}", flush=True)
    table = Table()
    for key in chosen:
        _guard(table, key, lambda: parts[key](table, args.quick))
    table.print()
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
