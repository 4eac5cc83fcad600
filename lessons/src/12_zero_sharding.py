# %% [markdown]
# # 12 · Sharding the model state: ZeRO and FSDP
#
# **Learning goals.** By the end of this lesson you can
#
# - split the memory of training four ways (parameters, gradients, optimizer state, activations) and
#   compute the first three per GPU at each of ZeRO's stages 0-3 with ZeRO's formula,
#   2Ψ + 2Ψ + KΨ bytes for Ψ parameters;
# - run every stage on real ranks, check that it trains **exactly** like one process, and measure the
#   model state each rank holds against the formula;
# - count what each stage sends per step, in units of Ψ, and read it from what the ranks sent;
# - read the overlap of compute and communication on a Gantt chart: DDP's gradient buckets and
#   FSDP's prefetch;
# - write ZeRO-2's step yourself (reduce-scatter, Adam on the shard, all-gather), checked on ranks;
# - say where ZeRO-3 loses: when its extra traffic crosses the slow links between nodes.
#
# This lesson continues lesson 11's **data parallelism**, where every replica held the whole model,
# its gradients and its Adam state. Here the replicas stop holding copies of what they can share.
# Sources: Rajbhandari et al. 2020, *ZeRO: Memory Optimizations Toward Training Trillion Parameter
# Models* (SC20); Zhao et al. 2023, *PyTorch FSDP* (VLDB); Li et al. 2020, *PyTorch Distributed*
# (VLDB). Notation: Ψ parameters, N data-parallel ranks, K bytes of optimizer state per parameter.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. Where the bytes of training go
#
# Lesson 00 split the memory of training four ways. Rajbhandari et al. 2020 (ZeRO, section 3.1) count
# the first three, the **model state**, for mixed-precision Adam: fp16 parameters (2Ψ bytes), fp16
# gradients (2Ψ) and the optimizer state, KΨ with K = 12 (an fp32 master copy of the parameters,
# Adam's momentum and its variance, 4 bytes each). The fourth, the **activations**, belongs to the
# batch, not to the model: every data-parallel GPU keeps those of its own slice of the batch, whatever
# the model state does. Plain data parallelism (lesson 11) keeps all of it on every GPU:
# (2 + 2 + K)·Ψ = 16Ψ bytes — 112 GB for a 7B model before a single activation.
#
# ZeRO (section 5) notices that the N replicas hold N identical copies and shards them, one stage at a
# time; rank r keeps only the r-th of N slices:
#
# | stage | ZeRO's name | sharded | bytes per GPU (the paper's Figure 1) |
# |---|---|---|---|
# | 0 | plain DP | nothing | 2Ψ + 2Ψ + KΨ |
# | 1 | P_os | optimizer state | 2Ψ + 2Ψ + KΨ/N |
# | 2 | P_os+g | + gradients | 2Ψ + (2 + K)Ψ/N |
# | 3 | P_os+g+p | + parameters | (2 + 2 + K)Ψ/N |

# %% [markdown]
# Stage 3 is what PyTorch calls FSDP's `FULL_SHARD` (Zhao et al. 2023). The formula lives in
# `parallel_lab.zero.memory.per_rank`. **Predict** before you read on (graded): one of N = 8 GPUs
# trains Ψ = 1 billion parameters under ZeRO stage 2 in mixed precision. How many GB of model state
# does it hold?

# %% tags=["answer:predict:zero2-model-state"]
my_prediction = None  # GB of model state on one GPU: ZeRO-2, Ψ = 1e9, N = 8, K = 12
### BEGIN SOLUTION
my_prediction = 2 + (2 + 12) / 8  # fp16 parameters whole, gradients and Adam state 1/8 each
### END SOLUTION

# %% tags=["check:predict:zero2-model-state"]
from parallel_lab.show.predict import predict

guess = predict("zero2-model-state", my_prediction)

# %% tags=["reveals:zero2-model-state"]
from parallel_lab.zero import memory as zero_memory

row = zero_memory.per_rank(1e9, dp=8, stage=2, value_bytes=2, adam_bytes=12)
print({part: f"{value / 1e9:g} GB" for part, value in row.items()})
guess.versus(row["total"] / 1e9, "formula")

# %% [markdown]
# The parameters stay whole at stage 2 (2 GB); gradients and Adam's state shrink eightfold
# (14 GB / 8). The paper's own example is Ψ = 7.5B on N = 64 GPUs: 120 GB per GPU without ZeRO,
# 31.4 GB, 16.6 GB and 1.9 GB at stages 1, 2 and 3 (Figure 1), which the figure below recomputes from
# the formula:

# %%
from parallel_lab.show import zero as zf

zf.stage_memory_figure()

# %% [markdown]
# Stage 1 alone removes most of it: the optimizer state is 12 of the 16 bytes per parameter. Now add
# the fourth way. GPT-3 6.7B (lesson 00's preset) with one 2048-token sequence per GPU keeps
# 30.6 GB of activations (Korthikanti et al. 2022's count, `planning.memory.activations`), and ZeRO does
# not touch them: they are not replicated, each GPU has its own (recomputation, lesson 08, and
# tensor or sequence parallelism, lesson 02, are the tools for those).

# %%
zf.four_way_figure("GPT-3 6.7B", dp=64)

# %% [markdown]
# ## 2. Every stage on real ranks, against one process
#
# `parallel_lab.zero.engine.Zero` applies a stage from outside to the unchanged course GPT
# (4 blocks, hidden 64, Ψ = 213,376 parameters), as FSDP does (Zhao et al. 2023, section 3): the model
# is cut into **units** (the embeddings, each block, the head), each unit's parameters become one flat
# buffer, and rank r owns the slice r of every flat buffer. What each stage does in a step:
#
# - **stage 0**: after the backward, one all-reduce per unit of the gradient (divided by N), Adam on
#   everything, on every rank — lesson 11's data parallelism;
# - **stage 1**: a reduce-scatter per unit leaves each rank *its* slice of the summed gradient; Adam
#   updates that slice with that slice's moments; an all-gather puts the updated slices back together;
# - **stage 2**: the same collectives, but a unit's full gradient lives only during that unit's
#   backward and is reduce-scattered and freed as soon as it is complete;
# - **stage 3**: the parameters are sharded too: a unit's full parameters are all-gathered just before
#   its forward, freed after it, gathered again for its backward and freed with its gradient.
#
# `run_zero(stage, dp)` (the command line's `parallel-lab run zero --stage S --dp N --json`) trains two
# Adam steps of the GPT in fp64 on dp ranks, each on its 8/dp rows of the batch, and one process trains
# the whole batch with `torch.optim.Adam`. Sharding must change *where* the numbers live, never what
# they are:

# %%
from parallel_lab.zero.run import run_zero

reports = {stage: run_zero(stage=stage, dp=4, steps=2) for stage in range(4)}
on_two = {stage: run_zero(stage=stage, dp=2, steps=2) for stage in range(4)}
print("dp = 4")
print(zf.equality_table(reports))
print("\ndp = 2")
print(zf.equality_table(on_two))

# %% [markdown]
# Every stage, on 2 and on 4 ranks, ends with the same parameters and the same losses as one process
# to rounding (the sums of the gradients run in another order; with fp64 that is below 1e-10). ZeRO is
# an exact rearrangement of data parallelism, not an approximation (Rajbhandari et al. 2020,
# section 5: each rank updates exactly its slice of what one process would, because Adam works element
# by element).
#
# ## 3. Memory per rank: measured against the formula
#
# Every hook of the engine measures the storages this rank really holds, by category (`Zero.peak`);
# the report puts them beside `zero.memory.per_rank` (fp64: 8 bytes per value, K = 16 for Adam's two
# fp64 moments, no master copy). **Predict** first (not graded): at stage 3 on 4 ranks, what share of
# stage 0's total does a rank keep?

# %% tags=["answer:predict:zero3-share"]
my_prediction = None  # a fraction of stage 0's bytes per rank, stage 3, dp = 4
### BEGIN SOLUTION
my_prediction = 0.25 + 0.12  # the shards, plus two full blocks in use
### END SOLUTION

# %%
share_guess = predict("zero3-share", my_prediction, zf.question("zero3-share"),
                      tolerance=0.25)

# %% tags=["reveals:zero3-share"]
print(zf.memory_table(reports))
totals = {s: r["memory_per_rank"]["total"]["measured"] for s, r in reports.items()}
share_guess.versus(totals[3] / totals[0])
zf.memory_figure(reports)

# %% [markdown]
# Every category matches the formula to the byte. Two things to read in the table:
#
# - **The shards are not the whole story.** At stage 2 a unit's full gradient exists while its backward
#   runs; at stage 3 a unit's full parameters and gradient do. The peak adds the largest unit (a block,
#   49,984 parameters): one at stage 2, two at stage 3 ("full units in use"). Zhao et al. 2023
#   (section 3.2.1) say the same of FSDP: its peak is the sharded state plus the largest unit
#   materialised, which is why FSDP wraps a transformer block by block.
# - The measured total is the largest *sum at one moment*; the formula adds each category's own peak,
#   so it is a bound, here a fraction of a percent above.
#
# So with 4 ranks the course GPT keeps more than a quarter of plain data parallelism: its blocks are a
# quarter of the model each. A real model has hundreds of units, and the transient part vanishes.

# %% [markdown]
# ## 4. What it costs on the wire
#
# Rajbhandari et al. 2020, section 7: a ring all-reduce is a reduce-scatter followed by an all-gather,
# each moving Ψ values per rank, so plain data parallelism moves 2Ψ per step. Stages 1 and 2 replace
# the all-reduce with exactly those two halves, a reduce-scatter of the gradients and an all-gather of
# the updated parameters: 2Ψ again, the memory saving for free. Stage 3 gathers the parameters twice,
# before the forward and before the backward: 3Ψ, 1.5× plain data parallelism (section 7.2.2).
# **Predict** (not graded): how many Ψ does stage 3 move per rank and step?

# %% tags=["answer:predict:zero3-traffic"]
my_prediction = None  # values moved per rank and step at stage 3, in units of Ψ
### BEGIN SOLUTION
my_prediction = 3
### END SOLUTION

# %%
traffic_guess = predict("zero3-traffic", my_prediction, zf.question("zero3-traffic"),
                        unit="Ψ", tolerance=0.01)

# %% [markdown]
# `runtime.commlog` recorded every collective the ranks made; `zero.traffic.volume` turns the bytes a
# rank passed in (an all-gather: its shard; a reduce-scatter: its whole input) into values moved in the
# paper's sense:

# %% tags=["reveals:zero3-traffic"]
print(zf.traffic_table(reports))
stage3 = zf.traffic_rows(reports)[3]
traffic_guess.versus(stage3["measured_psi"])
zf.traffic_figure(reports)

# %% [markdown]
# Six units, so six collectives of each kind per step; stage 3 has twelve all-gathers, two per unit.
# The same count holds every step (`report["collectives_same_every_step"]`):

# %%
print({stage: r["collectives_same_every_step"] for stage, r in reports.items()})

# %% [markdown]
# ## 5. Hiding the communication: buckets and prefetch
#
# Moving 2Ψ or 3Ψ costs time only if the GPU waits for it. PyTorch's DDP (Li et al. 2020, section
# 3.2.3) groups gradients in **buckets** and starts each bucket's all-reduce asynchronously as soon as
# its last gradient is ready, while the backward of the layers before it goes on. FSDP (Zhao et al.
# 2023, section 3.3) **prefetches**: once a unit's parameters have arrived, it issues the all-gather of
# the next unit's at once, so it travels while this unit computes. Here a bucket is a unit
# (`zero.overlap`; DDP's 25 MiB default would hold the course GPT whole and overlap nothing).
#
# `run_zero(..., overlap=True)` records each rank's step as a program (compute in thread CPU time,
# issue, wait), and `zero.overlap.place` lays the programs of all ranks out on the **virtual clock**
# (lesson 03): p dedicated devices, each with its own network queue, a collective costed by the α–β
# model of a link. Which link? The course's CPU ranks compute thousands of times slower than a GPU;
# on PCIe (25 GB/s) a block's all-gather would take microseconds against milliseconds of compute,
# and there would be nothing to hide. To keep a cluster's proportion between the two, the clock
# charges the collectives at **Gigabit Ethernet**'s 125 MB/s (`hardware.GIGABIT_ETHERNET`), thousands
# of times slower than NVLink: a unit's collective then takes milliseconds too. The order of the collectives is
# the engine's and is the same on every run:

# %%
from parallel_lab.hardware import GIGABIT_ETHERNET

overlapped = {stage: run_zero(stage=stage, dp=2, steps=2, overlap=True, link=GIGABIT_ETHERNET) for stage in (0, 3)}
print(zf.comm_orders(overlapped))

# %% [markdown]
# Stage 0's all-reduces go head first (the backward's order). Stage 3 gathers every unit in forward
# order, then again in backward order from the head, and each reduce-scatter follows the backward of
# its unit, interleaved with the next all-gather. The two charts below show stage 3's last step, first
# as it ran, then with every wait moved right after its issue (serial); the times are measured CPU
# time, so they change from run to run (nbval does not compare these cells). Compare the network lane
# with the compute lane: with overlap, the next unit's all-gather runs *under* this unit's compute;
# serially, the compute lane stops for every collective.

# %% tags=["nbval-ignore-output"]
zf.overlap_gantt(overlapped[3])

# %% tags=["nbval-ignore-output"]
zf.overlap_gantt(overlapped[3], which="serial")

# %% [markdown]
# The same measured work placed twice, so the difference is only where the waits are:

# %% tags=["nbval-ignore-output"]
print(zf.overlap_summary(overlapped))

# %% [markdown]
# Overlap is not free in memory: the unit in flight stays alive. At stage 3 the prefetched unit's
# parameters arrive while this unit's are still in use; at stage 2 the previous unit's gradient lives
# until its reduce-scatter has finished. The formula counts it (`per_rank(..., overlap=True)`), and the
# measurement agrees:

# %%
print(zf.units_in_use(overlapped))

# %% [markdown]
# ## 6. Exercise: ZeRO-2's step, yourself
#
# Write one ZeRO-2 step for one flat parameter of n values (n divisible by the number of ranks N):
#
# 1. **reduce-scatter** the gradient, so that rank r receives only its shard, values
#    `[r·n/N, (r+1)·n/N)` of the *sum* of all ranks' gradients, and divide by N for the average
#    (lesson 01: `dist.reduce_scatter_single(output, input)`);
# 2. run **Adam on that shard only**, with Adam's two moments kept only for the shard, in `state`;
# 3. **all-gather** the updated shards into the full `param` on every rank
#    (`dist.all_gather_single(output, input)`), in place.
#
# Adam (Kingma & Ba 2015; `torch.optim.Adam`'s defaults β₁ = 0.9, β₂ = 0.999, ε = 1e-8), at step t
# with gradient g: m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²; m̂ = m/(1−β₁ᵗ); v̂ = v/(1−β₂ᵗ);
# θ ← θ − lr·m̂/(√v̂ + ε). Every operation is element-wise, which is why a rank can update its slice
# alone (ZeRO, section 5.1).

# %% [markdown]
# **The check** runs your function for 3 steps on 2 and on 4 real ranks (n = 8 and n = 1000), each
# rank with its own gradient, and compares every rank's `param` with one process running
# `torch.optim.Adam` on the mean gradient (to 1e-12 in fp64). It reads what the ranks really sent
# (`commlog`): per step one reduce-scatter of the whole gradient and one all-gather of one shard. An
# all-reduce of the whole gradient followed by slicing computes the right numbers and fails: it leaves
# every rank the whole averaged gradient, N× the shard ZeRO-2 keeps. It also measures the optimizer
# state your rank keeps between steps (in `state` and in the cell's module-level names): at most 2n/N
# values.
#
# **What the check forbids:** `parallel_lab` (the engine's `zero` package is the answer) and
# `torch.optim`. Keep all your code in the answer cell: the grader reads that cell alone and runs it
# on fresh ranks of its own.

# %% tags=["answer:zero2-step"]
import torch
import torch.distributed as dist


def my_zero2_step(param, grad, state, lr):
    """One ZeRO-2 step on this rank. param: the full flat parameter (n values, the same on every rank),
    updated in place; grad: this rank's gradient (n values, its own slice of the batch); state: a dict
    kept between steps, empty at the first, for this rank's Adam moments; lr: the learning rate."""
    world, rank = dist.get_world_size(), dist.get_rank()
    shard = param.numel() // world
    ### BEGIN SOLUTION
    g = torch.empty(shard, dtype=grad.dtype)
    dist.reduce_scatter_single(g, grad)  # this rank's slice of the sum over ranks
    g /= world  # the average
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(g)
        state["exp_avg_sq"] = torch.zeros_like(g)
    state["step"] += 1
    t = state["step"]
    m, v = state["exp_avg"], state["exp_avg_sq"]
    m.mul_(0.9).add_(g, alpha=0.1)
    v.mul_(0.999).addcmul_(g, g, value=0.001)
    mine = param[rank * shard:(rank + 1) * shard]
    mine.sub_(lr * (m / (1 - 0.9**t)) / ((v / (1 - 0.999**t)).sqrt() + 1e-8))
    dist.all_gather_single(param, mine.clone())  # every rank's updated shard, into the full param
    ### END SOLUTION


# %% [markdown]
# **Try it on ranks** before the check: two ranks, the same parameter, each its own gradient. After
# one step every rank should hold the same updated parameter (the all-gather's work), 0.1 away from
# where it started in every value (Adam's first step moves each value by about lr).

# %%
# %%ranks 2 --with my_zero2_step
torch.manual_seed(dist.get_rank())  # each rank its own gradient
param = torch.arange(8, dtype=torch.float64)
my_zero2_step(param, torch.randn(8, dtype=torch.float64), {}, 0.1)
print([round(v, 4) for v in param.tolist()])

# %% tags=["check:zero2-step", "points:2"]
from parallel_lab.exercises import check_zero2_step

verdict = check_zero2_step(my_zero2_step)

# %% [markdown]
# ## 7. Where ZeRO-3 loses
#
# On the course's ranks the network is a memcpy, so 3Ψ costs nothing. On a cluster it is the point.
# Take the paper's 7.5B model on 64 GPUs (8 DGX H100 nodes), four 2048-token sequences per GPU per step
# (8192 tokens): the
# ring sends (N−1)/N of the traffic over each GPU's link. Inside a node that link is NVLink (450 GB/s
# each way); between nodes it is one InfiniBand NDR port per GPU (50 GB/s), and a data-parallel ring
# over 8 nodes crosses it. The compute is 6·Ψ·tokens FLOPs (forward 2, backward 4) at the achieved
# 40 % of the H100's peak (`hardware.SYSTEMS`):

# %%
print(zf.link_table(7.5e9, dp=64, tokens_per_gpu=8192, system="DGX H100"))
print()
print(zf.link_table(7.5e9, dp=64, tokens_per_gpu=4096, system="DGX H100"))

# %% [markdown]
# With 8192 tokens per GPU the compute (0.93 s) can hide the 2Ψ of stages 0-2 between nodes (0.59 s),
# if it overlaps (section 5); stage 3's 3Ψ (0.89 s) barely fits under it. With half the tokens per GPU
# nothing fits, and stage 3 leaves the step waiting longest for the network. Inside a node the same
# traffic takes a ninth of that. That is the trade ZeRO-3 makes: the model state divided by N for 1.5×
# the traffic, on links that may be 9× slower. FSDP's answer (Zhao et al. 2023, section 3.2.2,
# *hybrid sharding*) is to shard inside a node, where bandwidth is cheap, and replicate across nodes
# with a plain all-reduce of gradients — or keep
# stage 1 or 2, whose 2Ψ is no more than data parallelism already pays. Which stage wins for a given
# model and cluster is a question for the planner of lesson 16: `parallel-lab plan` searches the ZeRO
# stage beside dp, pp and tp, and each plan it prints carries its `zero`.

# %%
from parallel_lab.runtime import launcher

launcher.shutdown()  # stop the rank processes (a Binder pod has little memory)

# %% [markdown]
# ## What to remember
#
# - Training memory splits four ways. The model state is 2Ψ + 2Ψ + KΨ bytes (K = 12 for Adam in mixed
#   precision: 16 bytes per parameter), the same on every data-parallel GPU; activations belong to each
#   GPU's slice of the batch (Rajbhandari et al. 2020, section 3).
# - ZeRO shards what the replicas duplicate: stage 1 the optimizer state (2Ψ + 2Ψ + KΨ/N), stage 2 also
#   the gradients (2Ψ + (2 + K)Ψ/N), stage 3 — FSDP — also the parameters ((2 + 2 + K)Ψ/N). Every stage
#   trains exactly like one process.
# - The peak adds the units in use: one full gradient at stage 2, a unit's parameters and gradient at
#   stage 3, one more with overlap (Zhao et al. 2023): wrap the model in many small units.
# - Stages 1 and 2 move 2Ψ per step, the same as an all-reduce (a reduce-scatter plus an all-gather);
#   stage 3 moves 3Ψ, gathering the parameters for the forward and again for the backward (ZeRO,
#   section 7).
# - Buckets (DDP, Li et al. 2020) and prefetch (FSDP) run the collectives under the compute, at the cost
#   of one more unit in memory; across slow inter-node links ZeRO-3's 3Ψ may not fit under it — shard
#   inside a node, and let the planner weigh the stage.
