"""Blocking until a Qt signal fires, for scripts and benchmarks that drive the window."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QEventLoop, QTimer, SignalInstance


def wait_for_signal(signal: SignalInstance, start: Callable[[], object] | None = None,
                    timeout_s: float = 600.0) -> tuple[Any, ...]:
    """Run the event loop until ``signal`` fires and return its arguments.

    ``start`` is called after connecting, so that a signal emitted at once is not missed.

    Raises
    ------
    TimeoutError
        When the signal does not fire within ``timeout_s``.
    """
    loop = QEventLoop()
    got: list[tuple[Any, ...]] = []

    def on(*args: Any) -> None:
        got.append(args)
        loop.quit()

    signal.connect(on)
    try:
        QTimer.singleShot(int(timeout_s * 1000), loop.quit)
        if start is not None:
            start()
        if not got:
            loop.exec()
    finally:
        signal.disconnect(on)
    if not got:
        raise TimeoutError(f"no {signal} within {timeout_s:.0f} s")
    return got[0]
