"""Lesson 08 (activation recomputation and PipeDream): what its text says about recomputation holds.

- the graded prediction ``recompute-step``: on the clock of the pipeline lessons (F = 1, B = 2, free
  links) full recomputation makes every B into F + B, so a GPipe or 1F1B step of equal stages is
  (m + p − 1)(2F + B) (44 time units for the lesson's p = 4, m = 8) and its bubble does not change;
- on real ranks recomputation keeps the number of stashed micro-batches and shrinks each one (the
  ungraded prediction ``recompute-stash``);
- the range the lesson quotes for what recomputation adds to a measured B, in units of the measured
  F, holds over repeated runs (the lesson prints each run's own value).
"""

from __future__ import annotations

import statistics

import pytest

from parallel_lab.course import predictions
from parallel_lab.course.quiz import answers
from parallel_lab.pipeline.run import run_pipeline
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.show import recompute as recompute_figures

LOW, HIGH = 0.4, 1.4  # what recomputation adds to B, in F: the range lesson 08 quotes


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(4, 8), (2, 3), (8, 8)])
def test_full_recomputation_stretches_the_step_by_f_plus_b_over_b_and_keeps_the_bubble(schedule, p, m):
    plain, recomputed = (simulate(build(schedule, p, m), Costs(F=1, B=b)) for b in (2, 3))
    assert answers.recompute_makespan(schedule, p, m) == recomputed.makespan == (m + p - 1) * (2 * 1 + 2)
    assert recomputed.bubble_fraction == pytest.approx(plain.bubble_fraction)
    text = recompute_figures.step_text(plain, recomputed)
    assert f"{recomputed.makespan:g} with it" in text and "1.33 times" in text
    assert predictions.GRADED["recompute-step"].reference() == 44


@pytest.mark.ranks
def test_recomputation_stashes_as_many_smaller_micro_batches_and_costs_about_one_forward():
    extras = []
    for _ in range(3):
        plain, recomputed = (run_pipeline("1f1b", 4, 8, recompute=rc) for rc in (False, True))
        assert recompute_figures.stash_change(plain, recomputed) == "smaller"
        assert recomputed["max_grad_diff"] < 1e-10 and plain["max_grad_diff"] < 1e-10
        extras.append(recompute_figures.measured_costs(plain, recomputed)["extra_in_F"])
    assert LOW <= statistics.median(extras) <= HIGH, extras


def test_the_lesson_quotes_the_range_the_test_holds():
    from pathlib import Path

    source = (Path(__file__).resolve().parent.parent / "lessons" / "src" / "08_recompute_and_pipedream.py").read_text()
    assert f"between {LOW} F and {HIGH} F" in source
