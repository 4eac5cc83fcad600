"""``parallel-lab run pipeline``: a schedule on real ranks, checked against one process and the simulator.

    from parallel_lab.pipeline import run_pipeline
    result = run_pipeline("1f1b", ranks=4, microbatches=8, trace="1f1b.json")
    result["max_grad_diff"], result["bubble_measured"], result["bubble_predicted"]

What happens (the four uses of one schedule, ARCHITECTURE.md):
1. everything is checked here, before a process starts: the schedule (``schedules.build`` and
   ``validate``), the model sizes, that the batch splits into equal microbatches, the world size;
2. every rank (``pipeline_rank``) rebuilds the same model from the seed, keeps its stages, and runs
   the schedule with ``executor.Executor`` (one warm-up step, then ``STEPS`` recorded steps, of
   which the one with the median makespan is reported);
3. the loss and every gradient are compared with one process running the whole batch
   (``stages.reference``);
4. the measured costs (medians of thread CPU time per kind of action, stage and kind of action
   before it, over every recorded step: ``measured_durations``) and the same link model are fed to
   ``simulate`` to predict the bubble and peak activations, and both timelines are returned for
   ``show.pipeline`` and, with ``trace=``, written as a Chrome/Perfetto trace.

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
from parallel_lab.pipeline.simulate import M_W_SHARE, Costs, simulate, units
from parallel_lab.pipeline.stages import DTYPES, ModelSpec, check_stages, cut, reference
from parallel_lab.pipeline.trace import write_trace
from parallel_lab.pipeline.validate import validate
from parallel_lab.runtime import commlog, launcher

# Lesson 03 prints this (``i18n.source``): its docstring and comments are in the catalog too.
SHOWN_DOCSTRINGS = ("pipeline_rank",)
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


STEPS = 5  # recorded steps per run: the one with the median makespan is reported, all feed the costs


def pipeline_rank(spec: ModelSpec, schedule: Schedule, recompute: bool = False, link: Link = PCIE4,
                  warmup: int = 1, check: bool = True, grads: bool = True, fuse: bool = True,
                  tags: bool | None = None, steps: int = STEPS, share_memory: bool = True) -> dict:
    """Rank function: ``warmup`` unrecorded steps, then ``steps`` recorded ones (``recorded_steps``).
    Returns this rank's ``loss`` (last stage only), ``records`` (per action, both clocks, of the
    median step), ``samples`` (every recorded step's records), ``bytes_sent`` and, with ``grads``,
    this rank's parameter gradients by global name. ``tags=False`` sends messages without tags,
    matched in order per pair of ranks as on NCCL (see ``Executor``); ``share_memory=False`` keeps
    every message on torch.distributed."""
    rank = dist.get_rank()
    ex = build_executor(spec, schedule, rank, recompute=recompute, link=link, check=check, fuse=fuse,
                        tags=tags, share_memory=share_memory)
    out = {"rank": rank, **recorded_steps(ex, *spec.data(), warmup=warmup, steps=steps)}
    if grads:
        out["grads"] = {name: p.grad for w in ex.workers.values() for name, p in zip(w.names, w.params)}
    return out


def messages_rank(spec: ModelSpec, schedule: Schedule, share_memory: bool = True, depth: int | None = None,
                  steps: int = 2) -> dict:
    """Rank function: ``steps`` training steps (the last one recorded) inside ``commlog.recording``.
    Returns this rank's ``counts`` (``{op: {"count", "bytes"}}``), its pipeline ``neighbours``, those
    it reached through shared memory (``shared``), ``loss`` and ``grads``. ``depth``: slots per direction of a
    shared-memory link (small: the sender's queue for a full ring is used)."""
    rank = dist.get_rank()
    ex = build_executor(spec, schedule, rank, share_memory=share_memory, link_depth=depth)
    x, target = spec.data()
    with commlog.recording() as log:
        for i in range(steps):
            ex.zero_grad()
            ex.record = i == steps - 1
            loss = ex.step(x if rank == schedule.stage_to_rank[0] else None,
                           target if rank == schedule.stage_to_rank[-1] else None)
    return {"counts": log.as_dict(), "neighbours": ex.neighbours, "loss": loss,
            "shared": sorted(q for q, link in ex.links.items() if link),
            "grads": {name: p.grad for w in ex.workers.values() for name, p in zip(w.names, w.params)}}


def recorded_steps(ex: Executor, x, target, warmup: int = 1, steps: int = STEPS) -> dict:
    """``warmup`` unrecorded steps (first calls allocate and warm caches), then ``steps`` recorded
    ones. Every rank keeps the records of the same step, the one whose makespan on the virtual clock
    is the median over the ranks (a step's makespan is its latest end), so that one slow step on a
    busy machine is not the one reported; ``samples`` holds every step's records, for the costs.
    Gradients are left from the last step alone (each step starts from zero; steps are identical)."""
    for _ in range(warmup):
        ex.step(x, target)
        ex.zero_grad()
    ex.record = True
    runs = []
    for i in range(max(1, steps)):
        if i:
            ex.zero_grad()
        loss = ex.step(x, target)
        runs.append((ex.records[-1]["virtual"][1] if ex.records else 0.0, loss, ex.records, list(ex.w_bytes)))
    end = torch.tensor([r[0] for r in runs], dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(end, op=dist.ReduceOp.MAX)
    chosen = sorted(range(len(runs)), key=lambda i: (end[i].item(), i))[len(runs) // 2]
    _, loss, records, w_bytes = runs[chosen]
    return {"loss": loss, "records": records, "samples": [r[2] for r in runs], "bytes_sent": ex.bytes_sent,
            "message_bytes": ex.message_bytes, "w_bytes": w_bytes}


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
    (a student's, say), which carries its own. Its number of ranks is the launcher's to check
    (``launcher.prepare`` or ``launcher.run``, before any rank starts)."""
    sched = validate(schedule if isinstance(schedule, Schedule) else build(schedule, ranks, microbatches, virtual))
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

    ranks is p (model stages: p, or p*virtual, or 2p for zb-v and dualpipe-v); a Schedule object brings its own p, m
    and v (see ``plan``). Returns
    ``schedule, stages, microbatches, max_grad_diff, loss_diff, bubble_measured (virtual clock),
    bubble_predicted, bubble_wall (wall clock), peak_activations`` (per model stage, measured) and
    more: ``peak_activations_predicted``, ``peak_bytes``, ``bytes_sent`` per rank, per-stage
    ``costs`` and ``timeline`` (``virtual``, ``wall``, ``predicted``: per rank ``[action, start,
    end]``; ``memory``: per stage ``[time on the virtual clock, stashed, bytes]``).
    """
    sched, spec = plan(schedule, ranks, microbatches, model, virtual, dtype, seed,
                       hidden=hidden, layers=layers, batch=batch)
    # validated once, here: the ranks run this very schedule object, so they cannot disagree with it
    kwargs = dict(spec=spec, schedule=sched, recompute=recompute, link=link, warmup=warmup, check=False)
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


def _samples(ranks: list[dict]):
    """(action, kind before it on its rank or None for the step's first, thread CPU seconds) of every
    recorded action of every recorded step."""
    for r in ranks:
        for records in r.get("samples") or [r["records"]]:
            before = None
            for rec in records:
                a = Action.parse(rec["action"])
                yield a, before, rec["cpu"]
                before = a.kind


def measured_costs(schedule: Schedule, ranks: list[dict], link: Link) -> Costs:
    """Per model stage, the median thread CPU time of each kind of action, and the link model."""
    samples: dict = {}
    for a, _, cpu in _samples(ranks):
        samples.setdefault((a.kind, a.stage), []).append(cpu)

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


def measured_durations(schedule: Schedule, ranks: list[dict]) -> dict[Action, float]:
    """The prediction's cost of every action: the median thread CPU time, over every recorded step,
    of the actions of its kind on its stage that follow the same kind of action on their rank (or
    are the first of a step).

    Why not one median per kind and stage: on a CPU an action costs more when other work ran before
    it, as caches and branch predictors hold the last kind of work. Measured on the course MLP on 2
    cores: a backward right after a forward ~1.3-1.5x one after a backward, and a step's first
    action, after the barrier, ~1.5-2x any other forward. Those actions sit on the critical path
    (the start, the turn from forwards to backwards), so a prediction from plain medians came out
    10-20 % below the measured bubble."""
    samples: dict = {}
    for a, before, cpu in _samples(ranks):
        samples.setdefault((a.kind, a.stage, before), []).append(cpu)
    medians = {key: max(statistics.median(v), 1e-9) for key, v in samples.items()}
    durations = {}
    for actions in schedule.ranks:
        before = None
        for a in actions:
            if a is None:
                continue
            durations[a] = medians[a.kind, a.stage, before]
            before = a.kind
    return durations


def _bubble(per_rank: list[list], n_ranks: int) -> tuple[float, float]:
    """(bubble fraction, makespan) of per-rank [action, start, end] lists, time 0 = the common start."""
    busy = sum(e - s for timed in per_rank for _, s, e in timed)
    makespan = max((timed[-1][2] for timed in per_rank if timed), default=0.0)
    return (1.0 - busy / (n_ranks * makespan) if makespan else 0.0), makespan


def _round(x: float) -> float:
    return round(x, _DIGITS)


def typical_durations(ranks: list[dict]) -> dict[Action, float]:
    """Each action's median thread CPU time over every recorded step: the typical step."""
    samples: dict = {}
    for a, _, cpu in _samples(ranks):
        samples.setdefault(a, []).append(cpu)
    return {a: max(statistics.median(v), 1e-9) for a, v in samples.items()}


def analyse(schedule: Schedule, ranks: list[dict], link: Link) -> dict:
    """Measured and predicted bubble, peaks, bytes and the timelines (see run_pipeline).

    The measured virtual-clock timeline is the typical step: each action lasts the median of its own
    thread CPU time over the recorded steps, placed by the executor's clock rule (it starts when its
    rank is free and its input has arrived: the sender's clock plus the link), which is list
    scheduling, so ``simulate`` places it. The executor's own clock of one step is the same rule
    on one sample per action (``tests/test_pipeline_executor.py`` holds the two equal); a median per
    action keeps one slow sample -- another process took the core -- off the critical path. The wall
    clock is the median step's."""
    costs = measured_costs(schedule, ranks, link)
    share = w_share(schedule, ranks)
    typical = simulate(schedule, costs, w_share=share, durations=typical_durations(ranks))
    predicted = simulate(schedule, costs, w_share=share, durations=measured_durations(schedule, ranks))
    clocks = {"virtual": [[[str(a), _round(s), _round(e)] for a, s, e in timed] for timed in typical.ranks],
              "wall": [[[rec["action"], _round(rec["wall"][0]), _round(rec["wall"][1])] for rec in r["records"]]
                       for r in ranks]}
    bubble_wall, makespan_wall = _bubble(clocks["wall"], schedule.n_ranks)
    memory = memory_series(schedule, ranks, share, typical)
    return {
        "bubble_measured": typical.bubble_fraction, "bubble_predicted": predicted.bubble_fraction,
        "bubble_wall": bubble_wall, "makespan_measured": typical.makespan, "makespan_predicted": predicted.makespan,
        "makespan_wall": makespan_wall, "steps_recorded": len(ranks[0].get("samples") or [None]),
        "clocks": {"virtual": "median thread CPU time per action over the recorded steps + modelled link "
                              "(p dedicated devices)",
                   "wall": f"time.perf_counter on this machine ({os.cpu_count()} cores shared by "
                           f"{schedule.n_ranks} ranks), the median step",
                   "predicted": "median thread CPU time per kind of action, stage and kind of action "
                                "before it + modelled link"},
        "peak_activations": [units(max((c for _, c, _ in series), default=0)) for series in memory],
        "peak_activations_predicted": predicted.peak_activations, "w_share": share,
        "peak_bytes": [max((b for _, _, b in series), default=0) for series in memory],
        "bytes_sent": [r["bytes_sent"] for r in ranks],
        "link": {"latency_s": link.latency, "bandwidth_Bps": link.bandwidth,
                 "message_bytes": ranks[0]["message_bytes"]},
        "costs": {k: getattr(costs, k) for k in "FBIW"},
        "timeline": {**clocks, "predicted": [[[str(a), _round(s), _round(e)] for a, s, e in timed]
                                             for timed in predicted.ranks],
                     "memory": memory},
    }


def w_share(schedule: Schedule, ranks: list[dict]) -> float:
    """M_W / M_B as this run's tensors measured it: over every I, the bytes a microbatch keeps for its
    W against the bytes its whole stash held before (the paper's default when nothing is split)."""
    kept, full = (sum(r.get("w_bytes", (0, 0))[k] for r in ranks) for k in (0, 1))
    return kept / full if schedule.split_backward and full else M_W_SHARE


def memory_series(schedule: Schedule, ranks: list[dict], share: float = M_W_SHARE, timeline=None) -> list[list]:
    """Per model stage, ``[virtual time, activations in M_B, bytes]`` after each change, counted as
    the simulator does (``simulate.Timeline``): a microbatch holds 1 from the start of its F to the
    end of its B, or 1 until its I ends and ``share`` (M_W / M_B) until its W ends. Counts and bytes
    are what the executor held; times are ``timeline``'s (a simulate.Timeline), else the records'."""
    when = {} if timeline is None else {a: (s, e) for timed in timeline.ranks for a, s, e in timed}
    series: list[list] = [[[0.0, 0, 0]] for _ in range(schedule.n_stages)]
    for r in ranks:
        for rec in r["records"]:
            a = Action.parse(rec["action"])
            start, end = when.get(a, rec["virtual"])
            held = units(rec["stashed"] + share * rec.get("held", 0))
            series[a.stage].append([_round(start if a.kind == "F" else end), held, rec["bytes"]])
    return series
