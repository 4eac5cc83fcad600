"""The shared-memory all-reduce: exact sums on every call, the same bits on every rank, one
channel per group, nothing left in /dev/shm, spun time kept apart, a missing rank named."""

import glob
import os

import pytest
import torch

from parallel_lab.runtime import demos, launcher, shared_channel, shared_memory

WHY_NOT = shared_memory.why_not_here()


@pytest.mark.parametrize("args, reason", [
    (("x86_64", True), None),
    (("AMD64", True), None),
    (("arm64", True), "not x86-64"),
    (("x86_64", False), "no /dev/shm"),
    (("x86_64", True, "nccl"), "backend is nccl"),
])
def test_why_not_names_what_stops_sharing(args, reason):
    said = shared_memory.why_not(*args)
    assert said is None if reason is None else reason in said


@pytest.mark.ranks
@pytest.mark.timeout(120)
@pytest.mark.skipif(WHY_NOT is not None, reason=f"2 ranks cannot share memory here: {WHY_NOT}")
def test_every_call_sums_exactly_on_every_rank_and_leaves_no_file():
    before = set(glob.glob(os.path.join(shared_memory.SHM_DIR, "parallel_lab-*")))
    ranks = launcher.run(demos.shared_memory_sums, 2, kwargs={"calls": 60, "seed": 3})
    assert all(r["used"] for r in ranks)
    for i, (a, b) in enumerate(zip(ranks[0]["sums"], ranks[1]["sums"])):
        assert torch.equal(a, b), f"call {i}: ranks disagree"
    # Each rank's inputs again from its seed: the sum of call i is exact (integers in float64).
    inputs = []
    for r in range(2):
        gen, mine = torch.Generator().manual_seed(3000 + r), []
        for i in range(60):
            mine.append(torch.randint(-1000, 1000, (1 + 97 * i % 4000,), generator=gen).double())
            if torch.rand((), generator=gen) < 0.3:
                torch.rand((), generator=gen)
        inputs.append(mine)
    for i, got in enumerate(ranks[0]["sums"]):
        assert torch.equal(got, inputs[0][i] + inputs[1][i]), f"call {i}: wrong sum"
    assert ranks[0]["waited"] > 0.02  # rank 0 spun while rank 1 slept 50 ms
    assert set(glob.glob(os.path.join(shared_memory.SHM_DIR, "parallel_lab-*"))) == before


@pytest.mark.ranks
@pytest.mark.timeout(120)
@pytest.mark.skipif(WHY_NOT is not None, reason=f"2 ranks cannot share memory here: {WHY_NOT}")
def test_a_rank_that_never_arrives_is_named():
    with pytest.raises(launcher.RankError) as info:
        launcher.run(demos.shared_memory_missing_rank, 2, kwargs={"timeout": 0.5}, timeout=60)
    assert "group ranks [1] did not arrive within 0.5 s" in str(info.value)


def test_a_rank_one_call_ahead_does_not_overwrite_what_the_other_still_reads(tmp_path):
    # Two ranks' channels on one file, stepped by hand: rank 0 finishes call 1 and posts call 2
    # before rank 1 adds call 1. Call 1's parts must still be there (the two parities).
    path = tmp_path / "channel"
    path.write_bytes(bytes(shared_memory.FLAGS_BYTES * 2 + 2 * 2 * shared_memory.MAX_BYTES))
    zero, one = (shared_channel.Channel(None, str(path), 2, r) for r in (0, 1))
    x1, y1, x2, y2 = (torch.full((4,), v) for v in (1.0, 10.0, 100.0, 1000.0))
    s, slots0 = zero.post(x1.clone())
    _, slots1 = one.post(y1.clone())
    zero.wait(s)
    assert torch.equal(zero.add(slots0, torch.empty(4)), x1 + y1)
    zero.post(x2.clone())  # rank 0 runs ahead into call 2
    one.wait(s)
    assert torch.equal(one.add(slots1, torch.empty(4)), x1 + y1)
    one.post(y2.clone())
    assert zero.calls == one.calls == 2


def test_the_maximum_is_taken_elementwise_over_the_slots(tmp_path):
    path = tmp_path / "channel"
    path.write_bytes(bytes(shared_memory.FLAGS_BYTES * 3 + 2 * 3 * shared_memory.MAX_BYTES))
    ranks = [shared_channel.Channel(None, str(path), 3, r) for r in range(3)]
    parts = [torch.tensor([1.0, -5.0, 3.0]), torch.tensor([2.0, -7.0, 0.5]), torch.tensor([-1.0, -6.0, 3.5])]
    posted = [rank.post(x.clone()) for rank, x in zip(ranks, parts)]
    ranks[0].wait(posted[0][0])
    got = shared_channel.Channel.add(posted[0][1], torch.empty(3), "max")
    assert torch.equal(got, torch.tensor([2.0, -5.0, 3.5]))
    assert torch.equal(shared_channel.Channel.add(posted[0][1], torch.empty(3)), parts[0] + parts[1] + parts[2])


# ----------------------------------------------------------------------------------------------
# Point to point: the pipeline's links.


def _pair_file(tmp_path, nbytes: int, depth: int):
    size = 2 * shared_memory._direction_bytes(nbytes, depth)
    path = tmp_path / "pair"
    path.write_bytes(bytes(size))
    low = shared_memory._pair(str(path), size, nbytes, depth, peer=1, first=True)
    high = shared_memory._pair(str(path), size, nbytes, depth, peer=0, first=False)
    return low, high  # each (sending Link, receiving Link)


def test_a_link_keeps_order_and_stamps_and_says_when_its_slots_are_full(tmp_path):
    (send, back), (back_send, receive) = _pair_file(tmp_path, nbytes=64, depth=2)
    msgs = [torch.full((4, 4), float(i)) for i in range(4)]  # 64 bytes each
    assert send.send(msgs[0], 0.5) and send.send(msgs[1], 1.5)
    assert not send.send(msgs[2], 2.5)  # both slots unread: the caller keeps it
    first, stamp = receive.receive((4, 4), torch.float32)
    assert torch.equal(first, msgs[0]) and stamp == 0.5
    assert send.send(msgs[2], 2.5)  # slot 0 is free again
    for i in (1, 2):
        got, stamp = receive.receive((4, 4), torch.float32)
        assert torch.equal(got, msgs[i]) and stamp == i + 0.5
    assert not receive.ready()
    assert send.send(msgs[3], 3.5)  # into slot 1 again: what was received is a copy
    assert torch.equal(first, msgs[0])
    assert back_send.send(msgs[1], 9.0)  # the other direction has its own slots
    got, stamp = back.receive((4, 4), torch.float32)
    assert torch.equal(got, msgs[1]) and stamp == 9.0
    with pytest.raises(ValueError, match="does not fit"):
        send.send(torch.zeros(17))


def test_a_receive_from_a_silent_peer_times_out_naming_it(tmp_path, monkeypatch):
    _, (_, receive) = _pair_file(tmp_path, nbytes=64, depth=2)
    monkeypatch.setattr(shared_memory, "TIMEOUT_S", 0.05)
    looked = []
    with pytest.raises(TimeoutError, match="rank 0 sent nothing through shared memory within 0.05 s"):
        receive.receive((4,), torch.float32, progress=lambda: looked.append(1), text="irecv(src=0)")
    assert looked  # the caller's queued sends were tried while it waited


@pytest.mark.ranks
@pytest.mark.timeout(240)
@pytest.mark.skipif(WHY_NOT is not None, reason=f"ranks cannot share memory here: {WHY_NOT}")
@pytest.mark.parametrize("name, virtual", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-v", 2)])
def test_pipeline_messages_through_shared_memory_are_those_of_torch_distributed(name, virtual):
    from parallel_lab.pipeline.communication import messages
    from parallel_lab.pipeline.run import messages_rank
    from parallel_lab.pipeline.schedules import build
    from parallel_lab.pipeline.stages import ModelSpec

    before = set(glob.glob(os.path.join(shared_memory.SHM_DIR, "parallel_lab-*")))
    spec = ModelSpec("mlp", hidden=16, layers=8, batch=16, dtype="float64")
    schedule = build(name, 4, 8, virtual)
    # one slot per direction: a sender is often a message ahead, so its queue is used too
    shared = launcher.run(messages_rank, 4, kwargs=dict(spec=spec, schedule=schedule, depth=1))
    plain = launcher.run(messages_rank, 4, kwargs=dict(spec=spec, schedule=schedule, share_memory=False))
    for r in range(4):
        assert shared[r]["shared"] == shared[r]["neighbours"] != []  # every neighbour is on this host
        assert plain[r]["shared"] == []
        assert shared[r]["loss"] == plain[r]["loss"]
        assert shared[r]["grads"].keys() == plain[r]["grads"].keys()
        for key, g in shared[r]["grads"].items():
            assert torch.equal(g, plain[r]["grads"][key]), f"rank {r} {key}"
    steps, message_bytes = 2, 16 // 8 * 16 * 8  # rows of a microbatch x hidden x float64
    for op in ("isend", "irecv"):
        counted = [r["counts"].get(op, {"count": 0, "bytes": 0}) for r in shared]
        assert sum(c["count"] for c in counted) == steps * messages(schedule)
        assert sum(c["bytes"] for c in counted) == steps * messages(schedule) * message_bytes
    assert set(glob.glob(os.path.join(shared_memory.SHM_DIR, "parallel_lab-*"))) == before
