"""Alarms that explain, in the window: where the gradient stops, under the flow chart and in
the tree's tooltips; the target's seed is not called exploding."""

from __future__ import annotations

import torch
from PySide6.QtCore import Qt

from tests.app.conftest import TIMEOUT


def test_a_zero_head_is_named_under_the_flow_chart_and_in_the_tree(qtbot, window):
    from torchvision.models.vision_transformer import VisionTransformer

    from gradexplorer.capturing.capture import capture

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=16,
                            mlp_dim=32).eval()
    cap = capture(vit, torch.randn(2, 3, 32, 32), mode="stats", meta={"model": "vit", "model_name": "vit"})
    with qtbot.waitSignal(window.file_done, timeout=TIMEOUT):
        window.controller.show_capture(cap)
    flow = window.views.flow_view
    assert flow.stop_text().startswith("⚠ The gradient stops at heads.head (Linear): its output is all zeros")
    assert flow.stop_label.wordWrap() and flow.stop_label.isVisibleTo(window)
    tree = window.tree_view.tree_model
    tip = tree.data(tree.index_of("conv_proj"), Qt.ItemDataRole.ToolTipRole)
    assert "flag: zero" in tip and "stops at heads.head" in tip
    tip = tree.data(tree.index_of("heads.head"), Qt.ItemDataRole.ToolTipRole)
    assert "the gradient stops here" in tip and "weights and bias are zero" in tip
    i = flow.series()[0].index("conv_proj")
    assert "stops at heads.head" in flow.describe_bar(i)
