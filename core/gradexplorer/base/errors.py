"""User-facing errors: every failure the user can cause names the problem and the fix.

The GUI shows ``problem`` as the message and ``fix`` beneath it; the CLI prints
``error: <problem> <fix>`` on one line. Both are plain text (:func:`plain_text`): what a
message quotes from a file or a library loses its terminal escapes and any advice to load a
file unsafely. Anything that is not a ``GradExplorerError``
is a bug in gradexplorer and is shown with its traceback under "details".
"""

from __future__ import annotations

import re

# Terminal escape sequences (colours, cursor moves, titles: CSI, OSC and two-byte ESC forms)
# and the other control characters a message from a library or a file may carry.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?|\x9b[0-?]*[ -/]*[@-~]")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Advice to load a file unsafely, as torch and timm word it: torch's block of two options
# (up to the error it precedes), its paragraph on the default of weights_only, and any other
# sentence that advises weights_only=False.
_UNSAFE_ADVICE = (
    re.compile(r"This file can still be loaded, to do so you have two options.*?(?=WeightsUnpickler error:|$)",
               re.DOTALL),
    re.compile(r"In PyTorch 2\.\d+, we changed the default value of the `weights_only`.*?trusted source\.?", re.DOTALL),
    re.compile(r"[^.\n]*weights_only(?:=|`? set to `?| to )`?False.*?(?:\.(?=\s|$)|$)", re.MULTILINE),
)


def plain_text(text: str) -> str:
    """``text`` as it may reach the user: terminal escapes and control characters removed
    (a file or a library's message must not recolour or move the user's terminal), and
    torch's and timm's advice to load a file with ``weights_only=False`` left out (it runs
    whatever the file holds; gradexplorer names the blocked global instead)."""
    text = _CONTROLS.sub("", _ESCAPES.sub("", str(text).replace("\t", " ")))
    if "weights_only" in text or "two options" in text:
        for advice in _UNSAFE_ADVICE:
            text = advice.sub("", text)
        text = re.sub(r"[ ]{2,}", " ", text)  # where a sentence was left out
    return text.strip()


def listing(names: list[str], limit: int = 4) -> str:
    """The first ``limit`` names and how many more ("a, b, c and 2 more"), for messages."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


class GradExplorerError(Exception):
    """An error caused by the user's input, with a suggested fix.

    Parameters
    ----------
    problem : str
        What went wrong, in the user's terms ("image 'cat.jpg' cannot be read").
    fix : str, optional
        What to do about it ("choose a PNG or JPEG file").
    """

    def __init__(self, problem: str, fix: str = "") -> None:
        # Messages often quote a file or a library (a name, torch's refusal): what reaches
        # the user is plain text, without escapes or advice to load unsafely.
        self.problem = plain_text(problem)
        self.fix = plain_text(fix)
        super().__init__(f"{self.problem} {self.fix}".strip())


class ModelLoadError(GradExplorerError):
    """The model could not be built or loaded."""


class TrustRequired(ModelLoadError):
    """Loading this file or factory would run code; the user must opt in (``--trust``).

    Parameters
    ----------
    problem, fix : str
        As for :class:`GradExplorerError`.
    subject : str, optional
        The file or factory whose code would run, in words, for the trust dialog
        ("the Python file '/home/me/nets.py' (function build)").
    """

    def __init__(self, problem: str, fix: str = "", *, subject: str = "") -> None:
        super().__init__(problem, fix)
        self.subject = subject


class WeightsUnavailable(ModelLoadError):
    """Pretrained weights are neither cached nor downloadable right now.

    Parameters
    ----------
    problem, fix : str
        As for :class:`GradExplorerError` (the command line's words).
    weights : str, optional
        The weights' full name ("ResNet18_Weights.IMAGENET1K_V1").
    cache_file : str, optional
        Where the weights file is looked for; the window words its own next steps from
        these two (buttons, not flags).
    """

    def __init__(self, problem: str, fix: str = "", *, weights: str = "", cache_file: str = "") -> None:
        super().__init__(problem, fix)
        self.weights = weights
        self.cache_file = cache_file


class BatchError(GradExplorerError):
    """The input batch could not be read or does not fit the model."""


class UnreadableImages(BatchError):
    """Some of the pictures of a batch cannot be read; the others can.

    Parameters
    ----------
    problem, fix : str
        As for :class:`GradExplorerError`.
    paths : list of str
        The unreadable files.
    readable : int
        How many of the batch's pictures can be read (the batch without the others).
    """

    def __init__(self, problem: str, fix: str = "", *, paths: list[str] | None = None, readable: int = 0) -> None:
        super().__init__(problem, fix)
        self.paths = list(paths or [])
        self.readable = readable


class CaptureError(GradExplorerError):
    """Forward or backward failed during a capture."""


class CaptureCancelled(GradExplorerError):
    """The user cancelled a running capture; nothing was kept."""

    def __init__(self) -> None:
        super().__init__("The run was cancelled.", "")


class CaptureFileError(GradExplorerError):
    """A capture file cannot be read or written."""
