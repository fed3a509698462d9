"""The window tells a layer that never ran apart from one that no gradient reached, and shows
the parameter gradients of modules that are not leaves (the model's own, an attention's)."""

from __future__ import annotations

import torch
from PySide6.QtCore import Qt
from torch import nn

from tests.app.conftest import TIMEOUT


class Attention(nn.Module):
    """A position parameter on the model itself, and nn.MultiheadAttention, whose out_proj
    never runs (F.multi_head_attention_forward uses its weight directly)."""

    def __init__(self) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.proj = nn.Linear(8, 2)
        self.pos = nn.Parameter(torch.randn(1, 5, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.mha(x + self.pos, x + self.pos, x + self.pos)
        return self.proj(y).mean(1)


def test_never_called_is_not_no_gradient_and_parameter_gradients_show(qtbot, window):
    from gradexplorer.capturing.capture import capture
    from gradexplorer_app.window.module_tree_view import BADGES_ROLE

    torch.manual_seed(0)
    model = Attention().eval()
    x = torch.randn(2, 5, 8)
    cap = capture(model, x, meta={"model": "attention", "model_name": "attention"})
    out = model(x)
    target = out.gather(1, out.argmax(1, keepdim=True)).sum()
    g_out_proj, g_pos = torch.autograd.grad(target, [model.mha.out_proj.weight, model.pos])  # the truth
    with qtbot.waitSignal(window.file_done, timeout=TIMEOUT):
        window.controller.show_capture(cap)
    flow = window.views.flow_view
    names, _ = flow.series()
    i = names.index("mha.out_proj")
    assert flow.gaps()["mha.out_proj"] == "not called" and "no gradient" not in flow.flags()["mha.out_proj"]
    assert flow._colour(i) == "#cfd4dc" and "not called: it never ran during forward" in flow.describe_bar(i)
    assert "not&nbsp;called" in flow.legend_label.text()  # one entry, never broken inside
    assert flow.layer_axis.names[names.index("")] == "(model)"  # the model's own record, named
    tree = window.tree_view.tree_model
    index = tree.index_of("mha.out_proj")
    assert "not called" in [text for text, _colour in tree.data(index, BADGES_ROLE)]
    assert "never ran during forward" in tree.data(index, Qt.ItemDataRole.ToolTipRole)
    # its parameters' gradients, though it never ran: the Statistics tab, against autograd
    window.tree_view.select_layer("mha.out_proj")
    views = window.views
    assert window.view_state.layer == "mha.out_proj"
    views.show_view("Statistics")
    rows = dict(views.stats_view.rows())
    assert set(rows) == {"gradient of weight", "gradient of bias"}
    assert abs(float(rows["gradient of weight"]["l2"]) - float(g_out_proj.double().norm())) < 1e-5
    assert "not called" in views.layer_label.text()
    views.show_view("Heatmap")
    assert "never ran during the forward pass" in views.heatmap_view.message()
    # the model's own parameters: its row selects its record
    window.tree_view.select_layer("")
    assert window.view_state.layer == ""
    views.show_view("Statistics")
    rows = dict(views.stats_view.rows())
    assert abs(float(rows["gradient of pos"]["l2"]) - float(g_pos.double().norm())) < 1e-5
    assert "<b>(model)</b>" in views.layer_label.text()
