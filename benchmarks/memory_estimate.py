"""Memory estimate vs what captures really hold.

    python -m benchmarks.memory_estimate [--quick]

For each model: the estimate (``gradexplorer.capturing.memory_estimate.estimate_capture_memory``, from a
probe) and the measured bytes (``measure_capture_memory`` of the real capture) of a full
capture of every leaf layer with the input gradient, and of a statistics-only capture.
Target: the estimate within +-15% of what the capture holds.
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


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64x64 inputs")
    args = ap.parse_args(argv)
    rows = measure(args.quick)
    print(f"{'model':<20} {'input':<14} {'mode':<5} {'estimate':>10} {'actual':>10} {'error':>7}")
    for r in rows:
        print(f"{r['model']:<20} {r['shape']:<14} {r['mode']:<5} {format_bytes(r['estimate']):>10} "
              f"{format_bytes(r['actual']):>10} {r['error']:>+7.1%}")
    return rows


if __name__ == "__main__":
    main()
