"""Pipeline pictures (parallel_lab.show.pipeline): what the bars say, determinism and size of the
JSON nbval stores, and the schedule panel's update logic without a browser. Only the last test
starts ranks (the panel's "run on real ranks" button)."""

import json

import pytest

from parallel_lab.pipeline.schedules import SCHEDULES, build
from parallel_lab.pipeline.simulate import Costs, simulate
from parallel_lab.show import pipeline as figures


def _bars_by_rank(fig):
    """{rank: [(action, start, end), ...]} read back from the figure's bar traces."""
    out = {}
    for trace in fig.data:
        if trace.type != "bar" or "predicted" in trace.name:
            continue
        for rank, action, base, length in zip(trace.y, trace.customdata, trace.base, trace.x):
            out.setdefault(rank, []).append((action, base, base + length))
    return {r: sorted(v, key=lambda t: t[1]) for r, v in out.items()}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_gantt_draws_every_action_where_the_simulator_put_it(name):
    p, m = (4, 1) if name == "naive" else (4, 8)
    timeline = simulate(build(name, p, m, 2 if name == "interleaved-1f1b" else 1))
    fig = figures.gantt(timeline)
    bars = _bars_by_rank(fig)
    assert bars == {r: [(str(a), s, e) for a, s, e in timed] for r, timed in enumerate(timeline.ranks)}
    assert {t.name.split()[0] for t in fig.data} <= set("FBIW")
    # microbatch numbers as text, idle time as the gaps between bars
    for trace in fig.data:
        assert list(trace.text) == [a[-1] if a[-2].isalpha() else a[-2:] for a in trace.customdata]
    idle = sum(timeline.makespan - sum(e - s for _, s, e in row) for row in bars.values())
    assert idle == pytest.approx(timeline.bubble_fraction * p * timeline.makespan)
    assert "simulator cost units" in fig.layout.xaxis.title.text


def test_simulated_figures_are_deterministic_and_compact():
    timeline = simulate(build("zb-h1", 4, 8))
    a, b = figures.gantt(timeline).to_json(), figures.gantt(simulate(build("zb-h1", 4, 8))).to_json()
    assert a == b
    assert len(a) < 5000, len(a)  # no embedded template, integers where costs are integers
    assert len(figures.memory(timeline).to_json()) < 2500


def test_memory_figure_follows_the_stash():
    timeline = simulate(build("1f1b", 4, 8), Costs(F=1, B=2))
    fig = figures.memory(timeline)
    assert [max(t.y) for t in fig.data] == timeline.peak_activations == [4, 3, 2, 1]
    assert all(t.line.shape == "hv" and t.y[-1] == 0 for t in fig.data)


def _fake_result(name="1f1b", p=4, m=8, scale=1e-3):
    """A run_pipeline-shaped result made from two simulations (seconds), for drawing without ranks."""
    measured = simulate(build(name, p, m), Costs(F=1.1, B=2.3))
    predicted = simulate(build(name, p, m), Costs(F=1, B=2))

    def timed(t):
        return [[[str(a), s * scale, e * scale] for a, s, e in row] for row in t.ranks]

    return {"schedule": name, "stages": p, "microbatches": m, "bubble_measured": measured.bubble_fraction,
            "bubble_predicted": predicted.bubble_fraction, "bubble_wall": 0.5,
            "makespan_measured": measured.makespan * scale,
            "timeline": {"virtual": timed(measured), "wall": timed(measured), "predicted": timed(predicted),
                         "memory": [[[t * scale, c, 0] for t, c in curve] for curve in measured.memory]}}


def test_compare_overlays_outlined_prediction_on_filled_measurement():
    result = _fake_result()
    fig = figures.compare(result)
    filled = [t for t in fig.data if "predicted" not in t.name]
    outlined = [t for t in fig.data if "predicted" in t.name]
    assert len(filled) == len(outlined) == 2  # F and B
    assert all(t.marker.color == "rgba(0,0,0,0)" and t.marker.line.width == 2 for t in outlined)
    assert all(t.marker.color in figures.COLORS.values() for t in filled)
    assert "virtual clock" in fig.layout.xaxis.title.text
    assert sum(len(t.x) for t in filled) == sum(len(t.x) for t in outlined) == 2 * 4 * 8
    wall = figures.gantt(result, clock="wall")
    assert "wall clock" in wall.layout.xaxis.title.text and "wall clock" in wall.layout.title.text
    assert "virtual" in figures.gantt(result).layout.title.text
    with pytest.raises(ValueError, match="clock must be"):
        figures.gantt(result, clock="cpu")
    assert max(figures.memory(result).data[0].y) == 4


def _bar_data(panel):
    return json.dumps([t.to_plotly_json() for t in panel.figure.data], default=str)


def test_schedule_panel_updates_chart_and_numbers_in_place():
    panel = figures.schedule_panel("1f1b", 4, 8)
    figure = panel.figure
    before, numbers = _bar_data(panel), panel.numbers.value
    assert "simulated bubble 27.3%" in numbers and "F:B:W = 1:2:1" in numbers and "[4, 3, 2, 1]" in numbers

    panel.controls["schedule"].value = "gpipe"
    assert panel.figure is figure and _bar_data(panel) != before  # same widget, new bars
    assert "[8, 8, 8, 8]" in panel.numbers.value

    panel.controls["schedule"].value = "zb-h1"
    assert {t.name.split()[0] for t in panel.figure.data} == {"F", "I", "W"}
    split, numbers = _bar_data(panel), panel.numbers.value
    panel.controls["W"].value = 1.5  # F:B:W = 1:2:1.5 -> I = 0.5: shorter I bars
    assert _bar_data(panel) != split
    panel.controls["F"].value = 2.0
    assert panel.numbers.value != numbers

    panel.controls["microbatches"].value = 4
    assert len(_bars_by_rank(panel.figure)[0]) == 3 * 4

    chart = _bar_data(panel)
    panel.controls["schedule"].value = "interleaved-1f1b"
    panel.controls["microbatches"].value = 6  # 6 % 4 != 0: the reason is shown, no chart of another setting
    assert "microbatches % ranks == 0" in panel.numbers.value
    assert panel.figure.data == () and "no schedule for these settings" in panel.figure.layout.title.text
    panel.controls["microbatches"].value = 8
    panel.controls["virtual"].value = 2
    assert _bar_data(panel) != chart and "bubble" in panel.numbers.value


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_schedule_panel_runs_on_real_ranks_and_overlays_the_measurement():
    panel = figures.schedule_panel("1f1b", 2, 4)
    panel.button.click()
    assert panel.progress.value == panel.progress.max and panel.progress.description == "done"
    assert panel.result["max_grad_diff"] < 1e-10
    names = [t.name for t in panel.figure.data]
    assert "F forward" in names and "F forward (predicted)" in names
    assert "measured on 2 ranks" in panel.numbers.value and "virtual" in panel.numbers.value
    assert "from this run's measured costs" in panel.numbers.value
