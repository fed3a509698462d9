"""Statistics of tensors: one float64 formula computed where the tensor lives, and statistics
that merge exactly across batches, steps and ranks.

Modules
-------
record
    ``TensorStats``: the statistics record of one tensor (a ``TypedDict``), and its keys.
tensor_stats
    ``tensor_stats``: the summary of one tensor (moments, norms, non-finite counts,
    histogram).
moments
    The one formula every path ends in (``stats_from_moments``), Chan's merge, the
    histogram's sample and range, and the torch operations' path.
cpu
    The fused numba pass on the CPU.
cpu_kernels
    Its numba kernels (compiled on first use).
immediate
    Small CPU tensors taken the moment they are handed over, summarised together.
pending
    Statistics computed together, written into a capture's records when they are first read.
device
    The fused Triton kernels for GPU tensors, read without waiting on the GPU.
batched
    Many tensors' statistics in a fixed number of operations.
merge
    ``MergeStats``: statistics that merge exactly (Chan's formula).
merge_cpu
    ``MergeStats`` of a float32 CPU tensor in compiled passes.
merge_kernels
    Their numba kernels.
"""

__all__ = ["record", "tensor_stats", "moments", "cpu", "cpu_kernels", "immediate", "pending", "device",
           "batched", "merge", "merge_cpu", "merge_kernels"]
