"""A ticked block is a thing you can look at: ``layer4`` ticked (its leaves are captured, the
blocks themselves are not), a click on the ``layer4.0`` node of the graph or on the
``layer4.1`` row of the tree shows the block's output gradient, through the last captured
call inside it, and says so; never "not captured"."""

from __future__ import annotations

import pytest
import torch
from PySide6.QtCore import Qt

from tests.app.conftest import TIMEOUT


def block_output_gradient(model: torch.nn.Module, x: torch.Tensor, block: str) -> torch.Tensor:
    """The gradient of the top-1 logit's sum with respect to ``block``'s output, by autograd."""
    kept = {}
    handle = model.get_submodule(block).register_forward_hook(lambda m, a, out: kept.setdefault("y", out))
    try:
        logits = model(x)
    finally:
        handle.remove()
    target = logits.gather(1, logits.argmax(1, keepdim=True)).sum()
    (grad,) = torch.autograd.grad(target, kept["y"])
    return grad


@pytest.fixture
def layer4_run(qtbot, window):
    """resnet18 (random weights) on two random pictures, only layer4 ticked, run once."""
    window.show()
    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.load_model("resnet18", weights=None, inputs=["random:2x3x64x64"])
    window.session.select_none()
    window.session.set_checked("layer4", True)
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        window.run()
    assert done.args == ["ok"]
    cap = window.session.capture
    assert "layer4.0" not in cap and "layer4.0.relu" in cap  # the block itself is not recorded
    return window


def _shows_block_gradient(window, block: str) -> None:
    model = window.session.model.module
    x = window.session.capture.input
    want = block_output_gradient(model, x, block)
    state, views = window.view_state, window.views
    assert state.layer == f"{block}.relu" and state.call == 1  # BasicBlock's relu: out += identity; relu(out)
    heat = views.heatmap_view
    views.tabs.setCurrentWidget(heat)
    heat.set_tensor("grad_output")
    heat.ensure_drawn()
    assert heat.message() == "" and heat.plot_note.isHidden()
    shown = heat.context.tensor("grad_output")
    torch.testing.assert_close(shown, want, rtol=1e-5, atol=1e-7)
    assert f"<b>{block}</b>" in views.layer_label.text() and "not captured" not in views.layer_label.text()
    message = window.statusBar().currentMessage()
    assert "not captured" not in message and f"{block}.relu" in message


@pytest.mark.slow
def test_a_click_on_a_ticked_blocks_graph_node_shows_its_gradient(qtbot, layer4_run):
    window = layer4_run
    panel = window.graph_panel
    window.module_tabs.setCurrentWidget(panel)
    qtbot.waitUntil(lambda: panel.graph is not None and bool(panel.items) and panel.capture is not None
                    and not panel.layouts.is_busy() and not panel.extractions.is_busy(), timeout=TIMEOUT)
    node = panel.graph.module_node("layer4.0")
    if node.id not in panel.items:  # inside the collapsed layer4: open it
        with qtbot.waitSignal(panel.layout_done, timeout=TIMEOUT):
            panel.toggle(panel.graph.representative(node.id, panel.expanded))
    assert panel.graph.is_container(node.id) and node.id in panel.items
    item = panel.items[node.id]
    panel.canvas.centerOn(item)
    with qtbot.waitSignal(panel.layer_selected, timeout=5000):
        qtbot.mouseClick(panel.canvas.viewport(), Qt.MouseButton.LeftButton,
                         pos=panel.canvas.mapFromScene(item.rect.center()))
    _shows_block_gradient(window, "layer4.0")
    assert window.tree_view.current_name() == "layer4.0"  # the tree on the block's row
    assert panel.selected == node.id


def test_a_click_on_a_ticked_blocks_tree_row_shows_its_gradient(qtbot, layer4_run):
    window = layer4_run
    tree = window.tree_view
    tree.select_layer("layer4.1")
    _shows_block_gradient(window, "layer4.1")
    assert tree.current_name() == "layer4.1"  # the row stays the block's: the keys move on from it
    # Another layer ends it: the header no longer names the block.
    tree.select_layer("layer4.0.conv1")
    assert window.view_state.layer == "layer4.0.conv1"
    assert "layer4.1</b>" not in window.views.layer_label.text()
    assert window.controller.shown_for is None


@pytest.mark.slow
def test_a_module_with_nothing_captured_inside_still_says_so(qtbot, layer4_run):
    window = layer4_run
    window.tree_view.select_layer("layer1")
    assert "layer1 was not captured" in window.statusBar().currentMessage()
