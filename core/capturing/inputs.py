"""A batch of inputs to run through a model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ModelInputs:
    """The arguments of one forward when a model takes several inputs.

    Optical flow takes two images, ``model(frame1, frame2)``; other models take keyword
    arguments, ``model(input_ids=..., attention_mask=...)``. The first tensor is the
    primary input (``Batch.tensor``): the one shown, and the one whose gradient the
    capture records.

    Attributes
    ----------
    args : tuple
        Positional arguments, in order.
    kwargs : dict of str to object
        Keyword arguments.
    """

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def _values(self) -> list[Any]:
        return [*self.args, *self.kwargs.values()]

    @property
    def primary(self) -> torch.Tensor:
        """The first tensor, positional before keyword."""
        return next(v for v in self._values() if isinstance(v, torch.Tensor))

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ModelInputs:
        """The same arguments with ``fn`` applied to every tensor among them."""

        def one(v: Any) -> Any:
            return fn(v) if isinstance(v, torch.Tensor) else v

        return ModelInputs(tuple(one(v) for v in self.args), {k: one(v) for k, v in self.kwargs.items()})

    def to(self, device: torch.device | str) -> ModelInputs:
        """Every tensor moved to ``device``."""
        return self.map(lambda t: t.to(device))

    def __getitem__(self, index: slice) -> ModelInputs:
        """The same samples of every tensor that has the primary's batch size."""
        n = self.primary.shape[0]
        return self.map(lambda t: t[index] if t.dim() and t.shape[0] == n else t)

    def __len__(self) -> int:
        return int(self.primary.shape[0])

    def dim(self) -> int:
        """The primary tensor's number of dimensions."""
        return self.primary.dim()

    def call(self, model: Callable[..., Any], primary: torch.Tensor | None = None) -> Any:
        """``model(*args, **kwargs)``, with ``primary`` (say, the primary input made to
        require grad) in place of the primary tensor."""
        if primary is None:
            return model(*self.args, **self.kwargs)
        first = self.primary
        args = tuple(primary if v is first else v for v in self.args)
        kwargs = {k: primary if v is first else v for k, v in self.kwargs.items()}
        return model(*args, **kwargs)


def call_model(model: Callable[..., Any], inputs: torch.Tensor | ModelInputs) -> Any:
    """Run ``model`` on one tensor or on several inputs (:class:`ModelInputs`)."""
    return inputs.call(model) if isinstance(inputs, ModelInputs) else model(inputs)


def first_tensor_input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The first tensor among one module call's arguments, positional before keyword.

    What a forward pre-hook (``with_kwargs=True``) takes for the module's input: the
    value whose gradient is recorded as ``grad_input``, and the graph's edge into the
    module. ``None`` when the call has no tensor argument.
    """
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


@dataclass
class Batch:
    """Inputs for one capture, with what is needed to show them to the user.

    Attributes
    ----------
    tensor : torch.Tensor
        The preprocessed batch, ``(B, ...)``, on the CPU.
    labels : torch.Tensor or None
        ``(B,)`` int64 class indices, when known (for ``cross_entropy`` targets).
    names : list of str
        One short name per sample (file name, ``"random[0]"``...).
    source : str
        Where the batch came from, in words ("3 images from ~/cats", "random 2x3x224x224").
    preprocessing : str
        The preprocessing that was applied, in words.
    images : list or None
        The original pictures as RGB ``PIL.Image`` (for thumbnails and Grad-CAM overlays),
        when the batch came from images.
    inputs : ModelInputs or None
        All the arguments, for a model that takes several inputs (``tensor`` is the first
        of them); None for one input.
    tokens : list of list of str or None
        For a batch of texts: each sample's token strings, position by position.
    """

    tensor: torch.Tensor
    labels: torch.Tensor | None
    names: list[str]
    source: str
    preprocessing: str = "none"
    images: list | None = None
    inputs: ModelInputs | None = None
    tokens: list[list[str]] | None = None

    def __len__(self) -> int:
        return int(self.tensor.shape[0])

    @property
    def model_input(self) -> torch.Tensor | ModelInputs:
        """What the model is called with: ``tensor``, or every input when there are several."""
        return self.inputs if self.inputs is not None else self.tensor


def describe(batch: Batch) -> str:
    """One line about a batch, for status bars and the CLI.

    Parameters
    ----------
    batch : Batch

    Returns
    -------
    str
        E.g. ``"8 images (3×224×224) from ~/cats, preprocessing: resize ..."``.
    """
    tensor = batch.tensor
    sample = "×".join(str(d) for d in tensor.shape[1:]) if tensor.dim() > 1 else "scalar"
    source = batch.source
    head, sep, tail = source.partition(" from ")
    if sep and head[:1].isdigit():
        text = f"{head} ({sample}) from {tail}"
    else:
        n = int(tensor.shape[0]) if tensor.dim() else 1
        text = f"{n} sample{'s' if n != 1 else ''} ({sample}) from {source}"
    if batch.labels is not None:
        text += ", with labels"
    return f"{text}, preprocessing: {batch.preprocessing}"
