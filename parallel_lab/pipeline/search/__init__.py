"""Letting the machine find the schedule: a search under a memory cap, and an exact solver to measure it.

    from parallel_lab.pipeline.search import api
    found = api.search(ranks=4, microbatches=12, max_activations=4)        # F = I = W = 1
    found.schedule, found.makespan, found.peak_rank_activations          # a validated Schedule
    api.front(ranks=4, microbatches=12, caps=(1, 2, 3, 4, 8))              # (cap, makespan) points

- ``problem``: what is searched -- ranks, micro-batches, a placement ("wave": stage r on rank r;
  "v": two stages per rank in V order, as ZB-V and DualPipeV), per-stage costs of F, I, W (and B)
  and the link, a memory cap per rank counted as ``pipeline.simulate`` counts activations; and the
  evaluation of one candidate order (makespan, spans, peak memory)
- ``greedy``: list scheduling with rules after the Zero Bubble authors' automatic scheduler
  (Qi et al. 2023, section 3, and their ``auto_schedule.py``): variants of when to admit a new
  micro-batch, whether to fill a gap with a W, and what to prefer
- ``blocks``: the V-shape building blocks of Qi et al. 2024 ("Pipeline Parallelism with
  Controllable Memory"): V-Min and V-Half, repeated, their W's placed in the gaps
- ``improve``: local search on a found order (moving one action), kept when the step shortens
- ``exact``: the optimum of small cases with OR-Tools' CP-SAT (an optional dependency at run time)
- ``api``: ``search``, ``front`` and ``profile_stages`` (costs measured on real ranks)

Nothing here starts a process except ``api.profile_stages``; this ``__init__`` imports nothing.
"""
