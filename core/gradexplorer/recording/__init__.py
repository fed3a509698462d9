"""Recording over many steps or batches: the training-loop watch and its log, the dataset
capture, and the timeline read back from them.

Modules
-------
layer_recorder
    Hooks that record mergeable statistics of selected modules.
watch
    ``watch()``: a model inside the user's own training loop.
collective_failure
    A collective that a dead or stopped rank broke, recognised and said in one message.
sharded
    Which part of a tensor sharded over ranks (an FSDP2 ``DTensor``) a rank counts, and
    whether the ranks run the same samples (tensor parallelism).
watch_log
    The ``.gxw`` log (SQLite, one transaction per step).
dataset_capture
    ``capture_dataset()``: every batch captured and merged exactly, also under
    torch.distributed.
dataset_memory
    What a dataset capture holds and needs while it runs, replicated or sharded.
shard_blocks
    A model's blocks, and the model sharded over the ranks with FSDP2 per block.
sharded_dataset
    ``capture_dataset_sharded()``: the dataset capture over a model sharded with FSDP2.
timeline
    Arrays over steps from a watch log or a dataset capture.
"""

__all__ = ["layer_recorder", "collective_failure", "sharded", "watch", "watch_log", "dataset_capture", "dataset_memory",
           "shard_blocks", "sharded_dataset", "timeline"]
