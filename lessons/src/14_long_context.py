# %% [markdown]
# # 14 · Long sequences: context parallelism
#
# > *Tensor parallelism splits a layer's math, pipeline parallelism its layers; neither splits the
# > sequence. When one sequence is too long for one GPU, split the sequence itself.*
#
# **Learning goals.** By the end of this lesson you can
#
# - say why the attention scores, s × s per head, are what stops one GPU at long sequences, and
#   compute their bytes;
# - compute attention one key block at a time and combine the blocks with the **log-sum-exp merge**
#   (online softmax), exactly, without ever holding the s × s matrix;
# - follow **ring attention** step by step: which K/V block each rank holds at each step, which
#   scores it computes under the causal mask, and why the **zig-zag** split gives every rank the
#   same work;
# - run ring attention and **DeepSpeed-Ulysses** on 2 and 4 real ranks, check outputs and every
#   gradient against the dense attention in fp64, and measure the scores each rank holds;
# - compare the two: Ulysses' two all-to-alls and its limit (heads divisible by cp) against the
#   ring's cp − 1 hops hidden behind compute;
# - write the merge yourself, checked inside ring attention on real ranks.
#
# You need lesson 01 (ranks, send/recv, all-to-all, the α–β model) and lesson 02 (attention split
# by heads). Notation: s the sequence length, cp the number of ranks the sequence is split over
# (the *context-parallel* size), t = s / cp positions per rank, n heads of width d, batch B.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. The s² wall
#
# Softmax attention (Vaswani et al. 2017, *Attention Is All You Need*) computes, for every head,
# the scores S = QKᵀ/√d: one number per (query, key) pair, an s × s matrix, then softmax(S)·V.
# Everything else in a transformer layer grows like s; the scores grow like s². Korthikanti et al.
# 2022 (*Reducing Activation Recomputation in Large Transformer Models*) count a layer's activations
# as sbh·(34 + 5as/h) bytes: the 5as²b term is the scores (a heads), and at long s it dominates.
#
# Take a 70B-class model's attention (64 heads) in bf16, batch 1, one layer. How many GB do its
# scores take at 131,072 tokens (128k)?

# %%
from parallel_lab.show import context as cf

heads, s, bytes_per_value = 64, 131072, 2
print(cf.scores_line(heads, s, bytes_per_value))
cf.score_memory_figure()

# %% [markdown]
# Fifteen H200s would not hold one layer's scores at 128k tokens, and splitting the *rows* over cp
# GPUs only divides that by cp: each still needs s²/cp per head. Two ideas remove the wall:
#
# 1. never hold the whole row: compute attention **one block of keys at a time** and combine the
#    blocks exactly (section 2); on one GPU that is FlashAttention (Dao et al. 2022);
# 2. give each GPU a **block of the sequence** and pass the key/value blocks between GPUs, so each
#    one only ever holds t × t scores: **ring attention** (Liu, Zaharia & Abbeel 2023, *Ring
#    Attention with Blockwise Transformers for Near-Infinite Context*; section 3); or swap the
#    sequence split for a head split with an all-to-all: **DeepSpeed-Ulysses** (Jacobs et al. 2023;
#    section 5).

# %% [markdown]
# ## 2. Attention one block at a time: the log-sum-exp merge
#
# Split the keys (and values) into blocks. For one query and one block b, let `lse_b =
# log Σ_{j in b} e^{S_j}` (the log of the block's softmax denominator) and `out_b` the attention
# over that block alone, normalised by its own denominator. Two blocks a and b combine exactly:
#
#     lse = log(e^lse_a + e^lse_b)
#     out = e^(lse_a − lse) · out_a + e^(lse_b − lse) · out_b
#
# The weights `e^(lse_x − lse)` are each block's share of the joint denominator. This is the
# *online softmax* of Milakov & Gimelshein 2018 (*Online normalizer calculation for softmax*),
# the rescaling FlashAttention does between key blocks (Dao et al. 2022), and the step ring
# attention repeats at every hop (Liu et al. 2023). `context.blockwise.attend` returns a block's
# `(out, lse)`; `blockwise.merge` combines two. Check it numerically: 16 keys in 4 blocks, merged one
# after the other, against the full softmax in fp64.

# %%
import torch

from parallel_lab.context import blockwise

gen = torch.Generator().manual_seed(0)
q = torch.randn((2, 2, 8, 4), generator=gen, dtype=torch.float64)  # (B, n, 8 queries, d)
k, v = (torch.randn((2, 2, 16, 4), generator=gen, dtype=torch.float64) for _ in range(2))  # 16 keys
scale = q.shape[-1] ** -0.5
full = torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v  # (B, n, 8, d): all 8 x 16 scores

out, lse = blockwise.attend(q, k[..., :4, :], v[..., :4, :], causal=False, scale=scale)
for first in (4, 8, 12):  # the other three blocks of 4 keys, one at a time
    out_b, lse_b = blockwise.attend(q, k[..., first:first + 4, :], v[..., first:first + 4, :], False, scale)
    out, lse = blockwise.merge(out, lse, out_b, lse_b)
print(cf.blocks_merged_lines((out - full).abs().max().item(), queries=8, block=4, keys=16))

# %% [markdown]
# The difference is rounding (the same sums in another order). Why the weights are written with
# `lse` and not as `e^lse_a / (e^lse_a + e^lse_b)`: scores grow with the model's sharpness, and
# e^x overflows fp64 above x ≈ 709 (bf16 and fp32 above 88). With `lse ≥ max(lse_a, lse_b)`, every
# exponent in the merge is ≤ 0, the same trick as a stable softmax:

# %%
big_a, big_b = torch.tensor([1000.0], dtype=torch.float64), torch.tensor([995.0], dtype=torch.float64)
naive = torch.log(torch.exp(big_a) + torch.exp(big_b))
m = torch.maximum(big_a, big_b)
stable = m + torch.log(torch.exp(big_a - m) + torch.exp(big_b - m))
print(cf.stable_lse_line(naive.item(), stable.item()))

# %% [markdown]
# ## 3. Ring attention, step by step
#
# Each of cp ranks holds t = s / cp positions: its queries, keys and values. Ring attention (Liu et
# al. 2023) keeps the queries where they are and sends the **key/value blocks around a ring**:
# at step 0 a rank attends to its own block; then it sends the K/V block it holds to rank r + 1 and
# receives one from rank r − 1, attends to it, merges, and so on, cp − 1 hops. The next block's
# transfer is posted before the current block is computed (`context/ring.py`), so communication
# hides behind compute when a block's attention takes longer than a hop. The largest score tensor a
# rank ever holds is one t × t block per head.

# %% [markdown]
# **The causal mask and the zig-zag split.** With a causal mask, query i sees keys 0 … i. If rank r
# held positions r·t … (r+1)·t − 1, rank 0 would see only its own block and the last rank every
# block: the last rank does cp times the work of the first, and the ring goes at its pace.
# Megatron-LM's context parallelism (`get_batch_on_this_cp_rank`) cuts the sequence into 2·cp
# chunks and gives rank r chunks r and 2·cp − 1 − r: an early chunk and a late one ("zig-zag").
# Striped attention (Brandon et al. 2023) balances the same way with round-robin tokens instead of
# chunks. With the zig-zag split, at every step after the first a rank computes exactly half a
# block (`blockwise.step_block`): both of its query chunks against the first chunk of an earlier
# rank's block, or its later query chunk against all of a later rank's block.
#
# The table: at each step, whose K/V block each rank holds and the rows × columns of the scores it
# computes (◣: its own block, computed whole and masked inside).

# %%
print(cf.ring_table(cp=4, seq=16))

# %% [markdown]
# The same in pictures: the 16 × 16 score matrix in global positions (queries down, keys across),
# one panel per step, each score coloured by the rank that computes it then. Together the four
# panels cover the lower triangle exactly once.

# %%
cf.ring_steps_figure(cp=4, seq=16)

# %% [markdown]
# Count the work per rank in one forward (a diagonal block counted whole): the contiguous split
# gives rank r its r + 1 blocks, the zig-zag split every rank t² + (cp − 1)·t²/2.

# %%
work = cf.causal_work(cp=4, seq=16)
print(cf.work_line(work))
cf.work_figure(cp=4, seq=16)

# %% [markdown]
# **The backward.** Nothing but q, k, v, the output and the final lse is kept between forward and
# backward. The backward recomputes each block's probabilities from its scores and the *final* lse,
# P = exp(S − lse), and uses FlashAttention-2's softmax gradient dS = P ∘ (dP − rowsum(dO ∘ O))
# (Dao 2023). The K/V blocks go round the ring a second time, each with the accumulator of its
# gradient (dK, dV), to which every rank adds its share; after cp steps the accumulator takes one
# last hop home: per rank, cp − 1 K/V messages in the forward, cp − 1 K/V and cp gradient messages
# in the backward (`context/ring.py`).

# %% [markdown]
# ## 4. On real ranks, against the dense attention
#
# `context.run.run_context` runs the course GPT's attention layer (batch 2, s = 32, 8 heads of
# width 8, causal) with its attention core replaced by ring attention or Ulysses on cp real ranks,
# and compares each rank's output and input gradient with its part of the dense layer's, and every
# weight gradient after one all-reduce over the cp ranks (each rank's weight gradients cover its
# tokens only), all in fp64. It also measures, on every rank, the largest score tensor it creates,
# forward or backward (`blockwise.measuring`), and the bytes it sends (`commlog`).
#
# **Predict** before the run: with ring attention on cp = 4 ranks, how many bytes is the largest
# score tensor one rank holds at once? One process holds the whole 2 × 8 × 32 × 32 fp64 scores,
# 131,072 bytes. Write it below (graded: 1 point within ±10 %).

# %% tags=["answer:predict:ring-score-bytes"]
my_prediction = None  # bytes of the largest score tensor per rank, ring attention, cp = 4
### BEGIN SOLUTION
my_prediction = 2 * 8 * 8 * 8 * 8  # one block: batch x heads x t x t x 8 bytes, t = 32 / 4
### END SOLUTION

# %% tags=["check:predict:ring-score-bytes"]
from parallel_lab.show.predict import predict

guess = predict("ring-score-bytes", my_prediction)

# %% tags=["reveals:ring-score-bytes"]
from parallel_lab.context.run import run_context

results = [run_context(cp=cp, variant=variant) for variant in ("ring", "ulysses") for cp in (2, 4)]
print(cf.runs_table(results))
ring4 = results[1]
guess.versus(ring4["score_bytes_per_rank"]["measured"], "measured on 4 ranks")

# %% [markdown]
# Every output and gradient agrees with the dense layer to rounding (fp64), on 2 and 4 ranks, with
# both methods. The score columns are the memory story: one process holds B·n·s² scores; a rank of
# ring attention holds one t × t block per head, B·n·(s/cp)², **cp² times less** (the column
# "1 proc ÷" is one process / measured); a Ulysses rank holds all s × s scores of n / cp heads,
# B·(n/cp)·s², cp times less: exactly s²/cp per head's worth, the plain row split's amount.
# Measured and predicted (`context.cost.context_cost`) agree, and so do the bytes sent.

# %% tags=["reveals:ring-score-bytes"]
print(cf.score_bytes_lines(results))
print(cf.calls_line(ring4))

# %% [markdown]
# In a real implementation the blocks are tiled further inside each GPU (a FlashAttention kernel
# never stores a t × t block either); the course's blocks are whole so that their size can be
# measured. What context parallelism divides by cp in any case is everything else that grows with
# s: the layer's activations, q, k, v and the output, t = s / cp positions per rank.
#
# ## 5. DeepSpeed-Ulysses: all-to-all, and its limit
#
# Ulysses (Jacobs et al. 2023, *DeepSpeed Ulysses: System Optimizations for Enabling Training of
# Extreme Long Sequence Transformer Models*) does not pass blocks around. Each rank holds t
# consecutive positions of every head; one **all-to-all** (lesson 01: rank i sends its i-th chunk to
# each rank) of q, k and v turns that into the *whole sequence* of n / cp heads; each rank runs
# ordinary attention on its heads, and a second all-to-all returns the output to the sequence split
# (`context/ulysses.py`). The backward makes the same two calls in reverse.
#
# Its limit is in the middle step: the heads are what gets split, so **cp must divide the number
# of heads** (and a rank can never go below one head). The course layer has 8 heads: Ulysses on 3
# ranks is refused before any process starts, while ring attention, which splits only the
# sequence, runs on 3 ranks (with s = 48, divisible into 2·cp = 6 chunks).

# %%
try:
    run_context(cp=3, variant="ulysses")
except ValueError as err:
    print(cf.refused_line("Ulysses", 3, err))
print(cf.run_line(run_context(cp=3, variant="ring", seq=48)))

# %% [markdown]
# With grouped-query attention (few K/V heads) the limit bites earlier, which is why long-context
# systems combine the two: Ulysses inside a node over the heads, ring across nodes (the hybrid of
# Fang & Zhao 2024, *USP: A Unified Sequence Parallelism Approach*).
#
# ## 6. What each costs
#
# `context.cost.context_cost` counts one rank's messages and bytes per step (forward + backward of
# one attention layer) with the α–β model of lesson 01 (a message of n bytes costs α + n·β, β the
# inverse bandwidth in seconds per byte), and with a device's FLOP/s, the attention's compute and the
# communication compute does not hide:
#
# - **ring**: 2(cp − 1) K/V hops and cp gradient hops of 2·B·t·h values each (h = n·d, the layer's
#   width; K and V, or their gradients: 2·B·t·h·b bytes at b bytes per value, 2 in bf16), each
#   hidden behind a block of attention when that block takes longer than the hop;
# - **Ulysses**: four all-to-alls (q, k, v stacked; the output; their backwards), (cp − 1)/cp of
#   each rank's buffer leaving the rank, nothing to hide them behind.
#
# The table: the 128k-token, 64-head layer of section 1 in bf16, batch 1, causal, NVLink 4
# (`hardware.LINKS["nvlink4"]`), 400 TFLOP/s achieved per GPU:

# %%
print(cf.cost_table(cf.compare_costs(cps=(2, 4, 8))))

# %% [markdown]
# Ulysses sends less, and less per rank as cp grows (each rank's share of the sequence shrinks),
# but every byte of it is on the critical path; the ring sends more, almost all of it hidden behind
# the blocks' attention, whose cost grows like t² while a hop grows like t. The score column is the
# naive per-rank peak of section 4 at this size (real kernels tile it away). Which wins depends on
# the link and the head count; PyTorch's own `context_parallel` implements the ring (with
# all-gather as an alternative), but on CPU its ring does not run:

# %%
from parallel_lab.context import peer

print(peer.WHY_NOT)

# %% [markdown]
# ## 7. Exercise: write the merge yourself
#
# Write `my_merge(out_a, lse_a, out_b, lse_b)`: two partial attention results of the same queries
# over two disjoint key blocks, `out_*` of shape `(..., t, d)` and `lse_*` of shape `(..., t)`;
# return `(out, lse)`, the attention over both blocks and its log-sum-exp (section 2's formulas).
# It must be **stable** and handle **queries that saw no key**: a block that saw no key of a query
# has `lse = −inf` (and `out = 0` there); if neither block saw a key, the result is `out = 0`,
# `lse = −inf` (this pair is the merge's identity, so an online loop can start from it) — not nan.

# %% [markdown]
# The check
#
# - calls your merge directly on five cases whose expected result it computes from the scores
#   (attention over both blocks together): ordinary scores; scores near 1000, where e^x overflows
#   even in fp64; block b or block a fully masked for some queries; no key in either block;
# - runs ring attention with **your merge** in place of the library's on 4 real ranks, causal with
#   the zig-zag split, not causal, and causal with sharp scores (q × 300), and compares every rank's
#   output and its q, k, v gradients with the dense attention in fp64 (the backward uses your lse).
#
# **What the check forbids:** the library's merge (no import of `parallel_lab`) and torch's
# `softmax`, `log_softmax`, `logsumexp`, `logaddexp` and `scaled_dot_product_attention`, which would
# do the stable arithmetic for you: use `torch.exp`, `torch.log`, `torch.maximum`, `torch.where`.
# Keep all your code in the answer cell: the grader reads that cell alone and runs it on fresh ranks
# of its own.

# %% tags=["answer:lse-merge"]
def my_merge(out_a, lse_a, out_b, lse_b):
    """(out_a, lse_a), (out_b, lse_b): attention of the same queries over two key blocks,
    out (..., t, d), lse (..., t). Returns (out, lse) over both blocks.

    Hints: m = the larger lse (where both are -inf, use 0 instead, so that lse - m is not nan);
    the weights e^(lse_x - m) are then <= 1; lse = m + log(sum of weights); divide by the sum of
    weights (by 1 where it is 0)."""
    ### BEGIN SOLUTION
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # no key in either block: any finite m
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)  # every exponent <= 0: no overflow
    total = w_a + w_b
    lse = m + torch.log(total)  # log(0) = -inf: still the identity
    total = torch.where(total == 0, torch.ones_like(total), total)
    out = (w_a.unsqueeze(-1) * out_a + w_b.unsqueeze(-1) * out_b) / total.unsqueeze(-1)
    ### END SOLUTION
    return out, lse


# %% [markdown]
# Try it on section 2's blocks before checking it (two halves of the 16 keys against the full
# softmax):

# %%
try:
    out_a, lse_a = blockwise.attend(q, k[..., :8, :], v[..., :8, :], False, scale)
    out_b, lse_b = blockwise.attend(q, k[..., 8:, :], v[..., 8:, :], False, scale)
    mine, _ = my_merge(out_a, lse_a, out_b, lse_b)
    print(cf.merged_line("my_merge", (mine - full).abs().max().item()))
except NotImplementedError:
    print(cf.not_written_yet("my_merge"))

# %% tags=["check:lse-merge", "points:2"]
from parallel_lab.exercises import check_lse_merge

verdict = check_lse_merge(my_merge)

# %%
from parallel_lab.exercises import reveal

reveal("lse-merge", blockwise.merge)  # the library's version, once yours has passed

# %%
from parallel_lab.runtime import launcher

launcher.shutdown()  # stop the rank processes (a Binder pod has little memory)

# %% [markdown]
# ## What to remember
#
# - Attention's scores are s × s per head: at long sequences they, not the weights, fill a GPU
#   (the 5as²b term of Korthikanti et al. 2022). Splitting rows over cp GPUs only divides that by cp.
# - A block's attention with its log-sum-exp merges exactly with another's:
#   `lse = log(e^lse_a + e^lse_b)`, `out = Σ e^(lse_x − lse)·out_x`, every exponent ≤ 0 (online
#   softmax, Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022). (0, −inf) is its identity.
# - **Ring attention** (Liu et al. 2023) keeps the queries and passes K/V blocks round the ring,
#   cp − 1 hops overlapped with compute; a rank holds t × t scores per head, B·n·(s/cp)². Under a
#   causal mask the **zig-zag** split (chunks r and 2·cp − 1 − r, Megatron-LM) gives every rank the
#   same work.
# - **Ulysses** (Jacobs et al. 2023) swaps the sequence split for a head split with an all-to-all,
#   runs ordinary attention on n / cp heads, and swaps back: fewer bytes, none hidden, and cp must
#   divide the heads.
# - Both give exactly the dense attention's outputs and gradients: context parallelism changes where
#   the scores are computed, never what they are.
