"""Context parallelism: the sequence split over cp ranks, for sequences too long for one device's
attention scores (lessons/14_long_context.ipynb; ARCHITECTURE.md, layer 3).

- ``blockwise``: attention one block at a time with its log-sum-exp, the online-softmax merge, one
  block's backward, the zig-zag split (load balancing under a causal mask), the score meter (pure)
- ``ring``: ring attention (Liu et al. 2023), K/V blocks around the ring with isend/irecv, its
  backward written out
- ``ulysses``: DeepSpeed-Ulysses (Jacobs et al. 2023), all-to-all sequence split <-> head split
- ``cost``: bytes, α–β seconds and score memory per rank and step of both (pure, for the planner)
- ``run``: ``ContextParallelAttention``, rank functions and ``run_context``, the ``parallel-lab run
  context`` command, checked against the dense attention on one process
- ``peer``: PyTorch's ``context_parallel``, and what of it runs on CPU ranks (``probe``); timed beside
  ours in ``parallel_lab.bench.context``
"""
