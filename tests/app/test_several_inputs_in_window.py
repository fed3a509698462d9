"""A model of two inputs in the window: a .pt file holding a pair loads as the batch, the run
passes both, every view draws (the primary input is the one shown), and the estimate counts both."""

from __future__ import annotations

import textwrap

import torch

from tests.app.conftest import TIMEOUT

FLOW = textwrap.dedent(
    """
    import torch
    from torch import nn

    class TwoFrames(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 4, 3, padding=1)
            self.b = nn.Conv2d(3, 4, 3, padding=1)
            self.head = nn.Linear(4, 5)

        def forward(self, frame1, frame2):
            y = torch.relu(self.a(frame1) + self.b(frame2))
            return self.head(y.mean((2, 3)))

    def build():
        torch.manual_seed(0)
        return TwoFrames()
    """
)


def test_a_two_input_model_runs_and_every_view_draws(qtbot, window, shown_errors, tmp_path):
    (tmp_path / "flow.py").write_text(FLOW)
    g = torch.Generator().manual_seed(0)
    f1, f2 = torch.randn(2, 3, 16, 16, generator=g), torch.randn(2, 3, 16, 16, generator=g)
    torch.save((f1, f2), tmp_path / "pair.pt")
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        window.load_model(f"{tmp_path / 'flow.py'}:build", trust=True, inputs=[str(tmp_path / "pair.pt")],
                          run=True)
    assert done.args == ["ok"], shown_errors
    cap = window.session.capture
    assert torch.equal(cap.input, f1) and set(cap.layers) >= {"a", "b"}
    # Ground truth: both frames reach the model (b's activation is the conv of frame2).
    model = window.session.model.module
    torch.testing.assert_close(cap["b"].calls[0].activation, model.b(f2))
    views = window.views
    for layer in ("a", "b", "head"):
        views.set_layer(layer)
        for i in range(views.tabs.count()):
            views.tabs.setCurrentIndex(i)
            qtbot.wait(20)
    assert not shown_errors
    # The estimate counted the second frame too (forward holds it).
    estimate = window.run_panel.compute_estimate()
    assert estimate is not None and estimate.transient >= 2 * f1.numel() * f1.element_size()
