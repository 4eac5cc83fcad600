# %% [markdown]
# # 18 · Capstone: plan it, predict it, run it, explain the gap
#
# > *Frameworks increasingly automate the hard problem of deciding how to split a model across
# > devices, using profiling and search to balance compute and communication.*
# > (框架越來越自動化地解決決定如何跨裝置劃分模型的難題，使用分析和搜尋來平衡計算和通訊。)
#
# **Learning goals.** By the end of this capstone you have handed in
#
# - a parallel plan of your own for the tiny GPT: data, pipeline and tensor degrees, a schedule,
#   micro-batches, ZeRO-1, recomputation, sequence parallelism;
# - its memory and step time predicted by the course's model (lessons 15 and 16), with constants
#   measured on this machine;
# - a run of it on real ranks that computes what one process computes, in fp64, timed;
# - a written explanation of the gap between the prediction and the measurement;
#
# and you can translate a plan into the flags and classes of **Megatron-LM**, **DeepSpeed** and
# **PyTorch**, and turn the article's practical guidance into a checklist for a real training run.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. Your plan
#
# Write `my_plan` below: a function that returns a dict of the fields of `train3d.Config` (lesson
# 11) you choose. The mesh `dp`, `pp`, `tp` (at most 8 ranks); a `schedule` of `gpipe`, `1f1b`,
# `interleaved-1f1b` (with `virtual`), `zb-h1`, `zb-v`; `microbatches`; `zero` (0, or 1 for ZeRO-1
# over the data-parallel group, lesson 12); `recompute` and `sequence_parallel` (`True` or `False`);
# the tiny GPT's `batch`, `layers`, `hidden`, `heads`, `vocab`, `seq` and `steps` (3 to 8), or their
# defaults. The rules of lesson 11 hold: at least one layer per pipeline stage, equal replicas and
# micro-batches, `heads`, `hidden` and `vocab` divisible by `tp`. Experts (lesson 13) and context
# parallelism (lesson 14) run on their own, not inside this 3D training, so a plan here does not
# choose them.
#
# Choose a plan you can argue for: one that would be worth its ranks on a real cluster, or one that
# tests a question you have (does ZeRO-1 cost time here? does a deeper pipeline pay for its bubble?).
# The grader reads `my_plan` as data: plain numbers, strings and booleans, no imports.

# %% tags=["answer:capstone"]
def my_plan():
    """Your plan: a dict of train3d.Config fields, e.g. {"dp": ..., "pp": ..., "tp": ..., ...}."""
    ### BEGIN SOLUTION
    return {"dp": 2, "pp": 2, "tp": 1, "schedule": "1f1b", "microbatches": 4, "zero": 1, "steps": 4}
    ### END SOLUTION


# %%
from parallel_lab.exercises import capstone

cfg = capstone.plan_from(my_plan)  # checked before anything starts: a broken rule is named with its values

# %% [markdown]
# ## 2. Predict it with the course's model
#
# **Memory** per device is `memory_model` (lesson 15): the weights, gradients and optimizer state of
# the busiest device's shard in fp64, plus the activations of the micro-batches its schedule keeps in
# flight. The **step time** is the planner's model (lessons 15 and 16) with constants measured on
# this machine now, as in lesson 16: this model's own FLOP/s on every rank at once, the α–β of an
# all-reduce through gloo and through shared memory, and how many cores the ranks really get.
# `predict` measures the constants and applies the model; what it prints goes into your record.

# %% tags=["nbval-ignore-output"]
prediction = capstone.predict(cfg) if cfg else None
if prediction:
    print(capstone.format_prediction(cfg, prediction))

# %% [markdown]
# ## 3. Run it on real ranks
#
# The ranks train your plan for `steps` steps, timed on the wall clock (the slowest rank, from a
# barrier), and every loss and final weight is compared with one process training the whole model
# on the whole batch in fp64. The last line of the output is your **record**: the plan, the
# prediction, the measurement and a checksum. Keep this output in the notebook you hand in: the
# grader reads the record there, runs your plan again itself, and recomputes the prediction from the
# record's constants. If you change the plan, run sections 2 and 3 again.

# %% tags=["nbval-ignore-output"]
measurement = capstone.measure(cfg, prediction) if prediction else None
if measurement:
    print(capstone.format_measurement(cfg, measurement))

# %% [markdown]
# ## 4. The gap
#
# The prediction against the measurement, and the optimizer state the ranks really hold against the
# model's (the one part of the memory this run can count exactly):

# %% tags=["nbval-ignore-output"]
if measurement:
    print(capstone.format_gap(prediction, measurement))

# %% [markdown]
# **Where to look.** A gap has a place and a cause. The place: set the model's parts (compute,
# bubble, tensor-, pipeline- and data-parallel communication, and the bound of ranks that share
# cores) beside what you measured; `prediction["time"]` holds the parts, `measurement["steps_s"]`
# every step. The cause is usually one of the model's assumptions failing on this machine, each
# stated in lesson 16 and in `validate_plans`: that every rank has a core of its own; that a step
# costs $6 \cdot \text{parameters} \cdot \text{tokens}$ FLOPs at the FLOP/s measured for one
# micro-batch; that an all-reduce of $n$ bytes costs $\alpha + n\beta$ with the constants measured
# on this machine; that nothing else runs on the machine meanwhile. Test the assumption you
# suspect: run the same plan again (is the gap stable?), run more steps, or change one thing the
# suspected part depends on (more micro-batches for the bubble, one replica for the data-parallel
# all-reduce) and see whether the gap moves the way that part says it should.
#
# Now explain the gap, in the cell below, in your own words (about 150 to 300 words): *where* it
# is, *why*, and *how you know*. Your instructor scores it by the rubric that the cell after it
# prints; nothing here scores it for you.

# %% [markdown] tags=["answer:capstone-analysis"]
# *Your analysis: replace this text with yours.*

# %% tags=["check:capstone-analysis", "points:3"]
from parallel_lab.course.grading.policy import show_rubric

show_rubric("capstone-analysis")

# %% [markdown]
# The check runs what the grader runs: your plan again on real ranks against one process, the
# model again on the record's constants, and the record's losses against the run's.

# %% tags=["check:capstone", "points:2"]
verdict = capstone.check_capstone(my_plan, measurement)

# %% [markdown]
# ## 5. The same plan in Megatron-LM, DeepSpeed and PyTorch
#
# Every technique of the course has a name in the frameworks used for real training: the table in
# [docs/frameworks.md](../docs/frameworks.md) gives each one's flag, class or config key in
# Megatron-LM, DeepSpeed and PyTorch, checked against their sources. Your plan, spelt as Megatron-LM
# command-line flags (data parallelism is what is left of the world size), and then with this
# course's library under torchrun:

# %%
from parallel_lab.parallel3d import train3d

plan = cfg or train3d.Config()  # yours, or the default plan until yours is accepted
flags = [f"--tensor-model-parallel-size {plan.tp}", f"--pipeline-model-parallel-size {plan.pp}",
         f"--micro-batch-size {plan.batch // plan.dp // plan.microbatches}",
         f"--global-batch-size {plan.batch}",
         f"--num-layers {plan.layers} --hidden-size {plan.hidden} --num-attention-heads {plan.heads}",
         f"--seq-length {plan.seq}"]
if plan.schedule == "interleaved-1f1b":
    flags.append(f"--num-layers-per-virtual-pipeline-stage {plan.layers // (plan.pp * plan.virtual)}")
if plan.sequence_parallel:
    flags.append("--sequence-parallel")
if plan.recompute:
    flags.append("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
print(f"torchrun --nproc-per-node {plan.world_size} pretrain_gpt.py \\\n    " + " \\\n    ".join(flags))
print(f"torchrun --standalone --nproc-per-node {plan.world_size} -m parallel_lab.parallel3d.train3d "
      f"--dp {plan.dp} --pp {plan.pp} --tp {plan.tp} --schedule {plan.schedule} "
      f"--microbatches {plan.microbatches}")

# %% [markdown]
# ## 6. Before you spend a budget
#
# The article closes with practical guidance: architecture decisions set performance and running
# costs for years; choose the right stack, not just the newest; better engineering choices mean fewer
# reliability incidents. And an implementation roadmap: **define latency, quality and cost targets
# before implementing; benchmark under realistic load and data; instrument monitoring of errors,
# drift and user impact; prepare rollback and incident response before scaling.** For a training run
# that reads:

# %% [markdown]
# | step | for a training run | with this course's tools |
# |---|---|---|
# | cost and budget | GPU-hours = steps × seconds per step × GPUs / 3600; price it before you start | `planner.training_cost` |
# | targets | time to train (days), quality (loss or benchmark score at the end), cost ceiling | write them down with the plan |
# | choose the stack | a framework whose names you can map (section 5), not the newest one | the table above |
# | benchmark under realistic load | a few real steps at full scale, real data and sequence lengths, on the cluster and network you will use | `train3d` with `timed=True`; lesson 11's prediction check |
# | don't optimise one benchmark | tokens/s alone hides memory headroom, stragglers, restarts | check memory, the bubble and the loss together |
# | monitoring | loss and gradient norm per step, throughput, memory, hangs (which rank, which operation) | `step k/n loss ...`; `commlog` names a hung rank's operation |
# | rollback | checkpoints to resume from; a known-good plan to fall back to; a rule for when to stop | keep the single-process check as your known-good answer |

# %% [markdown]
# What a bad plan costs, in money: GPT-3 175B (300 billion tokens, batches of 1536 × 2048 tokens)
# on 512 GPUs at an illustrative $2 per GPU-hour, for two plans the planner scores (its own model,
# lesson 16: 64 DGX H100 nodes, 396 TFLOP/s achieved per GPU, NVLink 4 in a node, InfiniBand NDR
# between nodes):

# %%
from parallel_lab.hardware import SYSTEMS
from parallel_lab.planning import memory, planner
from parallel_lab.planning.cost import step_time
from parallel_lab.show.planner import plan_cost_line

gpt3 = memory.MODELS["GPT-3 175B"]
cluster = SYSTEMS["DGX H100"].cluster(64)
for dp, pp, tp, m, schedule_name in ((8, 16, 4, 192, "zb-h1"), (16, 32, 1, 96, "gpipe")):
    t = step_time(gpt3, cluster, 1536, dp, pp, tp, m, schedule_name, recompute="selective")
    row = {"global_batch": 1536, "seq": gpt3.seq, "step_s": t["step_s"], "world_size": dp * pp * tp}
    cost = planner.training_cost(row, tokens=300e9, price_per_gpu_hour=2.0)
    print(plan_cost_line(dp, pp, tp, m, schedule_name, t["step_s"], cost))

# %% [markdown]
# Same GPUs, same model, same tokens: the second plan (no tensor parallelism, a deep GPipe pipeline
# with few micro-batches per replica) costs more for the bubble alone — before asking whether its
# activations even fit. A day of benchmarking the top few plans for real is cheap against that.

# %%
from parallel_lab.runtime import launcher

launcher.shutdown()  # stop the rank processes (a Binder pod has little memory)

# %% [markdown]
# ## What to remember
#
# - A plan is (dp, pp, tp, schedule, micro-batches, ZeRO, recomputation); check its arithmetic,
#   memory and bubble *before* launching — errors are cheapest then.
# - A correct 3D run computes what one process computes: verify it on small shapes in fp64 before
#   trusting a big run.
# - Predictions from a calibrated cost model rank plans; a short real benchmark on the target
#   hardware decides between the best few, and a gap between the two is worth explaining before it
#   is worth trusting either.
# - The same ideas carry across frameworks: Megatron-LM spells them as flags
#   (`--tensor-model-parallel-size`, `--pipeline-model-parallel-size`, ...), DeepSpeed as
#   `PipelineModule` and a JSON config, PyTorch as `DeviceMesh`, `parallelize_module` and
#   `torch.distributed.pipelining` schedules.
# - Set latency, quality and cost targets first; benchmark under realistic load; monitor; keep a way
#   back.
