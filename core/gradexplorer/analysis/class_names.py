"""Class names for people: the one lookup from a class index to its name, and the top
predicted classes of a model output.

Name → index (what the user types as a label or a target class) is
``gradexplorer.batches.parse_labels``; this file goes the other way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gradexplorer.capturing.targets import is_class_axis


def class_name(index: int, categories: Sequence[str] | None) -> str:
    """The name of class ``index``, or ``"class N"`` when the model has no such name.

    Parameters
    ----------
    index : int
    categories : sequence of str, optional
        The model's class names, index-aligned with its logits.

    Returns
    -------
    str
    """
    index = int(index)
    if categories is not None and 0 <= index < len(categories):
        return str(categories[index])
    return f"class {index}"


def top_classes(output: torch.Tensor | None, categories: Sequence[str] | None,
                k: int = 5, class_dim: int = 1) -> list[list[tuple[str, float]]]:
    """Per sample, the ``k`` most probable classes (softmax over logits) with probabilities.

    Parameters
    ----------
    output : torch.Tensor or None
        Logits ``(B, C)``; dense outputs ``(B, C, H, W...)`` are averaged over positions
        first.
    categories : sequence of str, optional
    k : int
    class_dim : int
        The dim that holds the classes (the target's, ``gradexplorer.capturing.targets.Target.class_dim``):
        -1 for per-token logits ``(B, length, vocab)``.

    Returns
    -------
    list of list of (str, float)
        Empty when the output is not floating ``(B, C, ...)`` with more than one class.
    """
    if output is None or output.dim() < 2 or not output.is_floating_point():
        return []
    if not is_class_axis(class_dim, output.dim()):
        return []
    output = output.movedim(class_dim, 1)
    if output.shape[1] < 2:
        return []
    logits = output.detach().float()
    if logits.dim() > 2:
        logits = logits.flatten(2).mean(-1)
    probs = torch.softmax(logits, dim=1)
    values, indices = probs.topk(min(k, probs.shape[1]), dim=1)
    return [[(class_name(i, categories), v) for v, i in zip(vs, ix)]
            for vs, ix in zip(values.tolist(), indices.tolist())]
