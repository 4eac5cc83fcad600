# %% [markdown]
# # 07 · Zero-bubble schedules: B = I + W, ZB-H1, ZB-V and DualPipeV
#
# **Learning goals.** By the end of this lesson you can
#
# - split a backward pass into **I** (gradient for the stage input) and **W** (gradient for the
#   weights), explain how **ZB-H1** shrinks 1F1B's bubble by filling the cool-down with W's, and count
#   what it holds until each W;
# - explain the **V** placement of ZB-V (GPU r holds stages r and 2p−1−r);
# - say what **DualPipeV** (DeepSeek-V3's DualPipe, cut to the V) adds: a steady state that pairs one
#   micro-batch's forward with another's backward on the GPU's other stage, so that a
#   mixture-of-experts model's all-to-all (lesson 01 shows the collective; lesson 13 the experts) can
#   hide behind compute; and what it costs;
# - run all five schedules on real ranks, check them against one process, and compare the bubbles
#   they show with the simulator's;
# - write ZB-H1 yourself.
#
# You need lessons 03-06: schedules as per-rank lists of actions such as `1F3` (stage 1, forward,
# micro-batch 3), the simulator, the Gantt charts, and lesson 06's two ideas against 1F1B's bubble:
# make the slots shorter (interleaving, lesson 06) or **fill them** (this lesson). Notation: p GPUs
# (ranks), m micro-batches, F and B the time of one stage's forward and backward of one micro-batch.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# 1F1B on 4 GPUs with 8 micro-batches, F = 2 and B = 4, as lesson 06 left it: every GPU idles
# (p−1)·(F+B) = 18 units of a step of 66.

# %%
from parallel_lab.pipeline.actions import format_grid
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.show import pipeline as figures
from parallel_lab.show import schedules as schedule_figures
from parallel_lab.show.schedules import idle_report, stage_map

p, m = 4, 8
ideal = m * (2 + 4)  # m·(F+B): the work of one GPU
one_f_one_b = simulate(build("1f1b", p, m), Costs(F=2, B=4))
idle_report("1F1B, p = 4, m = 8", one_f_one_b)

# %% [markdown]
# ## 1. Splitting the backward: B = I + W
#
# Look at what the backward of one linear layer `Y = X·Wᵀ + b` computes from the gradient `dY` that
# arrives from the next stage:
#
# - **I**, the input gradient `dX = dY·W`: the *previous* stage is waiting for it;
# - **W**, the weight gradient `dW = dYᵀ·X` (and `db`): nobody needs it before the optimizer step at
#   the end of the whole pipeline step.
#
# Qi et al. 2023 (*Zero Bubble Pipeline Parallelism*) schedule them as separate actions: I as early
# as possible, W whenever the GPU would otherwise wait. In `parallel_lab`, I computes the input
# gradient and keeps what W needs — every Linear's input `X` and output gradient `dY` — and W later
# turns those into weight gradients, for a Linear one matrix product. A stage of any model (the GPT's)
# runs I as one autograd pass to its input and to the output of every layer, which computes no
# weight gradient (`worker.StageWorker`). The MLP of these lessons runs **by hand** instead
# (`chain.ChainWorker`): its I walks the chain of Linear and GELU backwards with the very operations
# autograd would run, in the same order — so the gradients are the same to the last bit — but
# without building a graph in F, which on micro-batches this small costs about as much as the
# arithmetic. This is the I the MLP runs, then the W every stage runs:

# %%
from parallel_lab.i18n import source
from parallel_lab.pipeline import chain, worker

print(source(worker.StageWorker.input_grad))
print(source(chain.ChainWorker._input_grads))
print(source(worker.StageWorker.weight_grad))
print(source(worker._weight_grads))

# %% [markdown]
# **ZB-H1** keeps 1F1B's order of forwards and input gradients, but GPU r holds back its first r
# W passes; the deferred W's fill the cool-down, where 1F1B waits for gradients. With F = I = W
# (here 2 units each, so B = I + W = 4 as before) each GPU idles (p−1)·(F + I − W) instead of
# (p−1)·(F + B): the bubble is (p−1)/(3m) of the ideal time.
#
# **Predict** ZB-H1's bubble — the idle share of the step — for p = 4 and m = 8 with F = I = W = 2
# units, before the simulator draws it (1F1B's was 27.3 %). Write it below (graded: 1 point within
# ±10 %).

# %% tags=["answer:predict:zb-h1-bubble"]
my_prediction = None  # ZB-H1's idle share of the step, p = 4, m = 8, F = I = W (a fraction, e.g. 0.2)
### BEGIN SOLUTION
my_prediction = 3 / 27  # idle (p−1)·F = 6 per GPU against 48 of work: 6 / 54
### END SOLUTION

# %% tags=["check:predict:zb-h1-bubble"]
from parallel_lab.show.predict import predict

guess = predict("zb-h1-bubble", my_prediction)

# %% tags=["reveals:zb-h1-bubble"]
zb_h1 = simulate(build("zb-h1", p, m), Costs(F=2, B=4, I=2, W=2))
idle_report("ZB-H1", zb_h1, "(p−1)/(3m)", ideal)
guess.versus(zb_h1.bubble_fraction, "simulated")
figures.gantt(zb_h1).update_xaxes(range=[0, 68])

# %% [markdown]
# Orange bars are I, purple ones W. The last GPU runs I right after each F (its gradient comes from
# the loss), and the W's fill what used to be the tail of the step.
#
# **What does that cost in memory?** A micro-batch's activations, M_B, are kept from its F. I frees
# only part of them: W computes `dW = dYᵀ·X` for every Linear, so it still needs each Linear's input
# `X` and output gradient `dY` — M_W, most of M_B: 32sbh of 34sbh + 5as²b for a transformer layer
# (Qi et al. 2023, Table 1), 32/34 once the attention scores are not stored. **Predict:** GPU 3
# runs `3I0` at time 8 in the chart above and `3W0` at time 22. How many micro-batches' activations does
# GPU 3 hold at its peak, in units of M_B, counting a micro-batch until its W? (1F1B's GPU 3: 1.)

# %% tags=["answer:predict:zb-h1-last-gpu-memory"]
my_prediction = None  # GPU 3's peak under ZB-H1, p = 4, m = 8, in micro-batches (M_B)
### BEGIN SOLUTION
my_prediction = 1 + 3 * 32 / 34  # one micro-batch whole, three waiting for their W
### END SOLUTION

# %%
memory_guess = predict("zb-h1-last-gpu-memory", my_prediction,
                       {"en": "ZB-H1's peak activations on GPU 3 of 4, m = 8, counted until W",
                        "zh-Hant": "ZB-H1 在 4 個 GPU 中 GPU 3 上的激活值高峰，m = 8，算到 W 為止"},
                       unit={"en": "micro-batches (M_B)", "zh-Hant": "個微批次（M_B）"}, tolerance=0.1)

# %% tags=["reveals:zb-h1-last-gpu-memory"]
share = simulate(build("zb-h1", p, m)).w_share  # M_W / M_B: the paper's 32/34
schedule_figures.zb_h1_stash_table(one_f_one_b, zb_h1, share)
memory_guess.versus(zb_h1.peak_rank_activations[3], "simulated")

# %% [markdown]
# GPU r holds back r weight passes, so at its peak it holds p − r micro-batches whole and r waiting
# for their W: (p − r)·M_B + r·M_W. GPU 0 peaks at p·M_B, exactly 1F1B's worst GPU — which is what
# the paper's "the same peak memory as 1F1B" means, a maximum over GPUs — but every other GPU holds
# nearly p·M_B where 1F1B's holds (p − r)·M_B: GPU 3 about 3.8 micro-batches instead of 1. The
# planner (lesson 15) counts ZB-H1 this way. (Freeing at I, as if W needed nothing, would make
# ZB-H1 look exactly like 1F1B: [4, 3, 2, 1].)
#
# ## 2. ZB-V: two stages per GPU, in a V
#
# ZB-V (same paper, §6) cuts the model into 2p stages like interleaving with v = 2, but places them in
# a **V**: GPU r holds stage r on the way down and stage 2p−1−r on the way back up. GPU 0 holds the
# first *and the last* stage; GPU p−1 holds the two middle ones, so the turn at the bottom of the V
# needs no message. **Predict:** GPU 1 holds stage 1 on the way down; which stage does it hold on
# the way back up when p = 4 (not graded)?

# %% tags=["answer:predict:zb-v-up-stage"]
my_prediction = None  # the stage GPU 1 holds on the way up, p = 4 (8 stages, numbered 0-7)
### BEGIN SOLUTION
my_prediction = 6  # 2p − 1 − r = 8 − 1 − 1
### END SOLUTION

# %%
stage_guess = predict("zb-v-up-stage", my_prediction, {"en": "the stage GPU 1 holds on the way up of ZB-V's V, p = 4",
                                                       "zh-Hant": "ZB-V 的 V 形上行時 GPU 1 持有的階段，p = 4"},
                      tolerance=0)

# %% tags=["reveals:zb-v-up-stage"]
zb_v = build("zb-v", p, m)
stage_map(zb_v)
stage_guess.versus(max(s for s, r in enumerate(zb_v.stage_to_rank) if r == 1), "reference")
zb_v_t = simulate(zb_v, Costs(F=1, B=2, I=1, W=1))
idle_report("ZB-V", zb_v_t)
schedule_figures.stash_and_messages([("ZB-V", zb_v, zb_v_t)])
figures.gantt(zb_v_t).update_xaxes(range=[0, 68])

# %% [markdown]
# GPU 1 holds stages 1 and 6. The V gives every GPU the same memory: each holds one early stage
# (many micro-batches in flight) and one late stage (few), 4 stages' worth in all, counted until W —
# 1F1B's worst GPU, but on every GPU, so no GPU is the memory bottleneck. It sends fewer messages
# than interleaving (the turn is local) and, with half-size slots that W passes fill, has the
# smallest bubble of the four. DeepSeek-V3's schedule, next, keeps this placement and changes the
# order.
#
# ## 3. DualPipeV: a forward and another micro-batch's backward, side by side
#
# DeepSeek-V3 (DeepSeek-AI 2024, *DeepSeek-V3 Technical Report*, §3.2.1) trains with **DualPipe**, a
# *bidirectional* pipeline: half the micro-batches enter at GPU 0 and flow towards GPU p−1, half
# enter at GPU p−1 and flow back, so the fill of one direction overlaps the drain of the other. Each
# GPU holds a stage of each direction: two copies of the model's parameters. **DualPipeV** (the
# "cut-in-half" V form in github.com/deepseek-ai/DualPipe, PyTorch's `ScheduleDualPipeV`) keeps one
# copy on ZB-V's placement, GPU r holding stages r and 2p−1−r: the two directions are the V's arms.
#
# Which comparison is meant matters here. DeepSeek's README compares at the **same number of
# stages** PP: DualPipe on PP GPUs and DualPipeV on PP/2 GPUs both hold 2× the parameters per GPU of
# 1F1B's one stage. At the **same number of GPUs** p, as in this lesson, DualPipeV's two half-size
# stages are what 1F1B's one stage holds (1×), and only DualPipe pays 2×.

# %% [markdown]
# What DualPipeV adds to ZB-V is its steady state: each forward is **paired** with the backward of
# *another* micro-batch on the GPU's *other* stage. DeepSeek-V3 is a mixture-of-experts model: every
# chunk's forward and backward contain expert-parallel all-to-alls (tokens sent to their experts'
# GPUs and back). DeepSeek's system runs the two halves of a pair *at the same time*, so that the
# forward's all-to-all hides behind the backward's compute and vice versa.
#
# The course's executor runs a pair **one after the other**: the forward, then the input and weight
# gradients — as PyTorch's runtime does with its paired action (`OVERLAP_F_B`) unless a custom
# overlap function is registered. Here DualPipeV is an order of actions; the overlap it was made
# for is not in our timelines. The grid, and GPU 0's pairs:

# %%
dualpipe = build("dualpipe-v", p, m)
stage_map(dualpipe)
print(format_grid(dualpipe, rows=(0, 29)))
schedule_figures.pairs(dualpipe, rank=0)

# %% [markdown]
# The warm-up runs forwards of the down stage, then the up stage's first micro-batches, each one's
# I and W right after it (GPU 0's `7F0 7I0 7W0 7F1 …`). Every backward is split, I then W at once,
# until the cool-down, where the later GPUs defer some W's to fill the drain, as ZB-V does.
#
# **Predict:** at ZB-V's costs (F = I = W = 1 per model stage), with each pair run one after the
# other, is DualPipeV's bubble for p = 4 and m = 8 `"smaller"` than ZB-V's above, `"the same"`, or
# `"larger"`? (Not graded.)

# %% tags=["answer:predict:dualpipe-v-bubble"]
my_prediction = None  # "smaller", "the same" or "larger" than ZB-V's bubble, p = 4, m = 8, F = I = W = 1
### BEGIN SOLUTION
my_prediction = "the same"  # run one after the other, a pair is ZB-V's work in another order
### END SOLUTION

# %%
dualpipe_guess = predict("dualpipe-v-bubble", my_prediction,
                         {"en": "DualPipeV's bubble against ZB-V's, p = 4, m = 8, F = I = W = 1 per model stage",
                          "zh-Hant": "DualPipeV 的氣泡與 ZB-V 的相比，p = 4、m = 8、每個模型階段 F = I = W = 1"},
                         choices=({"en": "smaller", "zh-Hant": "較小"}, {"en": "the same", "zh-Hant": "一樣"},
                                  {"en": "larger", "zh-Hant": "較大"}))

# %% tags=["reveals:dualpipe-v-bubble"]
dualpipe_t = simulate(dualpipe, Costs(F=1, B=2, I=1, W=1))
idle_report("DualPipeV", dualpipe_t)
difference = dualpipe_t.bubble_fraction - zb_v_t.bubble_fraction
dualpipe_guess.versus("the same" if abs(difference) < 1e-9 else "smaller" if difference < 0 else "larger",
                      "simulated")
schedule_figures.deepseek_bubble(p, F=1, I=1, W=1, simulated=dualpipe_t.makespan - dualpipe_t.busy[0])
schedule_figures.peaks_in_stages({"DualPipeV": dualpipe_t, "ZB-V": zb_v_t})
figures.gantt(dualpipe_t).update_xaxes(range=[0, 68])

# %% [markdown]
# Run one after the other, the pairs change the order, not the bubble: DualPipeV idles exactly as
# ZB-V does at these costs. DeepSeek's README gives DualPipeV's bubble as (PP/2 − 1)(F&B + B − 3W)
# with PP = 2p stages, F&B a pair's time and B a full backward: (p − 1)(F&B + B − 3W). It counts a
# pair as one block that starts once *both* its inputs are there and ends as one; the simulator runs
# a pair as two actions, so the forward starts without waiting for its partner's gradient, and the
# gradient leaves at the end of I. Hence, at these costs, p − 1 idle units per GPU against the
# formula's 2(p − 1) with F&B = F + B.

# %% [markdown]
# What DualPipeV costs:
#
# - **m ≥ 2p**, PyTorch's own check (at least one micro-batch per model stage): rank r's steady
#   state has m − 2p + r + 1 pairs of pairs, so at m = 2p − 1 rank 0 would have none, and fewer below;
# - **a little more activation memory**: counted until W, every GPU peaks at 2p + 1 half-size stashes
#   (one micro-batch on one model stage) where ZB-V peaks at 2p — half a stage more in the printout's
#   whole-stage units — because a pair's forward starts before its partner's backward has freed
#   anything. DeepSeek counts the same kind of extra: PP + 1 against 1F1B's PP (the report's
#   Table 2, the README's table);
# - with an input gradient dearer than the weight gradient, ZB-V fills the drain better than
#   DualPipeV's pairs do; DualPipe's gain, the hidden all-to-all, is what these timelines leave out.

# %% tags=["reveals:zb-h1-bubble"]
try:
    build("dualpipe-v", 4, 7)
except ValueError as err:
    print(err)
slow_i = Costs(F=1, B=3, I=2, W=1)  # an input gradient twice the weight gradient
schedule_figures.with_costs(("zb-v", "dualpipe-v"), p, m, slow_i, "I = 2W")

# %% [markdown]
# ## 4. Side by side
#
# All five with F = I = W per model stage (B = 2F), for a few pipeline shapes. *Peak stash* is the
# most activations any one GPU holds, in whole-stage units (chunks / v); *messages* counts the
# activations and gradients sent between GPUs in one step.

# %% tags=["reveals:zb-h1-bubble"]
five = schedule_figures.SCHEDULES + (("dualpipe-v", 2),)
print(schedule_figures.schedule_table(schedule_figures.compare_schedules([(4, 8), (4, 16), (8, 16)], five)))

# %% [markdown]
# The idle/compute column follows the closed forms: (p−1)/m for 1F1B, (p−1)/(v·m) for interleaving,
# (p−1)/(3m) for ZB-H1; DualPipeV's equals ZB-V's, for half a stage more at the peak and the same
# messages (the same V). The same bubbles against the number of micro-batches on 4 GPUs
# (interleaving needs m a multiple of 4, DualPipeV m ≥ 8; its dashed line lies on ZB-V's):

# %%
schedule_figures.bubble_curves(ranks=4, schedules=five + (("interleaved-1f1b", 4),))

# %% [markdown]
# ### Try it
#
# Pick a schedule, the number of GPUs p, micro-batches m, chunks v and the F:B:W costs. Things to
# find:
#
# 1. With W = 0.5 (a cheap weight gradient) and B = 2, how much of ZB-H1's advantage over 1F1B is
#    left? Why?
# 2. Which schedule's bubble depends on v? What happens to interleaving when m is not a multiple of p?
# 3. With the button, run the schedule you picked on real ranks and see its measured Gantt.

# %% tags=["nbval-ignore-output"]
figures.schedule_panel("zb-v", ranks=4, microbatches=8)

# %% [markdown]
# ## 5. On real ranks
#
# The same five schedules now run on 4 simulated GPUs: each rank rebuilds its stages of an 8-layer
# MLP (fp64), runs exactly the actions printed above with real send/recv, and the gradients are
# compared with one process running the whole batch (`run_pipeline`, lessons 03-05). The activations
# each stage held (counted until W, with the M_W / M_B this model's tensors measured) are compared
# with the simulator's, and `bytes_sent` is what each rank really sent.

# %%
from parallel_lab.pipeline.run import run_pipeline

runs = {}
for name, v in five:
    runs[name] = run_pipeline(name, 4, 8, virtual=v)
    schedule_figures.run_report(name, v, runs[name])

# %% [markdown]
# Every schedule computes exactly the gradients of one process — a schedule changes *when* work
# happens, never *what* is computed — and keeps the activations the simulator predicted. Interleaving
# sends 112 messages where 1F1B sends 48 (each 4 rows × 32 values × 8 bytes), ZB-V 96, and DualPipeV
# as many as ZB-V (the same V). DualPipeV's pairs run one after the other here, F then I and W: the
# same gradients as one process, in PyTorch's order.
#
# Now the bubbles, measured on the **virtual clock** (each action lasts its measured CPU time — the
# median over 5 recorded steps — and a message arrives after a modelled link: what 4 dedicated
# devices would show) against the simulator fed with the measured costs (per kind of action and
# stage, and per kind of action run before it: on a CPU a backward right after a forward costs more
# than one after a backward). They agree within 10 %; the numbers change from run to run. On this
# tiny model an action costs a fraction of a millisecond, mostly Python; W (one matrix product per
# Linear) is cheaper than I, so ZB-H1 fills less of the bubble than with F = I = W — the prediction,
# which uses the measured costs, says the same.

# %% tags=["nbval-ignore-output"]
schedule_figures.measured_bubbles(runs)
figures.compare(runs["zb-v"])

# %% [markdown]
# ## 6. Exercise: write ZB-H1 yourself
#
# Write `my_zb_h1(p, m)`: for each rank r, the ordered list of its ZB-H1 actions, as strings
# `"{stage}{F|I|W}{micro-batch}"` (rank r holds stage r; `"2I5"`: stage 2's I of micro-batch 5).
# Start from lesson 05's 1F1B with every backward split into I and W; then, on rank r:
#
# 1. **warm-up**: the forwards of micro-batches 0, 1, … — p − r − 1 of them, but never more than m;
# 2. **one I at a time**, for k = 0, 1, …, m − 1: the next forward while forwards are left, then the
#    I of micro-batch k; once r input gradients are ahead, the W of micro-batch k − r right after;
# 3. **the deferred W's**: those still missing (of the last min(r, m) micro-batches), in order.

# %% [markdown]
# The check calls your function for (p, m) = (2, 4), (4, 8) and (4, 3), and for each
#
# - validates it (the first offending action marked like `>1I0<`); every backward split, no B;
# - simulates it with F = I = W = 1: no rank may idle longer than in ZB-H1 (each W right after its I
#   fails), and, counted until W, no stage may hold more (extra warm-up forwards fail, and so do
#   more than r deferred W's);
# - runs it on 2 or 4 real ranks against the single-process model.
#
# **What the check forbids:** the library's schedules (`zb_h1`, `build`; no import of `parallel_lab`).
# Your function runs on a rank of its own. Keep all your code in the answer cell: the grader reads
# that cell alone.

# %% tags=["answer:zb-h1-order"]
def my_zb_h1(p, m):
    ranks = []
    for r in range(p):
        ### BEGIN SOLUTION
        warmup = min(p - r - 1, m)
        actions = [f"{r}F{j}" for j in range(warmup)]
        for k in range(m):
            if warmup + k < m:
                actions.append(f"{r}F{warmup + k}")
            actions.append(f"{r}I{k}")
            if k >= r:
                actions.append(f"{r}W{k - r}")
        actions += [f"{r}W{j}" for j in range(max(m - r, 0), m)]
        ### END SOLUTION
        ranks.append(actions)
    return ranks


# %% [markdown]
# Look at what your function returns for p = 4, m = 6 before checking it, as the validator sees it
# (its grid lists each rank's actions in order):

# %%
from parallel_lab.show.schedules import your_schedule

your_schedule(my_zb_h1, p=4, m=6)

# %% tags=["check:zb-h1-order", "points:2"]
from parallel_lab.exercises.zb_h1_order import check_zb_h1_order

verdict = check_zb_h1_order(my_zb_h1)

# %%
from parallel_lab.runtime import launcher

launcher.shutdown()  # stop the rank processes (a Binder pod has little memory)

# %% [markdown]
# ## What to remember
#
# - Zero-bubble schedules fill 1F1B's idle slots instead of shortening them (lesson 06).
# - A backward is **I** (input gradient, on the critical path) plus **W** (weight gradient, needed only
#   by the optimizer). **ZB-H1** defers W's into the cool-down: bubble (p−1)/(3m) with F = I = W.
#   A deferred W keeps M_W (most of M_B) until it runs: GPU r holds (p−r)·M_B + r·M_W, 1F1B's peak
#   on GPU 0 and nearly that on every other GPU.
# - **ZB-V** places stages r and 2p−1−r on GPU r: half-size slots filled with W's, the same memory on
#   every GPU, and a local turn at the bottom of the V.
# - **DualPipeV** (DeepSeek-V3's bidirectional DualPipe, cut to ZB-V's V) pairs each forward with
#   another micro-batch's backward on the GPU's other stage, so that DeepSeek's system can hide a
#   mixture-of-experts all-to-all behind the other half's compute. Run one after the other, as here
#   and in PyTorch without a custom overlap function, it idles like ZB-V at equal costs; it needs
#   m ≥ 2p and holds one more half-size stash per GPU than ZB-V (2p + 1, counted until W).
# - Whatever the schedule, the gradients are exactly those of one process: schedules move work in
#   time, they never change what is computed.
