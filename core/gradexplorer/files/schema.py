"""The schema of a capture file, and the one pass that checks a file against it.

``torch.load(path, weights_only=True)`` only promises plain containers, tensors, strings
and numbers: a file edited by hand, damaged, or written by another tool can put a string
where a statistic belongs, a list where a dict belongs, or nest a value 2,000 levels
deep. Every reader of captures (the CLI's ``inspect``, ``diff`` and ``graph``, the
window's views) trusts the shapes and types below, so :func:`check_capture_data` walks
the whole loaded file once, before anything reads it, and names the first field that
breaks the schema ("field layers['conv1'].calls[0].stats.activation.mean is a str,
expected a number").

The schema is data (:class:`Spec` objects composed below), not ``isinstance`` checks
scattered through the readers. Unknown keys are allowed wherever the format may grow
(plain values only, nested at most ``MAX_PLAIN_DEPTH`` levels), so that a file from a
newer minor release still opens.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gradexplorer.base.errors import CaptureFileError
from gradexplorer.stats.record import TensorStats

#: Free-form values (unknown metadata keys, the dataset merge state) may nest this deep.
MAX_PLAIN_DEPTH = 16
#: Containers a graph node or a layer name may nest in (real models: under 20); deeper
#: nesting is a damaged file, and the views' trees and layouts would pay for it.
MAX_GRAPH_DEPTH = 128
#: Bins a histogram may have (the capture writes 64; a dataset capture up to a few hundred).
MAX_HIST_BINS = 1 << 16
#: Tensor kinds a call records (``stats`` keys; a dataset capture adds ``grad_norm``).
CALL_TENSORS = ("activation", "grad_output", "grad_input")
#: Node kinds of a carried graph (``gradexplorer.model_graph.graph``); the views colour nodes by kind.
GRAPH_NODE_KINDS = ("input", "output", "op", "module")
#: A graph node's numeric statistics (``gradexplorer.model_graph.graph.node_stats_from_calls``), coloured by the view.
GRAPH_NODE_STATS = ("grad_l2", "grad_mean_abs", "grad_rms", "activation_std")


class SchemaViolation(Exception):
    """A value breaks the schema: ``path`` names the field, ``problem`` says how."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path or 'the file'} {problem}")
        self.path = path
        self.problem = problem


def kind_of(value: Any) -> str:
    """The type of ``value`` in words ("a str", "a tensor", "None")."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return "a tensor"
    name = type(value).__name__
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def _shown(value: Any) -> str:
    """A scalar as the message shows it; never the repr of a container (it may be huge or deep)."""
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "…")
    if isinstance(value, (bool, int, float)) or value is None:
        return str(value)
    return kind_of(value)


def _key_path(path: str, key: Any) -> str:
    shown = repr(key) if isinstance(key, str) and len(key) <= 80 else (repr(key[:80] + "…") if isinstance(key, str)
                                                                          else _shown(key))
    return f"{path}[{shown}]"


def _field_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class Spec:
    """One kind of value in the schema; ``check`` raises :class:`SchemaViolation`."""

    expected = "a value"

    def check(self, value: Any, path: str) -> None:
        raise NotImplementedError

    def wrong_type(self, value: Any, path: str) -> SchemaViolation:
        return SchemaViolation(path, f"is {kind_of(value)}, expected {self.expected}")


class Number(Spec):
    """An int or float (not a bool); NaN and Inf allowed (empty tensors have NaN statistics)."""

    expected = "a number"

    def check(self, value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.wrong_type(value, path)


class Integer(Spec):
    """An int (not a bool, not a float), at least ``minimum`` when given."""

    def __init__(self, minimum: int | None = None, expected: str | None = None) -> None:
        self.minimum = minimum
        self.expected = expected or ("a count (an integer of 0 or more)" if minimum == 0 else "an integer")

    def check(self, value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaViolation(path, f"is {kind_of(value)} ({_shown(value)}), expected {self.expected}"
                                  if isinstance(value, float) else f"is {kind_of(value)}, expected {self.expected}")
        if self.minimum is not None and value < self.minimum:
            raise SchemaViolation(path, f"is {value}, expected {self.expected}")


class Fraction(Number):
    """A number in [0, 1]."""

    expected = "a fraction between 0 and 1"

    def check(self, value: Any, path: str) -> None:
        super().check(value, path)
        if not 0.0 <= value <= 1.0:
            raise SchemaViolation(path, f"is {_shown(value)}, expected {self.expected}")


class Text(Spec):
    """A str; one of ``choices``, or accepted by ``valid``, when given."""

    def __init__(self, choices: tuple[str, ...] = (), valid: Callable[[str], bool] | None = None,
                 expected: str | None = None) -> None:
        self.choices = choices
        self.valid = valid
        self.expected = expected or (f"one of {', '.join(repr(c) for c in choices)}" if choices else "a string")

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, str):
            raise self.wrong_type(value, path)
        if (self.choices and value not in self.choices) or (self.valid is not None and not self.valid(value)):
            raise SchemaViolation(path, f"is {_shown(value)}, expected {self.expected}")


class Flag(Spec):
    expected = "true or false"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, bool):
            raise self.wrong_type(value, path)


class Tensor(Spec):
    """A real (not complex) tensor, of ``ndim`` dimensions (or at least ``min_ndim``) when
    given; with ``nonempty`` it holds at least one element (and one sample, its first
    dimension); with ``finite`` every value is finite (histogram counts, which the views
    hand to the plotting library as they are); with ``nonnegative`` none is below zero
    (counts, of which the views draw logarithms); with ``ordered`` the values never decrease
    and none is NaN (histogram edges: the outermost of a log2 histogram are -inf and inf)."""

    def __init__(self, ndim: int | None = None, min_ndim: int = 0, nonempty: bool = False,
                 finite: bool = False, max_numel: int | None = None, ordered: bool = False,
                 nonnegative: bool = False) -> None:
        self.nonnegative = nonnegative
        self.ordered = ordered
        self.max_numel = max_numel
        self.ndim = ndim
        self.min_ndim = min_ndim
        self.nonempty = nonempty
        self.finite = finite
        self.expected = f"a {ndim}-D tensor" if ndim is not None else "a tensor"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, torch.Tensor):
            raise self.wrong_type(value, path)
        if (self.ndim is not None and value.dim() != self.ndim) or value.dim() < self.min_ndim:
            want = self.expected if self.ndim is not None else f"a tensor of {self.min_ndim} or more dimensions"
            raise SchemaViolation(path, f"has shape {tuple(value.shape)}, expected {want}")
        if value.is_complex() or value.is_quantized or value.layout != torch.strided:
            raise SchemaViolation(path, f"is a {str(value.dtype).removeprefix('torch.')} tensor"
                                  f"{'' if value.layout == torch.strided else ' (' + str(value.layout) + ')'}, "
                                  "expected real numbers (a capture holds float, integer or bool tensors)")
        if self.nonempty and value.numel() == 0:
            raise SchemaViolation(path, f"has shape {tuple(value.shape)}, no "
                                  f"{'samples' if value.dim() and value.shape[0] == 0 else 'values'}: "
                                  "expected a tensor with values to show")
        if self.max_numel is not None and value.numel() > self.max_numel:
            raise SchemaViolation(path, f"has {value.numel():,} values, expected at most {self.max_numel:,}")
        if self.finite and value.numel() and not bool(torch.isfinite(value.float()).all()):
            raise SchemaViolation(path, "holds NaN or infinite values, expected finite numbers")
        if self.nonnegative and value.numel() and bool((value < 0).any()):
            raise SchemaViolation(path, "holds negative values, expected counts")
        if self.ordered and value.numel():
            v = value.double().reshape(-1)
            if bool(torch.isnan(v).any()) or (v.numel() > 1 and bool((v[1:] < v[:-1]).any())):
                raise SchemaViolation(path, "holds NaN or decreasing values, expected histogram edges in order")


class Nullable(Spec):
    """``spec`` or None."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.expected = f"{spec.expected} or None"

    def check(self, value: Any, path: str) -> None:
        if value is not None:
            self.spec.check(value, path)


class Items(Spec):
    """A list (or tuple) of ``item``, of ``length`` items when given."""

    def __init__(self, item: Spec, length: int | None = None) -> None:
        self.item = item
        self.length = length
        self.expected = f"a list of {length} items" if length is not None else f"a list of {item.expected}"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, (list, tuple)):
            raise self.wrong_type(value, path)
        if self.length is not None and len(value) != self.length:
            raise SchemaViolation(path, f"has {len(value)} items, expected {self.length}")
        for i, v in enumerate(value):
            self.item.check(v, f"{path}[{i}]")


class Pair(Spec):
    """A list (or tuple) of exactly the given specs, in order."""

    def __init__(self, *items: Spec) -> None:
        self.items = items
        self.expected = f"a list of {len(items)} items ({', '.join(s.expected for s in items)})"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, (list, tuple)):
            raise self.wrong_type(value, path)
        if len(value) != len(self.items):
            raise SchemaViolation(path, f"has {len(value)} items, expected {len(self.items)}")
        for i, (spec, v) in enumerate(zip(self.items, value)):
            spec.check(v, f"{path}[{i}]")


class Named(Spec):
    """A dict from str (names the user chose: layers, parameters) to ``value``."""

    def __init__(self, value: Spec, max_dots: int | None = None) -> None:
        self.value = value
        self.max_dots = max_dots
        self.expected = "a dict of names"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise self.wrong_type(value, path)
        for k, v in value.items():
            if not isinstance(k, str):
                raise SchemaViolation(_key_path(path, k), f"has a key that is {kind_of(k)}, expected a string")
            if self.max_dots is not None and k.count(".") > self.max_dots:
                raise SchemaViolation(_key_path(path, k), f"is a name nested more than {self.max_dots} modules deep")
            self.value.check(v, _key_path(path, k))


class Plain(Spec):
    """Any value ``weights_only`` loading gives (containers, tensors, scalars), nested at
    most ``MAX_PLAIN_DEPTH`` levels: deeper nesting would exhaust the readers' recursion."""

    expected = "plain data"

    def check(self, value: Any, path: str) -> None:
        stack = [(value, path, 0)]
        while stack:  # iterative: the value may be nested far deeper than Python's stack allows
            v, p, depth = stack.pop()
            if isinstance(v, (dict, list, tuple)):
                if depth >= MAX_PLAIN_DEPTH:
                    raise SchemaViolation(p, f"is nested deeper than {MAX_PLAIN_DEPTH} levels")
                items = v.items() if isinstance(v, dict) else enumerate(v)
                stack.extend((child, _key_path(p, k) if isinstance(v, dict) else f"{p}[{k}]", depth + 1)
                             for k, child in items)
            elif not (v is None or isinstance(v, (bool, int, float, str, torch.Tensor))):
                raise SchemaViolation(p, f"is {kind_of(v)}, expected plain data")


PLAIN = Plain()


class Record(Spec):
    """A dict with known keys: ``required`` (must be present), ``optional``, and any other
    key holding ``others`` (plain data unless told); ``then`` checks relations between
    fields once each is valid."""

    def __init__(self, required: Mapping[str, Spec], optional: Mapping[str, Spec] | None = None,
                 then: Callable[[Any, str], None] | None = None, expected: str = "a dict",
                 others: Spec = PLAIN) -> None:
        self.required = dict(required)
        self.optional = dict(optional or {})
        self.then = then
        self.expected = expected
        self.others = others

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise self.wrong_type(value, path)
        for key, spec in self.required.items():
            if key not in value:
                raise SchemaViolation(_field_path(path, key), "is missing")
            spec.check(value[key], _field_path(path, key))
        for key, v in value.items():
            if key in self.required:
                continue
            spec = self.optional.get(key, self.others) if isinstance(key, str) else self.others
            spec.check(v, _field_path(path, key) if isinstance(key, str) else _key_path(path, key))
        if self.then is not None:
            self.then(value, path)


# -- relations between fields -------------------------------------------------------------


def _stats_relations(s: TensorStats, path: str) -> None:
    # A record as the file holds it, every field checked (its hist_range a list).
    for key in ("nan_count", "inf_count"):
        if s[key] > s["numel"]:
            raise SchemaViolation(_field_path(path, key), f"is {s[key]}, more than numel ({s['numel']})")
    merged: Any = s.get("merged")
    if merged is not None and merged["hist"].numel() != s["hist"].numel():
        # The views draw the exact merged counts over the bins of ``hist``.
        raise SchemaViolation(_field_path(_field_path(path, "merged"), "hist"),
                              f"has {merged['hist'].numel()} bins, but hist has {s['hist'].numel()}")
    lo, hi = s["hist_range"]
    if lo > hi:  # NaN is allowed: a dataset capture of a layer with no finite value has no range
        raise SchemaViolation(_field_path(path, "hist_range"), f"is [{_shown(lo)}, {_shown(hi)}], expected "
                              "a range [low, high] with low ≤ high")


def _shape_of(value: Any) -> tuple[int, ...] | None:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _call_relations(call: dict, path: str) -> None:
    shape = tuple(call["shape"]) if "shape" in call else None
    act = _shape_of(call.get("activation"))
    if shape is not None and act is not None and act != shape:
        raise SchemaViolation(_field_path(path, "activation"), f"has shape {act}, but the call's shape is {shape}")
    grad = _shape_of(call.get("grad_output"))
    want = act if act is not None else shape
    if grad is not None and want is not None and grad != want:
        raise SchemaViolation(_field_path(path, "grad_output"), f"has shape {grad}, but the output it is the "
                              f"gradient of has shape {want}")


def _onset_tensor(text: str) -> bool:
    return text in CALL_TENSORS or (text.startswith("param:") and len(text) > len("param:"))


def _graph_relations(graph: dict, path: str) -> None:
    if not graph["nodes"]:
        raise SchemaViolation(f"{path}.nodes", "is empty, expected the graph's nodes")
    ids: dict[str, int] = {}
    for i, node in enumerate(graph["nodes"]):
        if not node["id"]:
            raise SchemaViolation(f"{path}.nodes[{i}].id", "is '', expected a node id")
        if node["id"] in ids:
            raise SchemaViolation(f"{path}.nodes[{i}].id", f"is {_shown(node['id'])}, the id of an earlier node")
        ids[node["id"]] = i
    parent = {node["id"]: node.get("parent") for node in graph["nodes"]}
    for i, node in enumerate(graph["nodes"]):
        if node.get("parent") is not None and node["parent"] not in ids:
            raise SchemaViolation(f"{path}.nodes[{i}].parent", f"is {_shown(node['parent'])}, a node the graph "
                                  "does not have")
    # Parents acyclic and nested at most MAX_GRAPH_DEPTH deep: one walk per chain, each node
    # settled once (linear in the nodes), never recursion that the file can deepen.
    depth: dict[str, int] = {}
    for start in parent:
        chain: list[str] = []
        on_chain: set[str] = set()
        nid: str | None = start
        while nid is not None and nid not in depth:
            if nid in on_chain:
                raise SchemaViolation(f"{path}.nodes[{ids[nid]}].parent", f"is {_shown(parent[nid])}: the "
                                      "parents form a cycle (a node inside itself)")
            chain.append(nid)
            on_chain.add(nid)
            nid = parent[nid]
        d = -1 if nid is None else depth[nid]
        for c in reversed(chain):
            d += 1
            if d > MAX_GRAPH_DEPTH:
                raise SchemaViolation(f"{path}.nodes[{ids[c]}].parent", f"nests the node more than "
                                      f"{MAX_GRAPH_DEPTH} containers deep")
            depth[c] = d
    for i, edge in enumerate(graph["edges"]):
        for end in ("src", "dst"):
            if edge[end] not in ids:
                raise SchemaViolation(f"{path}.edges[{i}].{end}", f"is {_shown(edge[end])}, a node the graph "
                                      "does not have")
    meta = graph.get("meta") or {}
    for key in ("node_values", "node_inputs"):
        for nid in meta.get(key, {}):
            if nid not in ids:
                raise SchemaViolation(_key_path(f"{path}.meta.{key}", nid), "names a node the graph does not have")


# The layer may be "", the root module (captured for parameters of its own).
_SERIES_ROW = re.compile(r"^.*#\d+:[A-Za-z_]+$")


def _series_relations(series: dict, path: str) -> None:
    # timeline_from_capture reads each row as LAYER#CALL:KIND, one value per batch and field.
    want = (len(series["batch"]), len(series["fields"]))
    for name, rows in series["rows"].items():
        where = _key_path(f"{path}.rows", name)
        if not _SERIES_ROW.match(name):
            raise SchemaViolation(where, "is not named LAYER#CALL:KIND")
        if tuple(rows.shape) != want:
            raise SchemaViolation(where, f"has shape {tuple(rows.shape)}, expected {want} (one row per batch, "
                                  "one column per field)")


def _log2_relations(data: dict) -> None:
    # A dataset capture's log2 histograms are drawn over meta.dataset.hist_edges: one bin
    # between each two edges (without the edges, over the watch's own HIST_BINS).
    from gradexplorer.stats.merge import HIST_BINS

    edges = ((data["meta"].get("dataset") or {}).get("hist_edges"))
    bins = edges.numel() - 1 if edges is not None else HIST_BINS
    for name, layer in data["layers"].items():
        records = [(f".calls[{i}].stats", kind, s) for i, call in enumerate(layer["calls"])
                   for kind, s in call["stats"].items()]
        records += [(".param_stats", pname, s) for pname, s in (layer.get("param_stats") or {}).items()]
        for where, key, s in records:
            if s is not None and s.get("hist_kind") == "log2" and s["hist"].numel() != bins:
                raise SchemaViolation(_field_path(_key_path("layers", name) + where, key) + ".hist",
                                      f"has {s['hist'].numel()} log2 bins, but the capture's histogram edges "
                                      f"make {bins}")


def _capture_relations(data: dict, path: str) -> None:
    _input_relations(data, path)
    _log2_relations(data)


def _input_relations(data: dict, path: str) -> None:
    x, g = _shape_of(data.get("input")), _shape_of(data.get("input_grad"))
    meta = data.get("meta")
    at_vectors = isinstance(meta, dict) and meta.get("input_grad_of") is not None
    if at_vectors and x is not None and g is not None and len(g) == len(x) + 1 and g[:len(x)] == x:
        return  # token ids' gradient, taken at their vectors: (B, T) ids, (B, T, D) gradient
    if x is not None and g is not None and x != g:
        raise SchemaViolation("input_grad", f"has shape {g}, but the input has shape {x}")


# -- the schema ---------------------------------------------------------------------------

COUNT = Integer(minimum=0)
NUMBER = Number()
TEXT = Text()
NAMES = Items(TEXT)
#: A tensor the views draw: real numbers, at least one value.
SHOWN = Tensor(nonempty=True)
LAYER_NAME = Text(valid=lambda name: name.count(".") <= MAX_GRAPH_DEPTH,
                  expected=f"a layer name nested at most {MAX_GRAPH_DEPTH} modules deep")
LAYER_NAMES = Items(LAYER_NAME)

#: A dataset capture's exact merge of a record (``MergeStats.to_dict``): the views draw its counts.
MERGED = Record(
    required={**dict.fromkeys(("numel", "count", "nan_count", "inf_count", "zero_count"), COUNT),
              **dict.fromkeys(("min", "max", "sum", "sum_abs", "mean", "m2"), NUMBER),
              "hist": Tensor(ndim=1, finite=True, nonnegative=True, max_numel=MAX_HIST_BINS)},
    expected="the exact merge of a dataset capture's statistics",
)

STATS = Record(
    required={
        "numel": COUNT, "min": NUMBER, "max": NUMBER, "mean": NUMBER, "std": NUMBER, "mean_abs": NUMBER,
        "l2": NUMBER, "zero_fraction": Fraction(), "nan_count": COUNT, "inf_count": COUNT,
        "hist": Tensor(ndim=1, finite=True, max_numel=MAX_HIST_BINS, nonnegative=True),
        "hist_range": Pair(NUMBER, NUMBER),
    },
    optional={"hist_exact": Flag(), "overflow": NAMES, "hist_kind": TEXT, "merged": MERGED},
    then=_stats_relations,
    expected="a dict of statistics",
)

CALL = Record(
    # The three tensors' statistics, and any a capture kind adds (a dataset's grad_norm).
    required={"stats": Record(required={k: Nullable(STATS) for k in CALL_TENSORS}, others=Nullable(STATS),
                              expected="a dict of statistics per tensor")},
    optional={
        "activation": Nullable(SHOWN), "grad_output": Nullable(SHOWN), "grad_input": Nullable(SHOWN),
        "output_key": TEXT, "shape": Items(COUNT), "dtype": TEXT,
        # Why a tensor kind has no statistics, in words, per kind.
        "absent": Named(TEXT),
    },
    then=_call_relations,
)

LAYER = Record(
    required={"type": TEXT, "calls": Items(CALL)},
    optional={"param_grads": Named(Nullable(Tensor())), "param_stats": Named(Nullable(STATS)),
              "param_absent": Named(TEXT)},
    expected="a dict describing a layer",
)

META = Record(
    required={},
    optional={
        **{key: Nullable(TEXT) for key in (
            "model", "model_name", "weights", "arch", "task", "batch", "batch_source", "preprocessing",
            "target", "device", "dtype", "mode", "autocast", "torch_version", "created")},
        "categories": Nullable(NAMES), "sample_names": Nullable(NAMES), "input_names": Nullable(NAMES),
        # A batch of texts: each sample's token strings; the prediction at the target's position.
        "tokens": Nullable(Items(NAMES)), "predicted_tokens": Nullable(NAMES),
        "target_words": Nullable(TEXT), "input_grad_of": Nullable(TEXT),
        "labels": Nullable(Items(Integer())),
        "train": Nullable(Flag()), "input_grad": Nullable(Flag()),
        "seconds": Nullable(NUMBER),
        "timing": Nullable(Named(NUMBER)),
        "layer_order": Nullable(LAYER_NAMES), "not_called": Nullable(LAYER_NAMES),
        "call_order": Nullable(Items(Pair(TEXT, COUNT))),
        "dataset": Nullable(Record(required={}, optional={
            "samples": COUNT, "batches": COUNT, "hist_kind": TEXT,
            "hist_edges": Tensor(ndim=1, ordered=True, max_numel=MAX_HIST_BINS + 1),
            "snr": Named(Record(required={"batches": COUNT, "mean_norm": NUMBER, "var_sum": NUMBER, "snr": NUMBER},
                                expected="a parameter gradient's signal-to-noise summary")),
            "series": Record(required={"batch": Items(Integer()), "fields": NAMES,
                                       "rows": Named(Tensor(ndim=2))},
                             optional={"samples": Items(COUNT)}, then=_series_relations),
        })),
    },
    expected="a dict of metadata",
)

_ONSET_COUNT = Nullable(COUNT)
ONSET = Record(required={}, optional={
    # "call" is always written (None for the input batch and parameters): required, since
    # the readers name it (a file without it gave inspect a KeyError).
    "forward": Nullable(Record(required={"layer": Nullable(TEXT), "type": TEXT, "call": Nullable(COUNT)},
                               optional={"own_code": Flag(),
                                         "nan_count": _ONSET_COUNT, "inf_count": _ONSET_COUNT})),
    "backward": Nullable(Record(required={"layer": TEXT, "type": TEXT, "call": Nullable(COUNT), "tensor": Text(
        valid=_onset_tensor, expected="activation, grad_output, grad_input or param:NAME")},
        optional={"nan_count": _ONSET_COUNT, "inf_count": _ONSET_COUNT})),
})

GRAPH = Record(
    required={
        "nodes": Items(Record(
            required={"id": TEXT, "kind": Text(GRAPH_NODE_KINDS), "name": TEXT, "type": TEXT},
            optional={"call": Nullable(COUNT), "parent": Nullable(TEXT), "shape": Nullable(Items(Integer())),
                      "dtype": Nullable(TEXT),
                      # What the graph view colours by and reads; keys it does not know stay free.
                      "stats": Nullable(Record(required={}, optional={
                          "flags": NAMES, "nonfinite": Flag(), "zero": Flag(),
                          **{k: Nullable(NUMBER) for k in GRAPH_NODE_STATS}}))})),
        "edges": Items(Record(
            required={"src": TEXT, "dst": TEXT, "shape": Items(Integer())},
            optional={"dtype": TEXT, "tensor": Integer(), "grad_l2": Nullable(NUMBER)})),
    },
    optional={"format": TEXT, "version": Integer(),
              "meta": Nullable(Record(required={}, optional={"node_values": Named(Integer()),
                                                             "node_inputs": Named(Integer()),
                                                             "model": Nullable(TEXT)}))},
    then=_graph_relations,
    expected="a graph (nodes and edges)",
)

MODEL_INPUTS = Record(
    required={"args": Items(PLAIN), "kwargs": Named(PLAIN)},
    expected="a model's inputs (args and kwargs)",
)

CAPTURE = Record(
    required={"meta": META, "layers": Named(LAYER, max_dots=MAX_GRAPH_DEPTH)},
    optional={"input": Nullable(Tensor(min_ndim=1, nonempty=True)), "input_grad": Nullable(SHOWN),
              "output": Nullable(SHOWN), "graph": Nullable(GRAPH), "nonfinite_onset": Nullable(ONSET),
              "model_inputs": Nullable(MODEL_INPUTS)},
    then=_capture_relations,
    expected="a capture",
)


def check_capture_data(data: dict, source: str = "the file") -> None:
    """Check a loaded capture file (``format`` and ``version`` already read) against the schema.

    Parameters
    ----------
    data : dict
        What ``torch.load(path, weights_only=True)`` gave.
    source : str
        How messages name the file (``"'capture.pt'"``).

    Raises
    ------
    CaptureFileError
        Naming the first field that breaks the schema, what it is and what it should be.
    """
    try:
        CAPTURE.check(data, "")
    except SchemaViolation as exc:
        raise CaptureFileError(
            f"{source}: field {exc.path} {exc.problem}.",
            "The file is not a valid gradexplorer capture (damaged, or changed by another program); "
            "export the capture again.",
        ) from None
    except RecursionError:  # a structure the schema did not foresee; never a traceback
        raise CaptureFileError(f"{source} nests its data too deeply to be a capture.",
                               "Export the capture again.") from None

