"""Run a pipeline schedule on this rank: the actions of ``parallel_lab.pipeline.schedules``, for real.

    ex = Executor(schedule, stages, spec, rank)      # stages: {stage index: stages.Stage} held here
    loss = ex.step(x, target)                        # one training step; .grad of every parameter set
    ex.records                                       # per action: wall and virtual start/end, memory

The rank runs exactly the op list that ``communication.communication(schedule)[rank]`` prints: before an
action it waits for the receive the action needs (as the validator assumes), then runs the action,
then sends (sends never block, again as validated). A neighbour on the same host is reached
through shared memory (``runtime.shared_memory.links``: a ring of slots per direction; a message
that finds its ring full waits in this rank's queue and moves while the rank waits), any other by
``isend``/``irecv``: gloo would carry even a same-host message over loopback TCP, about 0.6 ms
here, where the copy takes microseconds. Receives from the others are posted a few ops ahead
(``Inbox``) so the data can land while the rank computes, and from each peer in the order that peer
sends: NCCL ignores tags and matches a pair's sends and receives in the order they are issued (ZB-V
receives in another order than its neighbours send). Under gloo messages also carry a unique tag
per (tensor, stage, microbatch), so a mix-up would fail loudly rather than swap two microbatches.
A stage's output that feeds a stage on the same rank (ZB-V's turn at the bottom of the V) is handed
over in memory.

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
A stage that is a chain of Linear and GELU modules (the course MLP) runs the same operations by
hand, without autograd's graph (``worker.ChainWorker``); the numbers are the same.
With ``recompute`` (GPipe's re-materialisation) F runs without a graph and keeps only the stage
input; B or I first runs the forward again.

Recording (``record=True``), see ARCHITECTURE.md, "Honest timelines on few cores":
    wall clock     time.perf_counter from a common start (a barrier): what this machine did, with
                   ranks sharing few cores
    virtual clock  an action lasts its thread CPU time (time.thread_time; less what it spun waiting
                   for tensor-parallel peers, ``runtime.shared_memory``) and starts no earlier than
                   its inputs arrived: every message carries the sender's virtual clock (a one-number
                   tensor sent beside it, or the slot's stamp in shared memory) plus a modelled link
                   cost (``Link``). This is the timeline p dedicated devices would show.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import NamedTuple, Protocol

import torch
import torch.distributed as dist

from parallel_lab.hardware import PCIE4, Link
from parallel_lab.pipeline.communication import Comm, communication
from parallel_lab.pipeline.schedules import Action, Schedule
from parallel_lab.pipeline.worker import StageWorker, make_worker
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


def send_order(comms, rank: int) -> dict[int, list[tuple[int, str, int]]]:
    """peer -> the messages it sends to ``rank``, ``(sending stage, tensor, microbatch)`` in the
    order it sends them (what NCCL matches receives against)."""
    order: dict[int, list] = {}
    for peer, items in comms.items():
        for c in items:
            if isinstance(c, Comm) and c.op == "send" and c.peer == rank:
                order.setdefault(peer, []).append(message(c))
    return order


def message(comm: Comm) -> tuple[int, str, int]:
    """The message a send or a receive moves, named by its sender: (sending stage, tensor, microbatch)."""
    return comm.stage if comm.op == "send" else comm.peer_stage, comm.tensor, comm.microbatch


def _label(a: Action, recv: Comm | None) -> str:
    what = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad"}[a.kind]
    source = "" if recv is None else f", needs {'activation' if recv.tensor == 'act' else 'gradient'} " \
                                     f"from rank {recv.peer} (stage {recv.peer_stage})"
    return f"pipeline action {a} ({what} of stage {a.stage}, microbatch {a.microbatch}{source})"


def _tag(message: tuple[int, str, int], m: int) -> tuple[int, int]:
    """Unique per message (sending stage, tensor, microbatch): the tensor's tag and its timestamp's."""
    stage, tensor, microbatch = message
    tag = ((stage * m + microbatch) * 2 + (tensor == "grad")) * 2
    return tag, tag + 1


# ----------------------------------------------------------------------------------------------
# Receives, posted ahead.


class Inbox:
    """This rank's receives of one step: handed out in program order, posted in each sender's order.
    From a peer with a shared-memory link (``links``) nothing is posted: ``take`` copies that peer's
    messages out of its slots in the order it sent them, through the one needed, running
    ``progress`` (this rank's queued sends) while it waits.

    A gloo receive that is posted only when its action comes up costs a round trip: the sender's
    data waits until the receiver says it is ready. So the first ``depth`` needs are posted when the
    step starts (``post_ahead``) and ``take`` keeps the next ``depth`` posted. A need is posted
    together with every message its sender sends to this rank before it (NCCL matches a pair's
    messages in order), each into its own buffer until it is taken. With ``stamps`` every tensor has a
    one-number virtual timestamp beside it.

    needs:   ``(peer, message)`` per receive, in program order (peer: pipeline rank)
    arrive:  peer -> its messages to this rank in send order (``send_order``)
    tag:     message -> (tag of the tensor, tag of its timestamp); all 0 where tags are not used
    peers:   global rank of each pipeline rank
    """

    def __init__(self, needs: list, arrive: dict, tag, peers, shape, dtype, device, stamps: bool,
                 depth: int, links=None, progress=None):
        self.needs, self.tag, self.peers, self.depth = needs, tag, peers, depth
        self.links, self.progress = links or {}, progress  # peer -> (send, receive) Links, or None
        self.shape, self.stamps = shape, stamps
        self.like = dict(dtype=dtype, device=device)
        self.arrive = {peer: iter(messages) for peer, messages in arrive.items()}
        self.next, self.posted = 0, {}  # (peer, message) -> (works, data, stamp)
        self.ahead = 0  # needs before this index are posted (or taken)

    def _post_through(self, peer: int, message) -> None:
        while (peer, message) not in self.posted:
            sent = next(self.arrive[peer])
            data = torch.empty(self.shape, **self.like)
            tag, stamp_tag = self.tag(sent)
            works = [dist.irecv(data, self.peers[peer], tag=tag)]
            stamp = None
            if self.stamps:
                stamp = torch.empty(1, dtype=torch.float64, device=self.like["device"])
                works.append(dist.irecv(stamp, self.peers[peer], tag=stamp_tag))
            self.posted[peer, sent] = (works, data, stamp)

    def _post_until(self, end: int) -> None:
        end = min(end, len(self.needs))
        while self.ahead < end:
            peer, message = self.needs[self.ahead]
            if self.links.get(peer) is None:  # through shared memory nothing is posted: it is just there
                self._post_through(peer, message)
            self.ahead += 1

    def _take_through(self, peer: int, message) -> None:
        """Copy the peer's messages out of shared memory, in its send order, through ``message``."""
        link = self.links[peer][1]
        while (peer, message) not in self.posted:
            sent = next(self.arrive[peer])
            text = "" if link.ready() else commlog.describe("irecv", {
                "src": self.peers[peer], "tag": self.tag(sent)[0],
                "tensor": torch.empty(self.shape, dtype=self.like["dtype"], device="meta")})
            data, stamp = link.receive(self.shape, self.like["dtype"], self.progress, text)
            commlog.count("irecv", tensor=data, src=self.peers[peer])
            self.posted[peer, sent] = ((), data, stamp)

    def post_ahead(self) -> None:
        """Post the first ``depth`` needs (at the start of a step, before any action)."""
        self._post_until(self.depth)

    def take(self):
        """The next receive in program order: (tensor, sender's virtual clock or None)."""
        self._post_until(self.next + self.depth)
        need = self.needs[self.next]
        self.next += 1
        if need not in self.posted:  # a shared-memory peer's (the others are posted by now)
            self._take_through(*need)
        works, data, stamp = self.posted.pop(need)
        for work in works:
            work.wait()
        if not self.stamps or stamp is None:
            return data, None
        return data, (stamp if isinstance(stamp, float) else stamp.item())


# ----------------------------------------------------------------------------------------------
# The rank's loop.


class Executor:
    """Runs ``schedule``'s actions for the stages this rank holds, one training step per ``step``.

    stages:  {stage index: parallel_lab.pipeline.stages.Stage} for this rank's stages
    spec:    a ``StageSpec`` (loss, boundary shape, dtype, batch rows)
    record:  keep ``records`` (both clocks, memory) and send virtual timestamps beside tensors
    link:    the modelled link for the virtual clock
    check:   validate the schedule first (False only to demonstrate a hang)
    prefetch: receives posted ahead, from the start of the step (each holds one boundary-sized buffer
              until its action runs)
    fuse:    accumulate Linear weight gradients with one addmm_ (see StageWorker; a chain of Linear and
             GELU then runs by hand, ``worker.make_worker``)
    peers:   global rank of each pipeline rank (default: the same number). Inside a device mesh the
             schedule's rank r is ``Groups.pp_ranks[r]`` (parallel_lab.parallel3d.train3d); ``rank`` stays the
             pipeline rank
    tags:    give every message its own tag (default: yes, except under NCCL, which ignores tags);
             without tags the messages of a pair match in order, as on NCCL
    share_memory: send to a neighbour on this host through shared memory where gloo would go over
             loopback TCP (``runtime.shared_memory.links``; opened on the first step, with every
             neighbour); False keeps every message on torch.distributed
    """

    def __init__(self, schedule: Schedule, stages: dict, spec: StageSpec, rank: int, *, recompute: bool = False,
                 record: bool = False, link: Link = PCIE4, check: bool = True, prefetch: int = 4,
                 fuse: bool = True, peers=None, tags: bool | None = None, share_memory: bool = True):
        self.schedule, self.spec, self.rank = schedule, spec, rank
        self.m, self.n_stages = schedule.n_microbatches, schedule.n_stages
        comms = communication(schedule, check=check)
        self.program = program(schedule, rank, comms=comms)
        self.arrive = send_order(comms, rank)
        split = schedule.split_backward
        self.workers = {
            s: make_worker(stage, spec.loss, self.m, s == 0, s == self.n_stages - 1, recompute, split, fuse)
            for s, stage in stages.items()
        }
        self.tagged = not (dist.is_initialized() and dist.get_backend() == "nccl") if tags is None else tags
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
        self.share_memory, self.links, self.links_bytes = share_memory, {}, None
        self.outbox: dict = {}  # sending Link -> messages waiting for a free slot, oldest first
        self.record, self.link, self.prefetch = record, link, prefetch
        self.records: list[dict] = []
        self.loss = 0.0

    def tag(self, message: tuple[int, str, int]) -> tuple[int, int]:
        """Tags of a message and of its timestamp: unique per message, or 0 without tags."""
        return _tag(message, self.m) if self.tagged else (0, 0)

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
        self.loss, self.records, self.bytes_sent = 0.0, [], 0
        self.w_bytes = [0, 0]  # over this step's I's: bytes kept for W, bytes of the whole stash before
        if self.links_bytes != self.message_bytes:  # collective with the neighbours (first step)
            self._open_links()
        inbox = Inbox(self.needs, self.arrive, self.tag, self.peers, shape, dtype, self.device, self.record,
                      self.prefetch, self.links, self._progress)
        inbox.post_ahead()  # the senders may send as soon as they compute (no round trip on the first)
        # A hang report then names the action: "pipeline action 1B3 (...): wait(irecv(src=2, ...))".
        commlog.set_activity(f"pipeline {self.schedule.name}, starting a step")
        try:
            if self.record:
                self._run_recorded(inputs, targets, inbox)
            else:
                self._run(inputs, targets, inbox)
        finally:
            commlog.set_activity(None)
        return self.loss if self.n_stages - 1 in self.workers else None

    def _open_links(self) -> None:
        self.links_bytes, self.links = self.message_bytes, {q: None for q in self.neighbours}
        if self.share_memory and self.device.type == "cpu":
            opened = shared_memory.links([self.peers[q] for q in self.neighbours], self.message_bytes)
            self.links = {q: opened[self.peers[q]] for q in self.neighbours}

    def _send(self, send: Comm, out: torch.Tensor, tags: tuple, stamp: float, sends: list) -> None:
        """Send ``out`` (and, when recording, its virtual-clock ``stamp``) to ``send``'s peer without
        blocking: into shared memory (queued while the peer's slots are full) or by ``isend``."""
        peer, link = self.peers[send.peer], self.links.get(send.peer)
        if link is None:
            sends.append((dist.isend(out, peer, tag=tags[0]), out))  # the list keeps `out` alive until sent
            if self.record:
                t = torch.tensor([stamp], dtype=torch.float64, device=self.device)
                sends.append((dist.isend(t, peer, tag=tags[1]), t))
            return
        commlog.count("isend", tensor=out, dst=peer)
        queue = self.outbox.setdefault(link[0], [])
        if queue or not link[0].send(out, stamp):  # a pair's messages keep their order
            queue.append((out, stamp))

    def _progress(self) -> None:
        """Move queued shared-memory sends into slots their receivers have freed (run while waiting)."""
        for link, queue in self.outbox.items():
            while queue and link.room():
                link.send(*queue.pop(0))

    def _finish_sends(self, sends: list) -> None:
        for work, _ in sends:
            work.wait()
        for link, queue in self.outbox.items():
            while queue:  # only _progress sends what is queued: a pair's messages keep their order
                link.wait_for_room(self._progress, f"isend(dst={link.peer}) at the end of the step")
                self._progress()

    # The two loops are the same schedule walk; the plain one is the benchmark's hot path and does
    # nothing per action beyond the work itself and its messages.

    def _run(self, inputs, targets, inbox) -> None:
        local, sends, last = {}, [], self.n_stages - 1
        for (action, recv, send, text), tags in zip(self.program, self.tags):
            commlog.set_activity(text)
            s, kind, j = action
            w = self.workers[s]
            if kind == "W":
                w.weight_grad(j)
                continue
            if recv is not None:
                data, _ = inbox.take()
            elif kind == "F":
                data = inputs[j] if s == 0 else local.pop((s, j))
            else:
                data = None if s == last else local.pop((s, j))
            if kind == "F":
                out = w.forward(j, data, targets[j] if s == last else None)
                if s == last:
                    self.loss += out.item()
                    continue
                key = (s + 1, j)
            else:
                out = w.backward(j, data) if kind == "B" else w.input_grad(j, data)
                if s == 0:
                    continue
                key = (s - 1, j)
            if send is not None:
                self._send(send, out, tags, 0.0, sends)
            else:
                local[key] = out.detach()
        self._finish_sends(sends)

    def _run_recorded(self, inputs, targets, inbox) -> None:
        local, sends, last = {}, [], self.n_stages - 1
        hop = self.link.cost(self.message_bytes)
        dist.barrier()  # a common start for both clocks
        origin, vclock = time.perf_counter(), 0.0
        for (action, recv, send, text), tags in zip(self.program, self.tags):
            commlog.set_activity(text)
            s, kind, j = action
            w = self.workers[s]
            ready, data = vclock, None
            if recv is not None:
                data, stamp = inbox.take()
                ready = max(vclock, stamp + hop)
            elif kind == "F" and s == 0:
                data = inputs[j]
            elif kind != "W" and (kind == "F" or s != last):  # handed over in memory by this rank
                data, produced = local.pop((s, j))
                ready = max(vclock, produced)
            wall0, cpu0, spun0 = time.perf_counter(), time.thread_time(), shared_memory.waited_seconds()
            out = self._compute(w, kind, j, data, targets)
            cpu = time.thread_time() - cpu0 - (shared_memory.waited_seconds() - spun0)  # not spinning for TP peers
            wall1 = time.perf_counter()
            vclock = ready + cpu
            self._remember(action, w, wall0 - origin, wall1 - origin, ready, vclock, cpu)
            if out is None:
                continue
            if send is not None:
                self._send(send, out, tags, vclock, sends)
                self.bytes_sent += self.message_bytes
            else:
                local[(s + 1, j) if kind == "F" else (s - 1, j)] = (out.detach(), vclock)
        self._finish_sends(sends)

    def _compute(self, w: StageWorker, kind: str, j: int, data, targets):
        """Run one action; return what goes to the neighbour stage (None when nothing does)."""
        s, last = w.index, self.n_stages - 1
        if kind == "W":
            w.weight_grad(j)
            return None
        if kind == "F":
            with _saved_bytes(w, j):
                out = w.forward(j, data, targets[j] if s == last else None)
            if s == last:
                self.loss += out.item()
                return None
            return out
        with _saved_bytes(w, j) if w.recompute else _nothing():
            out = w.backward(j, data) if kind == "B" else w.input_grad(j, data)
        if kind == "I":  # from here on j keeps only what W needs: M_W of its M_B (simulate.Timeline)
            full, w.saved_bytes[j] = w.saved_bytes.get(j, 0), w.held_bytes(j)
            self.w_bytes[0] += w.saved_bytes[j]
            self.w_bytes[1] += full
        return None if s == 0 else out

    def _remember(self, action, w, wall0, wall1, v0, v1, cpu) -> None:
        j = action.microbatch
        if j not in w.stash and j not in w.held:  # its graph is gone (B, or W after I)
            w.saved_bytes.pop(j, None)
        held = sum(w.saved_bytes.values())
        self.records.append({
            "action": str(action), "wall": (wall0, wall1), "virtual": (v0, v1), "cpu": cpu,
            "stashed": w.stashed(), "held": len(w.held), "bytes": held,
        })


@contextmanager
def _nothing():
    yield


@contextmanager
def _saved_bytes(w: StageWorker, j: int):
    """Count the bytes of activations microbatch j's graph keeps on stage ``w`` (its input and every
    tensor autograd saves, or a ChainWorker keeps, parameters excluded) into ``w.saved_bytes[j]``. A
    tensor counts its own size, not its storage's: a micro-batch that is a slice of the whole batch (stage 0's input,
    the last stage's targets) holds only its slice; views of one storage count the largest once."""
    params = {p.untyped_storage().data_ptr() for p in w.params}
    seen: dict[int, int] = {}

    def count(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = max(seen.get(ptr, 0), t.numel() * t.element_size())
        return t

    w.count_kept = count  # what a worker keeps outside autograd (ChainWorker) counts the same way
    try:
        with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
            yield
    finally:
        w.count_kept = None
    x = w.stash.get(j, (None,))[0]
    if isinstance(x, torch.Tensor):
        count(x)
    w.saved_bytes[j] = sum(seen.values())
