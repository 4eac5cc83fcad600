# %% [markdown]
# # 01 · Ranks and collectives, on real processes
#
# **Learning goals**
# - Start several *ranks* (one process per simulated GPU) from this notebook and get their results back.
# - Know the six communication patterns every parallel method is built from — send/recv, broadcast,
#   all-reduce, all-gather, reduce-scatter, all-to-all — by seeing what each rank holds before and after.
# - Measure all-reduce on this machine and fit the α–β (latency–bandwidth) model that later lessons use
#   to predict the cost of tensor and pipeline parallelism.
# - Write ring all-reduce yourself from send/recv, and have it checked on real ranks.
#
# Every rank here is a real operating-system process running `torch.distributed` with the gloo
# backend, exactly as on a GPU cluster (where the backend would be NCCL). They share your CPU cores, so
# *times* are not GPU times — but who sends what to whom is exactly the same.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. Ranks
# `launcher.run(fn, world_size)` runs `fn` on every rank with the process group ready and returns the
# list of their return values, indexed by rank. `fn` must live in a module (here `parallel_lab.runtime.demos`):
# ranks are separate processes and import it by name.

# %%
from parallel_lab.i18n import source
from parallel_lab.runtime import demos, launcher
from parallel_lab.show import collectives as collective_figures

print(source(demos.hello))  # inspect.getsource, the docstring in the lesson's language
results = launcher.run(demos.hello, world_size=4)
print(collective_figures.hello_text(results))

# %% [markdown]
# The ranks stay up between calls (a *pool*), so the next call costs a message, not a process start.
# What a rank prints comes back prefixed with its rank, in rank order:

# %%
_ = launcher.run(demos.say_hello, world_size=4)

# %% [markdown]
# ### When something goes wrong
# A mistake on one rank must never freeze the notebook. An exception is raised here naming the rank
# (with its traceback); a rank stuck in communication is reported after a timeout together with the
# operation every rank is blocked in. Below, rank 0 sends a message nobody receives:

# %%
print(source(demos.unmatched_send))
try:
    launcher.run(demos.unmatched_send, world_size=2, timeout=2)
except launcher.RanksHung as err:
    print(collective_figures.hung_text(err))

# %% [markdown]
# ### Your own code on ranks
# `launcher.run` runs the library's functions. To run code you write here, start a cell with
# `%%ranks N`: the whole cell runs on N fresh ranks, with `rank`, `world_size`, `torch` and `dist`
# (`torch.distributed`) defined. What each rank prints comes back prefixed with its rank, and the
# cell's last expression is each rank's value:

# %%
# %%ranks 2
import torch
import torch.distributed as dist

x = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(x)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {x.item():g}")
x.item()

# %% [markdown]
# A function you wrote in a cell runs the same way with `cells.run(fn, N, args=...)`: the cell's
# imports, functions and constants travel with it (its other lines do not run on the ranks). A
# mistake is reported as the launcher reports one, with the line of *your* cell:

# %%
from parallel_lab.runtime import cells


def my_gather(scale):
    values = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(values, torch.tensor([float(dist.get_rank() * scale)]))
    return [v.item() for v in values]


def my_broken(n):
    if dist.get_rank() == 1:
        return n / 0
    return n


print(cells.run(my_gather, 4, args=(10,)))
try:
    cells.run(my_broken, 2, args=(1,))
except cells.RankError as err:
    print(err.failed())

# %% [markdown]
# ## 2. The six collectives
# Each rank starts with a small tensor; rank *r* holds `10·r + j` in slot *j*. The pictures come from a
# real run on 4 ranks (`collectives.holdings`). Empty cells are slots a rank does not hold.
#
# | pattern | what happens | used by |
# |---|---|---|
# | send / recv | one rank's tensor goes to one other rank | pipeline parallelism (activations forward, gradients back) |
# | broadcast | one rank's tensor is copied to all | initial weights |
# | all-reduce | everyone ends with the element-wise sum | tensor parallelism (Megatron's *g*), data parallelism |
# | all-gather | everyone ends with all ranks' pieces | gathering a sharded output; sequence parallelism |
# | reduce-scatter | the sum, but each rank keeps only its piece | sequence parallelism, ZeRO |
# | all-to-all | rank r sends its piece j to rank j: who holds what is transposed | expert parallelism (lesson 13), Ulysses' context parallelism (lesson 14) |

# %%
from parallel_lab.planning import calibration
from parallel_lab.runtime import collectives

for name in collectives.COLLECTIVES:
    per_rank = launcher.run(collectives.holdings, world_size=4, args=(name,))
    collective_figures.holdings_figure(name, per_rank).show()

# %% [markdown]
# Notice that **all-reduce = reduce-scatter followed by all-gather**: the reduce-scatter leaves rank *r*
# with the full sum of slot *r*; an all-gather then hands every slot to everyone. That identity is the
# whole idea behind ring all-reduce (your exercise below) and behind sequence parallelism (lesson 02).
# **All-to-all** moves every piece and sums nothing: rank r's slot j lands on rank j as its slot r. A
# mixture of experts sends each token to the rank of its expert this way (lesson 13), and Ulysses
# swaps a sequence split for a split by attention heads (lesson 14).

# %% [markdown]
# ## 3. What does an all-reduce cost? The α–β model
# A message of *n* bytes costs `α + n·β`: a fixed latency α (seconds) plus n times **β, the inverse
# bandwidth** (seconds per byte; the bandwidth is 1/β bytes per second). This course uses β in that
# sense throughout. A ring all-reduce on *p* ranks does 2(p−1) steps, each sending n/p bytes per rank:
#
# $$t_{\text{all-reduce}}(n) \approx 2(p-1)\,\alpha + \frac{2(p-1)}{p}\, n\, \beta$$
#
# Small messages are dominated by α, large ones by β. Let's measure gloo's all-reduce on 4 ranks of
# this machine and fit α and β (your numbers will differ from the ones stored in this notebook).

# %% tags=["nbval-ignore-output"]
sizes = [2**k for k in range(10, 23, 2)]  # 1 KB .. 4 MB
measured = launcher.run(calibration.time_all_reduce, world_size=4, args=(sizes,))[0]
fit = calibration.fit_alpha_beta(sizes, measured, world_size=4)
print(collective_figures.fit_text(fit))
collective_figures.alpha_beta_figure(sizes, {"gloo all_reduce": measured}, fit, world_size=4).show()

# %% [markdown]
# For comparison: NVLink 4 inside a DGX H100 moves 450 GB/s per GPU and direction with α of a few
# µs (NVLink 5 on B200: 900 GB/s); InfiniBand NDR between servers gives 50 GB/s per GPU (400 Gb/s),
# ConnectX-8 on GB300 systems 100 GB/s (800 Gb/s).
# Lesson 02 puts these numbers next to the compute time of a layer to show why tensor parallelism
# stays inside the NVLink domain.

# %% [markdown]
# ## 4. Exercise: ring all-reduce from send/recv
# Write `my_ring_all_reduce(tensor)` that sums `tensor` over all ranks **in place** using only
# `dist.isend` / `dist.recv` (or `dist.send` / `dist.irecv`) with the neighbours of a ring:
#
# 1. split the flat tensor into *p* chunks (`tensor.view(-1).tensor_split(p)` gives views);
# 2. **reduce-scatter**, p−1 steps: in step *s*, send chunk `(rank − s) mod p` to the right neighbour,
#    receive chunk `(rank − s − 1) mod p` from the left one and add it in;
# 3. **all-gather**, p−1 steps: pass the finished chunks around the ring, copying instead of adding.
#
# Start the send with `isend` before the blocking `recv`: if every rank blocked in `send` first,
# large messages could deadlock the ring. The check below runs your function on 2 and 4 real ranks
# against `dist.all_reduce` (tensors smaller than, divisible by and not divisible by *p*) and prints a
# verdict. A hang or an exception is reported, not frozen.

# %% [markdown]
# **What the check forbids:** any collective (`dist.all_reduce`, `dist.broadcast`, ...) and the
# library's own ring (`parallel_lab`): build it from point-to-point calls. It also counts the bytes
# your ranks send: a ring sends 2(p−1)/p of the tensor per rank, no more. No all-reduce can send less:
# each rank must pass on (p−1)/p of its data to be summed elsewhere and receive as much of the sums
# (Patarasuk and Yuan 2009, *Bandwidth optimal all-reduce algorithms*), so the ring is
# **bandwidth-optimal** because it meets that lower bound, not because 2(p−1)/p tends to 2.
#
# Keep all your code in the answer cell below: the grader reads that cell alone from your notebook and
# runs it on fresh ranks of its own, so helpers defined in other cells are not seen.

# %% tags=["answer:ring-all-reduce"]
import torch
import torch.distributed as dist


def my_ring_all_reduce(tensor):
    ### BEGIN SOLUTION
    rank, p = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.view(-1).tensor_split(p))
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(2 * (p - 1)):
        if step < p - 1:  # reduce-scatter
            send = (rank - step) % p
        else:  # all-gather
            send = (rank + 1 - (step - (p - 1))) % p
        recv = (send - 1) % p
        buffer = torch.empty_like(chunks[recv])
        request = dist.isend(chunks[send].contiguous(), dst=right)
        dist.recv(buffer, src=left)
        request.wait()
        if step < p - 1:
            chunks[recv] += buffer
        else:
            chunks[recv].copy_(buffer)
    ### END SOLUTION
    return tensor


# %% [markdown]
# **Try it on ranks** before the check: `--with my_ring_all_reduce` runs your answer cell's
# definitions on the ranks first. Each rank starts with its own tensor; after your ring, every rank
# should hold the same sums, `[60, 64, 68, 72, 76, 80]`.

# %%
# %%ranks 4 --with my_ring_all_reduce
x = torch.arange(6.0) + 10 * dist.get_rank()
my_ring_all_reduce(x)
print(x.tolist())

# %% tags=["check:ring-all-reduce", "points:2"]
from parallel_lab.exercises import check_ring_all_reduce

verdict = check_ring_all_reduce(my_ring_all_reduce)

# %% [markdown]
# ### Ring versus gloo
# How does a ring written in Python on top of send/recv compare with gloo's built-in all-reduce? Both
# run on the same 4 ranks, same 4 MB message (the library's `collectives.ring_all_reduce` is the same
# algorithm as your solution).
#
# **Predict** first: from the α and the bandwidth you fitted in section 3, how long should gloo's
# all-reduce of 4 MB (4 × 2²⁰ bytes) on 4 ranks take, in ms? Write it in the answer cell below and
# record it in the cell after it (not graded: your machine decides the answer).

# %% tags=["answer:predict:all-reduce-4mb"]
my_prediction = None  # gloo's all-reduce of 4 MB on 4 ranks, in ms, from your α–β fit
### BEGIN SOLUTION
my_prediction = (2 * 3 * fit["alpha_s"] + 2 * 3 / 4 * 4 * 2**20 / fit["bandwidth_bytes_per_s"]) * 1e3
### END SOLUTION

# %%
from parallel_lab.show.predict import predict

guess = predict("all-reduce-4mb", my_prediction,
                {"en": "gloo's all-reduce of 4 MB on 4 ranks, from your α–β fit",
                 "zh-Hant": "由你的 α–β 擬合推算：gloo 在 4 個 rank 上 all-reduce 4 MB 的時間"},
                unit="ms", tolerance=0.5)

# %% tags=["reveals:all-reduce-4mb", "nbval-ignore-output"]
from parallel_lab.hardware import ring_all_reduce_time

size = [4 * 2**20]
gloo_s = launcher.run(calibration.time_all_reduce, world_size=4, args=(size,), kwargs={"algorithm": "gloo"})[0][0]
ring_s = launcher.run(calibration.time_all_reduce, world_size=4, args=(size,), kwargs={"algorithm": "ring"})[0][0]
model_s = ring_all_reduce_time(size[0], 4, fit["alpha_s"], fit["bandwidth_bytes_per_s"])
print(collective_figures.ring_versus_text(size[0], 4, gloo_s, ring_s, model_s))
guess.versus(gloo_s * 1e3)

# %% [markdown]
# ## What to remember
# - A *rank* is one process owning one device; a *process group* lets ranks call collectives together.
# - Every collective must be called by **every** rank of its group, in the same order — a rank that
#   skips one leaves the others waiting forever (here: reported after a timeout).
# - all-reduce = reduce-scatter + all-gather; a ring sends 2(p−1)/p of the data per rank, the least
#   any all-reduce can send: it is bandwidth-optimal.
# - Cost ≈ α per message + bytes × β, with β the inverse bandwidth (seconds per byte). Latency rules
#   small messages, bandwidth rules large ones.
