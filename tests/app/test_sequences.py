"""Sequences are not pictures: token models get tokens × channels heatmaps, a per-token
saliency chart, and no Grad-CAM (with the reason said)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradexplorer.analysis.capture_summary import default_layer
from gradexplorer.capturing.capture import capture
from gradexplorer_app.views.capture_views import CaptureViews


class TokenModel(nn.Module):
    """Token ids (B, 10) -> embedding (B, 10, 32) -> mixer -> mean over tokens -> 4 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        self.mix = nn.Linear(32, 32)
        self.act = nn.GELU()
        self.head = nn.Linear(32, 4)

    def forward(self, ids):
        return self.head(self.act(self.mix(self.embed(ids))).mean(1))


class FeatureModel(nn.Module):
    """Feature sequences (B, 10, 32), the shape of the "3×3 grid" bug (10 = 1 + 3²)."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Linear(32, 32)
        self.act = nn.GELU()
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.act(self.mix(x)).mean(1))


def _top1_grad(model, x):
    """Ground truth: d(top-1 logit of each sample)/d x by autograd, independent of hooks."""
    x = x.clone().requires_grad_(True)
    out = model(x)
    target = out.gather(1, out.argmax(1, keepdim=True)).sum()
    return torch.autograd.grad(target, x)[0]


@pytest.fixture
def features():
    torch.manual_seed(0)
    model = FeatureModel().eval()
    x = torch.randn(2, 10, 32)
    return model, x, capture(model, x, input_grad=True)


@pytest.fixture
def tokens():
    torch.manual_seed(0)
    model = TokenModel().eval()
    ids = torch.randint(0, 50, (2, 10))
    return model, ids, capture(model, ids)


def _views(qtbot, cap) -> CaptureViews:
    w = CaptureViews()
    qtbot.addWidget(w)
    w.resize(900, 700)
    w.show()
    w.set_capture(cap, None)
    return w


def test_a_sequence_opens_on_its_first_layer_not_a_grid(features):
    _, _, cap = features
    assert default_layer(cap) == ("mix", 0)


def test_feature_sequence_heatmap_is_tokens_by_channels(qtbot, features):
    _, _, cap = features
    w = _views(qtbot, cap)
    w.set_layer("act")
    w.set_sample(1)
    w.show_view("Heatmap")
    image = w.current_image_array()
    np.testing.assert_array_equal(image, cap["act"].calls[0].grad_output[1].numpy())
    assert "10 tokens × 32 channels" in w.heatmap_view.layout_label.text()


def test_grad_cam_says_why_a_sequence_has_none(qtbot, features):
    _, _, cap = features
    w = _views(qtbot, cap)
    w.set_layer("act")
    w.show_view("Grad-CAM")
    message = w.gradcam_view.message()
    assert "sequence, not a picture" in message and "(B, 10, 32)" in message
    assert w.gradcam_view.current_cam() is None


def test_feature_sequence_saliency_is_a_bar_per_token(qtbot, features):
    model, x, cap = features
    w = _views(qtbot, cap)
    w.set_sample(1)
    w.show_view("Saliency")
    bars = w.saliency_view.current_map()[0]
    truth = _top1_grad(model, x)[1].double().norm(dim=-1).numpy()
    np.testing.assert_allclose(bars, truth, rtol=1e-5, atol=1e-12)
    assert w.saliency_view.token_widget.isVisibleTo(w.saliency_view)
    assert "input shape (2, 10, 32)" in w.saliency_view.info_label.text()


def test_token_ids_saliency_comes_from_the_embedding_gradient(qtbot, tokens):
    model, ids, cap = tokens
    w = _views(qtbot, cap)
    w.show_view("Saliency")
    bars = w.saliency_view.current_map()[0]
    # Ground truth: the gradient with respect to the embedding's output, by autograd.
    emb = model.embed(ids).detach().requires_grad_(True)
    out = model.head(model.act(model.mix(emb)).mean(1))
    g = torch.autograd.grad(out.gather(1, out.argmax(1, keepdim=True)).sum(), emb)[0]
    np.testing.assert_allclose(bars, g[0].double().norm(dim=-1).numpy(), rtol=1e-5, atol=1e-12)
    assert "'embed'" in w.saliency_view.info_label.text()


def test_stats_only_sequence_saliency_says_so(qtbot):
    torch.manual_seed(0)
    cap = capture(FeatureModel().eval(), torch.randn(2, 10, 32), mode="stats", input_grad=True)
    w = _views(qtbot, cap)
    w.show_view("Saliency")
    assert "Statistics-only" in w.saliency_view.message()
