"""Gradients on the graph: edge norms equal ``torch.autograd.grad`` of the same tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradexplorer.model_graph.grads import graph_gradients
from tests.conftest import assert_no_hooks, snapshot
from tests.core.test_graph import DictOut, InplaceBlock, Recurrent, TwoBranch


def _close(a: float, b: torch.Tensor) -> bool:
    return abs(a - float(b.double().norm())) <= 1e-5 * max(1.0, float(b.double().norm()))


def _edge(g, src, dst):
    return next(e for e in g.edges if e.src == src and e.dst == dst)


def test_residual_edges_match_autograd_before_and_after_in_place_changes():
    m = InplaceBlock().train()
    m.bn.weight.data.uniform_(0.5, 2.0)
    x = torch.randn(5, 4)
    before = snapshot(m)
    g = graph_gradients(m, x, target="sum", train=False)
    # Reference: the same arithmetic without in-place ops, on the same weights.
    m.eval()
    xr = x.clone().requires_grad_(True)
    h = m.fc(xr)
    b = m.bn(h)
    s = b + xr
    y = torch.relu(s)
    gx, gh, gb, gs, gy = torch.autograd.grad(y.sum(), [xr, h, b, s, y])
    assert _close(_edge(g, "in:input", "m:fc:0").grad_l2, gx)
    assert _close(_edge(g, "in:input", "op:0").grad_l2, gx)  # one tensor, one norm
    assert _close(_edge(g, "m:fc:0", "m:bn:0").grad_l2, gh)
    assert _close(_edge(g, "m:bn:0", "op:0").grad_l2, gb)  # before += changed it
    assert _close(_edge(g, "op:0", "m:relu:0").grad_l2, gs)  # before ReLU changed it
    assert _close(_edge(g, "m:relu:0", "out:output").grad_l2, gy)
    assert not torch.allclose(gs, gy)  # the test can tell the values apart
    stats = g.nodes["op:0"].stats
    assert stats["grad_l2"] == pytest.approx(float(gs.double().norm()), rel=1e-6)
    assert stats["grad_mean_abs"] == pytest.approx(float(gs.double().abs().mean()), rel=1e-6)
    assert stats["activation_std"] == pytest.approx(float(s.detach().double().std()), rel=1e-5)
    assert stats["flags"] == []
    m.train()
    assert_no_hooks(m)
    after = snapshot(m)
    assert all(torch.equal(before["params"][k], after["params"][k]) for k in before["params"])
    assert all(torch.equal(before["buffers"][k], after["buffers"][k]) for k in before["buffers"])
    assert after["grads"] == before["grads"] and after["training"] == before["training"]
    assert torch._C._len_torch_function_stack() == 0


def test_concatenation_and_dict_and_lstm_edges():
    m = TwoBranch()
    x = torch.randn(3, 4)
    g = graph_gradients(m, x, target="top1")
    xr = x.clone().requires_grad_(True)
    a, b = m.a(xr), m.b(xr)
    c = torch.cat([a, b], 1)
    out = m.head(c)
    ga, gb, gc = torch.autograd.grad(out.max(1).values.sum(), [a, b, c])
    assert _close(_edge(g, "m:a:0", "op:0").grad_l2, ga)
    assert _close(_edge(g, "m:b.1:0", "op:0").grad_l2, gb)
    assert _close(_edge(g, "op:0", "m:head:0").grad_l2, gc)

    d = DictOut()
    g = graph_gradients(d, x, target="sum@emb")
    assert _edge(g, "m:cls:0", "out:logits").grad_l2 is None  # not on the target's path
    assert g.nodes["m:cls:0"].stats["flags"] == ["no gradient"]
    assert _edge(g, "m:body:0", "out:emb").grad_l2 == pytest.approx(float(torch.ones(3, 6).norm()))

    r = Recurrent()
    xs = torch.randn(2, 6, 5)
    g = graph_gradients(r, xs, target="sum")
    xr = xs.clone().requires_grad_(True)
    o, _ = r.lstm(xr)
    last = o[:, -1]
    go, gl = torch.autograd.grad(r.fc(last).sum(), [o, last])
    assert _close(_edge(g, "m:lstm:0", "op:0").grad_l2, go)
    assert _close(_edge(g, "op:0", "m:fc:0").grad_l2, gl)


class Dead(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * 0 + torch.log(x - 10)


def test_flags_zero_and_nonfinite():
    g = graph_gradients(Dead(), torch.randn(2, 4), target="sum")
    assert "zero" in g.nodes["m:fc:0"].stats["flags"]
    log = next(n for n in g if n.name == "log")
    assert "nan/inf" in log.stats["flags"]


@pytest.mark.slow
def test_resnet18_module_edges_match_reference_gradients():
    import torchvision

    from tests.ground_truth import reference

    m = torchvision.models.resnet18()
    x = torch.randn(2, 3, 64, 64)
    g = graph_gradients(m, x, target="top1")
    leaves = [n for n, mod in m.named_modules() if next(mod.children(), None) is None]
    ref = reference(m, x, leaves, target="top1", input_grad=True)
    checked = 0
    values = g.meta["node_values"]
    for e in g.edges:
        src = g.nodes[e.src]
        if src.kind == "module" and e.tensor == values[src.id]:
            want = ref["calls"][src.name][src.call]["grad_output"]
            assert _close(e.grad_l2, want), (e.src, e.dst)
            checked += 1
        elif src.kind == "input":
            assert _close(e.grad_l2, ref["input_grad"])
            checked += 1
    assert checked == len(g.edges) - 9  # all but the 8 adds' and the flatten's out-edges
    assert_no_hooks(m)


class OpSpikes(nn.Module):
    """Ops whose output gradient is 1e4 times (``explode``) or 1e-4 times (vanishing) that of
    every module and op around them; the scalings cancel, so their neighbours stay level.

    explode: h -> matmul(h, 1e-4·I) -> cat([z, z]) -> ×1e4 -> b: the matmul's and the cat's
    outputs get 1e4 times the gradient of the mul's output.
    vanish: h -> ×1e4 -> add(·, h) -> ×1e-4 -> b: the first mul's and the add's outputs get
    1e-4 times it.
    """

    def __init__(self, explode: bool):
        super().__init__()
        self.explode = explode
        self.a1, self.a2, self.a3 = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.b1 = nn.Linear(16 if explode else 8, 8)
        self.b2, self.b3 = nn.Linear(8, 8), nn.Linear(8, 4)
        self.register_buffer("shrink", torch.eye(8) * 1e-4)
        self.seen: dict[str, torch.Tensor] = {}

    def forward(self, x):
        h = self.a3(self.a2(self.a1(x)))
        if self.explode:
            z = torch.matmul(h, self.shrink)
            c = torch.cat([z, z], dim=1)
            u = c * 1e4
            self.seen.update(h=h, matmul=z, cat=c, mul=u)
        else:
            up = h * 1e4
            s = torch.add(up, h)
            u = s * 1e-4
            self.seen.update(h=h, up=up, add=s, mul=u)
        v = self.b1(u)
        self.seen["b1"] = v
        return self.b3(self.b2(v))


def _rms(t: torch.Tensor) -> float:
    return float(t.double().norm()) / t.numel() ** 0.5


@pytest.mark.parametrize("explode", [True, False])
def test_op_nodes_flagged_vanishing_or_exploding_like_module_nodes(explode):
    torch.manual_seed(0)
    m = OpSpikes(explode)
    x = torch.randn(4, 8)
    g = graph_gradients(m, x, target="sum")
    # Ground truth: the gradients of the same tensors, from torch.autograd.grad.
    m.seen.clear()
    y = m(x)
    names = ["matmul", "cat", "mul"] if explode else ["up", "add", "mul"]
    truth = dict(zip(["h", "b1", *names], torch.autograd.grad(y.sum(), [m.seen[k] for k in ["h", "b1", *names]])))
    ops = [n for n in g if n.kind == "op"]  # in forward order
    assert [n.name for n in ops] == (names if explode else ["mul", "add", "mul"])
    for name, node in zip(names, ops):
        assert node.stats["grad_rms"] == pytest.approx(_rms(truth[name]), rel=1e-6)
    spiking = ["matmul", "cat"] if explode else ["up", "add"]
    level = (_rms(truth["h"]) * _rms(truth["b1"])) ** 0.5
    for name in spiking:  # the model does what it says: 1e4 (or 1e-4) times its neighbours
        ratio = _rms(truth[name]) / level
        assert (ratio > 1e3) if explode else (ratio < 1e-3)
    flagged = [(n.id, f) for n in g for f in (n.stats or {}).get("flags", []) if f in ("vanishing", "exploding")]
    want = "exploding" if explode else "vanishing"
    assert flagged == [(node.id, want) for name, node in zip(names, ops) if name in spiking]


class SpikeIntoModule(nn.Module):
    """A matmul by 1e-4·I feeding a Linear whose weight is 1e4 times larger: the matmul's
    output (the Linear's input) carries 1e4 times the gradient of everything around it."""

    def __init__(self):
        super().__init__()
        self.a1, self.a2, self.a3 = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.b1, self.b2, self.b3 = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)
        with torch.no_grad():
            self.b1.weight.mul_(1e4)
        self.register_buffer("shrink", torch.eye(8) * 1e-4)
        self.seen: dict[str, torch.Tensor] = {}

    def forward(self, x):
        h = self.a3(self.a2(self.a1(x)))
        z = torch.matmul(h, self.shrink)
        self.seen["matmul"] = z
        return self.b3(self.b2(self.b1(z)))


def test_a_capture_puts_gradients_and_flags_on_ops_that_feed_a_module():
    from gradexplorer.capturing.capture import capture
    from gradexplorer.model_graph.graph import extract_graph

    torch.manual_seed(0)
    m = SpikeIntoModule()
    x = torch.randn(4, 8)
    cap = capture(m, x, target="sum", mode="stats")
    g = extract_graph(m, x[:1])
    g.attach_capture(cap)
    op = next(n for n in g if n.kind == "op")
    assert op.name == "matmul"
    m.seen.clear()
    (truth,) = torch.autograd.grad(m(x).sum(), [m.seen["matmul"]])
    assert op.stats["grad_l2"] == pytest.approx(float(truth.double().norm()), rel=1e-6)
    assert _edge(g, op.id, "m:b1:0").grad_l2 == pytest.approx(float(truth.double().norm()), rel=1e-6)
    assert op.stats["flags"] == ["exploding"]
    assert not any(f in ("vanishing", "exploding") for n in g if n.kind == "module"
                   for f in (n.stats or {}).get("flags", []))


def test_a_force_field_gets_the_gradients_of_the_target_only_and_an_lstm_on_h_n_runs():
    """The forward takes forces = -dE/dpos itself: the edges carry the gradients of the
    target's own backward (autograd through gradient edges taken at call time), not those
    of the model's inner one; an LSTM whose sequence output is unused (autograd gives None
    for it) does not stop the graph."""
    from torch.autograd.graph import get_gradient_edge

    from tests.core.test_capture_exactness import ForceField, LastState

    torch.manual_seed(0)
    m, pos = ForceField().eval(), torch.randn(5, 3)
    g = graph_gradients(m, pos, target="sum")
    edges = {}

    def keep_edge(name):
        def hook(module, args, output):
            edges[name] = get_gradient_edge(output)
        return hook

    handles = [getattr(m, n).register_forward_hook(keep_edge(n)) for n in ("embed", "act", "energy")]
    try:
        out = m(pos)
    finally:
        for h in handles:
            h.remove()
    g_embed, g_act, g_energy = torch.autograd.grad(out.sum(), [edges[n] for n in ("embed", "act", "energy")],
                                                   allow_unused=True)
    assert _close(_edge(g, "m:embed:0", "m:act:0").grad_l2, g_embed)
    assert _close(_edge(g, "m:act:0", "m:energy:0").grad_l2, g_act)
    assert g_energy is None and g.nodes["m:energy:0"].stats["grad_l2"] is None

    ids = torch.randint(0, 10, (4, 5))
    g = graph_gradients(LastState(batch_first=True).eval(), ids, target="top1")
    assert _edge(g, "m:head:0", "out:output").grad_l2 == pytest.approx(2.0)
