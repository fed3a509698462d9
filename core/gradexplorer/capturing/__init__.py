"""Capture: one forward and backward pass with hooks, and what it records.

Modules
-------
capture
    ``capture()``: hooks, calls, in-place safety, parameter gradients.
settings
    ``capture()``'s settings, one object per concern, passed whole.
data
    ``Capture``, ``LayerRecord``, ``CallRecord``: what a capture holds.
inputs
    ``ModelInputs`` and ``Batch``: what a model is called with.
selection
    Which modules to capture (names, globs, a predicate).
targets
    The scalar backward starts from.
nonfinite
    Where NaN/Inf began, forward and backward.
module_tree
    The module tree and what one probe forward tells about each module.
structure
    The module tree as a capture reads it, kept per model between captures.
memory_estimate
    How much memory a capture will hold, before anything is allocated.
sharded_params
    Models whose parameters are split over ranks (DTensors): refused by one capture.
"""

__all__ = ["capture", "settings", "data", "inputs", "selection", "targets", "nonfinite", "module_tree", "structure",
           "memory_estimate", "sharded_params"]
