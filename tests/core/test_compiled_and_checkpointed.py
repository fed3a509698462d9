"""Models under torch.compile and models with activation checkpointing: every call counted
once, every number equal to plain autograd's on the same model."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.capture import capture
from tests.conftest import assert_no_hooks


def small_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_a_compiled_model_that_has_run_is_captured_through_its_eager_module():
    net = small_net()
    compiled = torch.compile(net, backend="eager")
    x = torch.randn(3, 8)
    compiled(x)  # after a run, hooks added to the compiled model never fire
    cap = capture(compiled, x, target="top1")
    assert {name: len(rec.calls) for name, rec in cap.layers.items()} == {"0": 1, "1": 1, "2": 1}
    assert_no_hooks(net)
    # The compiled capture itself against autograd on the eager graph: each layer's output
    # and its gradient, and every parameter's gradient, of the top logit's sum.
    h = net[0](x)
    a = net[1](h)
    out = net[2](a)
    scalar = out.max(dim=-1).values.sum()
    params = {f"{layer}.{p}": t for layer in ("0", "2") for p, t in net[int(layer)].named_parameters()}
    grads = torch.autograd.grad(scalar, [h, a, out, *params.values()])
    for layer, value, grad in zip(("0", "1", "2"), (h, a, out), grads[:3]):
        (call,) = cap[layer].calls
        torch.testing.assert_close(call.activation, value.detach(), rtol=0, atol=0)
        torch.testing.assert_close(call.grad_output, grad, rtol=1e-6, atol=1e-7)
    got = {f"{layer}.{p}": g for layer, rec in cap.layers.items() for p, g in rec.param_grads.items()}
    assert set(got) == set(params)
    for name, grad in zip(params, grads[3:]):
        torch.testing.assert_close(got[name], grad, rtol=1e-6, atol=1e-7)
    # The wrapper's names are understood too.
    assert list(capture(compiled, x, layers=["_orig_mod.2"]).layers) == ["2"]


def test_layers_inside_a_compiled_submodule_are_refused_in_words():
    net = small_net()
    net[2] = torch.compile(net[2], backend="eager")
    x = torch.randn(3, 8)
    net(x)
    with pytest.raises(GradExplorerError, match=r"torch\.compile"):
        capture(net, x, layers=["0", "2._orig_mod"])
    assert_no_hooks(net)
    assert len(capture(net, x, layers=["0"])["0"].calls) == 1


class Checkpointed(nn.Module):
    """Two checkpointed blocks (four module calls inside them) and a head."""

    def __init__(self, mode: str | None = "non-reentrant"):
        super().__init__()
        torch.manual_seed(0)
        self.mode = mode
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        for block in self.blocks:
            if self.mode is None:
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=self.mode == "reentrant")
        return self.head(x)


def test_checkpointing_recomputation_is_not_counted_and_gradients_are_exact():
    from tests.ground_truth import compare, reference

    x = torch.randn(4, 8)
    model = Checkpointed()
    cap = capture(model, x, input_grad=True)
    assert {name: len(rec.calls) for name, rec in cap.layers.items()} == dict.fromkeys(
        ["blocks.0.0", "blocks.0.1", "blocks.1.0", "blocks.1.1", "head"], 1)
    assert_no_hooks(model)
    # The truth: the same weights without checkpointing, by plain autograd.
    plain = Checkpointed(mode=None)
    names = list(cap.layers)
    assert compare(cap, reference(plain, x, names, input_grad=True), names) < 1e-6


def test_reentrant_checkpointing_is_refused_in_words_that_name_it():
    model = Checkpointed(mode="reentrant")
    with pytest.raises(GradExplorerError, match="use_reentrant=True") as info:
        capture(model, torch.randn(4, 8))
    assert "use_reentrant=False" in info.value.fix
    assert_no_hooks(model)


def test_a_watch_counts_no_recomputed_calls():
    from gradexplorer.recording.layer_recorder import LayerRecorder

    model = Checkpointed()
    with LayerRecorder(model, ["blocks.0.0", "head"]) as recorder:
        model(torch.randn(4, 8)).sum().backward()
    assert recorder.calls == {"blocks.0.0": 1, "head": 1}


def test_hugging_face_gradient_checkpointing_counts_each_call_once():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    model.gradient_checkpointing_enable()
    ids = torch.randint(0, 50, (2, 6))

    def hooks():  # Hugging Face's own hook (inputs that require grad) stays
        return {n: (len(m._forward_hooks), len(m._forward_pre_hooks)) for n, m in model.named_modules()}

    before = hooks()
    cap = capture(model, ids, layers=["transformer.h.*"], target="sum@logits", train=True)
    assert hooks() == before
    model.gradient_checkpointing_disable()
    plain = capture(model, ids, layers=["transformer.h.*"], target="sum@logits", train=True)
    counts = {name: len(rec.calls) for name, rec in cap.layers.items()}
    assert counts == {name: len(rec.calls) for name, rec in plain.layers.items()}
    assert counts["transformer.h.0.attn.c_attn"] == 1 and counts["transformer.h.1.mlp"] == 1
    from tests.ground_truth import compare, reference

    names = list(cap.layers)
    assert compare(cap, reference(model, ids, names, target="sum@logits", train=True), names) < 1e-5


@pytest.mark.slow
def test_a_capture_of_a_model_nobody_compiled_does_not_import_dynamo():
    """Looking for torch.compile's wrapper must not import dynamo (and with it sympy and
    Triton, about 200 MiB of the window's first run): in a fresh interpreter, a capture and
    the window's own checks leave torch._dynamo unimported; a compiled model imports it."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from gradexplorer.capturing.capture import capture\n"
        "from gradexplorer.capturing.compiled import compiled_modules, refuse_compiled_layers\n"
        "net = torch.nn.Sequential(torch.nn.Linear(3, 2))\n"
        "capture(net, torch.randn(2, 3))\n"
        "assert compiled_modules(net) == []\n"
        "refuse_compiled_layers(net, ['0'])\n"
        "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))\n"
        "compiled = torch.compile(net, backend='eager')\n"
        "print(compiled_modules(compiled))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["[]", "['']"]
