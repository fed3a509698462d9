"""Making a :class:`~core.batch.Batch` from what the user points at.

Sources are image files or folders (``images``), a tensor file saved with ``torch.save``
(``tensor_files``), a random batch of a given shape (``random_batches``), or the demo
batch of a demo model. :func:`load_batch` (``sources``) picks the right loader for what
the CLI or GUI was given; ``labels`` and ``shape_check`` serve them all. Every failure
the user can cause is a :class:`~core.errors.BatchError` naming the file or value, the
problem and the fix.
"""

from core.batches.images import (
    DEFAULT_PREPROCESS_DESCRIPTION,
    IMAGE_SUFFIXES,
    IMAGENET_MEAN,
    IMAGENET_STD,
    MAX_KEPT_IMAGE_SIDE,
    default_preprocess,
    load_images,
)
from core.batches.labels import parse_labels
from core.batches.random_batches import (
    MAX_RANDOM_ELEMENTS,
    RandomRecipe,
    random_batch,
    random_batch_for,
    random_shape_for,
    recipe_for,
)
from core.batches.shape_check import check_batch_shape
from core.batches.sources import describe, load_batch
from core.batches.tensor_files import TENSOR_SUFFIXES, load_tensor_file

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
