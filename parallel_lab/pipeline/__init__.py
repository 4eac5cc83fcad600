"""Pipeline (inter-layer) parallelism: schedules as data, and the passes over them.

    schedules -> validate -> communication -> simulate -> executor (on ranks) -> trace

- ``actions``: a schedule as data, per rank an ordered list of actions (``1F3``), read from plain
  lists (``as_schedule``) and drawn as a text grid
- ``schedules``: the generators of GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-V and DualPipeV, and
  ``build`` by name (``SCHEDULES``, ``V_SHAPED``)
- ``validate``: every action once, in dependency order, deadlock-free (before any process starts)
- ``communication``: the sends and receives a schedule implies, in program order
- ``simulate``: per-stage costs -> a timeline (bubble, makespan, activation memory)
- ``stages``: cut a model into stages (the same in every process); ``worker``: F, B, I, W of one
  stage with autograd, and its memory; ``chain``: the same by hand for a Linear+GELU stage (the MLP);
  ``activation_bytes``: the one count of the bytes saved tensors hold
- ``executor``: run one rank's actions for real, in one loop, with ``messages`` (receives posted
  ahead, sends that never block) and ``recording`` (both clocks, a record per action); ``run``: the
  parent side (check, launch, compare, predict); ``trace``: the Chrome/Perfetto trace
- ``profile``, ``partition``, ``balance``: measure layers, cut them into balanced stages
- ``pipedream``: asynchronous 1F1B with weight stashing, on the executor (its worker hook)
- ``search``: the schedule search under a memory cap (a folder); ``pytorch_csv`` and
  ``pytorch_runtime``: a schedule as PyTorch's CSV, and that CSV on PyTorch's own runtime
- ``post_validation``: the optimizer step after a pipeline step with gradient clipping, synchronised
  by an all-reduce or post-validated (Qi et al. 2023, section 4), on real ranks

Nothing here draws: the pictures are in ``parallel_lab.show``. This ``__init__`` imports nothing, so
``parallel-lab schedule`` (schedules + simulate: numpy only) does not pay torch's ~3 s import.
"""
