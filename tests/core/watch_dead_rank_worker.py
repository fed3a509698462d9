"""Two ranks of a watched training (gloo, a file store, a 10 s timeout); rank 1 dies
at the start of step 1. Run by test_watch_dead_rank:
``python -m tests.core.watch_dead_rank_worker LOG STOREFILE RANK [MODE]``.

MODE ``plain`` (the default): a plain model, whose first collective after the death is the
watch's gather at ``w.step()``. ``fsdp``: the model sharded with ``fully_shard`` on each
``Linear`` and the root, whose first collective is FSDP2's all-gather in the user's
forward: the survivor prints torch's error and its notes.

Started as two plain processes rather than by torchrun, whose agent kills every rank as
soon as one dies: here the survivor must end on its own, with the watch's message."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.recording.watch import watch

TIMEOUT_S = 10


def main() -> None:
    out, store, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else "plain"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=TIMEOUT_S))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    if mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (2,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        with watch(model, out=out, every=1) as w:
            for step in range(4):
                if rank == 1 and step == 1:
                    os._exit(3)  # dies without a word, as a killed process does
                loss = F.mse_loss(model(torch.randn(2, 4)), torch.zeros(2, 2))
                opt.zero_grad()
                loss.backward()
                opt.step()
                w.step(loss=loss)
    except GradExplorerError as exc:
        print(f"error: {exc}", flush=True)
        os._exit(1)  # the group cannot be destroyed cleanly with a dead peer
    except Exception as exc:  # noqa: BLE001 - torch's own error, as the user's script sees it
        notes = "\n".join(getattr(exc, "__notes__", []))
        print(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}\n{notes}",
              flush=True)
        os._exit(2)
    print("finished", flush=True)


if __name__ == "__main__":
    main()
