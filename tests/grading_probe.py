"""A probe exercise for the grader's sandbox tests (tests/test_grading.py): its answer may do what no
course exercise allows (os, open, fork, sleep), so that the sandbox, not the review, is what stops
it. The checker imports this module by name (``grade(..., modules=("grading_probe",))``)."""

from parallel_lab.exercises.check import Exercise, compile_answer, failure, register, run_answer
from parallel_lab.exercises.policy import Policy

POLICY = Policy("probe", imports=("os", "sys", "time", "signal"), reflection=True)


def harness(source: str, name: str) -> dict:
    """On a rank: call the answer's ``probe()``; what it said, as text."""
    return {"said": str(compile_answer(source, name)())[:300]}


def judge(source: str) -> tuple[bool, list]:
    per_rank = run_answer(harness, source, POLICY.name, 1, "probe")
    if isinstance(per_rank, str):
        return False, [per_rank]
    said = per_rank[0]["said"]
    return said == "ok", ["probe: PASSED: it said ok" if said == "ok" else failure(f"probe: FAILED: it said {said}")]


EXERCISE = register(Exercise("probe", "probe", POLICY, judge, forbids="nothing: the sandbox stops it"))
