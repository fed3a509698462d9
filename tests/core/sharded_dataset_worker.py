"""One rank of a dataset capture over a model sharded with FSDP2 (run by
test_sharded_dataset under torchrun, gloo):
``torchrun --standalone --nproc-per-node 2 -m tests.core.sharded_dataset_worker OUT``.

Before capturing, each rank checks that it holds only its rows of every parameter (the
shards FSDP2 made of the weights every rank started from); rank 0 saves the merged totals
(``DatasetStats.to_dict``), the blocks and each rank's parameter bytes to OUT.
"""

from __future__ import annotations

import gc
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.capturing.capture import capture
from gradexplorer.recording.dataset_capture import capture_dataset, gather_to_rank0
from gradexplorer.recording.shard_blocks import ShardPlan, choose_blocks, local_param_bytes, shard_model
from gradexplorer.recording.sharded_dataset import capture_dataset_sharded

SAMPLES, BATCH = 13, 3  # 5 batches: over 2 ranks the last round pads rank 1


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.relu(self.fc(x)))


class Net(nn.Module):
    """Repeated blocks (the default rule's), a head, a parameter of the root itself, and
    an activation called once per block (three calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(7) for _ in range(3)])
        self.act = nn.Tanh()
        self.head = nn.Linear(7, 5)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = self.act(block(x))
        return self.head(x) * self.scale


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return Net().eval()


def make_data() -> torch.Tensor:
    return torch.randn(SAMPLES, 7, generator=torch.Generator().manual_seed(3))


def batches(data: torch.Tensor):
    return [(i, data[s:s + BATCH], None) for i, s in enumerate(range(0, len(data), BATCH))]


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    whole = {n: p.detach().clone() for n, p in model.named_parameters()}
    blocks = choose_blocks(model)
    plan = ShardPlan.of(model, blocks, world)
    shard_model(model, blocks, torch.device("cpu"))
    for name, p in model.named_parameters():  # each rank holds its rows, and only them
        rows = -(-whole[name].shape[0] // world)
        assert p.placements[0].is_shard(0), (name, p.placements)
        assert torch.equal(p.to_local(), whole[name][rank * rows:(rank + 1) * rows]), name
    held = local_param_bytes(model)
    hooks_before = {n: (len(m._forward_pre_hooks), len(m._forward_hooks)) for n, m in model.named_modules()}
    data = make_data()
    loaded = batches(data)
    stats = capture_dataset_sharded(model, lambda i: loaded[i][1:], len(loaded))
    # every hook off: the modules' (FSDP2's own stay), and those on the gathered parameters
    assert hooks_before == {n: (len(m._forward_pre_hooks), len(m._forward_hooks)) for n, m in model.named_modules()}
    for m in model.modules():
        if isinstance(m, FSDPModule):
            for group in m._get_fsdp_state()._fsdp_param_groups:
                for fsdp_param in group.fsdp_params:
                    assert not getattr(fsdp_param._unsharded_param, "_post_accumulate_grad_hooks", None)
    assert all(p.grad is None for p in model.parameters())  # nothing reduced, nothing accumulated
    # one capture of the sharded model would find no parameter gradient: refused in words
    for run, arg in ((capture, data[:BATCH]), (capture_dataset, loaded)):
        try:
            run(model, arg)
        except GradExplorerError as exc:
            assert "split over ranks" in str(exc) and "FSDP2" in str(exc), exc
        else:
            raise AssertionError("a capture of a sharded model was not refused")
    sizes: list = [None] * world
    dist.all_gather_object(sizes, held)
    merged = gather_to_rank0(stats)
    if rank == 0:
        assert merged is not None
        torch.save({"stats": merged.to_dict(), "blocks": blocks, "held": sizes, "plan_shard": plan.shard_bytes,
                    "whole": sum(t.numel() * t.element_size() for t in whole.values())}, out)
    dist.barrier()
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
