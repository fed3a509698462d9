"""Every parameter, every model, every capture: each captured number against plain autograd.

The default selection holds every trainable parameter's gradient (those of containers and
of the root included) and the attention that computes; a model whose forward runs a
backward of its own (a force field, a gradient penalty, a PINN) gets the gradients of the
target's backward only; the n-th capture of a model is as exact as the first; gradients
that autograd gives as ``None`` are recorded as absent, with the reason; an eval-mode
capture leaves every buffer as it was. Ground truth: ``torch.autograd.grad`` on the same
graph (``tests/ground_truth.py``), through gradient edges taken at call time where the
model differentiates inside forward.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from gradexplorer.analysis.capture_summary import summarize
from gradexplorer.analysis.gradient_flow import NOT_CALLED, flow_gaps, layer_flags
from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.data import FROZEN, NOT_REACHED, UNUSED_OUTPUT
from tests.conftest import assert_unchanged, snapshot
from tests.ground_truth import (
    assert_param_grads_equal,
    compare,
    param_grads_by_autograd,
    reference,
    reference_by_edges,
    target_by_hand,
)

TOL = 1e-5


def tiny_vit() -> nn.Module:
    return torchvision.models.VisionTransformer(
        image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=5).eval()


def tiny_encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


class Tempered(nn.Module):
    """A classifier whose logits are divided by a learnt temperature on the root."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.temperature = nn.Parameter(torch.tensor(1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) / self.temperature


CASES = {
    "vit": (tiny_vit, lambda: torch.randn(2, 3, 32, 32), "top1"),
    "encoder": (tiny_encoder, lambda: torch.randn(2, 5, 16), "sum"),
    "root_parameter": (Tempered, lambda: torch.randn(3, 6), "top1"),
}


def _called(cap) -> list[str]:
    return [n for n, rec in cap.layers.items() if rec.called]


@pytest.mark.parametrize("key", list(CASES))
def test_a_default_capture_holds_every_trainable_parameter_gradient(key):
    make, batch, target = CASES[key]
    model, x = make(), batch()
    before = snapshot(model)
    cap = capture(model, x, target=target)
    assert_unchanged(model, before)
    want = param_grads_by_autograd(model, target_by_hand(model(x), target))
    assert set(want) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert assert_param_grads_equal(cap, want, rtol=0, atol=0) == len(want)
    # By full name too, as model.named_parameters() names them.
    for name, g in want.items():
        assert torch.equal(cap.param_grads[name], g), name
        assert cap.param_stats[name]["l2"] == pytest.approx(float(g.double().norm()), rel=1e-6)
    # Every recorded call (containers and the root included) against autograd.
    names = _called(cap)
    assert compare(cap, reference(model, x, names, target=target), names) < TOL


def test_the_parameters_of_containers_are_under_the_module_that_owns_them():
    vit = tiny_vit()
    cap = capture(vit, torch.randn(2, 3, 32, 32))
    assert set(cap[""].param_grads) == {"class_token"} and cap[""].called
    assert set(cap["encoder"].param_grads) == {"pos_embedding"}
    attention = "encoder.layers.encoder_layer_0.self_attention"
    assert set(cap[attention].param_grads) == {"in_proj_weight", "in_proj_bias"}
    assert cap.param_grads["encoder.pos_embedding"] is cap["encoder"].param_grads["pos_embedding"]
    assert cap.param_grads["class_token"] is cap[""].param_grads["class_token"]


@pytest.mark.parametrize("key", ["vit", "encoder"])
def test_attention_is_captured_and_its_out_proj_is_never_called_not_without_gradient(key):
    make, batch, target = CASES[key]
    model, x = make(), batch()
    cap = capture(model, x, target=target)
    attention = [n for n, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)]
    assert len(attention) == 2
    names = []
    for name in attention:
        rec = cap[name]
        assert rec.type == "MultiheadAttention" and len(rec.calls) == 1
        assert rec.calls[0].activation is not None and rec.calls[0].grad_output is not None
        names.append(name)
        out_proj = f"{name}.out_proj"
        assert not cap[out_proj].called and out_proj in cap.meta["not_called"]
        assert cap[out_proj].param_grads["weight"] is not None  # its weight is used, by its parent
    # The attention's own output and input gradients equal autograd's.
    assert compare(cap, reference(model, x, names, target=target), names) < TOL
    flags = layer_flags(cap)
    gaps = flow_gaps(cap, "grad_output")
    for name in attention:
        assert "no gradient" not in flags[f"{name}.out_proj"]
        assert gaps[f"{name}.out_proj"] == NOT_CALLED
        assert f"{name}.out_proj" in summarize(cap).not_called
    # Every layer that owns parameters has their gradients, called or not.
    assert set(flow_gaps(cap, "param").values()) <= {"no parameters"}


class Functional(nn.Module):
    """A block without parameters of its own that uses its child's weight functionally:
    the child never runs, the block computes."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.proj.weight * 2, self.proj.bias)


class UsesFunctional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, 4)
        self.block = Functional()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.block(self.inp(x))))


def test_a_container_that_runs_no_child_is_captured_as_a_leaf():
    model, x = UsesFunctional(), torch.randn(5, 3)
    cap = capture(model, x)
    assert cap["block"].called and cap.layer_order.index("block") == 1
    assert not cap["block.proj"].called and cap.meta["not_called"] == ["block.proj"]
    names = ["inp", "block", "head"]
    assert compare(cap, reference(model, x, names), names) < TOL
    assert cap["block"].calls[0].grad_input is not None  # its input gradient, hooked after the call
    want = param_grads_by_autograd(model, target_by_hand(model(x), "top1"))
    assert_param_grads_equal(cap, want, rtol=0, atol=0)
    # A container whose children run is not captured itself.
    assert "" not in capture(nn.Sequential(nn.Linear(3, 2), nn.ReLU()), x).layers
    # An explicit selection is what it says.
    assert list(capture(model, x, layers=["inp", "block.proj"]).layers) == ["inp", "block.proj"]


# -- models that differentiate inside forward ------------------------------------------------


class ForceField(nn.Module):
    """Energy of the positions, forces = -dE/dpos taken inside forward (SchNet, MACE)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 16)
        self.act = nn.Tanh()
        self.energy = nn.Linear(16, 1)

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        pos = pos.clone().requires_grad_(True)
        with torch.enable_grad():
            energy = self.energy(self.act(self.embed(pos))).sum()
            (grad,) = torch.autograd.grad(energy, pos, create_graph=True)
        return -grad


class Penalised(nn.Module):
    """A critic's score beside its gradient penalty ((|d score / dx| - 1)^2, WGAN-GP)."""

    def __init__(self) -> None:
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone().requires_grad_(True)
        with torch.enable_grad():
            score = self.critic(x)
            (g,) = torch.autograd.grad(score.sum(), x, create_graph=True)
        penalty = (g.norm(dim=1, keepdim=True) - 1) ** 2
        return torch.cat([score, penalty], 1)


class Burgers(nn.Module):
    """A physics-informed network: u(x, t) and the residual of Burgers' equation,
    u_t + u u_x - nu u_xx, through first and second derivatives taken inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, xt: torch.Tensor) -> torch.Tensor:
        xt = xt.clone().requires_grad_(True)
        with torch.enable_grad():
            u = self.net(xt)
            (du,) = torch.autograd.grad(u.sum(), xt, create_graph=True)
            u_x, u_t = du[:, :1], du[:, 1:]
            (d2u,) = torch.autograd.grad(u_x.sum(), xt, create_graph=True)
        return torch.cat([u, u_t + u * u_x - 0.01 * d2u[:, :1]], 1)


INNER = {
    "force_field": (ForceField, lambda: torch.randn(6, 3), "top1"),
    "gradient_penalty": (Penalised, lambda: torch.randn(5, 4), "sum"),
    "pinn": (Burgers, lambda: torch.rand(7, 2), "mean"),
}


@pytest.mark.parametrize("key", list(INNER))
@pytest.mark.parametrize("mode", ["full", "stats"])
def test_a_model_that_differentiates_inside_forward_gets_the_target_gradients_only(key, mode):
    make, batch, target = INNER[key]
    torch.manual_seed(3)
    model, x = make().eval(), batch()
    cap = capture(model, x, target=target, mode=mode)
    names = list(cap.layers)
    ref = reference_by_edges(model, (x,), names, target=target)
    for name in names:
        for got, want in zip(cap[name].calls, ref["calls"][name], strict=True):
            for kind in ("grad_output", "grad_input"):
                stats, truth = got.stats[kind], want[kind]
                assert (stats is None) == (truth is None), (name, kind, stats is None)
                if truth is None:
                    assert got.absent[kind] == NOT_REACHED
                    continue
                assert stats["l2"] == pytest.approx(float(truth.double().norm()), rel=1e-5, abs=1e-12), (name, kind)
                if mode == "full":
                    torch.testing.assert_close(got.tensor(kind), truth, rtol=1e-5, atol=1e-7)
            if mode == "full":
                torch.testing.assert_close(got.activation, want["activation"], rtol=0, atol=0)
        for pname, truth in ref["params"][name].items():
            if mode == "full":
                torch.testing.assert_close(cap[name].param_grads[pname], truth, rtol=1e-5, atol=1e-7)
    if key == "force_field":
        # The energy itself is not on the forces' path: the inner backward reached it, the
        # target's did not.
        assert cap["energy"].calls[0].stats["grad_output"] is None
        assert cap["energy"].calls[0].absent["grad_output"] == NOT_REACHED


# -- the n-th capture --------------------------------------------------------------------------


class ClampedThroughData(nn.Module):
    """Clamps a layer's output through ``.data``: no version counter moves."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h.data.clamp_(min=0.0)
        return self.head(h)


@pytest.mark.parametrize("mode", ["full", "stats"])
def test_every_capture_of_a_model_clamped_through_data_is_exact(mode):
    model, x = ClampedThroughData(), torch.randn(6, 4)
    want = model.fc(x).detach()
    assert want.min() < 0  # the clamp changes it
    for _ in range(3):
        cap = capture(model, x, mode=mode)
        stats = cap["fc"].calls[0].stats["activation"]
        assert stats["min"] == pytest.approx(float(want.min()), rel=1e-6)
        assert stats["mean"] == pytest.approx(float(want.double().mean()), rel=1e-6)
        if mode == "full":
            assert torch.equal(cap["fc"].calls[0].activation, want)


class Echo(nn.Module):
    """Returns its child's output after changing it through ``.data``: the same tensor
    object at the same version, another value."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h.data.mul_(2)
        return h


@pytest.mark.parametrize("mode", ["full", "stats"])
def test_two_modules_returning_one_tensor_changed_between_them_get_their_own_values(mode):
    model, x = Echo(), torch.randn(4, 3)
    inner = model.fc(x).detach()
    cap = capture(model, x, layers=["", "fc"], mode=mode)
    assert cap["fc"].calls[0].stats["activation"]["max"] == pytest.approx(float(inner.max()), rel=1e-6)
    assert cap[""].calls[0].stats["activation"]["max"] == pytest.approx(float(2 * inner.max()), rel=1e-6)
    if mode == "full":
        assert torch.equal(cap["fc"].calls[0].activation, inner)
        assert torch.equal(cap[""].calls[0].activation, 2 * inner)


# -- gradients autograd gives as None ---------------------------------------------------------


class LastState(nn.Module):
    """The common sequence classifier: an LSTM whose sequence output is never used, only h_n."""

    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(10, 8)
        self.rnn = nn.LSTM(8, 6, num_layers=2, batch_first=batch_first)
        self.head = nn.Linear(6, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.embed(ids)
        _, (h_n, _c_n) = self.rnn(e if self.batch_first else e.transpose(0, 1))
        return self.head(h_n[-1])


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("mode", ["full", "stats"])
def test_an_lstm_classifier_on_its_last_state(batch_first, mode):
    model = LastState(batch_first).eval()
    ids = torch.randint(0, 10, (4, 5), generator=torch.Generator().manual_seed(0))
    before = snapshot(model)
    cap = capture(model, ids, mode=mode, input_grad=True)
    assert_unchanged(model, before)
    want = param_grads_by_autograd(model, target_by_hand(model(ids), "top1"))
    if mode == "full":
        assert_param_grads_equal(cap, want, rtol=1e-6, atol=1e-8)
    else:
        for name, g in want.items():
            assert cap.param_stats[name]["l2"] == pytest.approx(float(g.double().norm()), rel=1e-5)
    rnn = cap["rnn"].calls[0]
    assert rnn.output_key == "0" and rnn.stats["grad_output"] is None and rnn.grad_output is None
    assert rnn.absent["grad_output"] == UNUSED_OUTPUT
    # The rest of the model against autograd.
    if mode == "full":
        names = ["embed", "head"]
        assert compare(cap, reference(model, ids, names), names) < TOL
    assert "no gradient" in layer_flags(cap)["rnn"]  # it ran: its output has none, truly


class TwoOut(torch.autograd.Function):
    """A node of the model's own with two outputs (x * 2, x * 3)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, g2, g3):
        return (0 if g2 is None else g2 * 2) + (0 if g3 is None else g3 * 3)


class Split(nn.Module):
    """Returns both outputs of one node: torch's own (``var_mean``) or the model's (``TwoOut``)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x):
        return torch.var_mean(x, dim=1, keepdim=True) if self.kind == "var_mean" else TwoOut.apply(x)


class Reads(nn.Module):
    """``lin``, then ``split``; the target reads the split's output ``use`` (0, 1), or
    neither (``None``: the split runs on a branch the target never reaches)."""

    def __init__(self, kind: str, use: int | None) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.split = Split(kind)
        self.head = nn.Linear(4 if kind == "two_out" or use is None else 1, 2)
        self.use = use

    def forward(self, x):
        h = self.lin(x)
        parts = self.split(h)
        return self.head(h if self.use is None else parts[self.use])


@pytest.mark.parametrize("kind", ["var_mean", "two_out"])
@pytest.mark.parametrize("use", [0, 1, None])
@pytest.mark.parametrize("mode", ["full", "stats"])
def test_one_output_of_a_node_with_several(kind, use, mode):
    """The split's recorded output is the node's first. Read by the target: its gradient is
    ``torch.autograd.grad``'s. The target reads the other: autograd computed the node and gave
    the first none (``UNUSED_OUTPUT``). Neither: the backward never reached the node
    (``NOT_REACHED``)."""
    torch.manual_seed(0)
    model, x = Reads(kind, use).eval(), torch.randn(3, 4)
    cap = capture(model, x, mode=mode, target="sum")
    call = cap["split"].calls[0]
    assert call.output_key == "0"
    h = model.lin(x)
    parts = model.split(h)
    out = model.head(h if use is None else parts[use]).sum()  # the model's forward, by hand
    if use == 0:
        want = torch.autograd.grad(out, parts[0], retain_graph=True)[0].double()
        got = call.stats["grad_output"]
        assert got["mean"] == pytest.approx(float(want.mean()), rel=1e-6, abs=1e-9)
        assert got["l2"] == pytest.approx(float(want.norm()), rel=1e-6)
        if mode == "full":
            torch.testing.assert_close(call.grad_output.double(), want, rtol=1e-6, atol=1e-9)
        assert not call.absent
    else:
        assert call.stats["grad_output"] is None and call.grad_output is None
        assert call.absent["grad_output"] == (UNUSED_OUTPUT if use == 1 else NOT_REACHED)
    # The gradient at the split's input is the one at lin's output (one value, one record).
    want_h = torch.autograd.grad(out, h)[0].double()
    assert cap["lin"].calls[0].stats["grad_output"]["l2"] == pytest.approx(float(want_h.norm()), rel=1e-6)
    assert call.stats["grad_input"] is cap["lin"].calls[0].stats["grad_output"]


class Second(nn.Module):
    """The second output of a two-output node, alone (its place among the node's outputs: 1)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.split = Split(kind)

    def forward(self, x):
        return self.split.forward(x)[1]


@pytest.mark.parametrize("kind", ["var_mean", "two_out"])
@pytest.mark.parametrize("mode", ["full", "stats"])
def test_the_second_output_of_a_node_gets_its_own_gradient(kind, mode):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Second(kind), nn.Linear(4 if kind == "two_out" else 1, 2)).eval()
    x = torch.randn(3, 4)
    cap = capture(model, x, mode=mode, target="sum")
    y = model[1](model[0](x))
    assert y.grad_fn is not None and y.output_nr == 1
    want = torch.autograd.grad(model[2](y).sum(), y)[0].double()
    got = cap["1"].calls[0].stats["grad_output"]
    assert got["l2"] == pytest.approx(float(want.norm()), rel=1e-6)
    assert got["mean"] == pytest.approx(float(want.mean()), rel=1e-6, abs=1e-9)
    if mode == "full":
        torch.testing.assert_close(cap["1"].calls[0].grad_output.double(), want, rtol=1e-6, atol=1e-9)


def test_a_frozen_parameter_is_absent_with_its_reason():
    model = Tempered()
    model.temperature.requires_grad_(False)
    cap = capture(model, torch.randn(2, 6))
    assert "" not in cap.layers  # the root owns no trainable parameter now
    cap = capture(model, torch.randn(2, 6), layers=["", "fc"])
    assert cap[""].param_grads["temperature"] is None
    assert cap.param_absent == {"temperature": FROZEN}


# -- buffers ------------------------------------------------------------------------------------


def _qat_model() -> nn.Module:
    from torch.ao.quantization import get_default_qat_qconfig, prepare_qat

    torch.manual_seed(0)
    model = nn.Sequential(torch.ao.quantization.QuantStub(), nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3),
                          torch.ao.quantization.DeQuantStub())
    model.qconfig = get_default_qat_qconfig("fbgemm")
    model = prepare_qat(model.train())
    model(torch.randn(16, 4))  # observers learn a first range
    return model.eval()


def _hooks_of(model: nn.Module) -> dict:
    return {(name, attr): dict(getattr(m, attr)) for name, m in model.named_modules()
            for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks")}


@pytest.mark.parametrize("train", [False, True])
def test_a_qat_model_keeps_its_observers_buffers(train):
    model = _qat_model()
    before, hooks = snapshot(model), _hooks_of(model)
    assert any("scale" in n for n in before["buffers"]) and any("min_val" in n for n in before["buffers"])
    x = torch.randn(5, 4) * 10  # outside the range the observers have seen
    cap = capture(model, x, train=train)
    assert _hooks_of(model) == hooks  # the model's own observer hooks, and none of ours
    now = {"params": dict(model.named_parameters()), "buffers": dict(model.named_buffers())}
    for kind in ("params", "buffers"):
        for name, t in before[kind].items():
            assert torch.equal(now[kind][name], t), name
    assert {n: m.training for n, m in model.named_modules()} == before["training"]
    # The gradients are those of the model as it was (observers update during forward, as
    # in plain autograd on a copy).
    import copy

    twin = copy.deepcopy(model).train(train)
    want = param_grads_by_autograd(twin, target_by_hand(twin(x), "top1"))
    assert_param_grads_equal(cap, want, rtol=1e-6, atol=1e-8)


class Replaces(nn.Module):
    """Replaces and resizes its buffers in forward, in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.register_buffer("seen", torch.zeros(1))
        self.register_buffer("last", torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = self.seen + 1  # a new tensor in its place
        self.last.data.resize_(x.shape[0]).copy_(x[:, 0].detach())  # resized, through .data
        return self.fc(x)


def test_buffers_replaced_or_resized_in_eval_are_put_back():
    model = Replaces().eval()
    seen, last = model.seen, model.last
    before = snapshot(model)
    capture(model, torch.randn(5, 3))
    assert model.seen is seen and model.last is last
    assert_unchanged(model, before)
