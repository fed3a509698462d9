"""Random batches of a given shape, for trying a model without data."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from gradexplorer.base.errors import BatchError
from gradexplorer.capturing.inputs import Batch
from gradexplorer.models.input_size import declared_input_shape

# 2 GiB of float32; a typo such as 8x3x2240x2240 should be refused, not swap the machine.
MAX_RANDOM_ELEMENTS = 2**29

_SHAPE_RE = re.compile(r"^\(?\s*\d+(?:\s*[x×,*\s]\s*\d+)*\s*,?\s*\)?$", re.IGNORECASE)
# Tokens per sample of a random batch for a sequence model whose length is not known.
_TOKENS = 16
_SHAPE_EXAMPLE = "write the shape as numbers joined by 'x' or ',', e.g. '2x3x224x224' (batch, channels, height, width)."


def looks_like_shape(text: str) -> bool:
    """Whether ``text`` is written as a shape of two or more sizes ("2x3x224x224")."""
    return bool(_SHAPE_RE.match(text) and re.search(r"\d\D+\d", text))


def parse_shape(shape: str | Sequence[int]) -> tuple[int, ...]:
    """The sizes of a shape the user wrote, checked (see :func:`random_batch`)."""
    if isinstance(shape, str):
        text = shape.strip()
        if not text or not _SHAPE_RE.match(text):
            raise BatchError(f"'{shape}' is not a shape;", _SHAPE_EXAMPLE)
        dims = tuple(int(d) for d in re.findall(r"\d+", text))
    else:
        try:
            items = list(shape)
            if any(isinstance(d, bool) or float(d) != int(d) for d in items):
                raise ValueError
            dims = tuple(int(d) for d in items)
        except (TypeError, ValueError) as exc:
            raise BatchError(f"{shape!r} is not a shape (sizes must be whole numbers);", _SHAPE_EXAMPLE) from exc
    if not dims:
        raise BatchError("an empty shape was given;", _SHAPE_EXAMPLE)
    if any(d <= 0 for d in dims):
        raise BatchError(f"shape {'x'.join(map(str, dims))} has a size of 0 or less;", "every size must be at least 1.")
    count = 1
    for d in dims:
        count *= d
    if count > MAX_RANDOM_ELEMENTS:
        raise BatchError(
            f"shape {'x'.join(map(str, dims))} has {count:,} values, more than the "
            f"{MAX_RANDOM_ELEMENTS:,} allowed for a random batch;",
            "use a smaller batch or image size.",
        )
    return dims


class RandomRecipe(NamedTuple):
    """What a random batch for a model holds, read off the model (:func:`recipe_for`).

    Attributes
    ----------
    dtype : torch.dtype
        The dtype of the model's floating parameters (float16, bfloat16...).
    vocab : int or None
        For a model that starts with an ``Embedding``: token ids are drawn from
        ``[0, vocab)`` instead of N(0, 1).
    sample_shape : tuple of int or None
        The shape of one sample its first layer takes, when the model says nothing else:
        ``(16,)`` tokens, ``(in_features,)``, ``(in_channels, 64, 64)``...
    """

    dtype: torch.dtype = torch.float32
    vocab: int | None = None
    sample_shape: tuple[int, ...] | None = None


def recipe_for(module: nn.Module | None) -> RandomRecipe:
    """What a random batch for ``module`` should hold: its dtype, token ids or floats.

    Parameters
    ----------
    module : nn.Module or None
        The model; ``None`` gives float32 values and no shape.

    Returns
    -------
    RandomRecipe
    """
    if module is None:
        return RandomRecipe()
    floats = [t.dtype for t in itertools.chain(module.parameters(), module.buffers())
              if t.is_floating_point()]
    dtype = floats[0] if floats else torch.float32
    first = _first_layer(module)
    if isinstance(first, (nn.Embedding, nn.EmbeddingBag)):
        return RandomRecipe(dtype, first.num_embeddings, (_TOKENS,))
    if isinstance(first, nn.Linear):
        return RandomRecipe(dtype, None, (first.in_features,))
    if isinstance(first, nn.modules.conv._ConvNd):
        spatial = {1: (64,), 2: (64, 64), 3: (8, 32, 32)}[len(first.kernel_size)]
        return RandomRecipe(dtype, None, (first.in_channels, *spatial))
    return RandomRecipe(dtype)


def _first_layer(module: nn.Module) -> nn.Module | None:
    # The first leaf with parameters, in registration order (which is forward order for
    # nearly every model: embeddings and stems are defined first).
    for sub in module.modules():
        if not any(True for _ in sub.children()) and any(True for _ in sub.parameters()):
            return sub
    return None


def random_batch(
    shape: str | Sequence[int],
    seed: int | None = 0,
    *,
    recipe: RandomRecipe | None = None,
) -> Batch:
    """A batch of standard normal values, or of token ids for a model that takes them.

    Parameters
    ----------
    shape : str or sequence of int
        The full shape, batch first: ``"2x3x224x224"``, ``"2,3,224,224"``,
        ``"(2, 3, 224, 224)"`` or ``(2, 3, 224, 224)``.
    seed : int or None, default 0
        Seed for the values: the same seed gives the same batch. ``None`` picks a fresh
        seed, which is reported in ``Batch.source`` so the batch can be made again.
    recipe : RandomRecipe, optional
        What the model takes (:func:`recipe_for`): its dtype, and token ids in
        ``[0, vocab)`` for a model that starts with an ``Embedding``. Default: float32.

    Returns
    -------
    Batch
        Values drawn from N(0, 1) in the recipe's dtype, or int64 token ids; no labels,
        no images.

    Raises
    ------
    BatchError
        The shape cannot be parsed, has a size below 1, or is too large.
    """
    recipe = recipe or RandomRecipe()
    dims = parse_shape(shape)
    generator = torch.Generator()
    if seed is None:
        seed = generator.seed()
    else:
        generator.manual_seed(int(seed))
    n = dims[0]
    samples = f"{n} random sample{'s' if n != 1 else ''}"
    if recipe.vocab is not None:
        tensor = torch.randint(0, recipe.vocab, dims, generator=generator)
        source = f"{samples} of token ids in [0, {recipe.vocab}), seed {seed}"
    else:
        tensor = torch.randn(dims, generator=generator).to(recipe.dtype)
        kind = "" if recipe.dtype == torch.float32 else f" as {str(recipe.dtype).replace('torch.', '')}"
        source = f"{samples} from N(0, 1){kind}, seed {seed}"
    return Batch(
        tensor=tensor,
        labels=None,
        names=[f"random[{i}]" for i in range(n)],
        source=source,
        preprocessing="none",
    )


def random_shape_for(
    module: nn.Module | None, input_shape: tuple[int | None, ...] | None, n: int = 2,
) -> tuple[int, ...] | None:
    """The full shape (batch first) of ``n`` random samples for a model: its known input
    shape, else the one it declares (timm's ``pretrained_cfg``, a Hugging Face config's
    ``image_size``), else what its first layer takes (:class:`RandomRecipe`).

    Parameters
    ----------
    module : nn.Module or None
        The model.
    input_shape : tuple or None
        The model's known shape of one sample (``LoadedModel.input_shape``); a shape with
        an unknown size (``(3, None, None)``) counts as unknown.
    n : int
        Samples.

    Returns
    -------
    tuple of int or None
        None when neither the model nor its first layer tells a shape.
    """
    if input_shape is not None and all(isinstance(d, int) for d in input_shape):
        sample: tuple[int, ...] | None = tuple(d for d in input_shape if d is not None)
    else:
        sample = declared_input_shape(module) or recipe_for(module).sample_shape
    return None if sample is None else (n, *sample)


def random_batch_for(
    module: nn.Module | None, input_shape: tuple[int | None, ...] | None, n: int = 2,
    seed: int | None = 0,
) -> Batch | None:
    """``n`` random samples that follow the model: its input shape (or what its first
    layer takes, :func:`random_shape_for`), its dtype, token ids for an ``Embedding``.

    Parameters
    ----------
    module : nn.Module or None
        The model.
    input_shape : tuple or None
        The model's known shape of one sample (``LoadedModel.input_shape``).
    n : int
        Samples.
    seed : int or None

    Returns
    -------
    Batch or None
        None when neither the model nor its first layer tells a shape.
    """
    shape = random_shape_for(module, input_shape, n)
    if shape is None:
        return None
    return random_batch(shape, seed, recipe=recipe_for(module))
