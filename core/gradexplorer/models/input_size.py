"""The input size a model declares about itself: timm's ``pretrained_cfg["input_size"]``,
Hugging Face vision configs' ``image_size``.

A model that says what it takes is believed before any guess from its first layer (the
random batch's ``(C, 64, 64)``): a vision transformer's patch embedding refuses any other
size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import nn

__all__ = ["declared_input_shape"]


def declared_input_shape(module: nn.Module | None) -> tuple[int, ...] | None:
    """The shape of one sample ``module`` declares, e.g. ``(3, 224, 224)``, or None.

    Parameters
    ----------
    module : nn.Module or None
        A timm model (``pretrained_cfg["input_size"]``, also a compiled one's
        ``_orig_mod``) or a Hugging Face vision model (``config.image_size`` and
        ``config.num_channels``, default 3 channels).

    Returns
    -------
    tuple of int or None
        None when the model declares nothing usable.
    """
    if module is None:
        return None
    module = getattr(module, "_orig_mod", module)
    cfg = getattr(module, "pretrained_cfg", None)
    if isinstance(cfg, Mapping):
        shape = _ints(cfg.get("input_size"))
        if shape is not None and len(shape) >= 2:
            return shape
    config = getattr(module, "config", None)
    size = getattr(config, "image_size", None) if config is not None else None
    if size is not None:
        side = _ints([size] if isinstance(size, int) else size)
        channels = getattr(config, "num_channels", 3)
        if side is not None and isinstance(channels, int) and channels > 0:
            if len(side) == 1:
                side = (side[0], side[0])
            if len(side) == 2:
                return (channels, *side)
    return None


def _ints(value: object) -> tuple[int, ...] | None:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value):
        return None
    return tuple(int(d) for d in value)
