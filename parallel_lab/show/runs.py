"""What the pipeline lessons print about a simulated step and a run on real ranks (lessons 03, 04 and
05, lessons/03_pipeline_bubble.ipynb, lessons/04_gpipe_microbatching.ipynb, lessons/05_1f1b_memory.ipynb),
in the lesson's language.

    from parallel_lab.show import runs
    runs.step_summary(timeline)                 # step, busy time per rank and bubble of a timeline
    runs.gpipe_bubble_table(4, (1, 2, 4, 8))    # GPipe's bubble against m: simulated and closed forms
    runs.ran("GPipe", result)                   # a run on ranks against one process, in one line

Every number comes from the timeline or the run passed in; the words go through the catalog
(``parallel_lab.i18n``). Lines of measured times are for cells that nbval does not compare.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go

from parallel_lab.i18n import _
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.show.pipeline import EXACT, memory, plain_layout, yes_no


def naive_step(timeline) -> None:
    """Lesson 03: the naive schedule's step, the work of one rank, and the bubble as the idle share of
    the p × step box."""
    p = len(timeline.busy)
    print()
    print(_("step: {step:g} units; every rank works {busy:g} of them").format(
        step=timeline.makespan, busy=timeline.busy[0]))
    print(_("bubble = idle share of the p × step box = 1 − {busy:g} / ({p} × {step:g}) = {bubble:.2f}").format(
        busy=sum(timeline.busy), p=p, step=timeline.makespan, bubble=timeline.bubble_fraction))


def running_naive(p: int) -> None:
    """Lesson 03: the line printed before the naive schedule's first run on ranks."""
    print(_("running the naive schedule on {p} ranks (the first start takes a few seconds) ...").format(p=p))


def naive_ran(result: Mapping) -> None:
    """Lesson 03: a run's loss and gradients against the single-process model (True/False as Python
    says them), and the micro-batches each stage stashed at once."""
    print(_("loss equals the single-process model: {equal}").format(equal=result["loss_diff"] < EXACT))
    print(_("gradients equal the single-process model: {equal}").format(equal=result["max_grad_diff"] < EXACT))
    print(_("micro-batches stashed at once per stage: {peaks}").format(peaks=result["peak_activations"]))


def two_clocks(result: Mapping, cores: int, p: int) -> None:
    """Lesson 03: a run's bubble on the virtual clock, predicted from its measured costs, and on the
    wall clock of this machine. Measured: for a cell nbval does not compare."""
    print(_("bubble on the virtual clock (p dedicated devices): {bubble:.3f}").format(bubble=result["bubble_measured"]))
    print(_("bubble predicted by the simulator, measured costs:  {bubble:.3f}").format(
        bubble=result["bubble_predicted"]))
    print(_("bubble on the wall clock ({cores} cores shared by {p} ranks): {bubble:.3f}").format(
        cores=cores, p=p, bubble=result["bubble_wall"]))


def step_summary(timeline) -> None:
    """The step, one rank's busy time and the bubble of a simulated timeline."""
    print(_("step {step:g} units, each rank busy {busy:g}, bubble {bubble:.3f}").format(
        step=timeline.makespan, busy=timeline.busy[0], bubble=timeline.bubble_fraction))


def gpipe_bubble_table(p: int, microbatches: Sequence[int], costs: Costs = Costs(F=1, B=2)) -> None:
    """GPipe's simulated bubble for each m beside the two closed forms: against the step,
    (p−1)/(m+p−1), and against the compute, (p−1)/m."""
    print(_(" m   bubble (simulated)   (p−1)/(m+p−1)   idle/compute (p−1)/m"))
    for m in microbatches:
        t = simulate(build("gpipe", p, m), costs)
        print(f"{m:>2}   {t.bubble_fraction:>18.3f}   {(p - 1) / (m + p - 1):>13.3f}   {(p - 1) / m:>20.3f}")


def gpipe_curves(stages: Sequence[int] = (2, 4, 8), microbatches: Sequence[int] = tuple(range(1, 33)),
                 costs: Costs = Costs(F=1, B=2)):
    """GPipe's simulated bubble against m, one line per number of stages."""
    curves = [go.Scatter(x=list(microbatches),
                         y=[round(simulate(build("gpipe", p, m), costs).bubble_fraction, 4) for m in microbatches],
                         mode="lines+markers", marker_size=4, name=_("p = {p} stages").format(p=p)) for p in stages]
    fig = go.Figure(curves)
    fig.update_layout(**plain_layout(height=330, title=_("GPipe: bubble (p−1)/(m+p−1), simulated"),
                                     xaxis_title=_("micro-batches m"),
                                     yaxis_title=_("bubble (idle share of the step)")))
    fig.update_yaxes(range=[0, 1])
    return fig


def running(name: str, p: int, m: int, end: str = "\n", recompute: bool = False) -> None:
    """The line printed before a run starts (``recompute``: the run recomputes its activations)."""
    line = (_("{name} with recomputation on {p} ranks, m = {m} ...") if recompute
            else _("{name} on {p} ranks, m = {m} ..."))
    print(line.format(name=name, p=p, m=m), end=end)


def ran(result: Mapping) -> None:
    """A run against one process: its gradients, and the micro-batches each stage kept at once."""
    print(_("gradients equal the single-process model: {equal}; stashed at once per stage: {peaks}").format(
        equal=yes_no(result["max_grad_diff"] < EXACT), peaks=result["peak_activations"]))


def bubble_runs_table(runs: Mapping[int, Mapping], p: int, cores: int) -> None:
    """Measured bubbles per m (virtual and wall clock) beside the formula and the prediction from the
    measured costs. Measured: for a cell nbval does not compare."""
    print(_(" m   (p−1)/(m+p−1)   predicted (measured costs)   measured (virtual clock)   "
            "wall clock ({cores} cores)").format(cores=cores))
    for m, r in runs.items():
        print(f"{m:>2}   {(p - 1) / (m + p - 1):>13.3f}   {r['bubble_predicted']:>26.3f}   "
              f"{r['bubble_measured']:>24.3f}   {r['bubble_wall']:>17.3f}")


def stash_figure(source, name: str, p: int, m: int):
    """``figures.memory`` titled with the schedule and its shape: simulated (a timeline) or measured
    on real ranks (a run's result, on the virtual clock)."""
    if isinstance(source, Mapping):
        title = _("{name} on {p} real ranks, m = {m}: stashed micro-batches (virtual clock)")
    else:
        title = _("{name}, p = {p}, m = {m}: stashed micro-batches per stage")
    return memory(source, title=title.format(name=name, p=p, m=m))


def peaks_are_m(runs: Mapping[int, Mapping], stage: int = 1) -> None:
    """For GPipe runs per m: whether every stage's peak stash is m, and one stage's bytes at its peak."""
    for m, r in runs.items():
        print(_("m = {m}: peak stash is m on every stage: {same}; stage {stage} keeps {bytes:,} bytes of "
                "activations").format(m=m, same=yes_no(r["peak_activations"] == [m] * len(r["peak_activations"])),
                                      stage=stage, bytes=r["peak_bytes"][stage]))


def trace_summary(path, events: Sequence[Mapping], kinds: Mapping[str, int], result: Mapping) -> None:
    """What a Chrome trace of a run holds: its events by kind, and the run's check against one process."""
    print(_("{file}: {n} events").format(file=path.name, n=len(events)))
    print("  " + _("{n} action slices: 4 ranks × 16 actions × 3 clocks").format(n=kinds["X"]))
    print("  " + _("{counters} activation-counter samples, {names} names of processes and tracks").format(
        counters=kinds["C"], names=kinds["M"]))
    print(_("gradients equal the single-process model: {equal}").format(equal=yes_no(result["max_grad_diff"] < EXACT)))


# ----------------------------------------------------------------------------------------------
# Lesson 05: 1F1B against GPipe.


def steps_and_bubbles(timelines: Mapping[str, object], p: int, m: int) -> None:
    """Each schedule's simulated step and bubble beside GPipe's closed form (p−1)/(m+p−1)."""
    for name, t in timelines.items():
        print(_("{name}: step {step:g} units, bubble {bubble:.3f}  ((p−1)/(m+p−1) = {formula:.3f})").format(
            name=f"{name:>5}", step=t.makespan, bubble=t.bubble_fraction, formula=(p - 1) / (m + p - 1)))


def peaks_table(p: int, microbatches: Sequence[int], costs: Costs = Costs(F=1, B=2)) -> None:
    """Peak micro-batches stashed per stage, GPipe against 1F1B, beside 1F1B's min(m, p−r)."""
    print(_(" m   GPipe peaks            1F1B peaks        min(m, p−r)"))
    for m in microbatches:
        peaks = {name: simulate(build(name, p, m), costs).peak_activations for name in ("gpipe", "1f1b")}
        print(f"{m:>2}   {str(peaks['gpipe']):<20}   {str(peaks['1f1b']):<15}   {[min(m, p - r) for r in range(p)]}")


def gpipe_against_1f1b(runs: Mapping[str, Mapping], predicted: Sequence[int], m: int, stage: int = 1) -> None:
    """1F1B and GPipe on real ranks: 1F1B's gradients, both measured peak stashes against their
    predictions, and one middle stage's bytes at its peak."""
    one, gpipe = runs["1f1b"], runs["gpipe"]
    print(_("1F1B gradients equal the single-process model: {equal}").format(
        equal=yes_no(one["max_grad_diff"] < EXACT)))
    print(_("1F1B measured peak stash == predicted min(m, p−r): {same} {peaks}").format(
        same=yes_no(one["peak_activations"] == list(predicted)), peaks=one["peak_activations"]))
    print(_("GPipe measured peak stash == m on every stage: {same}").format(
        same=yes_no(gpipe["peak_activations"] == [m] * len(gpipe["peak_activations"]))))
    print(_("stage {stage} (a middle stage: all it keeps is activations) at its peak: GPipe {gpipe:,} bytes, "
            "1F1B {one:,} bytes").format(stage=stage, gpipe=gpipe["peak_bytes"][stage], one=one["peak_bytes"][stage]))


def measured_bubbles(runs: Mapping[str, Mapping]) -> None:
    """Each run's bubble on the virtual clock (with its prediction) and on the wall clock. Measured:
    for a cell nbval does not compare."""
    for name, r in runs.items():
        print(_("{name}: bubble {measured:.3f} virtual clock (predicted {predicted:.3f}), {wall:.3f} wall "
                "clock").format(name=f"{name:>5}", measured=r["bubble_measured"], predicted=r["bubble_predicted"],
                                wall=r["bubble_wall"]))


def recompute_summary(plain: Mapping, recomputed: Mapping, stage: int = 1) -> None:
    """A run with recomputation against the same run without: gradients, micro-batches in flight and
    one stage's bytes at its peak."""
    print(_("gradients equal the single-process model: {equal}").format(
        equal=yes_no(recomputed["max_grad_diff"] < EXACT)))
    print(_("same micro-batches in flight: {same}").format(
        same=yes_no(recomputed["peak_activations"] == plain["peak_activations"])))
    print(_("stage {stage} at its peak: {plain:,} bytes without, {recomputed:,} bytes with recomputation").format(
        stage=stage, plain=plain["peak_bytes"][stage], recomputed=recomputed["peak_bytes"][stage]))


def backward_times(plain: Mapping, recomputed: Mapping) -> None:
    """The mean measured backward per micro-batch and stage, without and with recomputation. Measured:
    for a cell nbval does not compare."""
    b_plain, b_rec = (sum(r["costs"]["B"]) / len(r["costs"]["B"]) for r in (plain, recomputed))
    print(_("mean backward per micro-batch and stage: {plain:.2f} ms without, {rec:.2f} ms with recomputation "
            "({ratio:.2f}×)").format(plain=b_plain * 1e3, rec=b_rec * 1e3, ratio=b_rec / b_plain))
