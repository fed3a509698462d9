"""A capture and a timeline in a notebook: ``to_pandas()`` (a row per layer, call and kind;
the timeline's matrix) and ``_repr_html_`` (a compact table with flags), also in a real
Jupyter kernel."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gradexplorer as gx


class Shared(nn.Module):
    """A ReLU called twice, and a side branch whose output gradient nearly vanishes."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.act = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.ReLU()
        self.side, self.d, self.e, self.head = nn.Linear(8, 3), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.a(x))
        h = self.act(self.b(h))
        h = self.c(h)
        faint = self.side(h) * 1e-9  # its output gradient is 1e-9 times the head's
        return self.head(self.e(self.d(h))) + faint


def capture() -> tuple[nn.Module, torch.Tensor, gx.Capture]:
    torch.manual_seed(0)
    model = Shared()
    x = torch.randn(5, 6)
    return model, x, gx.capture(model, x, target="top1")


def test_to_pandas_has_a_row_per_layer_call_and_kind():
    model, x, cap = capture()
    frame = cap.to_pandas()
    calls = frame[frame.kind != "param_grad"]
    keys = set(zip(calls.layer, calls.call.astype(int), calls.kind))
    assert ("act", 0, "activation") in keys and ("act", 1, "grad_output") in keys
    assert {k for k in keys if k[0] == "act"} == {("act", c, kind) for c in (0, 1)
                                                  for kind in ("activation", "grad_output", "grad_input")}
    assert len(keys) == len(calls)  # one row each
    # The values are the capture's, and its output gradients those of autograd.
    outputs: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(module, inputs, output) -> None:
            outputs.setdefault(name, output)
        return hook

    hooks = [m.register_forward_hook(keep(n)) for n, m in model.named_children()]
    out = model(x)
    for h in hooks:
        h.remove()
    target = out[torch.arange(5), out.argmax(1)].sum()
    names = ["a", "b", "c", "side", "d", "e", "head"]
    truth = torch.autograd.grad(target, [outputs[n] for n in names])
    for name, g in zip(names, truth):
        row = frame[(frame.layer == name) & (frame.kind == "grad_output")]
        assert row.l2.item() == pytest.approx(float(g.double().norm()), rel=1e-5)
    params = frame[frame.kind == "param_grad"]
    assert set(zip(params.layer, params.param)) == {(n.rsplit(".", 1)[0], n.rsplit(".", 1)[1])
                                                    for n, _ in model.named_parameters()}
    assert params.call.isna().all()
    assert frame[frame.layer == "side"].layer_flags.iloc[0] == "vanishing"


def cap_flags(cap):
    from gradexplorer.capturing.flags import layer_flags

    return layer_flags(cap)


def test_the_notebook_table_shows_each_layer_its_gradient_and_its_flags():
    _model, _x, cap = capture()
    flags = cap_flags(cap)
    assert flags["side"] == ["vanishing"]  # 1e-9 times its neighbours' gradient
    html = cap._repr_html_()
    assert html.count("<tr>") == len(cap) + 1
    for name in cap.layer_order:
        assert f"<td style=\"text-align:left\">{name}</td>" in html
    assert "vanishing" in html and "(2 calls)" in html
    l2 = math.hypot(*(c.stats["grad_output"]["l2"] for c in cap["act"].calls))
    assert f"{l2:.3g}" in html


def test_a_timeline_as_a_frame_and_a_table(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gx.watch(model, str(tmp_path / "run.gxw"), every=1) as w:
        for _ in range(3):
            loss = F.cross_entropy(model(torch.randn(3, 4)), torch.randint(0, 2, (3,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.step(loss=loss)
    t = gx.read_timeline(tmp_path / "run.gxw")
    frame = t.to_pandas()
    assert list(frame.index) == t.rows and list(frame.columns) == t.steps.tolist()
    assert (frame.to_numpy() == t.values).all()
    assert frame.attrs == {"kind": "grad_output", "stat": "l2"}
    html = t._repr_html_()
    assert "3 rows × 3 steps (steps 0 .. 2)" in html and html.count("<svg") == 3


@pytest.mark.slow
def test_in_a_jupyter_kernel_a_capture_displays_as_a_table(tmp_path):
    manager = pytest.importorskip("jupyter_client.manager")
    km, kc = manager.start_new_kernel(kernel_name="python3", env=dict(os.environ), cwd=str(tmp_path))
    try:
        def run(code: str) -> dict:
            shown: dict = {}

            def on_message(m: dict) -> None:
                if m["msg_type"] in ("execute_result", "display_data"):
                    shown.update(m["content"]["data"])
                elif m["msg_type"] == "stream":
                    shown["stream"] = shown.get("stream", "") + m["content"]["text"]

            reply = kc.execute_interactive(code, timeout=300, output_hook=on_message)
            assert reply["content"]["status"] == "ok", reply["content"]
            return shown

        run("import torch, gradexplorer as gx\n"
            "m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))\n"
            "cap = gx.capture(m, torch.randn(4, 8))")
        shown = run("cap")
        assert "<table" in shown["text/html"] and "gradient L2" in shown["text/html"]
        assert "Capture(" in shown["text/plain"]
        frame = run("df = cap.to_pandas(); print(len(df), sorted(set(df.kind)))")
        assert frame["stream"].split(None, 1)[0] == "12"  # 3 layers' calls and 4 parameter gradients
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
