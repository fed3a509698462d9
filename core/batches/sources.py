"""Choosing the loader for what the user pointed at, and describing the batch it made."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from core.batch import Batch
from core.batches.images import load_images
from core.batches.labels import parse_labels
from core.batches.paths import SOURCES_HINT, missing_source
from core.batches.random_batches import looks_like_shape, random_batch
from core.batches.shape_check import check_batch_shape
from core.batches.tensor_files import TENSOR_SUFFIXES, load_tensor_file, looks_like_tensor_file
from core.errors import BatchError
from core.loaded_model import LoadedModel


def load_batch(
    sources: Sequence[str],
    model: LoadedModel | None = None,
    labels: str | None = None,
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
        - ``"demo"``: the demo batch of the demo model ``model`` (``core.demos``).
        - image files and folders: :func:`load_images` with the model's preprocess
          (the default ImageNet preprocess when the model has none).
    model : LoadedModel, optional
        Supplies the preprocess, the class names labels are matched against, and the
        input shape the batch is checked against (:func:`check_batch_shape`).
    labels : str, optional
        Class indices or names, e.g. ``"3,1,0"`` or ``"tabby"``; they replace labels
        that came with the batch.

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

    if len(sources) == 1:
        batch = _named_source(sources[0].strip(), model)
    else:
        _refuse_tensor_files_among(sources)
        batch = None
    if batch is None:
        batch = _images(sources, model)

    if labels is not None and str(labels).strip():
        batch.labels = parse_labels(
            labels, len(batch), model.categories if model is not None else None
        )
    check_batch_shape(batch, model.input_shape if model is not None else None)
    return batch


def _named_source(source: str, model: LoadedModel | None) -> Batch | None:
    # The single-source kinds: demo, random, a shape, a tensor file. None means images.
    path = Path(source).expanduser()
    if path.exists():
        return load_tensor_file(path) if looks_like_tensor_file(path) else None
    lowered = source.lower()
    if lowered == "demo":
        if model is None:
            raise BatchError(
                "'demo' inputs need a demo model;", "load a model such as 'demo:shapes' first."
            )
        from core.demos import demo_batch  # imported late to keep core.batches light

        return demo_batch(model.spec)
    if lowered == "random" or lowered.startswith("random:"):
        return _random(source[len("random:"):].strip(), model)
    if looks_like_shape(source):
        return random_batch(source, seed=0)
    return None


def _random(shape: str, model: LoadedModel | None) -> Batch:
    if shape:
        return random_batch(shape, seed=0)
    input_shape = model.input_shape if model is not None else None
    if input_shape is not None and all(d is not None for d in input_shape):
        return random_batch((2, *input_shape), seed=0)
    raise BatchError(
        "'random' needs a shape, and the model's input shape is not known;",
        "give the full shape, e.g. 'random:2x3x224x224'.",
    )


def _refuse_tensor_files_among(sources: list[str]) -> None:
    tensor_files = [s for s in sources if Path(s).suffix.lower() in TENSOR_SUFFIXES]
    if tensor_files:
        raise BatchError(
            f"'{tensor_files[0]}' is a tensor file, which must be the only input;",
            "give either one .pt file or image files and folders.",
        )


def _images(sources: list[str], model: LoadedModel | None) -> Batch:
    for source in sources:
        if not Path(source).expanduser().exists():
            raise missing_source(source)
    if model is not None and model.preprocess is not None:
        return load_images(sources, model.preprocess, model.preprocess_description)
    return load_images(sources)


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

