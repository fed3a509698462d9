"""One capture pipeline for every front end: what the user asked for, the job that runs it, and
the state of an exploring session.

Modules
-------
options
    ``CaptureOptions``: what the user asked a capture to do, frozen.
job
    ``CaptureJob``: options in, a capture with its metadata out, with progress and cancel.
dataset_job
    ``DatasetJob``: a ``CaptureJob`` over a whole dataset, its memory checked against the budget.
provenance
    The model, batch and option part of a capture's metadata.
compare_sources
    Where the second capture of a comparison comes from.
session
    The state of one exploring session, shared by the window's panels.
live
    A model and a batch from the caller's process, made ready for a session.
view_state
    What the user is looking at: an evented model the views share.
"""

__all__ = ["options", "job", "dataset_job", "provenance", "compare_sources", "session", "live", "view_state"]
