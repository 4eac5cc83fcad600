"""Lesson 15's exercise: the memory of one GPU of a plan, written as a formula
(lessons/15_cost_model.ipynb).

    def my_device_memory(model, dp, pp, tp, microbatches, micro_batch, recompute="none",
                         sequence_parallel=False, zero1=False, value_bytes=2, dropout=True):
        return {"params": ..., "weights": ..., "gradients": ..., "optimizer": ..., "activations": ...}

    check_device_memory(my_device_memory)
    # device memory: PASSED: 8/8 plans equal the memory model (...)

The answer gives, in bytes, what one GPU of the **first** pipeline stage (pp >= 2: it holds the
embeddings, not the head) keeps under 1F1B with mixed-precision Adam: its parameters (a count),
their weights (2 bytes each), gradients (2) and Adam state (12, sharded over dp with ZeRO-1), and
the activations of the micro-batches it holds at its peak. ``model`` is a plain dict (``layers``,
``hidden``, ``heads``, ``vocab``, ``seq``).

The answer runs on a rank of its own, which returns only the numbers it computed, one dict per
case. The checking process judges them two ways, both computed here:

1. against the memory model (``planning.memory_model.device_memory``, stage 0, schedule 1F1B) on
   GPT-3 175B plans of lesson 15 and others (plain tensor parallelism, sequence parallelism, the
   three recomputation modes, ZeRO-1, m < pp, fp32 values without dropout);
2. against real tensors of the course GPT (``planning.memory_check``): the parameters of the first
   stage's modules as ``pipeline.stages.cut`` builds them, and the bytes autograd saves for one
   transformer block in fp32 without dropout (``value_bytes=4, dropout=False``), less the per-token
   statistics the paper neglects (LayerNorm mean and 1/std, the fused attention's log-sum-exp).

A wrong value fails with what differs and, where it matches a known slip (a forgotten embedding,
2-byte values where the plan has 4, all m micro-batches instead of min(m, pp), ...), what it
probably is. The library (its memory model included) is forbidden in the answer (from the source).
Every verdict line is deterministic, so nbval compares it.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from parallel_lab.exercises.check import (
    Exercise,
    Verdict,
    answer_error,
    compile_answer,
    failure,
    register,
    run_answer,
)
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l, ngettext
from parallel_lab.planning import memory, memory_check, memory_model

FIELDS = ("params", "weights", "gradients", "optimizer", "activations")
POLICY = Policy("my_device_memory", imports=("math",), dist=())


def plan(name: str, dp: int, pp: int, tp: int, microbatches: int, micro_batch: int = 1, recompute: str = "none",
         sequence_parallel: bool = False, zero1: bool = False, value_bytes: int = 2, dropout: bool = True,
         model: dict | None = None) -> dict:
    """One case: the keyword arguments the answer is called with (``model`` from ``memory.MODELS``
    by ``name`` unless given) and, under ``name``, how verdicts call the model."""
    if model is None:
        m = memory.MODELS[name]
        model = {"layers": m.layers, "hidden": m.hidden, "heads": m.heads, "vocab": m.vocab, "seq": m.seq}
    return {"name": name, "model": dict(model), "dp": dp, "pp": pp, "tp": tp, "microbatches": microbatches,
            "micro_batch": micro_batch, "recompute": recompute, "sequence_parallel": sequence_parallel,
            "zero1": zero1, "value_bytes": value_bytes, "dropout": dropout}


GPT3 = "GPT-3 175B"
# Against the memory model: lesson 15's GPT-3 rows, the planner's best layout, plain TP with full
# recomputation and m < pp, a model with micro-batches of 2, and fp32 values without dropout.
CASES = (
    plan(GPT3, dp=8, pp=8, tp=8, microbatches=64, sequence_parallel=True),
    plan(GPT3, dp=8, pp=8, tp=8, microbatches=64, sequence_parallel=True, recompute="selective"),
    plan(GPT3, dp=8, pp=8, tp=8, microbatches=64, sequence_parallel=True, recompute="selective", zero1=True),
    plan(GPT3, dp=8, pp=16, tp=4, microbatches=192, sequence_parallel=True, recompute="selective"),
    plan(GPT3, dp=4, pp=16, tp=8, microbatches=8, recompute="full"),
    plan("GPT-3 13B", dp=16, pp=4, tp=2, microbatches=3, micro_batch=2, zero1=True),
    plan("Megatron 530B", dp=4, pp=35, tp=8, microbatches=70, sequence_parallel=True, recompute="full", zero1=True),
    plan("GPT-3 1.3B", dp=2, pp=4, tp=2, microbatches=3, micro_batch=4, sequence_parallel=True,
         value_bytes=4, dropout=False),
)
# Against real tensors of the course GPT (fp32, no dropout): the modules of the first stage, and one
# transformer block (a first stage of pp = 2 over 2 layers holds one block; one micro-batch in flight).
PARAM_CONFIG = dict(hidden=32, layers=4, heads=2, seq=8, vocab=96)
PARAM_PPS = (2, 4)
BLOCK_CONFIG = dict(vocab=96, seq=32, hidden=64, heads=4, layers=1)
BLOCK_BATCH = 3


def _course(layers: int, config: dict) -> dict:
    return {"layers": layers, **{k: config[k] for k in ("hidden", "heads", "vocab", "seq")}}


REAL_PARAMS = tuple(plan("the course GPT", dp=1, pp=pp, tp=1, microbatches=1, value_bytes=4, dropout=False,
                         model=_course(PARAM_CONFIG["layers"], PARAM_CONFIG)) for pp in PARAM_PPS)
REAL_BLOCK = tuple(plan("the course GPT", dp=1, pp=2, tp=1, microbatches=1, micro_batch=BLOCK_BATCH,
                        recompute=mode, value_bytes=4, dropout=False, model=_course(2, BLOCK_CONFIG))
                   for mode in memory_model.RECOMPUTE)


# ----------------------------------------------------------------------------------------------
# On a rank: the answer's numbers, as plain data.


def _number(value):
    if isinstance(value, bool):
        return {"type": "bool"}
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return {"type": type(value).__name__}


def harness(source: str, name: str, cases) -> list[dict]:
    """On a rank: ``fn(model, dp=..., ...)`` for each case, as ``{"values": {field: number}}``, or
    ``{"type": ...}`` when it returned no dict, ``{"error": ...}`` when it raised."""
    fn = compile_answer(source, name)
    out = []
    for case in cases:
        kwargs = {k: v for k, v in case.items() if k not in ("name", "model")}
        try:
            got = fn(dict(case["model"]), **kwargs)
        except Exception as err:  # the answer's own error: reported per case
            out.append({"error": answer_error(err)})
            continue
        if isinstance(got, dict):
            out.append({"values": {field: _number(got[field]) if field in got else None for field in FIELDS}})
        else:
            out.append({"type": type(got).__name__})
    return out


# ----------------------------------------------------------------------------------------------
# In the checking process.


def expected(case: dict, **change) -> dict:
    """The memory model's first stage for ``case`` (with ``change`` applied): the five fields."""
    c = {**case, **change}
    model = memory.ModelConfig(c["name"], **c["model"])
    precision = dataclasses.replace(memory.PRECISIONS["mixed"], activation=c["value_bytes"])
    row = memory_model.device_memory(
        model, micro_batch=c["micro_batch"], dp=c["dp"], pp=c["pp"], tp=c["tp"],
        sequence_parallel=c["sequence_parallel"], schedule="1f1b", microbatches=c["microbatches"],
        recompute=c["recompute"], zero1=c["zero1"], precision=precision, dropout=c["dropout"], stages=[0])[0]
    return {field: row[field] for field in FIELDS}


def describe(case: dict) -> str:
    """How a verdict names a plan: ``GPT-3 175B, TP 8 + SP × PP 8 × DP 8, 64 micro-batches of 1, ...``."""
    parts = [case["name"], f"TP {case['tp']}{' + SP' if case['sequence_parallel'] else ''} × PP {case['pp']} × "
             f"DP {case['dp']}",
             ngettext("{n} micro-batch of {size}", "{n} micro-batches of {size}", case["microbatches"]).format(
                 n=case["microbatches"], size=case["micro_batch"]),
             _("recompute {mode}").format(mode=repr(case["recompute"]))]
    if case["zero1"]:
        parts.append("ZeRO-1")
    if case["value_bytes"] != 2:
        parts.append(_("{n}-byte values").format(n=case["value_bytes"]))
    if not case["dropout"]:
        parts.append(_("no dropout"))
    return ", ".join(parts)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def _factor(got: float, want: float) -> str:
    """`` off by 2x``, `` off by 1/2`` (a whole factor), else `` off by +3.8%``."""
    if got <= 0 or want <= 0:
        return _(" off")
    ratio = got / want
    whole = round(ratio if ratio > 1 else 1 / ratio)
    if whole >= 2 and _close(ratio if ratio > 1 else 1 / ratio, whole):
        return (_(" off by {n}x") if ratio > 1 else _(" off by 1/{n}")).format(n=whole)
    return _(" off by {percent:+.2g}%").format(percent=(ratio - 1) * 100)


def _param_slips(case: dict, want: float) -> list[tuple[float, str]]:
    m, t, pp = case["model"], case["tp"], case["pp"]
    h, V, s, L = m["hidden"], m["vocab"], m["seq"], m["layers"]
    rows = math.ceil(V / t)
    block = memory_model.layer_params(h, t)
    token, position = rows * h, s * h
    slips = [(want - token - position, _("left out the embeddings: the first stage also holds the token embedding, "
                                         "⌈V/t⌉·h = {token:,}, and the position embedding, s·h = {position:,}").format(
                                             token=token, position=position)),
             (want - position, _("left out the position embedding, s·h = {position:,} (on every tensor-parallel "
                                 "rank)").format(position=position)),
             (want - token, _("left out the token embedding, ⌈V/t⌉·h = {token:,}").format(token=token)),
             (want + 2 * h + token, _("counted the head (final LayerNorm and output projection): it sits on the "
                                      "last stage, not the first")),
             (L * block + token + position, _("counted all {layers} blocks; the first of {pp} stages holds L/pp = "
                                              "{per}").format(layers=L, pp=pp, per=L // pp)),
             (want - L // pp * (7 * h // t + 6 * h), _("counted only each block's weight matrices; add its biases "
                                                       "and LayerNorms: (12h² + 7h)/t + 6h per block"))]
    if V % t:
        slips.append((want - token + V // t * h, _("split the vocabulary as V // t; Megatron pads it to a multiple "
                                                   "of tp: ⌈V/t⌉ = {rows:,} rows of h").format(rows=rows)))
    if t > 1:
        slips += [(want - token + V * h, _("did not split the token embedding: its vocabulary rows split over tp, "
                                           "⌈V/t⌉·h")),
                  (L // pp * (12 * h * h + 13 * h) / t + token + position,
                   _("split every block parameter by t; the LayerNorms (4h) and the row-parallel biases (2h) are on "
                     "every tensor-parallel rank: (12h² + 7h)/t + 6h per block")),
                  (L // pp * (12 * h * h + 13 * h) + token + position,
                   _("did not split the blocks by tp: (12h² + 7h)/t + 6h per block"))]
    return slips


def _state_slips(field: str, case: dict, want: dict) -> list[tuple[float, str]]:
    P, dp = want["params"], case["dp"]
    if field == "weights":
        return [(4 * P, _("4 bytes per parameter: in mixed precision the weights are 2-byte (bf16/fp16); "
                          "fp32 master weights are part of Adam's 12"))]
    if field == "gradients":
        return [(4 * P, _("4 bytes per parameter: in mixed precision the gradients are 2-byte (bf16/fp16)"))]
    slips = []
    if case["zero1"]:
        slips.append((12 * P, _("ZeRO-1 shards Adam's 12 bytes per parameter over the dp = {dp} replicas: "
                                "12·P/dp").format(dp=dp)))
    elif dp > 1:
        slips.append((12 * P / dp, _("without ZeRO-1 every data-parallel replica holds all of Adam's state")))
    shard = dp if case["zero1"] else 1
    slips += [(8 * P / shard, _("Adam keeps 12 bytes per parameter: fp32 master weights, momentum and variance, "
                                "4 each")),
              (16 * P / shard, _("only Adam's 12 bytes per parameter here: weights and gradients are their own "
                                 "entries"))]
    return slips


MODE_NOTE = {"none": _l("every stored tensor plus the a·s² attention scores per sequence"),
             "selective": _l("drop only the attention scores (recomputed in the backward)"),
             "full": _l("keep only each layer's input, v·sbh (/t with sequence parallelism)")}


def _activation_slips(case: dict, want: float) -> list[tuple[float, str]]:
    m, pp, L, v = case["microbatches"], case["pp"], case["model"]["layers"], case["value_bytes"]
    held, per_stage = min(m, pp), L // pp
    slips = []
    for other in (2, 4):
        if other != v:
            slips.append((expected(case, value_bytes=other)["activations"],
                          _("did you count {other} bytes per value? this plan stores {v}-byte values "
                            "(value_bytes={v})").format(other=other, v=v)))
    if held > 1:
        slips.append((want / held, _("counted one micro-batch; at its peak 1F1B's first stage holds min(m, pp) = "
                                     "{held} micro-batches").format(held=held)))
    if m != held:
        slips.append((want / held * m, _("counted all m = {m} micro-batches (GPipe's stash); 1F1B's first stage "
                                         "holds min(m, pp) = {held}").format(m=m, held=held)))
    if pp != held:
        slips.append((want / held * pp,
                      _("counted pp = {pp} micro-batches, but only m = {m} exist: min(m, pp) = {held}").format(
                          pp=pp, m=m, held=held)))
    if pp > 1:
        slips.append((want / per_stage * L, _("counted all {layers} layers; the first stage holds L/pp = {per}").format(
            layers=L, per=per_stage)))
    if per_stage > 1:
        slips.append((want / per_stage, _("counted one layer; the first stage holds L/pp = {per}").format(
            per=per_stage)))
    if held > 1 and per_stage > 1:
        slips.append((want / held / per_stage, _("one layer of one micro-batch: multiply by the min(m, pp) = "
                                                 "{held} micro-batches in flight and the L/pp = {per} layers").format(
                                                     held=held, per=per_stage)))
    if case["tp"] > 1:
        if case["sequence_parallel"]:
            note = _("left the LayerNorm, QKV and MLP inputs (and the dropout masks) whole: with sequence "
                     "parallelism every stored tensor splits over t")
        else:
            note = _("split every tensor by t: without sequence parallelism the LayerNorm, QKV and MLP inputs "
                     "(and the two dropout masks) are on every tensor-parallel rank")
        slips.append((expected(case, sequence_parallel=not case["sequence_parallel"])["activations"], note))
        slips.append((expected(case, tp=1)["activations"], _("did not divide by t: tensor parallelism splits the "
                                                            "activations of each layer")))
    slips.append((expected(case, dropout=not case["dropout"])["activations"],
                  _("left out dropout: two masks of sbh values (1 byte each) and, for the scores, a mask (1 byte) "
                    "and the dropout output (dropout=True)") if case["dropout"] else
                  _("counted dropout, which this plan does not have (dropout=False): no masks, no dropout output")))
    for mode in memory_model.RECOMPUTE:
        if mode != case["recompute"]:
            slips.append((expected(case, recompute=mode)["activations"],
                          _("that is the count for recompute={mode}; this plan has recompute={own}: {note}").format(
                              mode=repr(mode), own=repr(case["recompute"]), note=MODE_NOTE[case["recompute"]])))
    return slips


def why(field: str, got: float, case: dict, want: dict) -> str:
    """``field`` off by how much (got against expected) and the slip it matches, if any."""
    if field == "params":
        slips = _param_slips(case, want["params"])
    elif field == "activations":
        slips = _activation_slips(case, want["activations"])
    else:
        slips = _state_slips(field, case, want)
    # every slip the value matches (two can give the same number: 4-byte values or twice the micro-batches)
    reason = _("; or ").join(dict.fromkeys(text for value, text in slips
                                           if _close(got, value) and not _close(value, want[field])))
    line = (_("{field}{off}: got {got:,.0f}, expected {want:,.0f}") if field == "params" else
            _("{field}{off}: got {got:,.0f} bytes, expected {want:,.0f}")).format(
                field=field, off=_factor(got, want[field]), got=got, want=want[field])
    return line + (_(": {reason}").format(reason=reason) if reason else "")


def wrong(answer: dict, case: dict, want: dict, fields=FIELDS) -> str | None:
    """Why the answer to one case is wrong, or None (``fields``: the ones compared, in order)."""
    if "error" in answer:
        return _("{name} raised {error}").format(name=POLICY.name, error=answer["error"])
    if "values" not in answer:
        return _("{name} returned a {type}, not a dict with {fields}").format(
            name=POLICY.name, type=answer["type"], fields=", ".join(FIELDS))
    values = answer["values"]
    for field in FIELDS:
        if values[field] is None:
            return _("{name} returned no {field} (the dict needs {fields})").format(
                name=POLICY.name, field=repr(field), fields=", ".join(FIELDS))
        if isinstance(values[field], dict):
            return _("{field} is a {type}, not a number").format(field=field, type=values[field]["type"])
    for field in fields:
        if not _close(values[field], want[field]):
            return why(field, values[field], case, want)
    return None


def _real_counts() -> tuple[list[int], list[int]]:
    """Counted on the course GPT here: parameters of the first stage for each pp of PARAM_PPS, and
    the bytes one block saves for backward, less the per-token statistics, per recompute mode."""
    params = {row["pp"]: row["real"] for row in memory_check.param_check(PARAM_CONFIG, PARAM_PPS) if row["stage"] == 0}
    block = {row["recompute"]: (row["measured"], row["stats"])
             for row in memory_check.activation_check(BLOCK_CONFIG, BLOCK_BATCH)}
    return [params[pp] for pp in PARAM_PPS], [block[case["recompute"]] for case in REAL_BLOCK]


def judge(source: str):
    tried = len(CASES) + len(REAL_PARAMS) + len(REAL_BLOCK)
    answers = run_answer(harness, source, POLICY.name, 1, str(EXERCISE.label), args=(CASES + REAL_PARAMS + REAL_BLOCK,))
    if isinstance(answers, str):
        return False, [answers], (0, tried)
    got = answers[0]
    mine, real_params, real_block = got[:len(CASES)], got[len(CASES):-len(REAL_BLOCK)], got[-len(REAL_BLOCK):]

    failures = [f"{describe(case)}: {reason}" for case, answer in zip(CASES, mine)
                if (reason := wrong(answer, case, expected(case)))]
    if failures:
        lines = [failure(_("device memory: FAILED ({good}/{total} plans equal the memory model)").format(
                     good=len(CASES) - len(failures), total=len(CASES))),
                 "  " + failures[0]]
    else:
        lines = [_("device memory: PASSED: {good}/{total} plans equal the memory model (parameters, "
                   "weights, gradients, Adam state and activations of the first stage under 1F1B)").format(
                       good=len(CASES), total=len(CASES))]

    counted_params, counted_block = _real_counts()
    real = []
    for case, answer, count in zip(REAL_PARAMS, real_params, counted_params):
        want = {**expected(case), "params": count}
        if reason := wrong(answer, case, want, fields=("params",)):
            real.append(_("the first of pp = {pp} stages of the course GPT (h {h}, {layers} layers, V {v}, s {s}), "
                          "whose real modules hold {count:,} parameters: {reason}").format(
                              pp=case["pp"], h=PARAM_CONFIG["hidden"], layers=PARAM_CONFIG["layers"],
                              v=PARAM_CONFIG["vocab"], s=PARAM_CONFIG["seq"], count=count, reason=reason))
    for case, answer, (measured, stats) in zip(REAL_BLOCK, real_block, counted_block):
        want = {**expected(case), "activations": measured - stats}
        if reason := wrong(answer, case, want, fields=("activations",)):
            real.append(_("one block of the course GPT (s {s}, b {b}, h {h}, {heads} heads, 4-byte values, no "
                          "dropout), recompute {mode}: autograd saves {measured:,} bytes, {stats:,} of them "
                          "per-token statistics the paper neglects, so {net:,}: {reason}").format(
                              s=BLOCK_CONFIG["seq"], b=BLOCK_BATCH, h=BLOCK_CONFIG["hidden"],
                              heads=BLOCK_CONFIG["heads"], mode=repr(case["recompute"]), measured=measured,
                              stats=stats, net=measured - stats, reason=reason))
    if real:
        lines.append(failure(_("device memory on the course GPT: FAILED: {reason}").format(reason=real[0])))
    else:
        lines.append(_("device memory on the course GPT: PASSED: the first stage's parameters equal its real modules "
                       "(pp {pps}); one block's activations equal the bytes autograd saves, "
                       "less the per-token statistics (recompute none, selective, full)").format(
                           pps=", ".join(map(str, PARAM_PPS))))
    return not failures and not real, lines, (tried - len(failures) - len(real), tried)


EXERCISE = register(Exercise(
    "device-memory", _l("device memory"), POLICY, judge,
    forbids="the library (its memory model, memory_model.device_memory): write the formula yourself"))


def check_device_memory(fn) -> Verdict:
    """Lesson 15's exercise: ``fn(model, dp, pp, tp, microbatches, micro_batch, recompute,
    sequence_parallel, zero1, value_bytes, dropout)`` returns the bytes on one GPU of the first
    pipeline stage under 1F1B. One line against the memory model, one against the course GPT's real
    tensors. Prints and returns the verdict."""
    return EXERCISE.check_object(fn)
