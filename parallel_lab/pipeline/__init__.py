"""Pipeline parallelism on real ranks: cut a model into stages, run any schedule, draw it.

    from parallel_lab.pipeline import run_pipeline
    run_pipeline("zb-h1", stages=4, microbatches=8)   # the `parallel-lab run pipeline --json` dict

Modules (one idea each): ``stages`` (cut a model), ``executor`` (run a schedule's actions on a rank),
``run`` (the parent side: check, launch, compare, predict, trace), ``pipedream`` (asynchronous 1F1B
with weight stashing), ``figures`` (plotly pictures and the schedule panel), the lessons' tables
and pictures ``schedule_figures`` (schedules compared), ``recompute_figures`` (recomputation's
trade-off) and ``pipedream_figures`` (weight versions), ``exercise`` (lesson 05's 1F1B check),
``bench`` (against ``torch.distributed.pipelining``). Schedules themselves are data in ``parallel_lab.schedules``.
"""

from .executor import Executor, Link
from .run import run_pipeline
from .stages import ModelSpec

__all__ = ["Executor", "Link", "ModelSpec", "run_pipeline"]
