"""``parallel-lab run zero``: ZeRO stage 0-3 training on real ranks, checked against one process.

    from parallel_lab.zero.run import run_zero
    r = run_zero(stage=3, dp=4, steps=3)
    r["max_param_diff"], r["loss_diff"]                 # ~1e-16: the same training as one process
    r["memory_per_rank"]["optimizer"]                   # {"measured": bytes, "predicted": bytes}
    r["traffic_per_step"]                               # {"measured": 3Ψ bytes, "predicted": 3Ψ bytes}

1. ``plan`` checks everything before a process starts (the stage, dp against the launcher's cap,
   equal batch slices, the step count);
2. every rank (``zero_rank``) builds the same GPT from the seed, hands it to ``engine.Zero`` and
   trains ``steps`` Adam steps on its ``batch / dp`` rows, each step recorded by ``commlog``;
3. the parent (``report``) compares the per-step losses and every final parameter (gathered) with
   one process training the whole batch with ``torch.optim.Adam`` (``reference``), and the measured
   memory and traffic with ``zero.memory`` and ``zero.traffic``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from parallel_lab import models
from parallel_lab.checks import positive_int, positive_number
from parallel_lab.hardware import PCIE4, Link
from parallel_lab.runtime import commlog, launcher
from parallel_lab.zero import memory, traffic
from parallel_lab.zero.engine import Zero, gpt_units
from parallel_lab.zero.overlap import Recorder, place, serial

# 4 blocks of hidden 64: the blocks (50k parameters each) dominate, as in a real GPT.
DEFAULT_CONFIG = models.GPTConfig(vocab=96, seq=16, hidden=64, heads=4, layers=4)
MODELS = ("gpt",)
DTYPES = {"float64": torch.float64, "float32": torch.float32}
DEFAULTS = dict(steps=3, batch=8, lr=1e-2, seed=0)


@dataclasses.dataclass(frozen=True)
class ZeroRun:
    """One checked run: the stage, dp ranks, the model and how it trains."""

    stage: int
    dp: int
    model: str = "gpt"
    config: models.GPTConfig = DEFAULT_CONFIG
    steps: int = DEFAULTS["steps"]
    batch: int = DEFAULTS["batch"]
    lr: float = DEFAULTS["lr"]
    seed: int = DEFAULTS["seed"]
    dtype: str = "float64"
    overlap: bool = False  # collectives in flight during the compute (zero.overlap)
    link: Link = PCIE4  # what the virtual clock charges a collective


def plan(stage: int, dp: int, model: str = "gpt", steps: int = DEFAULTS["steps"], batch: int = DEFAULTS["batch"],
         lr: float = DEFAULTS["lr"], seed: int = DEFAULTS["seed"], dtype: str = "float64",
         config: models.GPTConfig = DEFAULT_CONFIG, overlap: bool = False, link: Link = PCIE4) -> ZeroRun:
    """The checked run (raises ValueError naming the broken invariant and its values; starts nothing)."""
    memory.check_stage(stage)
    dp = positive_int("dp", dp)
    if dp > launcher.MAX_WORLD_SIZE:
        raise ValueError(f"dp {dp} > {launcher.MAX_WORLD_SIZE}, the launcher's cap on ranks (simulated ranks "
                         f"share this machine's cores)")
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    steps, batch = positive_int("steps", steps), positive_int("batch", batch)
    if batch % dp:
        raise ValueError(f"batch {batch} % dp {dp} != 0: every rank needs an equal slice of the batch for "
                         f"the mean of their losses to be the batch's mean loss")
    positive_number("lr", lr)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    return ZeroRun(stage, dp, model, config, steps, batch, lr, seed, dtype, bool(overlap), link)


def unit_sizes(config: models.GPTConfig) -> dict:
    """``{unit name: parameter count}`` of the GPT's units (no process needed)."""
    model = models.GPT(config, seed=0)
    return {name: sum(p.numel() for p in m.parameters()) for name, m in gpt_units(model)}


def predicted(run: ZeroRun) -> dict:
    """``memory`` per category and ``traffic`` per step from Ψ, the largest unit and the formulas."""
    sizes = unit_sizes(run.config)
    params, value_bytes = sum(sizes.values()), DTYPES[run.dtype].itemsize
    return {"params": params, "largest_unit": max(sizes.values()), "units": sizes,
            "memory": memory.per_rank(params, run.dp, run.stage, value_bytes, unit=max(sizes.values()),
                                      overlap=run.overlap),
            "traffic": traffic.per_step(params, run.dp, run.stage, value_bytes)}


# ----------------------------------------------------------------------------------------------
# Both sides of the check.


def reference(run: ZeroRun) -> dict:
    """One process, the whole batch, ``torch.optim.Adam``: per-step ``losses`` and the final ``state``.

    On one thread, as each rank: another thread count sums the matrix products in another order,
    and Adam magnifies those last bits where a gradient is near zero (measured: 2e-12 after 3
    steps on two threads, against 0 at dp 1 on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = models.GPT(run.config, seed=run.seed).to(DTYPES[run.dtype])
        opt = torch.optim.Adam(model.parameters(), lr=run.lr)
        idx, targets = models.random_tokens(run.config, run.batch, seed=run.seed + 1)
        losses = []
        for _ in range(run.steps):
            loss = models.cross_entropy(model(idx), targets)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return {"losses": losses, "state": {n: p.detach().clone() for n, p in model.named_parameters()}}


def zero_rank(run: ZeroRun, group=None) -> dict:
    """Rank function: ``run.steps`` steps of ZeRO ``run.stage`` over ``group`` (default: the world).
    Returns the global mean ``losses``, the gathered final ``state``, the ``memory`` peaks
    (``Zero.peak``), ``collectives`` per step (commlog, this rank) and the last step's ``program``
    (``zero.overlap``: compute, issue and wait events for the virtual clock)."""
    group = dist.group.WORLD if group is None else group
    rank, dp = dist.get_rank(group), dist.get_world_size(group)
    model = models.GPT(run.config, seed=run.seed).to(DTYPES[run.dtype])
    engine = Zero(model, group, run.stage, lr=run.lr, overlap=run.overlap)
    idx, targets = models.random_tokens(run.config, run.batch, seed=run.seed + 1)
    per = run.batch // dp
    rows = slice(rank * per, (rank + 1) * per)
    losses, steps = [], []
    try:
        for _ in range(run.steps):
            engine.recorder = Recorder()
            with commlog.recording() as log:
                loss = models.cross_entropy(model(idx[rows]), targets[rows])
                loss.backward()
                engine.step()
            program, engine.recorder = engine.recorder.finish(), None
            steps.append(log.as_dict())
            total = loss.detach().clone()
            dist.all_reduce(total, group=group)  # outside the recording: reporting, not training
            losses.append(total.item() / dp)
        state = engine.full_state()
    finally:
        engine.remove()
    return {"rank": rank, "losses": losses, "state": state, "memory": dict(engine.peak), "collectives": steps,
            "program": program}


def zero_jobs(runs: list[ZeroRun]) -> list[dict]:
    """Rank function: ``zero_rank`` for each run, in one launch (the tests use it per dp)."""
    return [zero_rank(run) for run in runs]


def report(run: ZeroRun, ranks: list[dict], ref: dict | None = None) -> dict:
    """The ``run zero --json`` dict from the ranks' answers."""
    ref = reference(run) if ref is None else ref
    pred = predicted(run)
    diffs = {name: max((r["state"][name] - p).abs().max().item() for r in ranks) for name, p in ref["state"].items()}
    loss_diff = max(abs(a - b) for r in ranks for a, b in zip(r["losses"], ref["losses"]))
    measured = {key: max(r["memory"][key] for r in ranks) for key in ranks[0]["memory"]}
    steps = ranks[0]["collectives"]
    volumes = [traffic.volume(s, run.dp) for s in steps]
    programs = [r["program"] for r in ranks]
    placed = place(programs, run.dp, run.link)
    serialized = place([serial(p) for p in programs], run.dp, run.link)
    return {
        "stage": run.stage, "dp": run.dp, "model": run.model, "steps": run.steps, "batch": run.batch,
        "dtype": run.dtype, "lr": run.lr, "config": dataclasses.asdict(run.config),
        "params": pred["params"], "largest_unit": pred["largest_unit"], "units": pred["units"],
        "max_param_diff": max(diffs.values()), "loss_diff": loss_diff,
        "losses": ranks[0]["losses"], "reference_losses": ref["losses"],
        "memory_per_rank": {key: {"measured": measured[key], "predicted": pred["memory"][key]}
                            for key in pred["memory"]},
        "collectives": steps[-1],
        "collectives_same_every_step": all(s == steps[0] for s in steps),
        "traffic_per_step": {"measured": volumes[-1], "predicted": pred["traffic"]["volume"],
                             "ring_sent_predicted": pred["traffic"]["ring_sent"]},
        "overlap": run.overlap, "link": dataclasses.asdict(run.link),
        # The last step on the virtual clock; "serial": the same work with every wait right after
        # its issue. Seconds: compute is measured thread CPU time, communication the link model.
        "virtual": {"step_s": placed["makespan"], "serial_step_s": serialized["makespan"],
                    "waiting_s": max(placed["waiting"]), "serial_waiting_s": max(serialized["waiting"])},
        "timeline": {"virtual": placed, "serial": serialized},
    }


def run_zero(stage: int, dp: int, model: str = "gpt", steps: int = DEFAULTS["steps"], batch: int = DEFAULTS["batch"],
             lr: float = DEFAULTS["lr"], seed: int = DEFAULTS["seed"], dtype: str = "float64", *,
             config: models.GPTConfig = DEFAULT_CONFIG, overlap: bool = False, link: Link = PCIE4,
             timeout: float = 120.0) -> dict:
    """``parallel-lab run zero --json``: ``plan`` (before any process), the ranks, ``report``.
    ``overlap``: collectives in flight during the compute; ``link``: the virtual clock's network."""
    run = plan(stage, dp, model, steps, batch, lr, seed, dtype, config, overlap, link)
    answers = launcher.run(zero_rank, run.dp, kwargs={"run": run}, timeout=timeout)
    return report(run, answers)
