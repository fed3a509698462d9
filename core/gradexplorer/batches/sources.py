"""Choosing the loader for what the user pointed at, and describing the batch it made."""

from __future__ import annotations

import inspect
import itertools
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from gradexplorer.base.errors import BatchError, listing
from gradexplorer.batches.images import load_images
from gradexplorer.batches.labels import parse_labels
from gradexplorer.batches.paths import SOURCES_HINT, missing_source
from gradexplorer.batches.random_batches import (
    looks_like_shape,
    random_batch,
    random_batch_for,
    recipe_for,
)
from gradexplorer.batches.shape_check import check_batch_shape
from gradexplorer.batches.tensor_files import (
    TENSOR_SUFFIXES,
    load_tensor_file,
    looks_like_tensor_file,
)
from gradexplorer.batches.text import load_text
from gradexplorer.capturing.inputs import Batch, ModelInputs
from gradexplorer.models.loaded_model import LoadedModel

#: How a text sample is named among the sources (``gradexplorer.pipeline.options.TEXT_SOURCE``).
TEXT_SOURCE = "text:"


def load_batch(
    sources: Sequence[str],
    model: LoadedModel | None = None,
    labels: str | None = None,
    skip_unreadable: bool = False,
    memory_budget: int | None = None,
) -> Batch:
    """Make a batch from what the user gave on the command line or in the GUI.

    Parameters
    ----------
    sources : sequence of str
        One of:

        - ``"random:2x3x224x224"`` or a bare shape ``"2x3x224x224"``: :func:`random_batch`
          with seed 0. ``"random"`` alone uses two samples of ``model.input_shape``.
        - one ``.pt``/``.pth`` file (or another ``torch.save`` zip archive, such as a
          capture file): :func:`load_tensor_file`.
        - ``"text:the cat sat"`` (one or several, a ``.txt`` file after ``text:`` gives one
          sample per line): tokenised by the model's tokenizer (``gradexplorer.batches.text``).
        - ``"demo"``: the demo batch of the demo model ``model`` (``gradexplorer.models.demos``).
        - image files and folders: :func:`load_images` with the model's preprocess
          (the default ImageNet preprocess when the model has none).
    model : LoadedModel, optional
        Supplies the preprocess, the class names labels are matched against, and the
        input shape the batch is checked against (:func:`check_batch_shape`).
    labels : str, optional
        Class indices or names, e.g. ``"3,1,0"`` or ``"tabby"``; they replace labels
        that came with the batch.
    skip_unreadable : bool
        Among pictures, leave out those that cannot be read (see :func:`load_images`);
        without it, ``UnreadableImages`` names them.
    memory_budget : int, optional
        Bytes (``--memory-budget``) that the tensors of a ``.pt`` file may claim; by
        default half the free RAM (``gradexplorer.base.tensor_memory``).

    Returns
    -------
    Batch

    Raises
    ------
    BatchError
        Nothing was given, a path does not exist, a source cannot be read, the labels
        do not fit, or the batch's shape does not fit the model.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    sources = [str(s) for s in sources if str(s).strip()]
    if not sources:
        raise BatchError("no input was given;", SOURCES_HINT + ".")

    batch: Batch | None
    if all(s.startswith(TEXT_SOURCE) for s in sources):
        _refuse_text_for_pictures(model)
        batch = load_text([s[len(TEXT_SOURCE):] for s in sources], model, memory_budget)
    elif len(sources) == 1:
        batch = _named_source(sources[0].strip(), model, memory_budget)
    else:
        _refuse_tensor_files_among(sources)
        batch = None
    if batch is None:
        batch = _images(sources, model, skip_unreadable)

    if labels is not None and str(labels).strip():
        batch.labels = parse_labels(
            labels, len(batch), model.categories if model is not None else None
        )
    check_batch_shape(batch, model.input_shape if model is not None else None)
    if model is not None and batch.inputs is not None:
        _check_arguments(batch.inputs, model)
    if model is not None:
        _to_model_dtype(batch, model)
    return batch


def _to_model_dtype(batch: Batch, model: LoadedModel) -> None:
    # Pictures and saved tensors arrive in float32, which a fp16/bf16 model refuses
    # ("Input type (torch.FloatTensor) and weight type (CPUBFloat16Type) should be the
    # same"); the user cannot change what the image preprocess makes, so floating inputs
    # take the dtype of the model's floating parameters, as a random batch does. A model
    # that mixes dtypes is left to say what it wants; integer inputs (token ids) are kept.
    dtypes = {t.dtype for t in itertools.chain(model.module.parameters(), model.module.buffers())
              if t.is_floating_point()}
    if len(dtypes) != 1:
        return
    dtype = dtypes.pop()
    inputs = batch.inputs if batch.inputs is not None else ModelInputs((batch.tensor,))
    if not any(isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != dtype
               for v in [*inputs.args, *inputs.kwargs.values()]):
        return
    cast = inputs.map(lambda t: t.to(dtype) if t.is_floating_point() else t)
    batch.tensor = cast.primary
    if batch.inputs is not None:
        batch.inputs = cast
    name = str(dtype).replace("torch.", "")
    step = f"cast to {name} (the model's dtype)"
    batch.preprocessing = step if batch.preprocessing in ("", "none") else f"{batch.preprocessing}; {step}"


def _forward_parameters(model: LoadedModel | None) -> list[str] | None:
    """The parameters the model's forward names (not its ``**kwargs``), or None when unknown."""
    if model is None:
        return None
    try:
        params = inspect.signature(model.module.forward).parameters
    except (TypeError, ValueError):
        return None
    return [name for name, p in params.items()
            if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def _check_arguments(inputs: ModelInputs, model: LoadedModel) -> None:
    # Named inputs must be parameters of the model's forward: a state dict given as the
    # input would otherwise fail deep inside the forward.
    try:
        params = inspect.signature(model.module.forward).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = [name for name in inputs.kwargs if name not in params]
    if unknown:
        raise BatchError(
            f"the input file names {listing(unknown)}, which the model's forward does not "
            f"take (it takes {listing(list(params)) or 'no arguments'});",
            "name each entry after the forward's argument it is and leave out those it does not take, "
            "or save the tensors as a tuple in their order.",
        )


def _named_source(source: str, model: LoadedModel | None, memory_budget: int | None = None) -> Batch | None:
    # The single-source kinds: demo, random, a shape, a tensor file. None means images.
    path = Path(source).expanduser()
    if path.exists():
        if not looks_like_tensor_file(path):
            return None
        return load_tensor_file(path, memory_budget=memory_budget, forward_args=_forward_parameters(model))
    lowered = source.lower()
    if lowered == "demo":
        if model is None:
            raise BatchError(
                "'demo' inputs need a demo model;", "load a model such as 'demo:shapes' first."
            )
        from gradexplorer.models.demos import demo_batch  # imported late to keep gradexplorer.batches light

        return demo_batch(model.spec)
    if lowered == "random" or lowered.startswith("random:"):
        return _random(source[len("random:"):].strip(), model)
    if looks_like_shape(source):
        return _random(source, model)
    return None


def _random(shape: str, model: LoadedModel | None) -> Batch:
    # Values follow the model (dtype, token ids); the shape too when none is given.
    module = model.module if model is not None else None
    if shape:
        return random_batch(shape, seed=0, recipe=recipe_for(module))
    batch = random_batch_for(module, model.input_shape if model is not None else None)
    if batch is None:
        raise BatchError(
            "a random batch needs a shape here: the model's input shape is not known;",
            "give the full shape, e.g. 2x3x224x224.",
        )
    return batch


def _refuse_tensor_files_among(sources: list[str]) -> None:
    tensor_files = [s for s in sources if Path(s).suffix.lower() in TENSOR_SUFFIXES]
    if tensor_files:
        raise BatchError(
            f"'{tensor_files[0]}' is a tensor file, which must be the only input;",
            "give either one .pt file or image files and folders.",
        )


def _refuse_text_for_pictures(model: LoadedModel | None) -> None:
    """Text given to a model that takes pictures (no tokenizer, an input of channels × height ×
    width): say so, and what it takes. The general words for a model without a tokenizer
    suggest a file of token ids, which a picture model cannot take either."""
    if model is None or getattr(model, "tokenizer", None) is not None:
        return
    shape = model.input_shape
    pictures = shape is not None and len(shape) in (3, 4) and recipe_for(model.module).vocab is None
    if not pictures:
        return
    size = "×".join(str(d) for d in shape) if shape is not None else ""
    raise BatchError(
        f"'{model.spec}' takes pictures ({size}), not text;",
        "open pictures (--input with image files or a folder; in the window, Images…) or a random batch, "
        "or choose a language model saved with its tokenizer (hf:ORG/NAME) to give it text.",
    )


def _images(sources: list[str], model: LoadedModel | None, skip_unreadable: bool = False) -> Batch:
    for source in sources:
        if not Path(source).expanduser().exists():
            raise missing_source(source)
    vocab = recipe_for(model.module).vocab if model is not None else None
    takes_pictures = model is not None and any(
        isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)) for m in model.module.modules())
    if vocab is not None and not takes_pictures:
        # Pictures would reach the embedding as floats and fail deep in forward. A model with
        # picture convolutions too (text and vision) may well take them: it is left to try.
        raise BatchError(
            f"this model starts with an embedding of {vocab} tokens: it takes token ids, not pictures;",
            f"give a .pt file holding a (batch, length) int64 tensor of ids from 0 to {vocab - 1}, "
            "or a random batch.",
        )
    if model is not None and model.preprocess is not None:
        return load_images(sources, model.preprocess, model.preprocess_description,
                           skip_unreadable=skip_unreadable)
    return load_images(sources, skip_unreadable=skip_unreadable)
