# %% [markdown]
# # 06 · Interleaved 1F1B: thinner slots
#
# > *Dividing the batch into micro-batches lets several micro-batches occupy different stages at
# > once, keeping all GPUs busy and reducing idle time.*
# > (將批次劃分為微批次可以讓多個微批次同時佔據不同的階段，從而保持所有 GPU 繁忙並減少空閒時間。)
#
# **Learning goals.** By the end of this lesson you can
#
# - say why 1F1B still idles for (p−1)/m of its compute time, and name the two ways to shrink that
#   bubble *without* more micro-batches: make the fill and drain slots shorter, or fill them with work
#   nobody waits for (lesson 07);
# - read **interleaved 1F1B** (Megatron-LM): v model chunks per GPU, where the chunks go and where a
#   micro-batch travels, and what its bubble, its messages and its memory are.
#
# You need lessons 03-05 (the assembly line and the bubble, micro-batching and GPipe, 1F1B):
# schedules as per-rank lists of actions such as `1F3` (stage 1, forward, micro-batch 3), the
# simulator, and the Gantt charts. Notation: p GPUs (ranks), m micro-batches, F and B the time of one
# stage's forward and backward of one micro-batch.

# %%
from parallel_lab.course.notebook import setup

setup(ranks=False)

# %% [markdown]
# ## 1. Where 1F1B's bubble comes from
#
# Take 4 GPUs, 8 micro-batches, a forward that takes 2 time units and a backward that takes 4 (the
# usual B ≈ 2F). Every GPU does the same work, m·(F+B) = 48 units, and every GPU idles the same
# (p−1)·(F+B) = 18 units — but not in the same places. GPU r waits r forward slots (r·F) for the
# first activation to reach it, and finishes r backward slots (r·B) before the step ends, when
# GPU 0 runs the last backward; the rest, (p−1−r)·(F+B), are gaps in between, where it waits for a
# gradient. GPU 0 idles only in between, GPU p−1 only at the two ends:

# %%
from parallel_lab.pipeline.actions import format_grid
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.show import pipeline as figures
from parallel_lab.show.schedules import idle_report, stage_map, stash_and_messages

p, m = 4, 8
ideal = m * (2 + 4)  # m·(F+B): the work of one GPU
one_f_one_b = simulate(build("1f1b", p, m), Costs(F=2, B=4))
idle_report("1F1B, p = 4, m = 8", one_f_one_b, "(p−1)/m", ideal, where=True)
figures.gantt(one_f_one_b).update_xaxes(range=[0, 68])

# %% [markdown]
# More micro-batches shrink (p−1)/m, but m is not free: the global batch size is fixed by the
# optimisation (a larger one changes the training), so more micro-batches means smaller ones, and a
# GPU runs small matrix products inefficiently. The idle time itself is p−1 *slots*. Two ideas
# attack the slots:
#
# 1. **make every slot shorter**: give each GPU several thin pieces of the model instead of one thick
#    one (interleaving, section 2);
# 2. **fill the slots**: part of the backward pass is work that no other GPU waits for; do it in the
#    gaps (zero bubble, lesson 07).
#
# ## 2. Interleaved 1F1B: v thin chunks per GPU
#
# Megatron-LM (Narayanan et al. 2021, *Efficient Large-Scale Language Model Training on GPU Clusters*)
# cuts the model into p·v **chunks** (model stages) instead of p, and places chunk s on GPU s mod p.
# With p = 4 and v = 2, GPU 0 holds chunks 0 and 4: the first and the fifth eighth of the layers. A
# micro-batch goes around the GPUs v times. **Predict:** which GPU sends chunk 3's output to chunk 4
# (write its number; not graded)?

# %% tags=["answer:predict:chunk-3-sender"]
my_prediction = None  # the GPU that holds chunk 3 and sends its output to chunk 4, p = 4, v = 2
### BEGIN SOLUTION
my_prediction = 3  # chunk s lives on GPU s mod p: chunk 3 on GPU 3, chunk 4 back on GPU 0
### END SOLUTION

# %%
from parallel_lab.show.predict import predict

guess = predict("chunk-3-sender", my_prediction, {"en": "the GPU that sends chunk 3's output to chunk 4, p = 4, v = 2",
                                                  "zh-Hant": "把區塊 3 的輸出送給區塊 4 的是哪個 GPU，p = 4、v = 2"},
                unit="GPU", tolerance=0)

# %% tags=["reveals:chunk-3-sender"]
interleaved = build("interleaved-1f1b", p, m, virtual=2)
stage_map(interleaved)
print(format_grid(interleaved, rows=(0, 12)))
guess.versus(interleaved.stage_to_rank[3], "reference")

# %% [markdown]
# GPU 3 sends chunk 3's output back to GPU 0, which holds chunk 4. The grid shows Megatron's order:
# micro-batches move through the chunks in groups of p — `0F0 … 0F3` on chunk 0, then `4F0 … 4F3` on
# chunk 4 — so Megatron-LM's default order, which the course copies, needs m divisible by p. That is
# the grouping's constraint, not interleaving's: since late 2024 Megatron-LM takes the group size N
# as `--microbatch-group-size-per-virtual-pipeline-stage` (default p; its `schedules.py` asks
# p ≤ N ≤ m, and m mod N either 0 or at least p), and PyTorch's `ScheduleInterleaved1F1B` asks only
# that m be a multiple of its rounds, max(1, ⌊m/p⌋). After a longer warm-up each GPU alternates one
# forward and one backward, as in 1F1B.
#
# Each chunk has half a stage's layers, so its forward takes 1 unit and its backward 2. The total
# work per GPU is the same 48 units; the fill and drain are now made of half-size slots:

# %%
interleaved_t = simulate(interleaved, Costs(F=1, B=2))
idle_report("interleaved 1F1B, v = 2", interleaved_t, "(p−1)/(v·m) = 3/16", ideal, digits=4)
figures.gantt(interleaved_t).update_xaxes(range=[0, 68])

# %% [markdown]
# Lighter bars are a GPU's second chunk. The bubble halves: idle per GPU (p−1)·(F+B)/v. It is not
# free:
#
# - **more messages**: a micro-batch now crosses p·v − 1 chunk boundaries instead of p − 1, each
#   one an activation forward and a gradient backward — about v times the point-to-point traffic
#   (`communication.messages` counts the sends of one step from the schedule);
# - **more activation memory on the first GPUs**: GPU 0 starts 11 chunk-forwards (5.5 stages' worth)
#   before its first backward arrives, against 4 in 1F1B;
# - with Megatron-LM's default grouping (the course's), m must be a multiple of p.

# %%
stash_and_messages([("1f1b", build("1f1b", p, m), one_f_one_b), ("interleaved v=2", interleaved, interleaved_t)])

try:
    build("interleaved-1f1b", 4, 6, virtual=2)
except ValueError as err:
    print(err)

# %% [markdown]
# ## What to remember
#
# - 1F1B idles (p−1)·(F+B) per GPU — GPU r r·F at the start, r·B at the end, the rest in between: a
#   bubble of (p−1)/m of the compute time. Without raising m, you can shrink the slots (here) or fill
#   them (lesson 07).
# - **Interleaved 1F1B** gives each GPU v chunks (chunk s on GPU s mod p): bubble (p−1)/(v·m), for
#   about v times more point-to-point messages, more activations on the first GPUs, and (with
#   Megatron-LM's default grouping of p micro-batches) m divisible by p.
