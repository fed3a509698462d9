"""A model and a batch that already live in the user's process, made ready for a session.

``gradexplorer.explore(model, x)`` opens the window on objects a notebook or a script
already holds: nothing is loaded, nothing needs trust (the code is the user's own, and it
has already run). This module turns them into what every front end shares: a
:class:`~gradexplorer.models.loaded_model.LoadedModel` that says where it came from, a
:class:`~gradexplorer.capturing.inputs.Batch`, and the run options the caller passed,
checked the way the command line checks its flags.

The user's objects are never changed here: the batch's tensors are detached views on the
CPU (copies only when they live on another device), and the model is wrapped, not moved.
The capture itself restores hooks, modes, BatchNorm statistics, ``.grad`` and device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.inputs import Batch, ModelInputs
from gradexplorer.hooks.installed import model_device
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.options import CaptureOptions

__all__ = ["LIVE_PREFIX", "LIVE_WEIGHTS", "LiveRequest", "is_live", "live_batch", "live_model", "live_request"]

#: The spec of a model that came from the user's process: ``"live:ResNet"``. Never loaded
#: again by name (there is nothing on disk to load), never kept among the recent models.
LIVE_PREFIX = "live:"

#: What ``LoadedModel.weights`` says of a live model: its parameters are whatever the
#: user's object holds.
LIVE_WEIGHTS = "in memory (the caller's model)"


def is_live(spec: str | None) -> bool:
    """Whether ``spec`` names a model handed over in memory (``live_model``)."""
    return bool(spec) and str(spec).startswith(LIVE_PREFIX)


def live_model(module: nn.Module, *, name: str | None = None, categories: Sequence[str] | None = None,
               input_shape: tuple[int, ...] | None = None) -> LoadedModel:
    """The user's ``module`` as a model a session can show and run.

    Parameters
    ----------
    module : nn.Module
        Used as it is: not copied, not moved, not put in eval mode here (each capture
        sets the mode it runs in and restores the one it found).
    name : str, optional
        Shown in the window; the class name by default.
    categories : sequence of str, optional
        Class names, index-aligned with the logits (targets and labels by name).
    input_shape : tuple of int, optional
        One sample's shape, for the random batches the window offers.

    Raises
    ------
    GradExplorerError
        ``module`` is not a ``torch.nn.Module``.
    """
    if not isinstance(module, nn.Module):
        raise GradExplorerError(
            f"gradexplorer.explore needs a torch.nn.Module, not {type(module).__name__};",
            "pass the model object itself (a compiled model's original module, model._orig_mod, works too), "
            "or a Capture to open one.")
    label = name or type(module).__name__
    where = model_device(module)
    notes = [f"Handed over in memory ({type(module).__module__}.{type(module).__qualname__})"
             + (f", on {where}" if where is not None else "") + "."]
    return LoadedModel(
        module=module, spec=LIVE_PREFIX + label, name=label, weights=LIVE_WEIGHTS,
        categories=list(categories) if categories is not None else None,
        input_shape=tuple(int(d) for d in input_shape) if input_shape is not None else None,
        task="classification" if categories is not None else "other", notes=notes,
    )


def _cpu(value: Any) -> Any:
    # Detached so that the batch never holds the caller's autograd graph; on the CPU
    # because the views draw from it (the capture moves it to the run's device).
    if isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value.detach()
    return value


def _model_inputs(inputs: Any) -> torch.Tensor | ModelInputs:
    if isinstance(inputs, torch.Tensor):
        return _cpu(inputs)
    if isinstance(inputs, ModelInputs):
        return inputs.map(_cpu)
    if isinstance(inputs, Mapping):
        bad = [k for k in inputs if not isinstance(k, str)]
        if bad:
            raise GradExplorerError(f"the inputs dict has a key that is not a name ({bad[0]!r});",
                                    "give the forward's keyword arguments by name, as model(**inputs) takes them.")
        return ModelInputs((), {k: _cpu(v) for k, v in inputs.items()})
    if isinstance(inputs, (tuple, list)):
        return ModelInputs(tuple(_cpu(v) for v in inputs), {})
    raise GradExplorerError(
        f"the inputs are a {type(inputs).__name__}, which a model cannot be called with here;",
        "pass a tensor (model(x)), a tuple of the positional arguments (model(*args)) or a dict of the "
        "keyword arguments (model(**kwargs)), with the batch first in every tensor.")


def live_batch(inputs: Any, *, labels: Any = None, names: Sequence[str] | None = None) -> Batch:
    """The user's inputs as a batch.

    Parameters
    ----------
    inputs : Tensor, tuple, list, dict or ModelInputs
        What the model is called with: ``model(x)``, ``model(*inputs)`` or
        ``model(**inputs)``. The first tensor is the batch shown and whose gradient
        ``input_grad`` records; every tensor with its batch size is one sample per row.
    labels : Tensor or sequence of int, optional
        Class indices, one per sample (for ``cross_entropy`` targets).
    names : sequence of str, optional
        One name per sample; ``"sample 0"``, ``"sample 1"``... by default.

    Raises
    ------
    GradExplorerError
        No tensor among the inputs, a batch of no samples, labels of the wrong length.
    """
    model_input = _model_inputs(inputs)
    try:
        primary = model_input.primary if isinstance(model_input, ModelInputs) else model_input
    except StopIteration:
        raise GradExplorerError("the inputs hold no tensor;",
                                "pass the batch as a tensor, or among the arguments the model takes.") from None
    if primary.dim() == 0:
        raise GradExplorerError(f"the input is a single number ({primary.item()!r}), not a batch;",
                                "give a tensor whose first dimension is the batch, e.g. x.unsqueeze(0).")
    n = int(primary.shape[0])
    if n == 0:
        raise GradExplorerError(f"the batch has no samples (shape {tuple(primary.shape)});",
                                "give at least one sample: the first dimension is the batch.")
    label_tensor = None
    if labels is not None:
        label_tensor = torch.as_tensor(labels).detach().cpu().reshape(-1)
        if label_tensor.is_floating_point() or label_tensor.dtype == torch.bool or label_tensor.is_complex():
            raise GradExplorerError(f"labels must be class indices (integers), not {label_tensor.dtype};",
                                    "pass e.g. torch.tensor([3, 7]) or [3, 7], one per sample.")
        if len(label_tensor) != n:
            raise GradExplorerError(f"{len(label_tensor)} labels for {n} samples;", "give one label per sample.")
        label_tensor = label_tensor.to(torch.int64)
    sample_names = [str(x) for x in names] if names is not None else [f"sample {i}" for i in range(n)]
    if len(sample_names) != n:
        raise GradExplorerError(f"{len(sample_names)} names for {n} samples;", "give one name per sample.")
    shape = "×".join(str(d) for d in primary.shape)
    several = isinstance(model_input, ModelInputs) and len(model_input.args) + len(model_input.kwargs) > 1
    return Batch(
        tensor=primary, labels=label_tensor, names=sample_names,
        source=f"the caller's batch ({shape}{', with more inputs' if several else ''})",
        inputs=model_input if isinstance(model_input, ModelInputs) else None,
    )


@dataclass(frozen=True)
class LiveRequest:
    """What ``gradexplorer.explore`` hands the window: the model, the batch, the run settings."""

    loaded: LoadedModel
    batch: Batch | None
    options: CaptureOptions


def live_request(module: nn.Module, inputs: Any = None, *, layers: str | Sequence[str] | None = None,
                 target: str = "top1", labels: Any = None, device: str | None = None, mode: str = "full",
                 train: bool = False, input_grad: bool = False, autocast: str | None = None,
                 memory_budget: int | None = None, name: str | None = None,
                 categories: Sequence[str] | None = None) -> LiveRequest:
    """Check everything ``explore`` was given before a window opens.

    The options mean what the ``capture`` command's flags mean (``--layers``,
    ``--target``, ``--labels``, ``--device``, ``--stats-only`` as ``mode="stats"``,
    ``--train``, ``--input-grad``, ``--autocast``, ``--memory-budget``). ``labels`` may
    also be class indices (a tensor or a list of ints), one per sample. ``device``
    defaults to where the model is, so a model on a GPU runs there.

    Raises
    ------
    GradExplorerError
        A bad option, in the words the command line uses.
    """
    loaded = live_model(module, name=name, categories=categories)
    batch = live_batch(inputs, labels=labels if not isinstance(labels, str) else None) if inputs is not None else None
    if batch is not None and loaded.input_shape is None:
        loaded.input_shape = tuple(int(d) for d in batch.tensor.shape[1:])
    if device is None:
        where = model_device(module)
        device = str(where) if where is not None else "cpu"
    options = CaptureOptions(
        loaded.spec, labels=labels if isinstance(labels, str) else None,
        layers=(layers,) if isinstance(layers, str) else tuple(layers or ()), target=target, device=device,
        mode=mode, train=train, input_grad=input_grad, autocast=autocast, memory_budget=memory_budget,
    )
    return LiveRequest(loaded, batch, options)
