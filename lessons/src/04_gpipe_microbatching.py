# %% [markdown]
# # 04 · Micro-batching and GPipe
#
# > *Pipeline parallelism (GPipe, PipeDream) divides the batch into micro-batches that flow through
# > the stages on an interleaved timetable, which shortens the idle "bubble".*
# > (管道並行性（GPipe、PipeDream）將批次劃分為微批處理，
# > 這些微批處理以交錯的時間表流經各個階段，從而縮短了空閒「泡沫」時間。)
#
# **Learning goals.** By the end of this lesson you can
#
# - split a batch into m **micro-batches** and read the GPipe schedule: every stage runs all m
#   forwards, then all m backwards (Huang et al. 2019, *GPipe*);
# - predict GPipe's bubble from p and m, derive its formula, check it with the simulator, and
#   measure it on real ranks (FAQ 5: how micro-batching reduces the bubble);
# - name the price: every stage keeps the activations of all m micro-batches — of the whole batch —
#   until its backward passes begin;
# - export a real run as a Chrome/Perfetto trace and explore it.
#
# Lesson 03 left us with a pipeline in which only one of p ranks works at a time. The fix is the
# assembly line's own trick: don't wait for one car to leave the line before starting the next.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. Cut the batch into micro-batches
#
# Split the batch of B rows into m micro-batches of B/m rows. Stage 0 starts micro-batch 1 as soon
# as it has handed micro-batch 0 to stage 1, so several micro-batches occupy different stages at
# once. Each micro-batch's loss is scaled by 1/m, so the gradients summed over the micro-batches
# are exactly those of the whole batch: the optimizer steps once per batch, as before.
#
# GPipe's schedule (`schedules.build("gpipe", p, m)`) is the simplest one that does this: each
# rank runs all its forwards, then all its backwards.

# %%
from parallel_lab.pipeline.actions import format_grid
from parallel_lab.pipeline.schedules import build

gpipe = build("gpipe", 4, 4)
print(gpipe.to_text())

# %% [markdown]
# **Predict before you run the next cell.** With p = 4 stages, m = 4 micro-batches, a forward of 1
# time unit and a backward of 2 (per micro-batch and stage), and free links:
#
# 1. when does the last stage start its first forward?
# 2. how long is the whole step?
# 3. what fraction of the device time is idle?
#
# Write your three numbers down, and the third one in the answer cell below (a fraction: 0.5 for
# half the device time idle). Run it and the cell after it, which records your number (it counts for
# your grade: 1 point within ±10 %), then let the simulator answer.

# %% tags=["answer:predict:gpipe-bubble"]
my_prediction = None  # the idle fraction of the device time, p = 4, m = 4 (e.g. 0.5)
### BEGIN SOLUTION
my_prediction = 3 / 7
### END SOLUTION

# %% tags=["check:predict:gpipe-bubble"]
from parallel_lab.show.predict import predict

guess = predict("gpipe-bubble", my_prediction)

# %% tags=["reveals:gpipe-bubble"]
from parallel_lab.pipeline.simulate import Costs, simulate, unit_grid
from parallel_lab.show import runs as runs_text

costs = Costs(F=1, B=2)
timeline = simulate(gpipe, costs)
print(format_grid(unit_grid(timeline)))
runs_text.step_summary(timeline)
guess.versus(timeline.bubble_fraction, "simulated")

# %% [markdown]
# Read the grid diagonally. The forward phase is a staircase: micro-batch j reaches stage s at
# time j + s, so the last stage starts at p − 1 = 3 and the forwards end after m + p − 1 = 7 slots.
# The backward phase is the same staircase upside down, with slots of B = 2 units. Every stage is
# busy m (F + B) and the step lasts (m + p − 1)(F + B), so the idle share is
#
# $$\text{bubble} = 1 - \frac{m\,(F+B)}{(m+p-1)\,(F+B)} = \frac{p-1}{m+p-1}$$
#
# For p = 4, m = 4 that is 3/7 ≈ 0.429, down from 0.75 with the whole batch in one piece. The costs
# cancel: the bubble depends only on p and m (as long as the stages are equally fast).

# %% tags=["reveals:gpipe-bubble"]
from parallel_lab.show import pipeline as figures

figures.gantt(timeline)

# %% [markdown]
# ### How does pipeline parallelism reduce the bubble? (FAQ 5)
#
# > Dividing the batch into micro-batches lets several micro-batches occupy different stages at
# > once, keeping all GPUs busy and reducing idle time.
# > (將批次劃分為微批次可以讓多個微批次同時佔據不同的階段，從而保持所有 GPU 繁忙並減少空閒時間。)
#
# The fill (p − 1 slots before the last stage starts) and the drain (p − 1 slots while the last
# gradients travel back) do not go away; micro-batches make them *short compared with the work*.
# The two forms you will meet come from two papers. GPipe (Huang et al. 2019, §2.3) states the
# bubble against the step, as above: O((K − 1)/(M + K − 1)) with K partitions and M micro-batches,
# "negligible when M ≥ 4 × K". Narayanan et al. 2021 (*Efficient Large-Scale Language Model Training
# on GPU Clusters Using Megatron-LM*, §2.2.1) state it against the compute, the "bubble time
# fraction" **(p − 1)/m**. Both count the same idle time.
#
# **Predict:** how many micro-batches does a 4-stage GPipe need to bring the bubble to at most
# 10 %? (Not graded: compare, then read on.)

# %% tags=["answer:predict:gpipe-microbatches"]
my_prediction = None  # the fewest micro-batches m with a bubble of at most 10 %, p = 4
### BEGIN SOLUTION
my_prediction = 27  # (p−1)/(m+p−1) <= 0.1  <=>  m >= 9 (p−1) = 27
### END SOLUTION

# %%
guess = predict("gpipe-microbatches", my_prediction,
                {"en": "the fewest micro-batches that bring a 4-stage GPipe's bubble to at most 10 %",
                 "zh-Hant": "讓 4 個階段的 GPipe 氣泡降到 10 % 以下所需的最少微批次數"},
                unit={"en": "micro-batches", "zh-Hant": "個微批次"}, tolerance=0.02)

# %% tags=["reveals:gpipe-microbatches"]
p = 4
runs_text.gpipe_bubble_table(p, (1, 2, 4, 8, 16, 32), costs)
fewest = next(m for m in range(1, 100) if simulate(build("gpipe", p, m), costs).bubble_fraction <= 0.1 + 1e-9)
guess.versus(fewest, "simulated")

# %% [markdown]
# 27 micro-batches bring the bubble to at most 10 % (exactly 10 % at m = 27: 3/30); 26 leave 3/29,
# 10.3 %. The bubble shrinks like 1/m, quickly at first and then slowly. The same curves for 2, 4
# and 8 stages — the more stages, the more micro-batches it takes (every point is a simulation):

# %%
runs_text.gpipe_curves((2, 4, 8), range(1, 33), costs)

# %% [markdown]
# ## 2. GPipe on real ranks
#
# Now GPipe runs on 4 real ranks with the same batch of 32 rows cut into m = 1, 2, 4 and 8
# micro-batches (32, 16, 8 and 4 rows each). Every run is checked against one process running the
# whole batch, and the executor reports how many micro-batches each stage kept at once.

# %%
from parallel_lab.pipeline.run import run_pipeline

runs = {}
for m in (1, 2, 4, 8):
    runs_text.running("GPipe", 4, m, end=" ")
    runs[m] = run_pipeline("gpipe", 4, m, batch=32)
    runs_text.ran(runs[m])

# %% [markdown]
# The bubbles, measured on the **virtual clock** (each action lasts the CPU time its rank spent on
# it, messages cost a modelled 10 µs + bytes / 25 GB/s: the timeline of 4 dedicated devices, see
# lesson 03), next to the formula, the simulator fed the costs this run measured, and this
# machine's **wall clock**, where 4 ranks share its cores. Your numbers will differ from the ones
# stored here.

# %% tags=["reveals:gpipe-bubble", "nbval-ignore-output"]
import os

runs_text.bubble_runs_table(runs, 4, os.cpu_count())
figures.compare(runs[8])

# %% [markdown]
# The measured bubble falls with m as predicted, and the simulator fed the measured costs follows
# it closely. It does not sit exactly on (p−1)/(m+p−1), and the reasons are worth knowing because
# real pipelines have them too: the stages are not equally fast (the last one also computes the
# loss), so the others wait for the slowest; each message adds link time to the fill and the drain;
# and this tiny model's actions are so short that fixed per-action overheads weigh in. The wall
# clock adds what this laptop does that dedicated devices would not: ranks taking turns on the cores.
#
# ## 3. The price: activation memory
#
# A stage must keep what its forward computed for a micro-batch (the activations) until that
# micro-batch's backward has run. GPipe runs *every* forward before the first backward, so at the
# turn each stage holds **all m micro-batches** (the simulated stash over time, per stage):

# %%
runs_text.stash_figure(simulate(build("gpipe", 4, 8), costs), "GPipe", 4, 8)

# %% [markdown]
# The real runs agree: the executor counts the micro-batches whose activations are held, after
# every action, and its peaks are exactly m on every stage. Counted in bytes, a middle stage (whose
# memory holds nothing but activations) keeps the same amount whatever m is: m micro-batches of
# B/m rows are the whole batch.

# %%
runs_text.peaks_are_m(runs)

# %% [markdown]
# So micro-batching fixes the bubble but not the memory: GPipe needs as much activation memory as
# the whole batch, which is why the GPipe paper pairs it with **recomputation** (keep only each
# stage's input, run the forward again during the backward). Lesson 05 shows a schedule that does
# the same work in another order and needs far less.
#
# ## 4. Look inside a run: a Chrome/Perfetto trace
#
# `run_pipeline(..., trace=path)` writes the run as a Chrome trace: one process per rank, with one
# track per clock (virtual, wall, and the simulator's prediction) and a counter of stashed
# activations per stage. Open it at **https://ui.perfetto.dev** ("Open trace file", or drag the
# file onto the page; it stays in your browser) or in Chrome's `chrome://tracing`: zoom in with
# W/S, pan with A/D, click an action to see its stage, kind and micro-batch. Here it goes to a
# temporary folder; pass `trace="gpipe.json"` to write it beside this notebook and download it from
# JupyterLab's file browser.

# %%
import collections
import json
import tempfile
from pathlib import Path

folder = Path(tempfile.mkdtemp())
traced = run_pipeline("gpipe", 4, 8, batch=32, trace=folder / "gpipe.json")
events = json.loads(Path(traced["trace"]).read_text())["traceEvents"]
kinds = collections.Counter(e["ph"] for e in events)
runs_text.trace_summary(Path(traced["trace"]), events, kinds, traced)

# %% [markdown]
# ## What to remember
#
# - Micro-batches let several pieces of the batch occupy different stages at once (FAQ 5); the
#   gradients summed over them are exactly those of the whole batch.
# - GPipe: all forwards, then all backwards. Its bubble is (p−1)/(m+p−1) of the step, or (p−1)/m of
#   the compute: it shrinks like 1/m, and more stages need more micro-batches.
# - The fill and the drain never vanish in GPipe; measured bubbles also pay for unequal stages and
#   for links.
# - The price: each stage keeps all m micro-batches' activations until its backwards start — the
#   whole batch's worth, however finely it is cut. Lesson 05 (1F1B) removes most of it; lessons
#   06-07 shrink the bubble itself further.
