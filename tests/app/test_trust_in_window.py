"""The window's "Trust and load" lets the factory or model file run code, nothing else:
the weights given with it are read as tensors. The dialog names what will run. The
window's random batch follows the model like the CLI's --random."""

from __future__ import annotations

import os
import shlex
import textwrap

import pytest
import torch

from gradexplorer_app import dialogs
from tests.app.conftest import TIMEOUT


class _RunsCommand:
    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


FACTORY = textwrap.dedent(
    """
    import torch
    from torch import nn

    def build():
        return nn.Sequential(nn.Linear(4, 3))

    def build_half():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 3)).to(torch.bfloat16)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(40, 8)
            self.head = nn.Linear(8, 40)

        def forward(self, ids):
            return self.head(self.embed(ids)).mean(1)
    """
)


def test_trust_and_load_does_not_reach_the_weights_file(qtbot, window, shown_errors, monkeypatch, tmp_path):
    factory = tmp_path / "nets.py"
    factory.write_text(FACTORY)
    marker = tmp_path / "pwned"
    torch.save({"0.weight": _RunsCommand(marker)}, tmp_path / "evil.pth")
    asked = []
    monkeypatch.setattr(dialogs, "confirm_trust", lambda parent, what, why: asked.append(what) or True)
    with qtbot.waitSignal(window.error_shown, timeout=TIMEOUT):
        window.load_model(f"{factory}:build", weights=str(tmp_path / "evil.pth"))
    assert asked == [f"the Python file '{factory.resolve()}', then its build()"]
    assert not marker.exists()
    title, exc = shown_errors[-1]
    assert "posix.system" in exc.problem and "weights_only" not in str(exc)


def test_trust_dialog_names_the_pickled_model_file(qtbot, window, shown_errors, monkeypatch, tmp_path):
    path = tmp_path / "whole.pt"
    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 2)), path)
    asked = []
    monkeypatch.setattr(dialogs, "confirm_trust", lambda parent, what, why: asked.append(what) or False)
    with qtbot.waitSignal(window.error_shown, timeout=TIMEOUT):
        window.load_model(str(path))
    assert asked == [f"the model file '{path.resolve()}'"]


def test_window_random_batch_follows_the_model(qtbot, window, monkeypatch, tmp_path):
    factory = tmp_path / "nets.py"
    factory.write_text(FACTORY)
    monkeypatch.setattr(dialogs, "confirm_trust", lambda *a: True)
    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.load_model(f"{factory}:build_half", trust=True)
    batch = window.session.batch
    assert batch.tensor.dtype == torch.bfloat16 and batch.tensor.shape == (2, 4)
    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.load_model(f"{factory}:LM", trust=True)
    ids = window.session.batch.tensor
    assert ids.dtype == torch.int64 and int(ids.max()) < 40 and ids.shape == (2, 16)


# -- the scripted flags: nobody is there to answer a question --------------------------------


@pytest.mark.slow
def test_screenshot_mode_refuses_an_untrusted_factory_with_the_message_on_stderr(tmp_path):
    """``--screenshot`` without ``--trust``: exit 1 and the message, never a hidden trust dialog."""
    import subprocess
    import sys
    from pathlib import Path

    marker = tmp_path / "ran"
    factory = tmp_path / "nets.py"
    factory.write_text(FACTORY + f"\nopen({str(marker)!r}, 'w').close()\n")
    shot = tmp_path / "shot.png"
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", GRADEXPLORER_SETTINGS=str(tmp_path / "s.ini"),
               PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-m", "gradexplorer", "--model", f"{factory}:build",
                             "--screenshot", str(shot)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 1, result.stderr[-2000:]
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error: ")]
    assert errors and "The model cannot be loaded" in errors[0] and "--trust" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists()  # the factory's code never ran
    assert shot.stat().st_size > 0  # the window, with the message, was still captured


def test_unattended_window_refuses_over_budget_instead_of_asking(qtbot, window, shown_errors, capsys):
    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.load_model("demo:seed-mlp", inputs=["random:3x10"])
    window.controller.unattended = True
    window.session.memory_budget = 1  # one byte: every capture is over it
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        window.run()  # the autouse fixture fails the test if ask_item opens
    assert done.args == ["cancelled"]
    title, exc = shown_errors[-1]
    # one byte holds no statistics-only run either: the flag that helps, not --stats-only
    assert title == "Over the memory budget" and "--memory-budget" in exc.fix and "--stats-only" not in exc.fix
    assert "smaller batch" in exc.problem
    assert "error: Over the memory budget: " in capsys.readouterr().err
    assert window.session.capture is None
