"""Labels: the user's class indices or names, turned into one class index per sample."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import TypeAlias

import torch

from gradexplorer.base.errors import BatchError

#: What a user or a file may give as labels: ``"3,1,0"``, ``"tabby"``, ``3``, ``[3, 1, 0]``,
#: a tensor of class indices (:func:`parse_labels`).
LabelSpec: TypeAlias = str | int | Sequence[int | str] | torch.Tensor


def _normalise_name(name: str) -> str:
    return " ".join(name.replace("_", " ").split()).casefold()


def _label_index(token: object, categories: Sequence[str] | None) -> int:
    if isinstance(token, bool):
        raise BatchError(f"label {token!r} is not a class index or name;", "give class indices such as 3,1,0.")
    if isinstance(token, int) or (isinstance(token, str) and re.fullmatch(r"[+-]?\d+", token.strip())):
        index = int(token)
        if index < 0:
            raise BatchError(f"label {index} is negative;", "class indices start at 0.")
        if categories is not None and index >= len(categories):
            raise BatchError(
                f"label {index} is out of range: the model has {len(categories)} classes;",
                f"give an index from 0 to {len(categories) - 1}.",
            )
        return index
    if not isinstance(token, str):
        raise BatchError(f"label {token!r} is not a class index or name;", "give class indices such as 3,1,0.")
    name = token.strip()
    if not name:
        raise BatchError("an empty label was given;", "give class indices or names separated by commas, e.g. 3,1,0.")
    if not categories:
        raise BatchError(
            f"label '{name}' is a class name, but the model has no class names;",
            "give class indices such as 3,1,0.",
        )
    wanted = _normalise_name(name)
    normalised = [_normalise_name(c) for c in categories]
    matches = [i for i, c in enumerate(normalised) if c == wanted]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        # ImageNet, for one, has two classes named "crane" (bird and machine).
        raise BatchError(
            f"label '{name}' matches several classes ({', '.join(map(str, matches))});",
            "give the class index instead.",
        )
    close = difflib.get_close_matches(wanted, normalised, n=3, cutoff=0.6)
    if close:
        names = ", ".join(f"'{categories[normalised.index(c)]}'" for c in close)
        fix = f"did you mean {names}?"
    else:
        fix = f"give a class index from 0 to {len(categories) - 1} or one of the model's class names."
    raise BatchError(f"label '{name}' is not one of the model's classes;", fix)


def parse_labels(spec: LabelSpec, n: int, categories: Sequence[str] | None = None) -> torch.Tensor:
    """Turn the user's labels into class indices, one per sample.

    Parameters
    ----------
    spec : str, int, sequence of int or str, or Tensor
        ``"3,1,0"``, ``"tabby, tiger cat"``, ``"3"``, ``[3, 1, 0]``... Names are matched
        against ``categories`` ignoring case, underscores and repeated spaces. A single
        label is used for every sample.
    n : int
        The number of samples.
    categories : sequence of str, optional
        The model's class names, index-aligned with its logits; needed for names and
        used to check index range.

    Returns
    -------
    torch.Tensor
        ``(n,)`` int64.

    Raises
    ------
    BatchError
        A label is negative, out of range, an unknown or ambiguous name (close matches
        are suggested), or the number of labels is neither 1 nor ``n``.
    """
    if isinstance(spec, torch.Tensor):
        labels = checked_label_tensor(spec, n, "the labels")
        if categories is not None and n and int(labels.max()) >= len(categories):
            raise BatchError(
                f"label {int(labels.max())} is out of range: the model has {len(categories)} classes;",
                f"give indices from 0 to {len(categories) - 1}.",
            )
        return labels
    tokens: list[object]
    if isinstance(spec, str):
        tokens = [t.strip() for t in spec.split(",")]
        if all(not t for t in tokens):
            raise BatchError("no labels were given;", "give class indices or names separated by commas, e.g. 3,1,0.")
    elif isinstance(spec, int):
        tokens = [spec]
    else:
        try:
            tokens = list(spec)
        except TypeError as exc:
            raise BatchError(f"labels {spec!r} cannot be read;", "give class indices such as 3,1,0.") from exc
    indices = [_label_index(t, categories) for t in tokens]
    if len(indices) == 1:
        indices = indices * n
    if len(indices) != n:
        raise BatchError(
            f"{len(indices)} labels were given for {n} sample{'s' if n != 1 else ''};",
            "give one label per sample, or a single label for all of them.",
        )
    if any(i >= 2**63 for i in indices):  # what int64 holds; a far smaller model would refuse it anyway
        raise BatchError(f"label {str(max(indices))[:30]}… is far too large to be a class;",
                         "give class indices such as 3,1,0.")
    return torch.tensor(indices, dtype=torch.int64)



def checked_label_tensor(labels: torch.Tensor, n: int, what: str) -> torch.Tensor:
    """``labels`` from a file as ``(n,)`` int64 class indices, or the reason they do not fit."""
    labels = labels.detach().to("cpu")
    if labels.is_floating_point() and torch.equal(labels, labels.round()):
        labels = labels.long()
    if labels.dtype in (torch.bool,) or labels.is_floating_point() or labels.is_complex():
        raise BatchError(
            f"{what} have dtype {labels.dtype}, not integer class indices;",
            "give labels as integers (class indices), one per sample.",
        )
    if labels.dim() == 0:
        labels = labels.reshape(1)
    if labels.dim() != 1:
        raise BatchError(
            f"{what} have shape {tuple(labels.shape)}; one class index per sample is needed;",
            f"give a tensor of shape ({n},) (for one-hot labels, use labels.argmax(1)).",
        )
    if labels.numel() == 1 and n != 1:
        labels = labels.expand(n)
    if labels.numel() != n:
        raise BatchError(
            f"{what} give {labels.numel()} labels for {n} sample{'s' if n != 1 else ''};",
            "give one label per sample, or a single label for all of them.",
        )
    if n and int(labels.min()) < 0:
        raise BatchError(f"{what} include a negative class index;", "class indices start at 0.")
    return labels.to(torch.int64).clone()

