"""Pipeline (inter-layer) parallelism: schedules as data, and the passes over them.

    schedules -> validate -> communication -> simulate -> executor (on ranks) -> trace

- ``schedules``: per rank, an ordered list of actions (``1F3``); the generators of GPipe, 1F1B,
  interleaved 1F1B, ZB-H1, ZB-V, and ``build`` by name
- ``validate``: every action once, in dependency order, deadlock-free (before any process starts)
- ``communication``: the sends and receives a schedule implies, in program order
- ``simulate``: per-stage costs -> a timeline (bubble, makespan, activation memory)
- ``stages``: cut a model into stages (the same in every process); ``worker``: F, B, I, W of one stage
- ``executor``: run one rank's actions for real; ``run``: the parent side (check, launch, compare,
  predict); ``trace``: the Chrome/Perfetto trace
- ``profile``, ``partition``, ``balance``: measure layers, cut them into balanced stages
- ``pipedream``: asynchronous 1F1B with weight stashing

Nothing here draws: the pictures are in ``parallel_lab.show``. This ``__init__`` imports nothing, so
``parallel-lab schedule`` (schedules + simulate: numpy only) does not pay torch's ~3 s import.
"""
