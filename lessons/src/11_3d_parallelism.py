# %% [markdown]
# # 11 · 3D parallelism on a device mesh
#
# > *Both are usually layered together: tensor parallelism inside a node, pipeline parallelism
# > between nodes.* (兩者通常分層在一起，在節點內使用張量並行性，在節點之間使用管道並行性。)
#
# **Learning goals.** By the end of this lesson you can
#
# - map a rank to its **(data, pipeline, tensor)** coordinate on a device mesh and name the three
#   process groups it belongs to, and build those groups yourself from the rank grid;
# - explain with numbers from the α–β model **why tensor parallelism stays inside the NVLink domain**
#   (a node of 8 GPUs, or a 72-GPU NVL72 rack) and pipeline and data parallelism go across it;
# - recognise the shapes that cannot work (a mesh that does not fill the machine, more stages than
#   layers, sizes that do not divide) from the error raised **before** any process starts;
# - train the tiny GPT with **DP × PP × TP at once** on real ranks and check that every step's loss
#   and the final weights equal single-process training.
#
# The earlier lessons built the pieces one at a time: Megatron's tensor-parallel layers (02), pipeline
# schedules on real ranks (03-09), data parallelism's bucketed gradient all-reduce (09). Here they run
# together, as in
# Megatron-LM's "PTD-P" (Narayanan et al. 2021, *Efficient Large-Scale Language Model Training on GPU
# Clusters Using Megatron-LM*), which trained a trillion-parameter GPT on 3072 GPUs this way.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. The mesh: every rank has three coordinates
#
# With `dp × pp × tp` devices, arrange the global ranks in a 3D grid,
# `torch.arange(world).view(dp, pp, tp)` (picotron's one-liner). A rank's coordinate says which
# **replica** of the model it serves (dp), which **pipeline stage** of that replica (pp), and which
# **tensor shard** of that stage's layers (tp). Each coordinate axis gives a family of process groups:
#
# | group | ranks that differ only in | they | how often |
# |---|---|---|---|
# | tensor (tp) | the tp coordinate | all-reduce activations (Megatron's f and g) | 4× per layer and micro-batch |
# | pipeline (pp) | the pp coordinate | send activations forward, gradients back | 2× per stage boundary and micro-batch |
# | data (dp) | the dp coordinate | all-reduce gradients | once per step |
#
# **Predict:** 8 GPUs on 2 nodes of 4, `dp = pp = tp = 2`. Which of the three kinds of group has
# members on both nodes? (Not graded.)

# %% tags=["answer:predict:mesh-crossing"]
my_prediction = None  # "tp", "pp" or "dp"
### BEGIN SOLUTION
my_prediction = "dp"  # tp varies fastest, then pp: a node of 4 holds one whole replica
### END SOLUTION

# %%
from parallel_lab.show.predict import predict

crossing_guess = predict("mesh-crossing", my_prediction,
                         {"en": "the kind of group with members on both nodes, dp = pp = tp = 2 on 2 nodes of 4",
                          "zh-Hant": "dp = pp = tp = 2、2 個各有 4 個裝置的節點時，成員分布在兩個節點上的那一種群組"},
                         choices=("tp", "pp", "dp"))

# %% tags=["reveals:mesh-crossing"]
from parallel_lab.runtime.mesh import ParallelDims
from parallel_lab.show import mesh as mesh_figures
from parallel_lab.show.mesh import mesh_figure

dims = ParallelDims(dp=2, pp=2, tp=2, nodes=2)  # 2 nodes x 4 devices
print(dims)
print(dims.grid())
print(mesh_figures.groups_text(dims))
crossing_guess.versus(next(dim for dim in ("tp", "pp", "dp") if dims.crosses_nodes(dim)))

# %% tags=["reveals:mesh-crossing"]
mesh_figure(dims)

# %% [markdown]
# Tensor parallelism is the **fastest-varying** coordinate, so a TP group is a run of adjacent ranks
# and torchrun numbers ranks node by node: TP groups never leave a node. Pipeline neighbours are `tp`
# ranks apart and data-parallel replicas `pp · tp` apart; here the data-parallel groups are the ones
# that cross the network. Reading one rank's coordinate is a `divmod`:

# %%
print(mesh_figures.coords_text(dims, ranks=(0, 5, 6)))

# %% [markdown]
# Putting the tensor dimension anywhere else would stretch its groups over nodes. The mesh refuses a
# layout whose TP groups cannot stay inside one node:

# %%
for layout in (dict(dp=1, pp=1, tp=8, nodes=2), dict(dp=1, pp=3, tp=2, nodes=2)):
    try:
        ParallelDims(**layout)
    except ValueError as err:
        print(f"{layout}: {err}")

# %% [markdown]
# ### Exercise: the three families of groups, from the grid
#
# Write `my_mesh_groups(dp, pp, tp)`: for a world of `dp · pp · tp` ranks laid out as above (the rank
# at coordinate (d, p, t) is `(d · pp + p) · tp + t`, tp fastest), return a dict
# `{"dp": [...], "pp": [...], "tp": [...]}` that holds, for each axis, **every** group along it: the
# ranks that differ only in that coordinate. Each group is a list of ranks in the order of their
# coordinate on that axis (which is increasing rank order); the order of the groups in each list is
# up to you. For the 2 × 2 × 2 mesh above, `"tp"` is `[[0, 1], [2, 3], [4, 5], [6, 7]]`.

# %% [markdown]
# **What the check does.** It calls your function for five meshes. For the three of 4 ranks
# (1 × 2 × 2, 2 × 1 × 2 and 2 × 2 × 1) it then does with your lists what the library's `build_groups`
# does, on 4 real ranks: every rank creates every group with `dist.new_group`, in the same order
# (torch.distributed requires every process to enter `new_group` for every group, even those it is not
# in), and all-reduces `2**rank` over each group it belongs to, so each sum names exactly the ranks
# that took part; the checker compares them with the groups it computes itself. The 2 × 2 × 2 mesh
# and a 2 × 3 × 4 one (24 ranks) are compared as lists only.
#
# **What the check forbids:** the library's mesh (`parallel_lab.runtime.mesh`, `ParallelDims`, or
# any other `parallel_lab` import) and `torch.distributed` itself: your function is arithmetic on the
# grid (`torch` is allowed, so `torch.arange(world).view(dp, pp, tp)` is a fine start) and the check
# creates the groups. Your function runs on a rank of its own; only the lists it returns come back.
#
# Keep all your code in the answer cell below: the grader reads that cell alone from your notebook and
# runs it on fresh ranks of its own, so helpers defined in other cells are not seen.

# %% tags=["answer:mesh-groups"]
def my_mesh_groups(dp, pp, tp):
    """{"dp": [...], "pp": [...], "tp": [...]}: every group of ranks along each axis of the
    dp x pp x tp grid (rank = (d * pp + p) * tp + t), each group in coordinate order."""
    ### BEGIN SOLUTION
    def rank(d, p, t):
        return (d * pp + p) * tp + t

    return {
        "dp": [[rank(d, p, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
        "pp": [[rank(d, p, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
        "tp": [[rank(d, p, t) for t in range(tp)] for d in range(dp) for p in range(pp)],
    }
    ### END SOLUTION


# %% [markdown]
# **Try it on ranks** before the check: on 4 ranks, every rank creates every group your function
# returns for dp 1 × pp 2 × tp 2 (all ranks must create all groups, in the same order), then sums
# its rank over its tensor-parallel group: ranks 0 and 1 should get 1, ranks 2 and 3 should get 5.

# %%
# %%ranks 4 --with my_mesh_groups
import torch
import torch.distributed as dist

groups = my_mesh_groups(1, 2, 2)
me = dist.get_rank()
made = {axis: [dist.new_group(g) for g in members] for axis, members in groups.items()}
tp_group = next(h for g, h in zip(groups["tp"], made["tp"]) if me in g)
x = torch.tensor([float(me)])
dist.all_reduce(x, group=tp_group)
print({axis: next(g for g in members if me in g) for axis, members in groups.items()}, "tp sum", x.item())

# %% tags=["check:mesh-groups", "points:2"]
from parallel_lab.exercises import check_mesh_groups

verdict = check_mesh_groups(my_mesh_groups)

# %% [markdown]
# The library builds the same lists without a loop over coordinates: it permutes the grid so that the
# axis of the group comes last, then reads off rows (picotron's way). It appears here once your answer
# passes:

# %%
from parallel_lab.exercises import reveal

reveal("mesh-groups", ParallelDims.groups)

# %% [markdown]
# ## 2. Why tensor parallelism stays inside the NVLink domain
#
# FAQ 6 of the course: *tensor parallelism communicates often to recombine partial matrix results,
# so it is placed inside a node, where interconnect bandwidth (NVLink) is highest*
# (張量並行性經常進行通訊……因此它被放置在 NVLink 節點內部互連頻寬最高的地方). Lesson 02 derived it for one
# layer; now compare the **three** kinds of traffic of one GPT-3 175B layer (h = 12288, one 2048-token
# sequence per micro-batch, bf16) on 8 GPUs each way, with lesson 02's computation
# (`planning.cost.tp_layer_step`) and its DGX H100 preset (`hardware.SYSTEMS`): NVLink 4 at 450 GB/s
# per GPU and direction inside the node (α 3 µs), InfiniBand NDR at 50 GB/s per GPU between nodes
# (α 10 µs), GPUs achieving 396 TFLOP/s (40 % of the H100's 989 dense BF16).

# %%
from parallel_lab.hardware import SYSTEMS

print(mesh_figures.layer_traffic_table(SYSTEMS["DGX H100"], b=1, s=2048, h=12288, t=8))

# %% [markdown]
# Over InfiniBand, the tensor-parallel all-reduces of a layer (7.61 ms) take as long as its compute
# (7.04 ms), on the critical path, in every layer; over NVLink they cost 14 % of it — the same numbers
# as lesson 02's widget and lesson 16's table, from the same function. The pipeline sends one
# activation forward and one gradient back per stage boundary: 2.03 ms over InfiniBand for the whole
# tensor, and 1/t of it, 0.27 ms, with Megatron-LM's scatter/gather (Narayanan et al. 2021, §4.1: each
# TP rank sends its slice and the next stage all-gathers them over NVLink). Data parallelism
# all-reduces the gradients once per step and can overlap that with the backward pass. So: **TP
# inside the NVLink domain (8 GPUs in a DGX node, 72 in a GB200 NVL72 rack), PP and DP across it** —
# exactly the order of the mesh's coordinates.
#
# ## 3. Shapes that cannot work — caught before any process starts
#
# `train3d.check` validates a plan in the parent (pure arithmetic, no process), and every message
# names the broken invariant with its values. Read each plan's name and say which rule it breaks, then
# compare with the message:

# %%
from parallel_lab.parallel3d import train3d
from parallel_lab.show import train3d as train3d_figures

base = train3d.Config(dp=1, pp=2, tp=2, layers=4, hidden=16, heads=4, vocab=32, seq=8, batch=8, microbatches=2)
print(train3d_figures.check_plans(base))  # train3d.check(base.replace(**changes), world_size=world) for each

# %% [markdown]
# The memory check is `memory_model.max_device_memory` (lesson 00's arithmetic on a mesh) with this
# run's fp64 weights, gradients and Adam moments, and the activations of the micro-batches the
# schedule keeps in flight — the same model the planner uses (lesson 15).
#
# ## 4. One training step of a rank
#
# Every rank runs `train3d._train`, whose set-up is printed below. It builds the whole dense GPT from
# the seed and applies the three techniques to it from outside, one function each, as torchtitan does
# (`parallel3d.apply`): `apply_tp` keeps **its tensor shard** (lesson 02's `parallelize`; the loss is
# Megatron's vocabulary-parallel cross-entropy), `apply_pp` keeps **its pipeline stages**, and
# `apply_dp` gives the optimizer of a data-parallel replica. The pipeline executor of the pipeline
# lessons runs the schedule; its pipeline rank `r` is global rank
# `groups.pp_ranks[r]` (its `peers`), so the two pipelines of a 2 × 2 × 2 mesh — one per (replica,
# tensor shard) — talk only to their own ranks. Each step runs `ex.step(idx, targets)` (the schedule,
# with the TP collectives inside every action), then `opt.step()`: the optimizer's step first
# averages the gradients over `groups.dp_group` with a bucketed all-reduce
# (`data_parallel.allreduce_gradients`, as in PyTorch DDP), then updates every shard. With `zero=1`
# (`run 3d --zero 1`) the replicas instead shard Adam's moments: `zero.sharded_adam.ShardedAdam`
# reduce-scatters the gradients, each replica updates its 1/dp slice and all-gathers the parameters —
# the same 2Ψ of traffic, 1/dp of the optimizer state (ZeRO-1, Rajbhandari et al. 2020; lesson 12
# takes it to stages 2 and 3).

# %%
from parallel_lab.i18n import source
from parallel_lab.parallel3d import apply

print(source(train3d._train).split("    losses, ")[0])  # then per step: ex.step(...), opt.step()
print(source(apply.apply_dp))

# %%
print(mesh_figures.pipelines_text(dims))

# %% [markdown]
# Why should this give *exactly* the numbers of one process? Tensor parallelism computes the same
# sums split into pieces; the pipeline runs equal micro-batches whose losses are scaled by 1/m, so
# their gradients add up to the gradient of the batch mean; data-parallel replicas see equal slices,
# so the average of their gradients is the gradient of the whole batch. SGD and Adam then act element
# by element, so updating shards is updating the whole. In fp64 only the order of additions differs:
# ~1e-15 per step.
#
# ## 5. Training the tiny GPT on 4 ranks
#
# A 4-layer GPT (hidden 16, 4 heads, vocabulary 32, sequences of 8 tokens), batches of 8 sequences,
# Adam, fp64, six steps. First `dp 1 × pp 2 × tp 2` with the 1F1B schedule: two pipeline stages, each
# split over two tensor-parallel ranks. The first call starts the 4 rank processes (a few seconds);
# the lines after it come back when the ranks are done.

# %%
runs = [train3d.train(base, steps=6)]
print(train3d_figures.format_result(runs[0]))

# %% [markdown]
# The other two ways to use 4 ranks with two of the three dimensions, with other schedules:
# `2 × 2 × 1` (GPipe) and `2 × 1 × 2` (ZB-H1 needs a pipeline; with one stage any schedule is gradient
# accumulation).

# %%
runs.append(train3d.train(base, dp=2, pp=2, tp=1, schedule="gpipe", steps=6))
runs.append(train3d.train(base, dp=2, pp=1, tp=2, steps=6, progress=None))
for r in runs:
    print(train3d_figures.format_result(r))

# %%
train3d_figures.loss_figure(runs)

# %% [markdown]
# Every marker sits on the single-process line; the checks above compare every step's loss and every
# final weight of every rank (each shard against the same shard cut from the single-process model)
# to 1e-9.
#
# Lesson 16 checks the planner's predicted step times against real runs of this kind.
#
# ## 6. Eight ranks and real clusters
#
# The full 2 × 2 × 2 mesh of section 1 runs the same way, `train3d.train(base, dp=2, pp=2, tp=2)` on 8
# ranks (the course's tests check it: `tests/test_train3d.py`; it is left out here because starting
# 8 more processes would take longer than this lesson's time budget on a small machine). On GPUs,
# torchrun starts one process per GPU (NCCL) and the command prints the same check as JSON:
#
# ```bash
# torchrun --standalone --nproc-per-node 8 -m parallel_lab.parallel3d.train3d \
#     --dp 2 --pp 2 --tp 2 --steps 3
# torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:29500 \
#     -m parallel_lab.parallel3d.train3d --dp 2 --pp 2 --tp 2 --nodes 2
# ```

# %%
from parallel_lab.runtime import launcher

launcher.shutdown()  # stop the rank processes (a Binder pod has little memory)

# %% [markdown]
# ## What to remember
#
# - A 3D mesh is `arange(world).view(dp, pp, tp)`: each rank has a (replica, stage, shard) coordinate
#   and belongs to one TP, one PP and one DP group; with TP fastest-varying, TP groups are adjacent
#   ranks on one node.
# - TP all-reduces full activations 4× per layer and micro-batch, PP sends one activation per stage
#   boundary, DP all-reduces gradients once per step: so **TP inside the NVLink domain (8 GPUs of a
#   DGX node, 72 of an NVL72 rack), PP and DP across it (InfiniBand)**.
# - A plan must fit the machine exactly (`dp·pp·tp` = devices), have at least one layer per stage,
#   divide the batch into equal micro-batches per replica, and divide heads, hidden and vocabulary
#   by tp — check it before launching anything.
# - Done right, 3D training computes the same numbers as one process: equal micro-batches and
#   replicas make means of means the mean; element-wise optimizers update shards like the whole.
