"""Sharded data parallelism: ZeRO stages 0-3 (Rajbhandari et al. 2020) and FSDP (Zhao et al. 2023).

    memory     the model state per rank by stage, from Ψ and the largest unit (pure; the planner's)
    traffic    bytes per rank and step by stage: 2Ψ, 2Ψ, 2Ψ, 3Ψ; and the same from commlog (pure)
    adam       Adam on a flat shard, torch.optim.Adam's arithmetic
    engine     Zero: flat units, the hooks of each stage, the measured memory (rank side)
    overlap    the same engine with its collectives in flight during the compute (bucketed
               all-reduce as DDP, ZeRO-3 prefetch), and their placement on a virtual clock
    run        ``parallel-lab run zero``: checks, ranks, against one process with torch.optim.Adam

The model (``models.GPT``) is never edited: parameters become views of flat buffers and hooks do
the communication. ``parallel_lab.bench.zero`` holds ZeRO-3 against PyTorch's FSDP2.
"""
