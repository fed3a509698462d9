"""Every captured tensor against plain autograd on the same graph (tests/ground_truth.py)."""

from __future__ import annotations

import threading
from collections import namedtuple

import pytest
import torch
import torchvision
from torch import nn

from gradexplorer.base.errors import CaptureCancelled, CaptureError, GradExplorerError
from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.selection import leaf_names
from gradexplorer.stats.tensor_stats import tensor_stats
from tests.conftest import assert_no_hooks, assert_unchanged, snapshot
from tests.ground_truth import compare, reference

TOL = 1e-5


def check_against_reference(model, x, layers=None, target="top1", train=False, labels=None, **kw):
    names = layers or leaf_names(model)
    before = snapshot(model)
    cap = capture(model, x, layers=names, target=target, train=train, labels=labels, **kw)
    assert_unchanged(model, before)
    torch.manual_seed(0)  # same dropout masks are not needed: reference runs are compared in eval or without dropout
    ref = reference(model, x, names, target=target, train=train, labels=labels,
                    input_grad=kw.get("input_grad", False))
    err = compare(cap, ref, names)
    assert err < TOL, err
    return cap, ref


class SeedMLP(nn.Module):
    """The tutorial's Linear 10 -> 5 -> 3 -> 1 model."""

    def __init__(self):
        super().__init__()
        self.fc1, self.relu1 = nn.Linear(10, 5), nn.ReLU()
        self.fc2, self.relu2 = nn.Linear(5, 3), nn.ReLU()
        self.fc3 = nn.Linear(3, 1)

    def forward(self, x):
        return self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x)))))


def test_tutorial_mlp_matches_autograd_by_hand():
    torch.manual_seed(1)
    model = SeedMLP()
    x = torch.randn(4, 10)
    cap = capture(model, x, target="sum", input_grad=True)
    # Hand-written ground truth, no hooks at all.
    h1 = model.fc1(x)
    a1 = torch.relu(h1)
    h2 = model.fc2(a1)
    a2 = torch.relu(h2)
    out = model.fc3(a2)
    xs = x.clone().requires_grad_(True)
    g = torch.autograd.grad(out.sum(), [h1, a1, h2, a2, out, model.fc1.weight, model.fc3.bias], retain_graph=True)
    assert torch.allclose(cap["fc1"].calls[0].activation, h1)
    assert torch.allclose(cap["fc1"].calls[0].grad_output, g[0])
    assert torch.allclose(cap["relu1"].calls[0].grad_input, g[0])
    assert torch.allclose(cap["relu1"].calls[0].grad_output, g[1])
    assert torch.allclose(cap["fc2"].calls[0].grad_input, g[1])
    assert torch.allclose(cap["fc2"].calls[0].grad_output, g[2])
    assert torch.allclose(cap["relu2"].calls[0].grad_output, g[3])
    assert torch.allclose(cap["fc3"].calls[0].grad_output, g[4])
    assert torch.allclose(cap["fc1"].param_grads["weight"], g[5])
    assert torch.allclose(cap["fc3"].param_grads["bias"], g[6])
    (gx,) = torch.autograd.grad(model(xs).sum(), xs)
    assert torch.allclose(cap.input_grad, gx)
    assert torch.allclose(cap["fc1"].calls[0].grad_input, gx)
    # Without the input gradient the batch needs no grad: the first layer has no input gradient.
    plain = capture(model, x, target="sum")
    assert plain["fc1"].calls[0].grad_input is None and plain.input_grad is None
    assert plain["fc1"].calls[0].stats["grad_input"] is None
    assert cap.layer_order == ["fc1", "relu1", "fc2", "relu2", "fc3"]
    assert_no_hooks(model)


@pytest.mark.slow
def test_resnet18_inplace_relu_residual_and_reused_modules():
    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 64, 64)
    names = ["conv1", "bn1", "relu", "layer1.0.conv1", "layer1.0.bn1", "layer1.0.relu",
             "layer1.0.bn2", "layer1.0", "layer4.1.relu", "avgpool", "fc"]
    cap, ref = check_against_reference(model, x, names, input_grad=True)
    # BasicBlock.relu runs twice per forward: two records, with different gradients.
    calls = cap["layer1.0.relu"].calls
    assert len(calls) == 2
    assert not torch.equal(calls[0].grad_output, calls[1].grad_output)
    # bn1 feeds an in-place ReLU: its activation keeps its negative values...
    assert cap["bn1"].calls[0].activation.min() < 0
    assert cap["relu"].calls[0].activation.min() >= 0
    # ... and bn2 feeds `out += identity`: its activation is the value before the addition.
    bn2 = model.layer1[0].bn2
    assert cap["layer1.0.bn2"].calls[0].stats["activation"]["min"] == pytest.approx(
        cap["layer1.0.bn2"].calls[0].activation.min().item())
    assert cap["layer1.0.bn2"].type == type(bn2).__name__
    assert torch.allclose(cap.input_grad, ref["input_grad"])
    assert cap.input_grad.shape == x.shape


@pytest.mark.slow
def test_resnet18_every_leaf_layer_full_and_stats_modes():
    model = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 64, 64)
    cap, ref = check_against_reference(model, x)
    stats_cap = capture(model, x, mode="stats")
    assert stats_cap.layer_order == cap.layer_order
    for name, i, call in stats_cap.iter_calls():
        assert call.activation is None and call.grad_output is None and call.grad_input is None
        want = ref["calls"][name][i]
        for kind in ("activation", "grad_output"):
            if want[kind] is None:
                assert call.stats[kind] is None
                continue
            got = call.stats[kind]
            t = want[kind].double()
            assert got["numel"] == t.numel()
            assert got["max"] == pytest.approx(t.max().item(), rel=1e-5, abs=1e-7)
            assert got["min"] == pytest.approx(t.min().item(), rel=1e-5, abs=1e-7)
            assert got["mean"] == pytest.approx(t.mean().item(), rel=1e-3, abs=1e-7)
            assert got["l2"] == pytest.approx(t.norm().item(), rel=1e-4)
        for pname, g in ref["params"][name].items():
            assert stats_cap[name].param_grads[pname] is None
            if g is not None:
                assert stats_cap[name].param_stats[pname]["l2"] == pytest.approx(g.norm().item(), rel=1e-4)


@pytest.mark.slow
def test_efficientnet_mbconv_block_with_residual_and_inplace_silu():
    model = torchvision.models.efficientnet_b0().eval()
    x = torch.randn(1, 3, 64, 64)
    names = ["features.0.2", "features.2.0.block", "features.2.1.block", "features.2.1",
             "features.2.1.block.1.0", "features.2.1.block.2", "classifier.1"]
    check_against_reference(model, x, names)


@pytest.mark.slow
def test_vit_token_outputs_and_attention_tuple():
    model = torchvision.models.vit_b_16(image_size=64).eval()
    x = torch.randn(1, 3, 64, 64)
    names = ["conv_proj", "encoder.layers.encoder_layer_0.self_attention",
             "encoder.layers.encoder_layer_0.ln_1", "encoder.layers.encoder_layer_11",
             "encoder.layers.encoder_layer_11.mlp", "encoder.ln", "heads.head"]
    cap, _ = check_against_reference(model, x, names)
    # MultiheadAttention returns (output, weights): the output is recorded.
    attn = cap["encoder.layers.encoder_layer_0.self_attention"].calls[0]
    assert attn.output_key == "0" and attn.shape == (1, 17, 768)


@pytest.mark.slow
def test_googlenet_train_mode_namedtuple_output_restores_model():
    model = torchvision.models.googlenet(aux_logits=True, init_weights=False)
    model.eval()
    x = torch.randn(2, 3, 96, 96)
    names = ["conv1.bn", "inception3a.branch2.1.conv", "aux1.fc2", "aux2.conv.bn", "fc"]
    # Dropout makes two train-mode forwards differ: compare with dropout disabled by seed.
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    before = snapshot(model)
    cap, ref = check_against_reference(model, x, names, train=True, target="top1@aux_logits1")
    assert cap.meta["train"] is True
    assert cap["aux1.fc2"].calls[0].grad_output is not None
    # The main logits do not reach the aux1 target.
    assert cap["fc"].calls[0].grad_output is None
    assert_unchanged(model, before)


@pytest.mark.slow
def test_segmentation_dict_output():
    model = torchvision.models.segmentation.lraspp_mobilenet_v3_large(weights_backbone=None, num_classes=5).eval()
    x = torch.randn(1, 3, 64, 64)
    names = ["backbone", "backbone.1.block.0.0", "backbone.2", "classifier.cbr", "classifier.high_classifier"]
    cap, _ = check_against_reference(model, x, names, target="class:2@out")
    # The backbone returns an OrderedDict of feature maps: its first one is recorded.
    assert cap["backbone"].calls[0].output_key == "low"
    assert cap.output.shape == (1, 5, 64, 64)


@pytest.mark.slow
def test_video_model():
    model = torchvision.models.video.r3d_18().eval()
    x = torch.randn(1, 3, 4, 32, 32)
    check_against_reference(model, x, ["stem.0", "layer1.0.relu", "fc"])


class TwoHeads(nn.Module):
    """A shared module called twice, a frozen layer, tuple and dict outputs."""

    Out = namedtuple("Out", ["logits", "aux"])

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(6, 8)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.shared = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = self.act(self.stem(x))
        h = self.frozen(h)
        h = self.act(self.shared(h))
        h = self.act(self.shared(h))
        return self.Out(self.head(h), {"feat": h.mean(1)})


def test_shared_modules_frozen_params_and_namedtuple_outputs():
    model = TwoHeads()
    x = torch.randn(3, 6)
    cap, ref = check_against_reference(model, x, target="class:1")
    assert len(cap["shared"].calls) == 2
    assert len(cap["act"].calls) == 3
    assert cap["frozen"].param_grads == {"weight": None, "bias": None}
    assert cap["frozen"].param_stats == {"weight": None, "bias": None}
    # The shared layer's parameter gradient is the sum over both calls.
    assert cap["shared"].param_grads["weight"] is not None


def test_cross_entropy_target_with_labels():
    model = SeedMLP()
    model.fc3 = nn.Linear(3, 4)
    x = torch.randn(5, 10)
    labels = torch.tensor([0, 1, 2, 3, 1])
    check_against_reference(model, x, target="cross_entropy", labels=labels)


def test_all_frozen_model_still_gets_layer_gradients():
    model = SeedMLP().requires_grad_(False)
    x = torch.randn(2, 10)
    cap = capture(model, x, target="sum")
    assert cap["fc2"].calls[0].grad_output is not None
    assert cap.input_grad is None


def test_forward_error_names_the_module_and_removes_hooks():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(5, 2)

        def forward(self, x):
            return self.b(self.a(x))

    model = Broken()
    before = snapshot(model)
    with pytest.raises(CaptureError) as info:
        capture(model, torch.randn(2, 4))
    msg = str(info.value)
    assert "'b'" in msg and "Linear" in msg and "a" in msg
    assert_unchanged(model, before)


def _hook_dicts(model: nn.Module) -> dict:
    return {(n, attr): list(getattr(m, attr).items()) for n, m in model.named_modules()
            for attr in ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
                         "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")}


@pytest.mark.parametrize("mode", ["full", "stats"])
def test_the_users_own_hooks_run_beside_the_captures_and_the_hook_dicts_come_back_as_they_were(mode):
    # The capture's hooks share one function per kind across every module: a module the
    # user hooked keeps its hooks, in their order, and every module's hook dictionaries are
    # as they were after the capture, and after one whose forward raised.
    model = torchvision.models.resnet18().eval()
    fired: list[str] = []
    model.layer1[0].register_forward_pre_hook(lambda m, a: fired.append("pre"))
    model.layer1[0].relu.register_forward_hook(lambda m, a, k, o: fired.append("post"), with_kwargs=True,
                                               always_call=True)
    before = _hook_dicts(model)
    x = torch.randn(2, 3, 64, 64)
    names = leaf_names(model)
    cap = capture(model, x, layers=names, mode=mode, input_grad=True)
    assert _hook_dicts(model) == before
    runs = 1
    if mode == "full":  # (the statistics of every path are checked by test_stats_match_independent_computation)
        assert compare(cap, reference(model, x, names, input_grad=True), names) < TOL
        runs = 2
    assert fired.count("pre") == runs and fired.count("post") == 2 * runs  # the block's relu runs twice
    assert len(cap["layer1.0.relu"].calls) == 2

    class Fails(nn.Module):
        def forward(self, x):
            raise ValueError("no")

    model.layer2[0].relu = Fails()
    with pytest.raises(CaptureError):
        capture(model, x, mode=mode)
    after = _hook_dicts(model)
    assert {k: v for k, v in after.items() if not k[0].startswith("layer2.0.relu")} == {
        k: v for k, v in before.items() if not k[0].startswith("layer2.0.relu")}
    assert_no_hooks(model.layer2[0].relu)


def test_bad_target_and_layers_leave_model_untouched():
    model = SeedMLP()
    before = snapshot(model)
    with pytest.raises(GradExplorerError, match="out of range"):
        capture(model, torch.randn(2, 10), target="class:3")
    with pytest.raises(GradExplorerError, match="fc1"):
        capture(model, torch.randn(2, 10), layers=["fc_1"])
    with pytest.raises(GradExplorerError, match="labels"):
        capture(model, torch.randn(2, 10), target="cross_entropy")
    assert_unchanged(model, before)


@pytest.mark.parametrize("stage", ["forward", "backward"])
def test_cancel_in_forward_or_backward(stage):
    model = SeedMLP()
    before = snapshot(model)
    flag = threading.Event()

    def progress(s, done, total):
        # "forward" is reported during forward; its last report (done == total) comes just
        # before backward starts, so the next check is inside a gradient hook.
        if s == "forward" and (stage == "forward" or done == total):
            flag.set()

    with pytest.raises(CaptureCancelled):
        capture(model, torch.randn(2, 10), progress=progress, cancel=flag)
    assert_unchanged(model, before)
    # The model still works and a new capture succeeds.
    flag.clear()
    assert capture(model, torch.randn(2, 10)).layer_order


def test_existing_grads_are_left_as_they_were():
    model = SeedMLP()
    model(torch.randn(3, 10)).sum().backward()
    before = snapshot(model)
    capture(model, torch.randn(2, 10))
    assert_unchanged(model, before)


def test_nan_in_gradients_is_captured_and_counted():
    class Sqrt(nn.Module):
        def forward(self, x):
            return torch.sqrt(x)

    model = nn.Sequential(nn.Linear(3, 3), Sqrt(), nn.Linear(3, 1))
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(3))
        model[0].bias.zero_()
    cap = capture(model, torch.tensor([[-1.0, 4.0, 0.0]]), target="sum")
    act = cap["1"].calls[0].stats["activation"]
    assert act["nan_count"] == 1
    grad = cap["0"].calls[0].stats["grad_output"]
    assert grad["nan_count"] + grad["inf_count"] >= 1


def test_selection_by_pattern_and_predicate():
    model = torchvision.models.resnet18()
    x = torch.randn(1, 3, 32, 32)
    cap = capture(model, x, layers=["layer4.*"], mode="stats")
    assert set(cap.layer_order) == {n for n, _ in model.named_modules() if n.startswith("layer4.")}
    cap2 = capture(model, x, layers=lambda n, m: isinstance(m, nn.Conv2d), mode="stats")
    assert all(cap2[n].type == "Conv2d" for n in cap2)


def test_stats_match_independent_computation():
    t = torch.randn(3, 50, 40)
    t[0, 0, :5] = 0.0
    s = tensor_stats(t, hist_exact_limit=None)
    d = t.double()
    assert s["numel"] == t.numel()
    assert s["mean"] == pytest.approx(d.mean().item(), abs=1e-6)
    assert s["std"] == pytest.approx(d.std().item(), rel=1e-5)
    assert s["mean_abs"] == pytest.approx(d.abs().mean().item(), rel=1e-5)
    assert s["l2"] == pytest.approx(d.norm().item(), rel=1e-5)
    assert s["zero_fraction"] == pytest.approx(5 / t.numel())
    counts, edges = torch.histogram(d, bins=64, range=(d.min().item(), d.max().item()))
    assert torch.equal(s["hist"], counts.float())
    assert s["hist_exact"]
    # A subsampled histogram still adds up to numel and has the same shape.
    big = torch.randn(1 << 20)
    s2 = tensor_stats(big, hist_exact_limit=1 << 14)
    assert not s2["hist_exact"]
    assert s2["hist"].sum().item() == pytest.approx(big.numel(), rel=1e-4)
    exact = tensor_stats(big, hist_exact_limit=None)["hist"]
    assert (s2["hist"] - exact).abs().sum() / exact.sum() < 0.05
    with_nan = torch.tensor([1.0, float("nan"), float("inf"), -2.0])
    s3 = tensor_stats(with_nan)
    assert (s3["nan_count"], s3["inf_count"], s3["min"], s3["max"]) == (1, 1, -2.0, 1.0)
    assert s3["hist"].sum().item() == 2


@pytest.mark.slow
def test_repeated_full_captures_stay_exact():
    """Later captures keep unmodified outputs without a copy: still equal to autograd."""
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 64, 64)
    names = leaf_names(model)
    ref = reference(model, x, names)
    for _ in range(2):
        cap = capture(model, x)
        assert compare(cap, ref, names) < TOL


class Flip(nn.Module):
    """fc's output is left alone until ``inplace_next`` is set: then ReLU changes it in place."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.inplace_next = False

    def forward(self, x):
        h = self.fc(x)
        h = h.relu_() if self.inplace_next else h.relu()
        return h.sum(1, keepdim=True)


def test_output_modified_in_place_only_on_a_later_run_is_still_recorded_right():
    model = Flip()
    x = torch.randn(3, 4)
    capture(model, x)  # learns: fc's output is not modified in place
    model.inplace_next = True
    cap = capture(model, x)
    want = model.fc(x)
    assert torch.allclose(cap["fc"].calls[0].activation, want)
    assert cap["fc"].calls[0].activation.min() < 0


def test_cancel_in_backward_is_prompt_when_only_early_layers_are_selected():
    """Backward through unselected layers checks the flag too: it stops near the output."""
    reached = []

    class Mark(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            reached.append(True)
            return g

    class Spy(nn.Module):
        def forward(self, x):
            return Mark.apply(x)

    model = nn.Sequential(nn.Linear(4, 4), *[nn.Linear(4, 4) for _ in range(10)], Spy(), nn.Linear(4, 1))
    flag = threading.Event()

    def progress(stage, done, total):
        if stage == "forward" and done == total:
            flag.set()

    with pytest.raises(CaptureCancelled):
        capture(model, torch.randn(2, 4), layers=["0"], target="sum", progress=progress, cancel=flag)
    assert reached == []  # stopped at the last layer's output, before the spy's backward
    assert_no_hooks(model)


def test_module_returning_its_input_shares_one_record_value():
    model = nn.Sequential(nn.Linear(4, 4), nn.Identity(), nn.Dropout(0.5), nn.Linear(4, 2)).eval()
    cap = capture(model, torch.randn(3, 4))
    a, b, c = (cap[n].calls[0] for n in ("0", "1", "2"))
    assert b.activation is a.activation and c.activation is a.activation
    assert b.stats["activation"] is a.stats["activation"]
    assert torch.equal(a.activation, model[0](cap.input))


def test_pass_through_module_output_gradient_is_its_own_path():
    """MaxViT's MBConv: ``res = self.proj(x)`` with proj an Identity, then ``res + layers(x)``.
    The gradient at proj's output is what flows back through res, not every use of x."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Identity()
            self.layers = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

        def forward(self, x):
            res = self.proj(x)
            return res + self.layers(x)

    model = nn.Sequential(nn.Linear(4, 4), Block(), nn.Linear(4, 3))
    x = torch.randn(2, 4)
    cap, _ = check_against_reference(model, x)
    h = model[0](x)
    out = model[2](model[1](h))
    g_total = torch.autograd.grad(out.max(1).values.sum(), h)[0]
    proj = cap["1.proj"].calls[0]
    assert not torch.allclose(proj.grad_output, g_total)  # only the residual path
    assert torch.allclose(proj.grad_input, g_total)  # its input's gradient is the total


def test_view_output_modified_in_place_still_gets_its_gradient():
    """swin_v2's cpb_mlp: Linear on a (1, H, W, 2) table returns a view, then ReLU(inplace)."""
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(inplace=True), nn.Linear(8, 3), nn.Flatten(), nn.Linear(27, 2))
    x = torch.randn(1, 3, 3, 2)
    cap, _ = check_against_reference(model, x)
    assert cap["0"].calls[0].grad_output is not None
    assert cap["0"].calls[0].activation.min() < 0  # before the in-place ReLU


def test_the_garbage_collector_is_left_as_it_was():
    """Capture keeps the process's old objects out of the collector's passes while it runs
    (gc.freeze) and puts them back afterwards, also when forward fails."""
    import gc

    frozen_during = []
    model = SeedMLP()
    handle = model.register_forward_hook(lambda m, a, o: frozen_during.append(gc.get_freeze_count()))
    try:
        before = gc.get_freeze_count()
        capture(model, torch.randn(2, 10), mode="stats")
        assert frozen_during and frozen_during[-1] > before
        assert gc.get_freeze_count() == before
        with pytest.raises(CaptureError):
            capture(model, torch.randn(2, 4))
        assert gc.get_freeze_count() == before
    finally:
        handle.remove()


class TwoBranches(nn.Module):
    """``a(x) + b(x)``: the addition's backward hands the one gradient object it received
    to both branches, so the outputs of ``a`` and ``b`` get the same gradient tensor."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(6, 6)
        self.a = nn.Linear(6, 5)
        self.b = nn.Linear(6, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        h = self.stem(x)
        return self.head(self.a(h) + self.b(h))


@pytest.mark.parametrize("mode", ["stats", "full"])
def test_a_gradient_handed_to_two_hooks_is_summarised_once(mode, monkeypatch):
    import gradexplorer.stats.device as device_stats

    torch.manual_seed(3)
    model = TwoBranches()
    x = torch.randn(4, 6)
    summarised = []
    real = device_stats.tensor_stats

    def counting(t, *args, **kwargs):
        summarised.append(t)
        return real(t, *args, **kwargs)

    monkeypatch.setattr(device_stats, "tensor_stats", counting)
    import gradexplorer.stats.batched as batched_module

    real_batch = batched_module.batched_stats

    def counting_batch(tensors, *args, **kwargs):  # small tensors: summarised together
        summarised.extend(tensors)
        return real_batch(tensors, *args, **kwargs)

    monkeypatch.setattr(batched_module, "batched_stats", counting_batch)
    before = snapshot(model)
    cap = capture(model, x, mode=mode)
    assert_unchanged(model, before)
    a, b = cap["a"].calls[0], cap["b"].calls[0]
    # Ground truth: autograd on the same graph gives both branch outputs one gradient.
    h = model.stem(x)
    ya, yb = model.a(h), model.b(h)
    out = model.head(ya + yb)
    ga, gb = torch.autograd.grad(out.max(1).values.sum(), (ya, yb))
    assert torch.equal(ga, gb)
    want = tensor_stats(ga.double())
    for call in (a, b):
        for key in ("mean", "std", "min", "max", "l2", "mean_abs"):
            assert call.stats["grad_output"][key] == pytest.approx(want[key], rel=1e-6, abs=1e-9)
    assert a.stats["grad_output"] is b.stats["grad_output"]
    if mode == "full":
        assert a.grad_output is b.grad_output and torch.allclose(a.grad_output, ga)
        moved = cap.to("meta")  # a move keeps what records share shared
        assert moved["a"].calls[0].grad_output is moved["b"].calls[0].grad_output
        assert moved["a"].calls[0].grad_output.device.type == "meta"
    # Every tensor summarised once: no two summaries of the same gradient object.
    ids = [id(t) for t in summarised]
    assert len(ids) == len(set(ids))
    grads_summarised = [t for t in summarised if t.shape == ga.shape and torch.equal(t, ga)]
    assert len(grads_summarised) == 1


def test_settings_passed_whole_capture_what_the_keywords_do():
    from gradexplorer.capturing.settings import CaptureSettings, RecordSettings, ReportSettings, RunSettings

    torch.manual_seed(3)
    model = SeedMLP()
    x = torch.randn(4, 10)
    labels = torch.tensor([0, 0, 0, 0])
    names = ["fc1", "relu1", "fc2", "fc3"]
    seen = []
    settings = CaptureSettings(
        record=RecordSettings(layers=names, target="cross_entropy", labels=labels, input_grad=True),
        run=RunSettings(device="cpu"),
        report=ReportSettings(progress=lambda stage, done, total: seen.append(stage), meta={"note": "whole"}),
    )
    before = snapshot(model)
    whole = capture(model, x, settings=settings)
    assert_unchanged(model, before)
    ref = reference(model, x, names, target="cross_entropy", labels=labels, input_grad=True)
    assert compare(whole, ref, names) < TOL
    assert torch.allclose(whole.input_grad, ref["input_grad"], atol=TOL)
    assert "forward" in seen and "backward" in seen and whole.meta["note"] == "whole"
    assert whole.meta["target"] == "cross_entropy" and whole.meta["mode"] == "full"
    keywords = capture(model, x, layers=names, target="cross_entropy", labels=labels, input_grad=True, device="cpu")
    assert list(whole.layers) == list(keywords.layers) == names
    for name in names:
        a, b = whole[name].calls[0], keywords[name].calls[0]
        assert torch.equal(a.grad_output, b.grad_output) and torch.equal(a.activation, b.activation)
    # Statistics only, whole: no tensors kept, as mode="stats" does.
    stats = capture(model, x, settings=CaptureSettings(record=RecordSettings(layers=names, mode="stats")))
    assert stats.meta["mode"] == "stats" and stats["fc1"].calls[0].activation is None


def test_settings_and_keywords_together_are_refused_in_words():
    from gradexplorer.capturing.settings import CaptureSettings, RecordSettings

    model = SeedMLP()
    before = snapshot(model)
    with pytest.raises(GradExplorerError, match=r"settings= and also mode=, train=") as info:
        capture(model, torch.randn(2, 10), settings=CaptureSettings(RecordSettings(layers=["fc1"])), mode="stats",
                train=True)
    assert "not both" in info.value.fix
    # The defaults given again are no conflict.
    capture(model, torch.randn(2, 10), settings=CaptureSettings(RecordSettings(mode="stats")), mode="full")
    assert_unchanged(model, before)
    assert_no_hooks(model)


def test_records_made_by_the_hooks_are_default_ones():
    # The hooks make their records without the dataclasses' __init__ (one per module and
    # per call): the same attributes and defaults, and mutable ones of their own.
    import dataclasses

    from gradexplorer.capturing.capture import _new_call, _new_layer
    from gradexplorer.capturing.data import CallRecord, LayerRecord

    for made, default, other in ((_new_call(), CallRecord(), _new_call()),
                                 (_new_layer("Linear"), LayerRecord("Linear"), _new_layer("Linear"))):
        assert type(made) is type(default)
        assert dataclasses.asdict(made) == dataclasses.asdict(default)  # type: ignore[call-overload]
        assert vars(made) == vars(default)
        for key, value in vars(made).items():
            if isinstance(value, (dict, list)):
                assert getattr(other, key) is not value


class CallsItself(nn.Module):
    """A leaf whose call runs a second call of itself inside it: 2x, doubled again by the
    inner call (4x), plus 1 outside."""

    def forward(self, x, again=True):
        y = x * 2
        return self(y, again=False) + 1 if again else y


def test_a_module_calling_itself_gets_each_call_in_the_order_they_returned():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), CallsItself())
    x = torch.randn(2, 3)
    cap = capture(model, x, layers=["0", "1"], mode="full", target="sum")
    # The inner call (the second to start) returns first.
    assert [tuple(c) for c in cap.meta["call_order"]] == [("0", 0), ("1", 1), ("1", 0)]
    h = model[0](x)
    outer, inner = cap["1"].calls
    torch.testing.assert_close(inner.activation, h * 4)
    torch.testing.assert_close(outer.activation, h * 4 + 1)
    torch.testing.assert_close(outer.grad_output, torch.ones(2, 3))
