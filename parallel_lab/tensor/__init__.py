"""Tensor (intra-layer) parallelism as in Megatron-LM (Shoeybi et al. 2019), with sequence
parallelism (Korthikanti et al. 2022), on real ranks.

- ``mappings``: the communication ops (f, g and their sequence-parallel halves)
- ``layers``: parallel layers cut from dense modules, and the vocabulary-parallel loss
- ``plan``: ``parallelize(model, plan, group)`` and ``check_tensor_parallel`` (no processes)
- ``run``: rank functions and ``run_tensor``, the ``parallel-lab run tensor`` command
- ``dtensor``: the same plans with PyTorch's DTensor ``parallelize_module`` (the peer that
  ``parallel_lab.bench.tensor`` times ours against)
- ``demos``: lesson 02's rank functions
"""

from parallel_lab.tensor.layers import (
    ColumnParallelLinear,
    ParallelEmbeddings,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
    VocabParallelEmbedding,
    allreduce_sequence_parallel_grads,
    vocab_parallel_cross_entropy,
)
from parallel_lab.tensor.mappings import (
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
)
from parallel_lab.tensor.plan import check_tensor_parallel, default_plan, parallelize

__all__ = [
    "ColumnParallelLinear", "ParallelEmbeddings", "ParallelMLP", "ParallelSelfAttention",
    "RowParallelLinear", "VocabParallelEmbedding", "allreduce_sequence_parallel_grads",
    "vocab_parallel_cross_entropy", "copy_to_tensor_parallel_region",
    "gather_from_sequence_parallel_region", "gather_from_tensor_parallel_region",
    "reduce_from_tensor_parallel_region", "reduce_scatter_to_sequence_parallel_region",
    "scatter_to_sequence_parallel_region", "scatter_to_tensor_parallel_region",
    "check_tensor_parallel", "default_plan", "parallelize",
]
