# %% [markdown]
# # 15 · The planner: choosing the split
#
# > *Cost and budget: for years, architecture decisions determine performance and operating costs.*
# > (成本與預算：多年來，架構決策決定著效能和營運成本。)
#
# **Learning goals.** By the end of this lesson you can
#
# - compute the memory of one GPU under a (data, pipeline, tensor) layout — weights, gradients, Adam
#   state (sharded by ZeRO stages 1–3), activations with tensor and sequence parallelism and recomputation,
#   micro-batches in flight per schedule — and check those formulas against the real tensors of the
#   course GPT;
# - predict a training step's time from five parts: compute, tensor-parallel all-reduces, the bubble,
#   pipeline sends, the data-parallel (ZeRO) communication — of which the backward hides a part;
# - read what the planner (`parallel_lab.planning.planner`) picks for GPT-3 175B on 64 DGX H100
#   servers of 8 GPUs, and why it rejects each of the other 300 candidates;
# - explain why tensor parallelism stays inside the NVLink domain (≤ 8 GPUs on a DGX node), and why
#   on H100s TP 4 edges out TP 8 — a shallower pipeline's all-reduces against a deeper one's bubble —
#   where on Megatron-LM's A100s TP 8 won;
# - say where ZeRO-3 beats tensor and pipeline parallelism (a model that fits only sharded) and where
#   it loses (its traffic crossing the network), as Narayanan et al. 2021 measured;
# - turn a plan into GPU-hours and a budget, and run the same search from the command line.
#
# Lessons 02–11 built every piece on real ranks: tensor parallelism, pipeline schedules, balanced
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
# | Adam state | 12 per parameter | tp, pp, and dp with **ZeRO-1** (ZeRO-2 also the gradients, ZeRO-3 the weights: section 9) |
# | activations per layer and micro-batch | `sbh(34/t + 5as/(ht))` with tensor + sequence parallelism t (Korthikanti et al. 2022) | selective recomputation drops the `5as/h` scores; full keeps only the input `2sbh/t` |
# | micro-batches in flight | from the schedule simulator, counted until W: GPipe m, 1F1B min(m, p − r) on rank r, ZB-H1 (p − r) M_B + r M_W (m ≥ p) | |
#
# Before trusting it for 175 billion parameters, check it where we can count: the course GPT.
# First the parameters of each pipeline stage, model against the real modules of `stages.cut`
# (the embedding rides on the first stage, the head on the last):

# %%
from parallel_lab.hardware import SYSTEMS, Cluster
from parallel_lab.planning import cost, memory, memory_check, memory_model, planner
from parallel_lab.show import planner as pw

rows = memory_check.param_check()
print(f"{'pp':>3} {'stage':>6} {'memory_model':>13} {'real modules':>13}")
for r in rows:
    print(f"{r['pp']:>3} {r['stage']:>6} {r['model']:>13,} {r['real']:>13,}")
print("every stage equal:", all(r["model"] == r["real"] for r in rows))

# %% [markdown]
# Now the activations of one transformer block (width 64, 4 heads, 3 sequences of 32 tokens, fp32,
# no dropout), formula against the bytes autograd really saves for the backward pass (counted with
# `saved_tensors_hooks`, as lesson 09's profiler does), for the three recomputation modes. PyTorch's
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
# micro-batch in hand, a schedule decides how many micro-batches' worth a rank holds at its peak
# (the simulator's count; interleaved ranks hold *chunks* of half a stage). A split backward keeps
# part of a micro-batch after its I: W still needs every Linear's input and output gradient, M_W,
# which is most of M_B — 32sbh of 34sbh + 5as²b in Qi et al. 2023's Table 1 (`memory_model.
# weight_grad_bytes_per_layer`), 32/34 once the scores are recomputed. ZB-H1 defers r weight passes
# on rank r, so it holds (p − r) M_B + r M_W there: rank 0 peaks at p M_B as in 1F1B — the paper's
# "same peak memory" is this maximum — but every other rank holds nearly p M_B where 1F1B holds
# (p − r) M_B:

# %%
print(pw.in_flight_table(pp=4, microbatches=8))

# %% [markdown]
# Now GPT-3 175B, one GPU of the most loaded stage, micro-batches of one 2048-token sequence,
# TP 8 with sequence parallelism × PP 8 × DP 8 and 64 micro-batches per step.
#
# **Predict** first, with the table of section 1 and lesson 00's 16 bytes per parameter: how many
# GB does the fullest GPU need with 1F1B and no recomputation? (175 billion parameters over 64 GPUs
# of a replica; 12 layers a stage; 8 micro-batches in flight on stage 0; 34·s·b·h/t + 5·a·s²·b/t
# bytes per layer and micro-batch.) Graded: 1 point within ±15 %.

# %% tags=["answer:predict:tp8-memory"]
my_prediction = None  # GB on the fullest GPU, TP 8 × PP 8 × DP 8, 1F1B, m = 64, no recomputation
### BEGIN SOLUTION
my_prediction = 16 * 175e9 / 64 / 1e9 + 8 * 12 * (34 * 2048 * 12288 / 8 + 5 * 96 * 2048 * 2048 / 8) / 1e9
### END SOLUTION

# %% tags=["check:predict:tp8-memory"]
from parallel_lab.show.predict import predict

guess = predict("tp8-memory", my_prediction)

# %%
gpt3 = pw.GPT3
layout = dict(model=gpt3, micro_batch=1, dp=8, pp=8, tp=8, sequence_parallel=True, microbatches=64)
print(pw.memory_table({
    "1F1B, no recomputation": dict(layout, schedule="1f1b"),
    "1F1B, selective recomputation": dict(layout, schedule="1f1b", recompute="selective"),
    "ZB-H1, selective recomputation": dict(layout, schedule="zb-h1", recompute="selective"),
    "GPipe, selective recomputation": dict(layout, schedule="gpipe", recompute="selective"),
    "1F1B, selective + ZeRO-1 over dp 8": dict(layout, schedule="1f1b", recompute="selective", zero1=True),
}))
guess.versus(memory_model.max_device_memory(**dict(layout, schedule="1f1b"))["total"] / 1e9, "the memory model")

# %% [markdown]
# Read it row by row: without recomputation the first stage just fits in 80 GB (8 micro-batches in
# flight × 12 layers); selective recomputation cuts the activations to a third for about 1 % more
# compute; ZB-H1's fullest GPU is the first, with 1F1B's p micro-batches (its later ranks hold
# nearly as much, where 1F1B's hold less); GPipe stashes all 64 micro-batches and overflows;
# ZeRO-1 shards Adam's 12 bytes per parameter over the 8 replicas and frees 30 GB.
#
# ## 2. The time model: five parts of a step
#
# For a layout and a number of micro-batches m, `cost.step_time` predicts the step of the slowest
# GPU. The constants are a DGX H100 cluster (`hardware.SYSTEMS["DGX H100"]`, with its datasheets):
# 396 TFLOP/s achieved per GPU (40 % of the dense BF16 peak of 989, what large runs reach: 38–43 %
# for Llama 3 on 16 000 H100s, Dubey et al. 2024), NVLink 4 at 450 GB/s and InfiniBand NDR at
# 50 GB/s per GPU and direction, α 5 µs:
#
# - **compute**: 6 FLOPs per parameter and token, divided over all GPUs (+ the recomputed forward);
# - **TP all-reduce**: 2 forward + 2 backward per layer of a `(b, s, h)` bf16 tensor, ring α–β model
#   (lesson 01), on the critical path;
# - **bubble**: the schedule's idle time, closed forms of the simulator (tested equal to it):
# - **PP send/recv**: one activation forward and one gradient back per micro-batch and stage;
# - **DP all-reduce**: this GPU's gradients over its replicas, once per step (ZeRO: a reduce-scatter
#   and an all-gather, the same 2Ψ; ZeRO-3 3Ψ, section 9). It travels while the backward computes
#   (DDP's buckets, Li et al. 2020): only `max(0, comm − 0.9 × backward)` is **exposed** and counted
#   in the step; the rest is printed as **hidden** (`cost.dp_communication`; the share 0.9 is a
#   modelling assumption, held within 20 % of real ZeRO runs on the virtual clock by
#   `parallel3d.validate_plans.validate_overlap`). TP all-reduces and PP sends stay exposed.

# %%
import inspect

print(inspect.getsource(cost.pipeline_makespan))

# %% [markdown]
# ## 3. The search: GPT-3 175B on 64 DGX H100 servers
#
# `planner.plan` tries every (dp, pp, tp) whose product is the number of GPUs, every schedule
# (GPipe, 1F1B, interleaved 1F1B with 2–4 chunks, ZB-H1), recomputation (none, selective, full) and
# ZeRO stage (0–3, column `Z`), and for each the number of micro-batches (a divisor of the batch
# per replica) that is fastest and fits. GPT-3's batch: 1536 sequences of 2048 tokens. (ZB-V and
# DualPipeV have closed forms too, above; `schedules=planner.ALL_SCHEDULES` adds them, and
# `ends=True` puts the embedding and the LM head on their own ranks instead of spreading their work
# over all of them. This lesson's plans use neither.)

# %%
print("planning 512 GPUs (a few seconds) ...")
result = planner.plan(gpt3, pw.CLUSTER, pw.BATCH)
print(f"{result['feasible']} plans fit; the ten fastest (seconds per step, GB on the fullest GPU):")
print(pw.plans_table(result["plans"][:10]))

# %% [markdown]
# Every plan keeps tensor parallelism inside a node (TP ≤ 8) and uses a deep pipeline. The ten
# fastest are within 2 % of each other, about the model's own accuracy: a planner narrows hundreds
# of layouts to a handful, and a short measured run decides between those. Most use **ZeRO-1**: it
# shards Adam's state over the 8 replicas, which frees 29 GB per GPU for free in this model (its
# all-gather replaces half of the all-reduce), and that memory lets TP 2 × PP 32 fit — the first
# plan, with a third of TP 4's all-reduces.
#
# To see the trade between tensor and pipeline parallelism on its own, search once more without
# ZeRO (`zero=(0,)`):

# %%
no_zero = planner.plan(gpt3, pw.CLUSTER, pw.BATCH, zero=(0,))
print(pw.plans_table(no_zero["plans"][:3]))

# %% [markdown]
# **An honest surprise.** Megatron-LM's paper (Narayanan et al. 2021) ran GPT-3 175B on DGX A100s
# with TP 8 — a whole node — and 1F1B-family schedules. Here, on H100s without ZeRO, the best plan
# is **TP 4 × PP 16 × DP 8 with ZB-H1**, 6 % ahead of the best TP 8 plan, and TP 4 comes first with
# 1F1B too. Given the A100 cluster and 1F1B, the same planner puts TP 8 first, as in the paper
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
ratio_guess = predict("tp8-over-tp4", my_prediction, "TP 8 × PP 8's all-reduce time per step over TP 4 × "
                      "PP 16's, dp 8, 192 micro-batches", tolerance=0.25)

# %%
only_1f1b = planner.plan(gpt3, pw.CLUSTER, pw.BATCH, schedules=("1f1b",), zero=(0,))
print("DGX H100, 1F1B only, the five fastest:")
print(pw.plans_table(only_1f1b["plans"][:5]))
a100 = planner.plan(gpt3, SYSTEMS["DGX A100"].cluster(64), pw.BATCH, schedules=("1f1b",), zero=(0,))
print("DGX A100 (312 TFLOP/s peak, NVLink 3 at 300 GB/s, HDR at 25 GB/s), 1F1B only, the three fastest:")
print(pw.plans_table(a100["plans"][:3]))
same = dict(dp=8, microbatches=192)  # the best plans of dp 8 and 192 micro-batches, without ZeRO
compare = {
    "TP 4, ZB-H1 (best)": pw.best_plan(no_zero["plans"], tp=4, schedule="zb-h1", **same),
    "TP 8, ZB-H1": pw.best_plan(no_zero["plans"], tp=8, schedule="zb-h1", **same),
    "TP 4, 1F1B": pw.best_plan(no_zero["plans"], tp=4, schedule="1f1b", **same),
    "TP 8, 1F1B (Megatron-style)": pw.best_plan(no_zero["plans"], tp=8, schedule="1f1b", **same),
}
print("compute per step, s:", ", ".join(f"{name} {p['breakdown']['compute_s']:.2f}" for name, p in compare.items()))
tp_comm = {name: p["breakdown"]["tp_comm_s"] for name, p in compare.items()}
ratio_guess.versus(tp_comm["TP 8, ZB-H1"] / tp_comm["TP 4, ZB-H1 (best)"], "the planner's model")
pw.breakdown_figure(compare, title="GPT-3 175B on 512 GPUs: the step beyond compute (seconds)",
                    parts=("tp_comm_s", "bubble_s", "pp_comm_s", "dp_comm_s"))

# %% [markdown]
# The four plans compared have the same data parallelism (dp 8) and the same 192 micro-batches of
# one sequence; what differs is how the other 64 GPUs of a replica are split: pp × tp = 64.
#
# - **Compute is (almost) the same in every plan**: the same FLOPs over the same 512 GPUs. TP 4
#   adds 0.15 s of selective recomputation: with half the tensor parallelism it needs the memory.
# - **TP all-reduces**: TP 8 halves the pipeline (pp 8 instead of 16), so each GPU holds 12 layers
#   instead of 6 — twice the all-reduces per micro-batch, each of the same (b, s, h) activation — and
#   each ring sends 2·7/8 instead of 2·3/4 of the message: (8 − 1)/(4 − 1) = 7/3 ≈ 2.3× the bytes
#   (`cost.tp_per_device_ratio(4, 8)`), plus 14 ring steps of latency instead of 6: 2.54 s against
#   0.97 s.
# - **The bubble**: a stage's work per micro-batch is the same in both (6 layers on 4 GPUs, or 12 on
#   8), but TP 4's pipeline is twice as deep: p − 1 = 15 slots of fill and drain against 7. With 1F1B
#   that costs (p − 1)(F + B): 1.36 s against 0.69 s. ZB-H1 fills the drain with weight-gradient
#   work and leaves about a third of it: 0.46 s against 0.24 s.
# - **On H100s** TP 4 saves 1.57 s of all-reduces and pays 0.67 s (1F1B) or 0.22 s (ZB-H1) more
#   bubble: it wins with either schedule. **On A100s** (above) the GPU computes 3.2× slower and
#   NVLink is only 1.5× slower, so the all-reduces weigh half as much against the compute while the
#   bubble, which is compute, weighs more: TP 4 saves 2.1 s of all-reduces and pays 2.2 s of bubble
#   with 1F1B, and TP 8 wins by 1 %, as Megatron-LM chose.
#
# GPUs that outrun their links, and cheap deep pipelines (lesson 06's zero-bubble schedules), change
# the best tensor-parallel degree. Neither answer is "TP 8 because a node has 8 GPUs".
#
# ## 4. Why the others fail
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
# - **Layers** must split into equal stages (96 layers: pp 64 does not divide them).
# - **TP groups may not cross nodes**, which brings us to the FAQ's sixth question.
#
# ## 5. Why tensor parallelism stays inside the NVLink domain
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
print(f"TP 8 inside nodes  : step {inside['step_s']:6.1f} s, TP all-reduces {inside['breakdown']['tp_comm_s']:5.1f} s")
print(f"TP 16 across nodes : step {spanning['step_s']:6.1f} s, TP all-reduces {spanning['tp_comm_s']:5.1f} s")

# %% [markdown]
# Pipeline stages, on the other hand, send one activation per micro-batch and stage — about 0.1 s
# per step here — so they cross nodes cheaply: tensor parallelism inside the NVLink domain, pipeline
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
# 2. With 141 GB GPUs (H200), does the best plan still use a pipeline of 16 stages?
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
    print(f"{nodes} x {system.name} (8 GPUs of {system.gpu_mem_gb:g} GB): {smaller['feasible']} plans fit; "
          f"the three fastest:")
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
print("running parallel-lab " + " ".join(args[:3]) + " ... (a few seconds)")
out = subprocess.run([sys.executable, "-m", "parallel_lab.cli", *args], capture_output=True, text=True, timeout=120)
print(f"exit status {out.returncode}")
print("\n".join(out.stdout.splitlines()[:7]))

# %% [markdown]
# ## 8. Exercise: the memory of one GPU
#
# Write `my_device_memory(model, dp, pp, tp, microbatches, micro_batch, ...)`: what one GPU of the
# **first** pipeline stage holds under 1F1B with mixed-precision Adam, the table of section 1 as a
# formula. `model` is a dict: `layers` L, `hidden` h, `heads` a, `vocab` V, `seq` s; b is
# `micro_batch`, t is `tp`, m is `microbatches`, and pp ≥ 2 always (the first stage holds the
# embeddings, the last one the head). Return a dict of
#
# - `"params"`, the parameters this GPU holds: L/pp blocks of (12h² + 7h)/t + 6h each (the weight
#   matrices and the biases of the column-parallel layers split over t; the LayerNorms and the
#   row-parallel biases on every rank), the token embedding ⌈V/t⌉·h (its vocabulary rows split over
#   t, padded up) and the position embedding s·h;
# - `"weights"` and `"gradients"`, 2 bytes per parameter each, and `"optimizer"`, Adam's 12 bytes
#   per parameter (divided by dp with `zero1`);
# - `"activations"`, in bytes: min(m, pp) micro-batches in flight (1F1B's first stage) × L/pp layers ×
#   what one layer keeps for one micro-batch. With v = `value_bytes` bytes per value and d = 1 with
#   `dropout` (0 without), a layer keeps sbh·(4v + 2d) bytes that plain tensor parallelism leaves
#   whole (the two LayerNorm inputs, the QKV and MLP inputs, two dropout masks of one byte per value)
#   and sbh·12v that it splits over t; `sequence_parallel` splits the first part over t too. The
#   attention scores add a·s²·b·(2v + d)/t with dropout (softmax output, mask, dropout output) and
#   a·s²·b·v/t without. `recompute="selective"` drops the scores; `"full"` keeps only the layer's
#   input, v·sbh (/t with sequence parallelism).
#
# With v = 2 and dropout that is the table's sbh(10 + 24/t + 5as/(ht)), and sbh(34/t + 5as/(ht))
# with sequence parallelism. The check calls your function on 8 plans — GPT-3 175B as above, the
# planner's TP 4 layout, plain TP with full recomputation and m < pp, GPT-3 13B, Megatron 530B, fp32
# values without dropout — and compares every entry with the memory model (`memory_model.device_memory`,
# stage 0). Then on the course GPT at small sizes, against its real tensors: the parameters of the
# first stage's modules (pp 2 and 4), and the bytes autograd saves for one block in fp32 without
# dropout (`value_bytes=4, dropout=False`), less the per-token statistics the paper leaves out
# (section 1). A wrong entry fails with what differs and, where it matches a common slip, which one.
#
# **What the check forbids:** the library (`memory_model`, `memory_check`; no import of `parallel_lab`):
# write the formula yourself, with `math` at most. Your function runs on a rank of its own; only the
# numbers it returns come back.
#
# Keep all your code in the answer cell below: the grader reads that cell alone from your notebook and
# runs it on fresh ranks of its own, so helpers defined in other cells are not seen.

# %% tags=["answer:device-memory"]
import math


def my_device_memory(model, dp, pp, tp, microbatches, micro_batch, recompute="none",
                     sequence_parallel=False, zero1=False, value_bytes=2, dropout=True):
    """Bytes on one GPU of the first pipeline stage (pp >= 2) under 1F1B with mixed-precision Adam."""
    L, h, a, V, s = model["layers"], model["hidden"], model["heads"], model["vocab"], model["seq"]
    b, t, v = micro_batch, tp, value_bytes
    ### BEGIN SOLUTION
    params = L // pp * ((12 * h * h + 7 * h) // t + 6 * h) + math.ceil(V / t) * h + s * h
    weights = gradients = 2 * params
    optimizer = 12 * params / (dp if zero1 else 1)
    sbh = s * b * h
    if recompute == "full":
        per_layer = v * sbh / (t if sequence_parallel else 1)
    else:
        whole, split = 4 * v + (2 if dropout else 0), 12 * v
        per_layer = sbh * (whole + split) / t if sequence_parallel else sbh * (whole + split / t)
        if recompute == "none":
            per_layer += a * s * s * b * (2 * v + 1 if dropout else v) / t
    activations = min(microbatches, pp) * (L // pp) * per_layer
    ### END SOLUTION
    return {"params": params, "weights": weights, "gradients": gradients, "optimizer": optimizer,
            "activations": activations}


# %% [markdown]
# Try it on the plan of section 1 before checking it (the rows of its table are the memory model's):

# %%
gpt3_model = {"layers": pw.GPT3.layers, "hidden": pw.GPT3.hidden, "heads": pw.GPT3.heads,
              "vocab": pw.GPT3.vocab, "seq": pw.GPT3.seq}
try:
    mine = my_device_memory(gpt3_model, dp=8, pp=8, tp=8, microbatches=64, micro_batch=1, sequence_parallel=True)
    print(f"{mine['params'] / 1e9:.2f} billion parameters; " +
          ", ".join(f"{key} {mine[key] / 1e9:.1f} GB" for key in ("weights", "gradients", "optimizer", "activations")))
except NotImplementedError:
    print("my_device_memory is not written yet: fill it in above, run its cell, then this one")

# %% tags=["check:device-memory", "points:2"]
from parallel_lab.exercises.device_memory import check_device_memory

verdict = check_device_memory(my_device_memory)

# %% [markdown]
# ## 9. ZeRO-3 against tensor and pipeline parallelism
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
print(pw.memory_table({f"pure DP, ZeRO-{z}": dict(pure, zero=z) for z in range(4)}))

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
# pipeline + data parallelism) with ZeRO-3 for GPT-3 175B and 530B (Narayanan et al. 2021, section
# 5.3 and its figure comparing with ZeRO-3) and found PTD-P up to 70 % faster as the GPU count grew:
# ZeRO-3's data-parallel group spans every node, so its 3Ψ cross the network. The planner, on our
# 64 DGX H100, and the same ZeRO-3 plan on a (hypothetical) network as fast as NVLink:

# %%
zero3 = pw.best_plan(result["plans"], tp=1, pp=1, zero=3)
flat = planner.plan(gpt3, Cluster(64, 8, 80, inter_gbps=450), pw.BATCH, zero=(3,))
print(pw.zero_table({"best plan (3D + ZeRO-1)": result["plans"][0], "pure DP + ZeRO-3": zero3,
                     "pure DP + ZeRO-3, 450 GB/s network": pw.best_plan(flat["plans"], tp=1, pp=1)}))
print(f"ZeRO-3 is {zero3['step_s'] / result['plans'][0]['step_s'] - 1:.0%} slower than the best plan")
pw.breakdown_figure({"best plan (3D + ZeRO-1)": result["plans"][0], "pure DP + ZeRO-3": zero3},
                    title="GPT-3 175B on 512 H100s: 3D parallelism against ZeRO-3 (seconds)")

# %% [markdown]
# ZeRO-3 moves 21 s of traffic per step over InfiniBand; the backward hides part of it, and 9 s stay
# exposed, with 5 s more of full recomputation that its activations need — 70 % slower, the gap the
# paper measured. The 3D plan sends only its 1/64 share of the gradients over the network and keeps
# everything else on NVLink. On a network as fast as NVLink, most of ZeRO-3's exposed time goes. The
# rule of thumb: **shard (ZeRO/FSDP) to fit, inside a fast domain or on top of TP and PP; split (TP
# inside the node, PP across nodes) to scale.**

# %% [markdown]
# ## What to remember
#
# - A plan must **fit** (weights + gradients + Adam state, split by tp and pp — and by dp with ZeRO:
#   Adam's state with ZeRO-1, the gradients too with ZeRO-2, everything with ZeRO-3 — plus activations
#   × micro-batches in flight) and then be **fast** (compute + TP all-reduces + bubble + PP sends + the
#   part of the DP communication the backward does not hide). The formulas match the course GPT's real tensors.
# - **TP stays inside the NVLink domain** (8 GPUs of a DGX node, 72 of an NVL72 rack): its
#   all-reduces are on every layer's critical path; over the network they would cost as much as the
#   compute. Pipeline sends are rare, so **PP crosses nodes**.
# - The best TP degree is a trade: at fixed dp, more TP means a shallower pipeline, more layers per
#   GPU and (t − 1)-fold ring traffic; less TP means a deeper pipeline and a bigger bubble. On A100s
#   with 1F1B, TP 8 wins for GPT-3 175B (as Megatron-LM chose); on H100s, whose compute outgrew
#   their NVLink, TP 4 wins, by 6 % with ZB-H1 in this model (without ZeRO; with ZeRO-1's freed memory
#   TP 2 × PP 32 edges ahead) — measure before you believe it.
# - **ZeRO-3** trades memory for bandwidth: 3Ψ per micro-batch over the data-parallel group. Inside a
#   node it wins where a model only fits sharded; across nodes it loses to 3D parallelism (here by
#   70 %, as Narayanan et al. 2021 measured), which keeps its heavy traffic on NVLink.
# - A step time is a budget: GPU-hours = steps × step time × GPUs. Calibrate the model on your
#   cluster and benchmark the top few plans under realistic load before committing it.
