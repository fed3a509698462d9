"""A training that watches every step and says when each step is done (for the crash-safety
and live-reading tests: run as ``python -m tests.core.watch_writer LOG STEPS [PAUSE_S [HOLD...]]``;
the pause after each step keeps a fast machine from writing the whole log between two polls of
a reader). After each step named in HOLD the writer creates ``LOG.hold-STEP`` and waits, for
up to a minute, until a reader removes it: a reader then sees that step whatever pauses the
machine makes it take between two polls."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from gradexplorer.recording.watch import watch


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    holds = {int(a) for a in sys.argv[4:]}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, out=out, every=1) as w:
        for i in range(steps):
            x = torch.randn(8, 16)
            loss = F.cross_entropy(model(x), torch.randint(0, 4, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.step(loss=loss)
            print(f"done {i}", flush=True)
            if i in holds:
                hold = Path(f"{out}.hold-{i}")
                hold.touch()
                deadline = time.monotonic() + 60
                while hold.exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
            time.sleep(pause)


if __name__ == "__main__":
    main()
