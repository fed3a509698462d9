"""The command line on a default capture that holds every parameter: the root module's
record shown as ``(model)``, containers' parameters, never-called modules told apart from
gradients that are absent (and why), in ``capture``, ``inspect`` and ``diff``."""

from __future__ import annotations

import textwrap

import torch

from gradexplorer.files.capture_file import load_capture
from tests.app.test_cli import run
from tests.ground_truth import param_grads_by_autograd, target_by_hand

FACTORIES = textwrap.dedent("""
    import torch
    from torch import nn

    class Classifier(nn.Module):
        # An attention block and a learnt temperature on the root.
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(4, 8)
            self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
            self.head = nn.Linear(8, 3)
            self.temperature = nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            h = self.embed(x)
            a, _ = self.attention(h, h, h)
            return self.head(a.mean(1)) / self.temperature

    class LastState(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(4, 5, batch_first=True)
            self.head = nn.Linear(5, 3)

        def forward(self, x):
            _, (h, _c) = self.rnn(x)
            return self.head(h[-1])

    def classifier():
        torch.manual_seed(0)
        return Classifier()

    def last_state():
        torch.manual_seed(0)
        return LastState()
""")


def _setup(tmp_path):
    (tmp_path / "zoo.py").write_text(FACTORIES)
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1))
    torch.save(x, tmp_path / "x.pt")
    return tmp_path / "zoo.py", tmp_path / "x.pt", x


def test_inspect_shows_the_root_and_every_parameter_and_what_never_ran(tmp_path, capsys):
    zoo, batch, x = _setup(tmp_path)
    out_file = tmp_path / "cap.pt"
    code, out, err = run(capsys, "capture", "--model", f"{zoo}:classifier", "--trust", "--input", batch,
                         "--out", out_file, "-q")
    assert code == 0, err
    assert "not run   attention.out_proj (never called in forward)" in out
    cap = load_capture(out_file)
    import importlib.util

    spec = importlib.util.spec_from_file_location("zoo", zoo)
    zoo_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo_module)
    model = zoo_module.classifier().eval()
    want = param_grads_by_autograd(model, target_by_hand(model(x), "top1"))
    assert set(cap.param_grads) == set(want)
    for name, g in want.items():
        torch.testing.assert_close(cap.param_grads[name], g, rtol=0, atol=0)

    code, out, err = run(capsys, "inspect", out_file)
    assert code == 0, err
    assert "params   9 of 9 with gradients" in out
    assert "layers   5 (4 calls); 1 never called" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("(model)", "attention"))}
    assert rows["(model)"].split()[2] == "Classifier"
    assert rows["attention"].split()[2] == "MultiheadAttention" and "no grad" not in rows["attention"]
    assert rows["attention.out_proj"].rstrip().endswith("not called")

    code, out, err = run(capsys, "inspect", out_file, "--layer", "(model)")
    assert code == 0, err
    assert "(model) parameter gradients:" in out and "temperature" in out
    assert "no grad_input: it does not require a gradient" in out
    code, out, err = run(capsys, "inspect", out_file, "--layer", "attention.out_proj")
    assert "never called during forward" in out and "weight" in out


def test_inspect_and_diff_say_why_a_gradient_is_absent(tmp_path, capsys):
    zoo, batch, _ = _setup(tmp_path)
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    for path in (a, b):
        code, _out, err = run(capsys, "capture", "--model", f"{zoo}:last_state", "--trust", "--input", batch,
                              "--out", path, "-q")
        assert code == 0, err
    code, out, err = run(capsys, "inspect", a, "--layer", "rnn")
    assert code == 0, err
    assert "no grad_output: autograd gave none: the target does not use this output" in out
    code, out, err = run(capsys, "diff", a, b)
    assert code == 0, out + err
    assert "result     within tolerance" in out

    code, out, err = run(capsys, "capture", "--model", f"{zoo}:classifier", "--trust", "--input", batch,
                         "--out", a, "-q")
    assert code == 0, err
    code, out, err = run(capsys, "diff", a, a)
    assert code == 0, out
    assert "not called in A: attention.out_proj" in out and "not called in B: attention.out_proj" in out
    assert "(model)" in out
