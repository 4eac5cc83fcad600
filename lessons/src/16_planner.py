# %% [markdown]
# # 16 · The planner: choosing the split
#
# **Learning goals.** By the end of this lesson you can
#
# - read what the planner (`parallel_lab.planning.planner`) picks for GPT-3 175B on 64 DGX H100
#   servers of 8 GPUs, with lesson 15's memory and time models, and why it rejects the other
#   candidates;
# - explain why tensor parallelism stays inside the NVLink domain (≤ 8 GPUs on a DGX node), and why
#   on H100s TP 4 edges out TP 8 — a shallower pipeline's all-reduces against a deeper one's bubble —
#   where on Megatron-LM's A100s TP 8 won;
# - turn a plan into GPU-hours and a budget, and run the same search from the command line;
# - say where ZeRO-3 (lesson 12) beats tensor and pipeline parallelism (a model that fits only
#   sharded) and where it loses (its traffic crossing the network), as Narayanan et al. 2021 measured;
# - check the planner's predicted step times against real runs on this machine's ranks.
#
# You need lesson 15 (the memory and the time of one plan) and the lessons it builds on.

# %%
from parallel_lab.course.notebook import setup

setup()

# %%
from parallel_lab.hardware import SYSTEMS, Cluster
from parallel_lab.i18n import pad
from parallel_lab.planning import cost, memory, planner
from parallel_lab.show import planner as pw
from parallel_lab.show.predict import predict

gpt3 = pw.GPT3

# %% [markdown]
# ## 1. The search: GPT-3 175B on 64 DGX H100 servers
#
# `planner.plan` tries every (dp, pp, tp) whose product is the number of GPUs, every schedule whose
# closed form lesson 15's time model holds equal to the simulator (GPipe, 1F1B, interleaved 1F1B
# with 2–4 chunks, ZB-H1, and the V schedules ZB-V and DualPipeV of lesson 07), recomputation (none,
# selective, full) and ZeRO stage (0–3, column `Z`), and for each the number of micro-batches (a
# divisor of the batch per replica) that is fastest and fits. GPT-3's batch: 1536 sequences of 2048
# tokens.
#
# It prices the ends where they run: the embedding on the first rank, the LM head and its loss on
# the last (rank 0 in a V), as `pipeline.stages.cut` and Megatron-LM place them, and a pp that does
# not divide the layers gets lighter end ranks. Spreading their work evenly over all ranks
# (`ends=False`) would crown a plan that a real pipeline cannot run at its predicted speed; section 2
# shows one.

# %%
print(pw.line("planning", gpus=pw.CLUSTER.world_size))
result = planner.plan(gpt3, pw.CLUSTER, pw.BATCH)
print(pw.line("fastest", feasible=result["feasible"]))
print(pw.plans_table(result["plans"][:10]))

# %% [markdown]
# Every plan keeps tensor parallelism inside a node (TP ≤ 8). The ten fastest are within 1 % of
# each other, well inside the model's own accuracy: a planner narrows hundreds of layouts to a
# handful, and a short measured run decides between those. They share TP 4 and a shallow pipeline
# (PP 4 or 8), which leaves a wide data-parallel group (dp 32 or 16) and so makes **ZeRO** cheap
# memory: sharding Adam's state (ZeRO-1) or the gradients too (ZeRO-2) over 32 replicas. Every
# schedule appears, the V schedules included, within a few tenths of a second.
#
# To see the trade between tensor and pipeline parallelism on its own, keep only the plans without
# ZeRO (the same search's rows with `Z` = 0):

# %%
no_zero = {"plans": [p for p in result["plans"] if p["zero"] == 0]}
print(pw.plans_table(no_zero["plans"][:3]))

# %% [markdown]
# **An honest surprise.** Megatron-LM's paper (Narayanan et al. 2021) ran GPT-3 175B on DGX A100s
# with TP 8 — a whole node — and 1F1B-family schedules. Here, on H100s without ZeRO, the best plan
# is **TP 4 × PP 16 × DP 8 with ZB-H1**, ahead of every TP 8 plan, and TP 4 comes first with 1F1B
# too. Given the A100 cluster and 1F1B, the same planner puts TP 8 first, as in the paper
# (`tests/test_planner.py::test_gpt3_with_1f1b_puts_tp8_first_on_a100s_and_tp4_on_h100s`). Why?
#
# **Predict** before reading on: both best plans have dp 8 and 192 micro-batches. How many times
# more all-reduce time per step does TP 8 × PP 8 spend than TP 4 × PP 16?

# %% tags=["answer:predict:tp8-over-tp4"]
my_prediction = None  # TP 8's all-reduce seconds per step over TP 4's (a ratio, e.g. 2)
### BEGIN SOLUTION
my_prediction = 7 / 3  # twice the layers per GPU, 2·7/8 instead of 2·3/4 of each message
### END SOLUTION

# %%
ratio_guess = predict("tp8-over-tp4", my_prediction, pw.line("tp-ratio"), tolerance=0.25)

# %% tags=["reveals:tp8-over-tp4"]
only_1f1b = [p for p in no_zero["plans"] if p["schedule"] == "1f1b"]
print(pw.line("h100-1f1b"))
print(pw.plans_table(only_1f1b[:5]))
a100 = planner.plan(gpt3, SYSTEMS["DGX A100"].cluster(64), pw.BATCH, schedules=("1f1b",), zero=(0,))
print(pw.line("a100-1f1b"))
print(pw.plans_table(a100["plans"][:3]))
same = dict(dp=8, microbatches=192)  # the best plans of dp 8 and 192 micro-batches, without ZeRO
plans = {"tp4-zbh1": pw.best_plan(no_zero["plans"], tp=4, schedule="zb-h1", **same),
         "tp8-zbh1": pw.best_plan(no_zero["plans"], tp=8, schedule="zb-h1", **same),
         "tp4-1f1b": pw.best_plan(no_zero["plans"], tp=4, schedule="1f1b", **same),
         "tp8-1f1b": pw.best_plan(no_zero["plans"], tp=8, schedule="1f1b", **same)}  # tp8-1f1b: Megatron-style
print(f"{pad(pw.line('compare-header'), 28)} {pad(pw.COLUMNS['compute_s'], 8, '>')} {'TP':>6} "
      f"{pad(pw.COLUMNS['bubble_s'], 7, '>')} {pad(pw.line('step'), 7, '>')}")
for key, p in plans.items():
    parts = p["breakdown"]
    print(f"{pad(pw.line(key), 28)} {parts['compute_s']:>8.2f} {parts['tp_comm_s']:>6.2f} "
          f"{parts['bubble_s']:>7.2f} {p['step_s']:>7.2f}")
tp_comm = {key: p["breakdown"]["tp_comm_s"] for key, p in plans.items()}
ratio_guess.versus(tp_comm["tp8-zbh1"] / tp_comm["tp4-zbh1"], pw.line("planner-model"))
compare = {pw.line(key): p for key, p in plans.items()}
pw.breakdown_figure(compare, title=pw.line("tp-figure"), parts=("tp_comm_s", "bubble_s", "pp_comm_s", "dp_comm_s"))

# %% [markdown]
# The four plans have the same dp 8 and the same 192 micro-batches of one sequence; they differ in
# how the other 64 GPUs of a replica split, pp × tp = 64.
#
# - **Compute is almost the same**: the same FLOPs over the same 512 GPUs (TP 4 adds selective
#   recomputation: it needs the memory).
# - **TP all-reduces**: TP 8 halves the pipeline, so each GPU holds 12 layers instead of 6 — twice
#   the all-reduces per micro-batch — and each ring sends
#   2·7/8 instead of 2·3/4 of the message: 7/3 ≈ 2.3× the bytes (`cost.tp_per_device_ratio(4, 8)`),
#   plus 14 ring steps of latency instead of 6.
# - **The bubble**: TP 4's pipeline is twice as deep, 15 slots of fill and drain instead of 7, and
#   its last rank (6 layers and the LM head) is relatively heavier than TP 8's (12 layers and the
#   head), which paces the steady state. ZB-H1 fills most of the drain with weight-gradient work.
# - **On H100s** the all-reduces TP 4 saves outweigh the bubble it adds, with either schedule.
#   **On A100s** (above) the GPU computes 3.2× slower and NVLink is only 1.5× slower, so the
#   all-reduces weigh less against the compute while the bubble, which is compute, weighs as much:
#   with 1F1B, TP 8 comes first, as Megatron-LM chose.
#
# GPUs that outrun their links, and cheap deep pipelines (lesson 07), change
# the best tensor-parallel degree. Neither answer is "TP 8 because a node has 8 GPUs".

# %% [markdown]
# ## 2. Why the others fail
#
# The planner says why it rejects a candidate, before anything starts — the course's habit of
# naming the broken invariant with its values. Grouped by kind (a layout that cannot work at all is
# rejected once; a memory failure once per schedule and recomputation tried):

# %%
print(pw.rejections_table(result))

# %% [markdown]
# - **Memory** rejects most (each ZeRO stage that does not fit counts once): pure data parallelism
#   without ZeRO needs the whole 2.8 TB of model state per GPU; TP 8 × PP 1 still 350 GB. The nearest
#   miss is TP 2 × PP 16 with ZeRO-2, 0.5 GB over: ZeRO-2 shards the gradients but keeps one layer's
#   full gradient in flight, and TP 2 splits the activations only by 2.
# - **Layers** must split into stages: pp 64 does not divide 96 layers, so its end ranks get one
#   block and the middle ones two (the lighter ends carry the embedding and the head); pp 128 has
#   no such split.
# - **TP groups may not cross nodes**, which brings us to the FAQ's sixth question.
#
# A plan can also fail by being priced wrong. Spread the embedding's and the LM head's work evenly
# over all ranks (`ends=False`, searching the four one-stage-per-rank schedules) and the planner's
# best is TP 2 × PP 32 × DP 8 with ZB-H1 and ZeRO-1 (`tests/test_planner.py` holds it). Its last
# rank holds 3 blocks and the head, a third of a block more:

# %%
even = dict(dp=8, pp=32, tp=2, microbatches=192, schedule="zb-h1", recompute="selective", zero=1)
for ends in (False, True):
    step = cost.step_time(gpt3, pw.CLUSTER, pw.BATCH, **even, ends=ends)["step_s"]
    print(pw.line("ends", ends=ends, step=step))
print(pw.line("section-1", step=result["plans"][0]["step_s"]))

# %% [markdown]
# Priced where the head runs, that plan falls behind the best of section 1: which is why the planner
# prices the ends by default.
#
# ## 3. Why tensor parallelism stays inside the NVLink domain
#
# *Tensor parallelism communicates often to recombine partial results, so it is placed inside a node,
# where the interconnect (NVLink) is fastest* (張量並行性經常進行通訊以重新組合部分矩陣結果，因此它被
# 放置在 NVLink 節點內部互連頻寬最高的地方). Lesson 02 measured this; here it is with the same function
# and the same DGX H100 preset as lessons 02 and 11 (`cost.tp_layer_step`), for one layer's forward
# and backward and one micro-batch of GPT-3 on one GPU:

# %%
print(pw.tp_link_table(gpt3))

# %% [markdown]
# Inside the NVLink domain the four all-reduces add 14 % to the layer's compute at TP 8 (12 % of the
# layer's time); over the network they would cost as much as the compute itself. The domain is 8
# GPUs on a DGX/HGX node and 72 on a GB200 NVL72 rack, where a TP group of 16 or more can stay on
# NVLink. If the planner allowed a TP group to span two DGX nodes, its own model would predict this
# (TP 16 × PP 16 × DP 2, every TP group on two nodes):

# %%
inside = pw.best_plan(result["plans"], tp=8, pp=16, schedule="zb-h1", microbatches=384)
spanning = cost.across_nodes(gpt3, pw.CLUSTER, pw.BATCH, dp=2, pp=16, tp=16, microbatches=768)
print(pw.line("inside", step=inside["step_s"], tp=inside["breakdown"]["tp_comm_s"]))
print(pw.line("across", step=spanning["step_s"], tp=spanning["tp_comm_s"]))

# %% [markdown]
# Pipeline stages, on the other hand, send one activation per micro-batch and stage — about 0.1 s
# per step here — so they cross nodes cheaply: tensor parallelism inside the NVLink domain, pipeline
# across servers, data parallelism on top, exactly the layering the article describes.
#
# ## 4. Cost and budget
#
# A plan's step time becomes a budget: steps = tokens / (batch × sequence), GPU-hours = steps × step
# time × GPUs / 3600 (`planner.training_cost`). GPT-3 was trained on 300 billion tokens. Put in
# your own price per GPU-hour:

# %%
price_per_gpu_hour = 2.00  # $ per GPU-hour: change it to your provider's price
tokens = 300e9
best = result["plans"][0]
print(pw.cost_table(best, prices=(price_per_gpu_hour,), tokens=tokens))
megatron = plans["tp8-1f1b"]
extra = planner.training_cost(megatron, tokens, price_per_gpu_hour)["cost"] - \
    planner.training_cost(best, tokens, price_per_gpu_hour)["cost"]
print(pw.line("extra-cost", extra=extra, slower=megatron["step_s"] / best["step_s"] - 1))

# %% [markdown]
# Three weeks on 512 GPUs, half a million dollars, and a choice of layout worth tens of thousands —
# which is why the article's guidance applies here as much as anywhere: **define latency, quality and
# cost targets before you start; benchmark under realistic load** (the planner's constants —
# TFLOP/s, α, bandwidths — should come from your cluster; `planning.calibration.calibrate` fits them on real
# ranks); and do not let one benchmark hide the weaknesses of the whole system (the model leaves out
# kernel efficiency and congestion, and its overlap is one assumed share of the backward).
#
# ### Try it
#
# Change the cluster and press *Plan* (a second or two). Things to find:
#
# 1. How few 8-GPU servers of 80 GB can train GPT-3 175B at this batch at all?
# 2. With 141 GB GPUs (H200), which of its memory savings does the best plan give up?
# 3. Cut the network to 12.5 GB/s per GPU: which part of the step grows, and does the best layout change?
# 4. Raise the NVLink bandwidth to 900 GB/s (NVLink 5, keeping the H100's compute): does TP 8 take
#    the lead again? Then a B200's 900 TFLOP/s as well?

# %% tags=["nbval-ignore-output"]
pw.planner_widget()

# %% [markdown]
# For example, the same model and batch on a quarter of the cluster (16 DGX H100), and on 64 DGX
# H200 (141 GB GPUs):

# %%
for nodes, system in ((16, SYSTEMS["DGX H100"]), (64, SYSTEMS["DGX H200"])):
    smaller = planner.plan(gpt3, system.cluster(nodes), pw.BATCH, top=3)
    print(pw.line("smaller", nodes=nodes, system=system.name, gb=system.gpu_mem_gb, feasible=smaller["feasible"]))
    print(pw.plans_table(smaller["plans"]))
    print(pw.cost_table(smaller["plans"][0], prices=(price_per_gpu_hour,), tokens=tokens).splitlines()[0])
    print()

# %% [markdown]
# ## 5. The same search from the command line
#
# Instructors and scripts use `parallel-lab plan`; with `--json` it prints one JSON object (plans
# with their breakdown, memory and, given `--price`, cost; rejections with their reasons). It
# searches what `planner.plan` searches, every schedule with the ends priced on their ranks;
# `--schedules` narrows the schedules and `--no-ends` spreads the ends, to compare. In a terminal:
#
# ```bash
# parallel-lab plan --layers 96 --hidden 12288 --heads 96 --vocab 50257 \
#     --seq 2048 --batch 1536 --nodes 64 --gpus-per-node 8 --gpu-mem-gb 80 \
#     --price 2 --top 5
# ```
#
# Run here (the same program, `python -m parallel_lab.cli`), first lines of its output:

# %%
import subprocess
import sys

args = ["plan", "--layers", "96", "--hidden", "12288", "--heads", "96", "--vocab", "50257", "--seq", "2048",
        "--batch", "1536", "--nodes", "64", "--gpus-per-node", "8", "--gpu-mem-gb", "80", "--price", "2", "--top", "5"]
print(pw.line("running", args=" ".join(args[:3])))
out = subprocess.run([sys.executable, "-m", "parallel_lab.cli", *args], capture_output=True, text=True, timeout=120)
print(pw.line("exit", code=out.returncode))
print("\n".join(out.stdout.splitlines()[:7]))

# %% [markdown]
# ## 6. ZeRO-3 against tensor and pipeline parallelism
#
# ZeRO (Rajbhandari et al. 2020) does not split the model's computation; it splits its *memory* over
# the data-parallel replicas. Stage 1 shards Adam's 12 bytes per parameter, stage 2 the gradients'
# 2 too, stage 3 the weights' 2 as well: 16Ψ/dp per GPU (plus the layer being gathered and the next
# one prefetched). The price is traffic: stage 3 all-gathers every layer's weights before its forward
# and again before its backward and reduce-scatters its gradient — 3Ψ per micro-batch, 1.5× plain
# data parallelism's 2Ψ (`cost.dp_communication`). Pure data parallelism with GPT-3 175B on the 512
# GPUs, one GPU, by stage (3 sequences per GPU, full recomputation):

# %%
pure = dict(model=gpt3, micro_batch=3, dp=512, pp=1, tp=1, microbatches=1, recompute="full")
print(pw.memory_table({pw.line("pure-dp", zero=z): dict(pure, zero=z) for z in range(4)}))

# %% [markdown]
# Only ZeRO-3 fits. **Where it wins**: a model that fits only sharded, on GPUs joined by NVLink.
# GPT-3 1.3B (21 GB of model state) on one node of 8 GPUs of 16 GB: without ZeRO pure data
# parallelism does not fit; sharded it does, with neither a bubble nor a TP all-reduce on the
# critical path, and it ranks ahead of the pipelined plans. ZeRO-3 holds the least (2.6 GB of state per GPU)
# at the same speed: at 450 GB/s its all-gathers travel behind the compute.

# %%
small = planner.plan(memory.MODELS["GPT-3 1.3B"], Cluster(1, 8, 16), 16)
print(pw.plans_table(small["plans"][:4]))

# %% [markdown]
# **Where it loses**: bandwidth across nodes. Megatron-LM's paper compared its PTD-P (tensor +
# pipeline + data parallelism) with ZeRO-3 for GPT-3 175B and 530B at a fixed batch (Narayanan et
# al. 2021, §5.2, Table 2 and Figure 10): for 175B, PTD-P led by 6 % on 384 A100s, by 70 % once both
# doubled their GPUs, and by 3.2× on 1536, because ZeRO-3's data-parallel group spans every node and
# its 3Ψ cross the network, with ever fewer sequences per GPU to hide them behind. The planner, on our
# 64 DGX H100, and the same ZeRO-3 plan on a (hypothetical) network as fast as NVLink:

# %%
zero3 = pw.best_plan(result["plans"], tp=1, pp=1, zero=3)
flat = planner.plan(gpt3, Cluster(64, 8, 80, inter_gbps=450), pw.BATCH, zero=(3,))
print(pw.zero_table({pw.line("best-3d"): result["plans"][0], pw.line("pure-zero3"): zero3,
                     pw.line("flat-zero3"): pw.best_plan(flat["plans"], tp=1, pp=1)}))
print(pw.line("zero3-slower", slower=zero3["step_s"] / result["plans"][0]["step_s"] - 1))
pw.breakdown_figure({pw.line("best-3d"): result["plans"][0], pw.line("pure-zero3"): zero3},
                    title=pw.line("zero3-figure"))

# %% [markdown]
# ZeRO-3 moves 21 s of traffic per step over InfiniBand; the backward hides part of it, and 9 s stay
# exposed, with 5 s more of full recomputation that its activations need: 67 % slower in this model,
# between the paper's 6 % and 3.2×. The 3D plan's data-parallel traffic carries only its 1/16 share
# of the model (pp 4 × tp 4), the backward hides nearly all of it, and its TP all-reduces stay on
# NVLink. On a network as fast as NVLink, most of ZeRO-3's exposed time goes. The
# rule of thumb: **shard (ZeRO/FSDP) to fit, inside a fast domain or on top of TP and PP; split (TP
# inside the node, PP across nodes) to scale.**

# %% [markdown]
# ## 7. Does the planner predict real step times?
#
# The planner ranks plans by a predicted step time built from a few constants: achieved
# FLOP/s per device and the α–β of an all-reduce. Here we measure those constants on this machine's
# ranks the way a planner profiles a cluster before it searches (`validate_plans.calibrate`, which
# is `planning.calibration.calibrate` with `groups=True`): all-reduces timed between computations,
# as training issues them, on groups of each size a plan uses, all groups at once; the FLOP/s this
# very model reaches with every rank computing at once; and, for a plan that splits its layers, how
# fast one block split tp ways runs against the whole block (`validate_plans.tp_efficiency`). Then
# we predict four real 4-rank plans of a larger GPT (hidden 128, 4 layers, sequences of 32 tokens, fp32,
# 4 micro-batches, 1F1B) and time each for real. The adjustments are data given to the planner,
# explained in `validate_plans`: fp32 sends twice the bytes it counts; 4 ranks share fewer cores, so a
# step takes at least all ranks' compute divided by the cores that really run them. The table's last
# columns predict with a square matmul's FLOP/s instead. This takes about a minute; your numbers will
# differ from the stored ones.

# %% tags=["nbval-ignore-output"]
from parallel_lab.parallel3d import validate_plans

grid = validate_plans.validate(grid=((1, 2, 2), (2, 2, 1), (1, 4, 1), (4, 1, 1)),
                               sizes={"hidden 128": validate_plans.SIZES["hidden 128"]}, steps=3)
print(validate_plans.format_table(grid))

# %% [markdown]
# The ranks of this machine send two ways: tensor parallelism's all-reduces and the pipeline's
# activations through shared memory (`runtime.shared_memory`, microseconds), data-parallel gradient
# buckets through gloo (about a millisecond per step of its ring), so `calibrate` measures both and
# prices each communication by the way it goes. How far off the predictions are depends on what
# else the machine runs: `docs/benchmarks.md` keeps runs of the full grid (6 plans × 2 sizes,
# `validate_plans.validate()`) and what each constant changed.
#
# The tensor-parallel plans need the profile of a split block. The FLOP count divides a split
# layer's work by tp, but every rank still runs every operation of the layer, each with its fixed
# overhead, on matrices tp times narrower, and keeps the replicated ones (LayerNorms, residuals)
# whole. Planners that choose a TP degree profile each one for this reason (Alpa, Zheng et al.
# 2022, profiles every candidate stage on every submesh it could run on).

# %% [markdown]
# What the model still does not know:
#
# - **per-operation overhead** outside the split layers: a CPU (or a GPU with small matrices) pays
#   microseconds per operation whatever its size, and the pipeline's executor adds its own per
#   action (bookkeeping, messages) that no FLOP count sees;
# - **unequal stages**, here: these small plans are predicted with the embedding and the head
#   spread over the ranks (`cost.step_time`'s default), where the planner prices them on their ranks;
# - **waiting for the slowest**: every all-reduce waits for the last rank to arrive, and a rank that
#   was slowed down for a moment holds up its whole group;
# - **the machine's other work**: sharing cores with other programs changes both the constants and
#   the measurement, from one minute to the next.
#
# Every collective the implementation makes is counted: `tests/test_train3d.py` holds the
# planner's count of tensor-parallel all-reduces (4 per layer, plus the embedding's, the LM head's
# and the vocab-parallel loss's 3) against the calls `commlog` sees in a real step.
#
# That is the article's warning about optimising one benchmark: **calibrate on the hardware and under
# the load you will run on, and check a prediction against a real run before trusting a plan.**

# %%
from parallel_lab.runtime import launcher

launcher.shutdown()  # stop the rank processes (a Binder pod has little memory)

# %% [markdown]
# ## What to remember
#
# - A planner searches every layout that fits with a memory model and ranks them with a time model
#   that must price each rank's real work (the embedding and the LM head included); the fastest
#   plans come within a few percent of each other, so a short measured run decides between them.
# - **TP stays inside the NVLink domain** (8 GPUs of a DGX node, 72 of an NVL72 rack): its
#   all-reduces are on every layer's critical path. Pipeline sends are rare, so **PP crosses nodes**.
# - The best TP degree is a trade: at fixed dp, more TP means a shallower pipeline, more layers per
#   GPU and (t − 1)-fold ring traffic; less TP means a deeper pipeline and a bigger bubble. On A100s
#   with 1F1B, TP 8 wins for GPT-3 175B (as Megatron-LM chose); on H100s, whose compute outgrew
#   their NVLink, TP 4 wins in this model — measure before you believe it.
# - **ZeRO-3** trades memory for bandwidth: 3Ψ per micro-batch over the data-parallel group. Inside a
#   node it wins where a model only fits sharded; across nodes it loses to 3D parallelism, the more
#   GPUs the more (Narayanan et al. 2021, §5.2).
# - A step time is a budget: GPU-hours = steps × step time × GPUs. Calibrate the model on your
#   cluster and benchmark the top few plans under realistic load before committing to one.
