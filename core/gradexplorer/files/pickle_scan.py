"""What a file that ``torch.load(weights_only=True)`` refuses would import, found without
running it, and what that says the file is.

torch refuses such a file with paragraphs that end in advice to load it with
``weights_only=False``, which runs whatever the file holds. gradexplorer names the blocked
global instead (torch 2.14: "Trying to load unsupported GLOBAL posix.system whose module posix
is blocked"; older: "Unsupported global: GLOBAL ...") and says what the file seems to be.
"""

from __future__ import annotations

import pickletools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from gradexplorer.base.errors import listing

_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
# Globals a model or a checkpoint never needs, but a pickle built to attack does.
_DANGEROUS_MODULES = ("posix", "nt", "os", "subprocess", "runpy", "shutil", "socket",
                      "webbrowser", "pty", "importlib", "sys", "code", "ctypes")
_DANGEROUS_NAMES = ("io.open", "_io.open", "io.FileIO", "_io.FileIO", "codecs.open")
_DANGEROUS_BUILTINS = ("eval", "exec", "compile", "open", "__import__", "getattr", "setattr",
                       "breakpoint", "input", "delattr", "globals", "vars")


class Refusal(NamedTuple):
    """Why ``weights_only`` loading refused a file, in the user's terms.

    Attributes
    ----------
    blocked : str
        The global torch blocked ("posix.system").
    globals : list of str
        Every global the file would import.
    kind : str
        What the file seems to be (:func:`file_kind`).
    """

    blocked: str
    globals: list[str]
    kind: str

    @property
    def whole_model(self) -> bool:
        """Whether the file seems to hold a whole pickled ``nn.Module``."""
        return self.kind.startswith("a whole pickled model")

    def reason(self) -> str:
        """"loading it needs posix.system, which is blocked: it seems to be ..." """
        return f"loading it needs {self.blocked}, which is blocked: it seems to be {self.kind}"


def refusal(path: Path, error: BaseException) -> Refusal | None:
    """Why ``torch.load(path, weights_only=True)`` raised ``error``, or None when the file
    is damaged rather than unsafe."""
    found = unsafe_globals(path, error)
    if not found:
        return None
    named = _GLOBAL.search(str(error))
    blocked = named.group(1) if named else found[0]
    return Refusal(blocked, found, file_kind(found))


def unsafe_globals(path: Path, error: BaseException | None = None) -> list[str]:
    """The Python globals ``path`` would import when unpickled, without unpickling it.

    Parameters
    ----------
    path : Path
        A ``torch.save`` file (zip or legacy) or a plain pickle.
    error : exception, optional
        What ``torch.load(path, weights_only=True)`` raised; its text names the first
        blocked global of legacy files.

    Returns
    -------
    list of str
        Dotted names, each once, in the order found; empty when nothing is found (a
        damaged file, not an unsafe one).
    """
    import torch

    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - only zip checkpoints are supported; the error names the rest
        # Legacy torch.save files get this far and the error names the global; plain pickle
        # files stop earlier (on an opcode the safe unpickler lacks), so read their opcodes.
        named = _GLOBAL.findall(str(error)) if error is not None else []
        found = named or pickle_globals(path)
    return list(dict.fromkeys(found))


def pickle_globals(path: Path) -> list[str]:
    """The globals a plain pickle file would import, read without unpickling anything."""
    found: list[str] = []
    pushed: list[str | None] = []  # recent string pushes, to name STACK_GLOBAL's operands
    memo: dict[int, str | None] = {}
    try:
        with open(path, "rb") as stream:
            for opcode, arg, _pos in pickletools.genops(stream):
                name = opcode.name
                if name == "GLOBAL" and isinstance(arg, str):
                    found.append(arg.replace(" ", "."))
                elif name == "STACK_GLOBAL":
                    if len(pushed) >= 2 and pushed[-2] and pushed[-1]:
                        found.append(f"{pushed[-2]}.{pushed[-1]}")
                elif name == "MEMOIZE":
                    memo[len(memo)] = pushed[-1] if pushed else None
                elif name.endswith("PUT") and isinstance(arg, int):
                    memo[arg] = pushed[-1] if pushed else None
                elif name.endswith("GET") and isinstance(arg, int):
                    pushed.append(memo.get(arg))
                elif isinstance(arg, str) and ("UNICODE" in name or "STRING" in name):
                    pushed.append(arg)
    except Exception:  # noqa: BLE001 - not a pickle, or a damaged one: report what was seen
        pass
    return found


def is_dangerous(name: str) -> bool:
    """Whether a global is one that runs commands or touches files, never a model's."""
    module, _, attr = name.rpartition(".")
    top = module.split(".")[0]
    return (
        top in _DANGEROUS_MODULES
        or name in _DANGEROUS_NAMES
        or (module in ("builtins", "__builtin__") and attr in _DANGEROUS_BUILTINS)
    )


def file_kind(globals_: list[str]) -> str:
    """What a file that imports ``globals_`` seems to be, in words.

    Parameters
    ----------
    globals_ : list of str
        From :func:`unsafe_globals`.

    Returns
    -------
    str
        A noun phrase, e.g. "a pickle built to run commands or open files (posix.system):
        it may be malicious", "a whole pickled model (__main__.Net)".
    """
    dangerous = [g for g in globals_ if is_dangerous(g)]
    if dangerous:
        return (f"a pickle built to run commands or open files ({listing(dangerous)}): "
                "it may be malicious")
    if any(g.startswith(("pytorch_lightning.", "lightning.")) for g in globals_):
        return f"a Lightning checkpoint with Python objects in it ({listing(globals_)})"
    if any(g.startswith("torch.nn.modules.") for g in globals_):
        own = [g for g in globals_ if not g.startswith("torch.")]
        return f"a whole pickled model ({listing(own or globals_)})"
    if any(g.startswith(("numpy.", "numpy")) for g in globals_):
        return f"a pickle holding NumPy objects ({listing(globals_)})"
    return f"a pickle of Python objects ({listing(globals_)})"


def short_reason(exc: BaseException) -> str:
    """One readable line out of a (often very long) exception from ``torch.load``."""
    text = str(exc)
    # weights_only failures start with paragraphs of advice; the cause comes last.
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reason = lines[0] if lines else type(exc).__name__
    return reason if len(reason) <= 300 else reason[:297] + "..."


class _Inert(list):
    """What an object of a refused global becomes in :func:`load_inert`: nothing is called,
    imported or kept; its arguments and state are dropped."""

    def __new__(cls, *args: object, **kwargs: object) -> _Inert:
        return super().__new__(cls)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__()

    def __setstate__(self, state: object) -> None:
        pass

    def __repr__(self) -> str:
        return "<object not unpickled>"


def load_inert(path: Path, globals_: list[str]) -> object:
    """``torch.load(path, weights_only=True)`` with each of ``globals_`` read as an inert
    stand-in (never imported, never called), for files whose tensors are wanted and whose
    other objects are not: a Lightning checkpoint's ``hyper_parameters`` holding a
    ``pathlib.Path``.

    Parameters
    ----------
    path : Path
        A zip ``torch.save`` file.
    globals_ : list of str
        From :func:`unsafe_globals`; the caller refuses dangerous ones first
        (:func:`is_dangerous`), so that a malicious file is still called one.

    Returns
    -------
    object
        What the file holds, with :class:`_Inert` where those objects were.

    Raises
    ------
    Exception
        Whatever ``torch.load`` raises when the file cannot be read this way either.
    """
    import torch

    stand_ins: list[Callable[..., Any] | tuple[Callable[..., Any], str]] = [(_Inert, name) for name in globals_]
    with torch.serialization.safe_globals(stand_ins):
        return torch.load(path, map_location="cpu", weights_only=True)


def holds_inert(obj: object) -> bool:
    """Whether ``obj`` (a tensor mapping) holds any stand-in of :func:`load_inert`."""
    if isinstance(obj, _Inert):
        return True
    if isinstance(obj, dict):
        return any(holds_inert(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(holds_inert(v) for v in obj)
    return False
