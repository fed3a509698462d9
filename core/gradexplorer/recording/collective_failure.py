"""A collective that a dead or stopped rank broke: recognised, and said in one message.

A rank that dies (killed, out of memory) leaves the others in their next collective. gloo
fails it as soon as the dead peer's connection closes, else after the process group's
timeout (``init_process_group(timeout=...)``); NCCL after its timeout. The watch's gather,
FSDP2's all-gathers in forward, its reduce-scatters in backward and the sharded capture's
exchange all end the same way, in one message: what failed, that timeout, the way out.
"""

from __future__ import annotations

import os

import torch

from gradexplorer.base.errors import GradExplorerError

__all__ = ["collective_failed", "group_timeout", "is_collective_failure"]

#: Where a collective's Python frames live: ``torch.distributed`` and its FSDP2.
_DISTRIBUTED = os.path.join("torch", "distributed", "")
#: ... except DTensor's operator dispatch, where the model's own mistakes surface too.
_DTENSOR = os.path.join("torch", "distributed", "tensor", "")


def group_timeout() -> str:
    """The default process group's timeout in words ("10 s"), for a message."""
    import torch.distributed as dist

    try:
        group = dist.group.WORLD
        if group is None:
            return "the process group's timeout"
        seconds = group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
        return f"{seconds:g} s"
    except Exception:  # noqa: BLE001 - only for the message; a backend without options
        return "the process group's timeout"


def is_collective_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed (a peer gone, a timeout), not the
    model's own mistake.

    torch raises ``DistError`` (``DistBackendError``, ``DistNetworkError``) for most; gloo's
    transport errors (a peer that closed its connection, a timed-out receive) are plain
    ``RuntimeError``\\s raised where a collective waits, so those are recognised by the
    innermost Python frame being in ``torch.distributed`` (DTensor's dispatch aside).
    """
    import torch.distributed as dist

    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    if not isinstance(error, (RuntimeError, OSError)):
        return False
    tb = error.__traceback__
    innermost = None
    while tb is not None:
        innermost = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return innermost is not None and _DISTRIBUTED in innermost and _DTENSOR not in innermost


def collective_failed(failed: str, error: BaseException, kept: str = "") -> GradExplorerError:
    """The one-line message for a collective that a dead or stopped rank broke.

    Parameters
    ----------
    failed : str
        What failed, as the sentence's start ("Rank 0 could not gather watched step 3's
        statistics from the other ranks").
    error : BaseException
        torch's error; its first line is quoted.
    kept : str, optional
        What was kept, a sentence ("The watch log holds every step before step 3.").
    """
    text = str(error).strip()
    first = text.splitlines()[0][:200] if text else type(error).__name__
    return GradExplorerError(
        f"{failed} ({first}): a rank has likely died or stopped. Collectives give up after the process "
        f"group's timeout, here {group_timeout()} (init_process_group(timeout=...)).{' ' + kept if kept else ''}",
        "Look at the other ranks' output for the cause; a shorter init_process_group(timeout=...) ends "
        "the survivors sooner.")
