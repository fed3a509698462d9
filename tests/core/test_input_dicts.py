"""A ``.pt`` input stored as a dict: every entry beside the input (a MultiheadAttention model's
``key_padding_mask``, a plain ``scale=3.0``, entries beside a tuple of inputs) is the forward's
keyword argument, passed by name and never dropped; an entry that cannot be one (a name the
forward does not take, a key that is not a Python name) is refused in words naming it."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import gradexplorer as gx
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.batches import load_batch
from gradexplorer.models.loaded_model import LoadedModel
from tests.ground_truth import assert_param_grads_equal, param_grads_by_autograd


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        y, _ = self.mha(x, x, x, key_padding_mask=key_padding_mask)
        return self.head(y.mean(1))


def saved(tmp_path, **entries) -> str:
    path = tmp_path / "batch.pt"
    torch.save(entries, path)
    return str(path)


def test_the_padding_mask_beside_the_input_reaches_the_forward(tmp_path):
    model = Attention().eval()
    x = torch.randn(2, 5, 8)
    mask = torch.tensor([[False, False, False, True, True], [False] * 5])
    loaded = LoadedModel(model, "attention", "attention")
    batch = load_batch([saved(tmp_path, input=x, key_padding_mask=mask)], loaded)
    assert batch.inputs is not None and torch.equal(batch.inputs.kwargs["key_padding_mask"], mask)
    cap = gx.capture(model, batch.model_input, layers=["head"], target="sum")
    # the truth: autograd on the model called with its mask
    xx = x.clone()
    out = model(xx, key_padding_mask=mask)
    (want,) = torch.autograd.grad(out.sum(), [model.head.weight])
    assert torch.allclose(cap["head"].param_grads["weight"], want, rtol=1e-6, atol=1e-7)
    without = model(x)  # what dropping the mask gave: another output
    assert not torch.allclose(cap["head"].calls[0].activation, without, atol=1e-4)


def test_a_name_the_forward_does_not_take_is_refused(tmp_path):
    loaded = LoadedModel(Attention(), "attention", "attention")
    with pytest.raises(GradExplorerError, match="padding_msk"):
        load_batch([saved(tmp_path, input=torch.randn(2, 5, 8), padding_msk=torch.zeros(2, 5, dtype=torch.bool))],
                   loaded)


def _loss_grads(model: nn.Module, kwargs: dict) -> dict[str, torch.Tensor]:
    """The truth: autograd of the model's own loss, the labels passed to its forward."""
    return param_grads_by_autograd(model, model(**kwargs).loss)


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_labels_reach_a_forward_that_takes_them(tmp_path, kind):
    """A Hugging Face model's forward takes ``labels`` (one class per sample for a
    classifier, one token per position for a language model): stored beside the ids they
    are passed to it, and the model's own loss can be the target."""
    pytest.importorskip("transformers")
    from gradexplorer.models import load_model
    from tests import hf_tiny

    folder = hf_tiny.save(kind, tmp_path / kind)
    loaded = load_model(f"hf:{folder}")
    ids = torch.tensor([[4, 5, 6, 7], [8, 9, 10, 11]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    labels = torch.tensor([2, 0]) if kind == "bert" else torch.where(mask.bool(), ids, torch.full_like(ids, -100))
    batch = load_batch([saved(tmp_path, input_ids=ids, attention_mask=mask, labels=labels)], loaded)
    assert batch.inputs is not None and torch.equal(batch.inputs.kwargs["labels"], labels)
    assert "labels" in batch.source
    # one class per sample: also the batch's labels (a cross_entropy target reads them)
    assert (batch.labels is not None and batch.labels.tolist() == [2, 0]) if kind == "bert" else batch.labels is None
    model = loaded.module
    cap = gx.capture(model, batch.model_input, target="sum@loss")
    truth = _loss_grads(model, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    assert assert_param_grads_equal(cap, truth, rtol=1e-5, atol=1e-7) >= 10
    # the default target still reads the logits, not the loss the labels added first
    logits = gx.capture(model, batch.model_input, layers=["*.dropout"], mode="stats").output
    assert logits.shape[0] == 2 and logits.dim() == (2 if kind == "bert" else 3)


def test_labels_stay_out_of_a_forward_that_does_not_take_them(tmp_path):
    model = Attention().eval()
    x = torch.randn(2, 5, 8)
    loaded = LoadedModel(model, "attention", "attention")
    batch = load_batch([saved(tmp_path, input=x, labels=torch.tensor([1, 2]))], loaded)
    assert batch.inputs is None or "labels" not in batch.inputs.kwargs
    assert batch.labels.tolist() == [1, 2]


# ---------------------------------------------------------------------------
# Every entry of the dict reaches the forward or is refused by name: plain values
# (scale=3.0), entries beside a tuple of inputs, keys that are not Python names.
# ---------------------------------------------------------------------------

CROSS_SOURCE = '''
import torch
from torch import nn


class CrossAttention(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, query, memory, key_padding_mask=None, scale=1.0):
        y, _ = self.mha(query, memory, memory, key_padding_mask=key_padding_mask)
        return self.head(y.mean(1)) * scale


def build():
    return CrossAttention().eval()
'''


def _cross(tmp_path):
    """The factory file and the same model built from it (the ground truth's model)."""
    import importlib.util

    nets = tmp_path / "cross.py"
    nets.write_text(CROSS_SOURCE)
    spec = importlib.util.spec_from_file_location("cross_nets_for_truth", nets)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return nets, module.build()


def _cross_batch():
    g = torch.Generator().manual_seed(1)
    q, mem = torch.randn(2, 4, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    mask = torch.tensor([[False, False, False, True, True], [False] * 5])
    return q, mem, mask


def _truth(model, q, mem, **kwargs) -> dict[str, torch.Tensor]:
    """autograd on the model called with every stored argument, target the outputs' sum"""
    q = q.clone().requires_grad_(True)
    out = model(q, mem, **kwargs)
    named = dict(model.head.named_parameters())
    grads = torch.autograd.grad(out.sum(), [named["weight"], named["bias"], q])
    return {"weight": grads[0], "bias": grads[1], "input": grads[2]}


SHAPES = {
    # what is stored, and the keyword arguments the forward must receive
    "plain value beside the tuple": lambda q, mem, mask: ({"inputs": (q, mem), "scale": 3.0}, {"scale": 3.0}),
    "tensor and value beside a list": lambda q, mem, mask: (
        {"input": [q, mem], "key_padding_mask": mask, "scale": -2.0},
        {"key_padding_mask": mask, "scale": -2.0}),
    "named entries, a value among them": lambda q, mem, mask: (
        {"query": q, "memory": mem, "key_padding_mask": mask, "scale": 0.5},
        {"key_padding_mask": mask, "scale": 0.5}),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_entry_reaches_the_forward_in_the_library(tmp_path, shape):
    nets, model = _cross(tmp_path)
    q, mem, mask = _cross_batch()
    stored, want_kwargs = SHAPES[shape](q, mem, mask)
    loaded = LoadedModel(model, "cross", "cross")
    batch = load_batch([saved(tmp_path, **stored)], loaded)
    assert batch.inputs is not None
    for name, value in want_kwargs.items():
        got = batch.inputs.kwargs[name]
        assert torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value
    cap = gx.capture(model, batch.model_input, layers=["head"], target="sum", input_grad=True)
    want = _truth(model, q, mem, **want_kwargs)
    torch.testing.assert_close(cap["head"].param_grads["weight"], want["weight"], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(cap["head"].param_grads["bias"], want["bias"], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(cap.input_grad, want["input"], rtol=1e-6, atol=1e-7)
    # what dropping the extras gave: other gradients
    dropped = _truth(model, q, mem)
    assert not torch.allclose(want["weight"], dropped["weight"], atol=1e-4)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_entry_reaches_the_forward_from_the_command_line(tmp_path, capsys, shape):
    from gradexplorer_app.cli.main import main

    nets, model = _cross(tmp_path)
    q, mem, mask = _cross_batch()
    stored, want_kwargs = SHAPES[shape](q, mem, mask)
    out = tmp_path / "cap.pt"
    code = main(["capture", "--model", f"{nets}:build", "--trust", "--input", saved(tmp_path, **stored),
                 "--layers", "head", "--target", "sum", "--out", str(out), "-q"])
    assert code == 0, capsys.readouterr().err
    cap = gx.load_capture(out)
    want = _truth(model, q, mem, **want_kwargs)
    torch.testing.assert_close(cap["head"].param_grads["weight"], want["weight"], rtol=1e-6, atol=1e-7)
    assert cap.model_inputs is not None
    assert {k: v for k, v in cap.model_inputs["kwargs"].items() if not isinstance(v, torch.Tensor)} == {
        k: v for k, v in want_kwargs.items() if not isinstance(v, torch.Tensor)}


REFUSED = {
    # what is stored, and what the one-line refusal must name
    "a key that is not a Python name": lambda q, mem, mask: ({"inputs": (q, mem), "key-mask": mask}, "'key-mask'"),
    "such a key among named entries": lambda q, mem, mask: (
        {"query": q, "memory": mem, "key-mask": mask}, "'key-mask'"),
    "a value the forward does not take": lambda q, mem, mask: (
        {"input": [q, mem], "temperature": 3.0}, "temperature"),
    "tensors inside a list": lambda q, mem, mask: ({"input": [q, mem], "key_padding_mask": [mask]},
                                                   "'key_padding_mask'"),
}


@pytest.mark.parametrize("shape", list(REFUSED))
def test_an_entry_that_cannot_reach_the_forward_is_refused_by_name(tmp_path, capsys, shape):
    from gradexplorer_app.cli.main import main

    nets, model = _cross(tmp_path)
    stored, needle = REFUSED[shape](*_cross_batch())
    path = saved(tmp_path, **stored)
    with pytest.raises(GradExplorerError, match=re.escape(needle)):
        load_batch([path], LoadedModel(model, "cross", "cross"))
    out = tmp_path / "cap.pt"
    code = main(["capture", "--model", f"{nets}:build", "--trust", "--input", path,
                 "--target", "sum", "--out", str(out), "-q"])
    err = capsys.readouterr().err
    assert code != 0 and not out.exists()
    assert err.startswith("error: ") and needle in err and "Traceback" not in err, err
