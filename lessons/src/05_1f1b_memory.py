# %% [markdown]
# # 05 · 1F1B and why it saves memory
#
# **Learning goals.** By the end of this lesson you can
#
# - read the **1F1B** schedule (one forward, one backward; PipeDream-Flush, Narayanan et al. 2021,
#   *Memory-Efficient Pipeline-Parallel DNN Training*): warm-up forwards, a steady state that
#   alternates, a cool-down;
# - compare its step and its bubble with GPipe's, although it does the work in another order, and
#   say what sets them;
# - predict and measure how many micro-batches' activations each stage keeps at once, against
#   GPipe's m;
# - trade compute for memory with **recomputation**;
# - write the 1F1B schedule yourself, and have it validated, simulated and run on real ranks.
#
# Lesson 04 ended with GPipe's price: every stage keeps all m micro-batches' activations, the whole
# batch's worth, until its backwards begin. The bubble asks for many micro-batches; the memory
# forbids them. 1F1B resolves this.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. Same work, another order
#
# A micro-batch's activations on a stage can be freed as soon as its backward has run there. GPipe
# postpones every backward until all forwards are done; 1F1B starts each backward **as early as its
# gradient can arrive**. Stage r first runs p − r − 1 *warm-up* forwards (the time it takes the
# first micro-batch to reach the last stage and its gradient to come back), then alternates one
# forward and one backward, then runs the remaining backwards (*cool-down*). Both schedules for
# p = 4, m = 8:

# %%
from parallel_lab.pipeline.schedules import build

for name in ("gpipe", "1f1b"):
    print(f"{name}:\n{build(name, 4, 8).to_text()}\n")

# %% [markdown]
# **Predict:** which schedule finishes the step first, with a forward of 1 unit and a backward of 2:
# `"gpipe"`, `"1f1b"` or `"the same"`? Write it below and record it (not graded).

# %% tags=["answer:predict:1f1b-step"]
my_prediction = None  # "gpipe", "1f1b" or "the same": which finishes the step first, p = 4, m = 8
### BEGIN SOLUTION
my_prediction = "the same"  # the fill and the drain are on the critical path of both
### END SOLUTION

# %%
from parallel_lab.show.predict import predict

step_guess = predict("1f1b-step", my_prediction, {"en": "which schedule finishes the step first, p = 4, m = 8, "
                                                         "F = 1, B = 2",
                                                  "zh-Hant": "哪一個排程先完成一步，p = 4、m = 8、F = 1、B = 2"},
                     choices=("gpipe", "1f1b", {"en": "the same", "zh-Hant": "一樣快"}))

# %% tags=["reveals:1f1b-step"]
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.show import pipeline as figures
from parallel_lab.show import runs as runs_text

costs = Costs(F=1, B=2)
timelines = {name: simulate(build(name, 4, 8), costs) for name in ("gpipe", "1f1b")}
runs_text.steps_and_bubbles(timelines, 4, 8)
steps = {name: t.makespan for name, t in timelines.items()}
step_guess.versus("the same" if steps["gpipe"] == steps["1f1b"] else min(steps, key=steps.get), "simulated")
figures.gantt(timelines["1f1b"])

# %% [markdown]
# A tie. The bubble is set by the **critical path**, and the reordering does not touch it: the
# first micro-batch still needs p − 1 forwards before the last stage can start, and the last
# gradient still needs p − 1 backwards to get back to stage 0. In between, the last stage works
# without a gap in both schedules. So 1F1B's bubble is GPipe's, (p−1)/(m+p−1): it does not shrink
# the bubble (lessons 06 and 07 do). What it changes is memory.
#
# ## 2. Activations in flight
#
# A micro-batch is *stashed* on a stage from the start of its forward to the end of its backward.
#
# **Predict:** in 1F1B (p = 4, m = 8), which stage keeps the most micro-batches at once, and how
# many? Write the *how many* in the answer cell below and record it in the cell after it (1 point
# within ±10 %); GPipe keeps all 8 on every stage.

# %% tags=["answer:predict:1f1b-peak-stash"]
my_prediction = None  # the most micro-batches one stage keeps at once in 1F1B, p = 4, m = 8
### BEGIN SOLUTION
my_prediction = 4  # stage 0: p − r = 4 − 0
### END SOLUTION

# %% tags=["check:predict:1f1b-peak-stash"]
guess = predict("1f1b-peak-stash", my_prediction)

# %% [markdown]
# The simulator follows the stash of every stage over time (`figures.memory`):

# %% tags=["reveals:1f1b-peak-stash"]
runs_text.stash_figure(timelines["1f1b"], "1F1B", 4, 8)

# %% tags=["reveals:1f1b-peak-stash"]
guess.versus(max(timelines["1f1b"].peak_activations), "simulated")

# %% [markdown]
# Stage r runs p − r − 1 warm-up forwards and one more before its first backward, then frees one
# micro-batch for every one it starts: it never holds more than **p − r** (or m, when there are fewer
# micro-batches). Stage 0 holds the most, p. GPipe holds m everywhere, so the saving grows with m:

# %% tags=["reveals:1f1b-peak-stash"]
runs_text.peaks_table(4, (2, 4, 8, 32), costs)

# %% [markdown]
# With 1F1B the activation memory no longer grows with m, so the bubble can be made small by using
# many micro-batches. This is the schedule of Megatron-LM and of DeepSpeed's pipeline engine, and
# `torch.distributed.pipelining`'s `Schedule1F1B`.
#
# ## 3. Measured on real ranks
#
# Both schedules now run on 4 ranks with the same batch of 32 rows in 8 micro-batches. The executor
# counts, after every action, the micro-batches whose activations each stage holds, and the bytes
# those activations take; its peaks are exact, so they can be compared with the prediction as
# numbers, not as timings.

# %%
from parallel_lab.pipeline.run import run_pipeline

predicted = [min(8, 4 - r) for r in range(4)]
runs = {}
for name in ("gpipe", "1f1b"):
    runs_text.running(name, 4, 8)
    runs[name] = run_pipeline(name, 4, 8, batch=32)
one = runs["1f1b"]
runs_text.gpipe_against_1f1b(runs, predicted, 8)

# %% [markdown]
# Stage 1 keeps 3 micro-batches of 4 rows instead of 8: 3/8 of the bytes. The measured stash over
# time, on the virtual clock (the timeline of 4 dedicated devices; your times will differ, the
# heights will not):

# %% tags=["nbval-ignore-output"]
runs_text.stash_figure(one, "1F1B", 4, 8)

# %% [markdown]
# And the bubbles, measured on the virtual clock and on this machine's wall clock (lesson 03):
# equal for the two schedules, up to the noise of a real run.

# %% tags=["nbval-ignore-output"]
runs_text.measured_bubbles(runs)
figures.compare(one)

# %% [markdown]
# ## 4. Trading compute for memory: recomputation
#
# A stage can keep even less: only the *input* of each micro-batch, and run the forward again
# during the backward to rebuild the rest (activation **recomputation**, or checkpointing; GPipe
# uses it, Megatron-LM makes it selective). The stash still counts micro-batches in flight, but each
# one is much smaller; the price is one more forward per backward.
#
# **Predict:** with a backward twice as long as a forward, how many times the compute of a step
# without recomputation does a step with it need (1.5 for half as much again)? Not graded.

# %% tags=["answer:predict:recompute-compute"]
my_prediction = None  # a step's compute with recomputation / without, B = 2F (e.g. 1.5)
### BEGIN SOLUTION
my_prediction = 4 / 3  # F + (F + B) = 4 units where F + B = 3
### END SOLUTION

# %%
recompute_guess = predict("recompute-compute", my_prediction,
                          {"en": "a step's compute with recomputation against without it, B = 2F",
                           "zh-Hant": "有重新計算時一步的計算量是沒有時的幾倍，B = 2F"},
                          unit={"en": "×", "zh-Hant": "倍"}, tolerance=0.05)

# %% tags=["reveals:recompute-compute"]
runs_text.running("1F1B", 4, 8, recompute=True)
rec = run_pipeline("1f1b", 4, 8, batch=32, recompute=True)
runs_text.recompute_summary(one, rec)
again = simulate(build("1f1b", 4, 8), Costs(F=1, B=2 + 1))  # the backward runs the forward again first
recompute_guess.versus(sum(again.busy) / sum(timelines["1f1b"].busy), "simulated")

# %% [markdown]
# Stage 1 now keeps only the 32-value input rows of its micro-batches, not the intermediate results
# of its two blocks. The extra compute shows in the measured backward times (your numbers will
# differ; on a GPU the forward is about a third of F + B, so the step costs about 4/3 as much):

# %% tags=["nbval-ignore-output"]
runs_text.backward_times(one, rec)

# %% [markdown]
# ## 5. Exercise: write 1F1B yourself
#
# Write `my_one_f_one_b(p, m)`: for each rank r = 0 … p−1, the ordered list of its 1F1B actions, as
# strings `"{stage}{F|B}{micro-batch}"` (rank r holds stage r; `"2F5"` is stage 2's forward of
# micro-batch 5). For rank r:
#
# 1. **warm-up**: the forwards of micro-batches 0, 1, … — p − r − 1 of them, but never more than m;
# 2. **steady state**: while forwards are left, one forward (the next micro-batch) then one
#    backward (the oldest micro-batch not yet backwarded);
# 3. **cool-down**: the remaining backwards, in micro-batch order.
#
# It must work when m < p too (then some ranks have no steady state). The check calls your function
# for (p, m) = (2, 3), (4, 8) and (4, 2), and for each
#
# - validates the schedule (a broken one is rejected, its first offending action marked like
#   `>1B0<`, before any process starts);
# - simulates it: no stage may stash more than min(m, p − r) micro-batches, and the step must be as
#   short as 1F1B's (GPipe's order fails, and so does one micro-batch at a time);
# - runs it on 2 or 4 real ranks against the single-process model, gradients and measured stash.
#
# **What the check forbids:** the library's schedules (`one_f_one_b`, `build`): write the order
# yourself. Your function runs on a rank of its own; only the lists it returns come back. Keep all
# your code in the answer cell: the grader reads that cell alone and runs it on fresh ranks.

# %% tags=["answer:one-f-one-b"]
def my_one_f_one_b(p, m):
    ranks = []
    for r in range(p):
        ### BEGIN SOLUTION
        warmup = min(p - r - 1, m)
        actions = [f"{r}F{j}" for j in range(warmup)]
        for k in range(m - warmup):
            actions += [f"{r}F{warmup + k}", f"{r}B{k}"]
        actions += [f"{r}B{j}" for j in range(m - warmup, m)]
        ### END SOLUTION
        ranks.append(actions)
    return ranks


# %% [markdown]
# Look at what your function returns for p = 4, m = 6 before checking it, as the validator sees it
# (its grid lists each rank's actions in order):

# %%
from parallel_lab.show.schedules import your_schedule

your_schedule(my_one_f_one_b, p=4, m=6)

# %% tags=["check:one-f-one-b", "points:3"]
from parallel_lab.exercises.one_f_one_b import check_one_f_one_b

verdict = check_one_f_one_b(my_one_f_one_b)

# %% [markdown]
# ## What to remember
#
# - 1F1B runs p − r − 1 warm-up forwards on stage r, then alternates one forward and one backward,
#   then drains the backwards.
# - Its bubble is GPipe's, (p−1)/(m+p−1): the fill and the drain are on the critical path, and the
#   reordering does not shorten it.
# - Stage r keeps at most min(m, p−r) micro-batches of activations instead of m, so activation
#   memory no longer grows with m — many micro-batches (a small bubble) become affordable.
# - Recomputation keeps only each stage's input and runs the forward again in the backward: much less
#   memory for about a third more compute.
