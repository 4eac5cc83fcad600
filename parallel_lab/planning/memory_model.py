"""Training memory per device under 3D parallelism: weights, gradients, optimizer state, activations.

    from parallel_lab.planning import memory, memory_model
    gpt3 = memory.MODELS["GPT-3 175B"]
    memory_model.device_memory(gpt3, micro_batch=1, dp=8, pp=8, tp=8, sequence_parallel=True,
                               schedule="1f1b", microbatches=64, recompute="selective")
    # -> the most loaded pipeline rank: {"stage", "params", "weights", "gradients", "optimizer",
    #    "activations", "in_flight", "total"} in bytes

Extends ``parallel_lab.planning.memory`` (one device) to a (dp, pp, tp) mesh:

- **Parameters** are counted as the course GPT has them (``parallel_lab.models``: biases, LayerNorms,
  an untied LM head): ``L(12h^2 + 13h) + (V + s)h + 2h + Vh``. Under tensor parallelism (Megatron:
  Shoeybi et al. 2019) the weight matrices and the biases of column-parallel layers are split by
  ``tp``; LayerNorms, row-parallel biases and position embeddings are replicated: a layer keeps
  ``(12h^2 + 7h)/tp + 6h``. Pipeline stage 0 also holds the embeddings, the last stage the head.
- **Model state**: 2 + 2 + 12 bytes per parameter in mixed precision (``memory.PRECISIONS``), sharded
  over the ``dp`` replicas by ZeRO stage ``zero`` (Rajbhandari et al. 2020, "ZeRO", section 5 and
  Figure 1; the one formula is ``parallel_lab.zero.memory.per_rank``): stage 1 the optimizer state,
  stage 2 the gradients too, stage 3 the parameters too. Stages 2-3 add ``buffers``: the transient
  full units (a unit is one transformer layer on this TP rank; stage 2 one layer's gradient plus the
  one in flight, stage 3 its gathered parameters and gradient plus the next layer prefetched;
  Zhao et al. 2023, section 3.2.1). ``zero1=True`` is the older spelling of ``zero=1``.
- **Activations per layer** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", Table 2), with 2-byte values and dropout:
  ``sbh(34 + 5as/h)`` without parallelism; ``sbh(10 + 24/t + 5as/(ht))`` with tensor parallelism t;
  ``sbh(34/t + 5as/(ht))`` with tensor + sequence parallelism. Selective recomputation drops the
  ``5as/h`` term (the attention scores are recomputed); full recomputation keeps only the layer
  input, ``2sbh`` (``/t`` with sequence parallelism).
  Generally, with v bytes per value: 16 sbh-sized tensors (4 of them replicated under plain TP:
  the two LayerNorm inputs and the inputs of the QKV and first MLP projections) + two 1-byte
  dropout masks, and per head the s x s softmax output (v bytes) + its dropout mask (1) + dropout
  output (v).
- **Micro-batches in flight**: how many micro-batches' activations a pipeline rank holds at its peak
  comes from the schedule simulator (``parallel_lab.pipeline.simulate``: ``peak_rank_activations``,
  in units of one micro-batch's activations M_B): m for GPipe, min(m, p - r) for 1F1B on rank r, more
  for interleaved 1F1B (v chunks of L/(pv) layers). A split backward (ZB-H1, ZB-V) keeps M_W from I
  until W (``weight_grad_bytes_per_layer``: every Linear's input and output gradient, Qi et al. 2023,
  Table 1), so ZB-H1 holds (p - r) M_B + r M_W on rank r once m >= p: almost p M_B on every rank.
- The last stage also keeps the head's input and the fp32 logits for the loss: ``(v·sbh + 4sbV)/t``.

- **Experts** (``model.experts`` E > 0: every block's MLP a mixture of E experts, ``models.MoE``):
  a block keeps attention and LayerNorms as above, a router ``h x E`` (replicated) and E expert MLPs
  ``8h^2 + 5h`` each, split by ``tp`` like the dense MLP. Expert parallelism ``ep`` (Lepikhin et al.
  2020, "GShard", section 2.2; Rajbhandari et al. 2022, "DeepSpeed-MoE", section 5: EP groups carved
  out of the data-parallel group, ``ep`` | dp and ``ep`` | E) leaves E/ep experts on a device, whose
  state is replicated (and ZeRO-sharded) over the dp·cp/ep ranks of its expert-data-parallel group.
  Activations: each token passes ``top_k`` experts, so the MLP's per-token tensors are kept
  top_k times, plus the dispatched input and the expert output the combine needs
  (``10·v·top_k`` instead of the dense ``8v``); the router's logits are negligible. Balanced routing
  and no capacity padding (Fedus et al. 2021, "Switch Transformers", capacity factor 1).
- **Context parallelism** ``cp`` (ring attention: Liu et al. 2023, "Ring Attention with Blockwise
  Transformers"; ``parallel_lab.context``): each rank keeps its ``s/cp`` positions, so every
  ``sbh`` term is computed with ``s/cp``. Ring attention works block by block with an online softmax
  and recomputes each block in the backward (as FlashAttention), so no score tensor is kept per
  layer; the device holds one ``(s/cp)^2`` block of its ``heads/tp`` heads at a time:
  ``context.cost``'s ``score_peak_bytes`` (``scores`` in a row). Dense state is replicated and
  ZeRO-sharded over dp·cp (Megatron-Core reduces gradients over the data- and context-parallel
  ranks together).

Not counted: temporary buffers (communication buckets, workspace), fragmentation, the CUDA context,
the K/V blocks in flight of ring attention and the all-to-all buffers of expert parallelism.
"""

from __future__ import annotations

import functools
import math

from parallel_lab.checks import positive_int
from parallel_lab.context.cost import context_cost
from parallel_lab.hardware import Link
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import M_W_SHARE, simulate
from parallel_lab.planning import memory
from parallel_lab.zero import memory as zero_memory

RECOMPUTE = ("none", "selective", "full")
GB = memory.GB


def check_recompute(recompute: str) -> str:
    if recompute not in RECOMPUTE:
        raise ValueError(f"unknown recompute {recompute!r}; choose one of {', '.join(RECOMPUTE)}")
    return recompute


# ----------------------------------------------------------------------------------------------
# Parameters.


def layer_params(hidden: int, tp: int = 1) -> int:
    """Parameters of one transformer block on one tensor-parallel rank: ``(12h^2 + 7h)/tp + 6h``."""
    h, tp = positive_int("hidden", hidden), positive_int("tp", tp)
    if h % tp:
        raise ValueError(f"hidden {h} % tp {tp} != 0")
    return (12 * h * h + 7 * h) // tp + 6 * h


def moe_layer_params(hidden: int, experts: int, tp: int = 1, ep: int = 1) -> tuple[int, int]:
    """``(dense, expert)`` parameters of one mixture-of-experts block on one (tp, ep) rank:
    attention ``(4h^2 + 3h)/tp + h``, two LayerNorms ``4h`` and the router ``h·E`` (replicated; the
    dense part), and its E/ep experts ``(8h^2 + 4h)/tp + h`` each (``models.MoE``'s MLPs; GShard,
    Lepikhin et al. 2020: experts split over the EP ranks)."""
    h, E = positive_int("hidden", hidden), positive_int("experts", experts)
    tp, ep = positive_int("tp", tp), positive_int("ep", ep)
    if h % tp:
        raise ValueError(f"hidden {h} % tp {tp} != 0")
    if E % ep:
        raise ValueError(f"experts {E} % ep {ep} != 0: expert parallel ranks would hold unequal numbers of experts")
    dense = (4 * h * h + 3 * h) // tp + h + 4 * h + h * E
    return dense, E // ep * ((8 * h * h + 4 * h) // tp + h)


def param_count(layers: int, hidden: int, vocab: int, seq: int, experts: int = 0) -> int:
    """All parameters of ``models.GPT`` with these sizes (untied head, biases, LayerNorms; with
    ``experts`` > 0 a ``models.MoE`` in every block)."""
    L, h = positive_int("layers", layers), positive_int("hidden", hidden)
    V, s = positive_int("vocab", vocab), positive_int("seq", seq)
    block = sum(moe_layer_params(h, experts)) if experts else layer_params(h)
    return L * block + (V + s) * h + 2 * h + V * h


def active_param_count(model: memory.ModelConfig) -> int:
    """Parameters of ``models.GPT`` one token passes through: its ``top_k`` experts in place of all
    E (Fedus et al. 2021, "Switch Transformers", section 2); ``param_count`` for a dense model."""
    m = model
    if not m.experts:
        return param_count(m.layers, m.hidden, m.vocab, m.seq)
    dense, expert = moe_layer_params(m.hidden, m.experts)
    block = dense + m.top_k * expert // m.experts
    return m.layers * block + (m.vocab + m.seq) * m.hidden + 2 * m.hidden + m.vocab * m.hidden


def stage_params(model: memory.ModelConfig, pp: int = 1, tp: int = 1, stage: int = 0, ep: int = 1) -> int:
    """Parameters held by one device of pipeline stage ``stage`` (of ``pp``) with tensor parallel ``tp``
    (and expert parallel ``ep``): its ``layers/pp`` blocks, plus the embeddings on stage 0 and the
    head on the last stage. ``stage_param_split`` separates the experts' share."""
    return sum(stage_param_split(model, pp, tp, stage, ep))


V_SCHEDULES = ("zb-v", "dualpipe-v")  # rank r holds stages r and 2p-1-r: the first and the last on rank 0


def head_rank(schedule: str, pp: int) -> int:
    """The pipeline rank that holds the LM head: the last one, or rank 0 for the V schedules."""
    return 0 if schedule in V_SCHEDULES else pp - 1


def even_split(layers: int, pp: int) -> tuple[int, ...]:
    """``layers / pp`` blocks on every pipeline rank (ValueError unless pp divides layers)."""
    if layers % pp:
        raise ValueError(f"layers {layers} % pp {pp} != 0: stages would hold unequal numbers of blocks")
    return (layers // pp,) * pp


def light_ends_split(layers: int, pp: int) -> tuple[int, ...] | None:
    """Blocks per rank when ``pp`` does not divide ``layers``: floor(layers / pp) on every rank and one
    more on ``layers % pp`` middle ranks, so the first and last ranks, which also hold the embedding
    and the LM head, get the fewer (Megatron-LM's ``--decoder-first/last-pipeline-num-layers``, here
    chosen for them). None when it cannot be done (fewer blocks than ranks, or too few middle ranks)."""
    q, extra = divmod(layers, pp)
    if not q or not extra or extra > pp - 2:
        return None
    middle = range(1, pp - 1)
    more = {middle[round(i * (pp - 2) / extra)] for i in range(extra)}  # spread over the middle
    return tuple(q + (r in more) for r in range(pp))


@functools.lru_cache(maxsize=65536)
def stage_param_split(model: memory.ModelConfig, pp: int = 1, tp: int = 1, stage: int = 0,
                      ep: int = 1, layers: int | None = None, head: int | None = None) -> tuple[int, int]:
    """``(dense, expert)``: ``stage_params`` split into what is replicated over the data-parallel
    group and the E/ep experts per block, replicated only over the expert-data-parallel group
    (dp/ep ranks; DeepSpeed-MoE, Rajbhandari et al. 2022, section 5). ``expert`` is 0 for a dense model.
    ``layers``: the blocks on this stage (default layers / pp, which pp must divide); ``head``: the
    stage that holds the LM head (default the last; rank 0 in the V schedules, ``head_rank``)."""
    pp, tp, ep = positive_int("pp", pp), positive_int("tp", tp), positive_int("ep", ep)
    if ep > 1 and not model.experts:
        raise ValueError(f"ep {ep} needs a model with experts, got experts {model.experts}")
    if layers is None:
        layers = even_split(model.layers, pp)[0]
    if not 0 <= stage < pp:
        raise ValueError(f"stage must be in 0..{pp - 1}, got stage {stage}")
    if model.vocab % tp:  # Megatron pads the vocabulary instead; count the padded rows
        vocab_rows = math.ceil(model.vocab / tp)
    else:
        vocab_rows = model.vocab // tp
    h = model.hidden
    if model.experts:
        dense, expert = moe_layer_params(h, model.experts, tp, ep)
        count, experts = layers * dense, layers * expert
    else:
        count, experts = layers * layer_params(h, tp), 0
    if stage == 0:
        count += vocab_rows * h + model.seq * h  # token embedding split by vocabulary rows; positions replicated
    if stage == (pp - 1 if head is None else head):
        count += 2 * h + vocab_rows * h  # final LayerNorm (replicated) + output projection
    return count, experts


# ----------------------------------------------------------------------------------------------
# Activations.


def activation_bytes_per_layer(seq: int, micro_batch: int, hidden: int, heads: int, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               value_bytes: int = 2, dropout: bool = True, top_k: int = 0,
                               cp: int = 1) -> float:
    """Bytes one transformer layer keeps for backward, per micro-batch, on one device (Korthikanti
    et al. 2022; see the module doc). ``value_bytes`` 2 and ``dropout`` True give the paper's
    formulas; the course GPT in fp32 without dropout is ``value_bytes=4, dropout=False``.
    ``top_k`` > 0: a mixture-of-experts block whose tokens each pass ``top_k`` experts (the MLP's
    8v per token becomes 10v·top_k: the dispatched input, fc1 and GELU outputs, the expert output).
    ``cp`` > 1: ring attention over ``cp`` ranks, ``seq/cp`` positions here and no scores kept
    (the transient block is ``context.cost``'s ``score_peak_bytes``, counted once per device)."""
    s, b, h, a = (positive_int(n, v) for n, v in (("seq", seq), ("micro_batch", micro_batch),
                                                    ("hidden", hidden), ("heads", heads)))
    t, v, mask = positive_int("tp", tp), value_bytes, 1 if dropout else 0
    cp = positive_int("cp", cp)
    if s % cp:
        raise ValueError(f"seq {s} % cp {cp} != 0: context parallel ranks would hold unequal numbers of positions")
    s //= cp
    check_recompute(recompute)
    if sequence_parallel and t == 1:
        sequence_parallel = False  # nothing to split
    sbh = s * b * h
    if recompute == "full":
        return v * sbh / t if sequence_parallel else v * sbh
    replicated = 4 * v + 2 * mask  # LN inputs, QKV input, MLP input (+ two dropout masks)
    split = 12 * v                 # Q, K, V, attention output, MLP 4h output and GELU output
    if top_k:  # per assignment: the dispatched input, fc1 out (4h), GELU out (4h), the expert's output
        split += 10 * v * positive_int("top_k", top_k) - 8 * v
    per_sbh = (replicated + split) / t if sequence_parallel else replicated + split / t
    no_scores = recompute == "selective" or cp > 1  # ring attention recomputes its blocks
    scores = 0.0 if no_scores else a * s * s * b * (2 * v + mask if dropout else v) / t
    return sbh * per_sbh + scores


def weight_grad_bytes_per_layer(seq: int, micro_batch: int, hidden: int, tp: int = 1,
                                sequence_parallel: bool = False, value_bytes: int = 2) -> float:
    """M_W: bytes one transformer layer keeps from its input-gradient pass I to its weight-gradient
    pass W, per micro-batch, on one device. W computes dW = dY^T X for each of the four Linears, so
    it keeps each one's input X (QKV and MLP-in: sbh each, replicated under plain TP; attention-out:
    sbh/t; MLP-out: 4sbh/t) and output gradient dY (QKV 3sbh, attention-out sbh, MLP-in 4sbh,
    MLP-out sbh, each /t): 16 sbh-sized values without parallelism, Qi et al. 2023's M_W = 32sbh
    (Table 1, 2-byte values). With sequence parallelism the two replicated inputs are split too."""
    s, b, h = (positive_int(n, v) for n, v in (("seq", seq), ("micro_batch", micro_batch), ("hidden", hidden)))
    t, v = positive_int("tp", tp), value_bytes
    replicated = 2.0 / t if sequence_parallel else 2.0  # QKV and MLP-in inputs
    return v * s * b * h * (replicated + 14.0 / t)  # + attention-out 1, MLP-out 4, gradients 9, all /t


def head_activation_bytes(seq: int, micro_batch: int, hidden: int, vocab: int, tp: int = 1,
                          value_bytes: int = 2) -> float:
    """The last stage's extra per micro-batch: the final LayerNorm's input and fp32 logits."""
    return (value_bytes * seq * micro_batch * hidden + 4 * seq * micro_batch * vocab) / tp


@functools.lru_cache(maxsize=4096)
def _simulated_in_flight(schedule: str, pp: int, microbatches: int, virtual: int, w_share: float) -> tuple:
    return tuple(simulate(build(schedule, pp, microbatches, virtual), w_share=w_share).peak_rank_activations)


def in_flight(schedule: str, pp: int, microbatches: int, virtual: int = 1, w_share: float = M_W_SHARE) -> list:
    """Per pipeline rank, the most micro-batch *chunks* of activations held at once (a chunk is
    ``L/(pp*virtual)`` layers), in units of a chunk's M_B, from the simulator; a split backward holds
    ``w_share`` = M_W / M_B of a chunk from I until W. Once the pipeline is full the peak stops growing
    with m (1F1B and ZB-H1 from m = pp, interleaved 1F1B from m = 2 pp), so those are simulated with
    m capped at 2 pp + m % pp (tested equal to the uncapped run); GPipe stashes all m by construction."""
    pp, m, v = (positive_int(n, x) for n, x in (("pp", pp), ("microbatches", microbatches), ("virtual", virtual)))
    if schedule == "gpipe":
        return [m] * pp
    capped = m if m <= 2 * pp else 2 * pp + (m % pp)  # keeps m % pp (interleaving needs it 0)
    return list(_simulated_in_flight(schedule, pp, capped, v, round(float(w_share), 9)))


# ----------------------------------------------------------------------------------------------
# Per device.


def check_ep_cp(model: memory.ModelConfig, dp: int = 1, ep: int = 1, cp: int = 1) -> None:
    """The invariants of expert and context parallelism, or a ValueError naming the broken one with
    its values: EP groups are carved out of the data-parallel group (ep | dp) and hold equal numbers
    of experts (ep | E; GShard, DeepSpeed-MoE), CP ranks equal numbers of positions (cp | seq)."""
    dp, ep, cp = positive_int("dp", dp), positive_int("ep", ep), positive_int("cp", cp)
    if ep > 1 and not model.experts:
        raise ValueError(f"ep {ep} needs a model with experts, got experts {model.experts}")
    if model.experts and model.experts % ep:
        raise ValueError(f"experts {model.experts} % ep {ep} != 0: expert parallel ranks would hold "
                         f"unequal numbers of experts")
    if dp % ep:
        raise ValueError(f"dp {dp} % ep {ep} != 0: expert parallel groups are carved out of the "
                         f"data-parallel group")
    if model.seq % cp:
        raise ValueError(f"seq {model.seq} % cp {cp} != 0: context parallel ranks would hold unequal "
                         f"numbers of positions")


def ring_score_bytes(model: memory.ModelConfig, micro_batch: int, tp: int, cp: int, value_bytes: int = 2) -> int:
    """The one score block ring attention holds at a time on a (tp, cp) rank: ``b·(a/tp)·(s/cp)^2``
    values, ``context.cost``'s ``score_peak_bytes`` for the rank's ``heads/tp`` heads; 0 for cp 1
    (the scores are then per layer, in ``activation_bytes_per_layer``)."""
    if cp == 1:
        return 0
    return context_cost("ring", batch=micro_batch, seq=model.seq, hidden=model.hidden // tp,
                        heads=model.heads // tp, cp=cp, link=Link("any", 1.0, 0.0),
                        dtype_bytes=value_bytes).score_peak_bytes


def _per_layer(model, micro_batch, tp, sequence_parallel, recompute, prec, dropout, cp) -> tuple[float, float]:
    """(bytes one block keeps per micro-batch, M_W / M_B of it)."""
    top_k = model.top_k if model.experts else 0
    per_layer = activation_bytes_per_layer(model.seq, micro_batch, model.hidden, model.heads, tp,
                                           sequence_parallel, recompute, prec.activation, dropout, top_k, cp)
    share = weight_grad_bytes_per_layer(model.seq // cp, micro_batch, model.hidden, tp, sequence_parallel,
                                        prec.activation) / per_layer
    return per_layer, share


def device_memory(model: memory.ModelConfig, micro_batch: int = 1, dp: int = 1, pp: int = 1, tp: int = 1,
                  sequence_parallel: bool = False, schedule: str = "1f1b", microbatches: int = 1,
                  virtual: int = 1, recompute: str = "none", zero1: bool = False,
                  precision: str = "mixed", dropout: bool = True, stages=None, zero: int = 0,
                  ep: int = 1, cp: int = 1, split: tuple[int, ...] | None = None) -> list[dict]:
    """Bytes on one device of every pipeline stage (a list, stage 0 first; only ``stages`` if given):
    ``stage``, ``params``, ``weights``, ``gradients``, ``optimizer`` (sharded over ``dp`` by ZeRO
    stage ``zero``, 0-3; ``zero1`` means ``zero=1``), ``buffers`` (ZeRO 2-3's transient full units),
    ``activations`` (``in_flight`` chunks of ``layers_per_chunk`` layers in units of a chunk's M_B,
    ``w_share`` = M_W / M_B, plus the head's on the last stage), ``scores`` (ring attention's one
    block, cp > 1), ``zero``, ``ep``, ``cp`` and ``total``. ``ep``: experts over ep ranks of the dp
    group; ``cp``: positions over cp ranks (see the module doc); the dense state is sharded over
    dp·cp, the experts' over dp·cp/ep. ``split``: blocks per pipeline rank when they are not equal
    (``light_ends_split``; one chunk per rank). The V schedules keep the head on rank 0."""
    dp = positive_int("dp", dp)
    check_ep_cp(model, dp, ep, cp)
    zero = max(zero_memory.check_stage(zero), 1 if zero1 else 0)
    prec = memory.PRECISIONS[precision] if isinstance(precision, str) else precision
    if split is not None:
        if len(split) != pp or sum(split) != model.layers or virtual != 1 or min(split) < 1:
            raise ValueError(f"split {list(split)} must give {pp} ranks (virtual 1) at least one of the "
                             f"{model.layers} blocks each")
    elif model.layers % (pp * virtual):
        raise ValueError(f"layers {model.layers} % (pp {pp} x virtual {virtual}) != 0")
    if model.heads % tp:
        raise ValueError(f"heads {model.heads} % tp {tp} != 0")
    per_layer, share = _per_layer(model, micro_batch, tp, sequence_parallel, recompute, prec, dropout, cp)
    split = split or (model.layers // pp,) * pp
    head = head_rank(schedule, pp)
    peaks = in_flight(schedule, pp, microbatches, virtual, share)
    if prec.weights != prec.gradients:
        raise ValueError(f"ZeRO's formula counts one value size for weights and gradients, got "
                         f"{prec.weights} and {prec.gradients} bytes")
    if model.experts:  # ZeRO 2-3's transient full unit: one block on this TP rank, its experts apart
        unit, expert_unit = moe_layer_params(model.hidden, model.experts, tp, ep)
    else:
        unit, expert_unit = layer_params(model.hidden, tp), 0
    scores = ring_score_bytes(model, micro_batch, tp, cp, prec.activation)
    rows = []
    for stage in range(pp) if stages is None else sorted(set(stages)):
        params, experts = stage_param_split(model, pp, tp, stage, ep, split[stage], head)
        chunk_layers = split[stage] // virtual
        state = zero_memory.per_rank(params, dp * cp, zero, prec.weights,
                                     unit=min(unit, params) if zero >= 2 else 0,
                                     adam_bytes=prec.optimizer, overlap=True)
        if experts:  # the experts' state, replicated over the expert-data-parallel group only
            more = zero_memory.per_rank(experts, dp * cp // ep, zero, prec.weights,
                                        unit=min(expert_unit, experts) if zero >= 2 else 0,
                                        adam_bytes=prec.optimizer, overlap=True)
            state = {k: state[k] + more[k] for k in ("parameters", "gradients", "optimizer", "buffers")}
        acts = peaks[stage] * chunk_layers * per_layer
        if stage == head:
            # the head's tensors live from the last forward to its backward: one micro-batch at a time
            # in 1F1B-like schedules, all m in GPipe
            acts += (microbatches if schedule == "gpipe" else 1) * head_activation_bytes(
                model.seq // cp, micro_batch, model.hidden, model.vocab, tp, prec.activation)
        row = {"stage": stage, "params": params + experts, "weights": state["parameters"],
               "gradients": state["gradients"], "optimizer": state["optimizer"], "buffers": state["buffers"],
               "activations": acts, "in_flight": peaks[stage], "layers_per_chunk": chunk_layers,
               "w_share": share, "zero": zero, "scores": scores, "ep": ep, "cp": cp}
        row["total"] = (row["weights"] + row["gradients"] + row["optimizer"] + row["buffers"] + row["activations"]
                        + scores)
        rows.append(row)
    return rows


def max_device_memory(model: memory.ModelConfig, **kwargs) -> dict:
    """The most loaded device of ``device_memory`` (same arguments). With equal blocks per rank, ranks
    differ only by the ends (the embedding on rank 0, the head and its tensors on the head's rank)
    and by the micro-batches in flight, so the heaviest is rank 0, the head's rank, the last or the
    one with the most in flight (counted with the plan's own M_W / M_B: a zero-bubble schedule's
    later ranks can hold more); with uneven blocks, any rank."""
    pp, schedule = kwargs.get("pp", 1), kwargs.get("schedule", "1f1b")
    if kwargs.get("split"):
        candidates = set(range(pp))
    else:
        prec = kwargs.get("precision", "mixed")
        prec = memory.PRECISIONS[prec] if isinstance(prec, str) else prec
        sp = kwargs.get("sequence_parallel", False) and kwargs.get("tp", 1) > 1
        _, share = _per_layer(model, kwargs.get("micro_batch", 1), kwargs.get("tp", 1), sp,
                              kwargs.get("recompute", "none"), prec, kwargs.get("dropout", True), kwargs.get("cp", 1))
        peaks = in_flight(schedule, pp, kwargs.get("microbatches", 1), kwargs.get("virtual", 1), share)
        candidates = {0, head_rank(schedule, pp), pp - 1, max(range(pp), key=lambda r: peaks[r])}
    return max(device_memory(model, **kwargs, stages=candidates), key=lambda row: row["total"])
