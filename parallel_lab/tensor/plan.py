"""Apply tensor parallelism to a dense model from outside, with a plan (torchtitan's way).

A plan maps module names (or ``fnmatch`` globs such as ``blocks.*.attn``) to styles:

===================  =======================================  ===================================
style                module                                   becomes
===================  =======================================  ===================================
``colwise``          ``nn.Linear``                            ``ColumnParallelLinear``
``rowwise``          ``nn.Linear`` (input already split)      ``RowParallelLinear``
``mlp``              ``models.MLP``                           ``ParallelMLP``
``attention``        ``models.CausalSelfAttention``           ``ParallelSelfAttention``
``vocab_embedding``  ``nn.Embedding`` / ``models.Embeddings``  ``VocabParallelEmbedding`` / ``ParallelEmbeddings``
``replicate``        anything (LayerNorm)                     itself, computed in full by every rank
===================  =======================================  ===================================

The model's own ``forward`` is untouched: the parallel modules take and return the same shapes, so
``models.Block`` runs as a tensor-parallel block once its ``attn`` and ``mlp`` are swapped. With
``sequence_parallel=True`` activations between the parallel modules are sequence shards
``(B, T/p, H)``; ``replicate`` modules then run on a shard and their parameters are marked for
``layers.allreduce_sequence_parallel_grads`` -- which is why a parameter the plan does not cover is
an error in that mode (its gradient would silently be a partial sum).

``check_tensor_parallel(config, tp, sequence_parallel)`` raises, before any process starts, the
error a bad size would otherwise raise on every rank.
"""

from __future__ import annotations

import copy
from fnmatch import fnmatchcase

import torch.distributed as dist
from torch import nn

from parallel_lab import models
from parallel_lab.i18n import N_, _
from parallel_lab.runtime.prelaunch import MAX_WORLD_SIZE
from parallel_lab.tensor import layers

MLP_PLAN = {"fc1": "colwise", "fc2": "rowwise"}  # the same split as style "mlp"
BLOCK_PLAN = {"ln1": "replicate", "attn": "attention", "ln2": "replicate", "mlp": "mlp"}
GPT_PLAN = {
    "embed": "vocab_embedding",
    **{f"blocks.*.{name}": style for name, style in BLOCK_PLAN.items()},
    "head.ln": "replicate",
    "head.out": "colwise",  # logits stay split by vocabulary: see layers.vocab_parallel_cross_entropy
}


def _column(m, group, sp):
    return layers.ColumnParallelLinear.from_dense(m, group, sequence_parallel=sp)


def _row(m, group, sp):
    return layers.RowParallelLinear.from_dense(m, group, sequence_parallel=sp)


def _embedding(m, group, sp):
    cls = layers.ParallelEmbeddings if isinstance(m, models.Embeddings) else layers.VocabParallelEmbedding
    return cls.from_dense(m, group, sequence_parallel=sp)


def _replicate(m, group, sp):
    for p in m.parameters():
        p.sequence_parallel = sp
    return m


# style -> (the dense module types it accepts, how to build the parallel module)
STYLES = {
    "colwise": ((nn.Linear,), _column),
    "rowwise": ((nn.Linear,), _row),
    "mlp": ((models.MLP,), lambda m, g, sp: layers.ParallelMLP.from_dense(m, g, sequence_parallel=sp)),
    "attention": ((models.CausalSelfAttention,),
                  lambda m, g, sp: layers.ParallelSelfAttention.from_dense(m, g, sequence_parallel=sp)),
    "vocab_embedding": ((nn.Embedding, models.Embeddings), _embedding),
    "replicate": ((nn.Module,), _replicate),
}


def default_plan(model: nn.Module) -> dict:
    """The plan for the course's models: ``GPT_PLAN``, ``BLOCK_PLAN``, ``MLP_PLAN`` or attention."""
    for cls, plan in ((models.GPT, GPT_PLAN), (models.Block, BLOCK_PLAN), (models.MLP, MLP_PLAN),
                      (models.CausalSelfAttention, {"": "attention"})):
        if isinstance(model, cls):
            return dict(plan)
    raise TypeError(f"no default tensor-parallel plan for {type(model).__name__}; pass plan=")


def _inside(name: str, parent: str) -> bool:
    return parent == "" or name == parent or name.startswith(parent + ".")


def resolve_plan(model: nn.Module, plan: dict) -> list[tuple[str, str]]:
    """``[(module name, style)]`` the plan applies to ``model``, outermost first; checks the plan
    without any process (unknown style, a pattern matching nothing, a wrong module type)."""
    for pattern, style in plan.items():
        if style not in STYLES:
            raise ValueError(f"plan entry {pattern!r}: unknown style {style!r}; styles are {sorted(STYLES)}")
    modules = dict(model.named_modules())
    unmatched = [p for p in plan if not any(fnmatchcase(n, p) for n in modules)]
    if unmatched:
        names = ", ".join(repr(n) for n in list(modules)[:12])
        raise ValueError(f"plan entries {unmatched} match no module of {type(model).__name__} (modules: {names}, ...)")
    chosen: list[tuple[str, str]] = []
    for name, module in modules.items():
        if any(_inside(name, parent) for parent, _ in chosen):
            continue  # already inside a module the plan replaces
        styles = {s for p, s in plan.items() if fnmatchcase(name, p)}
        if len(styles) > 1:
            raise ValueError(f"module {name!r} matches plan entries with different styles {sorted(styles)}")
        if styles:
            style = styles.pop()
            accepted = STYLES[style][0]
            if not isinstance(module, accepted):
                wanted = " or ".join(c.__name__ for c in accepted)
                raise TypeError(f"plan: {name!r} is a {type(module).__name__}; style {style!r} needs {wanted}")
            chosen.append((name, style))
    return chosen


def parallelize(model: nn.Module, plan: dict | None = None, group=None, *, sequence_parallel=False) -> nn.Module:
    """A tensor-parallel copy of ``model`` for this rank of ``group`` (``model`` is left as is).

    ``plan``: ``{module name or glob: style}`` (default: ``default_plan(model)``). Runs on a rank
    (it reads the rank and size of ``group``); every rank must call it with the same dense model.
    """
    chosen = resolve_plan(model, default_plan(model) if plan is None else plan)
    model = copy.deepcopy(model)
    covered = set()
    for name, style in chosen:
        new = STYLES[style][1](model.get_submodule(name), group, sequence_parallel)
        if name == "":
            model = new
        else:
            model.set_submodule(name, new)
        covered |= {id(p) for p in new.parameters()}
    if sequence_parallel and dist.get_world_size(group) > 1:
        left = [n for n, p in model.named_parameters() if id(p) not in covered]
        if left:
            raise ValueError(
                f"sequence parallel: parameters {left} are not covered by the plan; each rank would "
                f"see only its sequence shard, so their gradients would be partial sums. Give their "
                f"modules a style ('replicate' for a LayerNorm)."
            )
    return model


def check_tensor_parallel(config: models.GPTConfig, tp: int, sequence_parallel: bool = False) -> None:
    """Raise ``ValueError`` naming the broken invariant if ``config`` cannot be split ``tp`` ways.

    Call it in the parent, before starting ranks. ``config`` needs ``hidden``, ``heads``, ``vocab``,
    ``seq`` and ``dropout`` (a ``models.GPTConfig``).
    """
    if isinstance(tp, bool) or not isinstance(tp, int):
        raise TypeError(f"tp must be an int, got {tp!r}")
    if tp < 1:
        raise ValueError(f"tp must be at least 1, got {tp}")
    if tp > MAX_WORLD_SIZE:
        raise ValueError(f"tp {tp} is larger than the {MAX_WORLD_SIZE} ranks available")
    needs = [
        (config.hidden, N_("hidden {size} is not divisible by tp {tp} (each rank holds hidden/tp of the attention "
                           "width)")),
        (config.heads, N_("heads {size} is not divisible by tp {tp} (each rank holds heads/tp whole heads)")),
        (config.vocab, N_("vocab {size} is not divisible by tp {tp} (each rank holds vocab/tp rows of the embedding "
                          "and the LM head)")),
    ]
    if sequence_parallel:
        needs.append((config.seq, N_("sequence length {size} is not divisible by tp {tp} (each rank holds seq/tp "
                                     "positions between layers)")))
    for size, message in needs:
        if size % tp:
            raise ValueError(_(message).format(size=size, tp=tp))
    if config.dropout and tp > 1:
        raise ValueError(
            f"dropout {config.dropout} with tp {tp}: tensor-parallel dropout needs Megatron's RNG "
            f"tracker (the same mask on replicated activations, different masks on shards), which "
            f"parallel_lab does not implement; use dropout=0"
        )
