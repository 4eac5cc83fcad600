"""nbclient with kernel channels that cannot miss a message: what the build, the lesson timer and the
tests execute notebooks with.

    from notebook_client import notebook_client
    notebook_client(nb, timeout=600, resources={"metadata": {"path": "lessons"}}).execute()

nbclient waits for a cell's ``execute_reply`` with ``await socket.poll()`` on a ``zmq.asyncio``
socket (jupyter_client's ``AsyncZMQSocketChannel.get_msg``). ZeroMQ says that a socket is readable
through an edge-triggered file descriptor (``ZMQ_FD``): once that edge has been consumed without the
event loop seeing it, a message can sit in the socket while the loop waits for an edge that never
comes. On this machine, under load, it did: lesson 02 built or timed with nbclient sat for the whole
600 s cell timeout in about one run in ten at load 5-10 (never under nbval, whose blocking client
asks the socket itself). The kernel was idle (py-spy), the cell's outputs and its ``status: idle``
had arrived, and its ``execute_reply`` was waiting in the client's shell socket (``ZMQ_EVENTS`` had
``POLLIN``).

``SlicedChannel`` waits in slices of ``SLICE_S`` seconds. pyzmq ends a timed ``poll`` by asking the
socket itself (a ``poll(0)``: the level, not the edge), so a missed edge costs at most a slice instead
of the cell's whole timeout.
"""

from __future__ import annotations

import time
from queue import Empty

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from traitlets import Type, default

SLICE_S = 1.0


class SlicedChannel(AsyncZMQSocketChannel):
    """``get_msg`` that waits in slices of ``SLICE_S``, each ended by a check of the socket's level."""

    async def get_msg(self, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SLICE_S if deadline is None else min(SLICE_S, max(0.0, deadline - time.monotonic()))
            if await self.socket.poll(int(left * 1000)):
                return await self._recv()
            if deadline is not None and time.monotonic() >= deadline:
                raise Empty


class SlicedKernelClient(AsyncKernelClient):
    """nbclient's kernel client, with ``SlicedChannel`` for the shell and iopub channels."""

    shell_channel_class = Type(SlicedChannel)
    iopub_channel_class = Type(SlicedChannel)


class SlicedKernelManager(AsyncKernelManager):
    @default("client_factory")
    def _client_factory_default(self):
        return SlicedKernelClient


def notebook_client(nb, **kwargs) -> NotebookClient:
    """``nbclient.NotebookClient(nb, kernel_name="python3", **kwargs)`` on ``SlicedKernelManager``."""
    kwargs.setdefault("kernel_name", "python3")
    return NotebookClient(nb, kernel_manager_class=SlicedKernelManager, **kwargs)
