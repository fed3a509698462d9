"""Two ranks of a dataset capture over a model sharded with FSDP2 (gloo, a file store, a
10 s timeout); rank 1 dies when it reads its second batch. Run by test_sharded_dataset:
``python -m tests.core.sharded_dataset_dead_rank_worker STOREFILE RANK``.

The survivor's next collective is FSDP2's all-gather in the forward of its second batch.
Started as two plain processes rather than by torchrun, whose agent kills every rank as
soon as one dies: here the survivor must end on its own, with the capture's message."""

from __future__ import annotations

import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from gradexplorer.base.errors import GradExplorerError
from gradexplorer.recording.shard_blocks import choose_blocks, shard_model
from gradexplorer.recording.sharded_dataset import capture_dataset_sharded
from tests.core.sharded_dataset_worker import batches, make_data, make_model

TIMEOUT_S = 10
DIES_AT = 3  # rank 1's second batch (rank r takes the batches b with b % 2 == r)


def main() -> None:
    store, rank = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=TIMEOUT_S))
    model = make_model()
    shard_model(model, choose_blocks(model), torch.device("cpu"))
    loaded = batches(make_data())

    def batch_of(index: int):
        if index == DIES_AT:
            os._exit(3)  # dies without a word, as a killed process does
        return loaded[index][1:]

    try:
        capture_dataset_sharded(model, batch_of, len(loaded))
    except GradExplorerError as exc:
        print(f"error: {exc}", flush=True)
        os._exit(1)  # the group cannot be destroyed cleanly with a dead peer
    except BaseException:  # noqa: BLE001 - anything else is the bug under test
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(2)
    print("finished", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
