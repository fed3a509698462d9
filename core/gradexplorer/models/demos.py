"""Built-in demo models that work offline: ``demo:seed-mlp`` and ``demo:shapes``.

``demo:shapes`` is what gradexplorer opens on first launch: a small CNN trained on
the procedural pictures of :mod:`gradexplorer.models.shape_pictures`, shipped with its weights and a few
sample pictures under ``resources/demo_shapes`` (made by
``scripts/make_shapes_demo.py``; a wheel ships them inside the package, as ``gradexplorer/resources``).
It is built to exercise the cases that break naive gradient tools: in-place ReLUs, a
residual ``+=``, and a ReLU module called twice per forward.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from PIL import Image
from torch import nn

from gradexplorer.base.errors import BatchError, GradExplorerError, ModelLoadError
from gradexplorer.capturing.inputs import Batch
from gradexplorer.models import shape_pictures as shapes
from gradexplorer.models.loaded_model import LoadedModel


def _resources_dir() -> Path:
    """The folder of the data shipped with gradexplorer (the repository's ``resources/``).

    A wheel installs it inside the package, as ``gradexplorer/resources`` (setup.py); a
    checkout, installed editable or not, reads the repository's top-level folder.
    """
    package = Path(__file__).resolve().parents[1]
    shipped = package / "resources"
    if shipped.is_dir():
        return shipped
    return package.parents[1] / "resources"


RESOURCES = _resources_dir()
SHAPES_DIR = RESOURCES / "demo_shapes"
SHAPES_CHECKPOINT = SHAPES_DIR / "shapes_cnn.pt"
SHAPES_SAMPLES = SHAPES_DIR / "samples"
SHAPES_INPUT_SIZE = 64
# The layer whose Grad-CAM the app shows by default: the residual block, 32x32 at 64 px
# (2-px cells, fine enough that the CAM's peak lands inside the drawn shape).
SHAPES_CAM_LAYER = "features.5"
SHAPES_CAM_GRID = SHAPES_INPUT_SIZE // 2

# What the window opens (and runs) on when no model is given: `gradexplorer` alone.
WINDOW_DEMO = "demo:shapes"

SEED_MLP_SEED = 0
SEED_MLP_BATCH_SEED = 1

_DEMOS: dict[str, str] = {
    "shapes": "small CNN that tells 6 drawn shapes apart (64x64 RGB); Grad-CAM shows where it looks",
    "seed-mlp": "the tutorial's 10-5-3-1 MLP with fixed random weights, on a random (4, 10) batch",
}


class SeedMLP(nn.Module):
    """The tutorial's MLP: ``Linear(10, 5) -> ReLU -> Linear(5, 3) -> ReLU -> Linear(3, 1)``.

    Parameters
    ----------
    seed : int
        Seed of the weight initialisation; the global torch RNG is left untouched.
    """

    def __init__(self, seed: int = SEED_MLP_SEED) -> None:
        super().__init__()
        # fork_rng keeps the caller's random stream where it was.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.fc1 = nn.Linear(10, 5)
            self.relu1 = nn.ReLU()
            self.fc2 = nn.Linear(5, 3)
            self.relu2 = nn.ReLU()
            self.fc3 = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x)))))


class ConvBNReLU(nn.Module):
    """``conv3x3 -> BatchNorm -> ReLU(inplace=True)``, spatial size kept."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class ResidualBlock(nn.Module):
    """A torchvision-style ``BasicBlock``: two conv3x3+BN, ``out += identity``, one shared ReLU.

    ``relu`` is in place and runs twice per forward, like ``BasicBlock.relu``.

    Parameters
    ----------
    channels : int
        Input and output channels.
    dilation : int
        Dilation (and padding) of both convolutions: the spatial size is kept either way,
        a larger dilation widens the receptive field at no extra cost.
    """

    def __init__(self, channels: int, dilation: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=dilation, dilation=dilation, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=dilation, dilation=dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ShapesCNN(nn.Module):
    """Small CNN for the 6 shape classes, Grad-CAM friendly.

    ``features`` for 64x64 inputs: ``0`` ConvBNReLU(3, 16) at 64x64, ``1`` max-pool to
    32x32, ``2`` ConvBNReLU(16, 32), ``3`` a stride-1 3x3 max-pool (keeps 32x32), ``4``
    ConvBNReLU(32, 32) and ``5`` ResidualBlock(32, dilation 2), all at 32x32. Then ``pool``
    (global average), ``flatten``, ``classifier``.

    Only one pooling halves the picture, so the Grad-CAM layer ``features.5`` has 2-px
    cells; the dilated block still sees 32 px, more than the largest shape.

    Parameters
    ----------
    num_classes : int
        Number of logits.
    """

    def __init__(self, num_classes: int = len(shapes.SHAPE_CLASSES)) -> None:
        super().__init__()
        self.features = nn.Sequential(
            ConvBNReLU(3, 16),
            nn.MaxPool2d(2),
            ConvBNReLU(16, 32),
            nn.MaxPool2d(3, stride=1, padding=1),
            ConvBNReLU(32, 32),
            ResidualBlock(32, dilation=2),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.classifier = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.flatten(self.pool(self.features(x))))


def shapes_preprocess(image: Image.Image) -> torch.Tensor:
    """Turn one picture into the ``(3, 64, 64)`` input of ``demo:shapes``.

    Parameters
    ----------
    image : PIL.Image.Image
        Any picture; converted to RGB and resized (bilinear) to 64x64 when needed.

    Returns
    -------
    torch.Tensor
        ``(3, 64, 64)`` float32, normalised with ``gradexplorer.models.shape_pictures.MEAN`` and ``STD``.
    """
    image = image.convert("RGB")
    if image.size != (SHAPES_INPUT_SIZE, SHAPES_INPUT_SIZE):
        image = image.resize((SHAPES_INPUT_SIZE, SHAPES_INPUT_SIZE), Image.Resampling.BILINEAR)
    return shapes.normalize(shapes.to_tensor(image))


SHAPES_PREPROCESS_DESCRIPTION = (
    f"RGB, resize to {SHAPES_INPUT_SIZE}x{SHAPES_INPUT_SIZE} (bilinear), scale to [0, 1], "
    f"normalise with mean {shapes.MEAN} and std {shapes.STD}"
)


def _demo_key(name: str) -> str:
    key = name.strip()
    if key.startswith("demo:"):
        key = key[len("demo:"):]
    if key not in _DEMOS:
        known = ", ".join(f"demo:{k}" for k in _DEMOS)
        raise GradExplorerError(f"There is no demo called '{name}'.", f"Choose one of: {known}.")
    return key


def list_demos() -> list[tuple[str, str]]:
    """List the built-in demos.

    Returns
    -------
    list of (str, str)
        ``(spec, description)`` pairs, e.g. ``("demo:shapes", "small CNN ...")``; the
        first is the one gradexplorer opens by default.
    """
    return [(f"demo:{key}", text) for key, text in _DEMOS.items()]


def load_demo(name: str) -> LoadedModel:
    """Build a demo model, in eval mode, with its weights.

    Parameters
    ----------
    name : str
        ``"shapes"`` or ``"seed-mlp"``, with or without the ``"demo:"`` prefix.

    Returns
    -------
    LoadedModel
        For ``shapes``: the trained ``ShapesCNN``, its class names, preprocess and input
        shape ``(3, 64, 64)``. For ``seed-mlp``: ``SeedMLP`` with input shape ``(10,)``.

    Raises
    ------
    GradExplorerError
        When ``name`` is not a demo.
    ModelLoadError
        When the shipped shapes checkpoint is missing or does not fit the model.
    """
    key = _demo_key(name)
    if key == "seed-mlp":
        return LoadedModel(
            module=SeedMLP().eval(),
            spec="demo:seed-mlp",
            name="seed MLP (demo)",
            weights=f"random init, seed {SEED_MLP_SEED}",
            input_shape=(10,),
            task="demo",
        )
    return LoadedModel(
        module=_load_shapes_cnn(),
        spec="demo:shapes",
        name="shapes CNN (demo)",
        weights=f"file:{SHAPES_CHECKPOINT}",
        categories=list(shapes.SHAPE_CLASSES),
        preprocess=shapes_preprocess,
        preprocess_description=SHAPES_PREPROCESS_DESCRIPTION,
        input_shape=(3, SHAPES_INPUT_SIZE, SHAPES_INPUT_SIZE),
        task="demo",
        notes=[f"Grad-CAM layer: {SHAPES_CAM_LAYER} ({SHAPES_CAM_GRID}x{SHAPES_CAM_GRID})"],
    )


def _load_shapes_cnn() -> ShapesCNN:
    fix = "Reinstall gradexplorer, or rebuild it with: .venv/bin/python scripts/make_shapes_demo.py"
    if not SHAPES_CHECKPOINT.is_file():
        raise ModelLoadError(f"The shapes demo's weights are missing ({SHAPES_CHECKPOINT}).", fix)
    model = ShapesCNN()
    try:
        state = torch.load(SHAPES_CHECKPOINT, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except Exception as exc:  # a damaged file surfaces as many different exception types
        raise ModelLoadError(
            f"The shapes demo's weights cannot be loaded ({SHAPES_CHECKPOINT}): {exc}", fix
        ) from exc
    return model.eval()


def demo_batch(name: str) -> Batch:
    """The demo's own inputs.

    Parameters
    ----------
    name : str
        ``"shapes"`` or ``"seed-mlp"``, with or without the ``"demo:"`` prefix.

    Returns
    -------
    Batch
        For ``shapes``: the shipped sample pictures (sorted by file name), preprocessed,
        with their labels and the PIL originals. For ``seed-mlp``: a fixed random
        ``(4, 10)`` batch without labels.

    Raises
    ------
    GradExplorerError
        When ``name`` is not a demo.
    BatchError
        When the shipped samples are missing or unreadable.
    """
    key = _demo_key(name)
    if key == "seed-mlp":
        generator = torch.Generator().manual_seed(SEED_MLP_BATCH_SEED)
        tensor = torch.randn(4, 10, generator=generator)
        return Batch(
            tensor=tensor,
            labels=None,
            names=[f"random[{i}]" for i in range(4)],
            source=f"random 4x10 (seed {SEED_MLP_BATCH_SEED})",
            preprocessing="none",
        )

    fix = "Reinstall gradexplorer, or rebuild it with: .venv/bin/python scripts/make_shapes_demo.py"
    labels_file = SHAPES_SAMPLES / "labels.json"
    try:
        labels_by_file: dict[str, str] = json.loads(labels_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BatchError(f"The shapes demo's sample labels cannot be read ({labels_file}): {exc}", fix) from exc
    names = sorted(labels_by_file)
    images = []
    for file_name in names:
        try:
            with Image.open(SHAPES_SAMPLES / file_name) as picture:
                images.append(picture.convert("RGB"))
        except OSError as exc:
            raise BatchError(f"The shapes demo's sample '{file_name}' cannot be read: {exc}", fix) from exc
    labels = torch.tensor(
        [shapes.SHAPE_CLASSES.index(labels_by_file[n]) for n in names], dtype=torch.int64
    )
    return Batch(
        tensor=torch.stack([shapes_preprocess(im) for im in images]),
        labels=labels,
        names=names,
        source=f"{len(names)} demo samples",
        preprocessing=SHAPES_PREPROCESS_DESCRIPTION,
        images=images,
    )
