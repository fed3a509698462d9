"""Capture every torchvision classification model and check it against plain autograd.

    .venv/bin/python scripts/sweep_models.py [--only resnet18,vit_b_16] [--skip-over 300]

For each model (random init, eval mode, batch 2 at its default input size): capture every
leaf module in full mode, compute the same gradients with the independent reference in
tests/ground_truth.py, and print one line: layers captured, module calls, the maximum
relative error over every activation, output/input gradient and parameter gradient, and
the capture time. Not part of CI (it takes a long while on a CPU); the summary goes in
the closing note of the issue that changes capture.
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

from core.capture import capture  # noqa: E402
from core.models import load_model  # noqa: E402
from core.selection import leaf_names  # noqa: E402
from tests.ground_truth import compare, reference  # noqa: E402


def classification_models() -> list[str]:
    return sorted(torchvision.models.list_models(module=torchvision.models))


def sweep_one(name: str, batch: int = 2) -> dict:
    torch.manual_seed(0)
    loaded = load_model(name)
    model = loaded.module
    shape = loaded.input_shape or (3, 224, 224)
    x = torch.randn(batch, *shape)
    names = leaf_names(model)
    t0 = time.perf_counter()
    cap = capture(model, x, layers=names)
    seconds = time.perf_counter() - t0
    calls = sum(len(cap[n].calls) for n in cap)
    del cap
    gc.collect()
    # Captured again after the reference's run: compares the second capture (no copies of
    # outputs known to stay unmodified) as well as the reference.
    ref = reference(model, x, names)
    cap = capture(model, x, layers=names)
    err = compare(cap, ref, names)
    return {"model": name, "layers": len(names), "calls": calls, "err": err, "seconds": seconds,
            "input": "x".join(map(str, (batch, *shape)))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--skip-over", type=float, default=0.0,
                    help="skip models with more than this many million parameters (0: none)")
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else classification_models()
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {len(names)} models, batch {args.batch}")
    print(f"{'model':<28} {'input':<16} {'layers':>6} {'calls':>6} {'max rel err':>12} {'capture s':>9}")
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
            r = sweep_one(name, args.batch)
        except Exception as exc:  # noqa: BLE001 - report and go on
            failed.append(name)
            print(f"{name:<28} FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", flush=True)
            traceback.print_exc(file=sys.stderr)
            continue
        worst = max(worst, r["err"])
        ok += 1
        print(f"{r['model']:<28} {r['input']:<16} {r['layers']:>6} {r['calls']:>6} {r['err']:>12.2e} {r['seconds']:>9.2f}",
              flush=True)
        gc.collect()
    print(f"summary: {ok} models captured, worst max relative error {worst:.2e}, "
          f"{len(failed)} failed {failed}, {len(skipped)} skipped {skipped}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
