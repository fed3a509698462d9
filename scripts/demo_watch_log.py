"""Make a watch log in which training goes wrong: a small CNN whose learning rate keeps
growing, so that gradients explode and then turn NaN (the README's timeline screenshot).

    python scripts/demo_watch_log.py run.gxw
    gradexplorer timeline run.gxw
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn as nn
import torch.nn.functional as F

from gradexplorer.recording.watch import watch


def main(out: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.LeakyReLU(0.1),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.LeakyReLU(0.1),
        nn.Conv2d(32, 32, 3, padding=1, stride=2), nn.LeakyReLU(0.1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=1.3)
    g = torch.Generator().manual_seed(1)
    with watch(model, out=out, every=2) as w:
        for _step in range(120):
            x = torch.randn(16, 3, 32, 32, generator=g)
            y = torch.randint(0, 10, (16,), generator=g)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            w.step(loss=loss)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "run.gxw")
