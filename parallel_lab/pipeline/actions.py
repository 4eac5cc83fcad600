"""A pipeline schedule as data: per rank, an ordered list of actions, and its text forms.

    a = Action.parse("1F3")                 # Action(stage=1, kind="F", microbatch=3)
    s = as_schedule(["0F0 0B0", "1F0 1B0"], p=2, m=1)   # a student's plain lists -> a Schedule
    print(format_grid(s))                   # the step x rank grid

Action kinds (PyTorch `torch.distributed.pipelining` notation, `{stage}{kind}{microbatch}`, e.g. `1F3`):
    F  forward of one microbatch through one stage
    B  full backward (input gradient and weight gradient together)
    I  backward for the input gradient only (the part the previous stage waits for)
    W  backward for the weight gradient only (nobody waits for it, so it can fill bubbles)

``pipeline.schedules`` generates the course's schedules in this form; the same object is validated
(``pipeline.validate``), turned into send/recv lists (``pipeline.communication``), simulated
(``pipeline.simulate``), executed on real ranks (``pipeline.executor``) and drawn
(``parallel_lab.show.pipeline``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, NamedTuple, Sequence

from parallel_lab.i18n import _, pad

KINDS = ("F", "B", "I", "W")
_ACTION_RE = re.compile(r"^(\d+)([FBIW])(\d+)$")


class ScheduleError(ValueError):
    """A schedule (or its parameters) breaks an invariant; the message names it with actual values."""


class Action(NamedTuple):
    """One compute step: run `kind` (F, B, I or W) of `microbatch` through model stage `stage`."""

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        """`Action.parse("1F3") == Action(stage=1, kind="F", microbatch=3)`."""
        match = _ACTION_RE.match(text.strip())
        if match is None:
            raise ScheduleError(_("cannot parse action {text}: expected '{{stage}}{{F|B|I|W}}{{microbatch}}', "
                                  "e.g. '1F3'").format(text=repr(text)))
        return cls(int(match[1]), match[2], int(match[3]))


def parse_actions(text: str) -> list[Action | None]:
    """`"0F0 . 0B0"` -> `[Action(0,'F',0), None, Action(0,'B',0)]` ('.' is an idle slot)."""
    return [None if token == "." else Action.parse(token) for token in text.split()]


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered actions of a pipeline schedule.

    name:            schedule name, e.g. "1f1b"
    n_ranks:         p, the number of pipeline ranks (devices)
    n_microbatches:  m
    virtual:         v, model stages per rank (1 except for interleaved and V schedules)
    stage_to_rank:   stage_to_rank[s] is the rank that holds model stage s; len = n_stages = p * v
    ranks:           ranks[r] = ordered list of Action, or None for an explicit idle slot (display only:
                     None carries no time in the simulator and no work for the executor)
    """

    name: str
    n_ranks: int
    n_microbatches: int
    virtual: int
    stage_to_rank: tuple[int, ...]
    ranks: list[list[Action | None]] = field(repr=False)  # print(schedule) shows the grid

    @property
    def n_stages(self) -> int:
        """Total model stages, p * v."""
        return len(self.stage_to_rank)

    @property
    def split_backward(self) -> bool:
        """True when the backward is split into I and W (zero-bubble schedules)."""
        return any(a is not None and a.kind in "IW" for actions in self.ranks for a in actions)

    def actions(self) -> Iterable[tuple[int, int, Action]]:
        """Yield (rank, step, action) for every non-idle slot."""
        for rank, actions in enumerate(self.ranks):
            for step, action in enumerate(actions):
                if action is not None:
                    yield rank, step, action

    def to_dict(self) -> dict:
        """JSON-ready form; `Schedule.from_dict(s.to_dict()) == s`."""
        return {
            "name": self.name,
            "n_ranks": self.n_ranks,
            "n_microbatches": self.n_microbatches,
            "virtual": self.virtual,
            "stage_to_rank": list(self.stage_to_rank),
            "ranks": {r: [None if a is None else str(a) for a in acts] for r, acts in enumerate(self.ranks)},
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "Schedule":
        ranks = data["ranks"]
        rows = [ranks[key] for key in sorted(ranks, key=int)] if isinstance(ranks, Mapping) else ranks
        return cls(
            name=data["name"],
            n_ranks=data["n_ranks"],
            n_microbatches=data["n_microbatches"],
            virtual=data["virtual"],
            stage_to_rank=tuple(data["stage_to_rank"]),
            ranks=[[None if t is None else Action.parse(t) for t in row] for row in rows],
        )

    def to_text(self) -> str:
        """One line per rank: `rank 0: 0F0 0F1 . 0B0` (parse a line back with `parse_actions`)."""
        return "\n".join(
            f"rank {r}: " + " ".join("." if a is None else str(a) for a in acts)
            for r, acts in enumerate(self.ranks)
        )

    def __str__(self) -> str:
        return format_grid(self)


# --------------------------------------------------------------------------------------------
# From plain lists (a student's, a notebook's) to a Schedule
# --------------------------------------------------------------------------------------------


def _action(item, rank: int, position: int) -> Action | None:
    if item is None or item == ".":
        return None
    if isinstance(item, Action):
        return item
    if isinstance(item, str):
        try:
            return Action.parse(item)
        except ScheduleError as err:
            raise ScheduleError(_("rank {rank}, position {position}: {error}").format(
                rank=rank, position=position, error=err)) from None
    if isinstance(item, tuple) and len(item) == 3:
        return Action(*item)
    raise ScheduleError(_("rank {rank}, position {position}: expected an action like '0F1' (a string) or "
                          "an Action, got {type} {item}").format(rank=rank, position=position,
                                                                 type=type(item).__name__, item=repr(item)))


def as_schedule(ranks, p: int, m: int, name: str = "my schedule") -> Schedule:
    """A Schedule of ``p`` ranks (stage r on rank r) and ``m`` micro-batches from plain data.

    ranks: one entry per rank (a list, or a dict rank -> entry), each an ordered list of actions as
    strings (``"1F3"``: stage 1, forward, micro-batch 3), ``Action``s, ``(stage, kind, micro-batch)``
    tuples, or None / ``"."`` for an idle slot; a single string ``"0F0 0F1 0B0"`` works too.
    Raises ScheduleError naming the rank and position of anything it cannot read. The result is not
    validated: call ``pipeline.validate.validate`` (which names the first broken action).
    """
    if isinstance(ranks, Mapping):
        ranks = [ranks[key] for key in sorted(ranks)]
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Sequence):
        raise ScheduleError(_("{name}: expected one list of actions per rank, got {type}").format(
            name=name, type=type(ranks).__name__))
    if len(ranks) != p:
        raise ScheduleError(_("{name}: returned {n} rank lists for p={p}; expected one per rank").format(
            name=name, n=len(ranks), p=p))
    rows = []
    for rank, entry in enumerate(ranks):
        items = entry.split() if isinstance(entry, str) else entry
        if not isinstance(items, Sequence):
            raise ScheduleError(_("{name}: rank {rank}: expected a list of actions, got {type}").format(
                name=name, rank=rank, type=type(entry).__name__))
        rows.append([_action(item, rank, i) for i, item in enumerate(items)])
    return Schedule(name, p, m, 1, tuple(range(p)), rows)


# --------------------------------------------------------------------------------------------
# Text grid
# --------------------------------------------------------------------------------------------


def format_grid(
    source: Schedule | Mapping[int, Sequence] | Sequence[Sequence],
    mark: tuple[int, int] | None = None,
    rows: tuple[int, int] | None = None,
) -> str:
    """Step x rank text grid: one row per step, one column per rank, idle slots as '.'.

    source: a Schedule (steps are list positions) or rank -> list of actions/strings/None (e.g. the
    unit-time grid of `simulate.summary`). mark=(rank, step) draws that cell as `>1B3<`.
    rows=(first, last) keeps only those steps (inclusive), with '...' where rows were cut.
    """
    columns = source.ranks if isinstance(source, Schedule) else (
        [source[k] for k in sorted(source)] if isinstance(source, Mapping) else list(source)
    )
    n_steps = max((len(c) for c in columns), default=0)
    cells = [["." if a is None else str(a) for a in c] + [""] * (n_steps - len(c)) for c in columns]
    if mark is not None and mark[0] < len(cells) and mark[1] < n_steps:
        cells[mark[0]][mark[1]] = f">{cells[mark[0]][mark[1]]}<"
    width = max([len(f"rank {len(cells) - 1}")] + [len(t) for c in cells for t in c]) + 2
    first, last = (0, n_steps - 1) if rows is None else (max(0, rows[0]), min(n_steps - 1, rows[1]))
    lines = [pad(_("step"), 4) + " " + "".join(f"rank {r}".center(width) for r in range(len(cells)))]
    if first > 0:
        lines.append("  ...")
    for step in range(first, last + 1):
        lines.append(f"{step:>4} " + "".join(c[step].center(width) for c in cells))
    if last < n_steps - 1:
        lines.append("  ...")
    return "\n".join(lines)
