"""The token-grid rule: when a sequence of tokens is a square picture of patches.

A vision transformer turns an ``H × W`` picture into ``N = (H/p)·(W/p)`` patch tokens,
often with a class token first, so its activations are ``(B, 1+N, C)`` or ``(B, N, C)``.
The views show such tokens as a ``√N × √N`` map and Grad-CAM weighs them like a conv
map. A token count that is not a perfect square (or a perfect square minus one) is read
as a plain sequence. A class token first is the common ViT layout, so it wins when both
readings fit (``T = 17`` is 1 + 4×4, not 17 tokens).

A sequence model's tokens are positions in a sentence or a time series, not patches of a
picture: ``aligned_token_grid`` folds tokens only when the model's input is an image whose
side the grid divides (224 px / 14 = 16 px patches), never when the input is itself a
sequence ``(B, T)`` of token ids or ``(B, T, D)`` of features, whatever ``T`` is.

This is the only place the rule is written; ``gradexplorer.analysis.heatmaps`` and
``gradexplorer.analysis.gradcam`` call it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple


class TokenGrid(NamedTuple):
    """How ``T`` tokens fold into a square grid.

    Attributes
    ----------
    side : int
        Height and width of the grid.
    class_token : bool
        Whether the first token is a class token to drop before folding.
    """

    side: int
    class_token: bool


def square_side(n: int) -> int | None:
    """``isqrt(n)`` when ``n`` is a positive perfect square, else ``None``.

    Parameters
    ----------
    n : int

    Returns
    -------
    int or None
    """
    if n < 1:
        return None
    side = math.isqrt(n)
    return side if side * side == n else None


def token_grid(tokens: int) -> TokenGrid | None:
    """The square grid that ``tokens`` tokens form, if any (see the module docstring).

    Parameters
    ----------
    tokens : int
        Sequence length ``T`` of a ``(B, T, C)`` activation.

    Returns
    -------
    TokenGrid or None
        ``None`` when neither ``T - 1`` nor ``T`` is a perfect square.
    """
    side = square_side(int(tokens) - 1)
    if side is not None:
        return TokenGrid(side, True)
    side = square_side(int(tokens))
    if side is not None:
        return TokenGrid(side, False)
    return None


def is_image_input(input_shape: Sequence[int] | None) -> bool:
    """Whether a model input of this shape (batch first) is a batch of pictures
    ``(B, C, H, W)`` with ``H, W >= 2``."""
    return input_shape is not None and len(input_shape) == 4 and int(input_shape[2]) >= 2 \
        and int(input_shape[3]) >= 2


def aligned_token_grid(tokens: int, input_shape: Sequence[int] | None) -> TokenGrid | None:
    """The square grid of ``tokens`` when it lines up with the model's input.

    Parameters
    ----------
    tokens : int
        Sequence length ``T`` of a ``(B, T, C)`` activation.
    input_shape : sequence of int or None
        The model input's shape, batch first; ``None`` when unknown (then the plain
        ``token_grid`` rule applies).

    Returns
    -------
    TokenGrid or None
        ``None`` for a sequence input, and for an image whose height and width the grid
        side does not divide (the tokens are then not its patches).
    """
    grid = token_grid(tokens)
    if grid is None or input_shape is None:
        return grid
    if not is_image_input(input_shape):
        return None
    h, w = int(input_shape[2]), int(input_shape[3])
    return grid if h % grid.side == 0 and w % grid.side == 0 else None
