"""A model ready for inspection, with what gradexplorer knows about where it came from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image
from torch import nn


@dataclass
class LoadedModel:
    """A ``nn.Module`` plus the facts the rest of gradexplorer needs about it.

    Attributes
    ----------
    module : nn.Module
        The user's model. gradexplorer never changes its parameters, buffers or mode
        permanently; capture restores ``training`` and ``.grad`` afterwards.
    spec : str
        What the user asked for: ``"resnet18"``, ``"demo:shapes"``, ``"ckpt.pt"``,
        ``"pkg.mod:make_model"``. Loading the same spec again gives the same model.
    name : str
        Short display name ("resnet18", "shapes CNN (demo)").
    weights : str or None
        Which weights were loaded: a torchvision enum name such as
        ``"ResNet18_Weights.IMAGENET1K_V1"``, ``"file:/path/to/weights.pth"``, or ``None``
        for random initialisation.
    categories : list of str or None
        Class names, index-aligned with the classifier's logits.
    preprocess : callable or None
        Turns one RGB ``PIL.Image`` into a ``(C, H, W)`` float tensor
        (``weights.transforms()`` for torchvision weights).
    preprocess_description : str
        What ``preprocess`` does, in words shown to the user.
    input_shape : tuple of int or None
        Shape of one sample, e.g. ``(3, 224, 224)``: used for random batches and to
        explain shape mismatches.
    task : str
        ``"classification"``, ``"segmentation"``, ``"video"``, ``"detection"``,
        ``"optical_flow"``, ``"quantized"``, ``"demo"``, ``"language_model"``,
        ``"token_classification"`` or ``"other"``.
    tokenizer : object or None
        A Hugging Face tokenizer, for text input (``--text``).
    default_target : str or None
        The target the plain ``top1`` stands for with this model: ``"top1,dim=-1,pos=-1"``
        (the predicted next token at the last position) for a causal language model.
    text_padding : str
        Where a batch of texts is padded: ``"right"``, or ``"left"`` for a causal language
        model (so that the last position is every sample's last token).
    init_seed : int or None
        The seed gradexplorer drew random initial weights from (``weights`` is ``None``
        and the architecture was built here), so that loading again gives the same model;
        ``None`` when the weights came from elsewhere.
    tokenizer_problem : str or None
        Why the model's own tokenizer files could not be read ("tokenizer.json is not valid
        JSON ..."), when it has such files and ``tokenizer`` is None: text is then refused
        with this reason rather than as a model without a tokenizer.
    """

    module: nn.Module
    spec: str
    name: str
    weights: str | None = None
    categories: list[str] | None = None
    preprocess: Callable[[Image.Image], torch.Tensor] | None = None
    preprocess_description: str = "none"
    input_shape: tuple[int, ...] | None = None
    task: str = "other"
    notes: list[str] = field(default_factory=list)
    tokenizer: Any = None
    default_target: str | None = None
    text_padding: str = "right"
    init_seed: int | None = None
    tokenizer_problem: str | None = None

    @property
    def weights_label(self) -> str:
        """The weights in words: "random init, seed 0", "file w.pth", an enum name."""
        if self.weights is None:
            return "random init" if self.init_seed is None else f"random init, seed {self.init_seed}"
        if self.weights.startswith("file:"):
            return "file " + self.weights[5:].replace("\\", "/").rsplit("/", 1)[-1]
        return self.weights
