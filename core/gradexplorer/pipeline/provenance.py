"""Where a capture came from: the model, batch and option part of its metadata.

The job fills it once its model and batch are loaded; ``gradexplorer.files.meta`` holds
the schema (``SOURCE_KEYS``) and reads it back.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from gradexplorer.capturing.inputs import describe

if TYPE_CHECKING:
    from gradexplorer.capturing.inputs import Batch
    from gradexplorer.models.loaded_model import LoadedModel
    from gradexplorer.pipeline.options import CaptureOptions


def build_meta(loaded: LoadedModel, batch: Batch, labels: torch.Tensor | None,
               options: CaptureOptions) -> dict:
    """The model, batch and option part of a capture's metadata (version 2 schema).

    Parameters
    ----------
    loaded : LoadedModel
        The model that runs (its spec, name, weights and categories are recorded).
    batch : Batch
        The batch that runs.
    labels : Tensor or None
        The labels the target uses (the options' labels, else the batch's own).
    options : CaptureOptions

    Returns
    -------
    dict
        Plain values only, every key of ``SOURCE_KEYS``.
    """
    return {
        "model": loaded.spec,
        "model_name": loaded.name,
        "weights": loaded.weights,
        "arch": options.arch,
        "categories": list(loaded.categories) if loaded.categories is not None else None,
        "task": loaded.task,
        "batch": describe(replace(batch, labels=labels)),
        "batch_source": batch.source,
        "sample_names": [str(n) for n in batch.names],
        "preprocessing": batch.preprocessing,
        "labels": [int(v) for v in labels.tolist()] if labels is not None else None,
        "input_grad": bool(options.input_grad),
        "autocast": options.autocast,
        **({"tokens": [list(t) for t in batch.tokens]} if batch.tokens is not None else {}),
    }
