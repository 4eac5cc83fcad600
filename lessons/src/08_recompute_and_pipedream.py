# %% [markdown]
# # 08 · Activation recomputation and PipeDream
#
# **Learning goals.** By the end of this lesson you can
#
# - explain **activation recomputation** (GPipe's *re-materialisation*): a stage keeps only its input
#   between the forward and the backward pass and runs the forward again when the gradient arrives;
# - check on real ranks that recomputation gives the same gradients and stashes fewer bytes, predict
#   what it does to a step and measure it, and read the memory-versus-compute trade-off of a GPT-3-sized
#   model (none, selective, full recomputation);
# - explain **PipeDream**'s asynchronous 1F1B: no flush, a weight update after every backward, and
#   the **weight staleness** this causes;
# - explain **weight stashing** (the backward uses the weights its forward used, at the price of up to
#   p−s weight versions) and why the **flushed** schedule (PipeDream-Flush, i.e. 1F1B) is exactly
#   synchronous SGD.
#
# You need lessons 03-05 (the assembly line and the bubble, micro-batching and GPipe, 1F1B):
# schedules as per-rank action lists, the stash of activations between F and B, and `run_pipeline`.
# Notation: p stages (one per GPU), m micro-batches per step, stage s (0 is the first).

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. Recomputation: keep the input, redo the forward
#
# Between a micro-batch's forward and its backward, a stage keeps every intermediate tensor its
# backward needs: for each layer the input of every matrix product, the input of every non-linearity,
# attention scores… That is the activation memory that GPipe multiplies by m and 1F1B by up to p.
#
# **Recomputation** (Chen et al. 2016, *Training Deep Nets with Sublinear Memory Cost*; called
# re-materialisation in GPipe, Huang et al. 2019, §2.3), which lesson 05 switched on for 1F1B, keeps
# only the stage's **input**. The forward
# runs without recording a graph; when the gradient arrives, the stage runs its forward again — this
# time recording — and then the backward. In `parallel_lab` (`run_pipeline(..., recompute=True)`):

# %%
from parallel_lab.i18n import source
from parallel_lab.pipeline import worker

print(source(worker.StageWorker.forward))  # inspect.getsource, the docstring and comments in the lesson's language
print(source(worker.StageWorker._take))

# %% [markdown]
# **Predict:** with recomputation, does a stage stash *fewer* micro-batches, or the same number of
# *smaller* ones? (Not graded.)

# %% tags=["answer:predict:recompute-stash"]
my_prediction = None  # "fewer" or "smaller"
### BEGIN SOLUTION
my_prediction = "smaller"  # the schedule decides how many; recomputation shrinks each one to the stage input
### END SOLUTION

# %%
from parallel_lab.show.predict import predict

stash_guess = predict("recompute-stash", my_prediction,
                      {"en": "what recomputation changes in a stage's stash",
                       "zh-Hant": "重新計算讓一個階段的暫存（stash）有什麼改變"}, choices=("fewer", "smaller"))

# %% [markdown]
# ## 2. On real ranks: same gradients, fewer bytes
#
# GPipe — where it matters most, since every stage stashes all m micro-batches — and 1F1B, each
# with and without recomputation, on 4 ranks with 8 micro-batches (an 8-layer MLP in fp64, two
# Linear+GELU blocks per stage, 4 rows of 32 values per micro-batch). Every run is compared with one
# process computing the whole batch. Stashed bytes are what a stage really keeps for its backward:
# the tensors autograd saves (the MLP's stages, run by hand as lesson 07 shows, keep exactly those),
# each counted once, weights excluded; we look at the middle stages 1 and 2, which hold exactly two
# blocks and nothing else (the first and last stages also hold the data batch and the loss target).

# %% tags=["reveals:recompute-stash"]
from parallel_lab.pipeline.run import run_pipeline
from parallel_lab.show import recompute as recompute_figures

runs = {(name, recompute): run_pipeline(name, 4, 8, recompute=recompute)
        for name in ("gpipe", "1f1b") for recompute in (False, True)}
print(recompute_figures.stash_table(runs))
stash_guess.versus(recompute_figures.stash_change(runs["gpipe", False], runs["gpipe", True]))

# %% [markdown]
# The gradients are those of one process in all four runs: recomputation runs the very same
# operations again. The number of stashed micro-batches is unchanged — that is the schedule's
# business (GPipe: all m; 1F1B: p−s on stage s) — but each one shrinks from 4 tensors of 1,024 bytes
# (the input, and the inputs of GELU, the second Linear and the second GELU) to 1: the stage input.
# GPipe's paper puts it as peak activation memory O(N + L/K · N/M) instead of O(N·L): the inputs of all
# micro-batches, plus the full activations of one micro-batch through one stage while it is
# recomputed.
#
# ### The price: predict it, then measure it
#
# The price is compute: every backward now starts by running its forward again. **Predict**
# (graded: 1 point within ±10 %): on the clock of the pipeline lessons (F = 1 and B = 2 time units
# without recomputation, free links), how long is a 1F1B step on p = 4 stages with m = 8
# micro-batches once full recomputation is switched on? Think of what happens to every B, and to the
# fill and the drain.

# %% tags=["answer:predict:recompute-step"]
my_prediction = None  # the step time with full recomputation, 1F1B, p = 4, m = 8, in time units
### BEGIN SOLUTION
my_prediction = (8 + 4 - 1) * (1 + (1 + 2))  # (m + p − 1)(F + B), and every B becomes F + B
### END SOLUTION

# %% tags=["check:predict:recompute-step"]
step_guess = predict("recompute-step", my_prediction)

# %% tags=["reveals:recompute-step"]
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import Costs, simulate

plain_t, recomputed_t = (simulate(build("1f1b", 4, 8), Costs(F=1, B=b)) for b in (2, 1 + 2))
print(recompute_figures.step_text(plain_t, recomputed_t))
step_guess.versus(recomputed_t.makespan, "simulated")

# %% [markdown]
# Every action of 1F1B's timeline with equal stages lies on the critical path of (m + p − 1)(F + B)
# time units, so B → F + B stretches the whole step, fill and drain included, by (2F + B)/(F + B): the
# step gets longer, but its idle share, (p − 1)/(m + p − 1), does not change.
#
# The ranks above measured each action's CPU time (the virtual clock of lesson 03). Does B with
# recomputation really cost one more F? The numbers change from run to run (this model is tiny):

# %% tags=["nbval-ignore-output"]
for name in ("gpipe", "1f1b"):
    print(recompute_figures.measured_text(name, runs[name, False], runs[name, True]))

# %% [markdown]
# What recomputation adds to B is one forward, give or take the noise: the course's tests hold it
# between 0.4 F and 1.4 F over repeated runs (`tests/test_recompute_lesson.py`). Nor is B without
# recomputation exactly 2F on the ranks: the clock's F = 1, B = 2 is a model, the printout a measurement.

# %% [markdown]
# ## 3. The trade-off at scale
#
# On a real model the choice is not all or nothing. Korthikanti et al. 2022 (*Reducing Activation
# Recomputation in Large Transformer Models*) observed that the attention scores (the s×s softmax
# per head, and its dropout) take most of a layer's activation memory but little of its compute:
# **selective** recomputation keeps everything else and recomputes only the attention core.
# `parallel_lab.planning.memory_model` (the memory model of the planner) counts the bytes on each GPU;
# the extra compute follows from the FLOPs of a layer, 24·b·s·h² + 4·b·s²·h forward, three times that
# for a step. Selective recomputation re-runs the attention core's forward, 4·b·s²·h: s/(3(6h + s)) of a
# **training step** (forward + backward = three forwards), 0.9 % for GPT-3 175B, which is what the table
# prints. Korthikanti et al. quote 2.7 % for GPT-3 175B (1.6 % for MT-NLG 530B), also per training
# iteration: their Appendix A (eq. 9) counts the recomputed core as ≈ s/6h of an iteration's FLOPs,
# as much as its forward and backward together (12·b·s²·h), three times the course's count.

# %%
print(recompute_figures.overhead_text("GPT-3 175B"))  # planning.cost.recompute_overhead for each mode

# %% [markdown]
# GPT-3 175B on 8-way tensor × 8-way pipeline parallelism (1F1B, 64 micro-batches) — the busiest GPU,
# with its share of weights, gradients and Adam state (about 45 GB) plus the activations of the
# micro-batches in flight:

# %%
recompute_figures.recompute_tradeoff("GPT-3 175B", micro_batches=(1, 2, 4), pp=8, tp=8, microbatches=64)

# %% [markdown]
# Without recomputation even one sequence per micro-batch overflows an 80 GB GPU. Selective
# recomputation fits it for under 1 % more compute by the course's count (under 3 % by the paper's);
# full recomputation fits micro-batches of 4 for a third more compute. Systems pick the cheapest
# option that fits (and combine it with sequence parallelism, lesson 02, which splits the remaining
# activations across the tensor-parallel GPUs).
#
# ## 4. PipeDream: never flush
#
# GPipe and 1F1B **flush** the pipeline at the end of every step: the last backwards drain, the
# optimizer updates the weights once, and the next step starts from an empty pipeline — the bubble.
# PipeDream (Narayanan et al. 2019, *PipeDream: Generalized Pipeline Parallelism for DNN Training*)
# never drains: every stage alternates one forward and one backward forever and **updates its
# weights after every backward**, on that micro-batch's gradient. Three steps of 4 micro-batches as one
# stream of 12 (F = 1, B = 2 time units):

# %%
from parallel_lab.show import pipedream as pipedream_figures
from parallel_lab.show import pipeline as figures

p, steps, m = 4, 3, 4
flushed = simulate(build("1f1b", p, m), Costs(F=1, B=2))
stream = simulate(build("1f1b", p, steps * m), Costs(F=1, B=2))
print(pipedream_figures.stream_text(flushed, stream, steps, m))
figures.gantt(stream, title=pipedream_figures.stream_title(steps * m))

# %% [markdown]
# Now look at one micro-batch on stage 0. Its forward runs with some weights; before its backward
# comes, stage 0 runs the backwards of the micro-batches ahead of it — and updates its weights after
# each. **Predict:** with 4 stages, how many updates happen on stage 0 between the forward and the
# backward of a micro-batch in the steady state? (Not graded; then think of the last stage.)

# %% tags=["answer:predict:pipedream-staleness"]
my_prediction = None  # updates on stage 0 between a micro-batch's F and its B, p = 4, steady state
### BEGIN SOLUTION
my_prediction = 3  # the backwards of the p − 1 micro-batches ahead of it, each followed by an update
### END SOLUTION

# %%
stale_guess = predict("pipedream-staleness", my_prediction,
                      {"en": "the updates stage 0 applies between a micro-batch's forward and its backward, p = 4",
                       "zh-Hant": "p = 4 時，第 0 階段在一個微批次的前向與反向之間套用幾次更新"},
                      unit={"en": "updates", "zh-Hant": "次更新"}, tolerance=0)

# %% [markdown]
# `pipedream.compare_modes` runs three versions of the same training on 4 real ranks, from the same
# initial weights and data (3 steps of 4 micro-batches, SGD with learning rate 0.1), and records the
# weight version (the number of updates so far) that each forward and each backward used:
#
# - **no-stash**: the backward differentiates whatever weights are current;
# - **stash** (PipeDream's *weight stashing*): the backward uses the weight version its forward used;
# - **flush** (PipeDream-Flush = 1F1B): the gradients of a step's 4 micro-batches accumulate, the
#   pipeline drains, one update.
#
# The heart of it is the update: a new version per backward with stashing, in place without.

# %%
from parallel_lab.pipeline import pipedream

print(source(pipedream.AsyncStage._update))

# %% tags=["reveals:pipedream-staleness"]
out = pipedream.compare_modes(stages=p, steps=steps, microbatches=m, lr=0.1)
print(pipedream_figures.recorded_text(out, pipedream.expected_versions(p, steps, m)))
print()
print(pipedream_figures.versions_text(out, stage=0))
stale_guess.versus(out["no-stash"]["staleness"][0][-1])

# %% [markdown]
# Every weight version is an integer and follows from the schedule alone, so the ranks recorded
# exactly what the schedule predicts. The whole picture, one row per stage (`f→b`: the forward used
# version f, the backward version b; the vertical lines are the step boundaries of the flushed
# schedule):

# %% tags=["reveals:pipedream-staleness"]
pipedream_figures.versions_figure(out, microbatches=m)

# %% [markdown]
# Read it row by row:
#
# - **no-stash**: once the pipeline is full, stage s applies **p−1−s** updates between a micro-batch's
#   forward and its backward (3 on stage 0, none on the last stage, which runs each backward right
#   after its forward). The backward then combines activations computed with old weights and the
#   current weights: the result is not the gradient of any model.
# - **stash**: the backward uses its forward's version (no red), so each stage computes a true
#   gradient — of a model whose stages sit at *different* versions: read a column, micro-batch 6
#   went through stages 0-3 with versions 3, 4, 5, 6. The price: stage s keeps up to p−s weight
#   versions at once. (PipeDream's optional **vertical sync** (Narayanan et al. 2019, SOSP)
#   removes that mismatch too: a micro-batch carries the version it entered stage 0 with, and
#   every stage uses that version for it — more stashed versions, still stale ones.)
# - **flush**: all micro-batches of a step, on every stage, see the same version: this *is*
#   synchronous SGD on the whole batch.
#
# The ranks' final weights, compared with two single-process references — synchronous SGD, and a
# replay of weight stashing's semantics (each micro-batch's gradient taken at the versions above,
# `pipedream.replay_stashed`):

# %%
print(pipedream_figures.checks_text(out, p))

# %%
from parallel_lab.runtime import launcher

launcher.shutdown()  # stop the rank processes (a Binder pod has little memory)

# %% [markdown]
# ## 5. Why the big systems flush
#
# PipeDream removes the bubble but changes the optimisation: updates use stale gradients (with
# stashing, gradients of a model whose stages disagree), and every stage stores several copies of its
# weights, each the size of the stage. Its successors traded back:
#
# - **PipeDream-2BW** (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training")
#   accumulates gradients over m micro-batches and updates once per m, so two weight versions suffice
#   (double buffering) and each micro-batch runs its forward and backward on one version; it keeps a
#   one-update delay (the gradient is applied to weights one version newer);
# - **PipeDream-Flush**, the 1F1B schedule of lessons 03-05, flushes every step and is exactly
#   synchronous SGD, with one weight version and 1F1B's activation memory.
#
# Megatron-LM and DeepSpeed train with flushed schedules, and fight the bubble with more micro-batches
# and with the schedules of lessons 06 and 07 (interleaving, zero bubble) instead of with asynchrony.

# %% [markdown]
# ## What to remember
#
# - **Recomputation** keeps only each stage's input between F and B and reruns the forward inside the
#   backward: the same gradients, the same number of stashed micro-batches, each much smaller, for
#   one extra forward pass per backward (a step a third longer with B = 2F). The bubble fraction is
#   unchanged.
# - **Selective** recomputation (only the attention core) recovers most of the memory for 0.9 % more
#   compute per step on GPT-3 175B by the course's count (2.7 % per iteration in Korthikanti et al.'s
#   Appendix A, which counts the core's forward and backward); full recomputation is the last resort.
# - **PipeDream** never flushes and updates after every backward: no bubble in the steady state, but
#   stage s applies p−1−s updates between a micro-batch's forward and backward.
# - **Weight stashing** makes each backward use its forward's weights (p−s versions on stage s); the
#   stages still sit at different versions. Only the **flushed** schedule (PipeDream-Flush / 1F1B)
#   is exactly synchronous SGD.
