"""Expert parallelism: a ``models.MoE`` whose E experts are spread over the N ranks of a group.

GShard (Lepikhin et al. 2020) and Switch (Fedus et al. 2021): rank r keeps experts
``[r E/N, (r+1) E/N)`` and a copy of the router, and holds its own tokens (the batch is split over
the group, as data parallelism splits it). A forward, on each rank:

1. route its tokens (``models.top_k_routing``, the dense layer's code);
2. all-gather every rank's counts ``(k, E)``: from them each rank knows the whole batch's queues,
   so it computes the capacity and its assignments' queue positions exactly as the dense layer does
   on the whole batch, drops before sending, and knows every split size of the two all-to-alls;
3. dispatch: all-to-all the kept token vectors to their experts' ranks (sorted by expert);
4. run its experts on what arrived; 5. combine: the reverse all-to-all brings the outputs home, where
   they are weighted by their gates and summed per token.

So N ranks compute what the dense layer computes on the concatenation of their tokens: outputs, the
load-balancing loss (each rank's share, which add up) and every gradient -- the router's once summed
over the group (``allreduce_router_grads``, the data-parallel sum of a replicated parameter).

DeepSpeed-MoE and GShard's "local groups" instead give each rank's tokens a capacity of their own,
which needs no count exchange but drops differently from one process. So does Megatron-LM
(``megatron/core/transformer/moe/moe_utils.py``: the router calls ``apply_router_token_dropping``,
whose ``get_capacity`` counts the rank's local tokens, and drops by router probability by default,
``moe_token_drop_policy="probs"``; with the default ``moe_expert_capacity_factor=None`` it drops
nothing); its all-to-all dispatcher gathers the counts only to size the all-to-alls
(``token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher.preprocess``).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from parallel_lab import models
from parallel_lab.moe.mappings import all_to_all


def check_experts_divisible(experts: int, ep: int) -> None:
    if experts % ep:
        raise ValueError(f"expert parallelism needs experts % ep == 0 (each rank holds experts / ep), "
                         f"got experts {experts}, ep {ep}")


def _gather_counts(counts, group):
    """Every rank's ``(k, E)`` counts, stacked: ``(N, k, E)`` (one small all-gather)."""
    world = dist.get_world_size(group)
    if world == 1:
        return counts[None]
    out = counts.new_empty((world * counts.shape[0], *counts.shape[1:]))  # gloo stacks along dim 0
    dist.all_gather_single(out, counts.contiguous(), group=group)
    return out.view(world, *counts.shape)


class ExpertParallelMoE(nn.Module):
    """``models.MoE`` over ``group``: ``(..., H)`` this rank's tokens -> ``(..., H)``.

    ``experts`` holds this rank's E/N experts (dense experts ``first_expert + i``). Each forward
    leaves ``routing`` (a ``models.Routing`` of this rank's tokens, with the whole batch's
    ``capacity``, ``routed_per_expert`` and ``tokens_per_expert``, and this rank's share of the
    ``aux_loss``) and ``received_per_expert``: the rows each local expert ran on, as measured here.
    """

    def __init__(self, router: nn.Linear, experts: nn.ModuleList, num_experts: int, top_k: int,
                 capacity_factor: float | None, group=None):
        super().__init__()
        self.router, self.experts, self.group = router, experts, group
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        self.first_expert = dist.get_rank(group) * len(experts)
        self.routing: models.Routing | None = None
        self.received_per_expert: list[int] | None = None

    @classmethod
    def from_dense(cls, moe: models.MoE, group=None):
        """Rank r's part of ``moe``: a copy of the router and experts ``[r E/N, (r+1) E/N)``."""
        ep, rank = dist.get_world_size(group), dist.get_rank(group)
        check_experts_divisible(moe.num_experts, ep)
        local = moe.num_experts // ep
        experts = nn.ModuleList(copy.deepcopy(moe.experts[rank * local + i]) for i in range(local))
        return cls(copy.deepcopy(moe.router), experts, moe.num_experts, moe.top_k, moe.capacity_factor, group)

    def forward(self, x):  # (..., H)
        flat = x.reshape(-1, x.shape[-1])  # (n, H): this rank's tokens
        E, k, local = self.num_experts, self.top_k, len(self.experts)
        rank, ep = dist.get_rank(self.group), dist.get_world_size(self.group)
        probs, gate, expert = models.top_k_routing(self.router(flat), k)  # (n, E), (n, k), (n, k)

        # 2. The whole batch's queues, from every rank's counts.
        table = _gather_counts(models.assignment_counts(expert, E), self.group)  # (N, k, E)
        total = table.sum(0)  # (k, E)
        tokens = int(total.sum()) // k  # the whole batch's
        capacity = models.expert_capacity(tokens, E, k, self.capacity_factor)
        # queued before (rank, choice, expert): earlier choices of every rank, then lower ranks
        ahead = (total.cumsum(0) - total)[None] + table.cumsum(0) - table  # (N, k, E)
        position = models.queue_positions(expert, E, ahead[rank])  # (n, k)
        kept = position < capacity
        kept_table = (capacity - ahead).clamp(min=0).minimum(table).sum(1)  # (N, E) kept, per rank
        send = kept_table[rank].view(ep, local).sum(1).tolist()  # rows to each rank
        mine = kept_table[:, self.first_expert:self.first_expert + local]  # (N, E/N) rows from each
        recv = mine.sum(1).tolist()

        # 3. Dispatch, sorted by expert: rank-major, then by expert within a rank, as `mine` counts.
        token, choice = kept.nonzero(as_tuple=True)
        order = torch.sort(expert[token, choice], stable=True).indices
        token, choice = token[order], choice[order]
        arrived = all_to_all(flat[token], recv, send, self.group)  # (sum(recv), H)

        # 4. This rank's experts, 5. combine: the outputs go back where they came from.
        which = torch.arange(local).repeat(ep).repeat_interleave(mine.flatten())  # local expert per row
        self.received_per_expert = torch.bincount(which, minlength=local).tolist()
        y = all_to_all(models.run_experts(self.experts, arrived, which), send, recv, self.group)
        out = flat.new_zeros(flat.shape).index_add(0, token, gate[token, choice, None] * y)  # (n, H)

        routed = total.sum(0)  # (E,)
        self.routing = models.Routing(expert, gate.detach(), position, kept, capacity, routed,
                                      kept_table.sum(0), models.load_balancing_loss(probs, routed, tokens))
        return out.view(x.shape)


def allreduce_router_grads(model: nn.Module, group=None) -> None:
    """Sum the router's gradient over the group: every rank holds a copy and saw its own tokens."""
    if dist.get_world_size(group) == 1:
        return
    for module in model.modules():
        if isinstance(module, ExpertParallelMoE) and module.router.weight.grad is not None:
            dist.all_reduce(module.router.weight.grad, group=group)
