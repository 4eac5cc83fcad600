# %% [markdown]
# # 09 · Balancing stages
#
# > *Frameworks increasingly automate the hard problem of deciding how to partition a model across
# > devices, using profiling and search to balance compute and communication.*
# > (框架越來越自動化地解決決定如何跨裝置劃分模型的難題，使用分析和搜尋來平衡計算和通訊。)
#
# **Learning goals.** By the end of this lesson you can
#
# - explain why the **slowest stage paces a pipeline**, and why more micro-batches cannot remove the
#   bubble an unbalanced cut leaves: its idle share tends to `1 − mean/max` of the stage loads;
# - **profile** a model layer by layer on the CPU — forward and backward time, parameters, activation
#   bytes — and tell the measurements from the facts;
# - cut layers into stages with **DeepSpeed's partition methods** (`uniform`, `parameters`,
#   `type:regex`) and with an **exact time balance**, and write that balance yourself;
# - run an unbalanced and a balanced cut on **real ranks**, check both against one process, and
#   measure the difference on the virtual clock;
# - put **data parallelism** on top of a pipeline with a bucketed gradient all-reduce.
#
# The pipeline lessons (03 · The assembly line and the bubble, 04 · Micro-batching and GPipe,
# 05 · 1F1B, 06 · Interleaved 1F1B, 07 · Zero-bubble schedules, 08) mostly gave every stage the same work:
# the MLP stack of identical blocks, cut evenly. Real models are not like that. A GPT's embedding is
# a cheap lookup with many parameters; its head projects onto a vocabulary of 50 000 tokens and
# computes the loss over all of them. Where you cut decides how fast the pipeline runs.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. The slowest stage sets the pace
#
# Take a model of 7 layers with made-up but typical forward costs: a cheap embedding (1), five
# transformer blocks (2 each), a heavy head with the loss (4, two blocks' worth); every backward
# costs twice its forward. `parallel_lab.pipeline.stages.cut` — the cut `run_pipeline` makes in the
# pipeline lessons — pins the embedding to the first stage and the head to the last and spreads the
# blocks evenly. On 4 stages that gives the stage loads below (`balance.stage_costs` sums each
# stage's layers into the simulator's per-stage `Costs`). A cut is DeepSpeed's `parts` list: stage
# *s* holds layers `parts[s]` up to `parts[s+1] − 1`.
#
# **Predict:** with 8 micro-batches and 1F1B, which rank sets the pace, and which ones idle most?
# And how long is the step? The even cut gives the stages forward loads 5 (the embedding and two
# blocks), 2, 2 and 6 (a block and the head), each backward twice its forward, and links are free.
# Write the step time, in the loads' time units, in the answer cell below and record it in the cell
# after it (1 point within ±10 %). The slowest stage sets the pace, but not alone: think of the fill
# before it and the drain after it.

# %% tags=["answer:predict:uneven-cut-step"]
my_prediction = None  # the step time (makespan) of the even cut, 1F1B, m = 8, in time units
### BEGIN SOLUTION
my_prediction = 8 * (6 + 12) + (5 + 2 + 2) + (4 + 4 + 10)  # m x slowest + fill + drain
### END SOLUTION

# %% tags=["check:predict:uneven-cut-step"]
from parallel_lab.show.predict import predict

guess = predict("uneven-cut-step", my_prediction)

# %%
from parallel_lab.pipeline import balance, partition
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import simulate
from parallel_lab.show import balance as balance_figures
from parallel_lab.show import pipeline as figures

layer_f = [1, 2, 2, 2, 2, 2, 4]  # forward cost of: embed, block 0..4, head + loss
names = ["embed", *(f"block {i}" for i in range(5)), "head"]
even = [0, 3, 4, 5, 7]  # what stages.cut does: embed + 2 blocks | 1 block | 1 block | 1 block + head
print(partition.describe(even, names, layer_f))
costs = balance.stage_costs(layer_f, even)
print(balance_figures.costs_text(costs))
unbalanced = simulate(build("1f1b", 4, 8), costs)
figures.gantt(unbalanced, title=balance_figures.gantt_title("even blocks", unbalanced))

# %% tags=["reveals:uneven-cut-step"]
guess.versus(unbalanced.makespan, "simulated")

# %% [markdown]
# Ranks 1 and 2 hold a single block each and wait most of the time; rank 3 (a block, the head and
# the loss) is busy all the way through its steady phase, and every other rank must wait for it.
# The step is rank 3's 8 × (6 + 12) = 144 units, plus the fill before its first forward
# (5 + 2 + 2 = 9) and the drain after its last backward (4 + 4 + 10 = 18): 171 units.
# The exact answer to the *balancing* question is the cut that makes the heaviest stage as light as
# possible (`partition.balanced`, below). Here it leaves the head alone on the last stage and moves
# the blocks up:

# %% tags=["reveals:uneven-cut-step"]
best = partition.balanced(layer_f, 4)
print(partition.describe(best, names, layer_f))
balanced = simulate(build("1f1b", 4, 8), balance.stage_costs(layer_f, best))
print(balance_figures.step_compare_text(unbalanced, balanced))
figures.gantt(balanced, title=balance_figures.gantt_title("balanced", balanced))

# %% [markdown]
# ## 2. More micro-batches do not fix it
#
# Lesson 04's cure for the bubble was more micro-batches: the fill-and-drain idle time is fixed
# (p − 1 slots) while the useful work grows with *m*. That cure assumes equal stages. With unequal
# ones, once the pipeline is full every stage waits for the slowest on every micro-batch, so a step
# takes about `m × max(load)` and the idle share tends to
#
# $$\text{bubble} \;\to\; 1 - \frac{\text{mean}(\text{load})}{\max(\text{load})} \qquad (m \to \infty)$$
#
# (`balance.limit_bubble`). Both cuts below go to their limit (dotted); the bubble of the even cut
# stalls at 37.5 %, the balanced one goes on to 6.25 %. Equal loads (3.75 each) would tend to 0, but
# layers cannot be split, so the balanced cut is the best this model allows.

# %%
ms = [1, 2, 4, 8, 16, 32, 64, 128]
cuts = {"even blocks": even, "balanced": best}
curves = balance.bubble_curves(layer_f, cuts, ms, schedule="1f1b")
limits = {name: balance.limit_bubble(partition.stage_loads(layer_f, parts)) for name, parts in cuts.items()}
print(balance_figures.curves_text(ms, curves, limits))
balance_figures.bubble_figure(ms, curves, limits)

# %% [markdown]
# Better schedules (interleaving, zero bubble: lessons 06 and 07) attack the fill-and-drain part; none of
# them can make a fast stage useful while it waits for a slow one. Balancing is a separate problem,
# and it comes first.
#
# ## 3. Profiling the course models
#
# To balance a real model we need each layer's cost. `parallel_lab.pipeline.profile.profile_layers` runs
# every layer of a model forward and backward on the output of the previous one and records:
#
# - **time** — thread CPU time of the forward and of the backward (median of 5 runs after a
#   warm-up), with torch on one thread: one simulated device, as on a rank. These are
#   *measurements*: they differ between machines and between runs.
# - **parameters** and **activation bytes** (what autograd saves for the backward pass, seen with
#   `saved_tensors_hooks`, each storage once, parameters excluded). These are *facts* of the model
#   and its input shapes: every run gives the same numbers.
#
# This lesson's GPT (`balance.LESSON_GPT`) is small — 5 blocks of width 64 on sequences of 16
# tokens — but its vocabulary has 4096 tokens, so its embedding and head are large, as in a real
# GPT with few blocks per stage. The facts first, on one micro-batch of 2 sequences:

# %%
from parallel_lab.pipeline import profile

print(balance.LESSON_GPT)
records = profile.profile_course_model("gpt", batch=2, **balance.LESSON_GPT)
print(balance_figures.facts_table(records, names))

# %% [markdown]
# The embedding and the head hold 5.3 blocks' worth of parameters each; the head saves only its
# input for the backward pass. Now the measurements (your numbers will differ; the shape should
# not):

# %% tags=["nbval-ignore-output"]
print(balance_figures.times_table(records, names))

# %% [markdown]
# One thing is missing: the **loss**. The last stage also computes the cross-entropy, a softmax over
# all 4096 logits of every token, and its backward. A profile of the model's layers alone does not
# see it. `balance.profile_pieces` profiles exactly what each stage of a pipeline runs: the same
# pieces, in the run's precision (fp64 here, for exact checks), with the loss attached to the head
# (`balance.WithLoss`).

# %% tags=["nbval-ignore-output"]
spec = balance.spec()  # the ModelSpec of the runs below: LESSON_GPT, 8 micro-batches of 2 sequences
pieces, _, _ = spec.pieces()
measured = balance.profile_pieces(spec, microbatches=8)
block_s = sorted(r.time_s for r in measured[1:-1])[len(measured[1:-1]) // 2]  # the median block
print(balance_figures.profile_text(measured, names, block_s))

# %% [markdown]
# The head with its loss costs the most (the course's tests find it so in every profile; the
# printout gives this run's numbers, in blocks): the shape of the illustration in section 1, where
# the head costs two blocks.
#
# ## 4. DeepSpeed's partition methods
#
# DeepSpeed's `PipelineModule(layers, num_stages, partition_method=...)` cuts a list of layers
# with one of three methods; `parallel_lab.pipeline.partition.partition` implements them with the same names
# (and refuses empty stages, which DeepSpeed allows):
#
# | method | weight of a layer | then |
# |---|---|---|
# | `uniform` | — | the same number of layers per stage |
# | `parameters` (DeepSpeed's **default**) | its trainable parameters | balance the weights |
# | `type:REGEX` | 1 if its class name matches, else 0 | balance the weights |
# | `time` (ours; DeepSpeed's `profile` is unimplemented) | measured forward + backward | balance the weights |
#
# "Balance" means the exact min-max cut: the contiguous cut whose heaviest stage is as light as
# possible, the quantity that paces the pipeline. On the lesson's GPT:

# %%
for method in ("uniform", "parameters", "type:block"):
    parts = partition.partition(pieces, 4, method)
    print(f"{method:<11} {parts}   " + " | ".join(", ".join(names[a:b]) for a, b in zip(parts[:-1], parts[1:])))

# %% [markdown]
# - `uniform` gives 2, 2, 2 and 1 pieces: with 7 pieces on 4 stages it happens to leave the head
#   alone — the right cut here, by luck (with 6 blocks it would pair the head with a block).
# - `parameters`, DeepSpeed's default, is the trap: the embedding has as many parameters as five
#   blocks, so it gets a stage **alone**, and stage 1 gets four blocks of work while stage 0 idles.
# - `type:block` counts blocks and gives the embedding and the head weight 0: it puts two blocks
#   with the embedding and leaves one block on stage 2 — blind to the head's cost.
#
# And `time`, from the measured profile (your run may differ if your machine's costs do):

# %% tags=["nbval-ignore-output"]
time_cut = partition.partition(pieces, 4, "time", profile=measured)
print(f"{'time':<11} {time_cut}   " + " | ".join(", ".join(names[a:b]) for a, b in zip(time_cut[:-1], time_cut[1:])))
print(partition.describe(time_cut, names, [r.time_s * 1e3 for r in measured]))

# %% [markdown]
# ## 5. Exercise: the exact min-max cut
#
# Write `my_balanced_cut(weights, stages)`: cut the list of non-negative layer costs `weights` into
# `stages` non-empty runs of consecutive layers so that the **heaviest run is as light as possible**;
# return DeepSpeed's `parts`: `stages + 1` increasing boundaries from 0 to `len(weights)`.
#
# Two classic ways (either is fine here):
#
# - **dynamic programming**: `best[s][i]` = the lightest heaviest stage when the first `i` layers
#   form `s` stages; `best[s][i] = min over j of max(best[s−1][j], sum(weights[j:i]))`. Remember the
#   best `j` to rebuild the cut. O(n²·p).
# - **bisection on the answer**: a bottleneck `B` is feasible if filling each stage greedily up to
#   `B` needs at most `stages` stages; bisect over the candidate values (all contiguous sums).
#
# The check calls your function on 8 cases and compares the heaviest stage of your cut with the
# optimum (any optimal cut passes).
#
# **What the check forbids:** the library's partitioner (`partition.balanced`): write the search
# yourself. Your function runs on a rank of its own; only the cuts it returns come back.
#
# Keep all your code in the answer cell below: the grader reads that cell alone from your notebook and
# runs it on fresh ranks of its own, so helpers defined in other cells are not seen.

# %% tags=["answer:balanced-cut"]
def my_balanced_cut(weights, stages):
    ### BEGIN SOLUTION
    n = len(weights)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]  # best[s][i]: first i layers in s stages
    start = [[0] * (n + 1) for _ in range(stages + 1)]  # where the last of those s stages starts
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                load = max(best[s - 1][j], prefix[i] - prefix[j])
                if load < best[s][i]:
                    best[s][i], start[s][i] = load, j
    parts = [n]
    for s in range(stages, 0, -1):
        parts.append(start[s][parts[-1]])
    return parts[::-1]
    ### END SOLUTION


# %% [markdown]
# **Try it on ranks** before the check: your cut of the measured pieces (section 3), run with 1F1B on
# 4 real ranks against one process, its heaviest stage against the exact optimum's.

# %% tags=["nbval-ignore-output"]
tried = balance_figures.try_cut(my_balanced_cut, spec, [r.time_s * 1e3 for r in measured], names)

# %% tags=["check:balanced-cut", "points:2"]
from parallel_lab.exercises import check_balanced_cut

verdict = check_balanced_cut(my_balanced_cut)

# %% [markdown]
# ## 6. On real ranks: unbalanced against balanced
#
# `run_pipeline` always cuts the GPT like `stages.cut`, whose even boundaries come from
# `stages.bounds`. To run any cut, `stages.cut_at` builds the stages from `parts` over all the
# pieces, and `balance.run_cut` runs a schedule with them; the executor, the comparison with one
# process and the simulator are the pipeline lessons' own:

# %%
from parallel_lab.i18n import source
from parallel_lab.pipeline import stages

print(source(stages.cut_at))
print(source(stages._stages))

# %% [markdown]
# Three cuts of the same GPT, each run with 1F1B on 4 ranks, 8 micro-batches, in fp64: the even
# cut of the pipeline lessons, DeepSpeed's default (`parameters`) and the time-balanced cut. Each
# run does a warm-up step, then 3 recorded steps, and keeps the one with the median step time.
# **Predict:** order the three by step time, fastest first. (Not graded.)

# %% tags=["answer:predict:cut-order"]
my_prediction = None  # ["even blocks", "DeepSpeed parameters", "time-balanced"] in your order, fastest first
### BEGIN SOLUTION
my_prediction = ["time-balanced", "even blocks", "DeepSpeed parameters"]  # heaviest: head; block + head; 4 blocks
### END SOLUTION

# %%
from parallel_lab.show.predict import predict

order_guess = predict("cut-order", my_prediction, {"en": "the three cuts by step time on 4 real ranks, fastest first",
                                                   "zh-Hant": "三種切法在 4 個真實 rank 上依一步時間排序，最快的在前"},
                      order=balance_figures.cut_choices("even blocks", "DeepSpeed parameters", "time-balanced"))

# %%
cuts = {"even blocks": balance.default_parts(spec, 4),
        "DeepSpeed parameters": partition.partition(pieces, 4, "parameters"),
        "time-balanced": time_cut}
runs = {}
for name, parts in cuts.items():
    runs[name] = balance.run_cut(spec, parts, "1f1b", microbatches=8, steps=3)

# %% [markdown]
# First, correctness: whatever the cut, the loss and every gradient must be those of one process
# running the whole batch (fp64, so only rounding differs).

# %%
print(balance_figures.match_text(runs))

# %% [markdown]
# Now the times. The per-stage costs are medians of measured thread CPU time; the bubble and the
# step time are on the **virtual clock** (each action lasts its CPU time, messages carry the
# sender's clock: what 4 dedicated devices would show; see lesson 03). `(pred.)` is the simulator fed
# the same measured costs. Your numbers will differ.

# %% tags=["nbval-ignore-output", "reveals:cut-order"]
print(balance_figures.measured_table(runs))
print()
print(balance_figures.speedup_text(runs, "time-balanced", ["even blocks", "DeepSpeed parameters"]))
order_guess.versus(sorted(runs, key=lambda name: runs[name]["makespan_measured"]))

# %% [markdown]
# The two timelines on the same time axis: the even cut's last rank (a block, the head and the loss)
# is the one every other rank waits for.

# %% tags=["nbval-ignore-output", "reveals:cut-order"]
end = max(r["makespan_measured"] for r in runs.values()) * 1e3
for name in ("even blocks", "time-balanced"):
    r = runs[name]
    fig = figures.gantt(r, clock="virtual", title=balance_figures.run_title(name, r))
    fig.update_xaxes(range=[0, end * 1.02])
    fig.show()

# %% [markdown]
# What the measurement shows, and its limits: with *the same hardware and the same schedule*, the
# time-balanced cut is the fastest of the three (the course's tests find it fastest in at least two
# of three runs, `tests/test_balance.py`; the line above gives this run's ratios, which move with the
# machine's load). The even cut's heaviest stage (a block, the head and the loss) and DeepSpeed's
# default's (four blocks) are close, so which of the two is slower depends on the run. The remaining
# bubble of the balanced cut is the ordinary fill-and-drain of 1F1B with 8 micro-batches on 4 stages
# (3/11, 27 %, with equal stages), plus the granularity of whole layers.
# Profiles on a shared CPU are noisy, so a time-balanced cut may change from run to run when two
# candidates are close — on GPUs too, which is why real planners profile several times and prefer
# robust cuts.
#
# ## 7. Data parallelism on top
#
# A pipeline of *p* stages can itself be replicated: *d* copies of it train on different slices of
# the batch and average their gradients — data parallelism, the third dimension of 3D parallelism
# (lesson 11). The average is one all-reduce of every gradient over the *d* replicas that hold the
# same stage. `parallel_lab.parallel3d.data_parallel.allreduce_gradients` packs gradients into **buckets**
# (in reverse order, as backward produces them) so that a GPT's many small tensors cost a few
# messages, not hundreds:

# %%
from parallel_lab import models
from parallel_lab.parallel3d import data_parallel
from parallel_lab.runtime import launcher

print(source(data_parallel.allreduce_gradients))
small = models.GPT(data_parallel.SMALL_GPT).double()  # fp64, as in the check below
plan = data_parallel.buckets(small.parameters(), bucket_bytes=4096)
print(balance_figures.buckets_text(len(list(small.parameters())), len(plan), 4096))

# %% [markdown]
# On the same 4 ranks, now 4 replicas of a small GPT (fp64): each trains on one of the batch's 4
# sequences, and after the all-reduce every replica must hold the gradient of the whole batch
# computed on one process:

# %%
dp_ranks = launcher.run(data_parallel.check_against_reference, 4, args=(4,))
print(balance_figures.replicas_text(dp_ranks))
launcher.shutdown()  # stop the rank processes (a Binder pod has little memory)

# %% [markdown]
# ## What to remember
#
# - A pipeline runs at the pace of its **slowest stage**. With stage loads `c`, the bubble tends to
#   `1 − mean(c)/max(c)` however many micro-batches you use: micro-batches and clever schedules fix
#   fill-and-drain, only a **balanced cut** fixes imbalance.
# - Balance what a stage *runs*: forward + backward time, including the **loss** on the last stage.
#   Parameters measure memory, not time — DeepSpeed's default (`parameters`) gives a big-vocabulary
#   embedding a stage of its own and overloads the next one.
# - The best contiguous cut (min-max) is exact and cheap to compute (dynamic programming or bisection);
#   its limit is the granularity of whole layers.
# - Profiles are **measurements**: thread CPU time on one thread, medians, warm-up; parameter counts and
#   activation bytes are facts you can check exactly.
# - Data parallelism on top averages gradients with a **bucketed all-reduce** per replica group.
