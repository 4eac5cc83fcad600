"""A pipeline run as a Chrome / Perfetto trace (open it in https://ui.perfetto.dev or chrome://tracing):
the virtual clock, the wall clock and the simulator's prediction of every rank, one track each.

    write_trace(run_pipeline("1f1b", 4, 8), "1f1b.json")     # or: parallel-lab run pipeline --trace F
"""

from __future__ import annotations

import json

from parallel_lab.pipeline.schedules import Action


def chrome_trace(result: dict) -> dict:
    """The run as a Chrome trace (open in https://ui.perfetto.dev or chrome://tracing).

    One process per rank with three labelled tracks: the virtual clock, the wall clock and the
    simulator's prediction (all in microseconds from the common start), plus one counter per model
    stage for its stashed activations on the virtual clock.
    """
    tracks = {"virtual": (1, "virtual clock: thread CPU time + modelled link (p dedicated devices)"),
              "wall": (2, f"wall clock: {result['clocks']['wall']}"),
              "predicted": (3, "predicted: simulator fed the measured per-stage costs")}
    events = []
    timeline = result["timeline"]
    for rank in range(result["stages"]):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for clock, (tid, name) in tracks.items():
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
            for action, start, end in timeline[clock][rank]:
                a = Action.parse(action)
                events.append({"ph": "X", "name": action, "cat": a.kind, "pid": rank, "tid": tid,
                               "ts": round(start * 1e6, 3), "dur": round((end - start) * 1e6, 3),
                               "args": {"stage": a.stage, "kind": a.kind, "microbatch": a.microbatch,
                                        "clock": clock}})
    owner = _stage_owner(result)
    for stage, series in enumerate(timeline["memory"]):
        for t, count, nbytes in series:
            events.append({"ph": "C", "name": f"stage {stage} activations (virtual clock)",
                           "pid": owner[stage], "ts": round(t * 1e6, 3),
                           "args": {"stashed microbatches": count, "MB": round(nbytes / 1e6, 6)}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {k: result[k] for k in ("schedule", "stages", "microbatches", "model",
                                                 "bubble_measured", "bubble_predicted", "bubble_wall")}}


def _stage_owner(result: dict) -> list[int]:
    owner = [0] * result["model_stages"]
    for rank, timed in enumerate(result["timeline"]["virtual"]):
        for action, _, _ in timed:
            owner[Action.parse(action).stage] = rank
    return owner


def write_trace(result: dict, path) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(result), f, separators=(",", ":"))
