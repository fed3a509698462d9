"""A batch of inputs to run through a model."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
    """

    tensor: torch.Tensor
    labels: torch.Tensor | None
    names: list[str]
    source: str
    preprocessing: str = "none"
    images: list | None = None

    def __len__(self) -> int:
        return int(self.tensor.shape[0])
