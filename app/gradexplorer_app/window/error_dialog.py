"""Showing a failure to the user: what went wrong, what to do, and details for bugs.

A :class:`~gradexplorer.base.errors.GradExplorerError` is the user's to fix: its ``problem`` and
``fix`` are shown as they are. Anything else is a bug in gradexplorer: a short message
says so, and the traceback waits under "Show Details...".

The dialog is never modal (``open()``, not ``exec()``), so the window stays usable.
Tests replace :func:`show_error` (``monkeypatch.setattr(error_dialog, "show_error",
...)``); callers must look it up on the module at call time.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget

from gradexplorer.base.errors import GradExplorerError, plain_text

#: A next step offered as a button: its label ("Use random weights") and what it does.
Action = tuple[str, Callable[[], object]]


def describe(exc: BaseException) -> tuple[str, str, str]:
    """``(message, fix, details)`` for an exception, in the user's words.

    For a ``GradExplorerError`` the details are the errors beneath it (``__cause__``),
    the technical text a user need not read but may want to report."""
    if isinstance(exc, GradExplorerError):
        causes: list[str] = []
        cause = exc.__cause__ or exc.__context__
        while cause is not None and len(causes) < 5:
            causes.append(plain_cause("".join(traceback.format_exception_only(type(cause), cause)).strip()))
            cause = cause.__cause__ or cause.__context__
        return exc.problem, exc.fix, "\n".join(causes)
    details = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    first = plain_text(str(exc).splitlines()[0]) if str(exc).strip() else ""
    message = f"Unexpected error: {type(exc).__name__}{': ' + first if first else ''}"
    fix = ("This is a bug in gradexplorer, not something you did. The details below help "
           "to report it; the window stays usable.")
    return message, fix, details


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain_cause(text: str) -> str:
    """A library's error text for the details, without its terminal colours and without
    torch's advice on a refused pickle: that re-running ``torch.load`` with
    ``weights_only=False`` "will likely succeed" (it runs whatever the file holds; the
    message above the details says what gradexplorer allows instead). What torch refused
    stays: its ``WeightsUnpickler error`` line, up to its own advice."""
    text = _ANSI.sub("", text)
    if "Weights only load failed" not in text:
        return text
    head = text.split(":", 1)[0] if text.startswith(("UnpicklingError", "_pickle.UnpicklingError",
                                                     "pickle.UnpicklingError")) else ""
    refused = next((line.strip() for line in text.splitlines() if "WeightsUnpickler error" in line), "")
    refused = refused.split(" Please use", 1)[0].split(". Please", 1)[0]
    lines = [f"{head + ': ' if head else ''}torch.load(weights_only=True) refused the file."]
    if refused:
        lines.append(refused.rstrip(".") + ".")
    return "\n".join(lines)


def one_line(exc: BaseException) -> str:
    """The message for a status bar."""
    message, fix, _ = describe(exc)
    return f"{message} {fix}".strip() if isinstance(exc, GradExplorerError) else message


def show_error(parent: QWidget | None, title: str, exc: BaseException, *,
               actions: Sequence[Action] = (), words: tuple[str, str] | None = None) -> QMessageBox:
    """Show ``exc`` in a non-modal message box and return it.

    Parameters
    ----------
    actions : sequence of (label, callable)
        Next steps offered as buttons beside Close; clicking one closes the box and runs it.
    words : (message, fix), optional
        The window's own words for the error (buttons rather than command-line flags); the
        exception's text then goes under "Show Details...".
    """
    message, fix, details = describe(exc)
    if words is not None:
        full = str(exc)
        message, fix, details = words[0], words[1], full + (f"\n\n{details}" if details else "")
    box = QMessageBox(parent)
    box.setWindowTitle(f"gradexplorer: {title}")
    box.setIcon(QMessageBox.Icon.Warning if isinstance(exc, GradExplorerError) else QMessageBox.Icon.Critical)
    box.setText(f"<b>{title}</b><br><br>{_escape(message)}")
    if fix:
        box.setInformativeText(fix)
    if details:
        box.setDetailedText(details)
    box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    box.setStandardButtons(QMessageBox.StandardButton.Close)
    for label, run in actions:
        button = box.addButton(label, QMessageBox.ButtonRole.ActionRole)
        button.clicked.connect(lambda _checked=False, run=run: run())
    # Enter and Esc close the box: with details, Enter had opened "Show Details..."; a next
    # step offered as a button is the user's to click.
    box.setDefaultButton(QMessageBox.StandardButton.Close)
    box.setEscapeButton(QMessageBox.StandardButton.Close)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.setWindowModality(Qt.WindowModality.NonModal)
    box.show()
    return box


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
