"""Random batches of a given shape, for trying a model without data."""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from core.batch import Batch
from core.errors import BatchError

# 2 GiB of float32; a typo such as 8x3x2240x2240 should be refused, not swap the machine.
MAX_RANDOM_ELEMENTS = 2**29

_SHAPE_RE = re.compile(r"^\(?\s*\d+(?:\s*[x×,*\s]\s*\d+)*\s*,?\s*\)?$", re.IGNORECASE)
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


def random_batch(shape: str | Sequence[int], seed: int | None = 0) -> Batch:
    """A batch of standard normal values.

    Parameters
    ----------
    shape : str or sequence of int
        The full shape, batch first: ``"2x3x224x224"``, ``"2,3,224,224"``,
        ``"(2, 3, 224, 224)"`` or ``(2, 3, 224, 224)``.
    seed : int or None, default 0
        Seed for the values: the same seed gives the same batch. ``None`` picks a fresh
        seed, which is reported in ``Batch.source`` so the batch can be made again.

    Returns
    -------
    Batch
        float32 values drawn from N(0, 1), no labels, no images.

    Raises
    ------
    BatchError
        The shape cannot be parsed, has a size below 1, or is too large.
    """
    dims = parse_shape(shape)
    generator = torch.Generator()
    if seed is None:
        seed = generator.seed()
    else:
        generator.manual_seed(int(seed))
    tensor = torch.randn(dims, generator=generator)
    n = dims[0]
    return Batch(
        tensor=tensor,
        labels=None,
        names=[f"random[{i}]" for i in range(n)],
        source=f"{n} random sample{'s' if n != 1 else ''} from N(0, 1), seed {seed}",
        preprocessing="none",
    )

