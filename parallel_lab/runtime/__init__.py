"""Ranks on this machine: simulated GPUs (one CPU process each, gloo), and what they say.

- ``launcher``: run an importable function on N rank processes (forkserver pool, failures by rank)
- ``torchrun``: the same functions on real machines under torchrun (NCCL on GPUs)
- ``commlog``: every torch.distributed call of a rank, described, counted and timed
- ``collectives``: who holds what before and after a collective; ring all-reduce from send/recv
- ``mesh``: the (dp, pp, tp) rank grid and its process groups
- ``demos``: small rank functions (hello world and every failure mode)
"""
