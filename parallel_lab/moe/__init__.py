"""Expert parallelism: a mixture of experts (``models.MoE``) with its experts spread over ranks.

Lesson 13 (lessons/13_mixture_of_experts.ipynb) runs it. The map, lowest first:

- ``cost``: what an all-to-all costs in the α–β model (pure; the planner's), and a MoE layer's four.
- ``mappings``: the all-to-all as an autograd function (its backward is the reverse all-to-all).
- ``layer``: ``ExpertParallelMoE.from_dense`` -- E experts on N ranks, E/N each, every rank routing
  its own tokens; dispatch and combine with ``all_to_all_single``.
- ``run``: ``parallel-lab run moe``, checked against the dense layer on one process (outputs, loss,
  every gradient, the same drops).
"""
