# %% [markdown]
# # 00 · Why split a model at all
#
# > *When a model is too big to fit on one GPU, model and pipeline parallelism split the model itself
# > across devices. This is what makes training giant language models with hundreds of billions of
# > parameters physically possible.*
# > (當模型太大而無法容納在一個 GPU 上時，模型和管道並行性會將模型本身分割到不同的裝置上。)
#
# **Learning goals.** By the end of this lesson you can
#
# - count the bytes that training needs on one device: weights, gradients, Adam's state
#   (16 bytes per parameter) and activations;
# - explain why GPT-3 175B needs at least 35 GPUs of 80 GB *just to hold its state*, so the model
#   itself must be split;
# - tell the two ways of splitting apart: **tensor** (intra-layer, 張量並行) and **pipeline**
#   (inter-layer, 管道並行) parallelism, and say where each one runs;
# - run a first collective (an all-reduce) on four simulated GPUs.
#
# **How to use this course.** Run it on your machine with `python3 course.py start` (it sets up a
# virtual environment and opens JupyterLab here), or in the browser with the *launch binder* badge in
# the README. Every lesson runs **real** `torch.distributed` code: each "GPU" is a separate CPU
# process (a *rank*) talking to the others over gloo, so a laptop can play a small cluster. Run the
# cells from top to bottom; move the sliders; answer the *predict* questions before you run a cell.
# Instructors check a notebook with `pytest lessons/00_why_split_a_model.ipynb` (nbval): every cell
# must reproduce its saved output, except cells tagged `nbval-ignore-output` (widgets).

# %%
from parallel_lab.course.notebook import setup

setup()  # seeds, one thread per process, plotly figures as JSON

# %% [markdown]
# ## 1. Where the bytes go
#
# Training a model keeps four kinds of data in device memory:
#
# | what | bytes | why it is there |
# |---|---|---|
# | **weights** | 2 per parameter (bf16/fp16) | the forward and backward passes read them |
# | **gradients** | 2 per parameter | the backward pass writes them, the optimizer reads them |
# | **Adam state** | 12 per parameter: fp32 master weights, momentum, variance (4 + 4 + 4) | the update is done in fp32 so that tiny steps are not rounded away |
# | **activations** | depends on batch × sequence × layers | every layer's intermediate results, kept for the backward pass |
#
# The first three are the **model state**: 2 + 2 + 12 = **16 bytes per parameter** for mixed-precision
# Adam (Rajbhandari et al. 2020, *ZeRO*, §3.1). The activations of a GPT layer take
# `s·b·h·(34 + 5·a·s/h)` bytes (s sequence length, b micro-batch, h hidden size, a heads;
# Korthikanti et al. 2022). `parallel_lab.planning.memory` does the arithmetic.
#
# **Predict:** plain fp32 Adam keeps 4-byte weights and gradients and 8 bytes of moments. How many bytes
# per parameter does mixed precision save compared with it? Write it in the answer cell and record it
# in the cell after it (not graded).

# %% tags=["answer:predict:mixed-precision-saving"]
my_prediction = None  # bytes per parameter that mixed-precision Adam saves against fp32 Adam
### BEGIN SOLUTION
my_prediction = 0  # 2 + 2 + 12 = 4 + 4 + 8 = 16
### END SOLUTION

# %%
from parallel_lab.show.predict import predict

guess = predict("mixed-precision-saving", my_prediction,
                {"en": "bytes per parameter that mixed-precision Adam saves against fp32 Adam",
                 "zh-Hant": "混合精度的 Adam 比單精度的 Adam 每個參數省下的位元組數"},
                unit={"en": "bytes", "zh-Hant": "位元組"}, tolerance=0)

# %% tags=["reveals:mixed-precision-saving"]
from parallel_lab.planning import memory
from parallel_lab.show import memory as memory_figures

print(memory_figures.precisions_text())
mixed, fp32 = memory.PRECISIONS["mixed"], memory.PRECISIONS["fp32"]
guess.versus(fp32.per_param - mixed.per_param)

# %% [markdown]
# None: both are 16 bytes per parameter. Mixed precision buys speed and halves the **activations**, not
# the model state. A 1.3-billion-parameter model therefore needs 21 GB before it sees a single token —
# more than a 16 GB V100 holds.
#
# Now the well-known sizes: the GPT-3 family (Brown et al. 2020, Table 2.1: layers, hidden size, heads;
# vocabulary 50257, sequences of 2048 tokens) and Megatron's 530B and 1T configurations
# (Narayanan et al. 2021). The parameter count is `12·L·h² + (V + s)·h`.

# %%
gpt3 = memory.MODELS["GPT-3 175B"]
print(memory_figures.params_text(gpt3))

# %% [markdown]
# The table counts everything on **one** device, for one micro-batch of one 2048-token sequence, and
# the fewest 80 GB GPUs that could hold it: `GPUs: state` for the weights, gradients and Adam state
# split evenly (a lower bound: real systems also need buffers and workspace), `+activ.` with the
# activations too. 1 GB = 10⁹ bytes.

# %%
print(memory.table(gpu="H100 80GB"))

# %% [markdown]
# Read the GPT-3 175B row: **2.8 TB of model state** — 35 GPUs of 80 GB at the very least — and one
# sequence's activations alone (275 GB) would overflow three of them. The chart shows the same
# numbers on a log scale against the memory of common GPUs (the dashed lines). Only the two smallest
# models fit under the 80 GB line.

# %%
memory_figures.models_figure()

# %% [markdown]
# ### Try it
#
# Change the model, the precision, the micro-batch, the sequence length, full **activation
# recomputation** (keep only each layer's input and recompute the rest during the backward pass:
# `2·s·b·h` bytes per layer instead of `s·b·h·(34 + 5·a·s/h)`), and the GPU. Things to find:
#
# 1. Which is the largest model whose *model state* fits on one H200 (141 GB)?
# 2. Double the sequence length of GPT-3 13B: why do its activations grow *more* than 2×?
# 3. With recomputation on, how much of GPT-3 175B's memory is still activations?

# %% tags=["nbval-ignore-output"]
memory_figures.memory_widget()

# %% [markdown]
# The widget starts in this configuration (printed here so the check has something to compare):

# %%
print(memory.summary("GPT-3 175B", micro_batch=1, seq=2048, precision="mixed", recompute=False,
                     gpu="H100 80GB"))

# %% [markdown]
# Recomputation trades compute (about one more forward pass) for memory; it shrinks the activations
# but cannot touch the 16 bytes per parameter. Data parallelism does not help either: every replica
# holds the *whole* model. The model itself has to be cut into pieces that live on different devices.

# %% [markdown]
# ## 2. Two ways to cut a model
#
# These are the first two questions of the course FAQ:
#
# - **What is model and pipeline parallelism?** When a model is too big to fit on one GPU, they split
#   the model itself across devices (模型和管道並行性會將模型本身分割到不同的裝置上).
# - **What fundamental problem does it solve?** It partitions the model across devices, so networks
#   far larger than any single GPU can hold can be trained
#   (能夠訓練遠大於任何單一 GPU 所能容納的網路).
#
# There are two flavours.

# %% [markdown]
# **Tensor parallelism (張量並行, intra-layer)** — Megatron-LM (Shoeybi et al. 2019). Every layer is
# split: each GPU holds a slice of every weight matrix and computes part of the output. In a
# transformer MLP `Z = GeLU(X·A)·B`, the first matrix is split by **columns** and the second by
# **rows**, so the only communication is one **all-reduce** that adds the partial results:
#
# ```
#               X  (the same input on both GPUs)
#              /                              \
#  GPU 0: Y0 = GeLU(X·A[:, 1st half])  GPU 1: Y1 = GeLU(X·A[:, 2nd half])
#  GPU 0: Z0 = Y0·B[1st half, :]       GPU 1: Z1 = Y1·B[2nd half, :]
#              \______ all-reduce: Z = Z0 + Z1 ______/
#
#  A by columns: no talk.  B by rows: partial sums.  One collective.
# ```
#
# Every layer needs such all-reduces, in the forward and in the backward pass, so tensor parallelism
# stays **inside the NVLink domain**: the GPUs joined by NVLink (450 GB/s per GPU and direction on an
# H100), 8 in a DGX/HGX node, 72 in a GB200 NVL72 rack.

# %% [markdown]
# **Pipeline parallelism (管道並行, inter-layer)** — GPipe (Huang et al. 2019), PipeDream (Narayanan
# et al. 2019). Consecutive layers go to different GPUs, and activations flow forward like on an
# assembly line (gradients flow back):
#
# ```
#  GPU 0          GPU 1           GPU 2           GPU 3
#  layers 1-24 ─▶ layers 25-48 ─▶ layers 49-72 ─▶ layers 73-96
#              ◀─              ◀─              ◀─
#  activations flow right (forward), gradients flow back left
# ```
#
# It sends only one activation tensor between neighbours, so it works **across nodes**. Its price is
# the **bubble (泡沫)**: with one batch, GPU 3 waits for GPUs 0-2, then GPU 0 waits for the gradients
# to come back (F forward, B backward, `·` idle; equal times for simplicity):
#
# ```
# time →   1  2  3  4  5  6  7  8
# GPU 0   F1  ·  ·  ·  ·  ·  · B1
# GPU 1    · F1  ·  ·  ·  · B1  ·
# GPU 2    ·  · F1  ·  · B1  ·  ·
# GPU 3    ·  ·  · F1 B1  ·  ·  ·         busy 2 of 8 slots: 75 % bubble
# ```

# %% [markdown]
# Cutting the batch into **micro-batches** keeps several stages busy at once (GPipe; lesson 04 works
# out how much for any number of them):
#
# ```
# time →   1  2  3  4  5  6  7  8  9 10
# GPU 0   F1 F2  ·  ·  ·  ·  ·  · B1 B2
# GPU 1    · F1 F2  ·  ·  ·  · B1 B2  ·
# GPU 2    ·  · F1 F2  ·  · B1 B2  ·  ·
# GPU 3    ·  ·  · F1 F2 B1 B2  ·  ·  ·
#
# two micro-batches: each GPU busy 4 of 10 slots, a 60 % bubble instead of 75 %
# ```
#
# Lessons 03 onwards run these schedules (and better ones: 1F1B, interleaved, zero-bubble) on real
# ranks.
#
# **Both at once: 3D parallelism.** Tensor parallelism inside an 8-GPU node, pipeline parallelism
# across nodes, and data parallelism on top (copies of the whole pipeline working on different
# data). For GPT-3 175B, 8-way tensor × 8-way pipeline parallelism puts the model state on 64 GPUs:

# %%
print(memory_figures.split_state_text(gpt3, tp=8, pp=8))

# %% [markdown]
# ## 3. A first run on simulated GPUs
#
# `parallel_lab.runtime.launcher.run(fn, n)` starts `n` rank processes, sets up `torch.distributed` (gloo) in
# each, runs `fn` on every rank and returns the list of their results. In `demos.hello` each rank
# contributes `rank + 1` and an **all-reduce** sums them — the same collective that recombines
# tensor-parallel partial results. **Predict:** what sum do 4 ranks get? Record it below (not graded).

# %% tags=["answer:predict:hello-sum"]
my_prediction = None  # the all-reduced sum on each of 4 ranks
### BEGIN SOLUTION
my_prediction = 10  # 1 + 2 + 3 + 4
### END SOLUTION

# %%
sum_guess = predict("hello-sum", my_prediction, {"en": "the all-reduced sum on each of 4 ranks",
                                                  "zh-Hant": "4 個 rank 各自得到的 all-reduce 總和"}, tolerance=0)

# %% tags=["reveals:hello-sum"]
from parallel_lab.runtime import demos, launcher
from parallel_lab.show.collectives import hello_text

results = launcher.run(demos.hello, 4)
print(hello_text(results))  # each rank also reports its process id; it changes every run, so it is not printed
sum_guess.versus(results[0]["sum"])

# %% [markdown]
# 1 + 2 + 3 + 4 = 10, on every rank. Each rank is a separate process: a real cluster in miniature.
#
# When something fails on a rank, the launcher stops every rank and raises an error in the notebook
# that names the rank, with its traceback; the cell never hangs. Here rank 2 raises an exception while
# the others wait for it in a barrier:

# %%
from parallel_lab.show.collectives import failed_rank_text

try:
    launcher.run(demos.fail_on, 4, args=(2, "pretend this rank ran out of memory"))
except launcher.RankError as err:
    print(failed_rank_text(err))  # the error's first line, then err.rank: the rank that failed

# %%
launcher.shutdown()  # stop the rank processes (a Binder pod has little memory)

# %% [markdown]
# Lesson 01 looks at ranks, collectives and failures (hangs, crashes) closely.

# %% [markdown]
# ## 4. The course map
#
# - **00 Why split a model at all** — memory arithmetic, the two flavours *(this lesson)*
# - **01 Ranks and collectives** — processes, send/recv, all-reduce, all-gather, reduce-scatter, all-to-all, α–β
# - **02 Tensor parallelism** — column and row splits, the f/g conjugate pair, a tensor-parallel GPT block
# - **03 The assembly line and the bubble** — stages, the naive split, measuring idle time
# - **04 Micro-batching and GPipe** — predict the bubble, then run it
# - **05 1F1B and why it saves memory** — activations in flight; write a 1F1B schedule yourself
# - **06 Interleaved 1F1B** — virtual stages: thinner slots in the fill and the drain
# - **07 Zero-bubble schedules** — splitting the backward pass (B = I + W), ZB-H1, the V shape, DualPipeV
# - **08 Recomputation and PipeDream** — trading compute for memory, asynchronous weight versions
# - **09 Balancing stages** — profiling and partitioning layers

# %% [markdown]
# - **10 Let the machine find the schedule** — a search under a memory cap, the bubble–memory front
# - **11 3D parallelism** — data × pipeline × tensor on one device mesh
# - **12 Sharding the model state** — ZeRO stages 1-3 and FSDP
# - **13 Mixture of experts** — routing, capacity, expert parallelism with all-to-all
# - **14 Long sequences** — context parallelism: ring attention and Ulysses
# - **15 The cost model** — the memory and the time of one plan, checked on the course GPT
# - **16 The planner** — searching the plans that fit, TP inside a node, ZeRO-3 against 3D, the budget
# - **17 The FAQ** — the article's six questions, answered by the lessons
# - **18 Capstone** — train a small GPT with a plan of your own

# %% [markdown]
# ## What to remember
#
# - Training with Adam costs **16 bytes per parameter** of model state (mixed precision or fp32 alike),
#   plus activations that grow with micro-batch × sequence length × layers.
# - GPT-3 175B needs 2.8 TB of model state: **at least 35 GPUs of 80 GB** before any activation.
#   Data parallelism replicates the model, so it cannot fix this; the model itself must be split.
# - **Tensor parallelism** splits every layer (columns, rows, all-reduce) and talks constantly: keep it
#   inside an NVLink node. **Pipeline parallelism** splits the stack of layers and only passes
#   activations between neighbours: it spans nodes, but has a **bubble** that micro-batches shrink.
# - Big runs combine them: tensor inside a node, pipeline across nodes, data parallelism on top.
