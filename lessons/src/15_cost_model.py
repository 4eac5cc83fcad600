# %% [markdown]
# # 15 · The cost model: the memory and the time of a plan
#
# > *Cost and budget: for years, architecture decisions determine performance and operating costs.*
# > (成本與預算：多年來，架構決策決定著效能和營運成本。)
#
# **Learning goals.** By the end of this lesson you can
#
# - compute the memory of one GPU under a (data, pipeline, tensor) layout — weights, gradients, Adam
#   state (sharded by ZeRO stages 1–3, lesson 12), activations with tensor and sequence parallelism
#   and recomputation, micro-batches in flight per schedule — and check those formulas against the
#   real tensors of the course GPT;
# - predict a training step's time from five parts: compute, tensor-parallel all-reduces, the bubble,
#   pipeline sends, the data-parallel (ZeRO) communication — of which the backward hides a part;
# - write the activations of one GPU yourself, as a planner needs them, and use them to size a
#   micro-batch.
#
# Lessons 02–14 built every piece on real ranks: tensor parallelism, pipeline schedules, balanced
# stages, the 3D mesh, ZeRO, experts and long sequences. On a real cluster you cannot try every
# combination — GPT-3 on 512 GPUs has hundreds of layouts, and one training run costs a million
# dollars. A planner searches them with a **memory model** (does it fit?) and a **time model** (how
# fast?): this lesson builds both, lesson 16 searches with them. Everything here is arithmetic, so it
# runs in seconds and prints the same numbers every time.

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
# | weights, gradients | 2 + 2 per parameter it holds (Rajbhandari et al. 2020, §3.1) | tp (Megatron's split matrices) and pp (its stage's layers) |
# | Adam state | 12 per parameter | tp, pp, and dp with **ZeRO-1** (ZeRO-2 also the gradients, ZeRO-3 the weights: lesson 12) |
# | activations per layer and micro-batch | `sbh(34/t + 5as/(ht))` with tensor + sequence parallelism t (Korthikanti et al. 2022) | selective recomputation drops the `5as/h` scores; full keeps only the input `2sbh/t` |
# | micro-batches in flight | from the schedule simulator, counted until W: GPipe m, 1F1B min(m, p − r) on rank r, ZB-H1 (p − r) M_B + r M_W (m ≥ p) | |
#
# Before trusting it for 175 billion parameters, check it where we can count: the course GPT.
# First the parameters of each pipeline stage, model against the real modules of `stages.cut`
# (the embedding rides on the first stage, the head on the last):

# %%
from parallel_lab.planning import cost, memory_check, memory_model
from parallel_lab.show import planner as pw

print(pw.param_check_table(memory_check.param_check()))

# %% [markdown]
# Now the activations of one transformer block (width 64, 4 heads, 3 sequences of 32 tokens, fp32,
# no dropout), formula against the bytes autograd really saves for the backward pass (counted with
# `saved_tensors_hooks`, as lesson 09's profiler does), for the three recomputation modes. PyTorch's
# fused attention on the CPU never stores the s × s scores — it recomputes them in the backward
# pass: it *is* selective recomputation. The plain attention (`SDPBackend.MATH`) stores them.

# %%
print(pw.activation_check_table(memory_check.activation_check()))

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

# %% tags=["reveals:tp8-memory"]
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

# %% [markdown]
# ## 2. The time model: five parts of a step
#
# For a layout and a number of micro-batches m, `cost.step_time` predicts the step of the slowest
# GPU. The constants are a DGX H100 cluster (`hardware.SYSTEMS["DGX H100"]`, with its datasheets):
# 396 TFLOP/s achieved per GPU (40 % of the dense BF16 peak of 989, what large runs reach: 38–43 %
# for Llama 3 on 16 000 H100s, Dubey et al. 2024), NVLink 4 at 450 GB/s and InfiniBand NDR at
# 50 GB/s per GPU and direction, α 5 µs:
#
# - **compute**: 6 FLOPs per parameter and token (Kaplan et al. 2020, §2.1), divided over all GPUs
#   (+ the recomputed forward);
# - **TP all-reduce**: 2 forward + 2 backward per layer of a `(b, s, h)` bf16 tensor, ring α–β model
#   (lesson 01; Thakur et al. 2005), on the critical path;
# - **bubble**: the schedule's idle time, closed forms of the simulator (tested equal to it):
# - **PP send/recv**: one activation forward and one gradient back per micro-batch and stage;
# - **DP all-reduce**: this GPU's gradients over its replicas, once per step (ZeRO: a reduce-scatter
#   and an all-gather, the same 2Ψ; ZeRO-3 3Ψ: Rajbhandari et al. 2020, §7; lesson 12). It travels
#   while the backward computes (DDP's buckets, Li et al. 2020): only `max(0, comm − 0.9 × backward)`
#   is **exposed** and counted in the step; the rest is printed as **hidden** (`cost.dp_communication`;
#   0.9 is an assumption, checked against real ZeRO runs by `validate_plans.validate_overlap`). TP and
#   PP stay exposed.

# %%
from parallel_lab.i18n import source

print(source(cost.pipeline_makespan))

# %% [markdown]
# ## 3. Exercise: the activations of one GPU
#
# The cell below holds the model state of section 1's table (`params` to `optimizer`). Write the
# rest: the bytes of activations one GPU of the **first** stage keeps under 1F1B. Korthikanti et al.
# 2022 (§4, Table 2) give one layer and one micro-batch, with 2-byte values and dropout, as
# sbh(10 + 24/t + 5as/(ht)) under tensor parallelism t, and sbh(34/t + 5as/(ht)) with sequence
# parallelism as well. Your function must also handle v = `value_bytes` and `dropout`, so derive the
# general form from what those terms count:
#
# - **10 sbh** stay whole under plain TP: two LayerNorm inputs, the QKV and MLP inputs (v bytes per
#   value), and two dropout masks (1 byte);
# - **24 sbh** split over t: Q, K, V, the attention output and the MLP's two 4h-wide tensors, 12
#   values of v bytes;
# - **5as²b** (÷ t): the softmax output and the dropout output (v bytes each) and its mask (1 byte);
#   without dropout, only the softmax output.
#
# `sequence_parallel` splits the first group over t too; `recompute="selective"` drops the scores;
# `"full"` keeps only the layer's input, v·sbh (÷ t with sequence parallelism). At its peak the first
# stage holds min(m, pp) micro-batches of L/pp layers each.
#
# The check compares all five entries with the memory model on 8 plans, then with the course GPT's
# real tensors (one block in fp32, no dropout). Import only `math`; the grader runs the answer cell alone.

# %% tags=["answer:device-memory"]
import math


def my_device_memory(model, dp, pp, tp, microbatches, micro_batch, recompute="none",
                     sequence_parallel=False, zero1=False, value_bytes=2, dropout=True):
    """Bytes on one GPU of the first pipeline stage (pp >= 2) under 1F1B with mixed-precision Adam."""
    L, h, a, V, s = model["layers"], model["hidden"], model["heads"], model["vocab"], model["seq"]
    b, t, v = micro_batch, tp, value_bytes
    # Model state (given): L/pp blocks of (12h² + 7h)/t + 6h parameters (the LayerNorms and the
    # row-parallel biases on every rank), the token embedding's ⌈V/t⌉ rows of h and the position
    # embedding s·h; 2 + 2 bytes of weights and gradients, Adam's 12 (sharded by ZeRO-1).
    params = L // pp * ((12 * h * h + 7 * h) // t + 6 * h) + math.ceil(V / t) * h + s * h
    weights = gradients = 2 * params
    optimizer = 12 * params / (dp if zero1 else 1)
    activations = None  # bytes: min(m, pp) micro-batches x L/pp layers x one layer's bytes
    ### BEGIN SOLUTION
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
from parallel_lab.show.context import not_written_yet

gpt3_model = {"layers": pw.GPT3.layers, "hidden": pw.GPT3.hidden, "heads": pw.GPT3.heads,
              "vocab": pw.GPT3.vocab, "seq": pw.GPT3.seq}
try:
    mine = my_device_memory(gpt3_model, dp=8, pp=8, tp=8, microbatches=64, micro_batch=1, sequence_parallel=True)
    print(pw.device_memory_line(mine))
except NotImplementedError:
    print(not_written_yet("my_device_memory"))

# %% tags=["check:device-memory", "points:2"]
from parallel_lab.exercises.device_memory import check_device_memory

verdict = check_device_memory(my_device_memory)

# %% [markdown]
# **Predict** with your function: GPT-3's batch is 1536 sequences, so with TP 8 + sequence
# parallelism × PP 8 × DP 8, 1F1B and selective recomputation, each replica runs 192/b micro-batches
# of b sequences. What is the largest b whose first stage still fits in 80 GB (weights, gradients,
# Adam state and activations)? Call `my_device_memory` with `micro_batch=b` for a few b.

# %% tags=["answer:predict:largest-micro-batch"]
my_prediction = None  # the largest micro-batch size b (sequences) that fits in 80 GB
### BEGIN SOLUTION
my_prediction = 3
### END SOLUTION

# %%
batch_guess = predict("largest-micro-batch", my_prediction,
                      {"en": "the largest micro-batch size b (sequences) whose first stage fits in 80 GB: GPT-3 "
                             "175B, TP 8 + SP x PP 8 x DP 8, 1F1B, selective recomputation, 1536 sequences a step",
                       "zh-Hant": "第一個階段仍放得進 80 GB 的最大微批次大小 b（序列數）：GPT-3 175B、"
                                  "TP 8 + SP × PP 8 × DP 8、1F1B、選擇性重新計算、每步 1536 條序列"},
                      tolerance=0)

# %% tags=["reveals:largest-micro-batch"]
fits = {b: memory_model.max_device_memory(**dict(layout, schedule="1f1b", recompute="selective", micro_batch=b,
                                                  microbatches=192 // b))["total"] / 1e9 for b in (1, 2, 3, 4, 6)}
print(", ".join(f"b = {b}: {gb:.1f} GB" for b, gb in fits.items()))
batch_guess.versus(max(b for b, gb in fits.items() if gb <= 80), {"en": "the memory model", "zh-Hant": "記憶體模型"})

# %% [markdown]
# ## What to remember
#
# - A plan must **fit**: weights + gradients + Adam state, split by tp and pp — and by dp with ZeRO:
#   Adam's state with ZeRO-1, the gradients too with ZeRO-2, everything with ZeRO-3 — plus activations
#   × micro-batches in flight, which the schedule decides. The formulas match the course GPT's real
#   tensors.
# - Then it must be **fast**: compute + TP all-reduces + bubble + PP sends + the part of the DP
#   communication the backward does not hide. TP all-reduces and PP sends stay on the critical path.
