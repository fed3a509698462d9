"""The foundation every other part stands on: user-facing errors, sizes for people, devices,
and the one safe writer of output files.

Modules
-------
errors
    ``GradExplorerError`` and its kinds: every failure the user can cause names the problem
    and the fix.
forward_errors
    Advice when the model's own forward raises (shape, dtype, BatchNorm on one sample).
units
    The byte formatter and the parser of the sizes people write.
devices
    Which devices a capture can run on, and their free memory.
file_write
    Atomic writes, never over a special file, one of the user's inputs or a model cache.
model_caches
    The model hubs' caches (Hugging Face, torch hub), read from the environment at every call.
"""

__all__ = ["errors", "forward_errors", "units", "devices", "file_write", "model_caches"]
