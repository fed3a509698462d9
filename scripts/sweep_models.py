"""Capture every torchvision classification model and check it against plain autograd.

    .venv/bin/python scripts/sweep_models.py [--only resnet18,vit_b_16] [--skip-over 300]

For each model (random init, eval mode, batch 2 at its default input size): capture every
leaf module, compute the same gradients with the independent reference in
tests/ground_truth.py, and print one line: layers captured, module calls, the maximum
relative error over every activation, output/input gradient and parameter gradient, and
the time of a full capture of every leaf (statistics-only where a full one would not fit
in memory). Big nets are compared in groups of layers that fit in memory (a full capture
of every leaf of efficientnet_b6 at 528 px, plus its reference, needs over 24 GiB). Not part of
CI (it takes a long while on a CPU); run it after any change to capture and keep its summary with that change.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import traceback
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.module_tree import ModuleTree
from gradexplorer.capturing.selection import leaf_names
from gradexplorer.models import load_model
from tests.ground_truth import compare, reference


def classification_models() -> list[str]:
    return sorted(torchvision.models.list_models(module=torchvision.models))


GROUP_BYTES = 1 << 30  # activations of one comparison group (held ~5 times over)


def _groups(tree, names: list[str]) -> list[list[str]]:
    groups, current, size = [], [], 0
    for n in names:
        b = tree[n].output_bytes
        if current and size + b > GROUP_BYTES:
            groups.append(current)
            current, size = [], 0
        current.append(n)
        size += b
    if current:
        groups.append(current)
    return groups


def sweep_one(name: str, batch: int = 2, max_size: int = 0) -> dict:
    torch.manual_seed(0)
    loaded = load_model(name)
    model = loaded.module
    shape = loaded.input_shape or (3, 224, 224)
    if max_size and shape[-1] > max_size:
        shape = (*shape[:-2], max_size, max_size)
    x = torch.randn(batch, *shape)
    names = leaf_names(model)
    tree = ModuleTree.build(model).probe(model, x)
    groups = _groups(tree, names)
    mode = "full" if len(groups) == 1 else "stats"
    t0 = time.perf_counter()
    cap = capture(model, x, layers=names, mode=mode)
    seconds = time.perf_counter() - t0
    calls = sum(len(cap[n].calls) for n in cap)
    del cap
    err = 0.0
    for group in groups:
        gc.collect()
        ref = reference(model, x, group)
        cap = capture(model, x, layers=group)
        err = max(err, compare(cap, ref, group))
        del ref, cap
    return {"model": name, "layers": len(names), "calls": calls, "err": err, "seconds": seconds,
            "mode": mode, "groups": len(groups), "input": "x".join(map(str, (batch, *shape)))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--skip-over", type=float, default=0.0,
                    help="skip models with more than this many million parameters (0: none)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--start-from", default="", help="skip models sorted before this name")
    ap.add_argument("--max-size", type=int, default=0,
                    help="cap the input's height and width (0: each model's default size)")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else classification_models()
    if args.start_from:
        names = [n for n in names if n >= args.start_from]
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {len(names)} models, batch {args.batch}")
    print(f"{'model':<28} {'input':<16} {'layers':>6} {'calls':>6} {'max rel err':>12} {'capture s':>9} mode")
    worst, ok, failed, skipped = 0.0, 0, [], []
    for name in names:
        if args.skip_over:
            with torch.device("meta"):
                try:
                    n_params = sum(p.numel() for p in torchvision.models.get_model(name).parameters()) / 1e6
                except Exception:  # noqa: BLE001 - some builders cannot run on meta
                    n_params = 0
            if n_params > args.skip_over:
                skipped.append(name)
                print(f"{name:<28} skipped ({n_params:.0f} M parameters)", flush=True)
                continue
        try:
            r = sweep_one(name, args.batch, args.max_size)
        except Exception as exc:  # noqa: BLE001 - report and go on
            failed.append(name)
            print(f"{name:<28} FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", flush=True)
            traceback.print_exc(file=sys.stderr)
            continue
        worst = max(worst, r["err"])
        ok += 1
        print(f"{r['model']:<28} {r['input']:<16} {r['layers']:>6} {r['calls']:>6} {r['err']:>12.2e} "
              f"{r['seconds']:>9.2f} {r['mode']}"
              + (f" ({r['groups']} groups compared)" if r["groups"] > 1 else ""),
              flush=True)
        gc.collect()
    print(f"summary: {ok} models captured, worst max relative error {worst:.2e}, "
          f"{len(failed)} failed {failed}, {len(skipped)} skipped {skipped}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
