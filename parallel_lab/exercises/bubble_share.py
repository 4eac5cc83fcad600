"""Lesson 17's exercise: the FAQ's fifth answer as a number -- the share of a step a GPU sits idle
under GPipe or 1F1B, and under interleaved 1F1B with v model chunks (lessons/17_faq.ipynb).

    def my_bubble_share(p, m, v=1):
        return ...   # idle share of the step, 0 <= share < 1

The answer runs on a rank of its own and returns only numbers; the checking process simulates each
case's schedule (``pipeline.simulate``, F = 1 and B = 2 per micro-batch on a rank, split evenly over
its v chunks) and compares the idle share of the step, 1 - m(F + B) / makespan, within 1e-9. The
closed form it should find is Narayanan et al. 2021's bubble, (p - 1)/v slots of F + B (their §2.2.2),
over the step that holds it: (p - 1) / (v·m + p - 1); with v = 1 it is GPipe's (K - 1)/(M + K - 1)
(Huang et al. 2019, §2.3). The library's simulator and closed forms are forbidden in the answer.
"""

from __future__ import annotations

from parallel_lab.exercises.check import (
    Exercise,
    Verdict,
    answer_error,
    compile_answer,
    register,
    run_answer,
    tallied,
)
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import Costs, simulate

# (p, m, v): GPipe/1F1B (v = 1) and interleaved 1F1B (m divisible by p, Megatron-LM's default)
CASES = ((4, 8, 1), (4, 12, 1), (8, 16, 1), (2, 6, 1), (8, 8, 1), (4, 8, 2), (8, 16, 2), (4, 12, 4), (2, 6, 3))
POLICY = Policy("my_bubble_share", imports=("math", "fractions"), dist=())


def harness(source: str, name: str, cases=CASES) -> list[dict]:
    """On a rank: the answer's share for each case (``{"share": x}``), or its error."""
    fn = compile_answer(source, name)
    out = []
    for p, m, v in cases:
        try:
            share = fn(p, m, v)
            out.append({"share": float(share)} if isinstance(share, (int, float)) else {"type": type(share).__name__})
        except Exception as err:  # the answer's own error: reported per case
            out.append({"error": answer_error(err)})
    return out


def simulated_share(p: int, m: int, v: int) -> float:
    """The idle share of the step in the simulator: F = 1, B = 2 per micro-batch and rank."""
    name = "1f1b" if v == 1 else "interleaved-1f1b"
    timeline = simulate(build(name, p, m, v), Costs(F=1 / v, B=2 / v))
    return 1 - 3 * m / timeline.makespan


def judge_case(answer: dict, p: int, m: int, v: int) -> str | None:
    """Why the answer to one case is wrong, or None."""
    if "error" in answer:
        return answer["error"]
    if "share" not in answer:
        return _("returned a {type}, not a number").format(type=answer["type"])
    got, want = answer["share"], simulated_share(p, m, v)
    if abs(got - want) > 1e-9:
        hint = ""
        if v > 1 and abs(got - simulated_share(p, m, 1)) < 1e-9:
            hint = _(": that is the share without interleaving; with v chunks each fill slot is 1/v as long")
        elif abs(got - (p - 1) / (v * m)) < 1e-9:
            hint = _(": that is the bubble over the ideal time; the share is of the whole step, bubble included")
        return _("returned {got:.4f}, the simulator's idle share is {want:.4f}{hint}").format(got=got, want=want,
                                                                                              hint=hint)
    return None


def judge(source: str):
    answers = run_answer(harness, source, POLICY.name, 1, str(EXERCISE.label))
    if isinstance(answers, str):
        return False, [answers], (0, len(CASES))
    failures = [f"p {p}, m {m}, v {v}: {wrong}" for (p, m, v), answer in zip(CASES, answers[0])
                if (wrong := judge_case(answer, p, m, v))]
    return tallied(failures, len(CASES), _("bubble share: FAILED ({passed}/{tried} cases)"),
                   _("bubble share: PASSED ({n}/{n} cases equal the simulator)"))


EXERCISE = register(Exercise(
    "bubble-share", _l("bubble share"), POLICY, judge,
    forbids="the library (its simulator and closed forms): work the share out yourself"))


def check_bubble_share(fn) -> Verdict:
    """Lesson 17's exercise: ``fn(p, m, v)`` returns the idle share of a step under 1F1B (v = 1) or
    interleaved 1F1B with v chunks. Prints and returns a deterministic verdict."""
    return EXERCISE.check_object(fn)
