"""Grad-CAM against hand computations, on conv and ViT token layouts, and overlays."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from gradexplorer.analysis.gradcam import cam_supported, grad_cam, overlay, turbo
from gradexplorer.base.errors import GradExplorerError


def _tiny():
    activation = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]],
                                [[0.0, 1.0], [0.0, 1.0]]]])
    gradient = torch.tensor([[[[0.0, 1.0], [0.0, 1.0]],      # alpha_0 = 0.5
                              [[-2.0, 0.0], [-2.0, 0.0]]]])  # alpha_1 = -1
    return activation, gradient


def test_matches_hand_computation_on_a_tiny_conv_map():
    activation, gradient = _tiny()
    # 0.5 * A0 - A1 = [[0.5, 0], [1.5, 1]]; ReLU keeps it; min-max by 1.5.
    expected = torch.tensor([[[1 / 3, 0.0], [1.0, 2 / 3]]])
    cam = grad_cam(activation, gradient)
    assert cam.shape == (1, 2, 2) and cam.dtype == torch.float32
    assert torch.allclose(cam, expected)


def test_relu_drops_negative_evidence():
    activation, gradient = _tiny()
    activation[0, 1, 0, 1] = 5.0  # 0.5 * 2 - 5 < 0 at (0, 1)
    cam = grad_cam(activation, gradient)
    raw = torch.tensor([[0.5, 0.0], [1.5, 1.0]])
    assert cam[0, 0, 1] == 0.0
    assert torch.allclose(cam[0], raw / 1.5)


def test_upsampled_to_out_size_is_bilinear_and_scaled_to_unit_range():
    torch.manual_seed(0)
    activation = torch.rand(3, 4, 5, 6)
    gradient = torch.randn(3, 4, 5, 6)
    cam = grad_cam(activation, gradient, out_size=(20, 24))
    assert cam.shape == (3, 20, 24)
    raw = F.relu((gradient.mean(dim=(2, 3), keepdim=True) * activation).sum(1, keepdim=True))
    up = F.interpolate(raw, size=(20, 24), mode="bilinear", align_corners=False)[:, 0]
    for i in range(3):
        if up[i].max() > up[i].min():
            expected = (up[i] - up[i].min()) / (up[i].max() - up[i].min())
            assert torch.allclose(cam[i], expected, atol=1e-6)
            assert cam[i].min() == 0.0 and cam[i].max() == pytest.approx(1.0)


def test_all_zero_cam_stays_zero_without_nan():
    activation = torch.rand(2, 3, 4, 4)
    gradient = -torch.ones(2, 3, 4, 4)  # every channel votes against: ReLU gives zeros
    cam = grad_cam(activation, gradient, out_size=(8, 8))
    assert torch.equal(cam, torch.zeros(2, 8, 8))
    flat = grad_cam(torch.ones(1, 2, 3, 3), torch.ones(1, 2, 3, 3))
    assert not torch.isnan(flat).any() and torch.equal(flat, torch.zeros(1, 3, 3))


def test_samples_are_scaled_independently():
    activation, gradient = _tiny()
    batch = grad_cam(torch.cat([activation, 10 * activation]), torch.cat([gradient, gradient]))
    assert torch.allclose(batch[0], batch[1])


def test_half_precision_inputs_give_float32():
    activation, gradient = _tiny()
    cam = grad_cam(activation.half(), gradient.half())
    assert cam.dtype == torch.float32
    assert torch.allclose(cam, grad_cam(activation, gradient), atol=1e-3)


def test_vit_tokens_with_class_token_equal_the_conv_computation():
    torch.manual_seed(1)
    b, side, c = 2, 3, 5
    tokens = torch.randn(b, 1 + side * side, c)
    grads = torch.randn(b, 1 + side * side, c)
    cam = grad_cam(tokens, grads, out_size=(12, 12))
    as_map = lambda t: t[:, 1:, :].reshape(b, side, side, c).permute(0, 3, 1, 2)  # noqa: E731
    assert torch.allclose(cam, grad_cam(as_map(tokens), as_map(grads), out_size=(12, 12)), atol=1e-6)
    # The class token takes no part.
    tokens[:, 0] = 1e6
    grads[:, 0] = -1e6
    assert torch.allclose(cam, grad_cam(tokens, grads, out_size=(12, 12)), atol=1e-6)


def test_vit_token_grid_is_row_major():
    # One hot token at patch (row 1, col 2) of a 3x3 grid must light up that cell.
    tokens = torch.zeros(1, 10, 4)
    tokens[0, 1 + 1 * 3 + 2] = 1.0
    grads = torch.ones(1, 10, 4)
    cam = grad_cam(tokens, grads)
    assert cam.shape == (1, 3, 3)
    assert torch.nonzero(cam[0] == 1.0).tolist() == [[1, 2]]


def test_tokens_without_class_token():
    torch.manual_seed(2)
    tokens = torch.rand(1, 16, 3)  # 16 - 1 = 15 is not square, 16 is: no class token
    grads = torch.rand(1, 16, 3)
    cam = grad_cam(tokens, grads)
    as_map = lambda t: t.reshape(1, 4, 4, 3).permute(0, 3, 1, 2)  # noqa: E731
    assert torch.allclose(cam, grad_cam(as_map(tokens), as_map(grads)), atol=1e-6)


def test_vit_b_16_shape_is_supported():
    assert cam_supported((1, 197, 768))  # 224 px / 16: class token + 14x14
    tokens = torch.rand(1, 197, 8)
    assert grad_cam(tokens, torch.rand(1, 197, 8), out_size=(224, 224)).shape == (1, 224, 224)


@pytest.mark.parametrize(
    "shape, supported",
    [((2, 512), False), ((2, 3, 7, 7), True), ((1, 197, 768), True), ((1, 50, 8), True),
     ((1, 49, 8), True), ((1, 11, 8), False), ((4,), False), ((1, 2, 3, 4, 5), False)],
)
def test_cam_supported(shape, supported):
    assert cam_supported(shape) is supported
    assert cam_supported(torch.Size(shape)) is supported


def test_vector_output_is_refused_with_a_clear_message():
    with pytest.raises(GradExplorerError) as info:
        grad_cam(torch.rand(2, 512), torch.rand(2, 512), layer="avgpool_flat")
    assert ("Grad-CAM needs a spatial layer (conv or ViT tokens); "
            "'avgpool_flat' outputs shape (B, 512)") in info.value.problem
    assert info.value.fix


def test_bad_gradients_are_refused():
    activation, gradient = _tiny()
    with pytest.raises(GradExplorerError, match="No gradient reached 'conv'"):
        grad_cam(activation, None, layer="conv")
    with pytest.raises(GradExplorerError, match="shape"):
        grad_cam(activation, gradient[:, :1])
    with pytest.raises(GradExplorerError, match="spatial"):
        grad_cam(torch.rand(1, 11, 4), torch.rand(1, 11, 4))


def test_grad_cam_leaves_inputs_alone():
    activation, gradient = _tiny()
    activation.requires_grad_(True)
    before = activation.detach().clone()
    cam = grad_cam(activation, gradient)
    assert not cam.requires_grad
    assert torch.equal(activation.detach(), before)


def test_turbo_runs_blue_to_red():
    colours = turbo(np.array([0.1, 0.5, 0.9, 0.0, np.nan, 1.0, 2.0]))
    assert colours.shape == (7, 3) and colours.dtype == np.uint8
    low, mid, high = colours[:3].astype(int)
    assert low[2] > 200 and low[2] > low[0] + 100  # blue
    assert mid[1] > 200  # green-yellow
    assert high[0] > 150 and high[0] > high[2] + 100  # red
    assert colours[3].max() < 60  # both ends are dark
    assert np.array_equal(colours[4], colours[3]) and np.array_equal(colours[6], colours[5])


def test_overlay_blends_the_heatmap_at_the_given_opacity():
    picture = Image.new("RGB", (32, 16), (10, 200, 30))
    cam = torch.zeros(4, 8)
    cam[0, 0] = 1.0
    assert np.array_equal(np.asarray(overlay(picture, cam, 0.0)), np.asarray(picture))
    full = overlay(picture, cam, 1.0)
    assert full.size == (32, 16) and full.mode == "RGB"
    resized = np.asarray(Image.fromarray(cam.numpy()).resize((32, 16), Image.BILINEAR))
    assert np.array_equal(np.asarray(full), turbo(resized))
    half = np.asarray(overlay(picture, cam.numpy(), 0.5)).astype(int)
    expected = np.rint(0.5 * np.asarray(picture) + 0.5 * turbo(resized)).astype(int)
    assert np.abs(half - expected).max() <= 1


def test_overlay_refuses_bad_arguments():
    picture = Image.new("RGB", (8, 8))
    with pytest.raises(GradExplorerError):
        overlay(picture, torch.zeros(1, 8, 8), 0.5)
    with pytest.raises(GradExplorerError):
        overlay(picture, torch.zeros(8, 8), 1.5)
