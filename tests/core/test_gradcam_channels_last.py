"""Grad-CAM on channels-last activations (ConvNeXt and Swin blocks' norms and MLPs,
``(B, H, W, C)``): the grid is H × W, not W × C, and the map equals Grad-CAM computed in
float64 NumPy on the channels-first view of autograd's activation and gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradexplorer.analysis.gradcam import cam_grid, cam_unavailable_reason, grad_cam, is_channels_last
from tests.ground_truth import reference


def numpy_cam(activation: torch.Tensor, gradient: torch.Tensor) -> np.ndarray:
    a = activation.double().numpy().transpose(0, 3, 1, 2)
    g = gradient.double().numpy().transpose(0, 3, 1, 2)
    cam = np.maximum((g.mean(axis=(2, 3), keepdims=True) * a).sum(axis=1), 0.0)
    low = cam.min(axis=(1, 2), keepdims=True)
    span = cam.max(axis=(1, 2), keepdims=True) - low
    return np.where(span > 0, (cam - low) / np.where(span > 0, span, 1), 0.0)


def test_layouts_are_told_apart_by_the_input_size():
    picture = (1, 3, 224, 224)
    assert is_channels_last((1, 7, 7, 768), picture)
    assert cam_grid((1, 7, 7, 768), picture) == (7, 7, False)
    assert cam_grid((1, 56, 56, 96), picture) == (56, 56, False)
    assert not is_channels_last((1, 768, 7, 7), picture)
    assert not is_channels_last((1, 64, 56, 56), picture)  # both read; channels first wins
    assert cam_grid((1, 64, 56, 56), picture) == (56, 56, False)
    assert is_channels_last((1, 7, 7, 768))  # no input known: a square grid of channels
    assert cam_unavailable_reason((1, 7, 7, 768), picture) is None


def test_grad_cam_of_a_convnext_block_norm_equals_the_float64_reference():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("convnext_atto", pretrained=False, conv_mlp=False).eval()  # norms in (B, H, W, C)
    x = torch.randn(2, 3, 64, 64)
    layer = "stages.3.blocks.0.norm"
    ref = reference(model, x, [layer])["calls"][layer][0]
    activation, gradient = ref["activation"], ref["grad_output"]
    assert activation.shape == (2, 2, 2, 320)  # channels last
    cam = grad_cam(activation, gradient, layer=layer, input_shape=tuple(x.shape))
    assert cam.shape == (2, 2, 2)
    np.testing.assert_allclose(cam.numpy(), numpy_cam(activation, gradient), atol=1e-5)
    # Upsampled to the picture, as the Grad-CAM view draws it.
    assert grad_cam(activation, gradient, out_size=(64, 64), input_shape=tuple(x.shape)).shape == (2, 64, 64)
