"""One rank of a DDP training watched with gloo (run by test_watch_ddp under torchrun):
``torchrun --standalone --nproc-per-node 2 -m tests.core.watch_ddp_worker LOG merged|per_rank``."""

from __future__ import annotations

import gc
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradexplorer.recording.watch import watch


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))


def make_batches(steps: int = 2, world: int = 2, per_rank: int = 4):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(world * per_rank, 12, generator=g), torch.randint(0, 3, (world * per_rank,), generator=g))
            for _ in range(steps)]


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, out=out, every=1, per_rank=(mode == "per_rank")) as w:
        for x, y in make_batches(world=world):
            xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
            loss = F.cross_entropy(model(xs), ys)
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.step(loss=loss)
    # DDP holds the process group: left to interpreter shutdown, gloo's threads outlived
    # Python and about one run in fifteen aborted ("terminate called without an active
    # exception"), with or without the watch. Drop it while Python is whole, in step.
    dist.barrier()
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
