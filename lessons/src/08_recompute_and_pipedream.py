# %% [markdown]
# # 08 · Activation recomputation and PipeDream
#
# **Learning goals.** By the end of this lesson you can
#
# - explain **activation recomputation** (GPipe's *re-materialisation*): a stage keeps only its input
#   between the forward and the backward pass and runs the forward again when the gradient arrives;
# - check on real ranks that recomputation gives the same gradients, stashes fewer bytes and costs
#   about one more forward pass, and read the memory-versus-compute trade-off of a GPT-3-sized model
#   (none, selective, full recomputation);
# - explain **PipeDream**'s asynchronous 1F1B: no flush, a weight update after every backward, and
#   the **weight staleness** this causes (p−1−s updates between a micro-batch's forward and backward on
#   stage s);
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
import inspect

from parallel_lab.pipeline import worker

print(inspect.getsource(worker.StageWorker.forward))
print(inspect.getsource(worker.StageWorker._take))

# %% [markdown]
# **Predict:** with recomputation, does a stage stash *fewer micro-batches*, or the *same number of
# smaller ones*? And which pass gets longer, the forward or the backward?
#
# ## 2. On real ranks: same gradients, fewer bytes, more compute
#
# GPipe — where it matters most, since every stage stashes all m micro-batches — and 1F1B, each
# with and without recomputation, on 4 ranks with 8 micro-batches (an 8-layer MLP in fp64, two
# Linear+GELU blocks per stage, 4 rows of 32 values per micro-batch). Every run is compared with one
# process computing the whole batch. Stashed bytes are what a stage really keeps for its backward:
# the tensors autograd saves (the MLP's stages, run by hand as lesson 07 shows, keep exactly those),
# each counted once, weights excluded; we look at the middle stages 1 and 2, which hold exactly two
# blocks and nothing else (the first and last stages also hold the data batch and the loss target).

# %%
from parallel_lab.pipeline.run import run_pipeline

runs = {}
print("running GPipe and 1F1B, with and without recomputation, on 4 ranks ...")
print(f"{'schedule':<8} {'recompute':<10} {'gradients match':<16} {'peak stash per stage':<22} "
      f"{'peak bytes, stages 1-2':<23} bytes per stashed micro-batch")
for name in ("gpipe", "1f1b"):
    for recompute in (False, True):
        runs[name, recompute] = r = run_pipeline(name, 4, 8, recompute=recompute)
        middle = r["peak_bytes"][1:3]
        per_mb = {b // n for b, n in zip(middle, r["peak_activations"][1:3])}
        print(f"{name:<8} {str(recompute):<10} {str(r['max_grad_diff'] < 1e-10 and r['loss_diff'] < 1e-10):<16} "
              f"{str(r['peak_activations']):<22} {str(middle):<23} {sorted(per_mb)}")

# %% [markdown]
# The gradients are those of one process in all four runs: recomputation runs the very same
# operations again. The number of stashed micro-batches is unchanged — that is the schedule's
# business (GPipe: all m; 1F1B: p−s on stage s) — but each one shrinks from 4 tensors of 1,024 bytes
# (the input, and the inputs of GELU, the second Linear and the second GELU) to 1: the stage input.
# GPipe's paper puts it as peak activation memory O(N + L/K · N/M) instead of O(N·L): the inputs of all
# micro-batches, plus the full activations of one micro-batch through one stage while it is
# recomputed.
#
# The price is compute. The backward now includes a forward, so B grows by about F. On the virtual
# clock (each action's measured CPU time; the numbers change from run to run, and on this tiny model
# Python overhead blurs them):

# %% tags=["nbval-ignore-output"]
import statistics

for name in ("gpipe", "1f1b"):
    plain, recomputed = runs[name, False]["costs"], runs[name, True]["costs"]
    f, b, b_rc = (1e6 * statistics.median(c) for c in (plain["F"], plain["B"], recomputed["B"]))
    print(f"{name}: median F {f:.0f} µs, B {b:.0f} µs; B with recomputation {b_rc:.0f} µs "
          f"(F + B = {f + b:.0f} µs); step {1e3 * runs[name, False]['makespan_measured']:.1f} ms -> "
          f"{1e3 * runs[name, True]['makespan_measured']:.1f} ms")

# %% [markdown]
# ## 3. The trade-off at scale
#
# On a real model the choice is not all or nothing. Korthikanti et al. 2022 (*Reducing Activation
# Recomputation in Large Transformer Models*) observed that the attention scores (the s×s softmax
# per head, and its dropout) take most of a layer's activation memory but little of its compute:
# **selective** recomputation keeps everything else and recomputes only the attention core.
# `parallel_lab.planning.memory_model` (the memory model of the planner) counts the bytes on each GPU;
# the extra compute follows from the FLOPs of a layer, 24·b·s·h² + 4·b·s²·h forward, three times that
# for a step. Mind the denominator: selective recomputation re-runs the 4·b·s²·h of the attention
# core, which is s/(6h + s) of a **forward** — the 2.7 % Korthikanti et al. quote for GPT-3 175B
# (1.6 % for MT-NLG 530B) — and a third of that, s/(3(6h + s)) = 0.9 %, of a **training step**
# (forward + backward = three forwards), which is what the table prints:

# %%
from parallel_lab.planning import cost, memory
from parallel_lab.show import recompute as recompute_figures

gpt3 = memory.MODELS["GPT-3 175B"]
for mode in ("none", "selective", "full"):
    print(f"{mode:<9} extra compute per step: {cost.recompute_overhead(gpt3, mode):6.1%}")
print()
print(inspect.getdoc(cost.recompute_overhead))

# %% [markdown]
# GPT-3 175B on 8-way tensor × 8-way pipeline parallelism (1F1B, 64 micro-batches) — the busiest GPU,
# with its share of weights, gradients and Adam state (about 45 GB) plus the activations of the
# micro-batches in flight:

# %%
recompute_figures.recompute_tradeoff("GPT-3 175B", micro_batches=(1, 2, 4), pp=8, tp=8, microbatches=64)

# %% [markdown]
# Without recomputation even one sequence per micro-batch overflows an 80 GB GPU. Selective
# recomputation fits it for under 1 % more compute; full recomputation fits micro-batches of 4 for
# a third more compute. Systems pick the cheapest option that fits (and combine it with sequence
# parallelism, lesson 02, which splits the remaining activations across the tensor-parallel GPUs).
# Note what recomputation does **not** change: the bubble. Every B grows by F on every stage, so the
# step is longer but its idle share stays (p−1)/(m+p−1).
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
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.show import pipeline as figures

p, steps, m = 4, 3, 4
flushed = simulate(build("1f1b", p, m), Costs(F=1, B=2))
stream = simulate(build("1f1b", p, steps * m), Costs(F=1, B=2))
print(f"flushed 1F1B: {steps} steps of {flushed.makespan:g} units = {steps * flushed.makespan:g}, "
      f"bubble {flushed.bubble_fraction:.1%} in every step")
print(f"PipeDream, one stream of {steps * m} micro-batches: {stream.makespan:g} units, bubble "
      f"{stream.bubble_fraction:.1%}, shrinking towards 0 as training goes on")
figures.gantt(stream, title=f"Asynchronous 1F1B (PipeDream): {steps * m} micro-batches without a flush")

# %% [markdown]
# Now look at one micro-batch on stage 0. Its forward runs with some weights; before its backward
# comes, stage 0 runs the backwards of the micro-batches ahead of it — and updates its weights after
# each. **Predict:** with 4 stages, how many updates happen on stage 0 between the forward and the
# backward of a micro-batch in the steady state? On the last stage?
#
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
from parallel_lab.show import pipedream as pipedream_figures

print(inspect.getsource(pipedream.AsyncStage._update))

# %%
print("running the three modes on 4 ranks ...")
out = pipedream.compare_modes(stages=p, steps=steps, microbatches=m, lr=0.1)
expected = pipedream.expected_versions(p, steps, m)
for mode in pipedream.MODES:
    measured = [sorted(tuple(v) for v in stage) for stage in out[mode]["versions"]]
    print(f"{mode:<9} versions recorded on the ranks == read off the schedule: {measured == expected[mode]}")
print()
print(pipedream_figures.versions_text(out, stage=0))

# %% [markdown]
# Every weight version is an integer and follows from the schedule alone, so the ranks recorded
# exactly what the schedule predicts. The whole picture, one row per stage (`f→b`: the forward used
# version f, the backward version b; the vertical lines are the step boundaries of the flushed
# schedule):

# %%
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
tol = 1e-12
no_stash, stash, flush = out["no-stash"], out["stash"], out["flush"]
stale = [row[-1] for row in no_stash["staleness"]]
print(f"no-stash: steady-state staleness per stage {stale}; "
      f"== p-1-s from the schedule: {stale == [pipedream.staleness(p, s) for s in range(p)]}")
print(f"no-stash: every backward used its forward's weights: "
      f"{all(f == b for stage in no_stash['versions'] for _, f, b in stage)}; "
      f"equals the weight-stashing replay: {no_stash['diff_vs_replay'] < tol}")
print(f"stash:    every backward used its forward's weights: "
      f"{all(f == b for stage in stash['versions'] for _, f, b in stage)}; "
      f"equals the weight-stashing replay: {stash['diff_vs_replay'] < tol}")
print(f"stash:    weight versions held at once per stage {stash['peak_versions']}; == p-s from the schedule: "
      f"{stash['peak_versions'] == [pipedream.stashed_versions(p, s) for s in range(p)]}")
print(f"flush:    equals synchronous SGD: {flush['diff_vs_sync_sgd'] < tol}; "
      f"no-stash and stash equal synchronous SGD: "
      f"{no_stash['diff_vs_sync_sgd'] < tol or stash['diff_vs_sync_sgd'] < tol}")

# %%
from parallel_lab.runtime import launcher

launcher.shutdown()  # stop the rank processes (a Binder pod has little memory)

# %% [markdown]
# ## 5. Why the big systems flush
#
# PipeDream removes the bubble but changes the optimisation: updates use stale gradients (with
# stashing, gradients of a model whose stages disagree), and every stage stores several copies of its
# weights — for a large model, each copy is the size of the stage. Its successors traded back:
# **PipeDream-2BW** (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training")
# accumulates gradients over m micro-batches and updates once per m instead of after every
# backward, so two weight versions suffice (double buffering) and each micro-batch still runs its
# forward and backward on one consistent version; what it gives up is PipeDream's per-micro-batch
# updates, and it keeps a one-update delay (the gradient is applied to weights one version newer);
# **PipeDream-Flush** — the 1F1B schedule of lessons 03-05 — flushes every
# step and is exactly synchronous SGD, with one weight version and 1F1B's activation memory. Megatron-LM
# and DeepSpeed train with flushed schedules, and fight the bubble with more micro-batches and with
# the schedules of lessons 06 and 07 (interleaving, zero bubble) instead of with asynchrony.
#
# ## What to remember
#
# - **Recomputation** keeps only each stage's input between F and B and reruns the forward inside the
#   backward: the same gradients, the same number of stashed micro-batches, each much smaller, for
#   about one extra forward pass (a third more compute with B = 2F). The bubble fraction is unchanged.
# - **Selective** recomputation (only the attention core) recovers most of the memory for 0.9 % more
#   compute per step on GPT-3 175B (2.7 % of a forward, Korthikanti et al.'s figure); full
#   recomputation is the last resort.
# - **PipeDream** never flushes and updates after every backward: no bubble in the steady state, but
#   stage s applies p−1−s updates between a micro-batch's forward and backward.
# - **Weight stashing** makes each backward use its forward's weights (p−s versions on stage s); the
#   stages still sit at different versions. Only the **flushed** schedule (PipeDream-Flush / 1F1B)
#   is exactly synchronous SGD.
