"""Schedules that travel (parallel_lab.pipeline.pytorch_csv): PyTorch's schedule CSV both ways, every
cell read by PyTorch's own parser and lowering, and PyTorch's runtime running an exported 1F1B and a
searched schedule on gloo ranks, equal to one process and to the course's executor."""

import dataclasses
import json

import pytest
from torch.distributed.pipelining.schedules import _Action, _add_send_recv, _validate_schedule

from parallel_lab import cli
from parallel_lab.pipeline import pytorch_csv
from parallel_lab.pipeline import run as prun
from parallel_lab.pipeline.communication import messages
from parallel_lab.pipeline.pytorch_runtime import run_csv
from parallel_lab.pipeline.schedules import ScheduleError, build
from parallel_lab.pipeline.search.api import search

CASES = [("gpipe", 4, 4, 1), ("1f1b", 4, 8, 1), ("interleaved-1f1b", 2, 4, 2), ("zb-h1", 4, 8, 1),
         ("zb-v", 4, 8, 2), ("dualpipe-v", 2, 4, 2), ("naive", 3, 1, 1)]
TOL = 1e-12


def schedules():
    yield from (build(name, p, m, v) for name, p, m, v in CASES)
    yield search(4, 8, 2, "v").schedule
    yield search(4, 8, 4).schedule


@pytest.mark.parametrize("schedule", list(schedules()), ids=lambda s: f"{s.name}-p{s.n_ranks}-v{s.virtual}")
def test_import_of_export_is_the_schedule(schedule):
    assert pytorch_csv.from_csv(pytorch_csv.to_csv(schedule), schedule.name) == schedule
    # the communication form has no idle slots; its compute actions are the same, in the same order
    back = pytorch_csv.from_csv(pytorch_csv.to_csv(schedule, comms=True), schedule.name)
    assert back == dataclasses.replace(schedule, ranks=[[a for a in row if a is not None] for row in schedule.ranks])


@pytest.mark.parametrize("schedule", list(schedules()), ids=lambda s: f"{s.name}-p{s.n_ranks}-v{s.virtual}")
def test_every_cell_parses_with_pytorchs_parser_and_its_lowering_accepts_the_schedule(schedule):
    for comms in (False, True):
        rows = pytorch_csv.to_rows(schedule, comms)
        parsed = {r: [_Action.from_str(cell) for cell in row] for r, row in enumerate(rows)}
        for row, actions in zip(rows, parsed.values()):
            assert [("" if a is None else str(a)) for a in actions] == row  # PyTorch writes each back the same
        compute = {r: [a for a in actions if a is not None and a.is_compute_op] for r, actions in parsed.items()}
        mapping = _validate_schedule(compute, schedule.n_ranks, schedule.n_stages, schedule.n_microbatches)
        assert tuple(mapping[s] for s in range(schedule.n_stages)) == schedule.stage_to_rank
        if not comms:  # PyTorch's own lowering adds its sends and receives without a deadlock: as many as ours
            lowered = _add_send_recv(compute, lambda s: mapping[s], schedule.n_stages)
            sends = [a for row in lowered.values() for a in row if a.computation_type.value.startswith("SEND")]
            assert len(sends) == messages(schedule)


def test_reading_names_the_broken_cell():
    with pytest.raises(ScheduleError, match="row 1 .*column 2: cannot read '1X0'"):
        pytorch_csv.from_csv("0F0,0B0\n1F0,1B0,1X0\n")
    with pytest.raises(ScheduleError, match="stage 0 is on rank 0 and rank 1"):
        pytorch_csv.from_csv("0F0,0B0\n0F1,0B1\n")
    with pytest.raises(ScheduleError, match="missing"):  # our validate: every (stage, micro-batch) once
        pytorch_csv.from_csv("0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n")


def test_export_and_import_on_the_command_line(capsys, tmp_path):
    out = tmp_path / "zbv.csv"
    assert cli.main(["schedule", "export", "zb-v", "--ranks", "4", "--microbatches", "8", "--virtual", "2",
                     "--format", "pytorch-csv", "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["schedule", "import", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["actions"] == {str(r): row for r, row in build("zb-v", 4, 8, 2).to_dict()["ranks"].items()}
    assert report["makespan"] > 0 and report["model_stages"] == 8
    saved = tmp_path / "found.json"
    cli.main(["schedule", "search", "--ranks", "4", "--microbatches", "8", "--max-activations", "4",
              "--save", str(saved)])
    capsys.readouterr()
    assert cli.main(["schedule", "export", str(saved), "--comms", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[0][-1] == "0REDUCE_GRAD" and any("SEND_F" in c for c in rows[0])
    assert cli.main(["schedule", "export", "nothing.csv"]) == 2
    assert "needs a schedule name" in capsys.readouterr().err


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("which", ["1f1b", "search-v", "search-wave"])
@pytest.mark.parametrize("comms", [False, True], ids=["compute_only", "compute_comms"])
def test_pytorchs_runtime_runs_the_export_equal_to_one_process_and_to_ours(which, comms):
    schedule = {"1f1b": lambda: build("1f1b", 4, 8), "search-v": lambda: search(4, 8, 2, "v").schedule,
                "search-wave": lambda: search(4, 8, 4).schedule}[which]()
    theirs = run_csv(schedule, comms=comms)
    assert theirs["max_grad_diff"] < TOL and theirs["loss_diff"] < TOL
    ours = prun.run_pipeline(schedule)
    assert abs(theirs["loss"] - ours["loss"]) < TOL
