"""Gradients on the graph: edge norms equal ``torch.autograd.grad`` of the same tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.graph_grads import graph_gradients
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
