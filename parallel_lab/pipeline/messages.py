"""Moving boundary tensors between pipeline ranks: receives posted ahead, sends that never block.

    inbox = Inbox(needs, send_order(comms, rank), tags, peers, shape, dtype, device, stamps, depth, links)
    data, stamp = inbox.take()             # the next receive in program order
    outbox = Outbox(peers, links, device)
    outbox.send(comm, out, tags(message(comm)), stamp)

A neighbour on the same host is reached through shared memory (``runtime.shared_memory.links``: a
ring of slots per direction; a message that finds its ring full waits in this rank's queue and moves
while the rank waits), any other by ``isend``/``irecv``: gloo would carry even a same-host message
over loopback TCP, about 0.6 ms here, where the copy takes microseconds. Receives from the others are
posted a few ops ahead (``Inbox``) so the data can land while the rank computes, and from each peer
in the order that peer sends: NCCL ignores tags and matches a pair's sends and receives in the order
they are issued (ZB-V receives in another order than its neighbours send). Under gloo messages also
carry a unique tag per (tensor, stage, microbatch) (``Tags``), so a mix-up would fail loudly rather
than swap two microbatches. With ``stamps`` every tensor travels with its sender's virtual clock.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_lab.pipeline.communication import Comm
from parallel_lab.runtime import commlog


def message(comm: Comm) -> tuple[int, str, int]:
    """The message a send or a receive moves, named by its sender: (sending stage, tensor, microbatch)."""
    return comm.stage if comm.op == "send" else comm.peer_stage, comm.tensor, comm.microbatch


def send_order(comms, rank: int) -> dict[int, list[tuple[int, str, int]]]:
    """peer -> the messages it sends to ``rank``, ``(sending stage, tensor, microbatch)`` in the
    order it sends them (what NCCL matches receives against)."""
    order: dict[int, list] = {}
    for peer, items in comms.items():
        for c in items:
            if isinstance(c, Comm) and c.op == "send" and c.peer == rank:
                order.setdefault(peer, []).append(message(c))
    return order


class Tags:
    """message -> (tag of the tensor, tag of its timestamp): unique per message of a step of ``m``
    microbatches, or (0, 0) when ``unique`` is False (messages of a pair then match in order)."""

    def __init__(self, m: int, unique: bool = True):
        self.m, self.unique = m, unique

    def __call__(self, message: tuple[int, str, int]) -> tuple[int, int]:
        if not self.unique:
            return 0, 0
        stage, tensor, microbatch = message
        tag = ((stage * self.m + microbatch) * 2 + (tensor == "grad")) * 2
        return tag, tag + 1


class Inbox:
    """This rank's receives of one step: handed out in program order, posted in each sender's order.
    From a peer with a shared-memory link (``links``) nothing is posted: ``take`` copies that peer's
    messages out of its slots in the order it sent them, through the one needed, running
    ``progress`` (this rank's queued sends) while it waits.

    A gloo receive that is posted only when its action comes up costs a round trip: the sender's
    data waits until the receiver says it is ready. So the first ``depth`` needs are posted when the
    step starts (``post_ahead``) and ``take`` keeps the next ``depth`` posted. A need is posted
    together with every message its sender sends to this rank before it (NCCL matches a pair's
    messages in order), each into its own buffer until it is taken. With ``stamps`` every tensor has
    a one-number virtual timestamp beside it.

    needs:   ``(peer, message)`` per receive, in program order (peer: pipeline rank)
    arrive:  peer -> its messages to this rank in send order (``send_order``)
    tag:     message -> (tag of the tensor, tag of its timestamp) (``Tags``)
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


class Outbox:
    """This rank's sends of one step, none of which blocks: into shared memory (queued, in order,
    while the peer's slots are full) or by ``isend``. ``finish`` waits until every one has left.

    peers:  global rank of each pipeline rank
    links:  pipeline rank -> (sending Link, receiving Link) through shared memory, or None
    """

    def __init__(self, peers, links: dict, device, stamps: bool):
        self.peers, self.links, self.device, self.stamps = peers, links, device, stamps
        self.works: list = []  # (work, tensor): the list keeps each tensor alive until it is sent
        self.queues: dict = {}  # sending Link -> messages waiting for a free slot, oldest first

    def send(self, comm: Comm, out: torch.Tensor, tags: tuple[int, int], stamp: float) -> None:
        """Send ``out`` (and, with ``stamps``, the virtual clock ``stamp``) to ``comm``'s peer."""
        peer, link = self.peers[comm.peer], self.links.get(comm.peer)
        if link is None:
            self.works.append((dist.isend(out, peer, tag=tags[0]), out))
            if self.stamps:
                t = torch.tensor([stamp], dtype=torch.float64, device=self.device)
                self.works.append((dist.isend(t, peer, tag=tags[1]), t))
            return
        commlog.count("isend", tensor=out, dst=peer)
        queue = self.queues.setdefault(link[0], [])
        if queue or not link[0].send(out, stamp):  # a pair's messages keep their order
            queue.append((out, stamp))

    def progress(self) -> None:
        """Move queued shared-memory sends into slots their receivers have freed (run while waiting)."""
        for link, queue in self.queues.items():
            while queue and link.room():
                link.send(*queue.pop(0))

    def finish(self) -> None:
        """Wait until every send of the step has left this rank."""
        for work, _ in self.works:
            work.wait()
        for link, queue in self.queues.items():
            while queue:  # only progress sends what is queued: a pair's messages keep their order
                link.wait_for_room(self.progress, f"isend(dst={link.peer}) at the end of the step")
                self.progress()
