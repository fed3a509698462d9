"""A real Jupyter kernel driven as a notebook front end drives it, for tests.

Why not ``BlockingKernelClient.execute_interactive``: once Qt's event loop integration is
on (``%gui qt``, which ``gradexplorer.explore`` turns on), ipykernel sometimes leaves a shell
request unread until the next message reaches the kernel (ipykernel 7.4 with pyzmq 27: the
Qt loop waits on the edge-triggered descriptor of the socket the request came in on, and
that edge can be consumed before the loop waits). Reproduced without gradexplorer: a kernel
with ``%gui qt`` and one ``QLabel`` shown, sent ``1`` back to back, left 6 of about 50
requests unanswered for more than 60 s, and answered each right after one
``kernel_info_request``. A notebook does not notice (its front end keeps talking to the
kernel); a test that waits in silence for its reply does (it had timed out after 300 s on a
loaded machine, where the timing that opens the window is likelier).

:class:`NotebookKernel` waits on the kernel's own messages: a request that the kernel has
not taken up (no ``busy`` status for it) within :data:`NUDGE_AFTER_S` gets a
``kernel_info_request`` beside it, as a front end sends them, and the wait goes on. Nothing
else changes: a cell that does not return (a window that blocked the kernel) still never
replies, and the wait ends at :data:`CELL_LIMIT_S` with what the kernel said so far.
"""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path
from typing import Any

#: Seconds a request may wait untaken before the kernel is nudged (again).
NUDGE_AFTER_S = 5.0
#: The longest wait for one cell (a loaded machine imports torch slowly); a bound, not a check.
CELL_LIMIT_S = 600.0
#: The longest wait for the kernel to start.
STARTUP_LIMIT_S = 300.0


class KernelSilent(AssertionError):
    """A cell got no reply within :data:`CELL_LIMIT_S`."""


class NotebookKernel:
    """One ipykernel process and its client; :meth:`run` executes a cell.

    Attributes
    ----------
    nudges : int
        ``kernel_info_request`` sent to wake a kernel that had not taken a request up.
    """

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        from jupyter_client.manager import start_new_kernel

        self.manager, self.client = start_new_kernel(kernel_name="python3", env=env, cwd=str(cwd),
                                                     startup_timeout=STARTUP_LIMIT_S)
        self.nudges = 0

    def run(self, code: str) -> str:
        """Execute ``code`` as a cell; returns what it printed.

        Raises
        ------
        AssertionError
            The cell raised (its error is in the message).
        KernelSilent
            No reply within :data:`CELL_LIMIT_S` (what the kernel sent is in the message).
        """
        kc = self.client
        msg_id = kc.execute(code, store_history=False)
        out: list[str] = []
        seen: list[str] = []
        taken = idle = False
        reply = None
        end = time.monotonic() + CELL_LIMIT_S
        nudge_at = time.monotonic() + NUDGE_AFTER_S
        while reply is None or not idle:
            now = time.monotonic()
            if now > end:
                raise KernelSilent(f"no reply to {code!r} within {CELL_LIMIT_S:.0f} s; the kernel sent {seen[-12:]}, "
                                   f"printed {''.join(out)!r}, was nudged {self.nudges} times")
            if not taken and now > nudge_at:
                kc.kernel_info()  # a front end's message: wakes a kernel that missed the request
                self.nudges += 1
                nudge_at = now + NUDGE_AFTER_S
            for msg in _drain(kc.iopub_channel):
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                seen.append(f"{kind}:{content.get('execution_state', '')}")
                if kind == "status":
                    taken = True
                    idle = idle or content["execution_state"] == "idle"
                elif kind == "stream":
                    out.append(content.get("text", ""))
            for msg in _drain(kc.shell_channel):
                if msg["parent_header"].get("msg_id") == msg_id:  # a nudge's own reply is passed over
                    reply = msg
                    taken = True
            if reply is None or not idle:
                _wait(kc, 0.1)
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def _drain(channel: Any) -> list[dict]:
    msgs = []
    while True:
        try:
            msgs.append(channel.get_msg(timeout=0))
        except queue.Empty:
            return msgs


def _wait(kc: Any, seconds: float) -> None:
    """Until a message is on the iopub or shell channel, at most ``seconds``."""
    import zmq

    poller = zmq.Poller()
    poller.register(kc.iopub_channel.socket, zmq.POLLIN)
    poller.register(kc.shell_channel.socket, zmq.POLLIN)
    poller.poll(int(seconds * 1000))


def kernel_env(settings: Path) -> dict[str, str]:
    """The test process's environment, headless, with a throwaway settings file."""
    return {**os.environ, "QT_QPA_PLATFORM": "offscreen", "GRADEXPLORER_SETTINGS": str(settings)}
