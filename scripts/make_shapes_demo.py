"""Train the ``demo:shapes`` CNN and write the files gradexplorer ships for it.

Run from the repository root (about 5 minutes on one CPU core, no GPU, no network)::

    .venv/bin/python scripts/make_shapes_demo.py

Writes
    resources/demo_shapes/shapes_cnn.pt          state_dict of ``gradexplorer.models.demos.ShapesCNN`` (float32)
    resources/demo_shapes/samples/<class>_<k>.png   2 sample pictures per class, 64x64
    resources/demo_shapes/samples/labels.json    file name -> class name

Deterministic: fixed seeds, ``torch.use_deterministic_algorithms(True)`` and one
thread (a fixed count keeps reductions in the same order; one also keeps the run fast on
a busy machine, where two threads fighting for cores can be several times slower), so
the same machine rebuilds the same weights. Every epoch sees fresh pictures from
:mod:`gradexplorer.models.shape_pictures`. Seeds used here: training ``TRAIN_SEED + epoch``, validation
``VAL_SEED``, samples ``SAMPLES_SEED``. Tests draw fresh pictures from other seeds (see
tests/core/test_demos.py).

The demo promises that Grad-CAM at ``SHAPES_CAM_LAYER`` points *inside* the shape. Plain
cross-entropy does not quite get there: this network then puts its class evidence on the
shape's outline (for circles, the smooth edge is the evidence), and the CAM's peak lands
strictly inside the shape for only about 85-89% of pictures. So training adds a small
localisation term (weight ``CAM_INSIDE_WEIGHT``), possible because the generator knows
each shape's mask: after global average pooling the top class's Grad-CAM at the block is
its per-location logit map, and the term is ``-log`` of the share of that map's spatial
softmax that falls on the shape's cells. It leaves the architecture and the checkpoint
format alone; the CAM the app shows is still computed the ordinary way from captured
activations and gradients.
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

from gradexplorer.analysis.gradcam import grad_cam
from gradexplorer.capturing.capture import capture
from gradexplorer.models import demos, shape_pictures as shapes

TRAIN_SEED = 1000
VAL_SEED = 2
SAMPLES_SEED = 3
EPOCHS = 10
PER_EPOCH = 8000
VAL_SIZE = 2000
BATCH = 64
LR = 4e-3
CAM_INSIDE_WEIGHT = 0.1
SAMPLES_PER_CLASS = 2
MAX_CHECKPOINT_BYTES = 1_000_000


def _set_determinism() -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    # A fixed thread count keeps reductions in the same order from run to run.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def _check_normalisation(images: torch.Tensor) -> None:
    mean = images.mean(dim=(0, 2, 3))
    std = images.permute(1, 0, 2, 3).reshape(3, -1).std(dim=1)
    print(f"data mean {mean.numpy().round(3)} std {std.numpy().round(3)} "
          f"(constants {shapes.MEAN} / {shapes.STD})")
    if (mean - torch.tensor(shapes.MEAN)).abs().max() > 0.02 or (std - torch.tensor(shapes.STD)).abs().max() > 0.02:
        raise SystemExit("gradexplorer.models.shape_pictures.MEAN/STD no longer match the generator: update them")


@torch.no_grad()
def _accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    predictions = torch.cat([model(shapes.normalize(x)).argmax(1) for x in images.split(256)])
    return (predictions == labels).float().mean().item()


def _cam_hit_rates(model: torch.nn.Module, images: torch.Tensor, masks: torch.Tensor) -> tuple[float, float]:
    """Fractions of pictures whose Grad-CAM peak (from a capture, as the app computes it)
    lies on the shape, and on the shape dilated by 1 px."""
    layer = demos.SHAPES_CAM_LAYER
    cap = capture(model, shapes.normalize(images), layers=[layer], target="top1")
    call = cap[layer].calls[0]
    cams = grad_cam(call.activation, call.grad_output, out_size=tuple(images.shape[-2:]), layer=layer)
    peaks = cams.reshape(len(cams), -1).argmax(1)[:, None]
    dilated = F.max_pool2d(masks.float()[:, None], 3, stride=1, padding=1)[:, 0] > 0
    strict = masks.reshape(len(cams), -1).gather(1, peaks).float().mean().item()
    near = dilated.reshape(len(cams), -1).gather(1, peaks).float().mean().item()
    return strict, near


def _cam_inside_loss(features: torch.Tensor, model: demos.ShapesCNN, labels: torch.Tensor,
                     masks: torch.Tensor) -> torch.Tensor:
    """``-log`` of the share of the true class's spatial evidence that lies on the shape.

    With global average pooling and a linear classifier, class ``k``'s evidence at each
    cell of ``features`` is ``classifier.weight[k] . features[:, :, y, x]`` (its Grad-CAM
    before the ReLU and the scaling). Cells count by the fraction of their pixels on the
    shape.
    """
    weights = model.classifier.weight[labels]
    evidence = torch.einsum("bchw,bc->bhw", features, weights).flatten(1)
    cell = masks.shape[-1] // features.shape[-1]
    on_shape = F.avg_pool2d(masks.float()[:, None], cell).flatten(1)
    inside = torch.logsumexp(evidence + on_shape.clamp_min(1e-6).log(), dim=1)
    return (torch.logsumexp(evidence, dim=1) - inside).mean()


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
        train_x, train_y, train_masks = shapes.make_dataset(PER_EPOCH, TRAIN_SEED + epoch)
        order = torch.randperm(PER_EPOCH, generator=generator)
        model.train()
        correct = seen = 0
        for step in range(steps_per_epoch):
            idx = order[step * BATCH:(step + 1) * BATCH]
            features = model.features(shapes.normalize(train_x[idx]))
            logits = model.classifier(model.flatten(model.pool(features)))
            loss = F.cross_entropy(logits, train_y[idx])
            inside = _cam_inside_loss(features, model, train_y[idx], train_masks[idx])
            loss = loss + CAM_INSIDE_WEIGHT * inside
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
    strict, near = _cam_hit_rates(model, val_x[:500], val_masks[:500])
    print(f"final: train acc {train_acc:.4f} (first {VAL_SIZE} of epoch 1)  val acc {val_acc:.4f}  "
          f"Grad-CAM peak on shape (val, 500) {strict:.3f}, within 1 px {near:.3f}")

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
