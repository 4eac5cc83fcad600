"""Run expert parallelism on real ranks and check it against the dense MoE on one process.

    from parallel_lab.moe.run import run_moe
    run_moe(ep=4, experts=8, top_k=2, capacity_factor=1.0)
    # {"ep": 4, "max_output_diff": 4e-16, "max_grad_diff": 9e-16, "loss_diff": 0.0,
    #  "tokens_per_expert": [16, 16, 12, ...], "dropped": 7, "collectives": {...}, ...}

The parent computes the reference once with ``models.MoE`` on the whole batch (``reference``) and
sends it to the ranks; every rank (``check_case``) rebuilds the same dense layer from the seed, cuts
its experts with ``ExpertParallelMoE.from_dense``, runs forward and backward on its own sequences,
and compares its output, its input's gradient, its experts' gradients and (summed over the group)
the router's with the reference, and its routing (which assignments it kept) with the dense
layer's. Expected gradient shards come from cutting a copy of the dense layer whose weights *are*
the reference gradients, as ``tensor.run`` does. The loss is ``(out * weight).sum() + coef * aux``,
so the router's gradient has both paths: through the gates and through the load-balancing loss.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parallel_lab import models
from parallel_lab.checks import positive_int
from parallel_lab.moe.layer import ExpertParallelMoE, allreduce_router_grads, check_experts_divisible
from parallel_lab.runtime import commlog, launcher


@dataclass(frozen=True)
class Case:
    """A dense MoE layer, its batch ``(batch, seq, hidden)`` and the loss's aux coefficient."""

    experts: int = 8  # divisible by ep 1, 2, 4, 8
    top_k: int = 2
    capacity_factor: float | None = 1.25
    hidden: int = 16
    ffn: int = 32
    batch: int = 8  # sequences, split over the ranks
    seq: int = 8
    aux_coef: float = 0.01  # Switch's
    seed: int = 0

    def __post_init__(self):
        for name in ("hidden", "ffn", "batch", "seq"):
            positive_int(name, getattr(self, name))
        models.check_moe(self.experts, self.top_k, self.capacity_factor)

    def build(self, dtype=torch.float64) -> models.MoE:
        return models.MoE(self.hidden, self.experts, self.top_k, self.capacity_factor, self.ffn,
                          seed=self.seed).to(dtype)


def check_expert_parallel(case: Case, ep: int) -> None:
    """The errors a bad size would raise on every rank, raised here before any process starts."""
    positive_int("ep", ep)
    if ep > launcher.MAX_WORLD_SIZE:
        raise ValueError(f"expert parallelism needs ep <= {launcher.MAX_WORLD_SIZE} (the launcher's cap on "
                         f"ranks), got ep {ep}")
    check_experts_divisible(case.experts, ep)
    if case.batch % ep:
        raise ValueError(f"expert parallelism needs batch % ep == 0 (each rank its own sequences), "
                         f"got batch {case.batch}, ep {ep}")


def _routing_stats(routing: models.Routing) -> dict:
    return {"capacity": routing.capacity, "tokens_per_expert": routing.tokens_per_expert.tolist(),
            "routed_per_expert": routing.routed_per_expert.tolist(), "dropped": routing.dropped,
            "dropped_tokens": int(routing.dropped_tokens.sum())}


def reference(case: Case, dtype=torch.float64) -> dict:
    """Forward and backward of the dense layer on the whole batch, on one process."""
    dense = case.build(dtype)
    gen = torch.Generator().manual_seed(case.seed + 1)
    x = torch.randn((case.batch, case.seq, case.hidden), generator=gen).to(dtype)
    weight = torch.randn(x.shape, generator=gen).to(dtype)  # the loss's: the output's gradient
    x_ = x.clone().requires_grad_()
    out = dense(x_)
    loss = (out * weight).sum() + case.aux_coef * dense.routing.aux_loss
    loss.backward()
    return {"x": x, "weight": weight, "output": out.detach(), "loss": loss.item(),
            "aux_loss": dense.routing.aux_loss.item(), "input_grad": x_.grad,
            "grads": {name: p.grad for name, p in dense.named_parameters()},
            "kept": dense.routing.kept, **_routing_stats(dense.routing)}


def max_diff(a, b) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


def check_case(case: Case, ref: dict | None = None, dtype=torch.float64, group=None) -> dict:
    """Rank function: ``case`` expert-parallel over ``group``, this rank on its own sequences,
    compared with ``ref``. Returns this rank's diffs, its routing, what it sent and received, and
    the collectives of ``forward``, ``backward`` and the router's gradient sum ``grad_sync``."""
    rank, ep = dist.get_rank(group), dist.get_world_size(group)
    ref = reference(case, dtype) if ref is None else ref
    model = ExpertParallelMoE.from_dense(case.build(dtype), group)
    rows = slice(rank * case.batch // ep, (rank + 1) * case.batch // ep)  # this rank's sequences
    tokens = slice(rows.start * case.seq, rows.stop * case.seq)  # the same, as flat token indices
    x = ref["x"][rows].clone().requires_grad_()

    with commlog.recording() as forward:
        out = model(x)
        aux = model.routing.aux_loss  # this rank's share: the ranks' add up to the batch's
        loss = (out * ref["weight"][rows]).sum() + case.aux_coef * aux
    with commlog.recording() as backward:
        loss.backward()
    with commlog.recording() as grad_sync:
        allreduce_router_grads(model, group)

    grads_as_weights = case.build(dtype)
    with torch.no_grad():
        for name, p in grads_as_weights.named_parameters():
            p.copy_(ref["grads"][name])
    expected = dict(ExpertParallelMoE.from_dense(grads_as_weights, group).named_parameters())
    grad_diffs = {name: max_diff(p.grad, expected[name]) for name, p in model.named_parameters()}
    grad_diffs["<input>"] = max_diff(x.grad, ref["input_grad"][rows])
    kept = model.routing.kept
    return {
        "rank": rank, "output_diff": max_diff(out.detach(), ref["output"][rows]),
        "grad_diff": max(grad_diffs.values()), "grad_diffs": grad_diffs,
        "loss": loss.item(), "aux_loss": aux.item(),
        "routing_equal": bool(torch.equal(kept, ref["kept"][tokens])), "dropped": model.routing.dropped,
        "sent": int(kept.sum()), "received_per_expert": model.received_per_expert,
        "first_expert": model.first_expert, "hidden": case.hidden, "element_size": x.element_size(),
        **{f"batch_{k}": v for k, v in _routing_stats(model.routing).items() if k != "dropped"},
        "forward": forward.as_dict(), "backward": backward.as_dict(), "grad_sync": grad_sync.as_dict(),
    }


def check_cases(jobs: list[dict]) -> list[dict]:
    """Rank function: ``check_case(**job)`` for each job, in one launch (tests use it per ep)."""
    return [check_case(**job) for job in jobs]


def summarize(case: Case, ep: int, ref: dict, results: list[dict]) -> dict:
    """The command's JSON dict from the ranks' results (``collectives``: rank 0's forward and
    backward, as ``run tensor`` reports; every rank's all-to-all bytes in ``all_to_all_bytes``)."""
    measured = [n for r in results for n in r["received_per_expert"]]  # rank order = expert order
    first = results[0]
    return {
        "ep": ep, "experts": case.experts, "top_k": case.top_k, "capacity_factor": case.capacity_factor,
        "dtype": str(ref["x"].dtype).removeprefix("torch."), "case": dataclasses.asdict(case),
        "tokens": case.batch * case.seq, "capacity": ref["capacity"],
        "max_output_diff": max(r["output_diff"] for r in results),
        "max_grad_diff": max(r["grad_diff"] for r in results),
        "loss_diff": abs(sum(r["loss"] for r in results) - ref["loss"]),
        "routing_equal": all(r["routing_equal"] for r in results) and measured == ref["tokens_per_expert"],
        "tokens_per_expert": measured, "reference_tokens_per_expert": ref["tokens_per_expert"],
        "routed_per_expert": ref["routed_per_expert"],
        "dropped": sum(r["dropped"] for r in results), "reference_dropped": ref["dropped"],
        "dropped_tokens": ref["dropped_tokens"],
        "collectives": commlog.merge_counts(first["forward"], first["backward"]),
        "grad_sync": first["grad_sync"],
        "all_to_all_bytes": [commlog.merge_counts(r["forward"], r["backward"]).get("all_to_all_single", {})
                             .get("bytes", 0) for r in results],
    }


def run_moe(ep: int, experts: int = 8, top_k: int = 2, capacity_factor: float | None = 1.25,
            dtype=torch.float64, *, case: Case | None = None, timeout: float = 60.0) -> dict:
    """``parallel-lab run moe``: the MoE layer with ``experts`` experts on ``ep`` ranks against the
    dense layer on one process. Bad sizes fail here, before any process starts."""
    case = Case(experts=experts, top_k=top_k, capacity_factor=capacity_factor) if case is None else case
    check_expert_parallel(case, ep)
    ref = reference(case, dtype)
    results = launcher.run(check_case, ep, kwargs=dict(case=case, ref=ref, dtype=dtype), timeout=timeout)
    return summarize(case, ep, ref, results)
