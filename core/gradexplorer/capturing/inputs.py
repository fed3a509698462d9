"""A batch of inputs to run through a model."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gradexplorer.base.errors import GradExplorerError


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in ``value``, depth first: itself, or those inside its tuples, lists and
    dicts (the order of a dict's entries)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _tensors_in(v)
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors_in(v)


def _mapped(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with ``fn`` applied to every tensor in it, containers rebuilt as they were
    (a namedtuple stays one, a dict keeps its order and type where it can)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Mapping):
        items = {k: _mapped(v, fn) for k, v in value.items()}
        kind: Any = type(value)
        try:
            return kind(items)
        except Exception:  # noqa: BLE001 - a mapping type that cannot be built from a dict
            return items
    if isinstance(value, tuple):
        items_t = [_mapped(v, fn) for v in value]
        return type(value)(*items_t) if hasattr(value, "_fields") else type(value)(items_t)
    if isinstance(value, list):
        return [_mapped(v, fn) for v in value]
    return value


@dataclass
class ModelInputs:
    """The arguments of one forward when a model takes several inputs.

    Optical flow takes two images, ``model(frame1, frame2)``; other models take keyword
    arguments, ``model(input_ids=..., attention_mask=...)``, or one argument that holds
    several tensors, ``model((image, mask))`` or ``model({"x": x, "edges": e})``. The first
    tensor, depth first, positional before keyword, is the primary input (``Batch.tensor``):
    the one shown, and the one whose gradient the capture records.

    Attributes
    ----------
    args : tuple
        Positional arguments, in order; each a tensor, a value, or a tuple, list or dict
        holding tensors.
    kwargs : dict of str to object
        Keyword arguments, the same.
    """

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def _values(self) -> list[Any]:
        return [*self.args, *self.kwargs.values()]

    @property
    def primary(self) -> torch.Tensor:
        """The first tensor, positional before keyword, depth first inside containers.

        Raises
        ------
        GradExplorerError
            No argument holds a tensor.
        """
        for value in self._values():
            for t in _tensors_in(value):
                return t
        shown = [f"#{i + 1} {type(v).__name__}" for i, v in enumerate(self.args)]
        shown += [f"{k}={type(v).__name__}" for k, v in self.kwargs.items()]
        raise GradExplorerError(
            f"the inputs hold no tensor ({', '.join(shown) or 'no arguments'});",
            "pass the batch as a tensor among the arguments the model takes (alone, or in a tuple, list or dict).")

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ModelInputs:
        """The same arguments with ``fn`` applied to every tensor among them (inside
        tuples, lists and dicts too)."""
        return ModelInputs(tuple(_mapped(v, fn) for v in self.args),
                           {k: _mapped(v, fn) for k, v in self.kwargs.items()})

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
        require grad) in place of the primary tensor, wherever it sits."""
        if primary is None:
            return model(*self.args, **self.kwargs)
        first = self.primary
        swapped = self.map(lambda t: primary if t is first else t)
        return model(*swapped.args, **swapped.kwargs)


def call_model(model: Callable[..., Any], inputs: torch.Tensor | ModelInputs) -> Any:
    """Run ``model`` on one tensor or on several inputs (:class:`ModelInputs`)."""
    return inputs.call(model) if isinstance(inputs, ModelInputs) else model(inputs)


def first_tensor_input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The first tensor among one module call's arguments, positional before keyword.

    What a forward pre-hook (``with_kwargs=True``) takes for the module's input: the
    value whose gradient is recorded as ``grad_input``, and the graph's edge into the
    module. ``None`` when the call has no tensor argument.
    """
    for value in args:
        if isinstance(value, torch.Tensor):
            return value
    for value in kwargs.values():
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
