"""The model graph: exact topology on hand-built models, resnet18's residual adds, every
module call as one node, collapse/expand consistency, hooks and the op mode removed."""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import nn

from gradexplorer.base.errors import CaptureError, GradExplorerError
from gradexplorer.capturing.capture import capture
from gradexplorer.model_graph.graph import ModelGraph, extract_graph, graph_for_capture
from tests.conftest import assert_no_hooks


def _mode_stack_depth() -> int:
    return torch._C._len_torch_function_stack()


def topology(g: ModelGraph) -> tuple[dict, set]:
    """``{id: (kind, name, parent)}`` and ``{(src, dst)}``."""
    nodes = {n.id: (n.kind, n.name, n.parent) for n in g}
    edges = {(e.src, e.dst) for e in g.edges}
    assert len(edges) == len(g.edges), "the same pair joined twice by one tensor"
    return nodes, edges


ROOT = "m::0"


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))) + x


def test_residual_add():
    g = extract_graph(Residual(), torch.randn(2, 4))
    nodes, edges = topology(g)
    assert nodes == {
        "in:input": ("input", "input", None),
        ROOT: ("module", "", None),
        "m:fc1:0": ("module", "fc1", ROOT),
        "m:act:0": ("module", "act", ROOT),
        "m:fc2:0": ("module", "fc2", ROOT),
        "op:0": ("op", "add", ROOT),
        "out:output": ("output", "output", None),
    }
    assert edges == {("in:input", "m:fc1:0"), ("m:fc1:0", "m:act:0"), ("m:act:0", "m:fc2:0"),
                     ("m:fc2:0", "op:0"), ("in:input", "op:0"), ("op:0", "out:output")}
    assert all(e.shape == (2, 4) and e.dtype == "float32" for e in g.edges)
    assert g.nodes["op:0"].type == "Tensor.add"


class TwoBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Sequential(nn.Linear(4, 5), nn.Tanh())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(torch.cat([self.a(x), self.b(x)], dim=1))


def test_concatenation_of_two_branches():
    g = extract_graph(TwoBranch(), torch.randn(3, 4))
    nodes, edges = topology(g)
    assert nodes == {
        "in:input": ("input", "input", None),
        ROOT: ("module", "", None),
        "m:a:0": ("module", "a", ROOT),
        "m:b:0": ("module", "b", ROOT),
        "m:b.0:0": ("module", "b.0", "m:b:0"),
        "m:b.1:0": ("module", "b.1", "m:b:0"),
        "op:0": ("op", "cat", ROOT),
        "m:head:0": ("module", "head", ROOT),
        "out:output": ("output", "output", None),
    }
    assert edges == {("in:input", "m:a:0"), ("in:input", "m:b.0:0"), ("m:b.0:0", "m:b.1:0"),
                     ("m:a:0", "op:0"), ("m:b.1:0", "op:0"), ("op:0", "m:head:0"),
                     ("m:head:0", "out:output")}
    shapes = {(e.src, e.dst): e.shape for e in g.edges}
    assert shapes[("m:a:0", "op:0")] == (3, 3) and shapes[("m:b.1:0", "op:0")] == (3, 5)
    assert g.nodes["op:0"].shape == (3, 8)
    # Collapsing b reroutes its edges to it.
    v = g.view({ROOT})
    assert {(e.src, e.dst) for e in v.edges} == {
        ("in:input", "m:a:0"), ("in:input", "m:b:0"), ("m:a:0", "op:0"), ("m:b:0", "op:0"),
        ("op:0", "m:head:0"), ("m:head:0", "out:output")}
    assert [(e.src, e.dst) for e in v.hidden] == [("m:b.0:0", "m:b.1:0")]


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.Tanh()

    def forward(self, x):
        return self.fc(self.act(self.fc(x)))


def test_module_called_twice_is_two_nodes():
    g = extract_graph(Twice(), torch.randn(2, 4))
    nodes, edges = topology(g)
    assert nodes == {
        "in:input": ("input", "input", None),
        ROOT: ("module", "", None),
        "m:fc:0": ("module", "fc", ROOT),
        "m:act:0": ("module", "act", ROOT),
        "m:fc:1": ("module", "fc", ROOT),
        "out:output": ("output", "output", None),
    }
    assert edges == {("in:input", "m:fc:0"), ("m:fc:0", "m:act:0"), ("m:act:0", "m:fc:1"),
                     ("m:fc:1", "out:output")}
    assert g.nodes["m:fc:1"].call == 1 and g.nodes["m:fc:1"].label == "fc #2"


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 6)
        self.cls = nn.Linear(6, 3)

    def forward(self, x):
        h = self.body(x)
        return {"logits": self.cls(h), "emb": h}


def test_dict_output():
    g = extract_graph(DictOut(), torch.randn(2, 4))
    nodes, edges = topology(g)
    assert nodes == {
        "in:input": ("input", "input", None),
        ROOT: ("module", "", None),
        "m:body:0": ("module", "body", ROOT),
        "m:cls:0": ("module", "cls", ROOT),
        "out:logits": ("output", "logits", None),
        "out:emb": ("output", "emb", None),
    }
    assert edges == {("in:input", "m:body:0"), ("m:body:0", "m:cls:0"), ("m:cls:0", "out:logits"),
                     ("m:body:0", "out:emb")}
    assert g.nodes[ROOT].shape == (2, 3)  # the first floating output: logits


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(5, 7, batch_first=True)
        self.fc = nn.Linear(7, 2)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.fc(out[:, -1])


def test_lstm():
    g = extract_graph(Recurrent(), torch.randn(3, 6, 5))
    nodes, edges = topology(g)
    assert nodes == {
        "in:input": ("input", "input", None),
        ROOT: ("module", "", None),
        "m:lstm:0": ("module", "lstm", ROOT),
        "op:0": ("op", "getitem", ROOT),
        "m:fc:0": ("module", "fc", ROOT),
        "out:output": ("output", "output", None),
    }
    assert edges == {("in:input", "m:lstm:0"), ("m:lstm:0", "op:0"), ("op:0", "m:fc:0"),
                     ("m:fc:0", "out:output")}
    assert g.nodes["m:lstm:0"].shape == (3, 6, 7)
    assert {(e.src, e.dst): e.shape for e in g.edges}[("m:lstm:0", "op:0")] == (3, 6, 7)


class Attention(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.d = d
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = q @ k.transpose(-2, -1)
        weights = torch.softmax(scores / math.sqrt(self.d), dim=-1)
        return self.o(weights @ v)


def test_functional_attention():
    g = extract_graph(Attention(), torch.randn(2, 5, 8))
    nodes, edges = topology(g)
    assert nodes == {
        "in:input": ("input", "input", None),
        ROOT: ("module", "", None),
        "m:q:0": ("module", "q", ROOT),
        "m:k:0": ("module", "k", ROOT),
        "m:v:0": ("module", "v", ROOT),
        "op:0": ("op", "transpose", ROOT),
        "op:1": ("op", "matmul", ROOT),
        "op:2": ("op", "div", ROOT),
        "op:3": ("op", "softmax", ROOT),
        "op:4": ("op", "matmul", ROOT),
        "m:o:0": ("module", "o", ROOT),
        "out:output": ("output", "output", None),
    }
    assert edges == {
        ("in:input", "m:q:0"), ("in:input", "m:k:0"), ("in:input", "m:v:0"),
        ("m:k:0", "op:0"), ("m:q:0", "op:1"), ("op:0", "op:1"), ("op:1", "op:2"), ("op:2", "op:3"),
        ("op:3", "op:4"), ("m:v:0", "op:4"), ("op:4", "m:o:0"), ("m:o:0", "out:output"),
    }
    assert g.nodes["op:1"].shape == (2, 5, 5)


class Bookkeeping(nn.Module):
    """contiguous, to(), clone and shape reads are folded; parameters are not inputs."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bias = nn.Parameter(torch.zeros(4))

    def forward(self, x):
        y = self.fc(x.contiguous().to(torch.float32).clone())
        n = y.shape[0]
        return (y + self.bias.expand(n, 4)).detach()


def test_bookkeeping_is_folded_and_parameters_are_not_inputs():
    g = extract_graph(Bookkeeping(), torch.randn(2, 4))
    nodes, edges = topology(g)
    assert nodes == {
        "in:input": ("input", "input", None),
        ROOT: ("module", "", None),
        "m:fc:0": ("module", "fc", ROOT),
        "op:0": ("op", "add", ROOT),
        "out:output": ("output", "output", None),
    }
    assert edges == {("in:input", "m:fc:0"), ("m:fc:0", "op:0"), ("op:0", "out:output")}


class SeveralInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(3, 4)

    def forward(self, x, y):
        return self.a(x) * self.b(y)


def test_several_inputs_and_half_precision():
    m = SeveralInputs().to(torch.bfloat16)
    g = extract_graph(m, (torch.randn(2, 4, dtype=torch.bfloat16), torch.randn(2, 3, dtype=torch.bfloat16)))
    nodes, edges = topology(g)
    assert {n for n in nodes if nodes[n][0] == "input"} == {"in:0", "in:1"}
    assert edges == {("in:0", "m:a:0"), ("in:1", "m:b:0"), ("m:a:0", "op:0"), ("m:b:0", "op:0"),
                     ("op:0", "out:output")}
    assert nodes["op:0"] == ("op", "mul", ROOT)
    assert all(e.dtype == "bfloat16" for e in g.edges)


class InplaceBlock(nn.Module):
    """A torchvision-style block: bn output modified by ``+=``, then an in-place ReLU."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.bn(self.fc(x))
        out += x
        return self.relu(out)


def test_inplace_ops_make_new_values():
    g = extract_graph(InplaceBlock(), torch.randn(3, 4))
    nodes, edges = topology(g)
    assert nodes["op:0"] == ("op", "add", ROOT)
    assert edges == {("in:input", "m:fc:0"), ("m:fc:0", "m:bn:0"), ("m:bn:0", "op:0"),
                     ("in:input", "op:0"), ("op:0", "m:relu:0"), ("m:relu:0", "out:output")}
    # bn's value, the sum and the relu output are one tensor object, three values.
    tensors = {(e.src, e.dst): e.tensor for e in g.edges}
    assert len({tensors[("m:bn:0", "op:0")], tensors[("op:0", "m:relu:0")],
                tensors[("m:relu:0", "out:output")]}) == 3


def test_hooks_and_mode_removed_and_model_left_as_it_was():
    m = Residual()
    m.train()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    extract_graph(m, torch.randn(2, 4))
    assert_no_hooks(m)
    assert _mode_stack_depth() == 0
    assert all(mod.training for mod in m.modules())
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_forward_failure_names_the_module_and_cleans_up():
    m = TwoBranch()
    with pytest.raises(CaptureError, match="'a'"):
        extract_graph(m, torch.randn(2, 5))
    assert_no_hooks(m)
    assert _mode_stack_depth() == 0
    # Outside the probe, torch functions are not recorded any more.
    assert torch.cat([torch.ones(1), torch.ones(1)]).shape == (2,)


@pytest.mark.slow
def test_resnet18_has_eight_residual_adds_with_skip_and_branch():
    import torchvision

    m = torchvision.models.resnet18()
    g = extract_graph(m, torch.randn(1, 3, 64, 64))
    adds = [n for n in g if n.kind == "op" and n.name == "add"]
    assert len(adds) == 8
    for add in adds:
        block = g.nodes[add.parent]
        assert block.type == "BasicBlock"
        incoming = [e for e in g.edges if e.dst == add.id]
        assert len(incoming) == 2
        srcs = {g.nodes[e.src].name for e in incoming}
        branch = f"{block.name}.bn2"
        assert branch in srcs
        skip = next(e for e in incoming if g.nodes[e.src].name != branch)
        if f"{block.name}.downsample" in {n.name for n in g}:
            assert g.nodes[skip.src].name == f"{block.name}.downsample.1"
        else:
            # The skip carries the very value that entered the block's first conv.
            into_block = next(e for e in g.edges if e.dst == f"m:{block.name}.conv1:0")
            assert skip.tensor == into_block.tensor and skip.src == into_block.src
    assert [n.name for n in g if n.kind == "op"] == ["add"] * 8 + ["flatten"]
    # The block input reaches conv1 and the add: two edges, one tensor.
    assert sum(1 for e in g.edges if e.src == "m:maxpool:0") == 2


def _module_calls_of(g: ModelGraph) -> set:
    return {(n.name, n.call) for n in g if n.kind == "module"}


@pytest.mark.parametrize("make,shape", [
    (Residual, (2, 4)), (TwoBranch, (2, 4)), (Twice, (2, 4)), (DictOut, (2, 4)),
    (Recurrent, (2, 6, 5)), (Attention, (2, 5, 8)), (InplaceBlock, (3, 4)),
])
def test_every_module_call_in_a_capture_is_one_node(make, shape):
    m = make()
    x = torch.randn(*shape)
    g = extract_graph(m, x)
    target = "sum"
    cap = capture(m, x, layers=lambda name, mod: True, target=target, mode="stats")
    calls = [(name, i) for name, i, _ in cap.iter_calls()]
    assert len(calls) == len(set(calls))
    assert set(calls) == _module_calls_of(g)
    assert g.attach_capture(cap) == len(calls)


@pytest.mark.slow
def test_every_module_call_of_resnet18_is_one_node():
    import torchvision

    m = torchvision.models.resnet18()
    x = torch.randn(1, 3, 64, 64)
    g = extract_graph(m, x)
    cap = capture(m, x, layers=lambda name, mod: True, mode="stats")
    assert {(name, i) for name, i, _ in cap.iter_calls()} == _module_calls_of(g)
    relu_calls = [n for n in g if n.name == "layer1.0.relu"]
    assert [n.call for n in relu_calls] == [0, 1]


def test_a_block_captured_through_its_leaves_shows_its_last_calls_output_statistics():
    import torchvision

    from gradexplorer.model_graph.render import node_colors, node_value

    torch.manual_seed(0)
    m = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 32, 32)
    cap = capture(m, x, mode="stats")  # leaves only: no BasicBlock is captured
    g = graph_for_capture(m, x, cap)
    block = "m:layer1.0:0"
    assert g.nodes[block].stats is None
    # The block returns the tensor its ReLU made on its second call (after the residual add).
    assert g.output_producer(block) == "m:layer1.0.relu:1"
    assert g.shown_stats(block) is g.nodes["m:layer1.0.relu:1"].stats
    # Ground truth: the gradient of the block's output by plain autograd.
    out = {}
    handle = m.layer1[0].register_forward_hook(lambda mod, a, o: out.setdefault("y", o))
    try:
        y = m(x)
    finally:
        handle.remove()
    (gy,) = torch.autograd.grad(y[0, y[0].argmax()], [out["y"]])
    assert node_value(g, block, "grad_l2") == pytest.approx(float(gy.double().norm()), rel=1e-5)
    collapsed = g.view(g.expanded_to_depth(1))
    assert block not in collapsed.nodes  # at depth 1 the whole layer1 is one box
    view = g.view(g.expanded_to_depth(2))
    assert node_colors(g, view.nodes)[block] != "#ffffff"  # coloured, not the blank of "no capture"
    assert g.output_producer("m:fc:0") is None  # a leaf has its own


def _check_view(g: ModelGraph, expanded: set) -> None:
    v = g.view(expanded)
    visible = set(v.nodes)
    assert len(visible) == len(v.nodes)
    members = [e for ve in v.edges for e in ve.members]
    assert sorted(map(id, members + v.hidden)) == sorted(map(id, g.edges)), "an edge lost or doubled"
    for ve in v.edges:
        assert ve.src in visible and ve.dst in visible, "a dangling edge"
        assert ve.src != ve.dst
        for e in ve.members:
            assert g.representative(e.src, expanded) == ve.src
            assert g.representative(e.dst, expanded) == ve.dst
    for e in v.hidden:
        assert g.representative(e.src, expanded) == g.representative(e.dst, expanded)
    # Every deepest node is visible or inside exactly one visible collapsed container.
    for n in g:
        if not g.is_container(n.id):
            assert g.representative(n.id, expanded) in visible


@pytest.mark.slow
def test_collapse_expand_keeps_the_edge_set_consistent():
    import torchvision

    g = extract_graph(torchvision.models.resnet18(), torch.randn(1, 3, 64, 64))
    containers = g.containers()
    rng = random.Random(0)
    for depth in range(g.max_depth() + 2):
        _check_view(g, g.expanded_to_depth(depth))
    for _ in range(50):
        _check_view(g, {c for c in containers if rng.random() < 0.5})
    # Fully collapsed: input -> model -> output.
    v = g.view(set())
    assert set(v.nodes) == {"in:input", ROOT, "out:output"}
    assert {(e.src, e.dst) for e in v.edges} == {("in:input", ROOT), (ROOT, "out:output")}
    # Fully expanded: every deepest edge is visible.
    v = g.view(set(containers))
    assert sum(len(e.members) for e in v.edges) == len(g.edges) and not v.hidden
    d = g.default_depth()
    assert len(g.view(g.expanded_to_depth(d)).nodes) <= 60 < len(g.view(g.expanded_to_depth(d + 1)).nodes)


def test_json_round_trip_and_contract():
    import json

    g = extract_graph(TwoBranch(), torch.randn(3, 4))
    data = json.loads(json.dumps(g.to_dict()))
    assert data["format"] == "gradexplorer.graph" and data["version"] == 1
    node = next(n for n in data["nodes"] if n["id"] == "m:b.0:0")
    assert node == {"id": "m:b.0:0", "kind": "module", "name": "b.0", "type": "Linear", "call": 0,
                    "parent": "m:b:0", "shape": [3, 5], "dtype": "float32", "stats": None}
    assert set(data["edges"][0]) >= {"src", "dst", "shape", "grad_l2"}
    back = ModelGraph.from_dict(data)
    assert topology(back) == topology(g)
    with pytest.raises(GradExplorerError, match="not a gradexplorer graph"):
        ModelGraph.from_dict({"format": "other"})
    data["edges"][0]["dst"] = "nowhere"
    with pytest.raises(GradExplorerError, match="nowhere"):
        ModelGraph.from_dict(data)
