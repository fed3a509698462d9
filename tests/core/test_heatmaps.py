"""gradexplorer.analysis.heatmaps: pictures of captured tensors; ground truth from the tensors themselves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradexplorer.analysis.heatmaps import (
    describe_layout,
    display_image,
    grad_x_activation,
    heatmap,
    is_signed,
    layout_of,
    saliency_map,
    symmetric_levels,
)
from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.capture import capture


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 12, 3, padding=1, stride=2)
        self.relu2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(12, 5)

    def forward(self, x):
        x = self.relu2(self.conv2(self.relu1(self.conv1(x))))
        return self.fc(self.pool(x).flatten(1))


@pytest.fixture(scope="module")
def cnn_capture():
    torch.manual_seed(0)
    model = TinyCNN().eval()
    return capture(model, torch.randn(2, 3, 16, 12), input_grad=True)


# -- layouts ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "shape, kind, source, hw, cls",
    [
        ((), "scalar", "scalar", (1, 1), False),
        ((10,), "vector", "vector", (3, 4), False),
        ((16,), "vector", "vector", (4, 4), False),
        ((64, 7, 5), "spatial", "conv", (7, 5), False),
        ((197, 768), "spatial", "tokens", (14, 14), True),
        ((196, 32), "spatial", "tokens", (14, 14), False),
        ((50, 8), "spatial", "tokens", (7, 7), True),
        ((12, 8), "matrix", "tokens", (12, 8), False),
        ((4, 3, 6, 5), "spatial", "video", (6, 5), False),
        ((2, 3, 4, 6, 5), "spatial", "folded", (6, 5), False),
    ],
)
def test_layout_of(shape, kind, source, hw, cls):
    lay = layout_of(shape)
    assert (lay.kind, lay.source, (lay.height, lay.width), lay.class_token) == (kind, source, hw, cls)


def test_describe_layout():
    assert describe_layout((2, 64, 16, 16)) == "conv map (B, 64, 16, 16): 64 channels of 16×16"
    assert "class token + 14×14 grid, 768 channels" in describe_layout((1, 197, 768))
    assert "not a square grid" in describe_layout((1, 12, 8))
    assert "10 values" in describe_layout((3, 10))
    assert "video" in describe_layout((1, 4, 3, 6, 5))
    assert describe_layout((64, 7, 7), batched=False).startswith("conv map (64, 7, 7)")


# -- conv maps from a real capture --------------------------------------------------------

def test_single_channel_is_the_tensor_slice(cnn_capture):
    g = cnn_capture["conv2"].calls[0].grad_output
    for s in range(2):
        hm = heatmap(g[s], "channel", channel=5)
        assert hm.array.shape == tuple(g.shape[2:])
        np.testing.assert_array_equal(hm.array, g[s, 5].numpy())
        assert hm.channels == [5]
        assert hm.locate(1, 2) == (5, 1, 2, None)


def test_topk_grid_ranks_by_gradient_norm(cnn_capture):
    call = cnn_capture["conv1"].calls[0]
    a, g = call.activation[1], call.grad_output[1]
    k = 5
    hm = heatmap(a, "topk", k=k, rank_by=g)
    expected = torch.topk(g.flatten(1).norm(dim=1), k).indices.tolist()
    assert hm.channels == expected
    h, w = a.shape[1:]
    assert (hm.tile_rows, hm.tile_cols) == (2, 3)
    assert hm.array.shape == (2 * (h + 1) - 1, 3 * (w + 1) - 1)
    # Tiles hold the activations of the ranked channels, row by row, separated by NaN.
    for i, c in enumerate(expected):
        r, col = divmod(i, 3)
        tile = hm.array[r * (h + 1) : r * (h + 1) + h, col * (w + 1) : col * (w + 1) + w]
        np.testing.assert_array_equal(tile, a[c].numpy())
    assert np.isnan(hm.array[h, :]).all() and np.isnan(hm.array[:, w]).all()
    # The sixth cell of the 2x3 grid is empty.
    assert np.isnan(hm.array[h + 1 :, 2 * (w + 1) :]).all()
    assert hm.locate(h, 0) is None
    assert hm.locate(h + 1 + 2, w + 1 + 3) == (expected[4], 2, 3, None)
    assert hm.locate(h + 1, 2 * (w + 1)) is None


def test_topk_ranks_by_the_tensor_itself_by_default_and_caps_k():
    t = torch.zeros(4, 3, 3)
    t[2] = 5.0
    t[0] = -1.0
    hm = heatmap(t, "topk", k=99)
    assert hm.channels[:2] == [2, 0] and len(hm.channels) == 4


@pytest.mark.parametrize("how", ["mean", "mean_abs", "l2"])
def test_reduce(cnn_capture, how):
    g = cnn_capture["conv2"].calls[0].grad_output[0]
    expected = {"mean": g.mean(0), "mean_abs": g.abs().mean(0), "l2": g.norm(dim=0)}[how]
    hm = heatmap(g, "reduce", reduce=how)
    np.testing.assert_allclose(hm.array, expected.numpy(), rtol=1e-5, atol=1e-12)
    assert hm.channels == [] and hm.locate(0, 0) == (None, 0, 0, None)


def test_bad_channel_and_display():
    t = torch.randn(3, 4, 4)
    with pytest.raises(GradExplorerError):
        heatmap(t, "channel", channel=3)
    with pytest.raises(GradExplorerError):
        heatmap(t, "sideways")
    with pytest.raises(GradExplorerError):
        heatmap(t, "reduce", reduce="median")
    with pytest.raises(GradExplorerError):
        heatmap(t, "topk", rank_by=torch.randn(2, 4, 4))


# -- tokens, vectors, video -------------------------------------------------------------------

def test_vit_tokens_with_class_token_form_14x14():
    t = torch.randn(1 + 196, 6)
    hm = heatmap(t, "channel", channel=4)
    assert hm.array.shape == (14, 14)
    np.testing.assert_array_equal(hm.array, t[1:, 4].reshape(14, 14).numpy())
    hm = heatmap(t, "reduce", reduce="mean")
    np.testing.assert_allclose(hm.array, t[1:].mean(1).reshape(14, 14).numpy(), rtol=1e-5, atol=1e-7)


def test_square_tokens_without_class_token():
    t = torch.randn(196, 3)
    hm = heatmap(t, "channel", channel=1)
    np.testing.assert_array_equal(hm.array, t[:, 1].reshape(14, 14).numpy())


def test_non_square_tokens_show_the_matrix():
    t = torch.randn(12, 8)
    hm = heatmap(t, "topk")  # display does not apply
    assert hm.display == "all"
    np.testing.assert_array_equal(hm.array, t.numpy())


def test_vector_wraps_into_a_near_square_grid():
    t = torch.arange(10, dtype=torch.float32)
    hm = heatmap(t)
    assert hm.array.shape == (3, 4)
    np.testing.assert_array_equal(hm.array.reshape(-1)[:10], t.numpy())
    assert np.isnan(hm.array.reshape(-1)[10:]).all()
    assert hm.locate(2, 1) == (None, 2, 1, 9)
    assert hm.locate(2, 2) is None


def test_scalar():
    hm = heatmap(torch.tensor(3.5))
    assert hm.array.shape == (1, 1) and hm.array[0, 0] == 3.5


def test_video_time_index_and_mean():
    t = torch.randn(3, 4, 5, 6)
    np.testing.assert_array_equal(heatmap(t, channel=2, time_index=1).array, t[2, 1].numpy())
    np.testing.assert_allclose(heatmap(t, channel=2).array, t[2].mean(0).numpy(), rtol=1e-5, atol=1e-7)
    with pytest.raises(GradExplorerError):
        heatmap(t, time_index=4)


def test_half_precision_is_shown_in_float32():
    t = torch.randn(2, 3, 3).to(torch.bfloat16)
    hm = heatmap(t, channel=1)
    assert hm.array.dtype == np.float32
    np.testing.assert_array_equal(hm.array, t[1].float().numpy())


# -- gradient x activation, levels ------------------------------------------------------------

def test_grad_x_activation(cnn_capture):
    call = cnn_capture["conv2"].calls[0]
    prod = grad_x_activation(call.activation, call.grad_output)
    torch.testing.assert_close(prod, call.activation * call.grad_output)
    assert grad_x_activation(call.activation, None) is None
    with pytest.raises(GradExplorerError):
        grad_x_activation(torch.zeros(2, 3), torch.zeros(3, 2))


def test_symmetric_levels():
    assert symmetric_levels(np.array([-1.0, 3.0])) == (-3.0, 3.0)
    assert symmetric_levels(np.array([0.5, 3.0])) == (0.0, 3.0)
    assert symmetric_levels(np.array([0.5, 3.0]), signed=True) == (-3.0, 3.0)
    assert symmetric_levels(np.array([np.nan, -2.0, np.inf, 1.0])) == (-2.0, 2.0)
    assert symmetric_levels(np.zeros(4)) == (0.0, 1.0)
    assert symmetric_levels(np.zeros(4), signed=True) == (-1.0, 1.0)
    assert symmetric_levels(np.full(3, np.nan)) == (0.0, 1.0)
    assert symmetric_levels(torch.tensor([-4.0, 1.0])) == (-4.0, 4.0)


def test_is_signed():
    assert is_signed(np.array([0.0, -1e-9]))
    assert not is_signed(np.array([0.0, 2.0, np.nan]))
    assert not is_signed(np.array([np.nan]))


def test_gradient_levels_are_symmetric(cnn_capture):
    g = cnn_capture["conv2"].calls[0].grad_output[0]
    lo, hi = symmetric_levels(heatmap(g, channel=0).array)
    assert lo == -hi and hi == pytest.approx(float(g[0].abs().max()))


# -- input pictures and saliency ------------------------------------------------------------------

def test_display_image_inverts_per_channel_normalisation():
    pic = torch.rand(3, 8, 9)
    pic[:, 0, 0] = 0.0
    pic[:, 0, 1] = 1.0
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    x = (pic - mean[:, None, None]) / std[:, None, None]
    rgb = display_image(x)
    assert rgb.shape == (8, 9, 3) and rgb.dtype == np.uint8
    np.testing.assert_allclose(rgb, (pic.permute(1, 2, 0).numpy() * 255).round(), atol=1)
    assert display_image(torch.randn(1, 5, 5)).shape == (5, 5, 3)
    assert display_image(torch.randn(10)) is None


def test_saliency_map(cnn_capture):
    g = cnn_capture.input_grad
    sal = saliency_map(g[1])
    assert sal.shape == tuple(g.shape[2:])
    np.testing.assert_array_equal(sal, g[1].abs().amax(0).numpy())
    assert saliency_map(torch.tensor([-1.0, 2.0, -3.0])).reshape(-1)[:3].tolist() == [1.0, 2.0, 3.0]
    np.testing.assert_array_equal(saliency_map(-torch.ones(4, 6)), np.ones((4, 6), np.float32))


def test_the_top_k_grid_fits_the_plots_shape():
    """16 tiles of 32×32 cells: a square grid (4 × 4) in a square plot, 8 × 2 in a plot four
    times as wide as tall (the square grid would cover a quarter of it), one column in a
    tall one; and the grid ``heatmap`` draws has that many columns."""
    from gradexplorer.analysis.heatmaps import grid_columns, heatmap

    assert grid_columns(16, (32, 32), 1.0) == 4
    assert grid_columns(16, (32, 32), 4.0) == 8
    assert grid_columns(16, (32, 32), 0.05) == 1
    assert grid_columns(16, (32, 32), float("nan")) == 4
    hm = heatmap(torch.randn(20, 32, 32), "topk", k=16, columns=8)
    assert (hm.tile_rows, hm.tile_cols) == (2, 8) and hm.array.shape == (2 * 33 - 1, 8 * 33 - 1)
