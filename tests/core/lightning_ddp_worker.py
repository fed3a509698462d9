"""One rank of a Lightning training on 2 CPU processes (gloo) watched by WatchCallback, run by
test_integration_lightning under torchrun:
``torchrun --standalone --nproc-per-node 2 -m tests.core.lightning_ddp_worker LOG FOLDER ddp|fsdp2``
(``fsdp2``: ModelParallelStrategy, each Linear and the module sharded with ``fully_shard``).
Each rank writes what its optimizer stepped with to ``FOLDER/truth<rank>.json``."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch.distributed.fsdp import fully_shard

from gradexplorer.integrations.lightning import WatchCallback
from tests.core.test_integration_lightning import CLIP, data, module_class
from tests.optimizer_steps import OptimizerSteps


def main() -> None:
    log, folder, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if mode == "fsdp2":
        class Sharded(module_class("lightning.pytorch")):
            def configure_model(self) -> None:
                for layer in (self.net[0], self.net[2]):
                    fully_shard(layer, mesh=self.device_mesh["data_parallel"])
                fully_shard(self, mesh=self.device_mesh["data_parallel"])

        model = Sharded()
        strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, process_group_backend="gloo")
    else:
        model = module_class("lightning.pytorch")()
        strategy = DDPStrategy(process_group_backend="gloo")
    trainer = pl.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy=strategy,
                         max_steps=3, accumulate_grad_batches=2, gradient_clip_val=CLIP, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, callbacks=[WatchCallback(log, every=1)])
    with OptimizerSteps(model) as truth:
        trainer.fit(model, data(64))
    (folder / f"truth{dist.get_rank()}.json").write_text(json.dumps({"grad": truth.grad, "update": truth.update}))
    # DDP holds the process group: drop it while Python is whole (docs/watch-and-timeline.md).
    dist.barrier()
    del trainer, model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
