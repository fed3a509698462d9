"""A ``.pt`` input stored as a dict: the tensors beside the input are the forward's keyword
arguments (a MultiheadAttention model's ``key_padding_mask``), passed by name and never
dropped; a name the forward does not take is refused in words."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradexplorer as gx
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.batches import load_batch
from gradexplorer.models.loaded_model import LoadedModel


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
