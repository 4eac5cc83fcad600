"""Choosing the split: memory and time models, the plan search, and measuring this machine.

- ``memory``: training memory on one device (weights, gradients, optimizer state, activations)
- ``memory_model``: memory per device under 3D parallelism (in-flight micro-batches from the simulator,
  model state sharded by the ZeRO stage)
- ``cost``: the time model of a training step (compute, TP/PP/DP communication, the bubble; DP/ZeRO
  traffic split into the part the backward hides and the part it exposes)
- ``planner``: the search over (dp, pp, tp, ZeRO stage, micro-batches, schedule, recomputation)
- ``calibration``: every timing and α–β fit of this machine's ranks

The devices and links themselves are described once, in ``parallel_lab.hardware``.
"""
