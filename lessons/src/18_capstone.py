# %% [markdown]
# # 18 · Capstone: plan it, predict it, train it, check it
#
# > *Frameworks increasingly automate the hard problem of deciding how to split a model across
# > devices, using profiling and search to balance compute and communication.*
# > (框架越來越自動化地解決決定如何跨裝置劃分模型的難題，使用分析和搜尋來平衡計算和通訊。)
#
# **Learning goals.** By the end of this capstone you can
#
# - choose a complete parallel plan — data, pipeline and tensor degrees, schedule, micro-batches,
#   recomputation — and say *before running it* whether it is valid, how much memory each device
#   needs and how large its pipeline bubble is;
# - train the tiny GPT with that plan on real ranks and prove it computes what one process computes;
# - compare the predicted step time with the measured one;
# - translate the plan into the flags and classes of **Megatron-LM**, **DeepSpeed** and **PyTorch**;
# - turn the article's practical guidance (cost and budget, targets, realistic benchmarks,
#   monitoring, rollback) into a checklist for a real training run.
#
# Everything here uses what the course built: the mesh and 3D training of lesson 11, the schedules
# and simulator of the pipeline lessons, the memory model of lesson 00, and the cost model and the
# planner of lessons 15 and 16.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. Your plan
#
# Edit the cell below and run the lesson from here on. The rules you learnt (lesson 11) still hold:
# `dp · pp · tp` ranks, at most 8 on this machine; at least one layer per pipeline stage; the batch
# splits into `dp` equal replicas, each into `microbatches` equal micro-batches; `heads`, `hidden` and
# `vocab` divisible by `tp`. Try a plan that breaks one of them, too: the next cell says which.
# Schedules: `gpipe`, `1f1b`, `interleaved-1f1b` (with `virtual=2`), `zb-h1`, `zb-v`.

# %%
from parallel_lab.parallel3d import train3d
from parallel_lab.show import train3d as train3d_figures

my_plan = train3d.Config(
    dp=1, pp=2, tp=2,             # the mesh: dp x pp x tp ranks
    schedule="1f1b", virtual=1,   # the pipeline schedule (virtual: stages per rank, interleaved only)
    microbatches=4,               # per replica and step
    recompute=False,              # keep only stage inputs, redo the forward in the backward
    sequence_parallel=False,      # Megatron's sequence parallelism inside the TP group
    batch=8, layers=4, hidden=32, heads=4, vocab=64, seq=16,  # the tiny GPT and its batch
    optimizer="adam", lr=0.01, steps=4,
)
memory_limit_gb = 0.01  # per device: a pretend small GPU, so that memory can be what refuses a plan

# %% [markdown]
# ## 2. Is it valid? Checked before anything starts

# %%
from parallel_lab.pipeline.schedules import ScheduleError

try:
    schedule = train3d.check(my_plan, memory_limit_gb=memory_limit_gb)
    print(f"plan accepted: {my_plan.describe()}")
except (ValueError, ScheduleError) as err:
    schedule = None
    print(f"plan refused: {type(err).__name__}: {err}")

# %% [markdown]
# ## 3. Predictions: memory, bubble, step time
#
# **Memory** per device comes from `memory_model` (weights, gradients and optimizer state of the
# device's shard in fp64, plus the activations of the micro-batches the schedule keeps in flight);
# the **bubble** from the schedule simulator with equal stage costs (backward = 2 × forward). Both
# are pure arithmetic: the same on every machine.

# %%
from parallel_lab.parallel3d import config
from parallel_lab.pipeline.actions import format_grid
from parallel_lab.pipeline.simulate import summary
from parallel_lab.planning import memory

if schedule is not None:
    need = config.predicted_memory(my_plan)
    parts = ", ".join(f"{k} {need[k] / 1e3:,.1f} kB" for k in ("weights", "gradients", "optimizer", "activations"))
    print(f"busiest device (pipeline stage {need['stage']}): {need['total'] / 1e3:,.1f} kB = {parts}; "
          f"{need['in_flight']} micro-batch(es) in flight")
    sim = summary(schedule)
    print(f"{schedule.name} on {my_plan.pp} pipeline ranks, {my_plan.microbatches} micro-batches: "
          f"bubble {sim['bubble_fraction']:.1%} of the device time, peak stashed micro-batches per stage "
          f"{sim['peak_activations']}")
    print(format_grid(sim["ranks"]))

# %% [markdown]
# The **step time** is the planner's model (lesson 15) with constants measured on this machine now
# (`validate_plans.calibrate`: all-reduce α–β through gloo and through shared memory, the two ways
# the ranks of one machine send here, and how many ranks really compute at once) and this
# model's own FLOP/s, as in lesson 11 section 6. The tiny GPT runs in fp64 here; its numbers are
# yours and change from run to run.

# %% tags=["nbval-ignore-output"]
from parallel_lab.parallel3d import validate_plans

if schedule is not None:
    calibration = validate_plans.calibrate(my_plan.world_size) if my_plan.world_size > 1 else None
    if calibration is None:
        calibration = {"tflops": 1.0, "latency_us": 0.0, "intra_gbps": 1.0}  # one rank: no communication
    tflops = validate_plans.workload_tflops(my_plan)
    cluster = validate_plans.cluster_from(calibration, my_plan.world_size, value_bytes=8, tflops=tflops)
    near = validate_plans.cluster_from(calibration, my_plan.world_size, value_bytes=8, tflops=tflops, near=True)
    predicted = validate_plans.predict(my_plan, cluster, calibration.get("effective_cores"), near)
    print(f"predicted step: {predicted['step_s'] * 1e3:.1f} ms (compute {predicted['compute_s'] * 1e3:.1f} ms, "
          f"TP {predicted['tp_comm_s'] * 1e3:.1f} ms, bubble {predicted['bubble_s'] * 1e3:.1f} ms, "
          f"PP {predicted['pp_comm_s'] * 1e3:.1f} ms, DP {predicted['dp_comm_s'] * 1e3:.1f} ms per device)")

# %% [markdown]
# ## 4. Train it for real, and check it
#
# The ranks start (a few seconds the first time), train `my_plan.steps` steps, and every step's loss
# and every final weight are compared with one process training the whole model on the whole batch
# with the same optimizer.

# %%
if schedule is not None:
    result = train3d.train(my_plan, timed=True, memory_limit_gb=memory_limit_gb)
    print(train3d_figures.format_result(result))

# %%
if schedule is not None:
    train3d_figures.loss_figure(result, title=f"your plan: dp {my_plan.dp} x pp {my_plan.pp} x tp {my_plan.tp}, "
                                      f"{my_plan.schedule}").show()

# %% [markdown]
# And the prediction against the measurement (median of the steps after the first; the slowest
# rank's wall clock):

# %% tags=["nbval-ignore-output"]
import statistics

if schedule is not None:
    measured = statistics.median(result["step_s"][1:])
    error = abs(predicted["step_s"] - measured) / measured
    print(f"measured {measured * 1e3:.1f} ms per step, predicted {predicted['step_s'] * 1e3:.1f} ms: "
          f"relative error {error:.0%}")

# %% [markdown]
# **Your turn.** Change one thing at a time and predict before you run: `microbatches=8` (what happens
# to the bubble? to activation memory?), `schedule="gpipe"` (memory?), `recompute=True` (memory and
# time?), `dp=2, pp=2, tp=1`, `dp=1, pp=1, tp=4`, an 8-rank `dp=2, pp=2, tp=2`. Then break a rule on
# purpose: `microbatches=3`, `heads=6`, `layers=1`, or a `memory_limit_gb` too small for the plan.
#
# ## 5. The same plan in Megatron-LM, DeepSpeed and PyTorch
#
# Every technique of the course has a name in the frameworks used for real training. The names were
# checked against PyTorch 2.13 (installed here: `torch.distributed.pipelining`,
# `torch.distributed.tensor.parallel`, `torch.distributed.device_mesh`, `torch.distributed.fsdp`) and
# against Megatron-LM's and DeepSpeed's sources; entries marked † could not be checked here.
#
# | technique (lesson) | parallel_lab | Megatron-LM | DeepSpeed | PyTorch |
# |---|---|---|---|---|
# | device mesh (11) | `mesh.ParallelDims`, `build_groups` | implicit: world = dp · pp · tp (`megatron.core.parallel_state`) | `PipeModelDataParallelTopology(num_pp, num_mp, num_dp)` | `init_device_mesh("cuda", (dp, pp, tp), mesh_dim_names=...)`, `DeviceMesh` |
# | tensor parallelism (02) | `tensor.plan.parallelize` | `--tensor-model-parallel-size` | through Megatron-DeepSpeed (Megatron's layers, `mpu=` in `deepspeed.initialize`) † | `parallelize_module` with `ColwiseParallel`, `RowwiseParallel` |
# | sequence parallelism (02) | `sequence_parallel=True` | `--sequence-parallel` | via Megatron-DeepSpeed † | `SequenceParallel` |
# | vocabulary-parallel loss (02) | `vocab_parallel_cross_entropy` | built in (vocab-parallel cross-entropy) | via Megatron-DeepSpeed † | `loss_parallel()` |
# | pipeline stages (03) | `pipeline.stages.cut` | `--pipeline-model-parallel-size` | `PipelineModule(layers, num_stages=...)`; config `"pipeline": {"stages": ...}` † | `PipelineStage` (or `pipeline(...)` + `SplitPoint`) |
# | balancing stages (09) | `partition` | `--decoder-first-pipeline-num-layers`, `--pipeline-model-parallel-layout` † | `partition_method="parameters"`, `"uniform"`, `"type:[regex]"` | manual split points |
# | micro-batches (04) | `microbatches` | `--micro-batch-size`, `--global-batch-size` | `train_micro_batch_size_per_gpu`, `gradient_accumulation_steps` | `n_microbatches=` of a schedule |
# | GPipe (04) | `"gpipe"` | — (1F1B only) | — | `ScheduleGPipe` |
# | 1F1B (05) | `"1f1b"` | default schedule | `TrainSchedule` (1F1B) | `Schedule1F1B` |
# | interleaved 1F1B (06) | `"interleaved-1f1b"`, `virtual` | `--num-layers-per-virtual-pipeline-stage` | — | `ScheduleInterleaved1F1B` |
# | zero bubble (07) | `"zb-h1"`, `"zb-v"` | — (in forks) † | — | `ScheduleInterleavedZeroBubble`, `ScheduleZBVZeroBubble`, `ScheduleDualPipeV` |
# | recomputation (08) | `recompute=True` | `--recompute-granularity full\|selective`, `--recompute-method`, `--recompute-num-layers` | `activation_checkpoint_interval=` of `PipelineModule`; config `"activation_checkpointing"` | `torch.utils.checkpoint.checkpoint`, `checkpoint_wrapper` |
# | data parallelism (11) | `data_parallel.allreduce_gradients` | implicit dp = world / (tp · pp) | the engine's gradient all-reduce | `DistributedDataParallel` |
# | sharded optimizer / weights | `memory_model(zero1=True)` | `--use-distributed-optimizer` | `"zero_optimization": {"stage": 1\|2\|3}` | `fully_shard` (FSDP2), `FullyShardedDataParallel` |
#
# Your plan, spelt as Megatron-LM command-line flags (data parallelism is what is left of the
# world size):

# %%
flags = [f"--tensor-model-parallel-size {my_plan.tp}", f"--pipeline-model-parallel-size {my_plan.pp}",
         f"--micro-batch-size {my_plan.batch // my_plan.dp // my_plan.microbatches}",
         f"--global-batch-size {my_plan.batch}",
         f"--num-layers {my_plan.layers} --hidden-size {my_plan.hidden} --num-attention-heads {my_plan.heads}",
         f"--seq-length {my_plan.seq}"]
if my_plan.schedule == "interleaved-1f1b":
    flags.append(f"--num-layers-per-virtual-pipeline-stage {my_plan.layers // (my_plan.pp * my_plan.virtual)}")
if my_plan.sequence_parallel:
    flags.append("--sequence-parallel")
if my_plan.recompute:
    flags.append("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
print(f"torchrun --nproc-per-node {my_plan.world_size} pretrain_gpt.py \\\n    " + " \\\n    ".join(flags))
print(f"and here: torchrun --standalone --nproc-per-node {my_plan.world_size} -m parallel_lab.parallel3d.train3d "
      f"--dp {my_plan.dp} --pp {my_plan.pp} --tp {my_plan.tp} --schedule {my_plan.schedule} "
      f"--microbatches {my_plan.microbatches}")

# %% [markdown]
# ## 6. Before you spend a budget
#
# The article closes with practical guidance: architecture decisions set performance and running
# costs for years; choose the right stack, not just the newest; better engineering choices mean fewer
# reliability incidents. And an implementation roadmap: **define latency, quality and cost targets
# before implementing; benchmark under realistic load and data; instrument monitoring of errors,
# drift and user impact; prepare rollback and incident response before scaling.** For a training run
# that reads:
#
# | step | for a training run | with this course's tools |
# |---|---|---|
# | cost and budget | GPU-hours = steps × seconds per step × GPUs / 3600; price it before you start | `planner.training_cost` |
# | targets | time to train (days), quality (loss or benchmark score at the end), cost ceiling | write them down with the plan |
# | choose the stack | a framework whose names you can map (section 5), not the newest one | the table above |
# | benchmark under realistic load | a few real steps at full scale, real data and sequence lengths, on the cluster and network you will use | `train3d` with `timed=True`; lesson 11's prediction check |
# | don't optimise one benchmark | tokens/s alone hides memory headroom, stragglers, restarts | check memory, the bubble and the loss together |
# | monitoring | loss and gradient norm per step, throughput, memory, hangs (which rank, which operation) | `step k/n loss ...`; `commlog` names a hung rank's operation |
# | rollback | checkpoints to resume from; a known-good plan to fall back to; a rule for when to stop | keep the single-process check as your known-good answer |
#
# What a bad plan costs, in money: GPT-3 175B (300 billion tokens, batches of 1536 × 2048 tokens)
# on 512 GPUs at an illustrative $2 per GPU-hour, for two plans the planner scores (its own model,
# lesson 16: 64 DGX H100 nodes, 396 TFLOP/s achieved per GPU, NVLink 4 in a node, InfiniBand NDR
# between nodes):

# %%
from parallel_lab.hardware import SYSTEMS
from parallel_lab.planning import planner
from parallel_lab.planning.cost import step_time

gpt3 = memory.MODELS["GPT-3 175B"]
cluster = SYSTEMS["DGX H100"].cluster(64)
for dp, pp, tp, m, schedule_name in ((8, 16, 4, 192, "zb-h1"), (16, 32, 1, 96, "gpipe")):
    t = step_time(gpt3, cluster, 1536, dp, pp, tp, m, schedule_name, recompute="selective")
    row = {"global_batch": 1536, "seq": gpt3.seq, "step_s": t["step_s"], "world_size": dp * pp * tp}
    cost = planner.training_cost(row, tokens=300e9, price_per_gpu_hour=2.0)
    print(f"dp {dp:>2} x pp {pp:>2} x tp {tp}, {schedule_name:<6} m={m:<3}: {t['step_s']:6.1f} s per step, "
          f"{cost['days']:5.1f} days, {cost['gpu_hours'] / 1e3:,.0f}k GPU-hours, ${cost['cost'] / 1e6:,.2f}M")

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
# - A plan is (dp, pp, tp, schedule, micro-batches, recomputation); check its arithmetic, memory and
#   bubble *before* launching — errors are cheapest then.
# - A correct 3D run computes what one process computes: verify it on small shapes in fp64 before
#   trusting a big run.
# - Predictions from a calibrated cost model rank plans; a short real benchmark on the target
#   hardware decides between the best few.
# - The same ideas carry across frameworks: Megatron-LM spells them as flags
#   (`--tensor-model-parallel-size`, `--pipeline-model-parallel-size`, ...), DeepSpeed as
#   `PipelineModule` and a JSON config, PyTorch as `DeviceMesh`, `parallelize_module` and
#   `torch.distributed.pipelining` schedules.
# - Set latency, quality and cost targets first; benchmark under realistic load; monitor; keep a way
#   back.
