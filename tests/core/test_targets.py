"""Targets on outputs whose classes are not on dim 1: a sequence model's per-token logits
``(B, length, vocab)``. Gradients against autograd on a scalar written out by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.capture import capture
from gradexplorer.capturing.targets import Target, class_axis_note, parse_target, target_scalar
from tests.conftest import assert_unchanged, snapshot


class TinyLM(nn.Module):
    """Token ids -> per-token logits (B, T, vocab)."""

    def __init__(self, vocab: int = 7, width: int = 5):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.embed(ids))))


@pytest.mark.parametrize("text, want", [
    ("top1,dim=-1", Target("top1", None, None, -1)),
    ("class:3, dim = 2", Target("class", 3, None, 2)),
    ("cross_entropy,dim=-1@logits", Target("cross_entropy", None, "logits", -1)),
    ("top1,dim=1", Target("top1")),
    ("TOP1,DIM=-1", Target("top1", None, None, -1)),
])
def test_the_class_axis_is_read_and_written_back(text, want):
    got = parse_target(text)
    assert got == want
    assert parse_target(str(got)) == got  # the text form round-trips (sessions, saved meta)
    assert parse_target(got, output_key="aux").class_dim == want.class_dim


@pytest.mark.parametrize("text, says", [
    ("sum,dim=-1", "reads no classes"),
    ("top1,dim=0", "the batch"),
    ("top1,dim=last", "no class axis number"),
    ("top1,axis=-1", "unknown part"),
    ("class:-3", "class -3 is negative"),
    ("class:-3,dim=-1", "class -3 is negative"),
])
def test_a_bad_class_axis_is_named(text, says):
    with pytest.raises(GradExplorerError, match=says):
        parse_target(text)


def _by_hand(kind: str, logits: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
    """The scalar each target means on (B, T, V) logits, written without gradexplorer.capturing.targets."""
    if kind == "top1":
        return logits.max(dim=-1).values.sum()
    if kind == "class:3":
        return logits[:, :, 3].sum()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


@pytest.mark.parametrize("kind", ["top1", "class:3", "cross_entropy"])
@pytest.mark.parametrize("mode", ["full", "stats"])
def test_per_token_logits_with_classes_last_match_autograd(kind, mode):
    torch.manual_seed(0)
    model = TinyLM()
    ids = torch.randint(0, 7, (2, 11))
    labels = torch.randint(0, 7, (2, 11)) if kind == "cross_entropy" else None
    before = snapshot(model)
    cap = capture(model, ids, target=f"{kind},dim=-1", labels=labels, mode=mode)
    assert_unchanged(model, before)
    h = model.mix(model.embed(ids))
    logits = model.head(torch.tanh(h))
    g_head, g_mix = torch.autograd.grad(_by_hand(kind, logits, labels), (logits, h))
    assert cap.meta["target"] == f"{kind},dim=-1"
    head, mix = cap["head"].calls[0], cap["mix"].calls[0]
    if mode == "full":
        torch.testing.assert_close(head.grad_output, g_head)
        torch.testing.assert_close(mix.grad_output, g_mix)
    for call, g in ((head, g_head), (mix, g_mix)):
        got = call.stats["grad_output"]
        g64 = g.double()
        assert got["l2"] == pytest.approx(g64.norm().item(), rel=1e-5)
        # the accuracy contract: the mean within 1e-6 of the mean |x|
        assert got["mean"] == pytest.approx(g64.mean().item(), abs=1e-6 * g64.abs().mean().item())
    # The default axis (dim 1, the position here) is a different scalar, so a different gradient.
    default = capture(model, ids, target=kind, labels=None if kind != "cross_entropy" else labels[:, 0],
                      mode="stats") if kind != "class:3" else None
    if default is not None:
        assert default["head"].calls[0].stats["grad_output"]["l2"] != pytest.approx(
            head.stats["grad_output"]["l2"], rel=1e-3)


def test_target_scalar_on_each_axis_of_a_4d_output():
    y = torch.randn(2, 3, 4, 5)
    for dim in (1, 2, 3, -1, -2):
        moved = y.movedim(dim, 1)
        assert torch.equal(target_scalar(y, f"top1,dim={dim}"), moved.max(dim=1).values.sum())
        assert torch.equal(target_scalar(y, f"class:1,dim={dim}"), moved[:, 1].sum())


def test_an_axis_the_output_has_not_or_a_class_beyond_it_is_named():
    y = torch.randn(2, 11, 7)
    with pytest.raises(GradExplorerError, match=r"dim 3.*shape \(2, 11, 7\)"):
        target_scalar(y, "top1,dim=3")
    with pytest.raises(GradExplorerError, match="-3"):
        target_scalar(y, "top1,dim=-3")  # -3 is the batch
    with pytest.raises(GradExplorerError, match="7 outputs"):
        target_scalar(y, "class:7,dim=-1")
    with pytest.raises(GradExplorerError, match=r"labels have shape \(2, 7\).*positions \(11,\)"):
        target_scalar(y, "cross_entropy,dim=-1", torch.zeros(2, 7, dtype=torch.long))


def test_the_note_on_3d_outputs_suggests_the_axis_and_goes_once_it_is_given():
    note = class_axis_note((2, 11, 7), "top1")
    assert note is not None and "--target top1,dim=-1" in note
    assert "--target class:4,dim=-1@logits" in class_axis_note((2, 11, 7), "class:4@logits")
    assert class_axis_note((2, 11, 7), "top1,dim=-1") is None
    assert class_axis_note((2, 11, 7), "sum") is None
    assert class_axis_note((2, 7), "top1") is None
