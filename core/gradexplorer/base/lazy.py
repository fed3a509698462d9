"""Public names of a package imported on first use (PEP 562), as napari's ``lazy_loader``.

A package's ``__init__`` re-exports the names its modules define. Imported eagerly, every
import of any one module of the package would import all of them: importing
``gradexplorer.models.loaded_model`` (a dataclass) would import torchvision (slow: docs/benchmarks.md,
"Start-up") through
``gradexplorer.models.loading``. :func:`attach` gives the package a ``__getattr__`` that
imports a name's module only when the name is first read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def attach(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package ``package``.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    exports : mapping of str to str
        Each public name and where it is defined: ``"module"`` (the same name there) or
        ``"module:attribute"``, with the module's full dotted name.

    Returns
    -------
    (callable, callable)
        The package's ``__getattr__`` (which keeps each value in the package once read)
        and ``__dir__``.
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        try:
            where = exports[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        module, _, attribute = where.partition(":")
        value = getattr(importlib.import_module(module), attribute or name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
