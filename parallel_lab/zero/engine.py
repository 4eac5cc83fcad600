"""ZeRO stages 0-3 over one explicit data-parallel group, applied from outside to an unchanged model.

    engine = Zero(model, group, stage=3, lr=1e-2)      # model: models.GPT, never edited
    loss = models.cross_entropy(model(idx[my_rows]), targets[my_rows])
    loss.backward()                                    # stages 2-3 communicate inside the backward
    engine.step()                                      # stages 0-2 communicate here; then Adam
    engine.full_state()                                # {name: the whole parameter}, on every rank

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
section 5; Zhao et al. 2023, "PyTorch FSDP", section 3 for the units and the flat parameter:

- The model is cut into **units** (``gpt_units``: the embeddings, each block, the head -- how FSDP
  wraps a transformer). A unit's parameters become one flat buffer padded to a multiple of N
  (``FlatUnit``); each parameter's ``.data`` is a view of it, so the modules and their parameter
  objects stay what they were. Rank r owns the slice ``[r*s, (r+1)*s)`` of every flat buffer.
- **Stage 0**, plain data parallelism: after the backward, one all-reduce per unit of its gradient,
  divided by N; Adam on everything, on every rank.
- **Stage 1** (P_os): Adam's moments only for this rank's slice. After the backward a reduce-scatter
  per unit leaves this rank its slice of the summed gradient (in place: the output is that slice of
  the input, as NCCL allows and gloo does); Adam updates the slice; an all-gather puts every rank's
  updated slice back into the full parameters (2Ψ moved, like the all-reduce: section 7.2.1).
- **Stage 2** (P_os+g): gradients sharded too. A unit's full gradient exists only from the start of
  its backward (a hook on its output's gradient allocates it) until its last parameter's gradient
  has been accumulated (``register_post_accumulate_grad_hook``), when it is reduce-scattered into
  the rank's gradient slice and freed.
- **Stage 3** (P_os+g+p, FSDP's FULL_SHARD): parameters sharded too. The flat buffer's storage is
  resized to 0 bytes between uses; a forward pre-hook resizes it and all-gathers the slices into it,
  the forward hook frees it again, the backward hook on the unit's output gathers it once more, and
  it is freed with the gradient after the reduce-scatter: 3Ψ moved per step (section 7.2.2).
  Resizing the storage (not replacing the tensor) is what keeps autograd's saved views of the
  weights valid (FSDP does the same).

Gradients are averaged over the group (sum / N): with equal slices of the batch that is the gradient
of the whole batch's mean loss. One backward per step (no gradient accumulation across backwards).

``overlap=True`` keeps collectives in flight during the compute (``zero.overlap``: per-unit buckets
as DDP, ZeRO-3 prefetch); a ``Recorder`` in ``engine.recorder`` records a step's compute, issues and
waits for the virtual clock.

``live_bytes`` measures the model state this rank holds now: the distinct storages behind the
model's parameters and gradients and the engine's shards and moments, by category (see
``zero.memory`` for the prediction); every hook samples it, ``peak`` keeps the maxima.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from parallel_lab.zero.adam import AdamState, adam_step
from parallel_lab.zero.memory import CATEGORIES, check_stage
from parallel_lab.zero.overlap import Recorder


def gpt_units(model) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of the course GPT's units: ``embed``, ``blocks.0`` ... ``blocks.L-1``, ``head``."""
    return [("embed", model.embed), *((f"blocks.{i}", b) for i, b in enumerate(model.blocks)),
            ("head", model.head)]


class FlatUnit:
    """The parameters of ``module`` as one flat buffer of ``padded = dp * shard_numel`` values (zeros
    after the last parameter), each parameter's ``.data`` a view of it; this rank's slice is
    ``flat[lo:hi]``. Parameters keep their values; the module does not change."""

    def __init__(self, name: str, module: nn.Module, dp: int, rank: int):
        self.name, self.module = name, module
        self.params = list(module.parameters())
        if not self.params:
            raise ValueError(f"unit {name!r} has no parameters")
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) > 1:
            raise ValueError(f"unit {name!r} mixes dtypes {sorted(map(str, dtypes))}: one flat buffer needs one")
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = -(-self.numel // dp)  # ceil
        self.padded = self.shard_numel * dp
        self.lo, self.hi = rank * self.shard_numel, (rank + 1) * self.shard_numel
        first = self.params[0]
        self.flat = torch.zeros(self.padded, dtype=first.dtype, device=first.device)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                self.flat[offset:offset + n].copy_(p.reshape(-1))
                p.data = self.flat[offset:offset + n].view_as(p)
                offset += n
        self.nbytes = self.padded * self.flat.element_size()
        # Filled in by the engine, per stage:
        self.shard = self.flat[self.lo:self.hi]  # this rank's parameters (a clone in stage 3)
        self.grad = None  # the full flat gradient, while it exists
        self.grad_shard = None  # this rank's slice of the averaged gradient (stages 2-3: from its
        #                         reduce-scatter until Adam has used it)
        self.adam: AdamState | None = None
        self.pending = 0  # parameters whose gradient this backward has not accumulated yet
        self.in_backward = False
        self.reduced = False  # this step's gradient is in grad_shard (stages 2-3)

    def grad_views(self) -> None:
        """Point every parameter's ``.grad`` at its slice of ``self.grad`` (autograd then accumulates
        in place, as DDP's ``gradient_as_bucket_view``)."""
        offset = 0
        for p in self.params:
            p.grad = self.grad[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

    # Stage 3: the full parameters exist only between gather() and free().
    def gathered(self) -> bool:
        return self.flat.untyped_storage().nbytes() > 0

    def materialize(self) -> None:
        self.flat.untyped_storage().resize_(self.nbytes)

    def free(self) -> None:
        self.flat.untyped_storage().resize_(0)


class Zero:
    """ZeRO ``stage`` (0-3) data parallelism of ``model`` over ``group`` with Adam (``lr``, ``betas``,
    ``eps`` as ``torch.optim.Adam``). ``units``: ``(name, module)`` pairs covering every parameter
    exactly once, in forward order (default ``gpt_units(model)``); ``overlap``: collectives in flight
    during the compute (see ``zero.overlap``)."""

    def __init__(self, model: nn.Module, group=None, stage: int = 0, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, units=None,
                 overlap: bool = False):
        self.model, self.group, self.stage = model, group, check_stage(stage)
        self.lr, self.betas, self.eps, self.overlap = lr, betas, eps, bool(overlap)
        self.recorder: Recorder | None = None  # set one for a step to record its program (zero.overlap)
        self._inflight: list = []  # (unit, handle) of gradient collectives not waited for yet
        self._gathering: dict = {}  # unit name -> handle of a prefetched all-gather (stage 3)
        self.dp, self.rank = dist.get_world_size(group), dist.get_rank(group)
        pairs = gpt_units(model) if units is None else list(units)
        self._check_cover(model, pairs)
        self.units = [FlatUnit(name, module, self.dp, self.rank) for name, module in pairs]
        self.names = {id(p): name for name, p in model.named_parameters()}
        self.peak = dict.fromkeys((*CATEGORIES, "total"), 0)
        self.handles = []
        for unit in self.units:
            self._shard(unit)
            self._hook(unit)
        self.sample()

    @staticmethod
    def _check_cover(model, pairs) -> None:
        owner: dict[int, list[str]] = {}
        for name, module in pairs:
            for p in module.parameters():
                owner.setdefault(id(p), []).append(name)
        names = {id(p): n for n, p in model.named_parameters()}
        missing = [n for i, n in names.items() if i not in owner]
        twice = [f"{names.get(i, '?')} in {units}" for i, units in owner.items() if len(units) > 1]
        if missing or twice:
            raise ValueError(f"units must cover every parameter exactly once: missing {missing[:4]}, "
                             f"in several units {twice[:4]}")

    def _shard(self, u: FlatUnit) -> None:
        """What this rank keeps of unit ``u`` between steps, by stage."""
        if self.stage < 2:  # the full gradient lives on; stage 1 reduces into its own slice of it
            u.grad = torch.zeros_like(u.flat)
            u.grad_views()
            u.grad_shard = u.grad if self.stage == 0 else u.grad[u.lo:u.hi]
        if self.stage == 3:
            u.shard = u.flat[u.lo:u.hi].clone()
            u.free()
        u.adam = AdamState.zeros_like(u.flat if self.stage == 0 else u.shard)

    def _hook(self, u: FlatUnit) -> None:
        self.handles.append(u.module.register_forward_pre_hook(lambda m, args, u=u: self._before_forward(u)))
        self.handles.append(u.module.register_forward_hook(lambda m, args, out, u=u: self._after_forward(u, out)))
        for p in u.params:
            self.handles.append(p.register_post_accumulate_grad_hook(lambda p, u=u: self._accumulated(u)))

    # ------------------------------------------------------------------------------------------
    # Collectives: all asynchronous underneath; a blocking one is waited for at once.

    def _launch(self, op: str, u: FlatUnit, out, inp=None):
        """Hand ``op`` on unit ``u``'s buffers to the group without waiting: ``(work, k)``."""
        k = self.recorder.issue(op, u.nbytes, u.name) if self.recorder is not None else None
        if op == "all_reduce":
            work = dist.all_reduce(out, group=self.group, async_op=True)
        elif op == "reduce_scatter_single":
            work = dist.reduce_scatter_single(out, inp, group=self.group, async_op=True)
        else:
            work = dist.all_gather_single(out, inp, group=self.group, async_op=True)
        return work, k

    def _wait(self, handle) -> None:
        work, k = handle
        work.wait()
        if self.recorder is not None:
            self.recorder.wait(k)

    def _blocking(self, op: str, u: FlatUnit, out, inp=None) -> None:
        self._wait(self._launch(op, u, out, inp))

    # ------------------------------------------------------------------------------------------
    # Hooks.

    def _doing(self, activity: str) -> None:
        if self.recorder is not None:
            self.recorder.doing(activity)

    def _gather(self, u: FlatUnit, prefetch: bool = False) -> None:
        """Stage 3: the unit's full parameters from every rank's slice (``prefetch``: do not wait)."""
        if u.name in self._gathering:
            if not prefetch:
                self._wait(self._gathering.pop(u.name))
            return
        if u.gathered():
            return
        u.materialize()
        handle = self._launch("all_gather_single", u, u.flat, u.shard)
        if prefetch:
            self._gathering[u.name] = handle
        else:
            self._wait(handle)
        self.sample()

    def _prefetch(self, u: FlatUnit, direction: int) -> None:
        """Stage 3 with overlap: start gathering the unit after ``u`` in the pass's order."""
        i = self.units.index(u) + direction
        if self.overlap and 0 <= i < len(self.units):
            self._gather(self.units[i], prefetch=True)

    def _before_forward(self, u: FlatUnit) -> None:
        self._doing(f"F {u.name}")
        if self.stage == 3:
            self._gather(u)
            self._prefetch(u, +1)

    def _after_forward(self, u: FlatUnit, out) -> None:
        if self.stage == 3:
            u.free()
        if torch.is_grad_enabled() and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad, u=u: self._before_backward(u))

    def _before_backward(self, u: FlatUnit) -> None:
        """The gradient of the unit's output is known: its backward starts now."""
        if u.in_backward:
            return
        if u.reduced:
            raise RuntimeError(f"unit {u.name}: a second backward before step(); one backward per step")
        self._doing(f"B {u.name}")
        u.in_backward, u.pending = True, len(u.params)
        if self.stage == 3:
            self._gather(u)
            self._prefetch(u, -1)
        if self.stage >= 2:
            u.grad = torch.zeros_like(u.flat)
            u.grad_views()

    def _accumulated(self, u: FlatUnit) -> None:
        """A parameter's gradient is in ``u.grad``; after the unit's last one the unit's gradient is
        complete: stages 2-3 reduce-scatter it (stage 2 with overlap: asynchronously, waiting for the
        previous unit's), stages 0-1 with overlap start its all-reduce / reduce-scatter."""
        u.pending -= 1
        if u.pending:
            return
        u.in_backward, u.reduced = False, True
        if self.stage < 2:
            if self.overlap:
                op = "all_reduce" if self.stage == 0 else "reduce_scatter_single"
                self._inflight.append((u, self._launch(op, u, u.grad_shard, u.grad if self.stage else None)))
            return
        u.grad_shard = torch.empty(u.shard_numel, dtype=u.flat.dtype, device=u.flat.device)
        if self.stage == 2 and self.overlap:
            self._inflight.append((u, self._launch("reduce_scatter_single", u, u.grad_shard, u.grad)))
            self.sample()  # the peak: this unit's full gradient and the previous one's, in flight
            if len(self._inflight) > 1:
                self._finish(*self._inflight.pop(0))
            return
        self.sample()  # the peak: full gradient (and, stage 3, full parameters) still here
        self._blocking("reduce_scatter_single", u, u.grad_shard, u.grad)
        self._finish(u, None)

    def _finish(self, u: FlatUnit, handle) -> None:
        """The unit's gradient is reduced (after ``handle``, if in flight): average it; stages 2-3
        free the full gradient, stage 3 the full parameters."""
        if handle is not None:
            self._wait(handle)
        u.grad_shard.div_(self.dp)
        if self.stage >= 2:
            for p in u.params:
                p.grad = None
            u.grad = None
        if self.stage == 3:
            u.free()

    # ------------------------------------------------------------------------------------------
    # The step.

    @torch.no_grad()
    def step(self) -> None:
        """Finish the gradients (stages 0-1, and what is still in flight), Adam on what this rank
        owns, share the parameters back (stages 1-2), and get ready for the next step."""
        self._doing("step")
        while self._inflight:
            self._finish(*self._inflight.pop(0))
        for u in self.units:
            if self.stage < 2 and not self.overlap:
                self._blocking("all_reduce" if self.stage == 0 else "reduce_scatter_single", u, u.grad_shard,
                               u.grad if self.stage else None)
                self._finish(u, None)
            elif not u.reduced:
                raise RuntimeError(f"unit {u.name} got no gradient: every unit needs a backward before step()")
        self.sample()
        for u in self.units:
            self._doing(f"adam {u.name}")
            adam_step(u.flat if self.stage == 0 else u.shard, u.grad_shard, u.adam, self.lr, self.betas, self.eps)
            if self.stage in (1, 2):  # in place: the shard is a slice of the flat buffer
                self._blocking("all_gather_single", u, u.flat, u.shard)
            if self.stage < 2:
                u.grad.zero_()
            else:  # as zero_grad(set_to_none=True): the next backward makes a new one
                u.grad_shard = None
            u.reduced = False
        self._doing("end")
        self.sample()

    # ------------------------------------------------------------------------------------------
    # What a rank holds.

    def live_bytes(self) -> dict:
        """Bytes of the model state alive on this rank now, per category (``zero.memory.CATEGORIES``)
        and ``total``: each distinct storage once, at its current size (a freed unit counts 0)."""
        out = dict.fromkeys(CATEGORIES, 0)
        seen = set()

        def add(category, t):
            if t is None:
                return
            storage = t.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in seen:
                return
            seen.add(storage.data_ptr())
            out[category] += storage.nbytes()

        for u in self.units:
            add("optimizer", u.adam.exp_avg)
            add("optimizer", u.adam.exp_avg_sq)
            add("gradients", u.grad_shard)
            add("parameters", u.shard)
        for p in self.model.parameters():  # full units: persistent in stages 0-2, transient in 3
            add("parameters" if self.stage < 3 else "buffers", p)
        for p in self.model.parameters():  # full gradients: persistent in stages 0-1, transient in 2-3
            add("gradients" if self.stage < 2 else "buffers", p.grad)
        out["total"] = sum(out.values())
        return out

    def sample(self) -> None:
        """Keep the per-category maxima of ``live_bytes`` in ``peak`` (not charged to the virtual clock)."""
        if self.recorder is not None:
            with self.recorder.paused():
                now = self.live_bytes()
        else:
            now = self.live_bytes()
        for key, value in now.items():
            self.peak[key] = max(self.peak[key], value)

    @torch.no_grad()
    def full_state(self) -> dict:
        """``{parameter name: a copy of the whole parameter}`` on every rank (stage 3 gathers each
        unit for it; every rank must call it)."""
        out = {}
        for u in self.units:
            was_free = self.stage == 3 and not u.gathered()
            if was_free:
                u.materialize()
                dist.all_gather_single(u.flat, u.shard, group=self.group)
            for p in u.params:
                out[self.names[id(p)]] = p.detach().clone()
            if was_free:
                u.free()
        return out

    def remove(self) -> None:
        """Take the hooks off the model. Its parameters stay views of the flat buffers, which in
        stage 3 hold nothing between uses: take ``full_state()`` first."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
