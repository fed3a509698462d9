"""The preprocessing a model gets when it brings none: torchvision's classification recipe.

Images are read by ``gradexplorer.batches.images``; what turns one picture into the
tensor a model expects belongs to the model (torchvision weights carry their own
``transforms()``), so the fallback lives here, beside the models that use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: The fallback preprocessing (:func:`default_preprocess`) in words.
DEFAULT_PREPROCESS_DESCRIPTION = (
    "resize shorter side to 256 px, center crop 224×224, scale to [0, 1], "
    "normalise with ImageNet mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225)"
)


def default_preprocess() -> Callable[[Image.Image], torch.Tensor]:
    """The preprocess used for images when the model brings none.

    Resize the shorter side to 256 px (bilinear, antialiased), center crop 224×224,
    convert to a float tensor in [0, 1] and normalise with the ImageNet mean and
    standard deviation: the recipe of torchvision's classification weights.

    Returns
    -------
    callable
        Maps one RGB ``PIL.Image`` to a ``(3, 224, 224)`` float32 tensor.
    """
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
