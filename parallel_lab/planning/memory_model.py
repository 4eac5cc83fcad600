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

Not counted: temporary buffers (communication buckets, workspace), fragmentation, the CUDA context.
"""

from __future__ import annotations

import functools
import math

from parallel_lab.checks import positive_int
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


def param_count(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """All parameters of ``models.GPT`` with these sizes (untied head, biases, LayerNorms)."""
    L, h = positive_int("layers", layers), positive_int("hidden", hidden)
    V, s = positive_int("vocab", vocab), positive_int("seq", seq)
    return L * layer_params(h) + (V + s) * h + 2 * h + V * h


@functools.lru_cache(maxsize=65536)
def stage_params(model: memory.ModelConfig, pp: int = 1, tp: int = 1, stage: int = 0) -> int:
    """Parameters held by one device of pipeline stage ``stage`` (of ``pp``) with tensor parallel ``tp``:
    its ``layers/pp`` blocks, plus the embeddings on stage 0 and the head on the last stage."""
    pp, tp = positive_int("pp", pp), positive_int("tp", tp)
    if model.layers % pp:
        raise ValueError(f"layers {model.layers} % pp {pp} != 0: stages would hold unequal numbers of blocks")
    if not 0 <= stage < pp:
        raise ValueError(f"stage must be in 0..{pp - 1}, got stage {stage}")
    if model.vocab % tp:  # Megatron pads the vocabulary instead; count the padded rows
        vocab_rows = math.ceil(model.vocab / tp)
    else:
        vocab_rows = model.vocab // tp
    h = model.hidden
    count = model.layers // pp * layer_params(h, tp)
    if stage == 0:
        count += vocab_rows * h + model.seq * h  # token embedding split by vocabulary rows; positions replicated
    if stage == pp - 1:
        count += 2 * h + vocab_rows * h  # final LayerNorm (replicated) + output projection
    return count


# ----------------------------------------------------------------------------------------------
# Activations.


def activation_bytes_per_layer(seq: int, micro_batch: int, hidden: int, heads: int, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               value_bytes: int = 2, dropout: bool = True) -> float:
    """Bytes one transformer layer keeps for backward, per micro-batch, on one device (Korthikanti
    et al. 2022; see the module doc). ``value_bytes`` 2 and ``dropout`` True give the paper's
    formulas; the course GPT in fp32 without dropout is ``value_bytes=4, dropout=False``."""
    s, b, h, a = (positive_int(n, v) for n, v in (("seq", seq), ("micro_batch", micro_batch),
                                                    ("hidden", hidden), ("heads", heads)))
    t, v, mask = positive_int("tp", tp), value_bytes, 1 if dropout else 0
    check_recompute(recompute)
    if sequence_parallel and t == 1:
        sequence_parallel = False  # nothing to split
    sbh = s * b * h
    if recompute == "full":
        return v * sbh / t if sequence_parallel else v * sbh
    replicated = 4 * v + 2 * mask  # LN inputs, QKV input, MLP input (+ two dropout masks)
    split = 12 * v                 # Q, K, V, attention output, MLP 4h output and GELU output
    per_sbh = (replicated + split) / t if sequence_parallel else replicated + split / t
    scores = 0.0 if recompute == "selective" else a * s * s * b * (2 * v + mask if dropout else v) / t
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


def device_memory(model: memory.ModelConfig, micro_batch: int = 1, dp: int = 1, pp: int = 1, tp: int = 1,
                  sequence_parallel: bool = False, schedule: str = "1f1b", microbatches: int = 1,
                  virtual: int = 1, recompute: str = "none", zero1: bool = False,
                  precision: str = "mixed", dropout: bool = True, stages=None, zero: int = 0) -> list[dict]:
    """Bytes on one device of every pipeline stage (a list, stage 0 first; only ``stages`` if given):
    ``stage``, ``params``, ``weights``, ``gradients``, ``optimizer`` (sharded over ``dp`` by ZeRO
    stage ``zero``, 0-3; ``zero1`` means ``zero=1``), ``buffers`` (ZeRO 2-3's transient full units),
    ``activations`` (``in_flight`` chunks of ``layers_per_chunk`` layers in units of a chunk's M_B,
    ``w_share`` = M_W / M_B, plus the head's on the last stage), ``zero`` and ``total``."""
    dp = positive_int("dp", dp)
    zero = max(zero_memory.check_stage(zero), 1 if zero1 else 0)
    prec = memory.PRECISIONS[precision] if isinstance(precision, str) else precision
    if model.layers % (pp * virtual):
        raise ValueError(f"layers {model.layers} % (pp {pp} x virtual {virtual}) != 0")
    if model.heads % tp:
        raise ValueError(f"heads {model.heads} % tp {tp} != 0")
    per_layer = activation_bytes_per_layer(model.seq, micro_batch, model.hidden, model.heads, tp,
                                           sequence_parallel, recompute, prec.activation, dropout)
    share = weight_grad_bytes_per_layer(model.seq, micro_batch, model.hidden, tp, sequence_parallel,
                                        prec.activation) / per_layer
    chunk_layers = model.layers // (pp * virtual)
    peaks = in_flight(schedule, pp, microbatches, virtual, share)
    if prec.weights != prec.gradients:
        raise ValueError(f"ZeRO's formula counts one value size for weights and gradients, got "
                         f"{prec.weights} and {prec.gradients} bytes")
    unit = layer_params(model.hidden, tp)  # ZeRO 2-3's transient full unit: one layer on this TP rank
    rows = []
    for stage in range(pp) if stages is None else sorted(set(stages)):
        params = stage_params(model, pp, tp, stage)
        state = zero_memory.per_rank(params, dp, zero, prec.weights, unit=min(unit, params) if zero >= 2 else 0,
                                     adam_bytes=prec.optimizer, overlap=True)
        acts = peaks[stage] * chunk_layers * per_layer
        if stage == pp - 1:
            # the head's tensors live from the last forward to its backward: one micro-batch at a time
            # in 1F1B-like schedules, all m in GPipe
            acts += (microbatches if schedule == "gpipe" else 1) * head_activation_bytes(
                model.seq, micro_batch, model.hidden, model.vocab, tp, prec.activation)
        row = {"stage": stage, "params": params, "weights": state["parameters"],
               "gradients": state["gradients"], "optimizer": state["optimizer"], "buffers": state["buffers"],
               "activations": acts, "in_flight": peaks[stage], "layers_per_chunk": chunk_layers,
               "w_share": share, "zero": zero}
        row["total"] = row["weights"] + row["gradients"] + row["optimizer"] + row["buffers"] + row["activations"]
        rows.append(row)
    return rows


def max_device_memory(model: memory.ModelConfig, **kwargs) -> dict:
    """The most loaded device of ``device_memory`` (same arguments). Only three stages can be it:
    the first (embeddings), the last (head) and the one with the most micro-batches in flight --
    every other stage holds the same blocks and no more activations than that one."""
    pp = kwargs.get("pp", 1)
    peaks = in_flight(kwargs.get("schedule", "1f1b"), pp, kwargs.get("microbatches", 1), kwargs.get("virtual", 1))
    # rank 0 holds the most activations for every w_share < 1 or schedule without a split backward
    # (their peaks fall with r); with w_share >= 1 ZB's later ranks can hold more: keep them all
    candidates = {0, pp - 1, max(range(pp), key=lambda r: peaks[r])}
    if kwargs.get("schedule") in ("zb-h1", "zb-v", "dualpipe-v"):
        candidates = set(range(pp))
    return max(device_memory(model, **kwargs, stages=candidates), key=lambda row: row["total"])
