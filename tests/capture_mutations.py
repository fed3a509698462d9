"""Malformed capture files for the tests: a valid capture, and seeded mutations of its fields.

Each mutation changes one field of a valid file's dict (its type, its presence, its value or
its shape) and says where (``path``, the keys from the top) and whether the change always
breaks the schema (``must_fail``): a type swap does, deleting an optional key does not.
"""

from __future__ import annotations

import copy
import math
import random
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Subtrees whose values are free-form by design (unknown keys hold any plain data).
FREE_FORM: tuple[tuple, ...] = ()


def valid_capture_dict() -> dict:
    """A small full capture of ``demo:seed-mlp`` with the input gradient, the graph the job
    attaches, and a NaN/Inf onset entry: every part of the format is present."""
    from gradexplorer.files.capture_file import capture_to_dict
    from gradexplorer.pipeline.job import CaptureJob
    from gradexplorer.pipeline.options import BatchSpec, CaptureOptions

    options = CaptureOptions("demo:seed-mlp", batch=BatchSpec(random="3x10"), device="cpu", input_grad=True)
    cap = CaptureJob(options).run()
    assert cap.graph is not None
    first = cap.layer_order[0]
    cap.nonfinite_onset = {
        "forward": {"layer": first, "call": 0, "type": cap[first].type, "own_code": False,
                    "nan_count": 1, "inf_count": 0},
        "backward": {"layer": first, "call": 0, "type": cap[first].type, "tensor": "grad_input",
                     "nan_count": 0, "inf_count": 2},
    }
    return capture_to_dict(cap)


def valid_dataset_capture_dict() -> dict:
    """A small dataset capture (statistics over 3 batches, with the exact merge state of
    each record, the log2 histogram edges, the per-batch series and gradient SNR) of
    ``demo:seed-mlp``: the parts of the format only a dataset capture has."""
    from gradexplorer.files.capture_file import capture_to_dict
    from gradexplorer.models import load_model
    from gradexplorer.recording.dataset_capture import capture_dataset, iter_tensor_batches, to_capture

    loaded = load_model("demo:seed-mlp")
    torch.manual_seed(0)
    x = torch.randn(12, 10)
    stats = capture_dataset(loaded.module, iter_tensor_batches(x, None, 4, range(3)), total_batches=3)
    layers = [n for n, m in loaded.module.named_modules() if n and not list(m.children())]
    cap = to_capture(stats, loaded.module, layers, {"model": "demo:seed-mlp"})
    return capture_to_dict(cap)


def deep(n: int = 2000) -> list:
    x: Any = 1
    for _ in range(n):
        x = [x]
    return x


def save(data: Any, path: Path) -> Path:
    """``torch.save`` even of values nested 2,000 deep (its pickler recurses)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))
    try:
        torch.save(data, path)
    finally:
        sys.setrecursionlimit(old)
    return path


@dataclass
class Mutation:
    path: tuple
    kind: str  # "type", "missing", "value", "shape", "deep"
    value: Any = None
    must_fail: bool = False

    def apply(self, data: dict) -> dict:
        out = copy.deepcopy(data)
        parent = out
        for key in self.path[:-1]:
            parent = parent[key]
        if self.kind == "missing":
            del parent[self.path[-1]]
        else:
            parent[self.path[-1]] = self.value
        return out

    def __str__(self) -> str:
        return f"{self.kind} at {'/'.join(map(str, self.path))}"


def _leaves(obj: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    yield path, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))


def _other_type(value: Any) -> Any:
    """A value of another kind, which no typed field accepts in place of ``value``."""
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, (int, float)):
        return "7"
    if isinstance(value, str):
        return 7
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, list):
        return {"a": 1}
    if isinstance(value, dict):
        return [1, 2]
    return [{"x": "y"}]  # None: no nullable field (number, text, names, record, tensor) takes this


def _bad_value(value: Any, rng: random.Random) -> Any:
    """A value of the same kind that may or may not be allowed (a NaN count, a negative one...)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([-1, 2**70, float("nan"), 0])
    if isinstance(value, float):
        return rng.choice([float("nan"), float("inf"), -1.0, 2.0])
    if isinstance(value, str):
        return rng.choice(["", "param", "é" * 300])
    if isinstance(value, list):
        return rng.choice([[], value + [value[-1] if value else None], value[:-1]])
    return None


def mutations(data: dict, seed: int = 0, limit: int = 400) -> list[Mutation]:
    """Up to ``limit`` mutations of ``data``'s fields, chosen with ``seed``: for each
    field, a type swap (must fail), and, in turn, a missing key, a value, a wrong shape
    (tensors) or a 2,000-deep list (must fail)."""
    rng = random.Random(seed)
    fields = [(p, v) for p, v in _leaves(data) if p and not any(p[:len(f)] == f for f in FREE_FORM)]
    rng.shuffle(fields)
    out: list[Mutation] = []
    for path, value in fields:
        out.append(Mutation(path, "type", _other_type(value), must_fail=True))
        choice = rng.choice(("missing", "value", "shape", "deep"))
        if choice == "missing" and isinstance(path[-1], str):
            out.append(Mutation(path, "missing"))
        elif choice == "shape" and isinstance(value, torch.Tensor):
            bad = value.reshape(-1) if value.dim() != 1 else value.reshape(1, -1)
            out.append(Mutation(path, "shape", bad))
        elif choice == "deep":
            out.append(Mutation(path, "deep", deep(), must_fail=True))
        else:
            out.append(Mutation(path, "value", _bad_value(value, rng)))
        if len(out) >= limit:
            break
    for version in ("2", True, 0, -1, 2.0, None):
        out.append(Mutation(("version",), "type", version, must_fail=True))
    return out


_TOKEN = re.compile(r"\['((?:[^'\\]|\\.)*)'\]|\[(\d+)\]|([^.\[\]]+)")


def field_tokens(message: str) -> list[str] | None:
    """The keys of the field an error message names ("field a.b['c'][0] is ..."), or None."""
    m = re.search(r"field (\S+) ", message)
    if m is None:
        return None
    return [a or b or c for a, b, c in _TOKEN.findall(m.group(1))]


def names_the_field(message: str, mutation: Mutation) -> bool:
    """Whether the message names the mutated field, a field inside it, or one next to it
    in the same record (the dict that lacks it; a field checked against it: a call's shape
    and its activation, numel and nan_count; in the graph, the node an edge names)."""
    got = field_tokens(message)
    if got is None:
        return False
    want = [str(k) for k in mutation.path]
    common = 0
    while common < min(len(got), len(want)) and got[common] == want[common]:
        common += 1
    return common >= max(1, len(want) - 2) or want[0] == got[0] == "graph"


# -- the fuzz: seeded mutations at the dict, pickle and zip levels ---------------------------


def _hostile_values(data: dict) -> list[tuple[str, Any]]:
    """Named dict-level edits that once crashed a reader (each a function of a copy)."""
    layer = data["meta"]["layer_order"][0]

    def stats(x: dict) -> dict:
        return x["layers"][layer]["calls"][0]["stats"]

    def chain(x: dict, n: int) -> None:
        x["graph"]["nodes"].extend({"id": f"c{i}", "kind": "module", "name": f"c{i}", "type": "T",
                                    "parent": f"c{i - 1}" if i else None} for i in range(n))

    def rename(x: dict, name: str) -> None:
        x["layers"][name] = x["layers"].pop(layer)
        x["meta"]["layer_order"][0] = name

    def many_layers(x: dict, n: int) -> None:
        rec = x["layers"][layer]
        for i in range(n):
            x["layers"][f"extra{i}"] = rec
        x["meta"]["layer_order"] = list(x["layers"])

    return [
        ("complex output", lambda x: x.__setitem__("output", x["output"].to(torch.complex64))),
        ("complex activation", lambda x: x["layers"][layer]["calls"][0].__setitem__(
            "activation", x["layers"][layer]["calls"][0]["activation"].to(torch.complex64))),
        ("(0, 5) activation", lambda x: x["layers"][layer]["calls"][0].update(activation=torch.zeros(0, 5),
                                                                              shape=[0, 5])),
        ("zero-sample input", lambda x: x.update(input=x["input"][:0], input_grad=None)),
        ("NaN hist", lambda x: stats(x)["activation"].__setitem__("hist", torch.full((64,), float("nan")))),
        ("negative hist", lambda x: stats(x)["activation"].__setitem__("hist", torch.full((64,), -5.0))),
        ("1e12-element hist", lambda x: stats(x)["activation"].__setitem__("hist", torch.zeros(1).expand(10**12))),
        ("1e12-element input and input_grad", lambda x: x.update(input=torch.zeros(1).expand(10**6, 10**6),
                                                                 input_grad=torch.zeros(1).expand(10**6, 10**6))),
        ("numel 1e12", lambda x: stats(x)["activation"].__setitem__("numel", 10**12)),
        ("l2 1e308", lambda x: stats(x)["grad_output"].__setitem__("l2", 1e308)),
        ("inf stats", lambda x: stats(x)["grad_output"].update(min=-math.inf, max=math.inf, l2=math.inf)),
        ("hist_range NaN", lambda x: stats(x)["activation"].__setitem__("hist_range", [math.nan, math.nan])),
        ("empty graph", lambda x: x["graph"].update(nodes=[], edges=[])),
        ("graph self parent", lambda x: x["graph"]["nodes"][0].__setitem__("parent", x["graph"]["nodes"][0]["id"])),
        ("graph cycle", lambda x: (x["graph"]["nodes"][0].__setitem__("parent", x["graph"]["nodes"][1]["id"]),
                                   x["graph"]["nodes"][1].__setitem__("parent", x["graph"]["nodes"][0]["id"]))),
        ("node_values ''", lambda x: x["graph"]["meta"]["node_values"].__setitem__("", 3)),
        ("1200-deep graph", lambda x: chain(x, 1200)),
        ("120-deep graph", lambda x: chain(x, 120)),
        ("3000-deep layer name", lambda x: rename(x, "a." * 3000 + "b")),
        ("100-deep layer name", lambda x: rename(x, "a." * 100 + "b")),
        ("2000 layers", lambda x: many_layers(x, 2000)),
    ]


def _dataset_hostile_values(data: dict) -> list[tuple[str, Any]]:
    """Edits of the parts only a dataset capture has: the exact merge state of a record, the
    log2 histogram edges, the per-batch series."""
    layer = data["meta"]["layer_order"][0]

    def merged(x: dict) -> dict:
        return x["layers"][layer]["calls"][0]["stats"]["activation"]["merged"]

    def series_rows(x: dict) -> dict:
        return x["meta"]["dataset"]["series"]["rows"]

    return [
        ("merged hist of 3 bins", lambda x: merged(x).__setitem__("hist", torch.zeros(3, dtype=torch.int64))),
        ("merged {}", lambda x: x["layers"][layer]["calls"][0]["stats"]["activation"].__setitem__("merged", {})),
        ("merged of wrong types", lambda x: x["layers"][layer]["calls"][0]["stats"]["activation"].__setitem__(
            "merged", {"hist": "x", "numel": -5, "min": "a"})),
        ("merged hist negative", lambda x: merged(x).__setitem__("hist", -merged(x)["hist"] - 1)),
        ("merged numel 1e30", lambda x: merged(x).__setitem__("numel", 10**30)),
        ("hist_edges of 10", lambda x: x["meta"]["dataset"].__setitem__("hist_edges", torch.arange(10.0))),
        ("hist of 5 bins, log2", lambda x: x["layers"][layer]["calls"][0]["stats"]["activation"].__setitem__(
            "hist", torch.ones(5))),
        ("series rows of another width", lambda x: series_rows(x).__setitem__(
            next(iter(series_rows(x))), torch.zeros(2, 1))),
        ("series rows of 1e12 elements", lambda x: series_rows(x).__setitem__(
            next(iter(series_rows(x))), torch.zeros(1).expand(10**6, 10**6))),
        ("series batch list longer", lambda x: x["meta"]["dataset"]["series"]["batch"].extend(range(100))),
        ("snr of wrong types", lambda x: x["meta"]["dataset"].__setitem__("snr", {"fc1.weight": "high"})),
    ]


def _zip_bytes(data: Any) -> bytes:
    import io
    buf = io.BytesIO()
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))
    try:
        torch.save(data, buf)
    finally:
        sys.setrecursionlimit(old)
    return buf.getvalue()


def _pickle_mutation(blob: bytes, rng: random.Random) -> bytes:
    """Flip bytes inside the archive's ``data.pkl`` (the zip stays readable, the pickle not)."""
    import io
    import zipfile
    src = zipfile.ZipFile(io.BytesIO(blob))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            body = bytearray(src.read(info))
            if info.filename.endswith("data.pkl") and body:
                for _ in range(rng.randint(1, 4)):
                    body[rng.randrange(len(body))] = rng.randrange(256)
            dst.writestr(info, bytes(body))
    return out.getvalue()


def _zip_mutation(blob: bytes, rng: random.Random) -> bytes:
    """Damage the archive itself: a truncation, flipped bytes, or a chunk removed."""
    b = bytearray(blob)
    how = rng.choice(("truncate", "flip", "cut"))
    if how == "truncate":
        return bytes(b[:rng.randrange(len(b))])
    if how == "flip":
        for _ in range(rng.randint(1, 16)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    i = rng.randrange(len(b))
    return bytes(b[:i] + b[i + rng.randint(1, 512):])


def fuzz_cases(data: dict, seed: int, n: int) -> Iterator[tuple[str, bytes]]:
    """``n`` seeded mutated capture files as bytes, with a name saying what changed: the
    hostile edits first, then field mutations (:func:`mutations`), pickle-level byte flips
    and zip-level damage in turn."""
    rng = random.Random(seed)
    made = 0
    hostile = _hostile_values(data) + (_dataset_hostile_values(data) if (data["meta"].get("dataset")) else [])
    for name, edit in hostile:
        if made >= n:
            return
        x = copy.deepcopy(data)
        try:
            edit(x)
        except (AttributeError, KeyError, IndexError, TypeError):
            continue  # an edit of a part this file does not have (a dataset capture has no output)
        yield name, _zip_bytes(x)
        made += 1
    base = _zip_bytes(data)
    fields = mutations(data, seed=seed, limit=max(n, 400))
    i = 0
    while made < n:
        level = ("dict", "pickle", "zip")[made % 3]
        if level == "dict":
            m = fields[i % len(fields)]
            i += 1
            yield f"dict: {m}", _zip_bytes(m.apply(data))
        elif level == "pickle":
            yield "pickle: bytes flipped", _pickle_mutation(base, rng)
        else:
            yield "zip: damaged", _zip_mutation(base, rng)
        made += 1


def draw_every_view(window: Any, process_events: Any, layers: int = 8) -> None:
    """Draw what the window shows of its capture the way a user looks at it: every view tab
    for each of the first ``layers`` layers (a damaged record is drawn only when its layer
    is selected), and each tensor and scope of the histogram view."""
    cap = window.session.capture
    names = list(cap.layer_order)[:layers] if cap is not None else [None]
    tabs = window.views.tabs
    histogram = window.views.histogram_view
    for name in names:
        if name is not None:
            window.view_state.select(name, 0)
        for i in range(tabs.count()):
            tabs.setCurrentIndex(i)
            process_events()
            if tabs.currentWidget() is histogram:
                for combo in (histogram.tensor_combo, histogram.scope_combo):
                    for j in range(combo.count()):
                        combo.setCurrentIndex(j)
                        process_events()
