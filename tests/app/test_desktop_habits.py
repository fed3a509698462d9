"""The habits of a desktop app: closing during a run, error dialogs with a next step."""

from __future__ import annotations

import time

from gradexplorer.app import dialogs

TIMEOUT = 60_000

SLOW_FACTORY = '''
import time
import torch.nn as nn


class Slow(nn.Module):
    """Each call waits ``delay`` seconds: a model whose forward takes as long as a big one's."""

    delay = 0.0

    def forward(self, x):
        time.sleep(self.delay)
        return x * 1.0


def build():
    return nn.Sequential(nn.Linear(8, 8), *[Slow() for _ in range(400)])
'''


def _slow_model(qtbot, window, tmp_path, delay: float = 0.1):
    """The window with a model whose forward takes ``400 * delay`` seconds, running."""
    factory = tmp_path / "slow_net.py"
    factory.write_text(SLOW_FACTORY)
    with qtbot.waitSignal(window.model_loaded, timeout=TIMEOUT):
        window.load_model(f"{factory}:build", trust=True)
    for module in window.session.model.module.modules():
        if type(module).__name__ == "Slow":
            module.delay = delay
    stages = []
    window.controller.run_progress.connect(lambda stage, done, total: stages.append(stage))
    window.run()
    qtbot.waitUntil(lambda: "forward" in stages, timeout=TIMEOUT)
    qtbot.wait(300)  # well inside the 40 s forward
    assert window.controller.is_running()


def test_closing_during_a_run_asks_cancels_and_closes_at_once(qtbot, window, tmp_path, monkeypatch):
    _slow_model(qtbot, window, tmp_path)
    asked = []
    monkeypatch.setattr(dialogs, "confirm_close_during_run",
                        lambda parent, what="A run": asked.append(what) or True)
    start = time.perf_counter()
    window.close()
    seconds = time.perf_counter() - start
    assert asked == ["A run"]
    assert not window.isVisible()
    assert not window.controller.is_running() or window.run_runner.wait_idle(1)
    # A guard against a hang only; the figure itself is in docs/window.md.
    assert seconds < 5, f"closing during a run took {seconds:.1f} s"
    print(f"closed during a run in {seconds * 1000:.0f} ms")


def test_closing_during_a_run_can_be_refused_and_the_run_goes_on(qtbot, window, tmp_path, monkeypatch):
    _slow_model(qtbot, window, tmp_path, delay=0.01)
    monkeypatch.setattr(dialogs, "confirm_close_during_run", lambda parent, what="A run": False)
    window.show()
    with qtbot.waitSignal(window.run_done, timeout=TIMEOUT) as done:
        window.close()
        assert window.isVisible()
    assert done.args == ["ok"]


def test_closing_an_idle_window_asks_nothing(qtbot, demo, monkeypatch):
    # confirm_close_during_run is refused by the suite's fixture: reaching it fails here.
    demo.close()
    assert not demo.isVisible()
