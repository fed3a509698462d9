"""Which modules to capture: names, glob patterns or a predicate, normalised to one list.

The default selection (``layers=None``) is every module that computes something of its
own: every leaf module, and every module that owns trainable parameters directly
(``nn.MultiheadAttention``'s ``in_proj_weight``, a ViT's ``class_token`` on the root,
``encoder.pos_embedding``), so that a default capture holds every trainable parameter's
gradient under the module that owns it. ``gradexplorer.capturing.capture`` adds, while
forward runs, each module that ran no other module during a call (a block that uses a
child's weight functionally): what it computed is its own.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Iterable

from torch import nn

from gradexplorer.base.errors import GradExplorerError

LayerPredicate = Callable[[str, nn.Module], bool]
LayerSpec = None | str | Iterable[str] | LayerPredicate


def is_leaf(module: nn.Module) -> bool:
    """A module with no children: the default unit of capture."""
    return next(iter(module.children()), None) is None


def leaf_names(model: nn.Module) -> list[str]:
    """Qualified names of every leaf module, in registration order."""
    return [name for name, m in model.named_modules() if name and is_leaf(m)]


def owns_trainable(module: nn.Module) -> bool:
    """Whether ``module`` owns a parameter that requires grad itself (not through a child)."""
    return any(p.requires_grad for p in module.parameters(recurse=False))


def in_default(name: str, module: nn.Module) -> bool:
    """Whether the default selection holds ``module`` (module docstring): a leaf (the root
    when the model has no children), or a module that owns trainable parameters."""
    return is_leaf(module) or owns_trainable(module)


def default_names(model: nn.Module) -> list[str]:
    """Qualified names of the default selection (module docstring), in registration order;
    the root is ``""``."""
    return [name for name, m in model.named_modules() if in_default(name, m)]


def as_predicate(layers: LayerSpec) -> LayerPredicate:
    """Normalise a layer specification into one predicate ``(name, module) -> bool``.

    ``None`` is the default selection (module docstring: every leaf and every module that
    owns trainable parameters); a string or iterable of strings selects modules whose
    qualified name equals one of them or matches it as a glob pattern (``layer4.*``,
    ``*.relu``); ``""`` names the root module.
    """
    if layers is None:
        return in_default
    if callable(layers):
        return layers
    patterns = [layers] if isinstance(layers, str) else list(layers)
    exact = {p for p in patterns if not any(c in p for c in "*?[")}
    globs = [p for p in patterns if p not in exact]
    return lambda name, module: name in exact or any(fnmatch.fnmatchcase(name, g) for g in globs)


def resolve_layers(model: nn.Module, layers: LayerSpec = None) -> list[str]:
    """The qualified names of the selected modules, in registration order.

    Raises
    ------
    GradExplorerError
        When a name or pattern matches nothing (with near names), or nothing is selected.
    """
    predicate = as_predicate(layers)
    selected = [name for name, m in model.named_modules() if predicate(name, m)]
    if layers is not None and not callable(layers):
        patterns = [layers] if isinstance(layers, str) else list(layers)
        names = [n for n, _ in model.named_modules()]
        # A set for the exact names: a capture of every leaf passes each name as a
        # pattern, and matching each against every name is quadratic in the modules (tens of
        # thousands of fnmatch calls, a visible share of the pass: docs/benchmarks.md,
        # "Where the time goes"); only patterns with glob characters are matched.
        known = set(names)
        for p in patterns:
            if p in known or not any(c in p for c in "*?["):
                found = p in known
            else:
                found = any(fnmatch.fnmatchcase(n, p) for n in names)
            if not found:
                near = difflib.get_close_matches(p, names, n=3)
                hint = f" Near names: {', '.join(near)}." if near else ""
                raise GradExplorerError(
                    f"No module is named or matches '{p}'.{hint}",
                    "List the model's modules with `gradexplorer layers --model ...`.",
                )
    if not selected:
        raise GradExplorerError(
            "No layers are selected.", "Tick at least one layer, or pass --layers with a name or pattern."
        )
    return selected
