"""tools/notebook_client: a kernel message whose wake-up the event loop missed is still read."""

import asyncio
import sys
import time
from pathlib import Path

import zmq
import zmq.asyncio
from jupyter_client.session import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import notebook_client  # noqa: E402


async def missed_wakeup(channel_class, timeout: float):
    """A reply reaches the client's socket while ``get_msg`` waits, and its edge is consumed before
    the event loop sees it (what a loaded machine did by chance). Returns (message or None, seconds)."""
    session = Session(key=b"")
    context = zmq.asyncio.Context()
    client = context.socket(zmq.DEALER)
    kernel = zmq.Context.instance().socket(zmq.ROUTER)
    try:
        port = kernel.bind_to_random_port("tcp://127.0.0.1")
        client.connect(f"tcp://127.0.0.1:{port}")
        await client.send_multipart(session.serialize(session.msg("kernel_info_request")))
        identity, *_ = kernel.recv_multipart()
        channel = channel_class(client, session)
        waiting = asyncio.ensure_future(channel.get_msg(timeout=timeout))
        await asyncio.sleep(0.2)  # get_msg is now waiting on the socket's file descriptor
        start = time.monotonic()
        kernel.send_multipart([identity, *session.serialize(session.msg("execute_reply", {"status": "ok"}))])
        level = zmq.Socket.shadow(client.underlying)
        while not level.get(zmq.EVENTS) & zmq.POLLIN:  # each read consumes the edge, the last one too
            time.sleep(0.001)
        try:
            message = await waiting
        except Exception:
            message = None
        return message, time.monotonic() - start
    finally:
        client.close(linger=0)
        kernel.close(linger=0)
        context.term()


def test_a_reply_whose_wakeup_was_missed_is_read_within_a_slice():
    """jupyter_client's own channel finds such a reply only when its poll times out (nbclient: the
    cell's timeout, 600 s in the build); the sliced one at the end of the slice it arrived in."""
    message, seconds = asyncio.run(missed_wakeup(notebook_client.SlicedChannel, timeout=60))
    assert message is not None and message["msg_type"] == "execute_reply"
    assert seconds < 30  # long before the timeout: a slice is one second


def test_notebook_client_uses_the_sliced_channels():
    import nbformat

    client = notebook_client.notebook_client(nbformat.v4.new_notebook(), timeout=60)
    manager = client.kernel_manager_class()
    kernel_client = manager.client()
    assert isinstance(kernel_client.shell_channel, notebook_client.SlicedChannel)
    assert isinstance(kernel_client.iopub_channel, notebook_client.SlicedChannel)
