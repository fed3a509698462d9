"""A real Jupyter kernel driven as a notebook front end drives it, for tests.

:meth:`NotebookKernel.run` waits for the reply and the kernel's ``idle`` status for the
request, as a front end does, rather than ``BlockingKernelClient.execute_interactive``: on a
silent kernel that raises a bare timeout, where ``run`` says what the kernel sent for the
request, which tells a request never started (nothing sent) from a cell that blocked (busy,
never idle).

Nothing is done here to wake the kernel. ipykernel runs Qt's event loop (``%gui qt``)
inside one of its asyncio tasks and leaves it only when a new message reaches the shell
socket, so a request taken off the socket just before the Qt loop was entered can wait
behind it until the next message (ipykernel 7.4 with pyzmq 27: with a window open and no
other traffic, a cell stalled at the 2nd to the 267th of back-to-back cells). A notebook user
sees that as a cell that never starts; ``gradexplorer.explore`` has the Qt loop hand back to
the kernel when that has work waiting, looked at every 0.1 s
(``gradexplorer_app.explore._hand_back_to_kernel``), and these tests show it by sending
nothing but the cells. A cell that does not return (a window that
blocked the kernel) never replies, and the wait ends at its limit with what the kernel said.
"""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path
from typing import Any

#: The longest wait for one cell (a loaded machine imports torch slowly); a bound, not a check.
CELL_LIMIT_S = 600.0
#: The longest wait for the kernel to start.
STARTUP_LIMIT_S = 300.0


class KernelSilent(AssertionError):
    """A cell got no reply within :data:`CELL_LIMIT_S`."""


class NotebookKernel:
    """One ipykernel process and its client; :meth:`run` executes a cell."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        from jupyter_client.manager import start_new_kernel

        self.manager, self.client = start_new_kernel(kernel_name="python3", env=env, cwd=str(cwd),
                                                     startup_timeout=STARTUP_LIMIT_S)

    def run(self, code: str, limit_s: float = CELL_LIMIT_S) -> str:
        """Execute ``code`` as a cell; returns what it printed.

        Raises
        ------
        AssertionError
            The cell raised (its error is in the message).
        KernelSilent
            No reply within ``limit_s`` seconds (what the kernel sent is in the message).
        """
        kc = self.client
        msg_id = kc.execute(code, store_history=False)
        out: list[str] = []
        seen: list[str] = []
        idle = False
        reply = None
        end = time.monotonic() + limit_s
        while reply is None or not idle:
            if time.monotonic() > end:
                raise KernelSilent(f"no reply to {code!r} within {limit_s:.0f} s; the kernel sent {seen[-12:]}, "
                                   f"printed {''.join(out)!r}")
            for msg in _drain(kc.iopub_channel):
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                seen.append(f"{kind}:{content.get('execution_state', '')}")
                if kind == "status":
                    idle = idle or content["execution_state"] == "idle"
                elif kind == "stream":
                    out.append(content.get("text", ""))
            for msg in _drain(kc.shell_channel):
                if msg["parent_header"].get("msg_id") == msg_id:
                    reply = msg
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
