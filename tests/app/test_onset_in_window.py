"""Where NaN/Inf began, in the window: the module tree and the graph mark the module call,
and the status bar's link selects that layer and call everywhere."""

from __future__ import annotations

import textwrap

import pytest
from PySide6.QtCore import Qt

from gradexplorer.capturing.nonfinite import onset_location
from gradexplorer_app.window.module_tree_view import BADGES_ROLE, ONSET_ROLE

TIMEOUT = 60_000

MODEL = '''
import torch
from torch import nn


class Div(nn.Module):
    def forward(self, x, d):
        return x / d


class TwiceDivided(nn.Module):
    """Its Div runs twice: by 2 (finite), then by 0 mid-forward (Inf/NaN from there on)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.div, self.act, self.fc2 = nn.Linear(4, 4), Div(), nn.Tanh(), nn.Linear(4, 2)

    def forward(self, x):
        h = self.div(self.fc1(x), 2.0)
        h = self.div(self.act(h), 0.0)
        return self.fc2(h)


def twice_divided():
    return TwiceDivided()
'''


def test_onset_is_marked_in_tree_and_graph_and_the_link_jumps_there(qtbot, window, tmp_path):
    path = tmp_path / "divide_models.py"
    path.write_text(textwrap.dedent(MODEL))
    w = window
    with qtbot.waitSignal(w.run_done, timeout=TIMEOUT) as done:
        w.load_model(f"{path}:twice_divided", trust=True, inputs=["random:2x4"], run=True)
    assert done.args == ["ok"]
    cap = w.session.capture
    # By construction the first non-finite output with finite inputs is Div's second call.
    assert onset_location(cap.nonfinite_onset, "forward") == ("div", 1, "activation")
    backward = onset_location(cap.nonfinite_onset, "backward")
    assert backward is not None

    # The tree marks the row, the others not.
    model = w.tree_view.tree_model
    assert model.data(model.index_of("div"), ONSET_ROLE)[0] == "forward"
    assert model.data(model.index_of("div"), BADGES_ROLE)[0][0] == "⚠ onset"
    assert "NaN/Inf began here" in model.data(model.index_of("div"), Qt.ItemDataRole.ToolTipRole)
    assert model.data(model.index_of("fc1"), ONSET_ROLE) == []

    # The status bar says where, as links.
    link = w.onset_link
    assert not link.isHidden() and "div, call 2" in link.text() and "href='forward'" in link.text()

    # The graph marks the node of that call.
    panel = w.graph_panel
    with qtbot.waitSignal(panel.layout_done, timeout=TIMEOUT):
        w.module_tabs.setCurrentWidget(panel)
    assert panel.items["m:div:1"].onset[:1] == ["forward"]
    assert not panel.items["m:div:0"].onset and not panel.items["m:fc1:0"].onset
    assert "NaN/Inf began here (forward)" in panel.tooltip("m:div:1")

    # Elsewhere first; then the link selects that layer and call in the views, tree and graph.
    w.view_state.select("fc1", 0)
    qtbot.waitUntil(lambda: w.tree_view.current_name() == "fc1", timeout=5000)
    link.linkActivated.emit("forward")
    assert (w.view_state.layer, w.view_state.call) == ("div", 1)
    assert w.tree_view.current_name() == "div"
    assert panel.selected == "m:div:1"
    # The backward link goes to the backward onset.
    link.linkActivated.emit("backward")
    name, call, _tensor = backward
    assert w.tree_view.current_name() == name and w.view_state.layer == name
    assert w.view_state.call == (call or 0)


@pytest.mark.slow
def test_a_finite_capture_shows_no_onset(demo):
    assert demo.onset_link.isHidden() and not demo.onset_link.places
    assert not any(item.onset for item in demo.graph_panel.items.values())
