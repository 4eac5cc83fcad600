# %% [markdown]
# # 03 · The assembly line and the bubble
#
# > *Pipeline (inter-layer) parallelism assigns consecutive layers to different GPUs, so block 1
# > sits on GPU 0, block 2 on GPU 1, and so on, and activations pass forward like on an assembly
# > line. The challenge of a simple pipeline is the "bubble": while GPU 0 works on the first batch,
# > the downstream GPUs sit idle.*
# > (管道（層間）並行性將不同的連續層分配給不同的 GPU……激活像裝配線一樣向前傳遞。簡單管線的挑戰是「泡沫」：
# > 當 GPU 0 在第一批中工作時，下游 GPU 閒置。)
#
# **Learning goals.** By the end of this lesson you can
#
# - cut a model into consecutive **stages** on p ranks and write what every rank does as a
#   **schedule**: per rank, an ordered list of actions such as `1F0` (stage 1, forward, batch 0);
# - turn that order into a timeline with the simulator and find the **bubble**: with the whole
#   batch in one piece, (p−1)/p of the device time is idle (FAQ 4);
# - run the very same schedule on real ranks, check its gradients against one process, and
#   measure the bubble on two clocks — and say which clock you are reading;
# - read the validator's message when a schedule is broken, before any process starts.
#
# Lessons 00-02 split the model *inside* each layer (tensor parallelism). This lesson and the next
# four split it *between* layers. One representation of a schedule carries all of them: the same
# object is validated, simulated, run on real ranks and drawn.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. Cutting a model into stages
#
# The model of the pipeline lessons is a stack of 8 blocks (`Linear` 32→32, then `GELU`) with a
# mean-squared-error loss: small enough to run anywhere, deep enough to cut. `stages.cut` gives
# stage s a run of consecutive blocks; with p = 4 ranks, rank r holds stage r, two blocks each. Every
# process rebuilds the same weights from a seed, so a pipeline run can be compared with one process
# running the whole model.

# %%
from parallel_lab.pipeline.stages import ModelSpec, cut

spec = ModelSpec("mlp", hidden=32, layers=8, batch=16)
for stage in cut(spec, 4):
    n = sum(p.numel() for p in stage.module.parameters())
    print(f"stage {stage.index} (rank {stage.index}): blocks {stage.first}-{stage.last - 1}, {n:,} parameters")

# %% [markdown]
# A training step then goes like an assembly line: rank 0 runs its blocks on the batch and **sends**
# the activation to rank 1, which runs its blocks and sends to rank 2, and so on; the last rank
# computes the loss. The backward pass runs the line in reverse: rank 3 sends the gradient of its
# input to rank 2, and so on down to rank 0. Each hop is one send/recv (lesson 01), nothing else.
#
# ## 2. A schedule is data
#
# What each rank does, in which order, is a **schedule**: per rank, a list of actions written
# `{stage}{kind}{micro-batch}` (PyTorch's `torch.distributed.pipelining` notation), where the kind is
# `F` (forward) or `B` (backward). Here the whole batch is one piece, numbered 0 — the *naive*
# schedule (`schedules.build("naive", p, 1)`):

# %%
from parallel_lab.pipeline.actions import format_grid
from parallel_lab.pipeline.schedules import build

naive = build("naive", 4, 1)
print(naive.to_text())

# %% [markdown]
# The step × rank grid puts each rank's list in a column. **Read it with care:** a row is a position
# in each rank's list, *not* a moment in time. Rank 3's first action is `3F0`, but it cannot start it
# before `2F0` has run on rank 2 and its activation has arrived.

# %%
print(format_grid(naive))

# %% [markdown]
# **Predict:** say a forward costs 1 time unit on every stage and a backward 2 (the usual ratio: the
# backward computes gradients for both the input and the weights), and messages are free. How long
# is the step, in time units? For how many of those units does each rank work? Write the step in
# the answer cell below and run it and the cell after it, which records it (not graded).

# %% tags=["answer:predict:naive-step"]
my_prediction = None  # the naive schedule's step on 4 ranks, F = 1, B = 2, in time units
### BEGIN SOLUTION
my_prediction = 12  # one rank at a time: 4 forwards of 1, then 4 backwards of 2
### END SOLUTION

# %%
from parallel_lab.show.predict import predict

guess = predict("naive-step", my_prediction, {"en": "the naive schedule's step on 4 ranks, F = 1, B = 2",
                                              "zh-Hant": "樸素排程在 4 個 rank 上的一步，F = 1、B = 2"},
                unit={"en": "time units", "zh-Hant": "時間單位"}, tolerance=0)

# %% [markdown]
# The **simulator** answers by list scheduling: every rank runs its actions in order, and an action
# starts as soon as its rank is free *and* its input has arrived. On a unit-time grid (one row per
# time unit, `.` = idle):

# %% tags=["reveals:naive-step"]
from parallel_lab.pipeline.simulate import Costs, simulate, unit_grid

costs = Costs(F=1, B=2)
timeline = simulate(naive, costs)
from parallel_lab.show import runs

print(format_grid(unit_grid(timeline)))
runs.naive_step(timeline)
guess.versus(timeline.makespan, "simulated")

# %% [markdown]
# The same timeline as a Gantt chart (`figures.gantt`): one row per rank, a bar per action with its
# micro-batch number inside; the white space is the idle time.

# %% tags=["reveals:naive-step"]
from parallel_lab.show import pipeline as figures

figures.gantt(timeline)

# %% [markdown]
# ### What is the bubble? (FAQ 4)
#
# > **What is the "bubble" in simple pipeline parallelism?** Early in a pipeline step, downstream
# > stages have no input yet and sit idle, wasting GPU time; that idle gap is the bubble.
# > (在管道步驟的早期，下游階段還沒有輸入並處於空閒狀態，浪費 GPU 時間；這種閒置間隙稱為泡沫。)
#
# In the chart: rank 3 waits 3 units for its input, and after the backward passes it on, it has
# nothing left to do while the gradient travels back to rank 0. With the whole batch in one piece,
# only **one** rank works at any moment, so p ranks are busy 1/p of the time: the bubble is
# **(p−1)/p**, whatever the costs of F and B. Adding GPUs makes it *worse*:

# %% tags=["reveals:naive-step"]
for p in (1, 2, 4, 8):
    t = simulate(build("naive", p, 1), costs)
    print(f"p = {p}: step {t.makespan:>2g} units, bubble {t.bubble_fraction:.3f}  ((p−1)/p = {(p - 1) / p:.3f})")

# %% [markdown]
# Naive model parallelism still lets a model that does not fit on one device train at all
# (lesson 00) — but 8 GPUs, each idle 7/8 of the time, do the work of one. Lesson 04 fixes this.
#
# ## 3. A broken schedule is rejected before anything runs
#
# A schedule can be wrong in ways that would make real ranks compute garbage or wait for each other
# forever. `pipeline.validate` checks every invariant first: every (stage, micro-batch) has exactly
# one F and one B, each on the rank that holds its stage; no action comes before its input on its
# own rank; and executing the lists with blocking receives cannot deadlock. Its message names the
# **first offending action** and marks it in the grid as `>2B0<`.
#
# Here are two schedules a student might write by hand for p = 4 (`as_schedule` turns plain lists
# of strings into a schedule): one with rank 2's row in the wrong order, one that forgot an action.

# %%
from parallel_lab.pipeline.actions import ScheduleError, as_schedule
from parallel_lab.pipeline.validate import validate

attempts = {
    "swapped": [["0F0", "0B0"], ["1F0", "1B0"], ["2B0", "2F0"], ["3F0", "3B0"]],
    "forgotten": [["0F0", "0B0"], ["1F0", "1B0"], ["2F0", "2B0"], ["3F0"]],
}
for name, ranks in attempts.items():
    try:
        validate(as_schedule(ranks, p=4, m=1, name=name))
    except ScheduleError as err:
        print(err, end="\n\n")

# %% [markdown]
# The same check runs inside `run_pipeline` and in every exercise check, always before a process
# starts: a broken schedule never gets the chance to hang your notebook.
#
# ### Exercise: a schedule by hand
#
# Cut the batch into two halves, micro-batches 0 and 1, and write a schedule for p = 3 ranks that
# the validator accepts: `my_schedule()` returns one list per rank r = 0, 1, 2 of action strings
# `"{stage}{F|B}{micro-batch}"` (rank r holds stage r). Every rank needs the forward and the
# backward of both micro-batches; choose the order. Think about what each action waits for: a
# forward needs the previous stage's forward of the same micro-batch, a backward the next stage's
# backward (and its own forward), and a rank runs its list in order, so a wait can go round in a
# cycle.
#
# The check validates your lists, simulates them (F = 1, B = 2) and runs them on 3 real ranks against
# one process. **What the check forbids:** any import: write the lists yourself. Keep all your code
# in the answer cell: the grader reads that cell alone.

# %% tags=["answer:hand-schedule"]
def my_schedule():
    ### BEGIN SOLUTION
    return [
        ["0F0", "0F1", "0B0", "0B1"],
        ["1F0", "1F1", "1B0", "1B1"],
        ["2F0", "2F1", "2B0", "2B1"],
    ]
    ### END SOLUTION


# %% [markdown]
# Look at your lists as the validator sees them before checking them:

# %%
from parallel_lab.show.schedules import your_schedule

your_schedule(my_schedule, p=3, m=2)

# %% tags=["check:hand-schedule", "points:1"]
from parallel_lab.exercises.hand_schedule import check_hand_schedule

verdict = check_hand_schedule(my_schedule)

# %% [markdown]
# ## 4. Run it on real ranks
#
# Now the naive schedule runs for real: 4 rank processes (lesson 01's simulated GPUs), each holding
# its stage. Every rank runs `pipeline_rank`: it rebuilds the model from the seed, keeps its own
# stage, and hands the schedule to an `Executor`, which performs exactly the actions printed above
# with a `recv` before an action that needs a neighbour's tensor and an `isend` after it (between
# ranks of one machine the executor copies the tensor through shared memory instead, because gloo
# would carry even that over the network stack, about 0.6 ms a message here). One warm-up step is
# run first and not recorded.

# %%
from parallel_lab.i18n import source
from parallel_lab.pipeline import run

print(source(run.pipeline_rank))

# %%
runs.running_naive(4)
result = run.run_pipeline("naive", 4, 1, batch=16)
runs.naive_ran(result)

# %% [markdown]
# The gradients match one process running the whole model (in fp64, exactly: same operations, same
# order). Cutting a model into stages changes *where* it runs, not *what* it computes.
#
# ## 5. Measuring the bubble: two clocks
#
# Your machine has fewer cores than there are ranks (a Binder pod has one), so the ranks take turns
# on the CPU, and a **wall-clock** timeline would show waiting that a real cluster never has. Every
# rank therefore keeps two clocks (`executor`):
#
# - the **virtual clock**: an action lasts its thread CPU time (the compute this rank really did),
#   and a message arrives at the sender's virtual time plus a modelled link cost (10 µs +
#   bytes / 25 GB/s). This is the timeline that **p dedicated devices** would show, from real
#   execution;
# - the **wall clock**: `time.perf_counter`, what *this* machine did, with ranks sharing its cores.
#
# Neither is passed off as the other. `bubble_predicted` is the simulator fed the costs this run
# measured. Your numbers will differ from the ones stored here.

# %% tags=["nbval-ignore-output"]
import os

runs.two_clocks(result, os.cpu_count(), 4)
figures.compare(result)

# %% [markdown]
# On the virtual clock the measured bubble sits on (p−1)/p = 0.75, a hair above it: the three
# modelled messages each way add a few microseconds of idle time. The filled bars (measured) lie
# inside the outlined ones (predicted). The wall clock tells a different story — the same run, drawn
# with what this machine's clock said:

# %% tags=["nbval-ignore-output"]
figures.gantt(result, clock="wall")

# %% [markdown]
# On the wall clock the bubble looks even larger: handing a tensor from one process to another,
# waking the receiving process and sharing the cores all cost time that dedicated devices would not
# spend. That is a fact about this laptop, not about the schedule. The check that does not depend on
# either clock is printed deterministically:

# %%
print("virtual-clock bubble within 0.05 of (p−1)/p:", abs(result["bubble_measured"] - 0.75) < 0.05)

# %% [markdown]
# ## 6. Try it: the schedule panel
#
# The panel draws any schedule of the course from the simulator and redraws as you move the
# sliders: the schedule, the number of ranks p, of micro-batches m, of stages per rank v, and the
# costs of F, B and W. **Run on real ranks** runs the same schedule for real and draws what was
# measured (filled) over the simulator's prediction (outlined), on the virtual clock.
#
# It starts on GPipe with one micro-batch, which is exactly the naive schedule. Things to try:
#
# 1. Change p. Does the bubble follow (p−1)/p?
# 2. Make B four times F. Does the bubble change? Why not?
# 3. Raise the number of micro-batches to 2, 4, 8 — a preview of lesson 04.

# %% tags=["nbval-ignore-output"]
figures.schedule_panel("gpipe", ranks=4, microbatches=1)

# %% [markdown]
# ## What to remember
#
# - Pipeline (inter-layer) parallelism gives each rank a run of consecutive layers; activations go
#   forward rank to rank, gradients come back, one send/recv per hop.
# - A schedule is data: per rank, an ordered list of actions (`1F0`, `1B0`). It is validated before
#   any process starts, simulated, run on real ranks and drawn — always the same object.
# - The list order is not time: an action waits for its input. The simulator turns the order into
#   a timeline.
# - With the whole batch in one piece only one rank works at a time: the bubble is (p−1)/p of the
#   device time (FAQ 4), and it grows with p.
# - Measured timelines come on two clocks: the virtual clock (p dedicated devices) and this
#   machine's wall clock. Say which one you show.
