# %% [markdown]
# # 02 · Tensor parallelism
#
# > *Tensor parallelism splits the computation inside a single layer — for example a large weight
# > matrix — so that each GPU computes part of the output.*
# > (張量並行性將計算分成單層，例如分割一個大的權重矩陣，以便每個 GPU 計算部分輸出。)
#
# **Learning goals.** By the end of this lesson you can
#
# - split a linear layer `Y = X·W` by **columns** or by **rows** of `W`, say what each GPU holds
#   and which collective recombines the pieces (none, all-gather or all-reduce);
# - explain Megatron-LM's MLP and attention split and its conjugate operators **f** and **g**, and
#   check on real ranks that a transformer block does **two all-reduces forward and two backward**;
# - write a row-parallel forward and the operator g yourself, checked on 2 and 4 ranks;
# - estimate a layer's compute time against its communication time and explain **why tensor
#   parallelism stays inside a node**;
# - describe two refinements: sequence parallelism and the vocabulary-parallel loss.
#
# This lesson answers two questions of the course FAQ: **how does tensor (intra-layer) splitting
# work?** (FAQ 3, 張量（層內）並行分割如何運作？) — sections 1-5 — and **why is tensor parallelism usually
# kept within a single node?** (FAQ 6, 為什麼張量並行性通常保留在單一節點內？) — section 6. Lesson 00
# drew the MLP split as a sketch; here it runs on simulated GPUs (ranks, lesson 01) and is checked
# against the dense layer on one process. Everything runs in fp64, so a correct split matches the
# dense result up to rounding (~1e-15); the cells print whether the difference is below 1e-12.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. One matrix, two ways to cut it
#
# Take one linear layer `Y = X·W`: `X` is (tokens × k), `W` is (k × m), `Y` is (tokens × m). Each
# output value is a sum over k: `Y[i, j] = Σ_k X[i, k]·W[k, j]`. With p GPUs there are two natural
# cuts of `W` (Shoeybi et al. 2019, *Megatron-LM*, §3):
#
# - **Column split** `W = [W₀ | W₁ | …]`: rank r holds m/p whole columns and computes
#   `Y_r = X·W_r`, whole columns of `Y`. It needs all of `X` and **no communication**; if someone
#   needs all of `Y`, an **all-gather** collects the columns.
# - **Row split**: rank r holds k/p rows `W_r` and the matching k/p columns `X_r` of the input. It
#   computes `X_r·W_r`, a full-size `Y`-shaped **partial sum** over its part of k. Only the sum of
#   all of them is `Y`: an **all-reduce** adds them.
#
# **Predict:** after its own multiplication, before any communication, which split leaves every rank
# with a tensor of `Y`'s full shape? Is that tensor `Y`?

# %%
from parallel_lab.show import tensor as figures

figures.split_figure("column", tp=2)

# %%
figures.split_figure("row", tp=2)

# %% [markdown]
# The row split: every rank holds a tensor of `Y`'s shape, but only its partial sum — `Y` exists
# nowhere until the all-reduce. (Grey marks what every rank holds in full, the same copy.)
#
# Now the real layers. `ColumnParallelLinear.from_dense(linear)` keeps this rank's columns of a dense
# `nn.Linear`; `RowParallelLinear.from_dense(linear)` its rows (PyTorch stores `weight` as (out × in),
# i.e. `Wᵀ`, so "columns of W" are rows of `weight`). This is what each rank runs: the same dense
# layer and input everywhere (from a seed), cut three ways, compared with the dense output.

# %%
import inspect

from parallel_lab.runtime import launcher
from parallel_lab.tensor import demos as lesson

print(inspect.getsource(lesson.column_and_row))

# %%
def shape(dims):
    return "×".join(map(str, dims))


def show_splits(world_size):
    per_rank = launcher.run(lesson.column_and_row, world_size)
    print(f"on {world_size} ranks           W (whole)  W_r (rank 0)  out (rank 0)  "
          f"collectives on a rank   matches dense")
    for split, mine in per_rank[0].items():
        ops = ", ".join(f"{op} x{row['count']}" for op, row in mine["collectives"].items()) or "none"
        same = all(r[split]["max_diff"] < lesson.TOLERANCE for r in per_rank)
        print(f"  {split:<22} {shape(mine['W']):<10} {shape(mine['W_r']):<13} {shape(mine['Y_r']):<13} "
              f"{ops:<23} {same}")


show_splits(2)
show_splits(4)

# %% [markdown]
# Each rank holds 1/p of `W` and does 1/p of the multiplications. The column split talks only if
# you gather its output; the row split must all-reduce — but it needs only its slice of `X`, which is
# exactly what a column split produces. That is the trick of the next sections. The forward of the
# column-parallel layer (`f` is the subject of section 3):

# %%
from parallel_lab.tensor.layers import ColumnParallelLinear

print(inspect.getsource(ColumnParallelLinear.forward))

# %% [markdown]
# ## 2. Exercise: the row-parallel forward
#
# Write `my_row_parallel_forward(x_shard, w_shard, bias, group)`. Rank r of the tensor-parallel
# `group` (p ranks) gets
#
# - `x_shard`: shape (..., k/p), its slice of the last dimension of `X`;
# - `w_shard`: shape (k/p, m), the matching rows of `W` (math orientation: `Y = X·W`);
# - `bias`: shape (m,), the same on every rank.
#
# Return all of `Y = X·W + bias`, shape (..., m), on every rank of the group. Use
# `dist.all_reduce(tensor, group=group)` (it sums in place). **Add the bias once**: added before the
# sum, it would be counted p times.
#
# The check runs your function on 2 and on 4 real ranks against the dense product (integer-valued
# fp64 tensors, so the comparison is exact); on 4 ranks also as two groups of 2, `{0, 1}` and
# `{2, 3}`, with different data — a collective that forgets `group=` sums over all four.
#
# **What the check forbids:** the library's parallel layers and mappings (`parallel_lab.tensor`):
# the one collective is your own `dist.all_reduce`.
#
# Keep all your code in the answer cell below: the grader reads that cell alone from your notebook and
# runs it on fresh ranks of its own, so helpers defined in other cells are not seen.

# %% tags=["answer:row-parallel-forward"]
import torch
import torch.distributed as dist


def my_row_parallel_forward(x_shard, w_shard, bias, group):
    ### BEGIN SOLUTION
    partial = x_shard @ w_shard  # (..., m): this rank's share of the sum over k
    dist.all_reduce(partial, group=group)  # the sum over the group: X·W, on every rank
    return partial + bias  # once, after the sum
    ### END SOLUTION


# %% [markdown]
# **Try it on ranks** before the check: this cell runs on 2 ranks after your answer cell's
# definitions (`--with`); each rank passes its half of the columns of X and of the rows of W, and
# compares what your function returns with the dense X·W + bias.

# %%
# %%ranks 2 --with my_row_parallel_forward
torch.manual_seed(0)  # the same X, W and bias on every rank
x, w, bias = (torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64),
              torch.randn(5, dtype=torch.float64))
half = slice(2 * dist.get_rank(), 2 * dist.get_rank() + 2)
y = my_row_parallel_forward(x[:, half], w[half], bias, dist.group.WORLD)
print("equal to the dense X·W + bias:", torch.allclose(y, x @ w + bias))

# %% tags=["check:row-parallel-forward", "points:2"]
from parallel_lab.exercises import check_row_parallel_forward

verdict = check_row_parallel_forward(my_row_parallel_forward)

# %% [markdown]
# ## 3. The Megatron MLP: column, then row — and the operators f and g
#
# A transformer's MLP is `Z = GeLU(X·A)·B` (A: h × 4h, B: 4h × h). Megatron-LM splits **A by
# columns and B by rows**. Each rank gets whole columns of `X·A`, so the non-linear GeLU applies on
# its own piece (a row split of A would need the sum *before* GeLU: GeLU(P₀ + P₁) ≠ GeLU(P₀) + GeLU(P₁)),
# and the GeLU output is already split the way the row split of B wants its input. The only
# communication is one all-reduce at the end:
#
# ```
#                  X    every rank holds all of it
#                  f    forward: identity
#                       backward: all-reduce of dL/dX
#         ┌────────┴────────┐
#  rank 0: GeLU(X·A₀)·B₀   rank 1: GeLU(X·A₁)·B₁
#         └────────┬────────┘
#                  g    forward: all-reduce of the partial sums
#                       backward: identity
#                  Z    every rank holds all of it
#
#  A by columns, B by rows: each GeLU(X·Aᵢ)·Bᵢ is a partial sum of Z
# ```
#
# The two operators are each other's *conjugate* (Megatron-LM §3):
#
# - **f** sits where a replicated activation enters the split layer. Forward it does nothing — every
#   rank already has `X`. Backward, each rank's columns produced only part of `dL/dX`, so the
#   gradients are **summed**: an all-reduce.
# - **g** sits where the partial sums leave. Forward: all-reduce. Backward: `Z` is replicated, the loss
#   after it is computed identically on every rank, so `dL/dZ` is already the same everywhere and is
#   exactly the gradient of each rank's partial sum: **identity**.
#
# Here is f in `parallel_lab.tensor.mappings` — a `torch.autograd.Function` whose forward and
# backward are one line each, as in Megatron-LM's `mappings.py`:

# %%
from parallel_lab.tensor import mappings

print(inspect.getsource(mappings._CopyToTensorParallelRegion))
print(inspect.getsource(mappings.copy_to_tensor_parallel_region))

# %% [markdown]
# `ParallelMLP.from_dense(mlp)` is `ColumnParallelLinear` (f inside), GeLU, `RowParallelLinear`
# (g inside). `run_tensor` runs it on real ranks, backward included, compares the output and **every
# gradient** with the dense MLP, and counts the collectives each rank made with `commlog`.
# **Predict:** how many all-reduces in the forward pass, and how many in the backward pass?

# %%
from parallel_lab.tensor.run import run_tensor


def show_collectives(report):
    for phase in ("forward", "backward"):
        ops = ", ".join(f"{op} x{row['count']} ({row['bytes']:,} bytes)" for op, row in report[phase].items())
        print(f"  {phase:<9} {ops or 'none'}")


mlp = run_tensor(4, "mlp")
print(f"ParallelMLP on 4 ranks: output and every gradient match the dense MLP (< 1e-12): "
      f"{mlp['max_output_diff'] < 1e-12 and mlp['max_grad_diff'] < 1e-12}")
show_collectives(mlp)

# %% [markdown]
# One all-reduce each way — g forward, f backward — of the full activation: 2 sequences × 24 tokens ×
# 192 values × 8 bytes (fp64) = 73,728 bytes.
#
# ## 4. Exercise: write g
#
# Write `MyG`, the operator g, as a `torch.autograd.Function`: `MyG.apply(x, group)` returns the sum
# of `x` over the ranks of `group`; its backward passes the gradient on unchanged. `backward` returns
# one gradient per input of `forward`: `None` for `group`. Sum into a copy (`x.clone()`) rather than
# into `x` itself: autograd may still need the original.
#
# The check runs `MyG` on 2 and 4 ranks (and two groups of 2): its forward, and a row-parallel layer
# `MyG.apply(x_r·W_r, group) + bias` whose output and gradients (of `x_r`, `W_r` and the bias) must
# equal the dense layer's.
#
# **What the check forbids:** the library's mappings (its own f and g, in `parallel_lab.tensor`).
#
# Keep all your code in the answer cell below: the grader reads that cell alone from your notebook and
# runs it on fresh ranks of its own, so helpers defined in other cells are not seen.

# %% tags=["answer:g-operator"]
class MyG(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        ### BEGIN SOLUTION
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return grad, None
        ### END SOLUTION


# %% [markdown]
# **Try it on ranks** before the check: forward, every rank should hold the sum over the ranks;
# backward, each rank's gradient should come back unchanged (all ones here).

# %%
# %%ranks 2 --with MyG
x = torch.full((3,), float(dist.get_rank() + 1), requires_grad=True)
y = MyG.apply(x, dist.group.WORLD)
y.sum().backward()
print("forward:", y.tolist(), " backward:", x.grad.tolist())

# %% tags=["check:g-operator", "points:2"]
from parallel_lab.exercises import check_g_operator

verdict = check_g_operator(MyG)

# %% [markdown]
# The library's g sums in place instead of into a copy (the partial sum is a fresh matmul output
# nobody else holds); `ctx.mark_dirty` tells autograd so, and makes it refuse a caller for whom that
# is not true:

# %%
from parallel_lab.exercises import reveal

reveal("g-operator", mappings._ReduceFromTensorParallelRegion)

# %% [markdown]
# ## 5. Attention: split by heads
#
# Multi-head attention is already split: each head has its own slice of the q, k and v projections
# and attends on its own. Megatron gives each rank **whole heads** (Megatron-LM §3, figure 3b): the
# q, k and v projections are split by columns (one f for the three, fused into one matrix), the
# attention of a head needs no other rank, and the output projection `W_o` is split by rows — so the
# block again ends in one g. The course's tiny GPT has 24 heads of width 8 (hidden 192); on 4 ranks:

# %%
figures.heads_figure(heads=24, tp=4, head_dim=8)

# %% [markdown]
# `ParallelSelfAttention` against the dense `CausalSelfAttention`, on 4 ranks (output and every
# gradient):

# %%
from parallel_lab.tensor import run

attention = launcher.run(run.check_case, 4, kwargs=dict(case="attention", ref=run.reference("attention")))
print(f"ParallelSelfAttention on 4 ranks matches the dense attention (< 1e-12): "
      f"{all(r['output_diff'] < 1e-12 and r['grad_diff'] < 1e-12 for r in attention)}")
show_collectives(attention[0])

# %% [markdown]
# A transformer block is LayerNorm, attention, LayerNorm, MLP (with residual connections). The
# LayerNorms are small and run in full on every rank; the plan that turns a dense block into a
# parallel one is data (torchtitan's way):

# %%
from parallel_lab.tensor import plan

print(plan.BLOCK_PLAN)

# %% [markdown]
# **Predict:** how many all-reduces does one block make, forward and backward? Here it runs with
# tensor-parallel groups of 2 (the 4 ranks as two groups `{0, 1}` and `{2, 3}`, each computing the
# block — the way tensor-parallel groups sit inside a larger job) and of 4:

# %%
block_runs = launcher.run(lesson.block_runs, 4, kwargs=dict(tps=(2, 4)))[0]
for r in block_runs:
    print(f"tensor-parallel block, tp={r['tp']}: matches the dense block: {r['matches']}")
    show_collectives(r)

# %% [markdown]
# **Two all-reduces forward (g after attention, g after the MLP) and two backward (the two f's)** —
# in every layer, for every micro-batch. Each one carries the whole activation, (tokens × h) values,
# whatever the number of ranks. That is the price of tensor parallelism.
#
# ## 6. Why tensor parallelism stays inside the fast NVLink domain
#
# FAQ 6: *tensor parallelism communicates often to recombine partial matrix results, so it is placed
# inside a node, where interconnect bandwidth (NVLink) is highest*
# (張量並行性經常進行通訊以重新組合部分矩陣結果，因此它被放置在 NVLink 節點內部互連頻寬最高的地方).
# More precisely: inside the **NVLink domain**, the GPUs joined by NVLink — 8 in a DGX/HGX node,
# 72 in a GB200 NVL72 rack. Let's put numbers on "often" with the α–β model of lesson 01. Per
# transformer layer, forward and backward, with b·s tokens of width h on t GPUs
# (`planning.cost.tp_layer_step`, the same computation lessons 11 and 15 print):
#
# - **compute** ≈ 3 × 24·b·s·h² FLOPs (forward: q, k, v and output projections 8·b·s·h², MLP
#   16·b·s·h², the attention scores' 4·b·s²·h left out; a backward costs two forwards; Narayanan et
#   al. 2021), split over t GPUs: `t_compute = 72·b·s·h² / (t · FLOP/s)`;
# - **communication**: 4 all-reduces (g, g forward; f, f backward) of `n = b·s·h·bytes` each, a
#   ring costing `2(t−1)/t · n/B + 2(t−1)·α` (bandwidth B per GPU and direction, latency α).
#
# The n of that formula is what the real block sent. Measured above (fp64, 8 bytes a value):

# %%
b, s, h, value_bytes = 2, 24, 192, 8  # run.DEFAULT_CONFIG, batch 2, fp64
n = b * s * h * value_bytes
print(f"model: each all-reduce sums n = b·s·h·bytes = {b}·{s}·{h}·{value_bytes} = {n:,} bytes")
for r in block_runs:
    rows = [r[phase]["all_reduce"] for phase in ("forward", "backward")]
    per_call = {row["bytes"] // row["count"] for row in rows}
    print(f"measured, tp={r['tp']}: {sum(row['count'] for row in rows)} all-reduces of {sorted(per_call)[0]:,} "
          f"bytes each; a ring sends 2(t−1)/t of it per rank: {2 * (r['tp'] - 1) / r['tp'] * n:,.0f} bytes")

# %% [markdown]
# The widget below puts the model to work for real sizes. Its presets are the GPUs of 2026
# (`parallel_lab.hardware.SYSTEMS`, each with its datasheet), computing at 40 % of their dense BF16
# peak, what large runs achieve (38–43 % for Llama 3 on 16 000 H100s, Dubey et al. 2024):
#
# | preset | link, per GPU and direction | compute |
# |---|---|---|
# | H100 inside a DGX H100 node | NVLink 4: 450 GB/s (the datasheet's "900 GB/s" counts both directions), α 3 µs | 396 TFLOP/s (of 989) |
# | H100 across nodes | InfiniBand NDR: 400 Gb/s = 50 GB/s, α 10 µs | 396 TFLOP/s |
# | B200 / GB200 | NVLink 5: 900 GB/s (1.8 TB/s both ways) | 900 TFLOP/s (of 2250) |
#
# and **this machine**: α and bandwidth fitted to gloo's all-reduce on 4 ranks as in lesson 01, and
# the FLOP/s of one core here, measured now (so these numbers are yours and change from run to run).
# gloo is the honest "network" of this machine; the course's own tensor-parallel layers do better
# on one host: their small all-reduces copy through shared memory instead of loopback TCP
# (`parallel_lab.runtime.shared_memory`, as DeepSpeed's CPU backend does): 10-20 × faster than
# gloo here for 32-128 KB (`parallel-lab bench collectives`).

# %% tags=["nbval-ignore-output"]
from parallel_lab.planning import calibration
from parallel_lab.show import tp_cost as widgets

machine = calibration.measure_machine()
link = machine["link"]
print(f"this machine: α ≈ {link.latency * 1e6:.0f} µs, bandwidth ≈ {link.bandwidth / 1e9:.2f} GB/s, "
      f"one core ≈ {machine['flops'] / 1e9:.1f} GFLOP/s")

# %% [markdown]
# ### Try it
#
# Every number is editable. Things to find:
#
# 1. With the defaults (GPT-3's width h = 12288, one 2048-token sequence), at which t does the
#    communication on InfiniBand overtake the compute? And on NVLink 4? On NVLink 5?
# 2. Halve the width h. Why does the ratio communication/compute double?
# 3. Choose *this machine*. Why does communication look cheap here, although gloo between processes
#    is hundreds of times slower than NVLink?

# %% tags=["nbval-ignore-output"]
widgets.cost_widget(machine)

# %% [markdown]
# The widget starts here (pure arithmetic, printed so the check has something to compare):

# %%
print(widgets.default_summary())

# %% [markdown]
# Read the ratio: communication/compute ≈ 0.14 on NVLink 4, ≈ 1.1 on InfiniBand NDR, 0.18 on
# NVLink 5 with a B200. Leaving out α it is
# `(8(t−1)/t · b·s·h·bytes / B) / (72·b·s·h² / (t·F)) = (t−1)·bytes·F / (9·h·B)`, with F the FLOP/s
# of a GPU: the tokens cancel, so a bigger batch does not help; it grows with t and with F/B — the
# GPU's speed against its link — and falls only as 1/h. Each GPU generation has raised F faster than
# B (A100 to H100: compute ×3.2, NVLink ×1.5), so tensor parallelism weighs more on newer GPUs
# (lesson 16 meets the consequence). And tensor-parallel all-reduces sit on the critical path: the
# next matmul needs their result, so they add to the step instead of hiding behind compute. Inside
# the NVLink domain a layer pays roughly 15 % extra; across InfiniBand the GPUs would wait as long
# as they compute. Hence the rule: **tensor parallelism stays inside the NVLink domain — t ≤ 8 on an
# 8-GPU DGX/HGX node, up to 72 on a GB200 NVL72 rack — and pipeline or data parallelism goes across
# it**: a pipeline sends one activation per stage boundary instead of four all-reduces per layer,
# and data parallelism's gradient all-reduce comes once per step and overlaps with the backward
# pass (lessons 03-09).
#
# On this machine the ratio is small for the opposite reason: one CPU core computes ~10⁴ times
# slower than a GPU, while gloo between processes is "only" some 10²-10³ times slower than NVLink.
# The ratio is what counts, not either speed alone.
#
# ## 7. Advanced: sequence parallelism
#
# With tensor parallelism the weights are split, but not every activation: the LayerNorms, dropouts
# and residual additions between the split layers run on the full `(b, s, h)` tensor **on every
# rank**, so their activations are stored t times. Korthikanti et al. 2022 (*Reducing Activation
# Recomputation in Large Transformer Models*) split these regions along the **sequence**: each rank
# keeps s/t of the tokens there. The all-reduces become their two halves (lesson 01: all-reduce =
# reduce-scatter + all-gather):
#
# ```
#  (b, s/t, h)   LayerNorm, sequence-split
#       │
#       │  "f": all-gather forward, reduce-scatter backward
#       ▼
#  (b, s, h)     column split · attention · row split
#       │        (partial sums)
#       │  "g": reduce-scatter forward, all-gather backward
#       ▼
#  (b, s/t, h)   dropout, residual, sequence-split
# ```
#
# **Predict:** compared with plain tensor parallelism, does the block send more bytes, fewer, or the
# same? Here is one block on 4 ranks both ways (`sequence_parallel=True` in `parallelize`):

# %%
from parallel_lab.runtime import commlog

sp_runs = launcher.run(lesson.block_runs, 4, kwargs=dict(tps=(4,), sequence_parallel=(False, True)))[0]
for r in sp_runs:
    both = commlog.merge_counts(r["forward"], r["backward"])
    name = "sequence parallel" if r["sequence_parallel"] else "tensor parallel  "
    print(f"{name}: block output on a rank {tuple(r['output_shape'])}, matches the dense block: {r['matches']}")
    show_collectives(r)
    print(f"  a ring sends {run.ring_bytes(both, r['tp']):,.0f} bytes per rank, forward and backward")

# %% [markdown]
# The same bytes on the wire (a reduce-scatter plus an all-gather is an all-reduce), but the
# activations between the layers are (2, 6, 192) instead of (2, 24, 192) on each rank: t times less
# activation memory in the LayerNorm/dropout regions, for free. One detail: a LayerNorm now sees only
# its rank's tokens, so its weight gradient is a partial sum; one extra all-reduce of those small
# gradients after the backward pass fixes it (`allreduce_sequence_parallel_grads`):

# %%
for op, row in sp_runs[1]["grad_sync"].items():
    print(f"after backward: {op} x{row['count']} of {row['bytes'] // 8:,} gradient values "
          f"(LayerNorm weights and biases, row-parallel biases: 6 × 192)")

# %% [markdown]
# ## 8. Advanced: the vocabulary-parallel embedding and loss
#
# The first and last layers of a GPT are the largest matrices when the vocabulary is large (GPT-3:
# 50257 × 12288). Megatron splits both **by vocabulary**:
#
# - the **input embedding**: rank r holds rows `[rV/t, (r+1)V/t)` of the table; a token id outside
#   its rows gives zeros, and a g (all-reduce) adds the rows — each id is found on exactly one rank;
# - the **output layer** is a column split, so each rank holds the logits of its V/t words. Gathering
#   all `b·s·V` logits would be the largest message of the model. Instead the cross-entropy is
#   computed from the shards with **three all-reduces of one number per token**: the maximum logit
#   (for a stable softmax), the target's logit (held by one rank), and the sum of exponentials.

# %%
from parallel_lab.tensor import layers

print(inspect.getsource(layers._VocabParallelCrossEntropy.forward))

# %% [markdown]
# The whole tiny GPT (embedding, 2 blocks, LM head) with this plan, on 4 ranks, against the dense GPT
# and its loss:

# %%
print(plan.GPT_PLAN)
gpt = run_tensor(4, "gpt")
print(f"tiny GPT on 4 ranks: loss equals the dense loss (|difference| < 1e-12): {gpt['loss_diff'] < 1e-12}; "
      f"every gradient matches: {gpt['max_grad_diff'] < 1e-12}")
show_collectives(gpt)
tokens, v, n_layers = 2 * 24, 96, 2
act, scalar = tokens * 192 * 8, tokens * 8
print(f"forward all-reduces: 1 embedding + {2 * n_layers} in the blocks of {act:,} bytes, "
      f"3 in the loss of {scalar:,} bytes = {(1 + 2 * n_layers) * act + 3 * scalar:,} bytes")
print(f"gathering the logits instead: {tokens} tokens × {v} words × 8 bytes = {tokens * v * 8:,} bytes "
      f"on every rank; for GPT-3 (2048 tokens, 50257 words, bf16): "
      f"{2048 * 50257 * 2 / 1e6:,.0f} MB against 3 × 2048 × 4 bytes = {3 * 2048 * 4 / 1e3:.1f} kB")

# %% [markdown]
# The loss is the dense loss, and the logits never travel. The backward pass makes 5 all-reduces: the
# f in front of each block's attention and MLP (4) and the f in front of the LM head (1); the
# embedding's g and the loss need none.

# %%
launcher.shutdown()  # stop the rank processes (a Binder pod has little memory)

# %% [markdown]
# ## What to remember
#
# - **Column split** (W by columns): each rank computes whole output columns from the whole input, no
#   communication. **Row split** (W by rows, input split to match): each rank computes a partial sum;
#   an **all-reduce** adds them. Megatron's MLP is column then row, so GeLU runs locally and only one
#   all-reduce remains.
# - The conjugate operators: **f** = identity forward, all-reduce backward (where a replicated input
#   enters); **g** = all-reduce forward, identity backward (where partial sums leave). Attention is
#   split by whole heads with the same pattern.
# - A tensor-parallel transformer layer does **2 all-reduces forward and 2 backward**, each of the
#   full activation (b·s·h values), in every layer and micro-batch.
# - Communication/compute ≈ (t−1)·bytes·F / (9·h·B) per layer (forward and backward), whatever the
#   batch: ~0.14 on an H100's NVLink 4, ~1.1 on InfiniBand NDR. So **tensor parallelism stays inside
#   the NVLink domain** (8 GPUs in a DGX node, 72 in an NVL72 rack); pipeline and data parallelism
#   go across it.
# - Sequence parallelism turns each all-reduce into reduce-scatter + all-gather: same bytes, t times
#   less activation memory; the vocabulary-parallel loss needs three tiny all-reduces instead of the
#   full logits.
