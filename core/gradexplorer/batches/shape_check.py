"""Checking that a batch can be fed to a model of a known input shape."""

from __future__ import annotations

from collections.abc import Sequence

from gradexplorer.base.errors import BatchError
from gradexplorer.capturing.inputs import Batch


def _fmt_shape(dims: Sequence) -> str:
    inner = ", ".join("?" if d is None else str(d) for d in dims)
    return f"({inner},)" if len(dims) == 1 else f"({inner})"


def check_batch_shape(batch: Batch, input_shape: tuple[int, ...] | None) -> None:
    """Check that a batch can be fed to a model with the given per-sample shape.

    Only the rank and the first per-sample size (channels for images and video,
    features for 1-D inputs) are compared. Spatial and temporal sizes may differ,
    because convolutional networks accept any size; models that need one fixed size
    (vision transformers) fail in forward, where that error is reported.

    Parameters
    ----------
    batch : Batch
        The batch to check.
    input_shape : tuple of int or None
        The model's shape for one sample, e.g. ``(3, 224, 224)``. ``None`` (unknown)
        skips the check; ``None`` entries are not compared.

    Raises
    ------
    BatchError
        The batch's rank differs (a missing batch dimension is named as such) or its
        channel count differs. The message gives the expected shape, e.g.
        ``(B, 3, 224, 224)``, and the one given.
    """
    if batch.tensor is not None and batch.tensor.numel() == 0:  # as --random 0x10 is refused
        raise BatchError(f"the input has shape {_fmt_shape(tuple(batch.tensor.shape))}: "
                         f"{'no samples' if batch.tensor.dim() and batch.tensor.shape[0] == 0 else 'no values'};",
                         "give a batch of at least one sample, every size at least 1.")
    if input_shape is None:
        return
    given = tuple(batch.tensor.shape)
    expected = ("B", *input_shape)
    expected_text = "(" + ", ".join("?" if d is None else str(d) for d in expected) + ")"
    given_text = _fmt_shape(given)
    if len(given) != len(expected):
        problem = f"the input has shape {given_text}, but the model expects {expected_text}"
        if len(given) == len(input_shape):
            raise BatchError(
                f"{problem}: the batch dimension is missing;",
                "add a batch dimension with x.unsqueeze(0) (for one sample) before saving the input.",
            )
        if len(given) == len(expected) + 1 and given[0] == 1:
            raise BatchError(
                f"{problem}: it has one dimension too many;",
                "remove the extra leading dimension with x.squeeze(0).",
            )
        fix = f"give a tensor with {len(expected)} dimensions, {expected_text}."
        raise BatchError(f"{problem} ({len(given)} dimensions instead of {len(expected)});", fix)

    want = input_shape[0] if input_shape else None
    have = given[1] if len(given) > 1 else None
    if want is not None and have is not None and have != want:
        unit = "channel" if len(input_shape) >= 2 else "feature"
        problem = (
            f"the input has shape {given_text}, but the model expects {expected_text}: "
            f"{have} {unit}{'s' if have != 1 else ''} instead of {want};"
        )
        if unit == "channel" and have == 1 and want == 3:
            fix = (
                "give RGB images (image files are converted to RGB), or repeat the channel "
                "with x.expand(-1, 3, *x.shape[2:])."
            )
        elif unit == "channel" and have == 3 and want == 1:
            fix = "convert to grayscale, e.g. x.mean(1, keepdim=True), or choose a model for RGB inputs."
        elif unit == "channel" and have == 4 and want == 3:
            fix = "drop the alpha channel with x[:, :3], or load the images as files (alpha is composited onto white)."
        else:
            fix = f"give inputs with {want} {unit}s, {expected_text}."
        raise BatchError(problem, fix)

