"""The model graph: the network's data flow, from one probe forward.

No symbolic tracing (``torch.fx`` and ``torch.export`` fail on control flow, LSTMs and
dict outputs): the model runs once, as it is, and the graph is what happened.

* Every module call is a node (leaves and containers; a module called twice is two
  nodes, ``call`` 0 and 1), found with forward pre-hooks and forward hooks.
* The tensor operations *between* modules (``x + identity``, ``torch.cat``, ``flatten``,
  attention's matmuls and softmax...) are nodes too, recorded with a
  ``TorchFunctionMode`` that is active during the probe only. Operations inside a leaf
  module's ``forward`` (the ``F.conv2d`` of a ``Conv2d``) belong to that leaf and are not
  recorded; pure bookkeeping (``contiguous``, ``to``, ``detach``, ``clone``...) is folded
  away: its output counts as its input.
* Edges are tensors, from the node that produced a value to the node that used it, with
  shape and dtype. A tensor changed in place (``out += identity``, ``ReLU(inplace)``) is
  a new value with a new producer, so the residual add gets one edge from the block input
  (skip) and one from the branch.
* Each node knows its parent container (the module whose ``forward`` was running), and
  edges join the deepest nodes only: collapsing a container (:meth:`ModelGraph.view`)
  reroutes the edges of everything inside it to it.

Hooks and the mode exist only inside :func:`extract_graph`, installed by
``gradexplorer.hooks.hooks_installed``, which removes them in ``finally``.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

import torch
from torch import nn
from torch.overrides import (
    TorchFunctionMode,
    _get_function_stack_at,
    _len_torch_function_stack,
    _pop_torch_function_stack,
    _push_on_torch_function_stack,
)

from gradexplorer.analysis.gradient_flow import layer_flags, neighbour_flags
from gradexplorer.base.errors import CaptureError, GradExplorerError
from gradexplorer.base.forward_errors import forward_fix
from gradexplorer.capturing.capture import primary_tensor
from gradexplorer.capturing.inputs import ModelInputs, first_tensor_input
from gradexplorer.hooks.installed import hooks_installed
from gradexplorer.stats.record import TensorStats

GRAPH_FORMAT = "gradexplorer.graph"
GRAPH_VERSION = 1
KINDS = ("input", "output", "module", "op")

#: Operations whose output is their input for the reader of a graph: they are folded.
FOLDED_OPS = frozenset({
    "contiguous", "detach", "detach_", "clone", "to", "type", "type_as", "float", "double", "half",
    "bfloat16", "cpu", "cuda", "requires_grad_", "data", "retain_grad", "align_to", "as_subclass",
    "coalesce", "pin_memory", "share_memory_",
})

#: Default number of visible nodes the collapsed view aims at.
DEFAULT_VISIBLE = 60


class NodeStats(TypedDict, total=False):
    """The statistics a graph node shows (``GraphNode.stats``): from a capture
    (:func:`node_stats_from_calls`, ``ModelGraph.attach_capture``), from the graph's own
    backward (``gradexplorer.model_graph.grads``), or from a comparison
    (``gradexplorer.model_graph.compare``). A graph read back from a file may hold keys of
    its own besides these.

    Keys
    ----
    grad_l2, grad_mean_abs, grad_rms : float or None
        Of the gradient at the node's output (None: no gradient reached it).
    activation_std : float or None
        Of the output itself.
    nonfinite : bool
        NaN or Inf in the output or its gradient.
    zero : bool
        The gradient is exactly zero everywhere.
    flags : list of str
        ``gradexplorer.analysis.gradient_flow``'s flags.
    div_grad, div_activation, grad_ratio : float or None
        A comparison's divergences (``gradexplorer.model_graph.compare.divergence_values``).
    """

    grad_l2: float | None
    grad_mean_abs: float | None
    grad_rms: float | None
    activation_std: float | None
    nonfinite: bool
    zero: bool
    flags: list[str]
    div_grad: float | None
    div_activation: float | None
    grad_ratio: float | None


@dataclass
class GraphNode:
    """One node of the graph.

    Attributes
    ----------
    id : str
        Unique within the graph: ``m:<name>:<call>`` for module calls (``m::0`` is the
        model itself), ``op:<n>``, ``in:<key>``, ``out:<key>``.
    kind : str
        ``input``, ``output``, ``module`` or ``op``.
    name : str
        Qualified module name (``""`` for the model), op name (``add``, ``cat``), or the
        input/output key.
    type : str
        Module class, or the function (``Tensor.add_``, ``torch.cat``, ``F.relu``).
    call : int or None
        0-based call index of the module in the forward (modules only).
    parent : str or None
        Id of the enclosing container's node.
    shape, dtype : tuple or None, str or None
        Of the (first) output.
    stats : NodeStats or None
        Statistics attached after a capture (see :func:`node_stats_from_calls`).
    """

    id: str
    kind: str
    name: str
    type: str
    call: int | None = None
    parent: str | None = None
    shape: tuple | None = None
    dtype: str | None = None
    stats: NodeStats | None = None

    @property
    def label(self) -> str:
        if self.kind == "module":
            parts = self.name.split(".") if self.name else ["(model)"]
            # "0" alone says little: blocks of a Sequential read "layer1.0".
            short = ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]
            return short + (f" #{self.call + 1}" if self.call else "")
        return self.name


@dataclass
class GraphEdge:
    """A tensor from ``src`` to ``dst`` (both deepest nodes: no container has edges).

    Attributes
    ----------
    tensor : int
        Which value flows (one per produced value: several edges share it when a tensor
        is used several times).
    grad_l2 : float or None
        L2 norm of the gradient of the target with respect to that tensor (after a
        gradient pass or from a capture).
    """

    src: str
    dst: str
    shape: tuple
    dtype: str
    tensor: int
    grad_l2: float | None = None


@dataclass
class VisibleEdge:
    """An edge of a collapsed view: the graph edges it stands for, between visible nodes."""

    src: str
    dst: str
    members: list[GraphEdge]

    @property
    def shape(self) -> tuple:
        return self.members[0].shape

    @property
    def grad_l2(self) -> float | None:
        """Norm of the gradients of the distinct tensors it carries (None when unknown)."""
        seen: dict[int, float] = {}
        for e in self.members:
            if e.grad_l2 is None:
                return None
            seen[e.tensor] = e.grad_l2
        return math.sqrt(sum(v * v for v in seen.values()))


@dataclass
class GraphView:
    """What is drawn at one collapse state: visible nodes and the edges between them."""

    nodes: list[str]
    edges: list[VisibleEdge]
    hidden: list[GraphEdge] = field(default_factory=list)  # inside a collapsed container


class ModelGraph:
    """Nodes at every depth (parents make the hierarchy) and edges between the deepest ones."""

    def __init__(self, nodes: Iterable[GraphNode], edges: Iterable[GraphEdge], meta: dict | None = None):
        self.nodes: dict[str, GraphNode] = {n.id: n for n in nodes}
        self.edges: list[GraphEdge] = list(edges)
        self.meta: dict = dict(meta or {})
        self.children: dict[str, list[str]] = {}
        for n in self.nodes.values():
            if n.parent is not None:
                self.children.setdefault(n.parent, []).append(n.id)
        self._depth: dict[str, int] = {}
        self._producers: dict | None = None
        for nid in self.nodes:
            self.depth(nid)
        self._top_down = sorted(self.nodes, key=self._depth.__getitem__)  # parents before children

    # -- structure ------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[GraphNode]:
        return iter(self.nodes.values())

    def depth(self, node_id: str) -> int:
        """Number of containers around ``node_id`` (walked iteratively and cached: a file's
        parent chain can be deeper than Python's stack; the schema has refused cycles)."""
        d = self._depth.get(node_id)
        if d is not None:
            return d
        chain = []
        nid: str | None = node_id
        while nid is not None and nid not in self._depth:
            chain.append(nid)
            nid = self.nodes[nid].parent
            if len(chain) > len(self.nodes):
                raise GradExplorerError("The model graph's parents form a cycle.", "Write the graph again.")
        d = -1 if nid is None else self._depth[nid]
        for c in reversed(chain):
            d += 1
            self._depth[c] = d
        return self._depth[node_id]

    def ancestors(self, node_id: str) -> list[str]:
        """Enclosing containers, outermost first."""
        out: list[str] = []
        p = self.nodes[node_id].parent
        while p is not None and len(out) <= len(self.nodes):
            out.append(p)
            p = self.nodes[p].parent
        return out[::-1]

    def is_container(self, node_id: str) -> bool:
        return bool(self.children.get(node_id))

    def containers(self) -> list[str]:
        return [nid for nid in self.nodes if self.is_container(nid)]

    def descendants(self, node_id: str) -> list[str]:
        out, todo = [], list(self.children.get(node_id, ()))
        while todo:
            nid = todo.pop()
            out.append(nid)
            todo.extend(self.children.get(nid, ()))
        return out

    def output_producer(self, node_id: str) -> str | None:
        """For a container, the deepest node that produced the value it returned (a
        ResNet block's last ReLU call): the same tensor, so the same statistics. ``None``
        when unknown (graphs without ``node_values``, or a container that returns its input)."""
        producers = self._producers
        if producers is None:
            producers = self._producers = {vid: nid for nid, vid in self.meta.get("node_values", {}).items()
                                           if nid in self.nodes and not self.is_container(nid)}
        vid = self.meta.get("node_values", {}).get(node_id)
        found = producers.get(vid) if vid is not None else None
        return found if found is not None and node_id in self.ancestors(found) else None

    def shown_stats(self, node_id: str) -> NodeStats | None:
        """The statistics a node is drawn with: its own, or for a container captured only
        through its children, those of the node that produced its output."""
        stats = self.nodes[node_id].stats
        if stats is None and self.is_container(node_id):
            producer = self.output_producer(node_id)
            return self.nodes[producer].stats if producer is not None else None
        return stats

    def module_node(self, name: str, call: int = 0) -> GraphNode | None:
        """The node of call ``call`` of module ``name``, or ``None``."""
        return self.nodes.get(module_node_id(name, call))

    def max_depth(self) -> int:
        return max(self._depth.values(), default=0)

    # -- collapsing -----------------------------------------------------------------
    def expanded_to_depth(self, depth: int) -> set[str]:
        """The containers to expand so that nodes up to ``depth`` are shown."""
        return {nid for nid in self.containers() if self.depth(nid) < depth}

    def default_depth(self, max_visible: int = DEFAULT_VISIBLE) -> int:
        """The deepest collapse depth (at least 1) that keeps at most ``max_visible`` nodes."""
        best = 1
        for d in range(1, self.max_depth() + 1):
            if len(self.view(self.expanded_to_depth(d)).nodes) <= max_visible:
                best = d
            else:
                break
        return best

    def representative(self, node_id: str, expanded: set[str]) -> str:
        """The visible node standing for ``node_id``: its outermost collapsed ancestor."""
        for a in self.ancestors(node_id):
            if a not in expanded:
                return a
        return node_id

    def view(self, expanded: Iterable[str]) -> GraphView:
        """Visible nodes and rerouted edges when exactly the containers in ``expanded`` are open.

        A node is visible when all its ancestors are expanded and it is not itself an
        expanded container. Each graph edge goes to the edge between its endpoints'
        representatives, or into ``hidden`` when both lie in the same collapsed container.
        Parallel edges carrying the same pair of visible nodes are merged.
        """
        expanded = {e for e in expanded if self.is_container(e)}
        # One pass, parents before children: a node's outermost collapsed ancestor is its
        # parent's, or its parent when that is collapsed (linear in the nodes at any depth).
        top: dict[str, str | None] = {}
        for nid in self._top_down:
            parent = self.nodes[nid].parent
            if parent is None:
                top[nid] = None
            else:
                above = top[parent]
                top[nid] = above if above is not None else (None if parent in expanded else parent)

        def rep_of(nid: str) -> str:
            r = top[nid]
            return nid if r is None else r

        visible = [nid for nid in self.nodes if nid not in expanded and top[nid] is None]
        merged: dict[tuple[str, str], VisibleEdge] = {}
        hidden = []
        for e in self.edges:
            s, d = rep_of(e.src), rep_of(e.dst)
            if s == d:
                hidden.append(e)
                continue
            ve = merged.get((s, d))
            if ve is None:
                merged[(s, d)] = VisibleEdge(s, d, [e])
            else:
                ve.members.append(e)
        return GraphView(visible, list(merged.values()), hidden)

    # -- statistics -----------------------------------------------------------------
    def attach_capture(self, cap: Any) -> int:
        """Put a capture's statistics on the module nodes of the same layer and call.

        Edges leaving a module node with that call's recorded output get its gradient
        norm (the capture hooked the same tensor).

        Returns
        -------
        int
            How many nodes got statistics.
        """
        flags = layer_flags(cap)
        values = self.meta.get("node_values", {})
        inputs = self.meta.get("node_inputs", {})
        op_of_value = {vid: nid for nid, vid in values.items() if self.nodes[nid].kind == "op"}
        edges_of: dict[int, list[GraphEdge]] = {}
        for e in self.edges:
            edges_of.setdefault(e.tensor, []).append(e)
        n = 0
        for name, index, call in cap.iter_calls():
            node = self.module_node(name, index)
            if node is None:
                continue
            node.stats = node_stats_from_calls(call.stats)
            node.stats["flags"] = list(flags.get(name, []))
            n += 1
            _put_edge_grad(edges_of, values.get(node.id), (call.stats or {}).get("grad_output"))
            # The gradient of the call's first input is the gradient of the op that made it
            # (a tensor hook sees the whole gradient of its tensor, from every consumer).
            grad_in = (call.stats or {}).get("grad_input")
            op = op_of_value.get(inputs.get(node.id, -1))
            if grad_in and op is not None:
                stats = node_stats_from_calls({"grad_output": grad_in})
                stats["flags"] = (["nan/inf"] if stats["nonfinite"] else []) + (["zero"] if stats["zero"] else [])
                self.nodes[op].stats = stats
                _put_edge_grad(edges_of, values[op], grad_in)
        flag_by_neighbours(self, kinds=("op",))
        return n

    # -- the JSON contract ----------------------------------------------------------
    def to_dict(self) -> dict:
        """The graph as plain containers (``format`` ``gradexplorer.graph``, version 1)."""
        return {
            "format": GRAPH_FORMAT,
            "version": GRAPH_VERSION,
            "nodes": [{
                "id": n.id, "kind": n.kind, "name": n.name, "type": n.type,
                "call": n.call, "parent": n.parent,
                "shape": list(n.shape) if n.shape is not None else None,
                "dtype": n.dtype,
                "stats": _plain(n.stats) if n.stats is not None else None,
            } for n in self.nodes.values()],
            "edges": [{
                "src": e.src, "dst": e.dst, "shape": list(e.shape), "dtype": e.dtype,
                "tensor": e.tensor, "grad_l2": _plain(e.grad_l2),
            } for e in self.edges],
            "meta": _plain(dict(self.meta)),
        }

    @classmethod
    def from_dict(cls, data: Mapping, source: str = "the graph") -> ModelGraph:
        """Read :meth:`to_dict`'s output back.

        Raises
        ------
        GradExplorerError
            When ``data`` is not a gradexplorer graph of a known version.
        """
        if not isinstance(data, Mapping) or data.get("format") != GRAPH_FORMAT:
            raise GradExplorerError(f"{source} is not a gradexplorer graph.",
                                    "Write it with 'gradexplorer graph --out FILE.json'.")
        if data.get("version") != GRAPH_VERSION:
            raise GradExplorerError(f"{source} has graph version {data.get('version')!r}; this "
                                    f"gradexplorer reads version {GRAPH_VERSION}.", "Update gradexplorer.")
        try:
            nodes = [GraphNode(str(n["id"]), str(n["kind"]), str(n["name"]), str(n["type"]), n.get("call"),
                               n.get("parent"), tuple(n["shape"]) if n.get("shape") is not None else None,
                               n.get("dtype"), n.get("stats")) for n in data["nodes"]]
            edges = [GraphEdge(str(e["src"]), str(e["dst"]), tuple(e["shape"]), str(e.get("dtype", "")),
                               int(e.get("tensor", i)), e.get("grad_l2")) for i, e in enumerate(data["edges"])]
            graph = cls(nodes, edges, dict(data.get("meta") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise GradExplorerError(f"{source} is a damaged gradexplorer graph ({type(exc).__name__}: {exc}).",
                                    "Write it again with 'gradexplorer graph'.") from exc
        for e in graph.edges:
            if e.src not in graph.nodes or e.dst not in graph.nodes:
                raise GradExplorerError(f"{source} has an edge to a node it lacks ({e.src} -> {e.dst}).",
                                        "Write it again with 'gradexplorer graph'.")
        return graph


def _put_edge_grad(edges_of: Mapping[int, list[GraphEdge]], value: int | None, grad: TensorStats | None) -> None:
    """The gradient norm of the tensor ``value`` on every edge that carries it."""
    if grad is None or value is None:
        return
    for e in edges_of.get(value, ()):
        e.grad_l2 = _float(grad.get("l2"))


def module_node_id(name: str, call: int) -> str:
    return f"m:{name}:{call}"


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


def _plain(obj: Any) -> Any:
    """Plain Python containers and numbers only (JSON and ``weights_only`` loading)."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None  # JSON has no NaN or Inf; the node's "nonfinite" flag keeps the fact
    return obj


#: Node statistics that colour the graph, from the statistics of a captured call.
NODE_STATISTICS = ("grad_l2", "grad_mean_abs", "activation_std", "flags")


def node_stats_from_calls(stats: Mapping[str, TensorStats | None] | None) -> NodeStats:
    """The few numbers a graph node shows, from a ``CallRecord.stats`` dict.

    Returns
    -------
    NodeStats
        ``grad_l2``, ``grad_mean_abs``, ``grad_rms``, ``activation_std`` (floats or None),
        ``nonfinite`` (bool: NaN or Inf in the activation or its gradient), ``zero``
        (bool: the gradient is exactly zero everywhere).
    """
    stats = stats or {}
    act: Mapping[str, Any] = stats.get("activation") or {}
    grad: Mapping[str, Any] = stats.get("grad_output") or {}
    numel = grad.get("numel") or 0
    l2 = _float(grad.get("l2")) if grad else None
    return {
        "grad_l2": l2,
        "grad_mean_abs": _float(grad.get("mean_abs")) if grad else None,
        "grad_rms": (l2 / math.sqrt(numel)) if (l2 is not None and numel) else None,
        "activation_std": _float(act.get("std")) if act else None,
        "nonfinite": bool((act.get("nan_count") or 0) + (act.get("inf_count") or 0)
                          + (grad.get("nan_count") or 0) + (grad.get("inf_count") or 0)),
        "zero": bool(grad) and grad.get("zero_fraction") == 1.0,
    }


# ---------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------


def flag_by_neighbours(graph: ModelGraph, kinds: tuple[str, ...] = ("module", "op")) -> None:
    """Add ``"vanishing"`` / ``"exploding"`` to the flags of the nodes of ``kinds``.

    The rule of ``gradexplorer.analysis.gradient_flow`` (RMS gradient below 1e-3 or above 1e3 times the
    median of up to 4 neighbours on each side), applied to the deepest module and op
    nodes that have a gradient, in forward order: an op (a residual ``add``, a ``cat``,
    attention's ``matmul``) is judged against the modules and ops around it. Containers
    are not judged (their value is their last inner node's).
    """
    seq = [(n, n.stats) for n in graph.nodes.values()
           if n.kind in ("module", "op") and not graph.is_container(n.id) and n.stats
           and n.stats.get("grad_rms") is not None]
    rms = [math.nan if stats.get("nonfinite") else float(cast(float, stats["grad_rms"])) for _n, stats in seq]
    for (node, stats), flag in zip(seq, neighbour_flags(rms)):
        if flag is None or node.kind not in kinds:
            continue
        flags = stats.setdefault("flags", [])
        if flag not in flags:
            flags.append(flag)


def tensors_in(obj: Any, out: list, depth: int = 0) -> list:
    """Tensors in nested tuples, lists and dicts, in order."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, ModelInputs):
        tensors_in([*obj.args, *obj.kwargs.values()], out, depth + 1)
    elif depth < 6:
        if isinstance(obj, Mapping):
            for v in obj.values():
                tensors_in(v, out, depth + 1)
        elif isinstance(obj, (tuple, list)):
            for v in obj:
                tensors_in(v, out, depth + 1)
    return out


def _keyed_tensors(obj: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """``(key, tensor)`` for each tensor in a nested output (``"0"``, ``"out"``, ``"1.0"``)."""
    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    items: list = []
    if isinstance(obj, Mapping):
        items = [(str(k), v) for k, v in obj.items()]
    elif isinstance(obj, (tuple, list)):
        fields = getattr(obj, "_fields", None)
        items = [(fields[i] if fields else str(i), v) for i, v in enumerate(obj)]
    out = []
    for k, v in items:
        out.extend(_keyed_tensors(v, f"{prefix}.{k}" if prefix else k))
    return out


def _op_name(func: Callable) -> tuple[str, str]:
    """``(name, type)`` of a function seen by the mode: ``("add", "Tensor.add_")``."""
    raw = getattr(func, "__name__", None) or repr(func)
    if raw == "__get__":
        attr = getattr(getattr(func, "__self__", None), "__name__", "attr")
        return attr, f"Tensor.{attr}"
    module = getattr(func, "__module__", None) or ""
    qual = getattr(func, "__qualname__", raw)
    if qual.startswith(("TensorBase.", "Tensor.")):
        typ = "Tensor." + raw
    elif module.startswith("torch.nn.functional") or module == "torch._C._nn":
        typ = "F." + raw
    elif module.startswith("torch"):
        typ = "torch." + raw
    else:
        typ = f"{module}.{raw}" if module else raw
    name = raw.strip("_")
    if raw.startswith("__i") and raw.endswith("__") and name[1:] in _ARITHMETIC:
        name = name[1:]  # __iadd__ -> add
    elif raw.startswith("__r") and raw.endswith("__") and name[1:] in _ARITHMETIC:
        name = name[1:]  # __radd__ -> add
    name = {"truediv": "div", "floordiv": "floor_divide", "and": "logical_and", "or": "logical_or"}.get(name, name)
    return name, typ


_ARITHMETIC = {"add", "sub", "mul", "truediv", "floordiv", "matmul", "pow", "mod", "and", "or", "xor",
               "lshift", "rshift", "div"}


class _Frame:
    __slots__ = ("leaf", "node_id")

    def __init__(self, node_id: str, leaf: bool):
        self.node_id = node_id
        self.leaf = leaf


class GraphRecorder:
    """What one probe forward builds; its methods are called by hooks and the op mode.

    Parameters
    ----------
    on_value : callable, optional
        ``on_value(value_id, tensor, node_id)`` for each value a node produces (the
        gradient pass hooks them).
    """

    def __init__(self, on_value: Callable[[int, torch.Tensor, str], None] | None = None):
        self.nodes: dict[str, GraphNode] = {}
        self.edges: dict[tuple[str, str, int], GraphEdge] = {}
        # id(tensor) -> (weak reference, value id, producer node id)
        self.values: dict[int, tuple] = {}
        self.stack: list[_Frame] = []
        self.calls: dict[str, int] = {}
        # Node id -> the value of its (primary) output: a leaf's or op's own, a container's
        # last inner producer's.
        self.node_values: dict[str, int] = {}
        # Module node id -> the value of its first tensor input (the tensor whose gradient a
        # capture records as that call's ``grad_input``).
        self.node_inputs: dict[str, int] = {}
        self.ops = itertools.count()
        self.value_ids = itertools.count()
        self.busy = False
        self.on_value = on_value
        self.mode: _OpMode | None = None  # set while record_forward runs

    # -- values ---------------------------------------------------------------------
    def lookup(self, t: torch.Tensor) -> tuple[int, str] | None:
        entry = self.values.get(id(t))
        if entry is None or entry[0]() is not t:
            return None
        return entry[1], entry[2]

    def produce(self, t: torch.Tensor, node_id: str) -> int:
        vid = next(self.value_ids)
        self.values[id(t)] = (weakref.ref(t), vid, node_id)
        if self.on_value is not None:
            self.on_value(vid, t, node_id)
        return vid

    def consume(self, tensors: Iterable[torch.Tensor], node_id: str) -> None:
        for t in tensors:
            found = self.lookup(t)
            if found is None:
                continue
            vid, src = found
            key = (src, node_id, vid)
            if key not in self.edges:
                self.edges[key] = GraphEdge(src, node_id, tuple(t.shape), _dtype(t), vid)

    def add_node(self, node: GraphNode) -> None:
        self.nodes[node.id] = node

    @property
    def parent(self) -> str | None:
        return self.stack[-1].node_id if self.stack else None

    # -- module hooks ---------------------------------------------------------------
    def pre_hook(self, name: str, leaf: bool, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if leaf and self.mode is not None:
            self.mode.pause()  # first: the hook's own shape reads need not pass through the mode
        self.busy = True
        try:
            call = self.calls.get(name, 0)
            self.calls[name] = call + 1
            nid = module_node_id(name, call)
            self.add_node(GraphNode(nid, "module", name, type(module).__name__, call, self.parent))
            x = first_tensor_input(args, kwargs)
            found = self.lookup(x) if x is not None else None
            if found is not None:
                self.node_inputs[nid] = found[0]
            if leaf:
                self.consume(tensors_in((args, kwargs), []), nid)
            self.stack.append(_Frame(nid, leaf))
        finally:
            self.busy = False

    def post_hook(self, name: str, leaf: bool, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        self.busy = True
        try:
            frame = self.stack.pop()
            node = self.nodes[frame.node_id]
            outs = tensors_in(output, [])
            first: torch.Tensor | None = None
            if outs:
                _, first = primary_tensor(output)
                first = first if first is not None else outs[0]
                node.shape, node.dtype = tuple(first.shape), _dtype(first)
            if leaf:
                for t in outs:
                    vid = self.produce(t, node.id)
                    if first is t:
                        self.node_values[node.id] = vid
            elif first is not None:
                found = self.lookup(first)
                if found is not None:
                    self.node_values[node.id] = found[0]
        finally:
            self.busy = False
            if leaf and self.mode is not None:
                self.mode.resume()  # the ops after this leaf are recorded again

    # -- operations -----------------------------------------------------------------
    def op(self, func: Callable, args: tuple, kwargs: dict, out: Any) -> None:
        name, typ = _op_name(func)
        if name == "setitem":
            outs = [args[0]] if args and isinstance(args[0], torch.Tensor) else []
        else:
            outs = tensors_in(out, [])
        if not outs:
            return  # .shape, .item(), comparisons to Python values: nothing flows on
        ins = tensors_in((args, kwargs), [])
        tracked = [t for t in ins if self.lookup(t) is not None]
        if not tracked:
            return  # constants and parameters alone: not part of the data flow
        if name in FOLDED_OPS:
            found = self.lookup(tracked[0])
            assert found is not None  # tracked holds only what lookup finds
            src = found[1]
            for t in outs:
                if t is not tracked[0]:
                    self.produce(t, src)
            return
        nid = f"op:{next(self.ops)}"
        first = outs[0]
        self.add_node(GraphNode(nid, "op", name, typ, None, self.parent, tuple(first.shape), _dtype(first)))
        self.consume(tracked, nid)
        for i, t in enumerate(outs):
            vid = self.produce(t, nid)
            if i == 0:
                self.node_values[nid] = vid

    def graph(self, meta: dict | None = None) -> ModelGraph:
        meta = dict(meta or {})
        meta["node_values"] = dict(self.node_values)
        meta["node_inputs"] = dict(self.node_inputs)
        return ModelGraph(self.nodes.values(), self.edges.values(), meta)


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _dtype(t: torch.Tensor) -> str:
    name = _DTYPE_NAMES.get(t.dtype)
    if name is None:
        name = _DTYPE_NAMES[t.dtype] = str(t.dtype).replace("torch.", "")
    return name


class _OpMode(TorchFunctionMode):
    """Records tensor operations that run outside leaf modules.

    Inside a leaf module nothing is recorded, so the mode steps off the torch-function
    stack for the leaf's forward (``pause`` in the pre-hook, ``resume`` in the hook):
    otherwise every ``conv2d`` and ``batch_norm`` of the model would pass through Python
    here for nothing (about 6,000 calls in efficientnet_v2_l).
    """

    def __init__(self, recorder: GraphRecorder):
        super().__init__()
        self.recorder = recorder
        self._pauses: list[bool] = []

    def pause(self) -> None:
        n = _len_torch_function_stack()
        # Only when this mode is on top (another mode pushed above it stays in charge).
        on_top = n > 0 and _get_function_stack_at(n - 1) is self
        if on_top:
            _pop_torch_function_stack()
        self._pauses.append(on_top)

    def resume(self) -> None:
        if self._pauses and self._pauses.pop():
            _push_on_torch_function_stack(self)

    def resume_all(self) -> None:
        """Back on the stack (a leaf's forward raised, so its hook never ran)."""
        while self._pauses:
            self.resume()

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        rec = self.recorder
        if rec.busy or not rec.stack or rec.stack[-1].leaf:
            return out
        rec.busy = True
        try:
            rec.op(func, args, kwargs, out)
        finally:
            rec.busy = False
        return out


def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model(x)``, ``model(*xs)`` for a tuple or list, ``model(**xs)`` for a dict, and
    ``model(*args, **kwargs)`` for :class:`gradexplorer.capturing.inputs.ModelInputs` (a batch of several inputs)."""
    if isinstance(inputs, ModelInputs):
        return inputs.call(model)
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _input_keys(inputs: Any) -> list[tuple[str, torch.Tensor]]:
    if isinstance(inputs, torch.Tensor):
        return [("input", inputs)]
    if isinstance(inputs, ModelInputs):  # positions by index, keywords by name
        return _keyed_tensors(list(inputs.args)) + _keyed_tensors(inputs.kwargs)
    return _keyed_tensors(inputs)


def record_forward(model: nn.Module, inputs: Any, recorder: GraphRecorder) -> Any:
    """Run ``model`` on ``inputs`` once with the recorder's hooks and mode; return its output.

    Hooks and the mode are removed in ``finally``; the model's modes are not changed here.

    Raises
    ------
    CaptureError
        When forward fails, naming the module that was running.
    """
    for key, t in _input_keys(inputs):
        nid = f"in:{key}"
        recorder.add_node(GraphNode(nid, "input", key, "input", None, None, tuple(t.shape), _dtype(t)))
        recorder.node_values[nid] = recorder.produce(t, nid)
    with hooks_installed() as hooks:
        for name, module in model.named_modules():
            leaf = next(module.children(), None) is None
            hooks.forward_pre(module, lambda m, a, k, _n=name, _l=leaf: recorder.pre_hook(_n, _l, m, a, k),
                              with_kwargs=True)
            hooks.forward(module, lambda m, a, k, o, _n=name, _l=leaf: recorder.post_hook(_n, _l, m, a, k, o),
                          with_kwargs=True)
        try:
            with _OpMode(recorder) as mode:
                recorder.mode = mode
                try:
                    output = call_model(model, inputs)
                finally:
                    mode.resume_all()
                    recorder.mode = None
        except GradExplorerError:
            raise
        except Exception as exc:
            where = ""
            if recorder.stack:
                name = recorder.nodes[recorder.stack[-1].node_id].name
                where = f" in module '{name}'" if name else ""
            raise CaptureError(
                f"The model's forward failed{where}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}",
                forward_fix(exc),
            ) from exc
        finally:
            recorder.stack.clear()
    for key, t in _keyed_tensors(output, ""):
        key = key or "output"
        nid = f"out:{key}"
        recorder.add_node(GraphNode(nid, "output", key, "output", None, None, tuple(t.shape), _dtype(t)))
        recorder.consume([t], nid)
        found = recorder.lookup(t)
        if found is not None:
            recorder.node_values[nid] = found[0]
    return output


def extract_graph(model: nn.Module, inputs: Any) -> ModelGraph:
    """The data-flow graph of ``model`` on ``inputs``, from one forward in eval mode.

    Parameters
    ----------
    model : nn.Module
        Left as it was: hooks removed, training modes restored. Runs under ``no_grad``.
    inputs : Tensor, tuple/list of tensors, or dict
        Passed as ``model(x)``, ``model(*inputs)`` or ``model(**inputs)``. A batch of one
        sample is enough: the graph does not depend on the batch size.

    Returns
    -------
    ModelGraph

    Raises
    ------
    CaptureError
        When forward fails.
    """
    recorder = GraphRecorder()
    with hooks_installed(model, train=False), torch.no_grad():
        record_forward(model, inputs, recorder)
    return recorder.graph({"model": type(model).__name__})


def first_sample(inputs: Any) -> Any:
    """The first sample of a batch (of each tensor in a tuple or dict): graphs do not depend
    on the batch size, and one sample keeps the probe cheap."""
    if isinstance(inputs, torch.Tensor):
        return inputs[:1] if inputs.dim() > 0 else inputs
    if isinstance(inputs, ModelInputs):
        return inputs[:1]
    if isinstance(inputs, Mapping):
        return {k: first_sample(v) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(first_sample(v) for v in inputs)
    return inputs


def graph_for_capture(model: nn.Module, inputs: Any, cap: Any) -> ModelGraph:
    """The graph a capture file carries: extracted from one sample of the capture's batch,
    with the capture's statistics on the module nodes and its output-gradient norms on
    the edges that carry a captured layer's output.

    Parameters
    ----------
    model : nn.Module
        The captured model (left as it was).
    inputs : Tensor, tuple or dict
        The capture's batch; only its first sample runs (shapes in the graph have batch 1).
    cap : Capture

    Returns
    -------
    ModelGraph
        ``to_dict()`` of it is what ``Capture.graph`` holds.
    """
    device = next((p.device for p in model.parameters()), None)
    sample = first_sample(inputs)
    if device is not None and isinstance(sample, (torch.Tensor, ModelInputs)):
        sample = sample.to(device)
    graph = extract_graph(model, sample)
    graph.meta["probe_batch"] = 1
    graph.attach_capture(cap)
    return graph
