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
from gradexplorer.batches.text import load_text, token_strings
from gradexplorer.capturing import compiled
from gradexplorer.capturing.inputs import Batch, ModelInputs
from gradexplorer.hooks.installed import model_device
from gradexplorer.models.input_size import declared_input_shape
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.pipeline.options import CaptureOptions

__all__ = ["LIVE_PREFIX", "LIVE_WEIGHTS", "LiveOptions", "LiveRequest", "is_live", "live_batch", "live_model",
           "live_request"]

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
               input_shape: tuple[int, ...] | None = None, tokenizer: Any = None) -> LoadedModel:
    """The user's ``module`` as a model a session can show and run.

    Parameters
    ----------
    module : nn.Module
        Used as it is: not copied, not moved, not put in eval mode here (each capture
        sets the mode it runs in and restores the one it found). A model under
        ``torch.compile`` is shown through its eager module (``_orig_mod``, the same
        parameters), whose hooks fire. A transformers model is read as an ``hf:`` one is:
        a classifier's class names, a causal language model's ``top1`` as its next token.
    name : str, optional
        Shown in the window; the class name by default.
    categories : sequence of str, optional
        Class names, index-aligned with the logits (targets and labels by name).
    input_shape : tuple of int, optional
        One sample's shape, for the random batches the window offers.
    tokenizer : optional
        A Hugging Face tokenizer: text can be given as the batch, and token strings are
        shown in place of positions.

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
    notes = []
    eager = compiled.eager_root(module)
    if eager is not module:
        notes.append("Compiled with torch.compile: shown and captured through its eager module (the same "
                     "parameters), whose hooks fire.")
        module = eager
    label = name or type(module).__name__
    where = model_device(module)
    notes.insert(0, f"Handed over in memory ({type(module).__module__}.{type(module).__qualname__})"
                 + (f", on {where}" if where is not None else "") + ".")
    task, default_target, padding = ("classification" if categories is not None else "other"), None, "right"
    if type(module).__module__.startswith("transformers.") and hasattr(module, "config"):
        # Deferred: hf_models brings the weight tables of torchvision's models (torchvision's
        # import, docs/benchmarks.md "Start-up"), which only a transformers model needs.
        from gradexplorer.models.hf_models import hf_traits

        traits = hf_traits(module)
        task, default_target, padding = traits.task, traits.default_target, traits.text_padding
        if categories is None and traits.categories is not None:
            categories = traits.categories
    shape = tuple(int(d) for d in input_shape) if input_shape is not None else declared_input_shape(module)
    return LoadedModel(
        module=module, spec=LIVE_PREFIX + label, name=label, weights=LIVE_WEIGHTS,
        categories=list(categories) if categories is not None else None,
        input_shape=shape, task=task, notes=notes, tokenizer=tokenizer, default_target=default_target,
        text_padding=padding,
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
    # ModelInputs.primary refuses inputs without a tensor, naming them.
    primary = model_input.primary if isinstance(model_input, ModelInputs) else model_input
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
class LiveOptions:
    """The run options ``gradexplorer.explore`` takes, passed whole to :func:`live_request`.

    They mean what the ``capture`` command's flags mean (``--layers``, ``--target``,
    ``--labels``, ``--device``, ``--stats-only`` as ``mode="stats"``, ``--train``,
    ``--input-grad``, ``--autocast``, ``--memory-budget``), with what a caller's process
    has beyond a command line: ``labels`` may also be class indices (a tensor or a list of
    ints), one per sample, and ``device=None`` is wherever the model is.
    """

    layers: str | Sequence[str] | None = None
    target: str = "top1"
    labels: Any = None
    device: str | None = None
    mode: str = "full"
    train: bool = False
    input_grad: bool = False
    autocast: str | None = None
    memory_budget: int | None = None

    def capture_options(self, spec: str, module: nn.Module) -> CaptureOptions:
        """The pipeline's options for the model named ``spec`` (``module``: where it is), checked
        as the command line's are; labels given as indices stay with the batch instead."""
        device = self.device
        if device is None:
            where = model_device(module)
            device = str(where) if where is not None else "cpu"
        layers = (self.layers,) if isinstance(self.layers, str) else tuple(self.layers or ())
        return CaptureOptions(
            spec, labels=self.labels if isinstance(self.labels, str) else None, layers=layers, target=self.target,
            device=device, mode=self.mode, train=self.train, input_grad=self.input_grad, autocast=self.autocast,
            memory_budget=self.memory_budget,
        )


@dataclass(frozen=True)
class LiveRequest:
    """What ``gradexplorer.explore`` hands the window: the model, the batch, the run settings."""

    loaded: LoadedModel
    batch: Batch | None
    options: CaptureOptions


def live_request(module: nn.Module, inputs: Any = None, options: LiveOptions | None = None, *,
                 name: str | None = None, categories: Sequence[str] | None = None,
                 tokenizer: Any = None) -> LiveRequest:
    """Check everything ``explore`` was given before a window opens.

    ``options`` are the run options (:class:`LiveOptions`; the defaults when ``None``);
    ``name``, ``categories`` and ``tokenizer`` describe the model (:func:`live_model`).
    With a ``tokenizer``, ``inputs`` may be text (a string, or a list of them: one sample
    each), tokenised as ``--text`` is, and token ids given as tensors are shown as their
    token strings.

    Raises
    ------
    GradExplorerError
        A bad option, in the words the command line uses.
    """
    options = options or LiveOptions()
    loaded = live_model(module, name=name, categories=categories, tokenizer=tokenizer)
    batch = _live_inputs(inputs, loaded, options, tokenizer)
    if batch is not None and loaded.input_shape is None:
        loaded.input_shape = tuple(int(d) for d in batch.tensor.shape[1:])
    return LiveRequest(loaded, batch, options.capture_options(loaded.spec, module))


def _live_inputs(inputs: Any, loaded: LoadedModel, options: LiveOptions, tokenizer: Any) -> Batch | None:
    """The caller's inputs as a batch (text tokenised; labels given as indices attached), or
    ``None`` without inputs."""
    labels = options.labels
    batch = None
    if _is_text(inputs):
        if tokenizer is None:
            shown = repr(inputs if isinstance(inputs, str) else inputs[0])[:60]
            raise GradExplorerError(
                f"the inputs are text ({shown}), which a model cannot be called with here, and no tokenizer "
                "was given to turn it into token ids;",
                "for text, pass the model's tokenizer: gradexplorer.explore(model, texts, tokenizer=tokenizer); "
                "otherwise pass a tensor, a tuple or a dict of tensors (pictures: load them first, or open them "
                "in the window's Input batch panel).")
        batch = load_text([inputs] if isinstance(inputs, str) else list(inputs), loaded, options.memory_budget)
    elif inputs is not None:
        batch = live_batch(inputs, labels=labels if not isinstance(labels, str) else None)
        if tokenizer is not None:
            batch.tokens = _tokens_of(batch, tokenizer)
    if batch is not None and labels is not None and not isinstance(labels, str) and batch.labels is None:
        batch.labels = live_batch(batch.tensor, labels=labels).labels
    return batch


def _is_text(inputs: Any) -> bool:
    return isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and bool(inputs)
                                       and all(isinstance(t, str) for t in inputs))


def _tokens_of(batch: Batch, tokenizer: Any) -> list[list[str]] | None:
    """Each sample's token strings, when the batch is token ids (``input_ids``, or an integer
    ``(B, T)`` first tensor) that the tokenizer can name; padding (attention mask 0) as ``[pad]``."""
    kwargs = batch.inputs.kwargs if batch.inputs is not None else {}
    ids = kwargs.get("input_ids", batch.tensor)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        return None
    mask = kwargs.get("attention_mask")
    masks = mask.tolist() if isinstance(mask, torch.Tensor) and tuple(mask.shape) == tuple(ids.shape) else None
    try:
        return [token_strings(tokenizer, row, masks[i] if masks is not None else None)
                for i, row in enumerate(ids.tolist())]
    except Exception:  # noqa: BLE001 - ids this tokenizer cannot name: positions are shown instead
        return None
