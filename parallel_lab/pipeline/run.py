"""``parallel-lab run pipeline``: a schedule on real ranks, checked against one process and the simulator.

    from parallel_lab.pipeline import run_pipeline
    result = run_pipeline("1f1b", ranks=4, microbatches=8, trace="1f1b.json")
    result["max_grad_diff"], result["bubble_measured"], result["bubble_predicted"]

What happens (the four uses of one schedule, ARCHITECTURE.md):
1. everything is checked here, before a process starts: the schedule (``schedules.build`` and
   ``validate``), the model sizes, that the batch splits into equal microbatches, the world size;
2. every rank (``pipeline_rank``) rebuilds the same model from the seed, keeps its stages, and runs
   the schedule with ``executor.Executor`` (one warm-up step, then the recorded step);
3. the loss and every gradient are compared with one process running the whole batch
   (``stages.reference``);
4. the measured per-stage costs (medians of thread CPU time per F/B/I/W) and the same link model are
   fed to ``simulate`` to predict the bubble and peak activations, and both timelines are returned
   for ``figures`` and, with ``trace=``, written as a Chrome/Perfetto trace.

Two clocks are reported and never mixed: ``bubble_measured`` is on the *virtual* clock (what p
dedicated devices would show, see executor), ``bubble_wall`` on this machine's wall clock, where
ranks share fewer cores than there are ranks.
"""

from __future__ import annotations

import os
import statistics

import torch
import torch.distributed as dist

from parallel_lab.hardware import PCIE4, Link
from parallel_lab.pipeline.executor import Executor
from parallel_lab.pipeline.schedules import Action, Schedule, build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.pipeline.stages import DTYPES, ModelSpec, check_stages, cut, reference
from parallel_lab.pipeline.trace import write_trace
from parallel_lab.pipeline.validate import validate
from parallel_lab.runtime import launcher

DEFAULTS = {"mlp": dict(hidden=32, layers=8), "gpt": dict(hidden=32, layers=4, heads=2, seq=8, vocab=32)}
ROWS_PER_MICROBATCH = {"mlp": 4, "gpt": 2}
_DIGITS = 7  # timeline times rounded to 0.1 us: the JSON stays short, the pictures do not change


# ----------------------------------------------------------------------------------------------
# The rank side.


def build_executor(spec: ModelSpec, schedule: Schedule, rank: int, **options) -> Executor:
    """This rank's stages of ``spec`` cut for ``schedule``, in an Executor."""
    mine = {s for s, r in enumerate(schedule.stage_to_rank) if r == rank}
    stages = {st.index: st for st in cut(spec, schedule.n_stages, keep=mine) if st is not None}
    return Executor(schedule, stages, spec, rank, **options)


def pipeline_rank(spec: ModelSpec, schedule: Schedule, recompute: bool = False, link: Link = PCIE4,
                  warmup: int = 1, check: bool = True, grads: bool = True, fuse: bool = True,
                  tags: bool | None = None) -> dict:
    """Rank function: ``warmup`` unrecorded steps, then one recorded step. Returns this rank's
    ``loss`` (last stage only), ``records`` (per action, both clocks), ``bytes_sent`` and, with
    ``grads``, this rank's parameter gradients by global name. ``tags=False`` sends messages
    without tags, matched in order per pair of ranks as on NCCL (see ``Executor``)."""
    rank = dist.get_rank()
    ex = build_executor(spec, schedule, rank, recompute=recompute, link=link, check=check, fuse=fuse,
                        tags=tags)
    x, target = spec.data()
    for _ in range(warmup):  # first calls allocate and warm caches: keep them out of the timeline
        ex.step(x, target)
        ex.zero_grad()
    ex.record = True
    loss = ex.step(x, target)
    out = {"rank": rank, "loss": loss, "records": ex.records, "bytes_sent": ex.bytes_sent,
           "message_bytes": ex.message_bytes}
    if grads:
        out["grads"] = {name: p.grad for w in ex.workers.values() for name, p in zip(w.names, w.params)}
    return out


# ----------------------------------------------------------------------------------------------
# Checks before anything starts.


def make_spec(model: str, microbatches: int, dtype, seed: int, **sizes) -> ModelSpec:
    """The ModelSpec of a run, with the course defaults filled in; raises ValueError naming the
    broken invariant with its values."""
    if model not in DEFAULTS:
        raise ValueError(f"model must be one of {tuple(DEFAULTS)}, got {model!r}")
    given = {k: v for k, v in sizes.items() if v is not None}
    batch = given.pop("batch", ROWS_PER_MICROBATCH[model] * microbatches)
    if isinstance(batch, int) and not isinstance(batch, bool) and batch % microbatches:
        raise ValueError(f"batch {batch} is not divisible by microbatches {microbatches} "
                         f"(microbatches must be equal for the loss to be the whole-batch mean)")
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype must be float64 or float32, got {dtype!r}")
    return ModelSpec(model=model, batch=batch, seed=seed, dtype=name, **{**DEFAULTS[model], **given})


def plan(schedule: str | Schedule = "1f1b", ranks: int = 4, microbatches: int = 8, model: str = "mlp",
         virtual: int = 1, dtype=torch.float64, seed: int = 0, **sizes) -> tuple[Schedule, ModelSpec]:
    """The validated schedule and model of a run (raises ScheduleError / ValueError; starts nothing).
    ``schedule`` is a name, built for ``ranks``, ``microbatches`` and ``virtual``, or a Schedule
    (a student's, say), which carries its own."""
    if isinstance(schedule, Schedule):
        sched = validate(schedule)
    else:
        launcher.check_world_size(ranks)
        sched = validate(build(schedule, ranks, microbatches, virtual))
    launcher.check_world_size(sched.n_ranks)
    spec = make_spec(model, sched.n_microbatches, dtype, seed, **sizes)
    check_stages(spec, sched.n_stages)
    return sched, spec


# ----------------------------------------------------------------------------------------------
# The parent side.


def run_pipeline(schedule: str | Schedule = "1f1b", ranks: int = 4, microbatches: int = 8, model: str = "mlp",
                 virtual: int = 1, recompute: bool = False, trace: str | None = None, dtype=torch.float64,
                 seed: int = 0, *, hidden: int | None = None, layers: int | None = None,
                 batch: int | None = None, link: Link = PCIE4, warmup: int = 1,
                 timeout: float = 60.0) -> dict:
    """``parallel-lab run pipeline --json``: run ``schedule`` on ``ranks`` ranks, check it, predict it.

    ranks is p (model stages: p, or p*virtual, or 2p for zb-v); a Schedule object brings its own p, m
    and v (see ``plan``). Returns
    ``schedule, stages, microbatches, max_grad_diff, loss_diff, bubble_measured (virtual clock),
    bubble_predicted, bubble_wall (wall clock), peak_activations`` (per model stage, measured) and
    more: ``peak_activations_predicted``, ``peak_bytes``, ``bytes_sent`` per rank, per-stage
    ``costs`` and ``timeline`` (``virtual``, ``wall``, ``predicted``: per rank ``[action, start,
    end]``; ``memory``: per stage ``[time on the virtual clock, stashed, bytes]``).
    """
    sched, spec = plan(schedule, ranks, microbatches, model, virtual, dtype, seed,
                       hidden=hidden, layers=layers, batch=batch)
    kwargs = dict(spec=spec, schedule=sched, recompute=recompute, link=link, warmup=warmup)
    answers = launcher.run(pipeline_rank, sched.n_ranks, kwargs=kwargs, timeout=timeout)
    return report(sched, spec, answers, recompute=recompute, link=link, trace=trace)


def pipeline_jobs(jobs: list[dict]) -> list[dict]:
    """Rank function: ``pipeline_rank(**job)`` for each job, in one launch (the tests use it)."""
    return [pipeline_rank(**job) for job in jobs]


def report(sched: Schedule, spec: ModelSpec, ranks: list[dict], *, recompute: bool = False,
           link: Link = PCIE4, trace=None) -> dict:
    """The run_pipeline dict from the ranks' answers: compared with ``stages.reference(spec)``,
    analysed against the simulator, and written to ``trace`` when given."""
    result = {
        "schedule": sched.name, "stages": sched.n_ranks, "microbatches": sched.n_microbatches,
        "virtual": sched.virtual, "model_stages": sched.n_stages, "model": spec.model,
        "recompute": recompute, "dtype": spec.dtype, "batch": spec.batch, "hidden": spec.hidden,
        "layers": spec.layers, **compare(ranks, reference(spec)), **analyse(sched, ranks, link),
    }
    if trace:
        write_trace(result, trace)
        result["trace"] = os.fspath(trace)
    return result


def compare(ranks: list[dict], ref: dict) -> dict:
    """Loss and gradient differences against the single-process reference."""
    grads = {name: g for r in ranks for name, g in r.get("grads", {}).items()}
    missing = sorted(set(ref["grads"]) - set(grads))
    if missing:
        raise RuntimeError(f"no rank returned gradients for {missing[:4]} ({len(missing)} parameters)")
    diffs = {n: (grads[n] - g).abs().max().item() for n, g in ref["grads"].items()}
    loss = next(r["loss"] for r in ranks if r["loss"] is not None)
    return {"loss": loss, "loss_diff": abs(loss - ref["loss"]), "max_grad_diff": max(diffs.values()),
            "grad_diffs": diffs}


def measured_costs(schedule: Schedule, ranks: list[dict], link: Link) -> Costs:
    """Per model stage, the median thread CPU time of each kind of action, and the link model."""
    samples: dict = {}
    for r in ranks:
        for rec in r["records"]:
            a = Action.parse(rec["action"])
            samples.setdefault((a.kind, a.stage), []).append(rec["cpu"])

    def median(kind):
        return [max(statistics.median(samples[kind, s]), 1e-9) if (kind, s) in samples else None
                for s in range(schedule.n_stages)]

    f, b, i, w = (median(k) for k in "FBIW")
    if schedule.split_backward:
        b = [x + y for x, y in zip(i, w)]
    else:
        i = w = None
    return Costs(F=f, B=b, I=i, W=w, latency=link.latency, bandwidth=link.bandwidth,
                 bytes_per_message=float(ranks[0]["message_bytes"]))


def _bubble(per_rank: list[list], n_ranks: int) -> tuple[float, float]:
    """(bubble fraction, makespan) of per-rank [action, start, end] lists, time 0 = the common start."""
    busy = sum(e - s for timed in per_rank for _, s, e in timed)
    makespan = max((timed[-1][2] for timed in per_rank if timed), default=0.0)
    return (1.0 - busy / (n_ranks * makespan) if makespan else 0.0), makespan


def _round(x: float) -> float:
    return round(x, _DIGITS)


def analyse(schedule: Schedule, ranks: list[dict], link: Link) -> dict:
    """Measured and predicted bubble, peaks, bytes and the timelines (see run_pipeline)."""
    clocks = {clock: [[[rec["action"], _round(rec[clock][0]), _round(rec[clock][1])] for rec in r["records"]]
                      for r in ranks] for clock in ("virtual", "wall")}
    bubble, makespan = _bubble(clocks["virtual"], schedule.n_ranks)
    bubble_wall, makespan_wall = _bubble(clocks["wall"], schedule.n_ranks)
    costs = measured_costs(schedule, ranks, link)
    predicted = simulate(schedule, costs)
    memory = memory_series(schedule, ranks)
    return {
        "bubble_measured": bubble, "bubble_predicted": predicted.bubble_fraction, "bubble_wall": bubble_wall,
        "makespan_measured": makespan, "makespan_predicted": predicted.makespan, "makespan_wall": makespan_wall,
        "clocks": {"virtual": "thread CPU time per action + modelled link (p dedicated devices)",
                   "wall": f"time.perf_counter on this machine ({os.cpu_count()} cores shared by "
                           f"{schedule.n_ranks} ranks)"},
        "peak_activations": [max((c for _, c, _ in series), default=0) for series in memory],
        "peak_activations_predicted": predicted.peak_activations,
        "peak_bytes": [max((b for _, _, b in series), default=0) for series in memory],
        "bytes_sent": [r["bytes_sent"] for r in ranks],
        "link": {"latency_s": link.latency, "bandwidth_Bps": link.bandwidth,
                 "message_bytes": ranks[0]["message_bytes"]},
        "costs": {k: getattr(costs, k) for k in "FBIW"},
        "timeline": {**clocks, "predicted": [[[str(a), _round(s), _round(e)] for a, s, e in timed]
                                             for timed in predicted.ranks],
                     "memory": memory},
    }


def memory_series(schedule: Schedule, ranks: list[dict]) -> list[list]:
    """Per model stage, ``[virtual time, stashed microbatches, bytes]`` after each change: a stash
    grows when its F starts and shrinks when its B or I ends (the simulator's accounting)."""
    series: list[list] = [[[0.0, 0, 0]] for _ in range(schedule.n_stages)]
    for r in ranks:
        for rec in r["records"]:
            a = Action.parse(rec["action"])
            t = rec["virtual"][0] if a.kind == "F" else rec["virtual"][1]
            series[a.stage].append([_round(t), rec["stashed"], rec["bytes"]])
    return series
