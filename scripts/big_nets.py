"""Captures of large nets on the CPU, within 24 GiB of memory. Not part of CI.

    python scripts/big_nets.py [--models vit_l_16,efficientnet_b7,regnet_y_16gf]

For each model (random init, batch 1, at its pretrained weights' input size), in a fresh
subprocess so that the peak is its own: a statistics-only capture of every leaf layer,
then a full capture of a subset; prints the time, the peak resident memory of the process
(``ru_maxrss``), what the capture holds and what ``gradexplorer.capturing.memory_estimate`` predicted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: name -> (input side, layers of the full capture)
NETS = {
    "vit_l_16": (224, ["encoder.layers.encoder_layer_23.*", "encoder.ln"]),
    "efficientnet_b7": (600, ["features.7.*"]),
    "regnet_y_16gf": (224, ["trunk_output.block4.*"]),
}


def one(name: str) -> dict:
    import resource

    import torch
    import torchvision

    from gradexplorer.capturing.capture import capture
    from gradexplorer.capturing.memory_estimate import estimate_capture_memory, measure_capture_memory
    from gradexplorer.capturing.module_tree import ModuleTree
    from gradexplorer.capturing.selection import resolve_layers

    def peak() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    side, subset = NETS[name]
    torch.manual_seed(0)
    model = torchvision.models.get_model(name).eval()
    x = torch.randn(1, 3, side, side)
    t0 = time.perf_counter()
    tree = ModuleTree.build(model).probe(model, x)
    probe_s = time.perf_counter() - t0
    out = {"model": name, "input": f"1x3x{side}x{side}", "params": sum(p.numel() for p in model.parameters()),
           "leaves": len(tree.leaves()), "probe_s": probe_s, "runs": []}
    for mode, layers in (("stats", None), ("full", subset)):
        selected = resolve_layers(model, layers)
        est = estimate_capture_memory(tree, selected, mode, x, False, model)
        t0 = time.perf_counter()
        cap = capture(model, x, layers=selected, mode=mode, expected_calls=tree.expected_calls())
        seconds = time.perf_counter() - t0
        out["runs"].append({"mode": mode, "layers": len(selected), "seconds": seconds, "peak_rss": peak(),
                            "held": measure_capture_memory(cap), "estimate": est.total,
                            "transient_estimate": est.transient})
        del cap
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(NETS))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one)))
        return 0
    from gradexplorer.capturing.memory_estimate import format_bytes

    print(f"{'model':<16} {'input':<12} {'mode':<5} {'layers':>6} {'time':>7} {'peak RSS':>9} "
          f"{'held':>9} {'estimate':>9}")
    ok = True
    for name in args.models.split(","):
        done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True)
        if done.returncode != 0:
            ok = False
            reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode
            print(f"{name:<16} FAILED: {reason}")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        for run in r["runs"]:
            print(f"{r['model']:<16} {r['input']:<12} {run['mode']:<5} {run['layers']:>6} {run['seconds']:>6.1f}s "
                  f"{format_bytes(run['peak_rss']):>9} {format_bytes(run['held']):>9} "
                  f"{format_bytes(run['estimate']):>9}")
            ok &= run["peak_rss"] < 24 * 2**30
    print("peak RSS is the process's high-water mark (model, probe and both captures so far); limit 24 GiB")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
