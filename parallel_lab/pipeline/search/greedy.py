"""Greedy list scheduling under a memory cap: one pass builds every rank's order, one action at a time.

After the Zero Bubble authors' automatic scheduler (Qi et al. 2023, "Zero Bubble Pipeline
Parallelism", section 3, "automatic pipeline scheduling", and ``auto_schedule.py`` in
sail-sg/zero-bubble-pipeline-parallelism): a pass simulates the ranks, and whenever a rank can start
something it picks by a few rules, within the memory cap; several variants of the rules run and the
shortest result is kept. Theirs fixes the warm-up by memory and decides, at each gap, whether a W
fills it; these rules are the same kinds of choices, written for any placement (one stage per rank,
or the V with two):

- ``admit``: how many micro-batches a rank may have started and not finished, as a multiple of
  1F1B's p - r (1: 1F1B's warm-up; 2: about ZB-H2's 2(p - r) - 1; inf: as many as memory allows);
- ``prefer``: when an input-gradient pass I and a forward F can both start, which goes first;
- ``w``: "eager" runs each W right after its I (a full backward in two pieces), "lazy" keeps W's
  back to fill gaps and runs them when memory is needed for a forward;
- ``fill``: "always" lets a rank with nothing else ready run a pending W at once, "fit" only when the
  W ends before the next F or I can start (else it waits: a W that delays an I delays every rank
  upstream of it).

Memory is counted as ``problem`` counts it (the simulator's rule). A forward that starts a
micro-batch on a rank reserves what the micro-batch will hold there on its later stages (the V's
way back up), so that a rank never fills up with micro-batches it cannot finish.

Micro-batches pass each stage in order (F, I and W of a stage each in micro-batch order), as in
the Zero Bubble scheduler's graph; ``exact`` solves the same class to the optimum.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from itertools import product

from parallel_lab.pipeline.actions import Action
from parallel_lab.pipeline.search.problem import EPS, Problem

INF = math.inf


@dataclass(frozen=True)
class Rules:
    """One variant of the greedy (see the module doc)."""

    admit: float = INF
    prefer: str = "I"
    w: str = "lazy"
    fill: str = "always"
    reserve: str = "all"
    template: object = None  # a Schedule whose per-rank order is the preference (``follow``)

    @property
    def name(self) -> str:
        admit = "memory" if self.admit == INF else f"{self.admit:g}x(p-r)"
        if self.template is not None:
            return (f"{self.template.name} under the cap (admit {admit}, fill {self.fill}"
                    + (f", reserve {self.reserve}" if self.reserve != "all" else "") + ")")
        return (f"greedy(admit {admit}, {self.prefer} first, W {self.w}, fill {self.fill}"
                + (f", reserve {self.reserve}" if self.reserve != "all" else "") + ")")


def follow(problem: Problem, templates) -> list[Rules]:
    """Rules that keep a generator's order (ZB-H1, ZB-V, ...) as the preference and let the cap decide:
    a rank runs, of what can start, the action that comes first in the template's order, admits a
    micro-batch only within the cap and runs a pending W when memory needs it, so the template's
    shape survives a cap it does not meet by itself."""
    reserves = ("all", "one") if problem.virtual > 1 else ("all",)
    return [Rules(a, "I", "lazy", f, rs, template) for template in templates
            for a, f, rs in product((2.0, INF), ("always", "fit"), reserves)]


def variants(problem: Problem) -> list[Rules]:
    """The rules tried: every combination that differs for this problem (W rules only when the backward
    is split)."""
    admits = (1.0, 1.5, 2.0, 3.0, INF)
    ws = ("lazy", "eager") if problem.split else ("eager",)
    fills = ("always", "fit") if problem.split else ("always",)
    reserves = ("all", "one") if problem.virtual > 1 else ("all",)
    return [Rules(a, pr, w, f, rs) for a, pr, w, f, rs in product(admits, ("I", "F"), ws, fills, reserves)
            if not (w == "eager" and f == "fit")]  # with eager W's there is no W left to fill a gap


@dataclass
class Pass:
    """The result of one pass: per-rank orders and the times the pass gave them (list scheduling, so
    ``simulate`` gives the same)."""

    orders: list[list[Action]]
    makespan: float
    spans: list[float]
    busy: list[float]
    peaks: list[float]

    @property
    def key(self) -> tuple[float, float, float]:
        return (round(self.makespan, 9), round(max(self.spans), 9),
                round(sum(s - b for s, b in zip(self.spans, self.busy)), 9))


class _State:
    """Everything a pass tracks; ``choose`` and ``commit`` are the two moves."""

    def __init__(self, problem: Problem, rules: Rules):
        self.pb, self.rules = problem, rules
        p, m, n = problem.ranks, problem.microbatches, problem.n_stages
        self.p, self.m, self.n = p, m, n
        self.owner = problem.owner
        t = problem.table
        self.cost = {"F": t["F"], "G": t["I"] if problem.split else t["B"], "W": t["W"]}
        self.stages = [problem.stages_of(r) for r in range(p)]
        size = problem.stage_memory
        self.size = size
        # what a micro-batch's first forward on a rank reserves for its later stages there: all of
        # them, or ("one") room for one later stage's forward of any micro-batch at any time
        later = [[size[x] for x in self.stages[self.owner[s]] if x > s] for s in range(n)]
        self.later = [sum(x) if rules.reserve == "all" else 0.0 for x in later]
        self.headroom = [0.0 if rules.reserve == "all" else max(x, default=0.0) for x in later]
        self.first = [s == self.stages[self.owner[s]][0] for s in range(n)]
        self.limit = [INF if rules.admit == INF else max(1, math.ceil(rules.admit * (p - r) - EPS))
                      for r in range(p)]
        self.g_free = 1.0 - problem.w_share if problem.split else 1.0  # share of M_B the I (or B) frees
        self.f_end = [[None] * m for _ in range(n)]
        self.g_end = [[None] * m for _ in range(n)]
        self.nf, self.ng, self.nw = [0] * n, [0] * n, [0] * n
        self.clock, self.first_start = [0.0] * p, [None] * p
        self.held, self.reserved, self.peak = [0.0] * p, [0.0] * p, [0.0] * p
        self.inflight, self.busy = [0] * p, [0.0] * p
        self.orders: list[list[Action]] = [[] for _ in range(p)]
        self.position = {}  # (stage, kind, micro-batch) -> place in the template's rank order
        if rules.template is not None:
            for row in rules.template.ranks:
                for i, a in enumerate(x for x in row if x is not None):
                    kind = "G" if a.kind in "IB" else a.kind
                    self.position[(a.stage, kind, a.microbatch)] = i

    # -- what can run on a rank, and when

    def _ready(self, kind: str, s: int) -> float:
        """When the next ``kind`` of stage ``s`` could start as far as its inputs go (INF: unknown yet)."""
        pb, m = self.pb, self.m
        if kind == "F":
            j = self.nf[s]
            if j >= m:
                return INF
            if s == 0:
                return 0.0
            end = self.f_end[s - 1][j]
            return INF if end is None else end + pb.hop(s - 1, s)
        if kind == "G":
            j = self.ng[s]
            if j >= self.nf[s]:
                return INF
            own = self.f_end[s][j]
            if s == self.n - 1:
                return own
            end = self.g_end[s + 1][j]
            return INF if end is None else max(own, end + pb.hop(s + 1, s))
        j = self.nw[s]
        return self.g_end[s][j] if j < self.ng[s] else INF

    def _admits(self, s: int) -> str:
        """"" when the next F of stage ``s`` may start now, else why not ("limit" or "memory")."""
        r = self.owner[s]
        cap = self.pb.max_activations[r]
        if not self.first[s]:  # reserved when the micro-batch entered this rank, or left as headroom
            return "" if self.held[r] + self.reserved[r] + self.size[s] <= cap + EPS else "memory"
        if self.inflight[r] >= self.limit[r]:
            return "limit"
        need = self.size[s] + self.later[s] + self.headroom[s]
        if self.held[r] + self.reserved[r] + need > cap + EPS:
            return "memory"
        return ""

    def choose(self, r: int):
        """(start, kind, stage) of what rank ``r`` runs next by the rules, or None (nothing known yet)."""
        t, rules = self.clock[r], self.rules
        work = []  # (ready, rank of preference, kind, stage) for F and I/B
        w_ready, w_stage, memory_blocked = INF, None, False
        for s in self.stages[r]:
            ready = self._ready("F", s)
            if ready < INF:
                why = self._admits(s)
                if not why:
                    work.append((ready, self._preference("F", s), "F", s))
                elif why == "memory" and ready <= t:
                    memory_blocked = True
            ready = self._ready("G", s)
            if ready < INF:
                work.append((ready, self._preference("G", s), "G", s))
            if self.pb.split:
                ready = self._ready("W", s)
                if ready < INF and (w_stage is None or self._w_key(s, ready) < self._w_key(w_stage, w_ready)):
                    w_ready, w_stage = ready, s
        if w_stage is not None and (rules.w == "eager" or memory_blocked):
            return (max(t, w_ready), "W", w_stage)
        now = [c for c in work if c[0] <= t + EPS]
        if now:
            _, _, kind, s = min(now, key=lambda c: c[1])
            return (t, kind, s)
        nxt = min((c[0] for c in work), default=INF)
        if w_stage is not None and (rules.fill == "always" or nxt - t >= self.cost["W"][w_stage] - EPS):
            return (t, "W", w_stage)
        if nxt == INF:
            return None
        _, _, kind, s = min((c for c in work if c[0] <= nxt + EPS), key=lambda c: c[1])
        return (nxt, kind, s)

    def _w_key(self, s: int, ready: float) -> tuple:
        """Which pending W goes first: the template's next, else the one whose I ended first."""
        return (self.position.get((s, "W", self.nw[s]), INF), ready) if self.position else (ready,)

    def _preference(self, kind: str, s: int) -> tuple:
        """Lower is preferred: the template's order when there is one; else the kind first
        (``prefer``), then the oldest micro-batch, then the later stage (closer to the loss on the way
        down, to the input on the way back)."""
        j = self.nf[s] if kind == "F" else self.ng[s]
        if self.position:
            return (self.position.get((s, kind, j), INF), j, -s)
        first = 0 if (kind == "G") == (self.rules.prefer == "I") else 1
        return (first, j, -s)

    # -- committing one action

    def commit(self, r: int, start: float, kind: str, s: int) -> list[int]:
        """Run ``kind`` of stage ``s`` on rank ``r`` from ``start``; return the ranks whose choice may change."""
        end = start + self.cost[kind][s]
        self.clock[r] = end
        self.busy[r] += end - start
        if self.first_start[r] is None:
            self.first_start[r] = start
        touched = [r]
        if kind == "F":
            j = self.nf[s]
            self.f_end[s][j] = end
            self.nf[s] += 1
            if self.first[s]:
                self.inflight[r] += 1
                self.reserved[r] += self.later[s]
            elif self.rules.reserve == "all":
                self.reserved[r] -= self.size[s]
            self.held[r] += self.size[s]
            self.peak[r] = max(self.peak[r], self.held[r])
            if s + 1 < self.n:
                touched.append(self.owner[s + 1])
            self.orders[r].append(Action(s, "F", j))
        elif kind == "G":
            j = self.ng[s]
            self.g_end[s][j] = end
            self.ng[s] += 1
            self.held[r] -= self.g_free * self.size[s]
            if self.first[s]:
                self.inflight[r] -= 1
            if s > 0:
                touched.append(self.owner[s - 1])
            self.orders[r].append(Action(s, "I" if self.pb.split else "B", j))
        else:
            j = self.nw[s]
            self.nw[s] += 1
            self.held[r] -= self.pb.w_share * self.size[s]
            self.orders[r].append(Action(s, "W", j))
        return touched


def run(problem: Problem, rules: Rules) -> Pass | None:
    """One pass of the greedy with ``rules``; None when it gets stuck (it admitted more than the cap lets
    it finish)."""
    state = _State(problem, rules)
    total = problem.n_stages * problem.microbatches * (3 if problem.split else 2)
    version = [0] * problem.ranks
    heap = []

    def refresh(r: int) -> None:
        version[r] += 1
        choice = state.choose(r)
        if choice is not None:
            heapq.heappush(heap, (choice[0], r, version[r], choice))

    for r in range(problem.ranks):
        refresh(r)
    done = 0
    while done < total:
        if not heap:
            return None
        start, r, v, choice = heapq.heappop(heap)
        if v != version[r]:
            continue
        for q in set(state.commit(r, *choice)):
            refresh(q)
        done += 1
    spans = [c - (f or 0.0) for c, f in zip(state.clock, state.first_start)]
    return Pass(state.orders, max(state.clock), spans, state.busy, state.peak)
