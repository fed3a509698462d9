"""Malformed capture files for the tests: a valid capture, and seeded mutations of its fields.

Each mutation changes one field of a valid file's dict (its type, its presence, its value or
its shape) and says where (``path``, the keys from the top) and whether the change always
breaks the schema (``must_fail``): a type swap does, deleting an optional key does not.
"""

from __future__ import annotations

import copy
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
