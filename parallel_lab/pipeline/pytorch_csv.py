"""Schedules that travel: PyTorch's schedule CSV, written and read.

    text = to_csv(build("1f1b", 4, 8))                # compute only: one row per rank, "0F0,0F1,,0B0"
    text = to_csv(schedule, comms=True)              # with the sends, receives and gradient reductions
    schedule = from_csv(text, name="1f1b")           # back, validated: from_csv(to_csv(x), x.name) == x

The format is ``torch.distributed.pipelining.schedules``' (torch 2.13): row r lists rank r's actions,
each as ``_Action``'s text, ``{stage}{type}{microbatch}``: F, I, W and B (full backward) for
compute, and in the "compute_comms" form also ``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B`` (the
receive is named by the receiving stage) and ``{stage}REDUCE_GRAD`` (no micro-batch: a stage's
gradients scaled by 1/m, and reduced over data parallel ranks, after its last W or B). An empty cell
is an idle step; PyTorch's ``_PipelineScheduleRuntime._load_csv(path, format="compute_only")`` runs
its own lowering (``_add_send_recv``) on the compute-only form, and takes the compute_comms form as
written. Torchtitan loads the same files (its ``pipeline_parallel_schedule_csv`` option).

The communication form here comes from the course's own pass (``pipeline.communication``: each
receive right before the action that needs it, each send right after the action that makes it,
nothing between two stages on one rank: PyTorch's "V-schedule special case"), which keeps the
validated order deadlock-free with blocking receives and asynchronous sends, as PyTorch's runtime
runs them. Nothing here imports torch: tests hold every cell against PyTorch's own parser.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from parallel_lab.pipeline.actions import Action, Schedule, ScheduleError
from parallel_lab.pipeline.communication import communication
from parallel_lab.pipeline.validate import validate

COMPUTE = frozenset("FIWB")
# PyTorch's _action_regex, anchored: the types its runtime reads from a CSV
_CELL = re.compile(r"^(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$")


def to_rows(schedule: Schedule, comms: bool = False) -> list[list[str]]:
    """Per rank, the cells of its row: compute actions ("" for an idle step), or with ``comms`` the
    program order with every send, receive and REDUCE_GRAD (no idle steps: that form has none)."""
    validate(schedule)
    if not comms:
        return [["" if a is None else str(a) for a in row] for row in schedule.ranks]
    m = schedule.n_microbatches
    rows = []
    for rank, ops in communication(schedule, check=False).items():
        done: dict[int, int] = {}
        row = []
        for op in ops:
            row.append(str(op))
            if isinstance(op, Action) and op.kind in "WB":  # PyTorch's _add_reduce_grad
                done[op.stage] = done.get(op.stage, 0) + 1
                if done[op.stage] == m:
                    row.append(f"{op.stage}REDUCE_GRAD")
        rows.append(row)
    return rows


def to_csv(schedule: Schedule, comms: bool = False) -> str:
    """The CSV text of ``to_rows`` (what ``_dump_csv`` writes: csv.writer, one row per rank)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(to_rows(schedule, comms))
    return out.getvalue()


def save(schedule: Schedule, path: str | Path, comms: bool = False) -> Path:
    path = Path(path)
    path.write_text(to_csv(schedule, comms))
    return path


def parse_cell(text: str, row: int, column: int) -> tuple[int, str, int | None] | None:
    """(stage, type, micro-batch or None) of one cell, None for an empty one; ScheduleError naming
    the cell for anything PyTorch's parser would not read."""
    text = text.strip()
    if not text:
        return None
    match = _CELL.match(text)
    if match is None:
        raise ScheduleError(f"row {row} (rank {row}), column {column}: cannot read {text!r} as a PyTorch action "
                            f"(expected e.g. '1F3', '0SEND_F2', '2REDUCE_GRAD')")
    kind, number = match[2], match[3]
    if kind in COMPUTE and not number:
        raise ScheduleError(f"row {row} (rank {row}), column {column}: {text!r} has no micro-batch")
    return int(match[1]), kind, int(number) if number else None


def from_rows(rows: list[list[str]], name: str = "imported", microbatches: int | None = None) -> Schedule:
    """A validated Schedule from CSV rows in either form: compute cells are kept in order (an empty
    cell as an idle step), communication and REDUCE_GRAD/UNSHARD/RESHARD cells dropped (the course
    derives them). Ranks, micro-batches (the largest index + 1 unless given), the stage-to-rank map
    (from where each stage's actions are) and stages per rank are read from the actions."""
    if not rows:
        raise ScheduleError("the CSV has no rows (one row per rank expected)")
    ranks: list[list[Action | None]] = []
    owner: dict[int, int] = {}
    comms = any(parse_cell(c, r, k) is not None and parse_cell(c, r, k)[1] not in COMPUTE
                for r, row in enumerate(rows) for k, c in enumerate(row))
    for r, row in enumerate(rows):
        actions: list[Action | None] = []
        for k, cell in enumerate(row):
            parsed = parse_cell(cell, r, k)
            if parsed is None:
                if not comms:
                    actions.append(None)
                continue
            stage, kind, mb = parsed
            if kind not in COMPUTE:
                continue
            if owner.setdefault(stage, r) != r:
                raise ScheduleError(f"row {r}, column {k}: stage {stage} is on rank {owner[stage]} and rank {r}")
            actions.append(Action(stage, kind, mb))
        ranks.append(actions)
    n_stages = max(owner, default=-1) + 1
    missing = [s for s in range(n_stages) if s not in owner]
    if missing or not n_stages:
        raise ScheduleError(f"stages {missing or [0]} have no action (stages must be 0..n-1, each on one rank)")
    p = len(ranks)
    if n_stages % p:
        raise ScheduleError(f"{n_stages} stages on {p} ranks: every rank must hold the same number of stages")
    seen = max((a.microbatch for row in ranks for a in row if a is not None), default=-1) + 1
    m = seen if microbatches is None else microbatches
    schedule = Schedule(name, p, m, n_stages // p, tuple(owner[s] for s in range(n_stages)), ranks)
    return validate(schedule)


def from_csv(text: str, name: str = "imported", microbatches: int | None = None) -> Schedule:
    """``from_rows`` of CSV text."""
    return from_rows([row for row in csv.reader(io.StringIO(text))], name, microbatches)


def load(path: str | Path, name: str | None = None, microbatches: int | None = None) -> Schedule:
    """``from_csv`` of a file; the schedule is named after the file unless ``name`` is given."""
    path = Path(path)
    return from_csv(path.read_text(), name or path.stem, microbatches)
