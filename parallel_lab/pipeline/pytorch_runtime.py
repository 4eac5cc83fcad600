"""A course schedule run by PyTorch's own runtime: the exported CSV, loaded into
``torch.distributed.pipelining.schedules._PipelineScheduleRuntime`` on gloo ranks, one step, checked
against one process.

    from parallel_lab.pipeline.pytorch_runtime import run_csv
    result = run_csv(build("1f1b", 4, 8))                    # compute-only CSV, PyTorch lowers it
    result = run_csv(found.schedule, comms=True)            # with the course's sends and receives
    result["max_grad_diff"], result["loss_diff"]            # against stages.reference

Each rank cuts the same model as ``pipeline.run`` (``stages.cut``, deterministic from the seed), wraps
each of its stages in PyTorch's ``PipelineStage``, loads the CSV with ``_load_csv`` (the format the
runtime reads; torchtitan's schedule-CSV option calls the same) and runs one ``step``; the loss is
the mean of the micro-batches' (scale_grads: gradients / m), as the course's executor computes it.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from parallel_lab.pipeline.actions import Schedule
from parallel_lab.pipeline.pytorch_csv import to_csv
from parallel_lab.pipeline.run import compare, make_spec
from parallel_lab.pipeline.stages import ModelSpec, check_stages, cut, reference
from parallel_lab.pipeline.validate import validate
from parallel_lab.runtime import launcher


def csv_rank(spec: ModelSpec, text: str, comms: bool, stage_to_rank: tuple[int, ...], microbatches: int) -> dict:
    """Rank function: this rank's stages under PyTorch's runtime, one step of the CSV ``text``; returns
    ``loss`` (on the rank of the last stage, else None) and ``grads`` by global parameter name."""
    rank, n_stages = dist.get_rank(), len(stage_to_rank)
    mine = [s for s, r in enumerate(stage_to_rank) if r == rank]
    pieces = cut(spec, n_stages, keep=set(mine))
    stages = [PipelineStage(pieces[s].module, s, n_stages, torch.device("cpu")) for s in mine]
    runtime = _PipelineScheduleRuntime(stages, microbatches, loss_fn=spec.loss, scale_grads=True)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "schedule.csv")
        with open(path, "w") as f:
            f.write(text)
        runtime._load_csv(path, format="compute_comms" if comms else "compute_only")
    x, target = spec.data()
    losses: list = []
    args = (x,) if 0 in mine else ()
    runtime.step(*args, target=target if n_stages - 1 in mine else None, losses=losses)
    loss = float(torch.stack(losses).detach().mean()) if losses else None
    grads = {name: p.grad for s in mine for name, p in zip(pieces[s].names, pieces[s].module.parameters())}
    return {"rank": rank, "loss": loss, "grads": grads}


def run_csv(schedule: Schedule, comms: bool = False, model: str = "mlp", dtype=torch.float64, seed: int = 0,
            timeout: float = 60.0, **sizes) -> dict:
    """Export ``schedule`` (``pytorch_csv.to_csv``), run one step of it on PyTorch's runtime on its
    ranks, compare loss and every gradient with one process. Returns ``schedule``, ``comms``,
    ``loss``, ``loss_diff``, ``max_grad_diff``, ``grad_diffs`` and the ``csv`` text."""
    validate(schedule)
    launch = launcher.prepare(csv_rank, schedule.n_ranks, timeout=timeout)
    spec = make_spec(model, schedule.n_microbatches, dtype, seed, **sizes)
    check_stages(spec, schedule.n_stages)
    text = to_csv(schedule, comms)
    kwargs = dict(spec=spec, text=text, comms=comms, stage_to_rank=schedule.stage_to_rank,
                  microbatches=schedule.n_microbatches)
    answers = launcher.start(launch, kwargs=kwargs)
    return {"schedule": schedule.name, "comms": comms, **compare(answers, reference(spec)), "csv": text}
