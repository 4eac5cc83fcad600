"""Context parallelism (parallel_lab.context) against the dense attention on one process, in fp64.

Pure tests first (no processes): the log-sum-exp merge against the full softmax, one block's
backward against autograd, the zig-zag assignment and its equal work, the cost model, the input
checks. Then every case (ring and Ulysses, causal and not) on 2 and 4 ranks, in one launch per
world size, read by the tests: outputs, the input gradient and every weight gradient equal the
dense reference to 1e-10; the traffic commlog saw and the score tensors the ranks made equal the
formulas. Last, the command's JSON and its bad-input errors.
"""

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from parallel_lab import hardware, models
from parallel_lab.context import blockwise, cost, run
from parallel_lab.runtime import launcher

CONFIG = run.DEFAULT_CONFIG  # seq 32, hidden 64, 8 heads
BATCH = 2
CPS = (2, 4)
CASES = [(variant, causal) for variant in cost.VARIANTS for causal in (True, False)]
TOL = 1e-10
EXE = str(Path(sys.executable).with_name("parallel-lab"))
pytestmark = pytest.mark.timeout(180)


def _qkv(seed, B=2, n=3, t=12, d=4, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, n, t, d, generator=gen, dtype=torch.float64) * scale for _ in range(3)]


# ----------------------------------------------------------------------------------------------
# The pieces, without processes.


@pytest.mark.parametrize("magnitude", [1.0, 30.0])  # 30: scores ~1e3, exp would overflow unshifted
def test_merge_of_blocks_equals_the_full_softmax(magnitude):
    q, k, v = _qkv(0, scale=magnitude)
    scale = q.shape[-1] ** -0.5
    parts = [blockwise.attend(q, k[..., s, :], v[..., s, :], False, scale)
             for s in (slice(0, 5), slice(5, 7), slice(7, 12))]
    left = blockwise.merge(*blockwise.merge(*parts[0], *parts[1]), *parts[2])
    right = blockwise.merge(*parts[2], *blockwise.merge(*parts[1], *parts[0]))  # other order, other grouping
    full = F.scaled_dot_product_attention(q, k, v)
    full_lse = torch.logsumexp((q @ k.transpose(-2, -1)) * scale, dim=-1)
    for out, lse in (left, right):
        assert torch.isfinite(out).all()
        assert (out - full).abs().max() < 1e-12 * max(1.0, magnitude)
        assert (lse - full_lse).abs().max() < 1e-12 * magnitude ** 2


def test_block_backward_equals_autograd_of_the_full_attention():
    q, k, v = _qkv(1)
    scale = q.shape[-1] ** -0.5
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out.backward(grad)
    # The same attention as two key blocks: the diagonal half (causal) and, for the second half of
    # the queries, the first half of the keys (all visible).
    a, b = slice(0, 6), slice(6, 12)
    o_diag, l_diag = blockwise.attend(q, k, v, True, scale)
    lse, delta = l_diag, (grad * o_diag).sum(-1)
    dq, dk, dv = blockwise.attend_backward(q, k, v, grad, lse, delta, True, scale)
    assert (dq - leaves[0].grad).abs().max() < 1e-12
    assert (dk - leaves[1].grad).abs().max() < 1e-12 and (dv - leaves[2].grad).abs().max() < 1e-12
    # split the keys: rows b see keys a fully; the diagonal blocks a x a and b x b are causal
    o_aa, l_aa = blockwise.attend(q[..., a, :], k[..., a, :], v[..., a, :], True, scale)
    o_ba, l_ba = blockwise.attend(q[..., b, :], k[..., a, :], v[..., a, :], False, scale)
    o_bb, l_bb = blockwise.attend(q[..., b, :], k[..., b, :], v[..., b, :], True, scale)
    o_b, l_b = blockwise.merge(o_ba, l_ba, o_bb, l_bb)
    o, l = torch.cat((o_aa, o_b), dim=-2), torch.cat((l_aa, l_b), dim=-1)
    assert (o - out.detach()).abs().max() < 1e-12
    delta = (grad * o).sum(-1)
    blocks = {"aa": (a, a, True), "ba": (b, a, False), "bb": (b, b, True)}  # (query rows, keys, diagonal)
    g = {name: blockwise.attend_backward(q[..., ra, :], k[..., ca, :], v[..., ca, :], grad[..., ra, :],
                                         l[..., ra], delta[..., ra], diag, scale)
         for name, (ra, ca, diag) in blocks.items()}
    dq = torch.cat((g["aa"][0], g["ba"][0] + g["bb"][0]), dim=-2)
    dk = torch.cat((g["aa"][1] + g["ba"][1], g["bb"][1]), dim=-2)
    dv = torch.cat((g["aa"][2] + g["ba"][2], g["bb"][2]), dim=-2)
    for mine, theirs in ((dq, leaves[0].grad), (dk, leaves[1].grad), (dv, leaves[2].grad)):
        assert (mine - theirs).abs().max() < 1e-12


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_zigzag_assignment(cp):
    seq = 4 * cp
    assert [blockwise.zigzag_chunks(r, cp) for r in range(cp)] == [(r, 2 * cp - 1 - r) for r in range(cp)]
    positions = [blockwise.zigzag_positions(seq, cp, r) for r in range(cp)]
    assert sorted(p for ps in positions for p in ps) == list(range(seq))  # a partition
    assert all(ps == sorted(ps) and len(ps) == seq // cp for ps in positions)  # ascending locally
    x = torch.arange(2 * seq).view(1, seq, 2)
    shards = [blockwise.zigzag_shard(x, cp, r) for r in range(cp)]
    assert all(s[0, :, 0].div(2, rounding_mode="floor").tolist() == positions[r] for r, s in enumerate(shards))
    assert torch.equal(blockwise.zigzag_unshard(shards), x)


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_step_blocks_cover_exactly_the_visible_scores_and_every_rank_does_the_same_work(cp):
    seq, local = 4 * cp, 4
    work = []
    for rank in range(cp):
        pos_q = torch.tensor(blockwise.zigzag_positions(seq, cp, rank))
        done = 0
        for source in range(cp):
            pos_k = torch.tensor(blockwise.zigzag_positions(seq, cp, source))
            visible = pos_q[:, None] >= pos_k[None, :]  # the causal mask between the two blocks
            block = blockwise.step_block(rank, source, cp, local, causal=True)
            computed = torch.zeros_like(visible)
            computed[block.rows, block.cols] = True
            assert not (visible & ~computed).any(), "a visible score was skipped"
            part = visible[block.rows, block.cols]
            if block.diagonal:
                assert torch.equal(part, torch.ones_like(part).tril())
            else:
                assert part.all(), "an off-diagonal block computed a masked score"
            done += part.numel()
            assert blockwise.step_block(rank, source, cp, local, causal=False).rows == slice(0, local)
        work.append(done)
    assert len(set(work)) == 1  # zig-zag: the same scores on every rank
    if cp > 1:  # consecutive positions instead: query p sees p + 1 keys, so the last rank does most
        contiguous = [sum(p + 1 for p in range(r * local, (r + 1) * local)) for r in range(cp)]
        assert contiguous[-1] > contiguous[0]


def test_cost_model_bytes_and_alpha_beta_time():
    link = hardware.Link("test", bandwidth=1e9, latency=1e-5)
    shape = dict(batch=2, seq=64, hidden=32, heads=8, link=link, dtype_bytes=8)
    block = 2 * (64 // 4) * 32 * 8  # one of K or V on one rank, cp 4
    ring = cost.context_cost("ring", cp=4, **shape)
    assert (ring.messages_forward, ring.messages_backward) == (3, 3 + 4)
    assert (ring.bytes_forward, ring.bytes_backward) == (3 * 2 * block, 7 * 2 * block)
    assert ring.comm_s == pytest.approx(10 * (1e-5 + 2 * block / 1e9))
    uly = cost.context_cost("ulysses", cp=4, **shape)
    assert uly.messages_forward == uly.messages_backward == 2 * 3
    assert uly.bytes_forward == uly.bytes_backward == 3 * 4 * block // 4
    assert uly.comm_forward_s == pytest.approx(2 * 3 * 1e-5 + 3 * 4 * block / 4 / 1e9)
    # scores: ring one block of (seq/cp)^2, Ulysses seq^2 for heads/cp heads
    assert ring.score_peak_bytes == 2 * 8 * 16 * 16 * 8 and uly.score_peak_bytes == 2 * 2 * 64 * 64 * 8
    full = 2 * 8 * 64 * 64 * 8
    assert uly.score_forward_bytes == full // 4
    assert ring.score_forward_bytes == full * 5 // 32  # causal: (cp+1)/(2cp) of seq^2/cp
    assert cost.context_cost("ring", cp=4, causal=False, **shape).score_forward_bytes == full // 4
    one = cost.context_cost("ring", cp=1, **shape)
    assert one.bytes_sent == 0 and one.comm_s == 0 and cost.context_cost("ulysses", cp=1, **shape).comm_s == 0
    # with compute: exposed communication is between 0 and all of it; fast compute exposes more
    slow, fast = (cost.context_cost("ring", cp=4, flops=f, **shape) for f in (1e6, 1e12))
    assert 0 <= slow.exposed_comm_s <= fast.exposed_comm_s <= fast.comm_s + 1e-15
    assert cost.context_cost("ulysses", cp=4, flops=1e6, **shape).exposed_comm_s == pytest.approx(uly.comm_s)
    with pytest.raises(ValueError, match="variant must be one of"):
        cost.context_cost("star", cp=2, **shape)


@pytest.mark.parametrize("cp,variant,seq,heads,message", [
    (4, "ring", 36, 8, "seq 36 is not divisible by 2·cp = 8"),
    (3, "ulysses", 24, 8, "heads 8 is not divisible by cp 3"),
    (4, "ulysses", 30, 8, "seq 30 is not divisible by cp 4"),
    (9, "ring", 36, 8, "cp 9 > 8"),
    (0, "ring", 32, 8, "cp must be a positive integer, got cp 0"),
    (2, "star", 32, 8, "variant must be one of ring, ulysses"),
])
def test_check_context_parallel_names_the_broken_invariant(cp, variant, seq, heads, message):
    config = models.GPTConfig(vocab=8, seq=seq, hidden=64, heads=heads, layers=1)
    with pytest.raises(ValueError, match=message):
        run.check_context_parallel(config, cp, variant)


def test_a_refused_degree_reads_chinese_in_the_zh_hant_edition():
    """Lesson 14's zh-Hant edition shows why Ulysses refuses cp 3, in Chinese, with the values."""
    from parallel_lab.i18n import using

    config = models.GPTConfig(vocab=8, seq=24, hidden=64, heads=8, layers=1)
    with using("zh-Hant"), pytest.raises(ValueError) as caught:
        run.check_context_parallel(config, 3, "ulysses")
    assert str(caught.value) == "注意力頭數 heads 8 無法被 cp 3 整除（Ulysses 讓每個 rank 拿到 heads / cp 個注意力頭）"


def test_run_context_rejects_bad_input_before_starting_ranks(monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("ranks were started")

    monkeypatch.setattr(launcher, "run", no_launch)
    with pytest.raises(ValueError, match="seq 30 is not divisible by 2·cp = 4"):
        run.run_context(2, "ring", seq=30)
    with pytest.raises(ValueError, match="hidden 64 is not divisible by heads 6"):
        run.run_context(2, "ulysses", heads=6)


# ----------------------------------------------------------------------------------------------
# On real ranks: every case per world size in one launch.


@functools.lru_cache(maxsize=None)
def _reference(causal):
    return run.reference(CONFIG, causal, torch.float64, seed=0, batch=BATCH)


@functools.lru_cache(maxsize=None)
def results(cp):
    jobs = [dict(variant=v, causal=c, config=CONFIG, batch=BATCH, ref=_reference(c)) for v, c in CASES]
    per_rank = launcher.run(run.check_cases, cp, args=(jobs,), timeout=150)
    return {case: [ranks[i] for ranks in per_rank] for i, case in enumerate(CASES)}


def _block_bytes(cp):  # one of K or V on one rank, fp64
    return BATCH * (CONFIG.seq // cp) * CONFIG.hidden * 8


@pytest.mark.ranks
@pytest.mark.parametrize("variant,causal", CASES, ids=[f"{v}-{'causal' if c else 'full'}" for v, c in CASES])
@pytest.mark.parametrize("cp", CPS)  # the outer loop: each cp's ranks start once
def test_matches_dense_attention(cp, variant, causal):
    ranks = results(cp)[variant, causal]
    for r in ranks:
        assert r["output_diff"] < TOL, (r["rank"], r["output_diff"])
        assert r["grad_diff"] < TOL, (r["rank"], r["grad_diffs"])
    whole = run.unshard([r["output"] for r in ranks], variant)
    assert (whole - _reference(causal)["output"]).abs().max() < TOL
    expected = {"q.weight", "q.bias", "k.weight", "k.bias", "v.weight", "v.bias", "proj.weight", "proj.bias", "<input>"}
    assert set(ranks[0]["grad_diffs"]) == expected  # every weight's gradient, and the input's


@pytest.mark.ranks
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cp", CPS)
def test_ring_sends_cp_minus_one_kv_blocks_forward_and_their_gradients_backward(cp, causal):
    kv = 2 * _block_bytes(cp)  # K and V travel as one message
    for r in results(cp)["ring", causal]:
        assert r["forward"] == {"isend": {"count": cp - 1, "bytes": (cp - 1) * kv},
                                "irecv": {"count": cp - 1, "bytes": (cp - 1) * kv}}
        # backward: the K/V blocks around again (cp - 1) and the dK/dV accumulators (cp hops)
        assert r["backward"]["isend"] == {"count": 2 * cp - 1, "bytes": (2 * cp - 1) * kv}
        assert set(r["backward"]) == {"isend", "irecv"}
        assert r["grad_sync"]["all_reduce"]["count"] == 1


@pytest.mark.ranks
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cp", CPS)
def test_ulysses_makes_two_all_to_alls_each_way(cp, causal):
    block = _block_bytes(cp)
    for r in results(cp)["ulysses", causal]:
        # q, k, v in (3 blocks), the output back (1 block); commlog counts each rank's whole buffer
        assert r["forward"] == {"all_to_all_single": {"count": 2, "bytes": 4 * block}}
        assert r["backward"] == {"all_to_all_single": {"count": 2, "bytes": 4 * block}}


@pytest.mark.ranks
@pytest.mark.parametrize("variant,causal", CASES, ids=[f"{v}-{'causal' if c else 'full'}" for v, c in CASES])
@pytest.mark.parametrize("cp", CPS)
def test_measured_traffic_and_score_memory_equal_the_cost_model(cp, variant, causal):
    report = run.summarize(results(cp)[variant, causal], variant, causal, CONFIG, BATCH, torch.float64)
    scores = report["score_bytes_per_rank"]
    assert report["bytes_sent_per_rank"]["measured"] == report["bytes_sent_per_rank"]["predicted"]
    assert scores["measured"] == scores["predicted"]
    assert scores["forward_total_measured"] == scores["forward_total_predicted"]
    # what is compared: the largest score tensor at once; one process holds seq^2 for every head
    per_head = {"ring": cp * cp, "ulysses": cp}[variant]
    assert scores["measured"] * per_head == scores["one_process"]
    totals = {r["scores_forward"]["total_bytes"] for r in results(cp)[variant, causal]}
    assert len(totals) == 1  # every rank the same amount of score work (zig-zag under the mask)


@pytest.mark.ranks
def test_run_context_contract():
    report = run.run_context(4, "ulysses", causal=False)
    for key in ("max_output_diff", "max_grad_diff", "variant", "score_bytes_per_rank", "collectives"):
        assert key in report
    assert report["variant"] == "ulysses" and report["cp"] == 4 and report["causal"] is False
    assert report["max_output_diff"] < TOL and report["max_grad_diff"] < TOL
    assert set(report["score_bytes_per_rank"]) >= {"measured", "predicted"}
    assert report["collectives"] == {"all_to_all_single": {"count": 4, "bytes": 8 * _block_bytes(4)}}
    json.dumps(report)


@pytest.mark.ranks
def test_cli_json_contract():
    out = subprocess.run([EXE, "run", "context", "--cp", "2", "--variant", "ring", "--json"],
                         capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["variant"] == "ring" and report["causal"] is True and report["cp"] == 2
    assert report["max_output_diff"] < TOL and report["max_grad_diff"] < TOL
    assert report["score_bytes_per_rank"]["measured"] == report["score_bytes_per_rank"]["predicted"]
    assert report["collectives"]["isend"]["count"] == 1 + 3


@pytest.mark.parametrize("args,message", [
    (("--cp", "4", "--seq", "30"), "seq 30 is not divisible by 2·cp = 8"),
    (("--cp", "3", "--variant", "ulysses"), "heads 8 is not divisible by cp 3"),
    (("--cp", "9"), "cp 9 > 8"),
])
def test_cli_bad_input_exits_2_with_one_line_before_any_process(args, message):
    out = subprocess.run([EXE, "run", "context", *args, "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1
