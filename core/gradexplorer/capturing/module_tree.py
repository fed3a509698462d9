"""The module tree of a model, and what one probe forward tells about each module.

Built without running the model (names, types, parameter counts), then enriched by
``probe``: calls per forward, output shapes and dtypes, in-place modules (whose output
is their input, modified) and reused modules (called more than once). Both are linear in
the number of modules, so nets with thousands of modules take milliseconds.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

from gradexplorer.base.errors import CaptureError
from gradexplorer.base.forward_errors import forward_fix
from gradexplorer.capturing.capture import primary_tensor
from gradexplorer.capturing.inputs import ModelInputs, call_model
from gradexplorer.hooks.installed import hooks_installed


@dataclass
class ModuleNode:
    """One module in the tree.

    Attributes
    ----------
    name : str
        Qualified name (``""`` for the root).
    type : str
        Class name.
    depth : int
    parent : str or None
    children : list of str
        Qualified names of direct children, in registration order.
    own_params, total_params : int
        Parameter counts of this module alone and with its descendants (shared
        parameters counted once per tree).
    trainable : bool or None
        Whether all of its (total) parameters require grad; ``None`` when it has none.
    calls : int or None
        Calls per forward (after ``probe``).
    output_shapes : list of tuple
        Shape of the recorded output of each call (after ``probe``).
    output_dtype : str
    inplace : bool
        The module returned one of its inputs, modified in place (ReLU(inplace=True)).
    """

    name: str
    type: str
    depth: int
    parent: str | None
    children: list[str] = field(default_factory=list)
    own_params: int = 0
    total_params: int = 0
    trainable: bool | None = None
    calls: int | None = None
    output_shapes: list[tuple] = field(default_factory=list)
    output_dtype: str = ""
    inplace: bool = False
    output_bytes: int = 0

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def reused(self) -> bool:
        return bool(self.calls and self.calls > 1)

    @property
    def short_name(self) -> str:
        return self.name.rsplit(".", 1)[-1] if self.name else "(model)"


class CallIO(NamedTuple):
    """One module call seen by ``ModuleTree.probe``, in the order calls started.

    ``input_key`` and ``output_key`` identify the tensor *value* (the same tensor object at
    the same version counter, as ``gradexplorer.capturing.capture`` dedupes them): two calls whose keys are
    equal saw the very same tensor. ``None`` when there was no tensor. Bytes are
    ``numel * element_size`` (the first tensor input; the recorded output tensor).
    ``start`` and ``end`` order the call's start and return among all starts and returns.
    """

    name: str
    input_key: TensorKey | None
    input_bytes: int
    output_key: TensorKey | None
    output_bytes: int
    start: int
    end: int


class ModuleTree:
    """All modules of a model by qualified name, in registration order.

    Use ``ModuleTree.build(model)``; call ``probe(model, x)`` to fill in calls and shapes.
    """

    def __init__(self, nodes: dict[str, ModuleNode], model_type: str):
        self.nodes = nodes
        self.model_type = model_type
        self.probed = False
        self.probe_seconds: float | None = None
        self.call_order: list[str] = []
        #: Every module call of the probe, in the order calls started (see ``CallIO``).
        self.call_io: list[CallIO] = []

    @classmethod
    def build(cls, model: nn.Module) -> ModuleTree:
        """The tree of ``model``'s modules, without running it."""
        nodes: dict[str, ModuleNode] = {}
        seen_params: set[int] = set()
        for name, module in model.named_modules(remove_duplicate=True):
            parent = name.rsplit(".", 1)[0] if "." in name else ("" if name else None)
            own = 0
            own_trainable = True
            has_params = False
            for p in module.parameters(recurse=False):
                has_params = True
                if id(p) not in seen_params:
                    seen_params.add(id(p))
                    own += p.numel()
                own_trainable &= p.requires_grad
            node = ModuleNode(
                name=name, type=type(module).__name__, depth=name.count(".") + 1 if name else 0,
                parent=parent, own_params=own, total_params=own,
                trainable=own_trainable if has_params else None,
            )
            nodes[name] = node
            if parent is not None and parent in nodes:
                nodes[parent].children.append(name)
        # Totals and trainable flags bottom-up: children come after parents in named_modules.
        for name in reversed(list(nodes)):
            node = nodes[name]
            if node.parent is not None and node.parent in nodes:
                up = nodes[node.parent]
                up.total_params += node.total_params
                if node.trainable is not None:
                    up.trainable = node.trainable if up.trainable is None else (up.trainable and node.trainable)
        return cls(nodes, type(model).__name__)

    def __getitem__(self, name: str) -> ModuleNode:
        return self.nodes[name]

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[ModuleNode]:
        return iter(self.nodes.values())

    @property
    def root(self) -> ModuleNode:
        return self.nodes[""]

    def leaves(self) -> list[str]:
        return [n.name for n in self.nodes.values() if n.name and n.is_leaf]

    def descendants(self, name: str) -> list[str]:
        """Qualified names below ``name`` (not including it), depth first."""
        out: list[str] = []
        stack = list(reversed(self.nodes[name].children))
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(reversed(self.nodes[n].children))
        return out

    def of_type(self, type_name: str) -> list[str]:
        return [n.name for n in self.nodes.values() if n.type == type_name and n.name]

    def expected_calls(self) -> int | None:
        """Module calls in one forward (after ``probe``)."""
        if not self.probed:
            return None
        return sum(n.calls or 0 for n in self.nodes.values())

    @torch.no_grad()
    def probe(self, model: nn.Module, x: torch.Tensor | ModelInputs) -> ModuleTree:
        """Run one forward under ``no_grad`` (eval mode) to learn calls, shapes and in-place
        modules. Hooks are removed and the mode restored afterwards.

        Raises
        ------
        CaptureError
            When the forward fails, naming the module.
        """
        for node in self.nodes.values():
            node.calls = 0
            node.output_shapes = []
            node.inplace = False
            node.output_bytes = 0
        recorder = _ProbeRecorder(self.nodes)
        t0 = time.perf_counter()
        with hooks_installed(model, train=False) as hooks:
            for name, module in model.named_modules():
                if name in self.nodes:
                    hooks.forward_pre(module, recorder.pre_hook(name))
                    hooks.forward(module, recorder.post_hook(name))
            try:
                call_model(model, x)
            except Exception as exc:
                raise recorder.forward_failed(exc) from exc
        self.probed = True
        self.call_order = recorder.order
        self.call_io = [call.frozen() for call in recorder.calls]
        self.probe_seconds = time.perf_counter() - t0
        return self


class TensorKey(NamedTuple):
    """A tensor *value*: a serial number per tensor object, and its version counter.

    Keys of one tensor order by version, so ``a <= b`` means ``b`` is ``a`` or a later
    in-place change of it.
    """

    serial: int
    version: int


@dataclass
class _OpenCall:
    """A ``CallIO`` being filled in: the output and return tick arrive after the start."""

    name: str
    input_key: TensorKey | None
    input_bytes: int
    start: int
    output_key: TensorKey | None = None
    output_bytes: int = 0
    end: int = -1

    def frozen(self) -> CallIO:
        return CallIO(self.name, self.input_key, self.input_bytes, self.output_key,
                      self.output_bytes, self.start, self.end)


class _ProbeRecorder:
    """The forward pre-hooks and hooks of one probe, and what they saw."""

    def __init__(self, nodes: dict[str, ModuleNode]):
        self.nodes = nodes
        self.running: list[str] = []
        self.order: list[str] = []
        self.calls: list[_OpenCall] = []
        self._open: list[_OpenCall] = []
        # Tensor identity that survives id() reuse: id -> (weak reference, serial number).
        self._serials: dict[int, tuple[weakref.ref, int]] = {}
        self._counter = itertools.count()
        self._ticks = itertools.count()

    def key_of(self, t: torch.Tensor) -> TensorKey:
        entry = self._serials.get(id(t))
        if entry is None or entry[0]() is not t:
            entry = (weakref.ref(t), next(self._counter))
            self._serials[id(t)] = entry
        return TensorKey(entry[1], t._version)

    def pre_hook(self, name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        node = self.nodes[name]

        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            self.running.append(name)
            node.calls = (node.calls or 0) + 1
            if node.calls == 1:
                self.order.append(name)
            x = next((a for a in args if isinstance(a, torch.Tensor)), None)
            call = _OpenCall(
                name=name,
                input_key=None if x is None else self.key_of(x),
                input_bytes=0 if x is None else x.numel() * x.element_size(),
                start=next(self._ticks),
            )
            self._open.append(call)
            self.calls.append(call)
        return hook

    def post_hook(self, name: str) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        node = self.nodes[name]

        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            self.running.pop()
            call = self._open.pop()
            call.end = next(self._ticks)
            _, y = primary_tensor(output)
            if y is None:
                return
            call.output_key, call.output_bytes = self.key_of(y), y.numel() * y.element_size()
            node.output_shapes.append(tuple(y.shape))
            node.output_dtype = str(y.dtype).replace("torch.", "")
            node.output_bytes += y.numel() * y.element_size()
            if any(a is y for a in args if isinstance(a, torch.Tensor)):
                # Handing the input back unchanged (eval-mode Dropout, Identity) is not in-place:
                # only a changed version counter says the module wrote into its input.
                before = call.input_key
                if before is None or self.key_of(y) != before:
                    node.inplace = True
        return hook

    def forward_failed(self, exc: Exception) -> CaptureError:
        where = f" in module '{self.running[-1]}'" if self.running else ""
        first = str(exc).splitlines()[0] if str(exc) else ""
        return CaptureError(
            f"The model's forward failed{where}: {type(exc).__name__}: {first}",
            forward_fix(exc),
        )
