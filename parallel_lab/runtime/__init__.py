"""Ranks on this machine: simulated GPUs (one CPU process each, gloo), and what they say.

- ``launcher``: run an importable function on N rank processes (the entry point: ``launcher.run``)
  - ``prelaunch``: the checks made before any process starts
  - ``pool``: the kernel's rank processes (forkserver), answers and failures collected by rank
  - ``rank_process``: a rank's loop, its messages, and the plain-data reader for untrusted ranks
  - ``errors``: RankError, RankDied, RanksHung
  - ``allocator``: glibc's malloc thresholds fixed, so a rank keeps its freed memory between steps
- ``torchrun``: the same functions on real machines under torchrun (NCCL on GPUs)
- ``commlog``: every torch.distributed call of a rank, described, counted and timed
- ``transport``: ``all_reduce`` the package's layers call (shared memory, one shot, or gloo's own)
- ``shared_memory``: whether ranks of one host can share memory, its files and wait, and a pair's links
  (the pipeline's messages)
- ``shared_channel``: a group's /dev/shm slots and flags: the all-reduce through shared memory
- ``collectives``: lesson 01's collectives (who holds what before and after) and its ring all-reduce
- ``mesh``: the (dp, pp, tp) rank grid and its process groups
- ``demos``: small rank functions (hello world and every failure mode)
"""
