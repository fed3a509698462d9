"""One rank of a Hugging Face Trainer on 2 CPU processes (gloo) watched by WatchCallback, run by
test_integration_transformers under torchrun:
``torchrun --standalone --nproc-per-node 2 -m tests.core.transformers_ddp_worker LOG FOLDER``.
Each rank writes what its optimizer stepped with to ``FOLDER/truth<rank>.json``."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch.distributed as dist

from tests.core.test_integration_transformers import train


def main() -> None:
    log, folder = Path(sys.argv[1]), Path(sys.argv[2])
    model, written, truth, _result = train(folder, log=log)
    assert written == log
    (folder / f"truth{dist.get_rank()}.json").write_text(json.dumps({"grad": truth.grad, "update": truth.update}))
    # The Trainer's DDP wrapper holds the process group: drop it while Python is whole.
    dist.barrier()
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
