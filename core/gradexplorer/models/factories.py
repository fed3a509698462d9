"""Factories: ``package.module:function`` or ``path/to/file.py:function``, called with no
arguments to build the model. Calling one runs the user's code, so it needs trust."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from torch import nn

from gradexplorer.base.errors import ModelLoadError, TrustRequired
from gradexplorer.models.files import import_path
from gradexplorer.models.input_size import declared_input_shape
from gradexplorer.models.loaded_model import LoadedModel
from gradexplorer.models.state_dicts import load_state_into, read_weights

#: The weights label of a factory's model when no weights file was given: the factory may
#: have loaded weights itself, so "random init" would be a guess (and often wrong).
FACTORY_WEIGHTS = "as built by the factory"
_FACTORY = re.compile(r"^(?P<target>.+):(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")


class FactorySpec(NamedTuple):
    """A factory the user named: where it lives and the attribute path inside."""

    target: str
    """A dotted module name or the path of a ``.py`` file."""
    attr: str
    """The attribute path after the colon, e.g. ``"make_model"`` or ``"Net.build"``."""


def parse_factory(text: str) -> FactorySpec | None:
    """``text`` as a factory, or None when it is not written as one."""
    match = _FACTORY.match(text)
    if match is None:
        return None
    target = match["target"]
    if target.endswith(".py") or _DOTTED.match(target):
        return FactorySpec(target, match["attr"])
    return None


def describe_factory(factory: FactorySpec) -> str:
    """The code a factory runs, in words for the trust dialog; imports nothing.

    Returns
    -------
    str
        E.g. "the Python file '/home/me/nets.py', then its build()" or "the Python module
        nets.zoo (from /home/me/nets/__init__.py), then its build()".
    """
    call = f"then its {factory.attr}()"
    if factory.target.endswith(".py"):
        return f"the Python file '{Path(factory.target).expanduser().resolve()}', {call}"
    top = factory.target.split(".")[0]
    with import_path(Path.cwd()):
        try:
            # A top-level name is found without running it; a dotted one would import
            # its parent packages, so only the top is looked up.
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            found = None
    if found is None:
        where = "not found on the import path or in the current folder"
    else:
        locations = list(found.submodule_search_locations or [])
        where = f"from {found.origin or (locations[0] if locations else top)}"
    return f"the Python module {factory.target} ({where}), {call}"


def factory_name(factory: FactorySpec) -> str:
    """The model's display name: where the factory lives and its name ("nets.build" for
    nets.py:build), since a function's name alone ("build", "make") tells models apart
    no better than "model" would."""
    where = Path(factory.target).stem if factory.target.endswith(".py") else factory.target
    return f"{where}.{factory.attr}"


def load_factory(
    spec: str, factory: FactorySpec, *, trust: bool, weights: str | None
) -> LoadedModel:
    """Import the factory, call it, and load ``weights`` (a state-dict file) into its model.

    The model's weights are labelled ``file:PATH`` when a file was loaded, else
    :data:`FACTORY_WEIGHTS` (which, given back as ``weights``, means no file).

    Raises
    ------
    TrustRequired
        ``trust`` is false.
    ModelLoadError
        The file or attribute does not exist, importing or calling it fails, it returns
        something other than a model, or the weights do not fit.
    """
    file = Path(factory.target).expanduser() if factory.target.endswith(".py") else None
    if file is not None and not file.is_file():
        raise ModelLoadError(f"The Python file '{file}' does not exist.", "Check the path.")
    if not trust:
        raise TrustRequired(
            f"'{spec}' is Python code: building the model runs it.",
            "Pass --trust if you trust this code.",
            subject=describe_factory(factory),
        )
    # A factory file imports its neighbours; a module name is looked up in the current
    # folder too, as `python -m gradexplorer` does (the console script's path lacks it).
    with import_path(file.parent if file is not None else Path.cwd()):
        function = _resolve(spec, factory, file)
        result = _call(spec, function)
    if isinstance(result, LoadedModel):
        result.module.eval()
        return result
    if not isinstance(result, nn.Module):
        kind = type(result)
        raise ModelLoadError(
            f"The factory '{spec}' returned a {kind.__module__}.{kind.__qualname__}, "
            "not a torch.nn.Module.",
            "Make it return the model (an nn.Module instance).",
        )
    label = FACTORY_WEIGHTS
    notes = ["built by a trusted factory"]
    if weights is not None and weights != FACTORY_WEIGHTS:
        path = Path(weights).expanduser()
        notes.extend(load_state_into(result, read_weights(path), path, spec))
        label = f"file:{path}"
    return LoadedModel(
        module=result.eval(),
        spec=spec,
        name=factory_name(factory),
        weights=label,
        input_shape=declared_input_shape(result),
        task="other",
        notes=notes,
    )


def _resolve(spec: str, factory: FactorySpec, file: Path | None) -> Callable[[], object]:
    target, attr = factory
    try:
        namespace = _import_file(file) if file is not None else importlib.import_module(target)
    except Exception as exc:  # the user's module may raise anything while importing
        raise ModelLoadError(
            f"Importing '{target}' failed: {type(exc).__name__}: {exc}",
            "Fix the error in that code, or make it importable (its folder on PYTHONPATH).",
        ) from exc
    found: object = namespace
    for part in attr.split("."):
        if not hasattr(found, part):
            raise ModelLoadError(
                f"'{target}' has no attribute '{attr}'.", "Check the name after the colon."
            )
        found = getattr(found, part)
    if not callable(found):
        raise ModelLoadError(
            f"'{spec}' is a {type(found).__name__}, not a callable.",
            "Point at a function or class that builds the model.",
        )
    return found


def _call(spec: str, function: Callable[[], object]) -> object:
    try:
        return function()
    except Exception as exc:  # the user's factory may raise anything
        raise ModelLoadError(
            f"The factory '{spec}' raised {type(exc).__name__}: {exc}",
            "Fix the factory so that calling it with no arguments returns an nn.Module.",
        ) from exc


def _import_file(file: Path) -> object:
    module_name = "_gradexplorer_factory_" + re.sub(r"\W", "_", file.stem)
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    # Registered so that dataclasses, pickling and relative lookups inside it work.
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
