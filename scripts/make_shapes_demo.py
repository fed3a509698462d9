"""Train the ``demo:shapes`` CNN and write the files gradexplorer ships for it.

Run from the repository root (about 2-3 minutes on 2 CPU cores, no GPU, no network)::

    .venv/bin/python scripts/make_shapes_demo.py

Writes
    resources/demo_shapes/shapes_cnn.pt          state_dict of ``core.demos.ShapesCNN`` (float32)
    resources/demo_shapes/samples/<class>_<k>.png   2 sample pictures per class, 64x64
    resources/demo_shapes/samples/labels.json    file name -> class name

Deterministic: fixed seeds, ``torch.use_deterministic_algorithms(True)`` and a fixed
thread count, so the same machine rebuilds the same weights. Every epoch sees fresh
pictures from :mod:`core.shapes`. Seeds used here: training ``TRAIN_SEED + epoch``,
validation ``VAL_SEED``, samples ``SAMPLES_SEED``. Tests draw fresh pictures from other
seeds (see tests/core/test_demos.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import demos, shapes  # noqa: E402
from core.gradcam import grad_cam  # noqa: E402

TRAIN_SEED = 1000
VAL_SEED = 2
SAMPLES_SEED = 3
EPOCHS = 10
PER_EPOCH = 8000
VAL_SIZE = 2000
BATCH = 64
LR = 4e-3
SAMPLES_PER_CLASS = 2
MAX_CHECKPOINT_BYTES = 1_000_000


def _set_determinism() -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    # A fixed thread count keeps reductions in the same order from run to run.
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)


def _check_normalisation(images: torch.Tensor) -> None:
    mean = images.mean(dim=(0, 2, 3))
    std = images.permute(1, 0, 2, 3).reshape(3, -1).std(dim=1)
    print(f"data mean {mean.numpy().round(3)} std {std.numpy().round(3)} "
          f"(constants {shapes.MEAN} / {shapes.STD})")
    if (mean - torch.tensor(shapes.MEAN)).abs().max() > 0.02 or (std - torch.tensor(shapes.STD)).abs().max() > 0.02:
        raise SystemExit("core.shapes.MEAN/STD no longer match the generator: update them")


@torch.no_grad()
def _accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    predictions = torch.cat([model(shapes.normalize(x)).argmax(1) for x in images.split(256)])
    return (predictions == labels).float().mean().item()


def _cam_hit_rate(model: torch.nn.Module, images: torch.Tensor, masks: torch.Tensor) -> float:
    """Fraction of pictures whose Grad-CAM peak lies on the shape (mask dilated by 1 px)."""
    model.eval()
    layer = model.get_submodule(demos.SHAPES_CAM_LAYER)
    kept = {}
    handle = layer.register_forward_hook(lambda m, i, o: kept.__setitem__("a", o))
    try:
        logits = model(shapes.normalize(images))
        top1 = logits.gather(1, logits.argmax(1, keepdim=True)).sum()
        (gradient,) = torch.autograd.grad(top1, kept["a"])
    finally:
        handle.remove()
    cams = grad_cam(kept["a"], gradient, out_size=images.shape[-2:])
    dilated = F.max_pool2d(masks.float()[:, None], 3, stride=1, padding=1)[:, 0] > 0
    peaks = cams.reshape(len(cams), -1).argmax(1)
    return dilated.reshape(len(cams), -1).gather(1, peaks[:, None]).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=demos.SHAPES_DIR,
                        help="where to write shapes_cnn.pt and samples/ (default: %(default)s)")
    out_dir = parser.parse_args().out
    _set_determinism()
    started = time.perf_counter()
    samples_dir = out_dir / "samples"
    samples_dir.mkdir(parents=True, exist_ok=True)

    val_x, val_y, val_masks = shapes.make_dataset(VAL_SIZE, VAL_SEED)
    _check_normalisation(val_x)

    model = demos.ShapesCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=1e-4)
    steps_per_epoch = PER_EPOCH // BATCH
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=LR, total_steps=EPOCHS * steps_per_epoch, pct_start=0.15
    )
    generator = torch.Generator().manual_seed(0)
    for epoch in range(EPOCHS):
        train_x, train_y, _ = shapes.make_dataset(PER_EPOCH, TRAIN_SEED + epoch)
        order = torch.randperm(PER_EPOCH, generator=generator)
        model.train()
        correct = seen = 0
        for step in range(steps_per_epoch):
            idx = order[step * BATCH:(step + 1) * BATCH]
            logits = model(shapes.normalize(train_x[idx]))
            loss = F.cross_entropy(logits, train_y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            correct += (logits.argmax(1) == train_y[idx]).sum().item()
            seen += len(idx)
        val_acc = _accuracy(model, val_x, val_y)
        print(f"epoch {epoch + 1:2d}/{EPOCHS}  train acc {correct / seen:.4f}  val acc {val_acc:.4f}  "
              f"({time.perf_counter() - started:.0f} s)", flush=True)

    model.eval()
    train_acc = _accuracy(model, *shapes.make_dataset(VAL_SIZE, TRAIN_SEED)[:2])
    val_acc = _accuracy(model, val_x, val_y)
    hit_rate = _cam_hit_rate(model, val_x[:500], val_masks[:500])
    print(f"final: train acc {train_acc:.4f} (first {VAL_SIZE} of epoch 1)  val acc {val_acc:.4f}  "
          f"Grad-CAM peak on shape (val, 500) {hit_rate:.3f}")

    state = {k: (v.float() if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    checkpoint = out_dir / demos.SHAPES_CHECKPOINT.name
    torch.save(state, checkpoint)
    size = checkpoint.stat().st_size
    digest = hashlib.sha256(checkpoint.read_bytes()).hexdigest()[:16]
    print(f"wrote {checkpoint} ({size} bytes, sha256 {digest}...)")
    if size >= MAX_CHECKPOINT_BYTES:
        raise SystemExit(f"checkpoint is {size} bytes, over the {MAX_CHECKPOINT_BYTES} byte budget")

    for old in samples_dir.glob("*.png"):
        os.remove(old)
    rng = np.random.default_rng(SAMPLES_SEED)
    labels: dict[str, str] = {}
    sample_tensors = []
    for label, name in enumerate(shapes.SHAPE_CLASSES):
        for k in range(1, SAMPLES_PER_CLASS + 1):
            image, _, _ = shapes.draw_sample(rng, label=label)
            file_name = f"{name}_{k}.png"
            image.save(samples_dir / file_name, optimize=True)
            labels[file_name] = name
            sample_tensors.append(demos.shapes_preprocess(image))
    (samples_dir / "labels.json").write_text(json.dumps(labels, indent=2) + "\n", encoding="utf-8")
    with torch.no_grad():
        predicted = model(torch.stack(sample_tensors)).argmax(1).tolist()
    right = sum(shapes.SHAPE_CLASSES[p] == labels[f] for p, f in zip(predicted, labels))
    print(f"wrote {len(labels)} samples to {samples_dir}; "
          f"{right}/{len(labels)} predicted right")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
