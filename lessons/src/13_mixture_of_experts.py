# %% [markdown]
# # 13 · Mixture of experts and expert parallelism
#
# **Learning goals.** By the end of this lesson you can
#
# - read a **mixture-of-experts** (MoE) layer: a router scores E expert MLPs for every token, the
#   token goes to its **top-k**, and its output is the gate-weighted sum of theirs (GShard, Lepikhin
#   et al. 2020; Switch Transformers, Fedus et al. 2021);
# - compute an expert's **capacity**, ⌈C·n·k/E⌉ (Switch's capacity factor C), predict how many
#   assignments a routing drops, and say which ones: queues fill every token's first choice before
#   any second choice (GShard);
# - write that **dispatch** yourself and have it drive a real expert-parallel forward;
# - spread the experts over an **expert-parallel** (EP) group: each rank keeps E/N experts and its own
#   tokens, a **dispatch all-to-all** sends every kept token row to its expert's rank and a
#   **combine all-to-all** brings the results home; run it on real ranks and check it equals the
#   dense layer (fp64: outputs, loss, every gradient, drops included);
# - measure **load imbalance**, say what the load-balancing loss (Switch) and DeepSeek-V3's
#   auxiliary-loss-free balancing do about it;
# - cost the all-to-all in the α–β model against tensor parallelism's all-reduce.
#
# You need lessons 01 (collectives, the α–β model) and 02 (tensor parallelism). Notation: n tokens,
# E experts, k choices per token (top-k), C the capacity factor, N ranks in the EP group, H the hidden
# size, α the latency of a message and β the inverse bandwidth (seconds per byte), as in lesson 01.

# %% [markdown]
# A dense MLP spends the same FLOPs on every token. A mixture of experts holds E MLPs and runs only k
# of them per token: E times the parameters, about k times the FLOPs of one. GShard (Lepikhin et al.
# 2020) trained a 600B-parameter translation model this way; DeepSeek-V3 (DeepSeek-AI 2024) has 671B
# parameters of which 37B are active per token (top-8 of 256 routed experts, plus one shared expert).
# The parameters no longer fit one device, and the experts are the natural cut.

# %%
from parallel_lab.course.notebook import setup

setup()

# %% [markdown]
# ## 1. The router and its top-k gates
#
# The router is one `Linear(H, E)` without bias. For each token it gives E logits; their softmax is
# the router's probability per expert; the token's **top-k** experts are the k most probable. With
# k > 1 their k probabilities are renormalised to sum to 1 and become the **gates** that weight the
# experts' outputs (GShard's top-2; Mixtral does the same). With k = 1 (Switch) the gate is the
# probability itself: renormalised it would be 1, and the router would get no gradient from the
# output. The course's layer is `models.MoE`; its routing is one short function:

# %%
from parallel_lab import models
from parallel_lab.i18n import source

print(source(models.top_k_routing))

# %% [markdown]
# Four tokens through a router over 8 experts, top-2 (the probabilities rounded):

# %%
import torch

from parallel_lab.show import experts as xf

moe = models.MoE(hidden=16, experts=8, top_k=2, seed=0).double()
tokens = torch.randn((4, 16), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
probs, gate, expert = models.top_k_routing(moe.router(tokens), moe.top_k)
print(xf.routing_lines(probs, gate, expert))

# %% [markdown]
# ## 2. Capacity, and the assignments it drops
#
# On a device an expert is a matrix multiply of fixed shape, so it takes at most a fixed number of
# assignments, its **capacity**. Switch Transformers define it from the **capacity factor** C: an
# even share of the assignments times C, here with k assignments per token,
#
# $$\text{capacity} = \left\lceil C \cdot \frac{n\,k}{E} \right\rceil$$
#
# (`models.expert_capacity`). An expert's queue fills in a fixed order, GShard's: every token's
# first choice before any token's second choice, and within a choice in token order. An assignment
# whose place in the queue is the capacity or beyond is **dropped**: it adds nothing, and a token
# whose every choice was dropped leaves the layer as 0, so the block's residual passes it on
# unchanged. A factor above 1 (Switch trains with 1 to 2, 1.25 typically) leaves room for some
# imbalance; C = 1 none.
#
# The lesson's batch is the one `run_moe` checks below: 8 sequences of 8 tokens (n = 64), E = 8
# experts, top-2, C = 1. The router has spoken; here is the demand, before any capacity:

# %%
from parallel_lab.moe.run import Case

case = Case(capacity_factor=1.0)
routing = xf.dense_routing(case)
print(xf.demand_lines(case, routing))

# %% [markdown]
# **Predict:** how many assignments does this routing drop? Compute the capacity first (1 point
# within ±10 %).

# %% tags=["answer:predict:moe-dropped"]
my_prediction = None  # assignments dropped: n = 64, E = 8, k = 2, C = 1, the demand above
### BEGIN SOLUTION
my_prediction = (24 - 16) + (21 - 16)  # capacity ⌈1 · 64 · 2 / 8⌉ = 16; experts 3 and 5 overflow
### END SOLUTION

# %% tags=["check:predict:moe-dropped"]
from parallel_lab.show.predict import predict

guess = predict("moe-dropped", my_prediction)

# %% tags=["reveals:moe-dropped"]
print(xf.load_table(routing))
guess.versus(routing.dropped, "models.MoE")

# %% [markdown]
# Each bar is an expert's demand: the kept first and second choices, and in red what lies beyond the
# capacity line:

# %% tags=["reveals:moe-dropped"]
xf.load_figure(routing)

# %% [markdown]
# And which ones: every token's two choices, the number in each cell the expert it chose. Here
# every drop is a **second** choice (first choices queue first, and on this batch they all fit), and
# the drops fall on the **later** tokens, which queue last within a choice. A token keeps its other
# choice, so it is half-served, not lost:

# %%
xf.drops_figure(routing)

# %% [markdown]
# ## 3. Write the dispatch
#
# The queue rule is the whole of the dispatch. Take 6 tokens, 3 experts, top-2 and C = 1: the
# capacity is ⌈6·2/3⌉ = 4. Expert 0 is the first choice of tokens 0, 1, 3 and 5, which fill it; the
# second choices of tokens 2 and 4 find it full. `models.queue_positions` gives each assignment its
# place in its expert's queue (`models.Routing.position`):

# %%
from parallel_lab.exercises.moe_dispatch import WORKED

worked = torch.tensor(WORKED)
counts = models.assignment_counts(worked, 3)  # (k, E): how many tokens chose each expert as choice s
position = models.queue_positions(worked, 3, counts.cumsum(0) - counts)
capacity = models.expert_capacity(6, 3, 2, 1.0)
print(xf.queue_lines(worked, position, capacity))

# %% [markdown]
# **Exercise (2 points).** Write `my_dispatch(expert, experts, capacity)`: `expert` is an `(n, k)`
# tensor of integers, token t's s-th choice `expert[t, s]`; return one list per expert, its
# **queue**: the `(token, choice)` pairs it computes, in queue order (`queues[e][i]` is the
# assignment at place i), at most `capacity` of them, dropping the rest by the rule above.
#
# The check runs your function on 2 fresh ranks: on four routings (this worked example, a top-2
# router with a popular expert, Switch's top-1, and no capacity), whose queues the checking process
# compares with `models.MoE`'s; then the ranks run a real expert-parallel forward whose dispatch and
# combine all-to-alls carry exactly the rows your queues name, and the checking process compares its
# output with the dense layer's on the whole batch. **Forbidden:** the library (`parallel_lab`, whose
# `queue_positions` is the answer) and `torch.distributed` (the all-to-alls are the check's); plain
# Python loops are fine, and so are `math`, `itertools` and `collections`.

# %% tags=["answer:moe-dispatch"]
def my_dispatch(expert, experts, capacity):
    """``expert`` (n, k): token t's s-th choice is expert[t, s]. Returns ``experts`` lists, the
    queue of each: (token, choice) pairs in queue order, at most ``capacity`` of them."""
    n, k = expert.shape
    queues = [[] for _ in range(experts)]
    ### BEGIN SOLUTION
    for s in range(k):  # every token's first choice before any second choice (GShard)
        for t in range(n):  # within a choice, in token order
            e = int(expert[t, s])
            if len(queues[e]) < capacity:
                queues[e].append((t, s))
    ### END SOLUTION
    return queues


# %% tags=["check:moe-dispatch", "points:2"]
from parallel_lab.exercises import check_moe_dispatch

verdict = check_moe_dispatch(my_dispatch)

# %% [markdown]
# ## 4. Experts over ranks: dispatch and combine
#
# **Expert parallelism** (GShard; Switch) spreads the E experts over the N ranks of an EP group:
# rank r keeps experts [r·E/N, (r+1)·E/N) and a copy of the router, and holds its own tokens, as
# data parallelism splits a batch. A forward, on each rank (`moe.layer.ExpertParallelMoE`):
#
# 1. route its tokens with the dense layer's code;
# 2. all-gather every rank's `(k, E)` counts, a few bytes: with them each rank knows the whole
#    batch's queues, so it computes the capacity and its assignments' places exactly as one process
#    would on the whole batch, and drops before sending;
# 3. **dispatch**: one all-to-all sends each kept token row to the rank of its expert;
# 4. run its experts on what arrived;
# 5. **combine**: the reverse all-to-all brings every output row back to its token's rank, which
#    weights it by its gate and sums per token.
#
# Backward, each all-to-all's gradient is the reverse all-to-all, so a step has four. Who sends how
# many rows to whom, for this batch on N = 4 ranks (2 experts and 16 tokens each; the diagonal stays
# home):

# %%
ep = 4
sent_to = xf.dispatch_counts(routing, ep)
xf.dispatch_figure(sent_to, hidden=case.hidden)

# %% [markdown]
# Now for real: 4 ranks, the same batch in fp64, checked against `models.MoE` on one process (the
# parent computes the reference; every rank compares its output, its input's gradient, its experts'
# gradients and the router's summed over the group, and which assignments it kept):

# %%
from parallel_lab.moe.run import run_moe

result = run_moe(ep=ep, experts=8, top_k=2, capacity_factor=1.0)
print(xf.run_summary(result))

# %% [markdown]
# The same assignments are kept because every rank counted the whole batch's queues (step 2). That is
# the course's choice, made so that EP equals one process drops included; it is not what Megatron-LM
# does. There (`megatron/core/transformer/moe/moe_utils.py`) the router of each rank calls
# `apply_router_token_dropping`, whose `get_capacity` counts only the rank's **local** tokens,
# ⌈C·n_local·k/E⌉, and drops before any exchange, by default the assignments with the **lowest router
# probability** (`moe_token_drop_policy="probs"`; `"position"` keeps the earliest tokens). By default it
# drops nothing at all (`moe_expert_capacity_factor=None`). Its all-to-all dispatcher gathers the
# per-expert counts too (`token_dispatcher.py`, `MoEAlltoAllTokenDispatcher.preprocess`), but only to
# size each all-to-all's splits.

# %% [markdown]
# The figure's matrix is what the ranks sent. Each rank hands its all-to-alls its outgoing rows twice
# (dispatch forward, combine's gradient backward) and its incoming rows twice (combine forward,
# dispatch's gradient backward), H = 16 values of 8 bytes each:

# %%
print(xf.all_to_all_bytes_lines(sent_to, result, row_bytes=case.hidden * 8))

# %% [markdown]
# ## 5. Load imbalance
#
# A rank computes what its experts were sent, so the busiest rank sets the layer's time, as the
# slowest stage does in a pipeline (lesson 09). Measured above, per rank:

# %%
print(xf.busiest_line(result))

# %% [markdown]
# A random router is mildly unbalanced. Real tokens are not random: tokens that are alike go to the
# same experts. Move every token of the batch along one direction (`shift`, in units of a token's
# typical length) and the demand piles up on a few experts, the drops grow, and so does Switch's
# **load-balancing loss**, E·Σᵢ fᵢ·Pᵢ (fᵢ the share of the assignments routed to expert i, Pᵢ its
# mean router probability): 1 when the routing is uniform, more when it is not.

# %%
rows = xf.imbalance_rows(case, shifts=(0.0, 0.5, 1.0, 2.0))
print(xf.imbalance_table(rows))
xf.imbalance_figure(rows)

# %% [markdown]
# What to do about it:
#
# - **Switch** (Fedus et al. 2021) adds 0.01 × the load-balancing loss to the training loss (`run_moe`
#   does too: the router's gradient above has that path), and sets C > 1 to absorb the rest.
# - **GShard** (Lepikhin et al. 2020) adds an auxiliary loss of the same kind, and dispatches in
#   *local groups*: each group of tokens gets a capacity of its own, which needs no count exchange but
#   drops differently from one process (the course's layer all-gathers the counts instead, so that it
#   drops exactly what one process drops; Megatron-LM does not, section 4).
# - **DeepSeek-V3** (DeepSeek-AI 2024) balances mainly without an auxiliary loss (it keeps only a
#   tiny sequence-wise one): a per-expert bias, added
#   to the scores for choosing the top-k only, is raised for underloaded experts and lowered for
#   overloaded ones after each step; and it drops no token (`capacity_factor=None` here). Without a
#   capacity nothing is lost, but the busiest rank computes as much as its experts are sent:

# %%
no_drop = run_moe(ep=ep, experts=8, top_k=2, capacity_factor=None)
print(xf.no_drop_line(no_drop))

# %% [markdown]
# ## 6. What the all-to-all costs
#
# In an all-to-all over N ranks each rank holds n bytes in N chunks, one per rank, and keeps its own
# chunk: it sends (N−1)/N · n. With the pairwise exchange that is N − 1 messages, so in the α–β model
# of lesson 01 (a message of n bytes costs α + n·β; `moe.cost.all_to_all_time`)
#
# $$T_{\text{all-to-all}}(n, N) = (N-1)\,\alpha + \frac{N-1}{N}\cdot n\,\beta$$
#
# against a ring all-reduce's 2(N−1)α + 2(N−1)/N · n·β. An MoE layer pays four all-to-alls per step,
# each of n = tokens · k · H · bytes (fewer when some are dropped). A tensor-parallel MLP (lesson 02,
# Megatron-LM, Shoeybi et al. 2019) pays two all-reduces of tokens · H · bytes. Per rank, 4096 tokens,
# H = 4096, bf16, top-2, N = 8:

# %%
print(xf.cost_table(xf.cost_rows(tokens=4096, hidden=4096, top_k=2, ranks=8)))

# %% [markdown]
# About k times tensor parallelism's bytes for the same tokens per rank: the all-to-all sends half an
# all-reduce's bytes per copy of a token, and a token travels k times. The difference is what it buys:
# the ranks of an EP group hold different experts *and* different tokens, so EP multiplies the
# parameters without multiplying any rank's work, and the all-to-all's volume does not grow with N.
# Across nodes the links are slower (the second row); DeepSeek-V3 therefore limits each token to
# experts on at most 4 nodes, and its DualPipe schedule (lesson 07) hides the all-to-alls behind
# compute.

# %%
from parallel_lab.runtime import launcher

launcher.shutdown()  # stop the rank processes (a Binder pod has little memory)

# %% [markdown]
# ## What to remember
#
# - A **mixture of experts** routes each token to its top-k of E expert MLPs and sums their outputs
#   weighted by the gates: E times the parameters for about k experts' FLOPs (GShard, Switch).
# - An expert takes at most its **capacity** ⌈C·n·k/E⌉ assignments (Switch's capacity factor C).
#   Queues fill every token's first choice before any second choice, in token order within a choice
#   (GShard); beyond the capacity an assignment is **dropped**, and a token with nothing kept passes
#   the block on its residual.
# - **Expert parallelism** keeps E/N experts and its own tokens on each rank; a **dispatch**
#   all-to-all sends each kept token row to its expert's rank, a **combine** all-to-all brings it back;
#   four all-to-alls per layer and step. Exchanging the counts first makes it equal one process,
#   drops included.
# - The busiest expert's rank paces the layer: **load imbalance** costs time, and drops when there is
#   a capacity. Switch's load-balancing loss E·Σ fᵢPᵢ pushes towards 1 (uniform); DeepSeek-V3 balances
#   with a per-expert routing bias instead, and drops nothing.
# - An all-to-all sends (N−1)/N of its bytes in N−1 messages: (N−1)α + (N−1)/N · n·β. Per token it
#   carries k copies where tensor parallelism's all-reduce carries one twice over, so MoE layers want
#   their EP group on fast links, or their all-to-alls hidden behind compute.
