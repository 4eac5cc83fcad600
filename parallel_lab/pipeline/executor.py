"""Run a pipeline schedule on this rank: the actions of ``parallel_lab.pipeline.schedules``, for real.

    ex = Executor(schedule, stages, spec, rank)      # stages: {stage index: stages.Stage} held here
    loss = ex.step(x, target)                        # one training step; .grad of every parameter set
    ex.records                                       # with record=True: per action, both clocks, memory

The rank runs exactly the op list that ``communication.communication(schedule)[rank]`` prints, in one
loop (``Executor._walk``): before an action it waits for the receive the action needs (as the
validator assumes), then runs the action on its stage's worker, then sends (sends never block, again
as validated). How tensors move is ``pipeline.messages``; what a step records, ``pipeline.recording``;
the arithmetic of one stage and its memory, ``pipeline.worker``. A stage's output that feeds a stage
on the same rank (ZB-V's turn at the bottom of the V) is handed over in memory.

Actions (GPipe, Huang et al. 2019; PipeDream-Flush / 1F1B, Narayanan et al. 2021; Zero Bubble,
Qi et al. 2023):
    F  forward of one microbatch; the last stage also computes its loss, scaled by 1/m so that the
       summed gradients are those of the whole-batch mean loss
    B  full backward: I and W at once (or, with ``fuse=False``, plain ``autograd.backward``)
    I  input gradient only: one ``autograd.grad`` pass w.r.t. the stage input and the output of
       every module that owns parameters ("taps"); it computes no weight gradient
    W  weight gradients from the taps: a Linear's dW = dY^T X added into ``.grad`` by one addmm_;
       other taps by autograd from their output to their own parameters only (the graph is kept
       for them). W redoes none of I's work (PyTorch's ``stage_backward_weight`` splits the same way)
With ``recompute`` (GPipe's re-materialisation) F runs without a graph and keeps only the stage
input; B or I first runs the forward again.

The worker of each stage is a hook (``worker=``): by default ``chain.make_worker``, which gives the
course MLP's stages ``chain.ChainWorker`` (the same arithmetic as autograd, by hand) and any other
stage ``worker.StageWorker`` (autograd); ``pipedream.AsyncStage`` runs PipeDream's asynchronous
1F1B (an SGD update after every backward).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

import torch
import torch.distributed as dist

from parallel_lab.hardware import PCIE4, Link
from parallel_lab.pipeline.chain import make_worker
from parallel_lab.pipeline.communication import Comm, communication
from parallel_lab.pipeline.messages import Inbox, Outbox, Tags, message, send_order
from parallel_lab.pipeline.recording import NOT_RECORDED, Recording
from parallel_lab.pipeline.schedules import Action, Schedule
from parallel_lab.runtime import commlog, shared_memory


class StageSpec(Protocol):
    """What an Executor needs to know about the model it runs, whoever built the stages
    (``pipeline.stages.ModelSpec`` for the course models, ``parallel3d.train3d`` for a 3D replica):

    batch:            rows of the whole batch a step sees; a micro-batch is ``batch / m`` of them
    torch_dtype:      the dtype of the tensors that cross between stages
    loss(out, target): the mean loss of one micro-batch, a scalar (the last stage computes it)
    boundary_shape(rows): the shape of what crosses between two stages for ``rows`` rows
    """

    batch: int
    torch_dtype: torch.dtype

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor: ...

    def boundary_shape(self, rows: int) -> tuple[int, ...]: ...


class Op(NamedTuple):
    """One entry of a rank's program: receive (or None), run ``action``, send (or None)."""

    action: Action
    recv: Comm | None
    send: Comm | None
    label: str


def program(schedule: Schedule, rank: int, check: bool = True, comms=None) -> list[Op]:
    """This rank's ops in ``communication(schedule)`` order, grouped per action.

    ``check=False`` skips validation so that a broken schedule can be run to show how it hangs
    (the hang test and the lesson's "what if" cell); it uses the same per-action send/recv rules.
    ``comms``: ``communication(schedule, check)`` when the caller has it already.
    """
    flat = (communication(schedule, check=check) if comms is None else comms)[rank]
    ops, recv = [], None
    for item in flat:
        if isinstance(item, Action):
            ops.append(Op(item, recv, None, _label(item, recv)))
            recv = None
        elif item.op == "recv":
            recv = item
        else:
            ops[-1] = ops[-1]._replace(send=item)
    return ops


def _label(a: Action, recv: Comm | None) -> str:
    what = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad"}[a.kind]
    source = "" if recv is None else f", needs {'activation' if recv.tensor == 'act' else 'gradient'} " \
                                     f"from rank {recv.peer} (stage {recv.peer_stage})"
    return f"pipeline action {a} ({what} of stage {a.stage}, microbatch {a.microbatch}{source})"


class Executor:
    """Runs ``schedule``'s actions for the stages this rank holds, one training step per ``step``.

    stages:  {stage index: parallel_lab.pipeline.stages.Stage} for this rank's stages
    spec:    a ``StageSpec`` (loss, boundary shape, dtype, batch rows)
    record:  keep ``records`` (both clocks, memory; ``pipeline.recording``) and send virtual
             timestamps beside tensors
    link:    the modelled link for the virtual clock
    check:   validate the schedule here (False when the caller validated it before the ranks started,
             as ``run.run_pipeline`` does, or to demonstrate a hang)
    prefetch: receives posted ahead, from the start of the step (each holds one boundary-sized buffer
              until its action runs)
    fuse:    accumulate Linear weight gradients with one addmm_ (see StageWorker)
    worker:  the hook that builds each stage's worker, called as
             ``worker(stage, loss_fn, n_microbatches, first, last, recompute, split, fuse)``
             (default ``chain.make_worker``; PipeDream's ``pipedream.AsyncStage``)
    peers:   global rank of each pipeline rank (default: the same number). Inside a device mesh the
             schedule's rank r is ``Groups.pp_ranks[r]`` (parallel_lab.parallel3d); ``rank`` stays the
             pipeline rank
    tags:    give every message its own tag (default: yes, except under NCCL, which ignores tags);
             without tags the messages of a pair match in order, as on NCCL
    share_memory: send to a neighbour on this host through shared memory where gloo would go over
             loopback TCP (``runtime.shared_memory.links``; opened on the first step, with every
             neighbour, ``link_depth`` slots per direction); False keeps every message on
             torch.distributed
    """

    def __init__(self, schedule: Schedule, stages: dict, spec: StageSpec, rank: int, *, recompute: bool = False,
                 record: bool = False, link: Link = PCIE4, check: bool = True, prefetch: int = 4,
                 fuse: bool = True, worker=make_worker, peers=None, tags: bool | None = None,
                 share_memory: bool = True, link_depth: int | None = None):
        self.schedule, self.spec, self.rank = schedule, spec, rank
        self.m, self.n_stages = schedule.n_microbatches, schedule.n_stages
        comms = communication(schedule, check=check)
        self.program = program(schedule, rank, check=False, comms=comms)
        self.arrive = send_order(comms, rank)
        split, last = schedule.split_backward, self.n_stages - 1
        self.workers = {s: worker(stage, spec.loss, self.m, s == 0, s == last, recompute, split, fuse)
                        for s, stage in stages.items()}
        tagged = not (dist.is_initialized() and dist.get_backend() == "nccl") if tags is None else tags
        self.tag = Tags(self.m, tagged)
        # per op, the tags of what it sends (tensor, timestamp)
        self.tags = [self.tag(message(op.send)) if op.send else None for op in self.program]
        # buffers live where the weights do (the CPU here)
        self.device = next(p.device for w in self.workers.values() for p in w.params)
        self.peers = list(range(schedule.n_ranks)) if peers is None else list(peers)
        if len(self.peers) != schedule.n_ranks:
            raise ValueError(f"peers lists {len(self.peers)} global ranks for {schedule.n_ranks} pipeline ranks")
        self.needs = [(op.recv.peer, message(op.recv)) for op in self.program if op.recv]
        self.neighbours = sorted({op.recv.peer for op in self.program if op.recv}
                                 | {op.send.peer for op in self.program if op.send})
        self.share_memory, self.link_depth, self.links, self.links_bytes = share_memory, link_depth, {}, None
        self.record, self.link, self.prefetch = record, link, prefetch
        self.recording = NOT_RECORDED
        self.loss = 0.0

    @property
    def records(self):
        """The last step's records (``pipeline.recording``): empty unless it was recorded."""
        return self.recording.records

    @property
    def bytes_sent(self) -> int:
        return self.recording.bytes_sent

    @property
    def w_bytes(self) -> list[int]:
        """Over the last step's I's, all stages: [bytes kept for W, bytes of the graph before]."""
        return [sum(w.w_bytes[k] for w in self.workers.values()) for k in (0, 1)]

    def zero_grad(self) -> None:
        for w in self.workers.values():
            for p in w.params:
                p.grad = None

    def step(self, x=None, target=None) -> float | None:
        """One step over the whole batch: ``x`` is needed where stage 0 lives, ``target`` where the
        last stage lives. Gradients accumulate into ``.grad`` (call ``zero_grad`` between steps).
        Returns the loss (mean over the batch) on the rank holding the last stage, else None."""
        m = self.m
        inputs = x.chunk(m) if x is not None else None
        targets = target.chunk(m) if target is not None else None
        shape, dtype = self.spec.boundary_shape(self.spec.batch // m), self.spec.torch_dtype
        self.message_bytes = math.prod(shape) * torch.tensor([], dtype=dtype).element_size()
        self.loss = 0.0
        if self.links_bytes != self.message_bytes:  # collective with the neighbours (first step)
            self._open_links()
        self.recording = Recording(self.link, self.message_bytes) if self.record else NOT_RECORDED
        for w in self.workers.values():
            w.start_step(counting=self.record)
        outbox = Outbox(self.peers, self.links, self.device, stamps=self.record)
        inbox = Inbox(self.needs, self.arrive, self.tag, self.peers, shape, dtype, self.device, self.record,
                      self.prefetch, self.links, outbox.progress)
        inbox.post_ahead()  # the senders may send as soon as they compute (no round trip on the first)
        # A hang report then names the action: "pipeline action 1B3 (...): wait(irecv(src=2, ...))".
        commlog.set_activity(f"pipeline {self.schedule.name}, starting a step")
        try:
            self._walk(inputs, targets, inbox, outbox, self.recording)
        finally:
            commlog.set_activity(None)
        return self.loss if self.n_stages - 1 in self.workers else None

    def _open_links(self) -> None:
        self.links_bytes, self.links = self.message_bytes, {q: None for q in self.neighbours}
        if self.share_memory and self.device.type == "cpu":
            opened = shared_memory.links([self.peers[q] for q in self.neighbours], self.message_bytes,
                                         depth=self.link_depth)
            self.links = {q: opened[self.peers[q]] for q in self.neighbours}

    def _walk(self, inputs, targets, inbox: Inbox, outbox: Outbox, rec) -> None:
        """The schedule's walk: every op of this rank's program, in order (``rec`` records it or not)."""
        local, last = {}, self.n_stages - 1  # local: (stage, microbatch) -> (tensor, virtual clock)
        rec.start()
        for (action, recv, send, text), tags in zip(self.program, self.tags):
            commlog.set_activity(text)
            s, kind, j = action
            data, ready = None, None  # the action's input and when it arrived on the virtual clock
            if recv is not None:
                data, stamp = inbox.take()
                ready = rec.arrival(stamp)
            elif kind == "F" and s == 0:
                data = inputs[j]
            elif kind != "W" and (kind == "F" or s != last):  # handed over in memory by this rank
                data, ready = local.pop((s, j))
            began = rec.begin(ready)
            out = self.workers[s].act(kind, j, data, targets[j] if kind == "F" and s == last else None)
            clock = rec.end(action, self.workers[s], began)
            if kind == "F" and s == last:
                self.loss += out.item()
                continue
            if out is None:  # W, or the first stage's input gradient
                continue
            if send is not None:
                outbox.send(send, out, tags, clock)
                rec.sent()
            else:
                local[(s + 1, j) if kind == "F" else (s - 1, j)] = (out.detach(), clock)
        outbox.finish()
