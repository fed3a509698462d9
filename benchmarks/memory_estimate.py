"""Memory estimate vs what captures really hold, and vs the peak of the process running them.

    python -m benchmarks.memory_estimate [--quick]
    python -m benchmarks.memory_estimate --peak [--models efficientnet_v2_l vit_l_16] [--threads 2]

For each model: the estimate (``gradexplorer.capturing.memory_estimate.estimate_capture_memory``, from a
probe) and the measured bytes (``measure_capture_memory`` of the real capture) of a full
capture of every leaf layer with the input gradient, and of a statistics-only capture.
Target: the estimate within +-15% of what the capture holds.

``--peak``: each model in a fresh process, as the window runs it (random weights, its
default batch of two samples, every leaf, statistics only): what the budget check compares
(``total + transient``) against the rise of the process's peak resident memory over the
run (Linux ``VmHWM``, reset before it); then the resident memory after the run, before and
after ``release_host_memory`` (what the window calls once a run is over), and after a
second run that replaces the first. Target: the estimate within +-25% of the peak's rise;
the second run adds nothing that stays.
"""

from __future__ import annotations

import argparse

import torch
import torchvision

from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.memory_estimate import estimate_capture_memory, format_bytes, measure_capture_memory
from gradexplorer.capturing.module_tree import ModuleTree


def _models(quick: bool):
    size = 64 if quick else 224
    seg = lambda: torchvision.models.segmentation.lraspp_mobilenet_v3_large(  # noqa: E731
        weights=None, weights_backbone=None, num_classes=21)
    return [
        ("resnet50", lambda: torchvision.models.resnet50(), (2 if quick else 8, 3, size, size), "top1"),
        ("efficientnet_b0", lambda: torchvision.models.efficientnet_b0(), (2, 3, size, size), "top1"),
        ("vit_b_16", lambda: torchvision.models.vit_b_16(image_size=size), (2, 3, size, size), "top1"),
        ("lraspp_mobilenet_v3", seg, (2, 3, size, size), "sum"),
    ]


def measure(quick: bool = False) -> list[dict]:
    rows = []
    for name, make, shape, target in _models(quick):
        torch.manual_seed(0)
        model = make().eval()
        x = torch.randn(shape)
        tree = ModuleTree.build(model).probe(model, x)
        leaves = tree.leaves()
        for mode in ("full", "stats"):
            est = estimate_capture_memory(tree, leaves, mode, x, True, model)
            cap = capture(model, x, mode=mode, input_grad=True, target=target)
            held = measure_capture_memory(cap)
            del cap
            rows.append({"model": name, "shape": "x".join(map(str, shape)), "mode": mode,
                         "estimate": est.total, "actual": held, "error": (est.total - held) / held,
                         "describe": est.describe()})
    return rows


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5": the peak resident size starts again from now
        f.write("5")


def peak_one(name: str) -> dict:
    """One model as the window runs it, statistics only, in this process (see the docstring)."""
    import gc

    from gradexplorer.base.devices import release_host_memory
    from gradexplorer.batches import load_batch
    from gradexplorer.models import load_model
    from gradexplorer.pipeline.job import default_batch_spec, probe_model

    loaded = load_model(name)
    spec = default_batch_spec(loaded)
    batch = load_batch(spec.sources(), loaded)
    tree = probe_model(loaded, batch.model_input).tree
    est = estimate_capture_memory(tree, tree.leaves(), "stats", batch.model_input, False, loaded.module)
    gc.collect()
    release_host_memory()
    before = _status("VmRSS")
    _reset_peak()
    cap = capture(loaded.module, batch.model_input, mode="stats")
    peak = _status("VmHWM") - before
    kept = _status("VmRSS") - before
    release_host_memory()
    after_one = _status("VmRSS") - before
    cap = capture(loaded.module, batch.model_input, mode="stats")  # the window's second run replaces the first
    del cap
    release_host_memory()
    after_two = _status("VmRSS") - before
    need = est.total + est.transient
    return {"model": name, "shape": spec.random, "estimate": need, "peak": peak, "error": (need - peak) / peak,
            "kept": kept, "after_one": after_one, "after_two": after_two}


def measure_peaks(models: list[str], threads: int) -> list[dict]:
    """``peak_one`` for each model in a fresh process (no memory of one model stays for the next)."""
    import json
    import os
    import subprocess
    import sys

    rows = []
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    for name in models:
        out = subprocess.run([sys.executable, "-m", "benchmarks.memory_estimate", "--peak-one", name,
                              "--threads", str(threads)], capture_output=True, text=True, check=True, env=env)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64x64 inputs")
    ap.add_argument("--peak", action="store_true", help="the estimate against the peak of the process (Linux)")
    ap.add_argument("--models", nargs="+", default=["efficientnet_v2_l", "vit_l_16"], help="with --peak")
    ap.add_argument("--threads", type=int, default=2, help="torch's threads, with --peak")
    ap.add_argument("--peak-one", metavar="MODEL", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peak_one:
        import json

        torch.set_num_threads(args.threads)
        print(json.dumps(peak_one(args.peak_one)))
        return []
    if args.peak:
        rows = measure_peaks(args.models, args.threads)
        print(f"{'model':<18} {'input':<14} {'estimate':>9} {'peak rise':>10} {'error':>7} {'kept':>9} "
              f"{'released':>9} {'2nd run':>9}")
        for r in rows:
            print(f"{r['model']:<18} {r['shape']:<14} {format_bytes(r['estimate']):>9} {format_bytes(r['peak']):>10} "
                  f"{r['error']:>+7.1%} {format_bytes(r['kept']):>9} {format_bytes(r['after_one']):>9} "
                  f"{format_bytes(r['after_two']):>9}")
        return rows
    rows = measure(args.quick)
    print(f"{'model':<20} {'input':<14} {'mode':<5} {'estimate':>10} {'actual':>10} {'error':>7}")
    for r in rows:
        print(f"{r['model']:<20} {r['shape']:<14} {r['mode']:<5} {format_bytes(r['estimate']):>10} "
              f"{format_bytes(r['actual']):>10} {r['error']:>+7.1%}")
    return rows


if __name__ == "__main__":
    main()
