"""Targets: the scalar that backward starts from.

A target picks one tensor from the model's output (a plain tensor, a tuple/namedtuple
such as GoogLeNet's train-mode ``(logits, aux2, aux1)``, or a dict such as a
segmentation model's ``{"out", "aux"}``) and reduces it to a scalar. Logits are used
as they are (pre-softmax). Dense outputs (``B, C, *positions``) sum over positions.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gradexplorer.base.errors import GradExplorerError

TARGET_KINDS = ("top1", "class", "sum", "mean", "cross_entropy")


@dataclass(frozen=True)
class Target:
    """What to differentiate.

    Attributes
    ----------
    kind : str
        ``top1`` (sum over the batch, and over positions for dense outputs, of each
        sample's largest logit), ``class`` (sum of logit ``class_index``), ``sum``,
        ``mean``, or ``cross_entropy`` (mean cross-entropy against the batch's labels).
    class_index : int or None
        For ``class``.
    output_key : str or None
        Which element of a dict/tuple output to use (``"out"``, ``"aux"``, ``"0"``);
        ``None`` picks ``"out"`` or the first element.
    class_dim : int
        The output's class axis for ``top1``, ``class`` and ``cross_entropy``: 1 for
        ``(B, classes, *positions)`` (classifiers, segmentation, Conv1d), -1 for a sequence
        model's per-token logits ``(B, length, vocab)``. Any dim but the batch's (0).
    position : int or None
        For a sequence output ``(B, length, vocab)``: read one position only (``-1``, the
        last: a causal language model's prediction of the next token); ``None`` sums over
        every position.
    """

    kind: str = "top1"
    class_index: int | None = None
    output_key: str | None = None
    class_dim: int = 1
    position: int | None = None

    def __str__(self) -> str:
        s = f"class:{self.class_index}" if self.kind == "class" else self.kind
        if self.class_dim != 1 and self.kind in CLASS_KINDS:
            s += f",dim={self.class_dim}"
        if self.position is not None:
            s += f",pos={self.position}"
        return f"{s}@{self.output_key}" if self.output_key is not None else s

    def describe(self) -> str:
        """The target in words ("the logit of the predicted next token at the last position")."""
        if self.kind in ("sum", "mean"):
            what = f"the {self.kind} of the output"
        elif self.kind == "cross_entropy":
            what = "the cross-entropy against the labels"
        elif self.kind == "class":
            what = f"the logit of class {self.class_index}"
        elif self.position is not None and self.class_dim == -1:
            what = "the logit of the predicted next token"
        else:
            what = "the largest logit of each sample"
        if self.position == -1:
            what += " at the last position"
        elif self.position is not None:
            what += f" at position {self.position}"
        elif self.kind in CLASS_KINDS and self.class_dim != 1:
            what += ", summed over positions"
        return what + (f" (output '{self.output_key}')" if self.output_key else "")


#: Targets that read a class axis (``Target.class_dim``).
CLASS_KINDS = ("top1", "class", "cross_entropy")


def parse_target(spec: str | Target, output_key: str | None = None) -> Target:
    """Read a target from its text form.

    Parameters
    ----------
    spec : str or Target
        ``"top1"``, ``"class:N"``, ``"sum"``, ``"mean"``, ``"cross_entropy"``; the class
        targets optionally followed by ``,dim=D`` for an output whose classes are not on
        dim 1 (``"top1,dim=-1"`` for per-token logits ``(B, length, vocab)``); then
        optionally ``@key`` to pick an output element (``"top1@aux"``).
    output_key : str, optional
        Overrides the ``@key`` part.

    Raises
    ------
    GradExplorerError
        For anything else, listing the valid forms.
    """
    if isinstance(spec, Target):
        if output_key is not None:
            return Target(spec.kind, spec.class_index, output_key, spec.class_dim, spec.position)
        return spec
    text = str(spec).strip()
    key = None
    if "@" in text:
        text, key = text.split("@", 1)
        key = key.strip() or None
    key = output_key if output_key is not None else key
    text, class_dim, position = _split_class_dim(text, spec)
    target = _parse_kind(text, spec, key)
    if class_dim != 1:
        if target.kind not in CLASS_KINDS:
            raise GradExplorerError(
                f"Target '{spec}' has a class axis, but {target.kind} reads no classes.",
                "Drop the ',dim=...' part, or use top1, class:N or cross_entropy.",
            )
        target = Target(target.kind, target.class_index, target.output_key, class_dim)
    if position is not None:
        if target.kind not in ("top1", "class") or target.class_dim != -1:
            raise GradExplorerError(
                f"Target '{spec}' reads one position, which needs per-token logits with the classes last.",
                "Write it as top1,dim=-1,pos=-1 (or class:N,dim=-1,pos=-1).",
            )
        target = Target(target.kind, target.class_index, target.output_key, target.class_dim, position)
    return target


def _split_class_dim(text: str, spec: object) -> tuple[str, int, int | None]:
    """``"top1,dim=-1,pos=-1"`` -> ``("top1", -1, -1)``; no parts -> ``(text, 1, None)``."""
    if "," not in text:
        return text, 1, None
    text, *clauses = text.split(",")
    dim, position = 1, None
    for clause in clauses:
        name, _, value = clause.replace(" ", "").partition("=")
        if name.lower() == "dim":
            dim = _class_dim_value(value, spec)
        elif name.lower() in ("pos", "position"):
            try:
                position = int(value)
            except ValueError:
                raise GradExplorerError(f"Target '{spec}' has no position number after 'pos='.",
                                        "Write it as top1,dim=-1,pos=-1 (the last position).") from None
        else:
            raise GradExplorerError(
                f"Target '{spec}' has an unknown part ',{clause.strip()}'.",
                "The parts after a comma are the class axis and a position, e.g. top1,dim=-1,pos=-1.",
            )
    return text, dim, position


def _class_dim_value(value: str, spec: object) -> int:
    try:
        dim = int(value)
    except ValueError:
        raise GradExplorerError(
            f"Target '{spec}' has no class axis number after 'dim='.",
            "Write it as top1,dim=-1 (classes last) or top1,dim=2.",
        ) from None
    if dim == 0:
        raise GradExplorerError(
            f"Target '{spec}' puts the classes on dim 0, the batch.",
            "Use dim=1 for (B, classes, ...) or dim=-1 for (B, length, vocab).",
        )
    return dim


def _parse_kind(text: str, spec: object, key: str | None) -> Target:
    name = text.strip().lower().replace("-", "_")
    if name in ("crossentropy", "ce", "loss"):
        name = "cross_entropy"
    if name.startswith(("class:", "class=")):
        raw = text.strip()[6:]  # the number as written: "-3" is negative, not "_3"
        try:
            index = int(raw)
        except ValueError:
            raise GradExplorerError(
                f"Target '{spec}' has no class number.", "Write it as class:N, e.g. class:281."
            ) from None
        if index < 0:
            raise GradExplorerError(f"Target class {index} is negative.", "Use a class index from 0.")
        return Target("class", index, key)
    if name in ("top1", "sum", "mean", "cross_entropy"):
        return Target(name, None, key)
    near = difflib.get_close_matches(name, ["top1", "class:N", "sum", "mean", "cross_entropy"], n=1)
    hint = f" Did you mean '{near[0]}'?" if near else ""
    raise GradExplorerError(
        f"Unknown target '{spec}'.{hint}",
        "Use top1, class:N, sum, mean or cross_entropy (add ,dim=-1 when the classes are last, "
        "@key to pick a dict/tuple output).",
    )


def class_dim_of(target: str | Target | None) -> int:
    """The class axis a target reads (``Target.class_dim``; 1 for targets that read none);
    1 for text that is no target (a capture file from elsewhere)."""
    try:
        return parse_target(target or "top1").class_dim
    except GradExplorerError:
        return 1


def is_class_axis(dim: int, ndim: int) -> bool:
    """Whether ``dim`` names an axis of an ``ndim``-dim output other than the batch's."""
    return -ndim <= dim < ndim and dim % ndim != 0


def select_output(output: Any, key: str | None = None) -> torch.Tensor:
    """Pick the tensor a target applies to from a model's output.

    Raises
    ------
    GradExplorerError
        When the output holds no tensor or the key is not there, or when the output is a
        list of dicts (detection models, which need targets in forward: not supported yet).
    """
    if isinstance(output, torch.Tensor):
        if key not in (None, "", "0", "out", "logits"):
            raise GradExplorerError(
                f"The model returns a single tensor; there is no output '{key}'.",
                "Leave the output element empty.",
            )
        return output
    if isinstance(output, Mapping):
        keys = list(output.keys())
        if key is None:
            key = default_key(keys)
        if key not in output:
            raise GradExplorerError(
                f"The model's output has no element '{key}'.",
                f"Pick one of: {', '.join(map(str, keys))}.",
            )
        return select_output(output[key])
    if isinstance(output, (tuple, list)):
        if output and all(isinstance(o, Mapping) for o in output):
            raise GradExplorerError(
                "This model returns a list of dicts per image (a detection model); "
                "detection targets are not supported yet.",
                "Inspect its backbone or a classification model instead.",
            )
        fields = getattr(output, "_fields", None)
        if key is None:
            index = 0
        elif fields and key in fields:
            index = fields.index(key)
        else:
            try:
                index = int(key)
            except ValueError:
                names = ", ".join(fields) if fields else f"0..{len(output) - 1}"
                raise GradExplorerError(
                    f"The model's output has no element '{key}'.", f"Pick one of: {names}."
                ) from None
        if not 0 <= index < len(output):
            raise GradExplorerError(
                f"The model's output has {len(output)} elements; '{key}' is out of range.",
                f"Pick 0..{len(output) - 1}.",
            )
        return select_output(output[index])
    raise GradExplorerError(
        f"The model returned a {type(output).__name__}, not a tensor.",
        "gradexplorer needs a model whose forward returns a tensor, a tuple or a dict of tensors.",
    )


def default_key(keys: list) -> Any:
    """The element of a dict output that a target without ``@key`` reads: ``out``, else
    ``logits`` (a Hugging Face ModelOutput puts ``loss`` first when labels are passed), else
    the first."""
    return "out" if "out" in keys else "logits" if "logits" in keys else keys[0] if keys else None


def output_keys(output: Any) -> list[str]:
    """The element names a target may pick from an output (empty for a plain tensor)."""
    if isinstance(output, Mapping):
        return [str(k) for k in output]
    if isinstance(output, (tuple, list)):
        fields = getattr(output, "_fields", None)
        return list(fields) if fields else [str(i) for i in range(len(output))]
    return []


def class_axis_note(output_shape: tuple[int, ...] | None, target: str | Target, *,
                    window: bool = False) -> str | None:
    """What to tell the user when a class target reads a 3-D output, whose class axis is a guess.

    Class targets (``top1``, ``class:N``, ``cross_entropy``) take dim 1 as the classes, as for
    dense outputs ``(B, classes, positions)`` (Conv1d, segmentation). A sequence model's
    per-token logits are ``(B, length, vocab)``, classes last: there dim 1 is the position.

    Parameters
    ----------
    output_shape : tuple of int or None
        The shape of the output the target reads.
    target : str or Target
    window : bool
        Word the fix for the window ("set Classes on to last dim") rather than the command line.

    Returns
    -------
    str or None
        One sentence for a 3-D output under a class target, else None.
    """
    t = parse_target(target)
    if (output_shape is None or len(output_shape) != 3 or t.kind not in CLASS_KINDS
            or t.class_dim != 1):
        return None
    b, c, n = output_shape
    last = Target(t.kind, t.class_index, t.output_key, -1)
    fix = "set 'Classes on' to 'last dim'" if window else f"use --target {last}"
    return (f"the output ({b}, {c}, {n}) is read as (batch, {c} classes, {n} positions): {t} picks along "
            f"dim 1; if it is per-token logits (batch, length, vocab), {fix}.")


def target_scalar(
    output: Any, target: Target | str, labels: torch.Tensor | None = None
) -> torch.Tensor:
    """Reduce a model's output to the scalar that backward starts from.

    Parameters
    ----------
    output : Tensor, tuple, namedtuple or dict
        What the model's forward returned.
    target : Target or str
        See ``parse_target``.
    labels : Tensor, optional
        ``(B,)`` class indices (or ``(B, *positions)`` for dense outputs), needed for
        ``cross_entropy``.

    Raises
    ------
    GradExplorerError
        Class out of range, missing labels, or an output a target cannot use.
    """
    target = parse_target(target)
    y = select_output(output, target.output_key)
    if not y.is_floating_point():
        raise GradExplorerError(
            f"The selected output has dtype {y.dtype}, which has no gradient.",
            "Pick a floating-point output element.",
        )
    if target.kind == "sum":
        return y.sum()
    if target.kind == "mean":
        return y.mean()
    if y.dim() < 2:
        keys = output_keys(output)
        picked = target.output_key or (default_key(keys) if isinstance(output, Mapping) else keys[0] if keys else "")
        others = [k for k in keys if k != picked]
        raise GradExplorerError(
            f"Target '{target}' needs class logits of shape (B, classes, ...); the output "
            f"{'element ' + repr(picked) + ' ' if keys else ''}has shape {tuple(y.shape)}.",
            f"Pick the logits with @KEY (the output has {', '.join(others)}: e.g. {target}@{others[0]})"
            if others else "Use the sum or mean target for this model.",
        )
    dim = target.class_dim
    if not is_class_axis(dim, y.dim()):
        raise GradExplorerError(
            f"Target '{target}' reads the classes on dim {dim}, but the output has shape "
            f"{tuple(y.shape)} (dims 1..{y.dim() - 1} besides the batch).",
            "Pick the dim that holds the classes, e.g. dim=-1 for (B, length, vocab).",
        )
    # The class axis second, as cross_entropy and the messages below expect (where it is
    # already: no view, whose node backward would run too).
    if dim % y.dim() != 1:
        y = y.movedim(dim, 1)
    if target.position is not None:
        if y.dim() != 3 or not -y.shape[2] <= target.position < y.shape[2]:
            raise GradExplorerError(
                f"Target '{target}' reads position {target.position}, but the output has shape "
                f"{tuple(y.movedim(1, dim).shape)}.",
                "Give a position inside the sequence (-1 is the last), or drop ',pos=...'.",
            )
        y = y[:, :, target.position]
        if labels is not None and labels.dim() > 1:
            labels = labels[:, target.position]
    classes = y.shape[1]
    if target.kind == "top1":
        return y.max(dim=1).values.sum()
    if target.kind == "class":
        assert target.class_index is not None  # parse_target sets it for every "class" target
        if target.class_index >= classes:
            raise GradExplorerError(
                f"Target class {target.class_index} is out of range: the model has {classes} "
                f"outputs (classes 0..{classes - 1}).",
                "Pick a class in that range.",
            )
        return y[:, target.class_index].sum()
    # cross_entropy
    if labels is None:
        raise GradExplorerError(
            "The cross_entropy target needs labels for the batch.",
            "Give labels (--labels 3,1,0 or class names), or choose top1.",
        )
    labels = labels.to(y.device)
    if labels.shape[0] != y.shape[0]:
        raise GradExplorerError(
            f"There are {labels.shape[0]} labels for a batch of {y.shape[0]}.",
            "Give one label per sample.",
        )
    if labels.dim() > 1 and tuple(labels.shape[1:]) != tuple(y.shape[2:]):
        raise GradExplorerError(
            f"The labels have shape {tuple(labels.shape)}, the output's positions "
            f"{tuple(y.shape[2:])} (batch {y.shape[0]}, {classes} classes on dim {dim}).",
            "Give one label per sample, or one per sample and position (B, *positions).",
        )
    if labels.min() < 0 or labels.max() >= classes:
        raise GradExplorerError(
            f"A label is out of range: the model has {classes} classes.",
            f"Use labels in 0..{classes - 1}.",
        )
    if y.dim() > 2 and labels.dim() == 1:
        # One label per image for a dense output: every position is asked for that class.
        labels = labels.view(-1, *([1] * (y.dim() - 2))).expand(y.shape[0], *y.shape[2:])
    return F.cross_entropy(y, labels.long())
