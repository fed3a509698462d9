"""Making a :class:`~gradexplorer.capturing.inputs.Batch` from what the user points at.

Sources are image files or folders (``images``), a tensor file saved with ``torch.save``
(``tensor_files``), a random batch of a given shape (``random_batches``), or the demo
batch of a demo model. :func:`load_batch` (``sources``) picks the right loader for what
the CLI or GUI was given; ``labels`` and ``shape_check`` serve them all. Every failure
the user can cause is a :class:`~gradexplorer.base.errors.BatchError` naming the file or value, the
problem and the fix.
"""

from typing import TYPE_CHECKING

from gradexplorer.base.lazy import attach

__all__ = [
    "IMAGE_SUFFIXES",
    "TENSOR_SUFFIXES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MAX_KEPT_IMAGE_SIDE",
    "MAX_RANDOM_ELEMENTS",
    "DEFAULT_PREPROCESS_DESCRIPTION",
    "default_preprocess",
    "load_images",
    "load_tensor_file",
    "random_batch",
    "random_batch_for",
    "random_shape_for",
    "recipe_for",
    "RandomRecipe",
    "parse_labels",
    "check_batch_shape",
    "load_batch",
    "describe",
]

# Imported on first use: the image loader imports torchvision (through the models' preprocessing).
__getattr__, __dir__ = attach(__name__, {
    "IMAGE_SUFFIXES": "gradexplorer.batches.images",
    "MAX_KEPT_IMAGE_SIDE": "gradexplorer.batches.images",
    "load_images": "gradexplorer.batches.images",
    "parse_labels": "gradexplorer.batches.labels",
    "MAX_RANDOM_ELEMENTS": "gradexplorer.batches.random_batches",
    "RandomRecipe": "gradexplorer.batches.random_batches",
    "random_batch": "gradexplorer.batches.random_batches",
    "random_batch_for": "gradexplorer.batches.random_batches",
    "random_shape_for": "gradexplorer.batches.random_batches",
    "recipe_for": "gradexplorer.batches.random_batches",
    "check_batch_shape": "gradexplorer.batches.shape_check",
    "load_batch": "gradexplorer.batches.sources",
    "TENSOR_SUFFIXES": "gradexplorer.batches.tensor_files",
    "load_tensor_file": "gradexplorer.batches.tensor_files",
    "describe": "gradexplorer.capturing.inputs",
    "DEFAULT_PREPROCESS_DESCRIPTION": "gradexplorer.models.preprocess",
    "IMAGENET_MEAN": "gradexplorer.models.preprocess",
    "IMAGENET_STD": "gradexplorer.models.preprocess",
    "default_preprocess": "gradexplorer.models.preprocess",
})

if TYPE_CHECKING:
    from gradexplorer.batches.images import IMAGE_SUFFIXES, MAX_KEPT_IMAGE_SIDE, load_images
    from gradexplorer.batches.labels import parse_labels
    from gradexplorer.batches.random_batches import (
        MAX_RANDOM_ELEMENTS,
        RandomRecipe,
        random_batch,
        random_batch_for,
        random_shape_for,
        recipe_for,
    )
    from gradexplorer.batches.shape_check import check_batch_shape
    from gradexplorer.batches.sources import load_batch
    from gradexplorer.batches.tensor_files import TENSOR_SUFFIXES, load_tensor_file
    from gradexplorer.capturing.inputs import describe
    from gradexplorer.models.preprocess import (
        DEFAULT_PREPROCESS_DESCRIPTION,
        IMAGENET_MEAN,
        IMAGENET_STD,
        default_preprocess,
    )
