"""Predictions that count: the number a student writes down before a run, read and (when the
lesson wants it) graded.

A prediction in a lesson source is an answer cell, the cell that records it, the run, and the
comparison (the notebook side is ``parallel_lab.show.predict``):

    # %% tags=["answer:predict:gpipe-bubble"]
    my_prediction = None  # GPipe's bubble, p = 4, m = 4: a fraction of the step (e.g. 0.5)
    ### BEGIN SOLUTION
    my_prediction = ...  # the instructor's answer, which only the lesson source holds
    ### END SOLUTION

    # %% tags=["check:predict:gpipe-bubble"]
    from parallel_lab.show.predict import predict

    guess = predict("gpipe-bubble", my_prediction)

    # %%
    timeline = simulate(...)               # the run
    guess.versus(timeline.bubble_fraction)

The student edition keeps the ``None`` line (the build drops a prediction's solution region with
no stub; the region comes last in the cell); the solution edition also has the answer's line.

**Graded or not.** A prediction is graded when its recording cell is tagged
``check:predict:<id>`` and ``<id>`` is registered in ``GRADED`` below, for that lesson; the points
are the registry's (the cell takes no ``points:`` tag). Without the check tag it only records and
compares, and ``predict`` takes its question, unit and tolerance as arguments.

**A new graded prediction** (lesson NN): an entry in ``GRADED`` (id, lesson "NN", the question in
English and Traditional Chinese, a ``parallel_lab.<module>:<function>`` and its params, tolerance,
points, unit, ``about``); in the lesson source the answer cell and the recording cell tagged as
above; ``tools/build_lessons.py`` refuses a lesson whose ``check:predict:`` tags and registry
entries differ, or whose student edition would not leave ``my_prediction = None``.

**What the grader reads.** ``my_prediction`` from the answer cell's source, as data: a number, or
numbers with ``+ - * /`` (``3 / 11``), or ``None``; for a prediction of another ``kind`` a string
(``"choice"``: one of its ``choices``) or a list of strings (``"order"``: its ``choices`` in the
student's order); nothing in the cell is executed (see ``read_prediction``). The reference is
computed by the grader with the registered function (``parallel_lab.course.quiz.answers``, like
the quiz banks' computed answers), never taken from the submission, whose measured outputs a
student could edit. The grader cannot know *when* the number
was written: the lesson asks for it before the run, and the comparison is there to learn from.
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass, field
from typing import Mapping

from parallel_lab.course.quiz.bank import localize, resolve
from parallel_lab.exercises.check import Verdict, failure
from parallel_lab.i18n import _, _l

VARIABLE = "my_prediction"  # what every prediction's answer cell assigns


KINDS = ("number", "choice", "order")  # what a prediction is: a number, one of its choices, an order of them


@dataclass(frozen=True)
class GradedPrediction:
    """A prediction the grader scores: within ``tolerance`` (relative: 0.1 is ±10 %; 0 is exact) of
    ``function(**params)`` earns ``points``. ``question`` is ``{"en": ..., "zh-Hant": ...}``;
    ``about`` names the reference in feedback ("GPipe bubble, p = 4, m = 4"). ``kind`` "choice"
    (the reference is one of ``choices``) or "order" (the reference is ``choices`` in some order)
    is scored right or wrong."""

    id: str
    lesson: str
    question: Mapping
    function: str
    params: Mapping = field(default_factory=dict)
    tolerance: float = 0.1
    points: float = 1.0
    unit: str = ""
    about: str = ""
    kind: str = "number"
    choices: tuple = ()

    def reference(self):
        """The reference value, computed here (``parallel_lab.course.quiz.bank.resolve``)."""
        return resolve({"function": self.function, "params": dict(self.params)}, f"prediction {self.id}")

    def text(self, lang: str = "en") -> str:
        return localize(self.question, lang)


ANSWERS = "parallel_lab.course.quiz.answers"
GRADED: dict[str, GradedPrediction] = {p.id: p for p in (
    GradedPrediction(
        "gpipe-bubble", "04",
        {"en": "GPipe's bubble with p = 4 stages and m = 4 micro-batches (F = 1, B = 2, free links): the "
               "idle share of the device time, a fraction between 0 and 1",
         "zh-Hant": "GPipe 在 p = 4 個階段（stage）、m = 4 個微批次（micro-batch）時的氣泡（bubble）"
                    "（F = 1、B = 2、連線不計成本）：裝置時間中閒置的比例，介於 0 與 1 之間的分數"},
        f"{ANSWERS}:bubble_fraction", {"schedule": "gpipe", "ranks": 4, "microbatches": 4},
        tolerance=0.1, about=_l("GPipe bubble, p = 4, m = 4")),
    GradedPrediction(
        "1f1b-peak-stash", "05",
        {"en": "in 1F1B with p = 4 stages and m = 8 micro-batches, the most micro-batches whose "
               "activations one stage keeps at once (GPipe: 8)",
         "zh-Hant": "1F1B 在 p = 4 個階段、m = 8 個微批次時，單一階段同時保存激活值（activation）的"
                    "微批次最多有幾個（GPipe：8 個）"},
        f"{ANSWERS}:peak_activations", {"schedule": "1f1b", "ranks": 4, "microbatches": 8, "stage": 0},
        tolerance=0.1, unit=_l("micro-batches"), about=_l("1F1B peak stash, stage 0, p = 4, m = 8")),
    GradedPrediction(
        "uneven-cut-step", "09",
        {"en": "the step time (makespan) of the even-blocks cut, stage forward loads 5, 2, 2, 6 "
               "(backward twice the forward), with 1F1B and m = 8 micro-batches, free links",
         "zh-Hant": "均分區塊（even blocks）切法的一步時間（makespan）：各階段前向負載 5、2、2、6"
                    "（反向為前向的兩倍），1F1B 排程（schedule）、m = 8 個微批次，連線不計成本"},
        f"{ANSWERS}:stage_loads_makespan", {"loads": (5, 2, 2, 6), "microbatches": 8, "schedule": "1f1b"},
        tolerance=0.1, unit=_l("time units"), about=_l("1F1B, stage loads 5, 2, 2, 6, m = 8")),
    GradedPrediction(
        "recompute-step", "08",
        {"en": "the step time (makespan) of 1F1B with full activation recomputation: p = 4 stages, m = 8 "
               "micro-batches, F = 1 and B = 2 time units without recomputation, free links",
         "zh-Hant": "1F1B 在完整激活值重新計算（full activation recomputation）下的一步時間（makespan）："
                    "p = 4 個階段（stage）、m = 8 個微批次（micro-batch），不重新計算時 F = 1、B = 2 個時間單位，"
                    "連線不計成本"},
        f"{ANSWERS}:recompute_makespan", {"schedule": "1f1b", "ranks": 4, "microbatches": 8},
        tolerance=0.1, unit=_l("time units"), about=_l("1F1B with full recomputation, p = 4, m = 8, F = 1, B = 2")),
    GradedPrediction(
        "zb-h1-bubble", "07",
        {"en": "ZB-H1's bubble with p = 4 GPUs and m = 8 micro-batches, F = I = W = 2 time units: the "
               "idle share of the device time, a fraction between 0 and 1 (1F1B's is 0.273)",
         "zh-Hant": "ZB-H1 在 p = 4 個 GPU、m = 8 個微批次（micro-batch）、F = I = W = 2 個時間單位時的"
                    "氣泡（bubble）：裝置時間中閒置的比例，介於 0 與 1 之間的分數（1F1B 是 0.273）"},
        f"{ANSWERS}:bubble_fraction", {"schedule": "zb-h1", "ranks": 4, "microbatches": 8, "F": 2.0,
                                       "B": 4.0, "W": 2.0},
        tolerance=0.1, about=_l("ZB-H1 bubble, p = 4, m = 8, F = I = W")),
    GradedPrediction(
        "synchronised-bubble", "10",
        {"en": "the bubble of each step in steady state (the idle share of the device time, a fraction between "
               "0 and 1) when a global all-reduce (gradient clipping) precedes every optimizer step: p = 4 ranks, "
               "m = 12 micro-batches, F = I = W = 1, free links, and the search's schedule under a cap of 2p = 8, "
               "which keeps every rank busy from its first action to its last",
         "zh-Hant": "每次最佳化器（optimizer）更新之前都有一次全域 all-reduce（梯度裁剪，gradient clipping）時，"
                    "穩定狀態下每一步的氣泡（bubble）（裝置時間中閒置的比例，介於 0 與 1 之間的分數）：p = 4 個"
                    " rank、m = 12 個微批次（micro-batch）、F = I = W = 1、連線不計成本，排程（schedule）是搜尋"
                    "在 2p = 8 的記憶體上限下找到的那一個，它讓每個 rank 從第一個動作到最後一個動作都不停工作"},
        f"{ANSWERS}:searched_bubble", {"ranks": 4, "microbatches": 12, "max_activations": 8, "synchronised": True},
        tolerance=0.1, about=_l("searched schedule, cap 2p, p = 4, m = 12, with the optimizer's all-reduce")),
    GradedPrediction(
        "tp8-memory", "15",
        {"en": "GB on the fullest GPU for GPT-3 175B with TP 8 (sequence parallel) × PP 8 × DP 8, 1F1B, "
               "64 micro-batches of one 2048-token sequence, no recomputation, no ZeRO: weights, "
               "gradients, Adam state and activations",
         "zh-Hant": "GPT-3 175B 以 TP 8（序列平行）× PP 8 × DP 8、1F1B、64 個各一條 2048 個 token 序列的"
                    "微批次（micro-batch）、不重新計算、不用 ZeRO 時，最滿的 GPU 上的 GB 數：權重、梯度、"
                    "Adam 狀態與激活值（activation）"},
        f"{ANSWERS}:device_memory_gb", {"model": "GPT-3 175B", "dp": 8, "pp": 8, "tp": 8, "microbatches": 64,
                                        "schedule": "1f1b"},
        tolerance=0.15, unit="GB", about="GPT-3 175B, TP 8 x PP 8 x DP 8, 1F1B, m = 64"),
    GradedPrediction(
        "ring-score-bytes", "14",
        {"en": "bytes of the largest attention-score tensor one rank holds at once in ring attention with "
               "cp = 4 ranks: batch 2, 8 heads, a 32-token sequence, fp64 (8 bytes); one process holds "
               "2 × 8 × 32 × 32 × 8 = 131,072",
         "zh-Hant": "環狀注意力（ring attention）在 cp = 4 個 rank 上時，單一 rank 同時持有的最大注意力分數"
                    "（attention score）張量有幾個位元組：批次 2、8 個注意力頭（head）、序列長 32 個 token、"
                    "fp64（8 位元組）；單一行程持有 2 × 8 × 32 × 32 × 8 = 131,072"},
        f"{ANSWERS}:context_score_bytes", {"variant": "ring", "batch": 2, "seq": 32, "heads": 8, "cp": 4,
                                           "dtype_bytes": 8, "hidden": 64},
        tolerance=0.1, unit=_l("bytes"), about=_l("ring attention, cp = 4, batch 2, 8 heads, seq 32, fp64")),
    GradedPrediction(
        "zero2-model-state", "12",
        {"en": "GB of model state (parameters, gradients, Adam state; no activations) on one of N = 8 "
               "data-parallel GPUs under ZeRO stage 2, for Ψ = 1 billion parameters in mixed precision "
               "(2 + 2 + K bytes per parameter, K = 12)",
         "zh-Hant": "在 ZeRO 第 2 階段（stage 2）下，Ψ = 10 億個參數、混合精度（每個參數 2 + 2 + K 位元組，"
                    "K = 12），N = 8 個資料平行（data parallel）GPU 中的一個所保存的模型狀態 GB 數"
                    "（參數、梯度、Adam 狀態；不含激活值）"},
        f"{ANSWERS}:zero_model_state_gb", {"billions": 1.0, "dp": 8, "stage": 2},
        tolerance=0.05, unit="GB", about=_l("ZeRO-2, Ψ = 1e9, N = 8, mixed precision")),
    GradedPrediction(
        "moe-dropped", "13",
        {"en": "the assignments (token, choice) the mixture-of-experts layer drops for want of capacity: "
               "n = 64 tokens, E = 8 experts, top-2, capacity factor C = 1, with the demand per expert "
               "printed above",
         "zh-Hant": "混合專家（mixture of experts）層因容量（capacity）不足而丟棄的指派（token, 第幾選擇）數："
                    "n = 64 個 token、E = 8 個專家（expert）、top-2、容量因子（capacity factor）C = 1，"
                    "每個專家的需求量如上方所印"},
        f"{ANSWERS}:moe_dropped", {"experts": 8, "top_k": 2, "capacity_factor": 1.0},
        tolerance=0.1, unit=_l("assignments"), about=_l("MoE, n = 64, E = 8, top-2, C = 1")),
)}


# ----------------------------------------------------------------------------------------------
# Reading a prediction from a cell's source, as data.

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _number(node) -> float:
    """The value of a number, or of numbers with + - * / (all in floats: no huge integers)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _number(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_number(node.left), _number(node.right))
    raise ValueError("not a number")


def _assigns(node) -> bool:
    """A top-level ``my_prediction = ...`` (or ``my_prediction: float = ...``)."""
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == VARIABLE for t in node.targets)
    return isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
        node.target.id == VARIABLE and node.value is not None


def _words(node):
    """A string literal, or a list/tuple of string literals (as a tuple), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return tuple(e.value for e in node.elts)
    return None


def read_prediction(source: str, kind: str | None = "number"):
    """``my_prediction`` of an answer cell's source (its last top-level assignment): a float (kind
    "number"), a string ("choice"), a tuple of strings ("order"), or None while it is still None;
    ``kind=None`` takes any of them. ValueError, with the reason, when it is missing or not of its
    kind. Nothing in the cell is executed."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise ValueError(_("the prediction cell does not parse: {error} (line {line})").format(
            error=err.msg, line=err.lineno)) from None
    values = [node.value for node in tree.body if _assigns(node)]
    if not values:
        raise ValueError(_("the prediction cell defines no {variable}").format(variable=VARIABLE))
    node = values[-1]
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    words = _words(node)
    if kind == "choice" or (kind is None and isinstance(words, str)):
        if not isinstance(words, str):
            raise ValueError(_("{variable} is not one of the choices (the grader reads it, it never runs it): "
                               "write one of them in quotes, such as 'rows'").format(variable=VARIABLE))
        return words
    if kind == "order" or (kind is None and isinstance(words, tuple)):
        if not isinstance(words, tuple):
            raise ValueError(_("{variable} is not an order (the grader reads it, it never runs it): write the "
                               "choices as a list of strings, such as ['a', 'b', 'c']").format(variable=VARIABLE))
        return words
    try:
        value = _number(node)
    except (ValueError, ZeroDivisionError, OverflowError, RecursionError):
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(_("{variable} is not a number (the grader reads it, it never runs it): write a number "
                           "such as 0.25 or 3 / 11").format(variable=VARIABLE))
    return value


# ----------------------------------------------------------------------------------------------
# Comparing, in words (the notebook and the grader print the same lines).


def number(x: float, unit: str = "") -> str:
    """``0.273``, ``171``, ``12,345``: three significant digits, thousands written out."""
    text = f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"
    return f"{text} {unit}" if unit else text


def within(value: float, target: float, tolerance: float) -> bool:
    """``value`` within ``tolerance`` (relative) of ``target``."""
    return abs(value - target) <= tolerance * abs(target) + 1e-12


def answer_text(value, unit: str = "") -> str:
    """A prediction or its reference as the lessons print it: a number (``number``), a choice as
    written, an order as ``a → b → c``."""
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)):
        return " → ".join(str(v) for v in value)
    return number(float(value), unit)


def matches(value, target) -> bool:
    """A choice or an order equals its reference (case and surrounding spaces aside)."""
    def norm(v):
        return tuple(norm(x) for x in v) if isinstance(v, (tuple, list)) else str(v).strip().casefold()

    return norm(value) == norm(target)


def exact_comparison(value, target, unit: str = "", name: str = "measured", about: str = "") -> str:
    """``predicted rows, simulated columns (...): not this time`` for a choice, an order or an exact
    count (a number with tolerance 0); an order also says how many are in place."""
    right = matches(value, target) if not isinstance(value, (int, float)) else within(value, target, 0)
    about = f" ({about})" if about else ""
    fields = dict(value=answer_text(value, unit), name=name, target=answer_text(target, unit), about=about)
    if right:
        return _("predicted {value}, {name} {target}{about}: right").format(**fields)
    if isinstance(value, (tuple, list)) and isinstance(target, (tuple, list)):
        placed = sum(matches(a, b) for a, b in zip(value, target))
        return _("predicted {value}, {name} {target}{about}: {placed} of {n} in place").format(
            placed=placed, n=len(target), **fields)
    return _("predicted {value}, {name} {target}{about}: not this time").format(**fields)


def comparison(value: float, target: float, tolerance: float, unit: str = "", name: str = "measured",
               about: str = "") -> str:
    """``predicted 0.1, reference 0.273 (GPipe bubble, p = 4, m = 8): -63 %, outside ±10 %`` (in the
    process's language; ``name`` as given). A tolerance of 0 is an exact count: ``exact_comparison``."""
    if tolerance == 0:
        return exact_comparison(value, target, unit, name, about)
    percent = round((value - target) / abs(target) * 100) if target else 0
    off = f"{percent:+d} %, " if percent else ("0 %, " if target else "")
    inside = within(value, target, tolerance)
    about = f" ({about})" if about else ""
    text = _("predicted {value}, {name} {target}{about}: {off}within ±{tolerance:g} %") if inside else \
        _("predicted {value}, {name} {target}{about}: {off}outside ±{tolerance:g} %")
    return text.format(value=number(value, unit), name=name, target=number(target, unit), about=about, off=off,
                       tolerance=tolerance * 100)


# ----------------------------------------------------------------------------------------------
# Grading.


def grade(prediction_id: str, source: str) -> Verdict:
    """The verdict on a graded prediction's answer cell: PASSED within the tolerance of the
    reference the grader computes, FAILED outside it or when unreadable, NOT YET while None."""
    graded = GRADED.get(prediction_id)
    if graded is None:
        return Verdict(False, [failure(_("prediction {id}: FAILED: the grader knows no graded prediction "
                                         "{id!r}").format(id=prediction_id))])
    try:
        value = read_prediction(source, graded.kind)
    except ValueError as err:
        return Verdict(False, [failure(_("prediction {id}: FAILED: {reason}").format(id=prediction_id, reason=err))])
    if value is None:
        return Verdict(False, [failure(_("prediction {id}: NOT YET: {variable} is still None; write your number in "
                                         "the cell tagged answer:predict:{id}").format(id=prediction_id,
                                                                                       variable=VARIABLE))],
                       not_yet=True)
    target = graded.reference()
    if graded.kind == "number":
        passed = within(value, target, graded.tolerance)
        text = comparison(value, target, graded.tolerance, str(graded.unit), _("reference"), str(graded.about))
    else:
        passed = matches(value, target)
        text = exact_comparison(value, target, str(graded.unit), _("reference"), str(graded.about))
    if passed:
        return Verdict(True, [_("prediction {id}: PASSED: {comparison}").format(id=prediction_id, comparison=text)])
    return Verdict(False, [failure(_("prediction {id}: FAILED: {comparison}").format(id=prediction_id,
                                                                                       comparison=text))])
