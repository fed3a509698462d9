"""The window's listeners of the engine's evented objects (the session, the view state).

psygnal calls a signal's listeners in turn, stops at the first one that raises and raises
its exception into whoever changed the object: a worker's result being shown, a click. That
caller then stops half way, and the other listeners never hear of the change. A model whose
graph could not be drawn (a random sample of gigabytes made on a memory-capped machine) left
its batch unset and the run it was loaded for never started, and ``gradexplorer.explore``
waited for that run for ever.

Every listener of the window is connected through :func:`listen`: one that raises is
reported to whoever watches the emitting object (:func:`report_errors`; the main window
shows a message) and to ``sys.excepthook`` (its traceback on stderr, and a test that
captures exceptions fails); the other listeners still run, and the change completes.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from collections.abc import Callable
from typing import Any

from psygnal import SignalGroup, SignalInstance

__all__ = ["listen", "report_errors"]

#: Who is told of a failing listener: by the emitting object's id, the object and the reporter
#: held weakly (an evented dataclass is not hashable, so no WeakKeyDictionary).
_reporters: dict[int, tuple[weakref.ref, Callable[[], Callable[[BaseException], None] | None]]] = {}


def _weak(fn: Callable[..., Any]) -> Callable[[], Callable[..., Any] | None]:
    """A reference to ``fn`` that does not keep its object alive (a bound method), as psygnal
    holds its listeners; a function or lambda is held as it is."""
    if inspect.ismethod(fn):
        return weakref.WeakMethod(fn)
    return lambda: fn


def report_errors(emitter: Any, report: Callable[[BaseException], None]) -> None:
    """Tell ``report`` of every exception raised by a listener of ``emitter``'s signals.

    Parameters
    ----------
    emitter : object
        A ``Session``, or an evented object (the ``ViewState``).
    report : callable
        ``report(exception)``, on the thread that emitted; a bound method is held weakly.
    """
    key = id(emitter)
    _reporters[key] = (weakref.ref(emitter, lambda _ref: _reporters.pop(key, None)), _weak(report))


def _emitter(signal: SignalInstance) -> Any:
    owner = signal.instance
    # An evented dataclass's signals belong to its SignalGroup; the object is the group's.
    return owner.instance if isinstance(owner, SignalGroup) else owner


def _positional_count(fn: Callable[..., Any]) -> int | None:
    """How many of a signal's arguments ``fn`` takes, as psygnal passes them (None: all)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: every argument
        return None
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return None
    return sum(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
               for p in parameters)


def _report(emitter: weakref.ref | None, exc: Exception) -> None:
    sys.excepthook(type(exc), exc, exc.__traceback__)
    owner = emitter() if emitter is not None else None
    entry = _reporters.get(id(owner)) if owner is not None else None
    report = entry[1]() if entry is not None and entry[0]() is owner else None
    if report is not None:
        try:
            report(exc)
        except Exception as failed:  # noqa: BLE001 - the reporter's own failure: its traceback, not a loop
            sys.excepthook(type(failed), failed, failed.__traceback__)


def listen(signal: SignalInstance, listener: Callable[..., Any]) -> None:
    """Connect ``listener`` to ``signal``: an exception it raises is reported
    (:func:`report_errors`), never raised into the code that emitted, and the signal's
    other listeners still run.

    Parameters
    ----------
    signal : psygnal.SignalInstance
        ``session.model_changed``, ``view_state.events.layer``...
    listener : callable
        Called with as many of the signal's arguments as it takes, as psygnal does; a bound
        method is held weakly (it stops listening when its object is gone), a function or
        lambda as it is.
    """
    owner = _emitter(signal)
    emitter = weakref.ref(owner) if owner is not None else None
    count = _positional_count(listener)
    target = _weak(listener)

    def guarded(*args: Any) -> None:
        fn = target()
        if fn is None:
            signal.disconnect(guarded)
            return
        try:
            fn(*(args if count is None else args[:count]))
        except Exception as exc:  # noqa: BLE001 - any listener's failure: a message, never a broken emitter
            _report(emitter, exc)

    signal.connect(guarded)
