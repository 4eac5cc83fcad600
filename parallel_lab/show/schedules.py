"""Schedules side by side (lessons 06 and 07, lessons/07_zero_bubble.ipynb): bubble, memory and
messages per schedule, and the bubble against the number of micro-batches; and a student's own
schedule as the validator sees it (``your_schedule``, before an exercise's check).

    from parallel_lab.show import schedules as sf
    print(sf.schedule_table(sf.compare_schedules()))   # bubble, memory, messages per schedule
    sf.bubble_curves(ranks=4)                          # bubble fraction against m, simulated

Computed from integers (the schedules, the simulator with unit costs), so every figure is
deterministic and nbval compares it. Papers: interleaved 1F1B (Narayanan et al. 2021, SC), ZB-H1 and
ZB-V (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"), DualPipeV (DeepSeek-V3 technical report
2024, section 3.2.1), which lesson 07 passes in: ``SCHEDULES + (("dualpipe-v", 2),)``.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import plotly.graph_objects as go

from parallel_lab.i18n import _, pad, width
from parallel_lab.pipeline.actions import ScheduleError, as_schedule
from parallel_lab.pipeline.communication import messages
from parallel_lab.pipeline.schedules import build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.pipeline.validate import validate
from parallel_lab.show.pipeline import equals_one_process, plain_layout, yes_no

# (schedule, virtual stages per rank) compared in lesson 07; costs per model stage F = I = W = 1
SCHEDULES = (("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zb-v", 2))
UNIT = Costs(F=1, B=2, I=1, W=1)
_COLORS = {"1f1b": "#4c78a8", "interleaved-1f1b": "#54a24b", "zb-h1": "#f58518", "zb-v": "#b279a2",
           "dualpipe-v": "#e45756"}  # dualpipe-v: not in lesson 07's SCHEDULES, pass it to compare


def label(name: str, virtual: int = 1) -> str:
    """``interleaved-1f1b`` with v = 2 -> ``interleaved-1f1b v=2``; others keep their name."""
    return f"{name} v={virtual}" if name == "interleaved-1f1b" else name


def compare_schedules(cases: Iterable[tuple[int, int]] = ((4, 8), (4, 16), (8, 16)),
                      schedules: Sequence[tuple[str, int]] = SCHEDULES, costs: Costs = UNIT) -> list[dict]:
    """One row per (p, m) case and schedule, simulated with ``costs`` (per model stage; default
    F = I = W = 1, B = 2): ``schedule``, ``virtual``, ``p``, ``m``, ``bubble`` (idle share of the
    step), ``ratio`` (idle / compute time, the papers' t_bubble / t_ideal), ``peak`` (most
    activations stashed on the busiest rank, in whole-stage units: chunks / v) and ``messages``."""
    rows = []
    for p, m in cases:
        for name, v in schedules:
            schedule = build(name, p, m, v)
            timeline = simulate(schedule, costs)
            bubble = timeline.bubble_fraction
            rows.append({"schedule": name, "virtual": v, "p": p, "m": m, "bubble": bubble,
                         "ratio": bubble / (1 - bubble), "peak": max(timeline.peak_rank_activations) / v,
                         "messages": messages(schedule)})
    return rows


def schedule_table(rows: Sequence[Mapping]) -> str:
    """``compare_schedules`` rows as a text table (numbers rounded for print)."""
    head = (f"{'p':>2} {'m':>3}  {pad(_('schedule'), 20)} {pad(_('bubble'), 7, '>')} "
            f"{pad(_('idle/compute'), 13, '>')} {pad(_('peak stash (stages)'), 20, '>')} {pad(_('messages'), 9, '>')}")
    lines, last = [head, "-" * width(head)], None
    for row in rows:
        if last is not None and (row["p"], row["m"]) != last:
            lines.append("")
        last = (row["p"], row["m"])
        lines.append(f"{row['p']:>2} {row['m']:>3}  {label(row['schedule'], row['virtual']):<20} "
                     f"{row['bubble']:>7.1%} {row['ratio']:>13.3f} {row['peak']:>20g} {row['messages']:>9}")
    return "\n".join(lines)


def _fits(name: str, ranks: int, m: int) -> bool:
    """Whether ``build`` takes m: interleaving needs m % p == 0, DualPipeV m >= 2p."""
    return {"interleaved-1f1b": m % ranks == 0, "dualpipe-v": m >= 2 * ranks}.get(name, True)


def bubble_curves(ranks: int = 4, microbatches: Sequence[int] = tuple(range(4, 33, 4)),
                  schedules: Sequence[tuple[str, int]] = SCHEDULES + (("interleaved-1f1b", 4),),
                  costs: Costs = UNIT):
    """Simulated bubble fraction against the number of microbatches, one line per schedule (each
    at the m its schedule takes: interleaving m % p == 0, DualPipeV m >= 2p)."""
    traces = []
    for name, v in schedules:
        ms = [m for m in microbatches if _fits(name, ranks, m)]
        bubbles = [round(simulate(build(name, ranks, m, v), costs).bubble_fraction, 4) for m in ms]
        # dualpipe-v's bubble is zb-v's at these costs: dashed, so that both lines show
        dash = "dot" if v == 4 else "dash" if name == "dualpipe-v" else "solid"
        traces.append(go.Scatter(x=list(ms), y=bubbles, mode="lines+markers", name=label(name, v),
                                 line=dict(color=_COLORS[name], dash=dash)))
    fig = go.Figure(traces)
    fig.update_layout(**plain_layout(height=340, xaxis_title=_("microbatches m"),
                                yaxis_title=_("bubble (idle share of the step)"),
                                title=_("Bubble against microbatches on p={p} ranks (simulated, F=I=W)").format(
                                    p=ranks)))
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    fig.update_xaxes(tickvals=list(microbatches))
    return fig


def your_schedule(fn, p: int, m: int, name: str | None = None) -> None:
    """Print what an exercise's ``fn(p, m)`` returns (``fn()`` for a function of no arguments, written
    for this ``p`` and ``m``) as the validator sees it:
    the step x rank grid of the valid schedule, the validator's message for a broken one, or, for the
    stub, how to go on. Lessons 03, 05 and 07 call it before an exercise's check."""
    name = name or getattr(fn, "__name__", "my_schedule")
    try:
        ranks = fn(p, m) if fn.__code__.co_argcount else fn()
        print(validate(as_schedule(ranks, p=p, m=m, name=name)))
    except NotImplementedError:
        print(_("{name} is not written yet: fill it in above, run its cell, then this one").format(name=name))
    except ScheduleError as err:
        print(err)


# ----------------------------------------------------------------------------------------------
# What lessons 06 and 07 print about a simulated timeline, in the lesson's language.


def _list(values) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def idle_report(name: str, timeline, formula: str = "", ideal: float | None = None, digits: int = 3,
                where: bool = False) -> None:
    """Print a timeline's step, idle time per GPU and idle share (``name``: the schedule as the lesson
    names it); with ``formula`` also the idle / compute ratio (idle of GPU 0 against ``ideal``, the
    work of one GPU) and the closed form it follows; with ``where`` where each GPU idles: at the start
    (r·F), in between and at the end (r·B)."""
    idle = [timeline.makespan - busy for busy in timeline.busy]
    print(_("{name}: step {step:g} units, idle per GPU {idle}, idle share {share:.1%}").format(
        name=name, step=timeline.makespan, idle=_list(idle), share=timeline.bubble_fraction))
    if where:
        for r, timed in enumerate(timeline.ranks):
            start, end = timed[0][1], timeline.makespan - timed[-1][2]
            print("  " + _("GPU {rank}: idle {start:g} at the start (r·F), {between:g} in between ((p−1−r)·(F+B)), "
                           "{end:g} at the end (r·B)").format(rank=r, start=start, between=idle[r] - start - end,
                                                               end=end))
    if formula and ideal:
        print(_("idle / compute = {ratio} = {formula}").format(ratio=f"{idle[0] / ideal:.{digits}f}", formula=formula))


def stage_map(schedule) -> None:
    """Print which GPU (rank) holds each model stage of ``schedule``."""
    print(_("model stage → GPU: {map}").format(map=dict(enumerate(schedule.stage_to_rank))))


def stash_and_messages(rows) -> None:
    """Print, for each ``(name, schedule, timeline)``, the messages one step sends and the peak
    activations per GPU in whole-stage units (chunks / v)."""
    names = [name for name, _schedule, _timeline in rows]
    wide = max(width(name) for name in names)
    for name, schedule, timeline in rows:
        stash = [n / schedule.virtual for n in timeline.peak_rank_activations]
        print(_("{name}  messages per step: {messages:>4}   peak stash per GPU (in stages): {stash}").format(
            name=pad(name, wide), messages=messages(schedule), stash=_list(stash)))


def zb_h1_stash_table(one_f_one_b, zb_h1, share: float) -> None:
    """Per GPU, 1F1B's peak (p − r micro-batches) beside ZB-H1's counted until W and its closed form
    (p − r) + r·M_W/M_B (``share`` = M_W / M_B)."""
    p = len(zb_h1.peak_rank_activations)
    print(_("M_W / M_B = {share:.3f}").format(share=share))
    heads = [_("GPU"), _("1F1B: (p−r)"), _("ZB-H1 counted until W"), _("= (p−r) + r·M_W/M_B")]
    print(" ".join(pad(h, w, ">") for h, w in zip(heads, (4, 12, 22, 21))))
    for r in range(p):
        print(f"{r:>4} {one_f_one_b.peak_rank_activations[r]:>12g} {zb_h1.peak_rank_activations[r]:>22.3f} "
              f"{(p - r) + r * share:>21.3f}")


def pairs(schedule, rank: int = 0) -> None:
    """A rank's pairs in a DualPipeV order: a forward followed by another micro-batch's input gradient
    on the rank's other stage."""
    row = [a for a in schedule.ranks[rank] if a is not None]
    found = [f"{f}+{b}" for f, b in zip(row, row[1:]) if f.kind == "F" and b.kind == "I" and f.stage != b.stage]
    print(_("GPU {rank}'s pairs (a forward, then another micro-batch's backward on its other stage): {pairs}").format(
        rank=rank, pairs=" ".join(found)))


def deepseek_bubble(p: int, F: float, I: float, W: float, simulated: float) -> None:
    """DeepSeek's DualPipeV bubble (its README, per device: (PP/2 − 1)(F&B + B − 3W) with PP = 2p
    stages), with a pair run one after the other (F&B = F + I + W, B = I + W), beside the idle time
    per GPU the simulator gives."""
    formula = (p - 1) * ((F + I + W) + (I + W) - 3 * W)
    print(_("DeepSeek's formula (p−1)(F&B + B − 3W) with F&B = F + I + W: {formula:g} units idle per GPU; "
            "simulated: {simulated:g}").format(formula=formula, simulated=simulated))


def peaks_in_stages(timelines: Mapping[str, object], virtual: int = 2) -> None:
    """Each timeline's peak stash per GPU in whole-stage units (chunks / ``virtual``), counted until W."""
    shown = "  ".join(f"{name} {_list([n / virtual for n in t.peak_rank_activations])}"
                      for name, t in timelines.items())
    print(_("peak stash per GPU (in stages), counted until W: {peaks}").format(peaks=shown))


def with_costs(names: Sequence[str], p: int, m: int, costs: Costs, what: str) -> None:
    """Each schedule's idle share and peak stash per GPU (in stages) at ``costs`` (``what`` says which)."""
    for name in names:
        schedule = build(name, p, m)
        timeline = simulate(schedule, costs)
        print(_("{name} with {what}: idle share {share:.1%}, peak stash per GPU (in stages) {stash}").format(
            name=pad(name, 11), what=what, share=timeline.bubble_fraction,
            stash=_list([n / schedule.virtual for n in timeline.peak_rank_activations])))


def run_report(name: str, virtual: int, result: Mapping) -> None:
    """A schedule run on real ranks: its loss and gradients against one process, the activations each
    stage held against the simulator's, and what each rank sent."""
    sent = sum(result["bytes_sent"]) // result["link"]["message_bytes"]
    equal = equals_one_process(result)
    same = result["peak_activations"] == result["peak_activations_predicted"]
    print(label(name, virtual) + ":")
    print("  " + _("loss and gradients match one process (< 1e-10): {equal}").format(equal=yes_no(equal)))
    print("  " + _("peak activations per stage measured == predicted: {same} {peaks}").format(
        same=yes_no(same), peaks=result["peak_activations"]))
    print("  " + _("bytes sent per rank {sent}: {messages} messages").format(sent=result["bytes_sent"], messages=sent))


def measured_bubbles(runs: Mapping[str, Mapping]) -> None:
    """Each run's bubble on the virtual clock against the prediction from its measured costs, and the
    mean cost of each kind of action. Measured: for a cell nbval does not compare."""
    for name, result in runs.items():
        costs = {k: round(1e6 * sum(c) / len(c)) for k, c in result["costs"].items() if c}
        print(_("{name} bubble measured {measured:.1%}, predicted {predicted:.1%}; mean cost per action (µs of CPU): "
                "{costs}").format(name=pad(label(name, result["virtual"]), 21), measured=result["bubble_measured"],
                                  predicted=result["bubble_predicted"], costs=costs))
