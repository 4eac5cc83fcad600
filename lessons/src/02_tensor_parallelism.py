# %% [markdown]
# # 02 · Tensor parallelism
#
# > *Tensor parallelism splits the computation inside a single layer — for example a large weight
# > matrix — so that each GPU computes part of the output.*
# > (張量並行性將計算分成單層，例如分割一個大的權重矩陣，以便每個 GPU 計算部分輸出。)
#
# A warning on the article's machine translation: "將計算分成單層" reads as "splits the computation
# into single layers", that is *by* layers, which is pipeline parallelism. The English says the
# opposite: the computation *inside* one layer is split.
#
# **Learning goals.** By the end of this lesson you can
#
# - split a linear layer `Y = X·W` by **columns** or by **rows** and name the collective that
#   recombines the pieces;
# - explain Megatron-LM's operators **f** and **g** and count a transformer block's all-reduces;
# - write a row-parallel forward and the operator g yourself, checked on real ranks;
# - explain **why tensor parallelism stays inside the NVLink domain**;
# - say what sequence parallelism saves and what it costs.
#
# It answers FAQ 3 (張量（層內）並行分割如何運作？) and FAQ 6 (為什麼張量並行性通常保留在單一節點內？).
# Everything runs on ranks (lesson 01) in fp64 and is compared with the dense layer on one process.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. One matrix, two ways to cut it
#
# Take one linear layer `Y = X·W`: `X` is (tokens × k), `W` is (k × m), `Y` is (tokens × m), and
# `Y[i, j] = Σ_k X[i, k]·W[k, j]`. With p GPUs there are two natural cuts of `W` (Shoeybi et al.
# 2019, *Megatron-LM*, §3):
#
# - **Column split** `W = [W₀ | W₁ | …]`: rank r holds m/p whole columns and computes whole columns
#   `Y_r = X·W_r` from all of `X`, with **no communication**; an **all-gather** collects `Y` if
#   someone needs all of it.
# - **Row split**: rank r holds k/p rows `W_r` and the matching k/p columns `X_r` of the input. Its
#   `X_r·W_r` has `Y`'s full shape but is only a **partial sum** over its part of k: an
#   **all-reduce** adds them. Grey marks what every rank holds in full.

# %%
from parallel_lab.show import tensor as figures

figures.split_figure("column", tp=2).show()
figures.split_figure("row", tp=2).show()

# %% [markdown]
# Now the real layers: `ColumnParallelLinear.from_dense(linear)` keeps this rank's columns of a
# dense `nn.Linear`, `RowParallelLinear.from_dense(linear)` its rows (PyTorch stores `weight` as
# `Wᵀ`). Each rank builds the same dense layer and input from a seed, cuts it three ways and compares
# with the dense output:

# %%
from parallel_lab.i18n import source
from parallel_lab.runtime import launcher
from parallel_lab.tensor import demos as lesson

print(source(lesson.column_and_row))  # inspect.getsource, the docstring and comments in the lesson's language
for world_size in (2, 4):
    print(figures.splits_text(launcher.run(lesson.column_and_row, world_size), lesson.TOLERANCE))

# %% [markdown]
# The row split needs only its slice of `X`: exactly what a column split produces (section 3).
#
# ## 2. Exercise: the row-parallel forward
#
# Write `my_row_parallel_forward(x_shard, w_shard, bias, group)`. Rank r of the tensor-parallel
# `group` (p ranks) gets `x_shard` (..., k/p), its slice of the last dimension of `X`; `w_shard`
# (k/p, m), the matching rows of `W`; `bias` (m,), the same on every rank. Return all of
# `Y = X·W + bias` on every rank of the group, with `dist.all_reduce(tensor, group=group)` (it sums
# in place). **Add the bias once**: added before the sum, it would be counted p times.
#
# The check runs your function on 2 and 4 real ranks against the exact dense product, and on 4 ranks
# as two groups of 2: a collective that forgets `group=` sums over all four. **It forbids** the
# library's parallel layers (`parallel_lab.tensor`). Keep all your code in the answer cell: the
# grader reads that cell alone.

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
# A transformer's MLP is `Z = GeLU(X·A)·B`. Megatron-LM splits **A by columns and B by rows**: each
# rank gets whole columns of `X·A`, so GeLU applies to its own piece (GeLU(P₀ + P₁) ≠ GeLU(P₀) +
# GeLU(P₁)), already split the way the row split of B wants its input:
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
# ```

# %% [markdown]
# The two operators are each other's *conjugate* (Megatron-LM §3):
#
# - **f**, where a replicated activation enters the split layer: forward nothing (every rank has
#   `X`); backward, each rank's columns give only part of `dL/dX`, so an all-reduce **sums** them.
# - **g**, where the partial sums leave: forward an all-reduce; backward **identity**, since `dL/dZ`
#   is the same on every rank.
#
# Here is f, one line each way, as in Megatron-LM's `mappings.py`:

# %%
from parallel_lab.tensor import mappings

print(source(mappings._CopyToTensorParallelRegion))

# %% [markdown]
# `ParallelMLP` is `ColumnParallelLinear` (f inside), GeLU, `RowParallelLinear` (g inside).
# `run_tensor` runs it on ranks, compares output and **every gradient** with the dense MLP, and
# counts each rank's collectives. **Predict:** how many all-reduces does it make, forward and
# backward together? Write it below; the next cell records it, then runs the MLP (not graded).

# %% tags=["answer:predict:mlp-all-reduces"]
my_prediction = None  # all-reduces of ParallelMLP, forward and backward together
### BEGIN SOLUTION
my_prediction = 2  # g forward, f backward
### END SOLUTION

# %% tags=["reveals:mlp-all-reduces"]
from parallel_lab.show.predict import predict
from parallel_lab.tensor.run import run_tensor

mlp_guess = predict("mlp-all-reduces", my_prediction,
                    {"en": "all-reduces of ParallelMLP, forward and backward together",
                     "zh-Hant": "ParallelMLP 前向與反向合計的 all-reduce 次數"}, tolerance=0)
mlp = run_tensor(4, "mlp")
print(figures.check_text("ParallelMLP", 4, mlp["max_output_diff"] < 1e-12 and mlp["max_grad_diff"] < 1e-12, mlp))
mlp_guess.versus(sum(mlp[phase]["all_reduce"]["count"] for phase in ("forward", "backward")))

# %% [markdown]
# One all-reduce each way (g forward, f backward) of the full activation: 2 sequences × 24 tokens ×
# 192 values × 8 bytes = 73,728 bytes.
#
# ## 4. Exercise: write g
#
# Write `MyG`, a `torch.autograd.Function`: `MyG.apply(x, group)` returns the sum of `x` over the
# ranks of `group`; its backward passes the gradient on unchanged (and `None` for `group`). Sum into
# a copy (`x.clone()`): autograd may still need `x`. The check runs `MyG` on 2 and 4 ranks, alone and
# in a row-parallel layer whose output and gradients must equal the dense layer's. **It forbids**
# the library's own f and g. Keep all your code in the answer cell.

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
# ## 5. Attention: split by heads, and the whole block
#
# Each attention head has its own slice of the q, k and v projections. Megatron gives each rank
# **whole heads** (Megatron-LM §3, figure 3b): q, k and v split by columns (one f), the output
# projection by rows (one g). A block (LayerNorm, attention, LayerNorm, MLP) runs its small
# LayerNorms in full on every rank, so it makes **two all-reduces forward and two backward**, in
# every layer and micro-batch. Below: the 24 heads of the course's tiny GPT on 4 ranks, its
# attention against the dense one, the block's plan (data, torchtitan's way) and the block on
# groups of 2 (`{0, 1}`, `{2, 3}`) and of 4:

# %%
from parallel_lab.tensor import plan, run

figures.heads_figure(heads=24, tp=4, head_dim=8).show()
attention = launcher.run(run.check_case, 4, kwargs=dict(case="attention", ref=run.reference("attention")))
print(figures.check_text("ParallelSelfAttention", 4,
                         all(r["output_diff"] < 1e-12 and r["grad_diff"] < 1e-12 for r in attention), attention[0]))
print(plan.BLOCK_PLAN)
block_runs = launcher.run(lesson.block_runs, 4, kwargs=dict(tps=(2, 4)))[0]
for r in block_runs:
    print(figures.check_text("Block", r["tp"], r["matches"], r))
print(f"b·s·h·bytes = 2·24·192·8 = {2 * 24 * 192 * 8:,}")

# %% [markdown]
# Each all-reduce carries the whole activation, b·s·h values, whatever the number of ranks.
#
# ## 6. Why tensor parallelism stays inside the fast NVLink domain
#
# FAQ 6: *tensor parallelism communicates often to recombine partial matrix results, so it is placed
# inside a node, where interconnect bandwidth (NVLink) is highest*
# (張量並行性經常進行通訊以重新組合部分矩陣結果，因此它被放置在 NVLink 節點內部互連頻寬最高的地方):
# inside the **NVLink domain**, 8 GPUs in a DGX/HGX node, 72 in an NVL72 rack. Per layer, forward and
# backward, b·s tokens of width h on t GPUs (`planning.cost.tp_layer_step`):
#
# - **compute** ≈ 3 × 24·b·s·h² FLOPs (projections 8·b·s·h², MLP 16·b·s·h², the attention scores
#   left out; a backward costs two forwards; Narayanan et al. 2021): `72·b·s·h² / (t · FLOP/s)`;
# - **communication**: 4 ring all-reduces of `n = b·s·h·bytes`, `2(t−1)/t · n/B + 2(t−1)·α` each
#   (bandwidth B per GPU and direction, latency α: lesson 01).

# %% [markdown]
# The presets (`parallel_lab.hardware.SYSTEMS`, with datasheets) compute at 40 % of the dense BF16
# peak, the model FLOPs utilisation (MFU) of large runs: 38–43 % for Llama 3 on 16,000 H100s (Dubey
# et al. 2024, Table 4). Megatron-LM's 52 % (Narayanan et al. 2021) counts the recomputation's extra
# forward pass, so it is *hardware* FLOPs utilisation (Korthikanti et al. 2022 report both).
#
# | preset | link, per GPU and direction | compute |
# |---|---|---|
# | DGX H100, inside the node | NVLink 4: 450 GB/s (the datasheet's 900 counts both ways), α 3 µs | 396 TFLOP/s (of 989) |
# | DGX H100, across nodes | InfiniBand NDR: 400 Gb/s = 50 GB/s, α 10 µs | 396 TFLOP/s |
# | GB200 NVL72, inside the rack | NVLink 5: 900 GB/s | 1000 TFLOP/s (of 2500; a B200: 2250) |
# | GB300 NVL72, across racks | ConnectX-8: 800 Gb/s = 100 GB/s | 1000 TFLOP/s (of 2500) |
#
# GB300 (Blackwell Ultra, 288 GB per GPU) has shipped since the second half of 2025. The last preset
# is **this machine**, measured now: gloo's α and bandwidth on 4 ranks, one core's FLOP/s.

# %% tags=["nbval-ignore-output"]
from parallel_lab.planning import calibration
from parallel_lab.show import tp_cost as widgets

machine = calibration.measure_machine()
print(f"α ≈ {machine['link'].latency * 1e6:.0f} µs, {machine['link'].bandwidth / 1e9:.2f} GB/s, "
      f"{machine['flops'] / 1e9:.1f} GFLOP/s")
widgets.cost_widget(machine)

# %% [markdown]
# ### Try it
#
# 1. With the defaults (GPT-3's width h = 12288, one 2048-token sequence), at which t does the
#    communication on InfiniBand overtake the compute? On NVLink 4? On NVLink 5?
# 2. Halve the width h. Why does the ratio communication/compute double?
# 3. Choose *this machine*. Why does communication look cheap here, although gloo between processes
#    is far slower than NVLink? (Compare the core's FLOP/s with a GPU's.)
#
# The widget starts here (pure arithmetic):

# %%
print(widgets.default_summary())

# %% [markdown]
# Leaving out α, the ratio is `(t−1)·bytes·F / (9·h·B)`, with F a GPU's FLOP/s: the tokens cancel,
# so a bigger batch does not help; it grows with t and with F/B and falls only as 1/h. Generations
# raise F faster than B (A100 to H100: compute ×3.2, NVLink ×1.5; GB300's network is twice NDR, its
# compute 2.5 times an H100's). The all-reduces sit on the critical path: the next matmul needs their
# result. Hence the rule: **tensor parallelism stays inside the NVLink domain**, and pipeline or data
# parallelism, which send far less and less often, go across it (lessons 03-11).

# %% [markdown]
# ## 7. Sequence parallelism: memory for one more all-gather
#
# The LayerNorms, dropouts and residual additions between the split layers run on the full
# `(b, s, h)` tensor on every rank: their activations are stored t times. Korthikanti et al. 2022
# (*Reducing Activation Recomputation in Large Transformer Models*, §4.2.2) split these regions along
# the **sequence**, turning each all-reduce into its two halves (lesson 01):
#
# ```
#  (b, s/t, h)   LayerNorm, sequence-split
#       │  "f": all-gather forward, reduce-scatter backward
#  (b, s, h)     column split · attention or MLP · row split (partial sums)
#       │  "g": reduce-scatter forward, all-gather backward
#  (b, s/t, h)   dropout, residual, sequence-split
# ```
#
# To store only s/t tokens, the column layer after "f" keeps its input's *shard* and all-gathers it
# again in the backward (`parallel_lab.tensor.layers`, as Megatron-LM does). **Predict:** against
# plain tensor parallelism, does a block send fewer bytes, the same, or more? (Not graded.)

# %% tags=["answer:predict:sp-bytes"]
my_prediction = None  # "fewer", "the same" or "more"
### BEGIN SOLUTION
my_prediction = "more"  # the same forward; backward 4 all-gathers + 2 reduce-scatters
### END SOLUTION

# %% tags=["reveals:sp-bytes"]
from parallel_lab.planning.memory_model import activation_bytes_per_layer

sp_guess = predict("sp-bytes", my_prediction, {"en": "bytes a block sends with sequence parallelism, against "
                                                     "plain tensor parallelism",
                                               "zh-Hant": "加上序列平行後，一個區塊送出的位元組數和單純的張量平行相比"},
                   choices=("fewer", "the same", "more"))
sp_runs = launcher.run(lesson.block_runs, 4, kwargs=dict(tps=(4,), sequence_parallel=(False, True)))[0]
sent = {}
for r in sp_runs:
    sent[r["sequence_parallel"]] = {phase: run.ring_bytes(r[phase], 4) for phase in ("forward", "backward")}
    model_bytes = activation_bytes_per_layer(24, 2, 192, 24, tp=4, sequence_parallel=r["sequence_parallel"],
                                             recompute="selective", value_bytes=8, dropout=False)
    print(figures.sequence_parallel_text(r, 4, sent[r["sequence_parallel"]], model_bytes))
more = sum(sent[True].values()) - sum(sent[False].values())
sp_guess.versus("more" if more > 0 else "fewer" if more < 0 else "the same")

# %% [markdown]
# Forward, the same bytes (reduce-scatter + all-gather = all-reduce); backward, each column layer
# gathers its input once more: 1.5 times the bytes (Megatron-LM overlaps it with the input-gradient
# matmul). In exchange the activations between the split layers are stored once across the ranks:
# the paper's `s·b·h·34/t` bytes a layer instead of `s·b·h·(10 + 24/t)` (`planning.memory_model`;
# fp64 and no dropout here, and the fused attention keeps no scores). What autograd kept is that
# plus small per-token statistics. The LayerNorms' weight gradients are now partial: one small
# all-reduce after the backward sums them.
#
# ## 8. The vocabulary-parallel embedding and loss
#
# Megatron splits the embedding and the output layer **by vocabulary** (GPT-3: 50257 × 12288 each).
# Instead of gathering all `b·s·V` logits, the loss takes **three all-reduces of one number per
# token**: the largest logit, the target's logit, the sum of exponentials. The tiny GPT on 4 ranks:

# %%
print(plan.GPT_PLAN)
gpt = run_tensor(4, "gpt")
print(figures.check_text("GPT", 4, gpt["loss_diff"] < 1e-12 and gpt["max_grad_diff"] < 1e-12, gpt))
launcher.shutdown()  # stop the rank processes (a Binder pod has little memory)

# %% [markdown]
# ## What to remember
#
# - **Column split**: whole output columns, no communication. **Row split**: partial sums that an
#   **all-reduce** adds. Megatron's MLP is column then row: one all-reduce remains.
# - **f**: identity forward, all-reduce backward; **g**: the reverse. Attention splits by heads.
# - A layer does 2 all-reduces forward and 2 backward of the full activation.
# - Communication/compute ≈ (t−1)·bytes·F / (9·h·B), whatever the batch: **tensor parallelism
#   stays inside the NVLink domain**.
# - Sequence parallelism stores the activations between the split layers once across the ranks
#   (34/t) for one extra all-gather per column layer in the backward.
