"""One rank of an FSDP2 training watched with gloo (run by test_watch_fsdp under torchrun):
``torchrun --standalone --nproc-per-node 2 -m tests.core.watch_fsdp_worker LOG MODE DUMP``.

MODE: ``fp32``, ``bf16`` (a ``MixedPrecisionPolicy`` computing in bfloat16),
``keep`` (``reshard_after_forward=False``), ``per_rank``, or ``tp``: tensor parallelism on
a 1-D mesh instead of FSDP2 (the first ``Linear`` column-wise, the second row-wise, the
last plain), every rank on the whole batch; ``tp_dtensor``: the same with DTensor outputs
(``use_local_output=False``: the column-wise output a ``Shard(-1)`` DTensor, the row-wise
one left ``Partial()``, the last ``Linear`` row-wise on the replicated ``Tanh`` output);
``fsdp_tp`` (4 processes): FSDP2 over the ``tp`` model on a 2 × 2 mesh (``dp``, ``tp``),
each ``dp`` half of the ranks on its half of the batch.
Rank 0 also saves,
for the test only, every parameter's full gradient and weights at each step
(``DTensor.full_tensor``) to DUMP: the statistics the watch merged from shards are checked
against them.
"""

from __future__ import annotations

import gc
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gradexplorer.recording.watch import watch

STEPS = 2
PER_RANK = 4


def make_model() -> nn.Module:
    # Rows that do not split evenly over 2 ranks (7, 5), and a bias of one row: rank 1
    # holds an empty shard of it.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 7), nn.ReLU(), nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 1))


def make_tp_model() -> nn.Module:
    # Tensor parallelism needs features that split evenly (a local output is taken as an even shard).
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 1))


def make_batches(world: int = 2):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(world * PER_RANK, 12, generator=g), torch.randn(world * PER_RANK, 1, generator=g))
            for _ in range(STEPS)]


def shard(model: nn.Module, mode: str) -> nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict = {}
    if mode == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    if mode == "keep":
        kwargs["reshard_after_forward"] = False
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def tensor_parallel(model: nn.Module, mode: str = "tp") -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if mode == "tp_dtensor":
        return parallelize_module(model, mesh, {
            "0": ColwiseParallel(use_local_output=False),
            "2": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Partial(), use_local_output=False),
            "4": RowwiseParallel(input_layouts=Replicate())})
    return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def fsdp_over_tensor_parallel(model: nn.Module) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"])


def whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def main() -> None:
    out, mode, dump = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = mode.startswith("tp")
    if mode == "fsdp_tp":
        model, batches = fsdp_over_tensor_parallel(make_tp_model()), make_batches(2)
        shares, share = 2, rank // 2  # the dp coordinate
    else:
        model = tensor_parallel(make_tp_model(), mode) if tp else shard(make_model(), mode)
        batches = make_batches(world)
        shares, share = (1, 0) if tp else (world, rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    saved: list[dict] = []
    with watch(model, out=out, every=1, per_rank=(mode == "per_rank")) as w:
        for x, y in batches:
            xs, ys = x.chunk(shares)[share], y.chunk(shares)[share]
            weights = {n: whole(p.detach()).clone() for n, p in model.named_parameters()}
            loss = F.mse_loss(model(xs), ys)
            opt.zero_grad()
            loss.backward()
            grads = {n: whole(p.grad).clone() for n, p in model.named_parameters()}
            opt.step()
            w.step(loss=loss)
            saved.append({"weights": weights, "grads": grads})
    if rank == 0:
        torch.save(saved, dump)
    dist.barrier()
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
