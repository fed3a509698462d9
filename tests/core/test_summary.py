"""gradexplorer.analysis.capture_summary: the call that stands for a block, the seed layer and the
reasons behind zero gradients, on real captures."""

from __future__ import annotations

import torch
from torch import nn

from gradexplorer.analysis.capture_summary import block_call
from gradexplorer.capturing.capture import capture


class Block(nn.Module):
    """A residual block whose ReLU is called twice (as ResNet's BasicBlock): registered
    before conv2, so the order of first calls puts it before conv2."""

    def __init__(self) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Linear(6, 6)
        self.conv2 = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.relu(self.conv1(x)))
        return self.relu(y + x)


def test_a_block_stands_for_the_last_call_inside_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), Block(), nn.Linear(6, 3)).eval()
    cap = capture(model, torch.randn(2, 4), layers=["1.*"])
    assert cap.layer_order == ["1.conv1", "1.relu", "1.conv2"]  # first calls: relu before conv2
    assert block_call(cap, "1") == ("1.relu", 1)  # yet its second call returns last
    assert block_call(cap, "") == ("1.relu", 1)  # the model itself, through what it holds
    assert block_call(cap, "1.conv2") is None  # captured itself
    assert block_call(cap, "2") is None  # nothing captured inside
    # Without the call order (an older file): the last call of the last layer inside.
    cap.meta.pop("call_order")
    assert block_call(cap, "1") == ("1.conv2", 0)


def test_the_targets_seed_is_not_flagged_exploding():
    """The logits layer's output gradient is the target's seed (a one-hot for top1), a
    thousand times and more above the gradients passed back through small random weights:
    it is not judged against its neighbours, and its note says why."""
    from gradexplorer.analysis.capture_summary import summarize
    from gradexplorer.analysis.gradient_flow import neighbour_flags, seed_calls

    torch.manual_seed(0)
    layers = [nn.Linear(32, 32) for _ in range(4)] + [nn.Linear(32, 10)]
    with torch.no_grad():
        for layer in layers:
            layer.weight.mul_(1e-3)
    model = nn.Sequential(*layers).eval()
    cap = capture(model, torch.randn(3, 32))
    assert seed_calls(cap) == {("4", 0)}
    # The rule alone would flag it: its RMS against its neighbours'.
    rms = [float(cap[n].calls[0].grad_output.pow(2).mean().sqrt()) for n in cap.layer_order]
    assert neighbour_flags(rms)[-1] == "exploding"
    summary = summarize(cap)
    assert summary.flags["4"] == [] and "exploding" not in summary.flagged().get("4", "")
    assert "target's seed" in summary.notes["4"]
    # Statistics only: told by the output's statistics.
    stats = capture(model, torch.randn(3, 32), mode="stats")
    assert seed_calls(stats) == {("4", 0)} and summarize(stats).flags["4"] == []


def test_zero_gradients_name_the_layer_whose_weights_are_zero():
    """A torchvision ViT with random weights starts with heads.head at zero: every gradient
    before it is zero. The summary names heads.head and why, and autograd agrees: its
    output gradient is not zero, its input's is."""
    from torchvision.models.vision_transformer import VisionTransformer

    from gradexplorer.analysis.capture_summary import summarize

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=16,
                            mlp_dim=32).eval()
    x = torch.randn(2, 3, 32, 32)
    kept = {}
    handle = vit.heads.head.register_forward_hook(lambda m, a, out: kept.update(x=a[0], y=out))
    logits = vit(x)
    handle.remove()
    target = logits.gather(1, logits.argmax(1, keepdim=True)).sum()
    g_in, g_out = torch.autograd.grad(target, [kept["x"], kept["y"]])
    assert g_out.abs().sum() > 0 and g_in.abs().sum() == 0  # the truth
    for mode in ("full", "stats"):
        summary = summarize(capture(vit, x, mode=mode))
        stop = summary.stop
        assert stop is not None and (stop.layer, stop.type) == ("heads.head", "Linear")
        assert "weights and bias are zero" in stop.reason and "heads.head" in stop.sentence()
        assert "conv_proj" in stop.below and summary.flags["conv_proj"] == ["zero"]
        assert "stops at heads.head" in summary.notes["conv_proj"]


def test_a_dead_relu_is_named_where_the_gradient_stops():
    torch.manual_seed(0)
    first = nn.Linear(8, 8)
    with torch.no_grad():
        first.bias.fill_(-100.0)  # every input of the ReLU below zero
    model = nn.Sequential(nn.Linear(8, 8), first, nn.ReLU(), nn.Linear(8, 3)).eval()
    from gradexplorer.analysis.capture_summary import summarize

    stop = summarize(capture(model, torch.randn(4, 8))).stop
    assert stop is not None and stop.layer == "2" and "dead ReLU" in stop.reason
    assert stop.below == ("0", "1")
