"""Saliency of a sequence input: how much the target depends on each token.

For a picture, saliency is ``|d target / d pixel|`` (``gradexplorer.analysis.heatmaps.saliency_map``). A
sequence has no pixels: its unit is the token, so the saliency of token ``t`` is the L2
norm, over the feature dimension, of the gradient of the target with respect to that
token's vector. Token ids ``(B, T)`` are integers and have no gradient; their vectors are
the output of the model's first layer that maps them to ``(B, T, D)`` (the embedding), so
the gradient there is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gradexplorer.capturing.data import Capture


@dataclass(frozen=True)
class TokenSaliency:
    """One sample's per-token saliency.

    Attributes
    ----------
    values : numpy.ndarray
        ``(T,)`` float64, non-negative.
    source : str
        Which gradient it was taken from, in words.
    unit : str
        What one value is about: ``"token"``, or ``"feature"`` for a ``(B, F)`` float input.
    """

    values: np.ndarray
    source: str
    unit: str = "token"


def is_sequence_input(input_shape: Sequence[int] | None) -> bool:
    """Whether a model input of this shape (batch first) is a sequence: ``(B, T)`` or
    ``(B, T, D)``."""
    return input_shape is not None and len(input_shape) in (2, 3)


def token_saliency(capture: Capture, sample: int) -> TokenSaliency | None:
    """Per-token saliency of ``sample`` for a sequence input (module docstring).

    Parameters
    ----------
    capture : Capture
        A full capture (statistics-only captures hold no gradient tensors).
    sample : int
        Index in the batch.

    Returns
    -------
    TokenSaliency or None
        ``None`` when the input is not a sequence, or no gradient at the tokens was
        captured (no input gradient, and no layer with a ``(B, T, D)`` output and its
        gradient).
    """
    x = capture.input
    if not isinstance(x, torch.Tensor) or not is_sequence_input(tuple(x.shape)):
        return None
    s = min(max(int(sample), 0), x.shape[0] - 1)
    g = capture.input_grad
    if x.dim() == 2 and x.is_floating_point():
        # (B, F) floats are features (a tabular row, an MLP's input), not token ids: no layer
        # holds their vectors, so only the input gradient tells, one value per feature.
        if isinstance(g, torch.Tensor) and tuple(g.shape) == tuple(x.shape):
            return TokenSaliency(g[s].detach().to(torch.float64).cpu().abs().numpy(),
                                 "|gradient with respect to the input| of each feature", unit="feature")
        return None
    if x.dim() == 3 and isinstance(g, torch.Tensor) and tuple(g.shape) == tuple(x.shape):
        return TokenSaliency(_norms(g[s]), "gradient with respect to the input, L2 norm over its features")
    b, t = int(x.shape[0]), int(x.shape[1])
    if x.dim() == 2 and isinstance(g, torch.Tensor) and g.dim() == 3 and tuple(g.shape[:2]) == (b, t):
        where = capture.meta.get("input_grad_of") or "the token vectors"
        return TokenSaliency(_norms(g[s]), f"gradient at {where}, L2 norm over its features")
    for name in capture.layer_order:
        for call in capture[name].calls:
            grad = call.grad_output
            if len(call.shape) == 3 and tuple(call.shape[:2]) == (b, t) and isinstance(grad, torch.Tensor):
                return TokenSaliency(_norms(grad[s]), f"gradient at the output of '{name}' (the token vectors), "
                                                      "L2 norm over its features")
    return None


def token_saliency_csv(capture: Capture) -> str | None:
    """Every sample's per-token saliency as CSV: ``sample, position, token, saliency``, the
    token strings of a batch of texts (empty for other sequences); None when the capture has
    no token saliency (not a sequence, or no gradient at the tokens)."""
    import csv
    import io

    x = capture.input
    if not isinstance(x, torch.Tensor) or not is_sequence_input(tuple(x.shape)):
        return None
    tokens = capture.meta.get("tokens")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["sample", "position", "token", "saliency"])
    for sample in range(int(x.shape[0])):
        sal = token_saliency(capture, sample)
        if sal is None:
            return None
        row = tokens[sample] if isinstance(tokens, list) and sample < len(tokens) else None
        for position, value in enumerate(sal.values.tolist()):
            word = row[position] if row is not None and position < len(row) else ""
            w.writerow([sample, position, word, repr(float(value))])
    return buf.getvalue()


def _norms(tokens: torch.Tensor) -> np.ndarray:
    return tokens.detach().to(torch.float64).cpu().norm(dim=-1).numpy()
