"""commlog: every torch.distributed call a rank makes is described, counted, and can be switched off."""


import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from parallel_lab.runtime import commlog, demos, launcher, shared_memory, transport

SHARES = shared_memory.why_not_here() is None


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_recording_counts_calls_and_bytes_per_op():
    logs = launcher.run(demos.count_collectives, 2)
    assert logs[0] == {"all_gather_single": {"count": 1, "bytes": 8}, "all_reduce": {"count": 1, "bytes": 16},
                       "send": {"count": 1, "bytes": 24}}
    assert logs[1]["recv"] == {"count": 1, "bytes": 24} and "send" not in logs[1]


def test_describe_names_peer_shape_dtype_and_tag():
    text = commlog.describe("recv", {"tensor": torch.empty(4, 8, dtype=torch.float64), "src": 1, "tag": 3})
    assert text == "recv(src=1, shape=(4, 8), dtype=float64, tag=3)"


def test_activity_prefixes_the_status_and_clears():
    seen = []
    commlog._status = seen.append
    try:
        commlog.set_activity("pipeline action 1B3")
        commlog._set_status("recv(src=2)")
        commlog.set_activity(None)
        commlog._set_status("recv(src=2)")
    finally:
        commlog._status = None
    assert seen == ["pipeline action 1B3: recv(src=2)", "recv(src=2)"]


def test_unwrapped_gives_torch_functions_back_and_restores_the_wrappers(monkeypatch):
    original = c10d.isend

    def wrapper(*args, **kwargs):
        return original(*args, **kwargs)

    wrapper._parallel_lab_original = original
    monkeypatch.setattr(c10d, "isend", wrapper)
    monkeypatch.setattr(dist, "isend", wrapper)
    with commlog.unwrapped():
        assert dist.isend is original and c10d.isend is original
    assert dist.isend is wrapper and c10d.isend is wrapper


@pytest.mark.ranks
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world, groups_of", [(2, None), (4, None), (4, 2)])
@pytest.mark.parametrize("numel", [1000, 128 * 2**10])  # 8 KB: shared memory or one shot; 1 MB: gloo's ring
def test_one_shot_all_reduce_sums_like_gloo_and_is_counted_as_one_all_reduce(world, groups_of, numel):
    ranks = launcher.run(demos.one_shot_against_gloo, world, args=(numel, groups_of))
    size = groups_of or world
    for start in range(0, world, size):
        group = ranks[start:start + size]
        expected = sum(torch.randn(numel, dtype=torch.float64, generator=torch.Generator().manual_seed(r))
                       for r in range(start, start + size))
        for r in group:
            assert torch.allclose(r["ours"], r["gloo"], rtol=0, atol=1e-12)
            assert torch.allclose(r["ours"], expected, rtol=0, atol=1e-12)
            assert torch.equal(r["ours"], group[0]["ours"])  # the same bits on every rank of the group
            assert torch.equal(r["async"], r["ours"])
            assert torch.allclose(r["one_shot"], expected, rtol=0, atol=1e-12)
            assert torch.equal(r["one_shot"], group[0]["one_shot"])
            assert r["used_shared_memory"] == (numel * 8 <= shared_memory.MAX_BYTES and SHARES)
            assert r["used_one_shot"] == (numel * 8 <= transport.ONE_SHOT_MAX_BYTES and size > 2
                                          and not r["used_shared_memory"])
            assert r["calls"] == {"all_reduce": {"count": 1, "bytes": numel * 8}}  # not its sends and receives
