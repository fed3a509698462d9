"""The module tree as a capture reads it, cached per model and checked at every capture.

A capture needs the model's modules by name, which of them have children, the ones it
records for the user's layer selection, the embeddings that read token ids: a walk of
the tree (``named_modules``) for each, several per capture. On a 200-layer MLP those
walks cost as much per layer call as a hook. The tree changes rarely between captures of
one model (a notebook replaces a head, a user wraps a block), so :func:`structure_of`
walks it once, keeps what the walks gave, and at each later capture only checks that the
tree is the one it walked: every module's identity and its children's names, in one
plain pass over the modules' child dictionaries (no names built, no generators).

What can change without changing the tree is read live, never cached: parameters (a
user may assign a new ``nn.Parameter``), ``requires_grad``, modes, buffers.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, cast

from torch import nn

from gradexplorer.capturing.selection import LayerSpec, is_leaf, resolve_layers

__all__ = ["ModelStructure", "structure_of"]


def _fingerprint(model: nn.Module) -> list:
    """Every module under ``model`` (depth first, as it is reached) as its identity and the
    names of its children: equal lists mean the same tree. Holds no module. Written for
    speed: it runs at every capture."""
    parts: list = []
    append = parts.append
    stack: list[nn.Module | None] = [model]
    pop, extend = stack.pop, stack.extend
    while stack:
        m = pop()
        if m is None:  # a child registered as None
            append(None)
            continue
        children = m._modules
        append(id(m))
        if children:
            append(tuple(children))
            extend(children.values())
        else:
            append(())
    return parts



def _alive(ref: weakref.ref[nn.Module]) -> nn.Module:
    """The module behind ``ref``; a structure is used only while its modules live (``alive``)."""
    m = ref()
    assert m is not None, "a structure whose modules no longer exist"
    return m

class ModelStructure:
    """The module tree of one model, as :func:`named_modules` gives it, and what captures
    ask of it. Build it with :func:`structure_of`.

    Attributes
    ----------
    names : tuple of str
        Qualified names in ``named_modules`` order (``""``: the model itself).
    has_children : tuple of bool
        Per name, whether the module has children (is not a leaf).
    name_by_id : dict of int to str
        ``id(module)`` to its name, for every module of ``names``.

    The modules are held by weak references, so that a kept structure keeps no module alive
    (a module that refers to its model would otherwise keep the whole model).
    """

    def __init__(self, model: nn.Module, fingerprint: list) -> None:
        self.fingerprint = fingerprint
        named = list(model.named_modules())
        self.names = tuple(n for n, _ in named)
        self._refs = tuple(weakref.ref(m) for _, m in named)
        self.has_children = tuple(not is_leaf(m) for _, m in named)
        self._index = {n: i for i, n in enumerate(self.names)}
        # id(module) -> its name: what hooks shared by every module look a call's module up
        # in (``gradexplorer.hooks.installed.Hooks.call_hooks``). The ids are those of living
        # modules (``alive``), which no other object can share.
        self.name_by_id = {id(m): n for n, m in named}
        self._selections: dict[Any, list[str]] = {}

    def __len__(self) -> int:
        return len(self.names)

    def alive(self) -> bool:
        """Whether every module it was built from still exists (then a fingerprint of equal
        identities is of the same modules: no new module can share a living one's id)."""
        return all(r() is not None for r in self._refs)

    def module(self, name: str) -> nn.Module:
        """The module named ``name`` (``""``: the model)."""
        return _alive(self._refs[self._index[name]])

    @property
    def modules(self) -> list[nn.Module]:
        """The modules of ``names``, in order (the model itself first)."""
        got = [r() for r in self._refs]  # (no call of _alive per module: a capture asks several times)
        assert None not in got, "a structure whose modules no longer exist"
        return cast(list[nn.Module], got)

    def named_modules(self) -> list[tuple[str, nn.Module]]:
        """``model.named_modules()``, as a list."""
        return list(zip(self.names, self.modules))

    def children_of(self, name: str) -> bool:
        """Whether the module named ``name`` has children."""
        return self.has_children[self._index[name]]

    def selected(self, layers: LayerSpec) -> list[str]:
        """``gradexplorer.capturing.selection.resolve_layers`` for this model: a selection by
        names or patterns from the tree kept; the default one (``None``: every leaf, and
        every module that owns trainable parameters itself) from the leaves kept and the
        containers' own parameters as they are now (``requires_grad`` may change between
        captures); a predicate asked again each time (it may read more than the tree).
        Raises as ``resolve_layers`` does."""
        if layers is None:
            got = [n for n, m, inner in zip(self.names, self.modules, self.has_children)
                   if not inner or _owns_trainable(m)]
            return got if got else resolve_layers(self.module(""), None)  # raises: nothing selected
        if callable(layers):
            return resolve_layers(self.module(""), layers)
        key = layers if isinstance(layers, str) else tuple(layers)
        if key not in self._selections:
            self._selections[key] = resolve_layers(self.module(""), key)
        return list(self._selections[key])

    def containers(self) -> list[str]:
        """Names of the modules that have children (the root included when it has)."""
        return [n for n, inner in zip(self.names, self.has_children) if inner]

    def of_type(self, kind: type | tuple[type, ...]) -> list[tuple[str, nn.Module]]:
        """(name, module) of every module that is an instance of ``kind``, in tree order."""
        return [(n, m) for n, m in zip(self.names, self.modules) if n and isinstance(m, kind)]


def _owns_trainable(module: nn.Module) -> bool:
    """``gradexplorer.capturing.selection.owns_trainable``, read from the module's own
    parameter dictionary (no generator: it runs for every container at every capture)."""
    return any(p is not None and p.requires_grad for p in module._parameters.values())


_CACHE: weakref.WeakKeyDictionary[nn.Module, ModelStructure] = weakref.WeakKeyDictionary()


def structure_of(model: nn.Module, walk: Callable[[nn.Module], list] = _fingerprint) -> ModelStructure:
    """The structure of ``model``'s module tree: the one kept from an earlier call when the
    tree is the same (checked by ``walk``, one pass over its child dictionaries), else a
    new one, kept for the next call."""
    fingerprint = walk(model)
    cached = _CACHE.get(model)
    if cached is not None and cached.fingerprint == fingerprint and cached.alive():
        return cached
    structure = _CACHE[model] = ModelStructure(model, fingerprint)
    return structure
