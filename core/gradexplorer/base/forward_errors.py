"""What to tell the user when the model's own forward raises (in the probe or the capture).

The exception comes from the user's model, so the advice must match its cause: a shape hint
for a shape error only, the BatchNorm rule for a batch of one in train mode, the dtype for a
dtype error, and otherwise that the model itself failed on this batch. Words for both front
ends: CLI flags, and what the window calls them.
"""

from __future__ import annotations

import re

# torch's messages for inputs of the wrong shape (conv, linear, matmul, cat, view, pooling).
_SHAPE = re.compile(
    r"shape|size mismatch|mat1 and mat2|must match the size|sizes of tensors|expected input|"
    r"expected .*(?:dimension|channels|dim)|to have \d+ channels|input size|"
    r"not enough values|too many values|invalid for input of size|output size is too small",
    re.IGNORECASE,
)
_DTYPE = re.compile(r"scalar type|dtype|expected .* to have one of the following scalar types|"
                    r"not implemented for '(?:Half|BFloat16|Long|Int|Bool)'", re.IGNORECASE)
_BATCHNORM_ONE = "Expected more than 1 value per channel when training"
# Python's words when forward(a, b) gets one tensor: a model of several inputs given one.
_MISSING_INPUTS = re.compile(r"forward\(\) missing \d+ required (?:positional|keyword-only) argument")

SHAPE_FIX = "Check that the batch has the shape the model expects."


def forward_fix(exc: BaseException) -> str:
    """The fix to suggest for an exception raised by the model's forward.

    Parameters
    ----------
    exc : BaseException
        What the model raised.

    Returns
    -------
    str
        One sentence: a batch of two for BatchNorm in train mode, the shape hint for shape
        errors, the input's dtype for dtype errors, else to check the model on this batch.
    """
    text = str(exc)
    if isinstance(exc, TypeError) and _MISSING_INPUTS.search(text):
        return ("The model's forward takes more inputs than the batch gives: save them in one .pt file, "
                "as a tuple in the forward's order or a dict named after its arguments, and give that "
                "file as the input (--input FILE.pt; in the window, the batch panel's More ▸ Tensor file). A random "
                "batch makes one tensor only.")
    if _BATCHNORM_ONE in text:
        return ("BatchNorm cannot train on one sample per channel: use a batch of 2 or more, or eval "
                "mode (leave out --train; in the window, choose eval).")
    if _DTYPE.search(text):
        return "Check the input's dtype (token ids must be integers, images floating point)."
    if _SHAPE.search(text):
        return SHAPE_FIX
    return "The error is raised by the model's own code on this batch; check that the model runs on it."
