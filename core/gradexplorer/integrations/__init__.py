"""Watching trainings that run inside a trainer's own loop: thin callbacks over the watch.

Modules
-------
trainer_watch
    ``TrainerWatch``: the watch (``gradexplorer.recording.watch``) driven by a trainer's
    events, with the gradients read when the optimizer steps; what both callbacks share.
lightning
    ``WatchCallback`` for Lightning's ``Trainer`` (``lightning`` or ``pytorch_lightning``).
transformers
    ``WatchCallback`` for the Hugging Face ``Trainer``.

Each callback module imports its trainer; this package imports neither.
"""

__all__ = ["trainer_watch", "lightning", "transformers"]
