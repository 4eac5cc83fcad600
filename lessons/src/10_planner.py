# %% [markdown]
# # 10 · The planner: choosing the split
#
# > *Cost and budget: for years, architecture decisions determine performance and operating costs.*
# > (成本與預算：多年來，架構決策決定著效能和營運成本。)
#
# **Learning goals.** By the end of this lesson you can
#
# - compute the memory of one GPU under a (data, pipeline, tensor) layout — weights, gradients, Adam
#   state (and ZeRO-1), activations with tensor and sequence parallelism and recomputation,
#   micro-batches in flight per schedule — and check those formulas against the real tensors of the
#   course GPT;
# - predict a training step's time from five parts: compute, tensor-parallel all-reduces, the bubble,
#   pipeline sends, the data-parallel gradient all-reduce;
# - read what the planner (`parallel_lab.planning.planner`) picks for GPT-3 175B on 64 servers of 8 GPUs, and
#   why it rejects each of the other 300 candidates;
# - explain why tensor parallelism stays at ≤ 8 GPUs inside a node, and why, with a zero-bubble
#   schedule, TP 4 edges out TP 8 in this model;
# - turn a plan into GPU-hours and a budget, and run the same search from the command line.
#
# Lessons 02–09 built every piece on real ranks: tensor parallelism, pipeline schedules, balanced
# stages, the 3D mesh. On a real cluster you cannot try every combination — GPT-3 on 512 GPUs has
# hundreds of layouts, and one training run costs a million dollars. A planner searches them with
# a **memory model** (does it fit?) and a **time model** (how fast?). Everything in this lesson is
# arithmetic, so it runs in seconds and prints the same numbers every time.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. The memory model, checked on the course GPT
#
# `parallel_lab.planning.memory_model` extends lesson 00's one-device arithmetic to a (dp, pp, tp) layout:
#
# | what, per GPU | bytes | splits with |
# |---|---|---|
# | weights, gradients | 2 + 2 per parameter it holds | tp (Megatron's split matrices) and pp (its stage's layers) |
# | Adam state | 12 per parameter | tp, pp, and dp with **ZeRO-1** |
# | activations per layer and micro-batch | `sbh(34/t + 5as/(ht))` with tensor + sequence parallelism t (Korthikanti et al. 2022) | selective recomputation drops the `5as/h` scores; full keeps only the input `2sbh/t` |
# | micro-batches in flight | from the schedule simulator: GPipe m, 1F1B and ZB-H1 min(m, p − r) on rank r | |
#
# Before trusting it for 175 billion parameters, check it where we can count: the course GPT.
# First the parameters of each pipeline stage, model against the real modules of `stages.cut`
# (the embedding rides on the first stage, the head on the last):

# %%
from parallel_lab.hardware import Cluster
from parallel_lab.planning import cost, memory_check, planner
from parallel_lab.show import planner as pw

rows = memory_check.param_check()
print(f"{'pp':>3} {'stage':>6} {'memory_model':>13} {'real modules':>13}")
for r in rows:
    print(f"{r['pp']:>3} {r['stage']:>6} {r['model']:>13,} {r['real']:>13,}")
print("every stage equal:", all(r["model"] == r["real"] for r in rows))

# %% [markdown]
# Now the activations of one transformer block (width 64, 4 heads, 3 sequences of 32 tokens, fp32,
# no dropout), formula against the bytes autograd really saves for the backward pass (counted with
# `saved_tensors_hooks`, as lesson 08's profiler does), for the three recomputation modes. PyTorch's
# fused attention on the CPU never stores the s × s scores — it recomputes them in the backward
# pass: it *is* selective recomputation. The plain attention (`SDPBackend.MATH`) stores them.

# %%
print(f"{'recompute':<10} {'formula':>9} {'measured':>9} {'difference':>10}  difference = per-token statistics?")
for r in memory_check.activation_check():
    diff = r["measured"] - r["formula"]
    print(f"{r['recompute']:<10} {r['formula']:>9,} {r['measured']:>9,} {diff:>10,}  {diff == r['stats']}")

# %% [markdown]
# The formula is exact up to what the paper neglects: each LayerNorm's mean and 1/std per token and
# the fused kernel's log-sum-exp per head and token (under 1 %). With the activations of one
# micro-batch in hand, a schedule decides how many micro-batches a rank holds at its peak
# (the simulator's count; interleaved ranks hold *chunks* of half a stage):

# %%
print(pw.in_flight_table(pp=4, microbatches=8))

# %% [markdown]
# Now GPT-3 175B, one GPU of the most loaded stage, micro-batches of one 2048-token sequence,
# TP 8 with sequence parallelism × PP 8 × DP 8 and 64 micro-batches per step:

# %%
gpt3 = pw.GPT3
layout = dict(model=gpt3, micro_batch=1, dp=8, pp=8, tp=8, sequence_parallel=True, microbatches=64)
print(pw.memory_table({
    "1F1B, no recomputation": dict(layout, schedule="1f1b"),
    "1F1B, selective recomputation": dict(layout, schedule="1f1b", recompute="selective"),
    "GPipe, selective recomputation": dict(layout, schedule="gpipe", recompute="selective"),
    "1F1B, selective + ZeRO-1 over dp 8": dict(layout, schedule="1f1b", recompute="selective", zero1=True),
}))

# %% [markdown]
# Read it row by row: without recomputation the first stage just fits in 80 GB (8 micro-batches in
# flight × 12 layers); selective recomputation cuts the activations to a third for about 1 % more
# compute; GPipe stashes all 64 micro-batches and overflows; ZeRO-1 shards Adam's 12 bytes per
# parameter over the 8 replicas and frees 30 GB.
#
# ## 2. The time model: five parts of a step
#
# For a layout and a number of micro-batches m, `cost.step_time` predicts the step of the slowest
# GPU (constants: 150 TFLOP/s achieved per GPU, NVLink 300 GB/s and network 25 GB/s per GPU, α 5 µs):
#
# - **compute**: 6 FLOPs per parameter and token, divided over all GPUs (+ the recomputed forward);
# - **TP all-reduce**: 2 forward + 2 backward per layer of a `(b, s, h)` bf16 tensor, ring α–β model
#   (lesson 01), on the critical path;
# - **bubble**: the schedule's idle time, closed forms of the simulator (tested equal to it):
# - **PP send/recv**: one activation forward and one gradient back per micro-batch and stage;
# - **DP all-reduce**: this GPU's gradients over its replicas, once per step.

# %%
import inspect

print(inspect.getsource(cost.pipeline_makespan))

# %% [markdown]
# ## 3. The search: GPT-3 175B on 64 servers of 8 GPUs
#
# `planner.plan` tries every (dp, pp, tp) whose product is the number of GPUs, every schedule
# (GPipe, 1F1B, interleaved 1F1B with 2–4 chunks, ZB-H1) and recomputation (none, selective, full),
# and for each the number of micro-batches (a divisor of the batch per replica) that is fastest and
# fits. GPT-3's batch: 1536 sequences of 2048 tokens.

# %%
print("planning 512 GPUs (a few seconds) ...")
result = planner.plan(gpt3, pw.CLUSTER, pw.BATCH)
print(f"{result['feasible']} plans fit; the ten fastest (seconds per step, GB on the fullest GPU):")
print(pw.plans_table(result["plans"][:10]))

# %% [markdown]
# Every plan keeps tensor parallelism inside a node (TP ≤ 8) and uses a deep pipeline. The ten
# fastest are within 3 % of each other, which is well inside the model's own accuracy: a planner
# narrows hundreds of layouts to a handful, and a short measured run decides between those.
#
# **An honest surprise.** Megatron-LM's paper (Narayanan et al. 2021) ran GPT-3 175B with TP 8 —
# a whole node — and PP 16, with 1F1B-family schedules. Here the best plan is **TP 4 × PP 16 × DP 8 with ZB-H1**,
# 2 % ahead of the best TP 8 plan. With 1F1B only, TP 8 comes first, as in the paper (the planner's
# docstring and `tests/test_planner.py::test_gpt3_with_1f1b_puts_tp8_first` document both). Why?

# %%
only_1f1b = planner.plan(gpt3, pw.CLUSTER, pw.BATCH, schedules=("1f1b",))
print("1F1B only, the five fastest:")
print(pw.plans_table(only_1f1b["plans"][:5]))
compare = {
    "TP 4, ZB-H1 (best)": pw.best_plan(result["plans"], tp=4, schedule="zb-h1"),
    "TP 8, ZB-H1": pw.best_plan(result["plans"], tp=8, schedule="zb-h1"),
    "TP 4, 1F1B": pw.best_plan(result["plans"], tp=4, schedule="1f1b"),
    "TP 8, 1F1B (Megatron-style)": pw.best_plan(result["plans"], tp=8, schedule="1f1b"),
}
print("compute per step, s:", ", ".join(f"{name} {p['breakdown']['compute_s']:.2f}" for name, p in compare.items()))
pw.breakdown_figure(compare, title="GPT-3 175B on 512 GPUs: the step beyond compute (seconds)",
                    parts=("tp_comm_s", "bubble_s", "pp_comm_s", "dp_comm_s"))

# %% [markdown]
# - **Compute is (almost) the same in every plan**: the same FLOPs over the same 512 GPUs. TP 4
#   adds 0.4 s of selective recomputation: with half the tensor parallelism it needs the memory.
# - **TP all-reduces**: with TP 8 the data-parallel degree halves (512 = dp × pp × tp), so each GPU
#   pushes twice as many tokens through its layers, and each all-reduce sends 2·7/8 instead of 2·3/4
#   of the message: about 2.3× the bytes (`cost.tp_per_device_ratio(4, 8)`), plus 14 ring steps of
#   latency instead of 6: 3.46 s against 1.37 s.
# - **The bubble**: TP 4 has half as many micro-batches per replica, each twice as long, so its
#   fill-and-drain is twice as long. With 1F1B that costs (p − 1)(F + B): 3.5 s against 1.7 s, and
#   TP 8 wins. ZB-H1 fills the drain with weight-gradient work and leaves about (p − 1)·F, a third
#   of it: 1.2 s against 0.6 s — now the all-reduce saving is larger, and TP 4 wins.
#
# Cheap deep pipelines (lesson 06's zero-bubble schedules) change the best tensor-parallel degree.
# Neither answer is "TP 8 because a node has 8 GPUs".
#
# ## 4. Why the others fail
#
# The planner says why it rejects a candidate, before anything starts — the course's habit of
# naming the broken invariant with its values. Grouped by kind (a layout that cannot work at all is
# rejected once; a memory failure once per schedule and recomputation tried):

# %%
print(pw.rejections_table(result))

# %% [markdown]
# - **Memory** rejects most: pure data parallelism needs the whole 2.8 TB of model state per GPU;
#   TP 8 × PP 1 still 350 GB. The nearest miss is GPipe with full recomputation: the last stage keeps
#   the fp32 logits of all 192 micro-batches (a 50 257-token vocabulary is big).
# - **Layers** must split into equal stages (96 layers: pp 64 does not divide them).
# - **TP groups may not cross nodes**, which brings us to the FAQ's sixth question.
#
# ## 5. Why tensor parallelism stays inside a node
#
# *Tensor parallelism communicates often to recombine partial results, so it is placed inside a node,
# where the interconnect (NVLink) is fastest* (張量並行性經常進行通訊以重新組合部分矩陣結果，因此它被
# 放置在 NVLink 節點內部互連頻寬最高的地方). Lesson 02 measured this; here it is in the planner's
# constants, for one layer and one micro-batch of GPT-3 on one GPU:

# %%
print(pw.tp_link_table(gpt3, pw.CLUSTER))

# %% [markdown]
# Over NVLink the two all-reduces cost a tenth of the layer's compute at TP 8; over the network they
# would cost more than the compute itself. If the planner allowed a TP group to span two nodes, its
# own model would predict this (TP 16 × PP 16 × DP 2, every TP group on two nodes):

# %%
inside = pw.best_plan(result["plans"], tp=8, pp=16, schedule="zb-h1")
spanning = cost.across_nodes(gpt3, pw.CLUSTER, pw.BATCH, dp=2, pp=16, tp=16, microbatches=768)
print(f"TP 8 inside nodes  : step {inside['step_s']:6.1f} s, TP all-reduces {inside['breakdown']['tp_comm_s']:5.1f} s")
print(f"TP 16 across nodes : step {spanning['step_s']:6.1f} s, TP all-reduces {spanning['tp_comm_s']:5.1f} s")

# %% [markdown]
# Pipeline stages, on the other hand, send one activation per micro-batch and stage — about 0.2 s
# per step here — so they cross nodes cheaply: tensor parallelism inside the 8-GPU server, pipeline
# across servers, data parallelism on top, exactly the layering the article describes.
#
# ## 6. Cost and budget
#
# A plan's step time becomes a budget: steps = tokens / (batch × sequence), GPU-hours = steps × step
# time × GPUs / 3600 (`planner.training_cost`). GPT-3 was trained on 300 billion tokens. Put in
# your own price per GPU-hour:

# %%
price_per_gpu_hour = 2.00  # $ per GPU-hour: change it to your provider's price
tokens = 300e9
best = result["plans"][0]
print(pw.cost_table(best, prices=(price_per_gpu_hour,), tokens=tokens))
megatron = compare["TP 8, 1F1B (Megatron-style)"]
extra = planner.training_cost(megatron, tokens, price_per_gpu_hour)["cost"] - \
    planner.training_cost(best, tokens, price_per_gpu_hour)["cost"]
print(f"the best TP 8 + 1F1B plan would cost ${extra:,.0f} more ({megatron['step_s'] / best['step_s'] - 1:.1%} slower)")

# %% [markdown]
# Fifty days on 512 GPUs, a million dollars, and a choice of layout worth tens of thousands —
# which is why the article's guidance applies here as much as anywhere: **define latency, quality and
# cost targets before you start; benchmark under realistic load** (the planner's constants —
# TFLOP/s, α, bandwidths — should come from your cluster; `planning.calibration.calibrate` fits them on real
# ranks); and do not let one benchmark hide the weaknesses of the whole system (the model leaves out
# kernel efficiency, overlap of communication with compute, and congestion).
#
# ### Try it
#
# Change the cluster and press *Plan* (a second or two). Things to find:
#
# 1. How few 8-GPU servers of 80 GB can train GPT-3 175B at this batch at all?
# 2. With 141 GB GPUs (H200), does the best plan still use a pipeline of 16 stages?
# 3. Cut the network to 12.5 GB/s per GPU: which part of the step grows, and does the best layout change?
# 4. Raise the NVLink bandwidth to 900 GB/s: does TP 8 take the lead again?

# %% tags=["nbval-ignore-output"]
pw.planner_widget()

# %% [markdown]
# For example, the same model and batch on a quarter of the cluster (16 servers), and on 64 servers
# of 141 GB GPUs:

# %%
for nodes, mem in ((16, 80), (64, 141)):
    smaller = planner.plan(gpt3, Cluster(nodes=nodes, gpus_per_node=8, gpu_mem_gb=mem), pw.BATCH, top=3)
    print(f"{nodes} nodes x 8 GPUs of {mem} GB: {smaller['feasible']} plans fit; the three fastest:")
    print(pw.plans_table(smaller["plans"]))
    print(pw.cost_table(smaller["plans"][0], prices=(price_per_gpu_hour,), tokens=tokens).splitlines()[0])
    print()

# %% [markdown]
# ## 7. The same search from the command line
#
# Instructors and scripts use `parallel-lab plan`; with `--json` it prints one JSON object (plans
# with their breakdown, memory and, given `--price`, cost; rejections with their reasons). In a
# terminal:
#
# ```bash
# parallel-lab plan --layers 96 --hidden 12288 --heads 96 --vocab 50257 --seq 2048 --batch 1536 \
#                   --nodes 64 --gpus-per-node 8 --gpu-mem-gb 80 --price 2 --top 5
# ```
#
# Run here (the same program, `python -m parallel_lab.cli`), first lines of its output:

# %%
import subprocess
import sys

args = ["plan", "--layers", "96", "--hidden", "12288", "--heads", "96", "--vocab", "50257", "--seq", "2048",
        "--batch", "1536", "--nodes", "64", "--gpus-per-node", "8", "--gpu-mem-gb", "80", "--price", "2", "--top", "5"]
print("running parallel-lab " + " ".join(args[:3]) + " ... (a few seconds)")
out = subprocess.run([sys.executable, "-m", "parallel_lab.cli", *args], capture_output=True, text=True, timeout=120)
print(f"exit status {out.returncode}")
print("\n".join(out.stdout.splitlines()[:7]))

# %% [markdown]
# ## What to remember
#
# - A plan must **fit** (weights + gradients + Adam state, split by tp and pp — and Adam by dp with
#   ZeRO-1 — plus activations × micro-batches in flight) and then be **fast** (compute + TP all-reduces
#   + bubble + PP sends + DP all-reduce). The formulas match the course GPT's real tensors.
# - **TP stays inside a node**: its all-reduces are on every layer's critical path; over the network
#   they would cost more than the compute. Pipeline sends are rare, so **PP crosses nodes**.
# - The best TP degree is a trade: more TP means more all-reduce per GPU; less TP means longer
#   micro-batches and a bigger bubble. With 1F1B, TP 8 wins for GPT-3 175B; with zero-bubble ZB-H1,
#   TP 4 edges ahead (2 % in this model — measure before you believe it).
# - A step time is a budget: GPU-hours = steps × step time × GPUs. Calibrate the model on your
#   cluster and benchmark the top few plans under realistic load before committing it.
