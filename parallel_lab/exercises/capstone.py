"""Lesson 18's hand-in, the capstone: a plan of the student's own, predicted by the course's model,
run on real ranks against one process, and the gap explained (lessons/18_capstone.ipynb).

    def my_plan():                          # the answer cell (answer:capstone): a dict of Config fields
        return {"dp": 2, "pp": 2, "tp": 1, "schedule": "1f1b", "microbatches": 4}

    cfg = plan_config(my_plan())            # train3d.Config in fp64, checked (a clear error if not)
    prediction = predict(cfg)               # memory and step time by the course's model (lessons 15-16)
    measurement = measure(cfg, prediction)  # trained on real ranks; prints the record line
    check_capstone(my_plan, measurement)    # what the grader verifies, here

**What a student hands in.** The plan (a function returning a dict of ``train3d.Config`` fields:
the mesh ``dp``, ``pp``, ``tp``, a pipeline ``schedule`` with ``virtual`` and ``microbatches``,
ZeRO-1 with ``zero``, ``recompute``, ``sequence_parallel``, and the tiny GPT's sizes), the
**record** that ``measure`` prints as one line ``capstone record: {...}`` in the output of the cell
that ran it (the grader reads it from the submitted notebook's outputs), and the written analysis
(a markdown cell, ``answer:capstone-analysis``), which no program scores: the grader exports it with
the rubric of the grading policy (``grading.yaml``, ``rubric: capstone-analysis``; the lesson shows
it with ``course.grading.policy.show_rubric``) for the instructor, whose score enters as an override.

**What the check verifies**, in the checking process (the grader's sandbox), one case each:

1. *the plan runs and equals one process*: the answer runs on a rank of its own and returns plain
   data; its plan is checked (``parallel3d.config.check``: every invariant named with its values)
   and trained here on real ranks in fp64 (``train3d.train``), whose losses and final weights must
   equal one process's to 1e-9;
2. *the prediction came from the model for that plan*: the record's memory is
   ``config.predicted_memory`` of the plan, and its step time ``validate_plans.predict`` of the plan
   with the constants the record says were measured (FLOP/s of this model, all-reduce α–β,
   cores), both recomputed here to a relative 1e-9;
3. *the measurement is theirs*: the record is of this plan, unedited (its digest), and of a real
   run of it: its losses are the ones this run computes (fp64 losses are the same on every machine;
   a record of another plan, of a run that never happened or with numbers typed in does not have
   them), with one wall time per step and the median it reports.

What it does not prove: that the student's own machine took the times the record shows. The digest
is a checksum of the record, not a signature (the library that writes it is readable, so anyone can
write a consistent record by hand with enough effort); a record copied from another student with
the same plan passes, and the similarity report lists two identical hand-ins. Timings are never
judged for accuracy: the analysis explains the gap, and that is the instructor's to score.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import statistics

from parallel_lab.exercises.check import (
    Exercise,
    Verdict,
    answer_source,
    compile_answer,
    failure,
    register,
    run_answer,
)
from parallel_lab.exercises.policy import Policy
from parallel_lab.i18n import _, _l

RECORD_PREFIX = "capstone record: "
VERSION = 1
EXACT = 1e-9  # fp64: the run against one process, and the record's losses against the grader's run
SAME = 1e-9  # relative: a prediction recomputed from the same plan and constants
ANALYSIS = "capstone-analysis"  # the check id of the written analysis (scored by the instructor)
POLICY = Policy("my_plan", imports=("math",), dist=())
LABEL = _l("Your capstone")

# The fields a plan may set, with their type and bounds (a plan the grader can afford: at most 8
# ranks on CPU, a few seconds of training).
INTS = {"dp": (1, 8), "pp": (1, 8), "tp": (1, 8), "virtual": (1, 4), "microbatches": (1, 32), "zero": (0, 1),
        "steps": (3, 8), "batch": (1, 64), "layers": (1, 16), "hidden": (4, 256), "heads": (1, 16),
        "vocab": (8, 512), "seq": (2, 64)}
BOOLS = ("recompute", "sequence_parallel")
STRINGS = {"schedule": ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"), "optimizer": ("sgd", "adam")}
FIELDS = (*INTS, *BOOLS, *STRINGS)
PARTS = {"weights": _l("weights"), "gradients": _l("gradients"), "optimizer": _l("optimizer"),
         "activations": _l("activations")}


class PlanError(ValueError):
    """A plan that is not a plan of this lesson: the message names the field and its value."""


def plan_config(plan):
    """``train3d.Config`` of a plan (a dict of ``FIELDS``; the rest keeps Config's defaults, in fp64),
    checked by ``parallel3d.config.check``. PlanError or the check's ValueError names what is wrong."""
    from parallel_lab.parallel3d import train3d

    if not isinstance(plan, dict):
        raise PlanError(f"my_plan() must return a dict of plan fields, got {type(plan).__name__}")
    unknown = sorted(set(plan) - set(FIELDS), key=str)
    if unknown:
        raise PlanError(f"unknown plan field(s) {unknown}; a plan sets some of {list(FIELDS)}")
    for key, value in plan.items():
        if key in INTS:
            low, high = INTS[key]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise PlanError(f"{key} must be an integer from {low} to {high}, got {value!r}")
        elif key in BOOLS and not isinstance(value, bool):
            raise PlanError(f"{key} must be True or False, got {value!r}")
        elif key in STRINGS and value not in STRINGS[key]:
            raise PlanError(f"{key} must be one of {list(STRINGS[key])}, got {value!r}")
    cfg = train3d.Config(**plan, dtype="float64")
    if cfg.world_size > 8:
        raise PlanError(f"dp {cfg.dp} x pp {cfg.pp} x tp {cfg.tp} = {cfg.world_size} ranks; at most 8 here")
    train3d.check(cfg)
    return cfg


def plan_fields(cfg) -> dict:
    """The fields of ``FIELDS`` of a Config: what a record names its plan by."""
    return {key: getattr(cfg, key) for key in FIELDS}


# ----------------------------------------------------------------------------------------------
# The model's prediction (lessons 15 and 16), from the plan and measured constants.


def _constants(calibration: dict) -> dict:
    """What ``validate_plans.cluster_from`` reads of a calibration (no per-group tables)."""
    keep = ("tflops", "latency_us", "intra_gbps")
    out = {k: float(calibration[k]) for k in keep}
    if calibration.get("near"):
        out["near"] = {k: float(calibration["near"][k]) for k in keep}
    return out


def model_prediction(cfg, constants: dict, workload_tflops: float, cores: float) -> dict:
    """The course's model for ``cfg`` given its constants: memory by ``config.predicted_memory``
    (bytes of the busiest device) and the step by ``validate_plans.predict`` (seconds and parts).
    Pure arithmetic: the grader recomputes it from the record."""
    from parallel_lab.parallel3d import config, validate_plans

    need = config.predicted_memory(cfg)
    memory = {k: float(need[k]) for k in ("weights", "gradients", "optimizer", "activations", "total")}
    memory["stage"], memory["in_flight"] = int(need["stage"]), int(need["in_flight"])
    cluster = validate_plans.cluster_from(constants, cfg.world_size, value_bytes=8, tflops=workload_tflops)
    near = validate_plans.cluster_from(constants, cfg.world_size, value_bytes=8, tflops=workload_tflops, near=True)
    step = validate_plans.predict(cfg, cluster, cores, near)
    keys = ("step_s", "compute_s", "tp_comm_s", "bubble_s", "pp_comm_s", "dp_comm_s", "planner_s", "shared_s")
    return {"memory": memory, "time": {k: float(step[k]) for k in keys}}


def predict(cfg, calibration: dict | None = None) -> dict:
    """Measure the model's constants on this machine (``validate_plans.calibrate`` on the plan's
    ranks, ``workload_tflops``, the cores the ranks really get) and predict ``cfg``: the constants
    and ``model_prediction``'s memory and time, ready for the record."""
    from parallel_lab.parallel3d import validate_plans
    from parallel_lab.runtime import launcher

    if cfg.world_size > 1:
        calibration = calibration or validate_plans.calibrate(cfg.world_size)
    else:  # one rank: nothing to send
        calibration = calibration or {"tflops": 1.0, "latency_us": 0.0, "intra_gbps": 1.0}
    constants = _constants(calibration)
    cores = float(min(launcher.cores(), calibration.get("effective_cores") or launcher.cores()))
    tflops = float(validate_plans.workload_tflops(cfg))
    return {"constants": constants, "workload_tflops": tflops, "cores": cores,
            **model_prediction(cfg, constants, tflops, cores)}


def format_prediction(cfg, prediction: dict) -> str:
    """The prediction as the lesson prints it."""
    mem, t = prediction["memory"], prediction["time"]
    parts = ", ".join(_("{part} {kb:,.1f} kB").format(part=str(PARTS[k]), kb=mem[k] / 1e3) for k in PARTS)
    return "\n".join([
        _("memory of the busiest device (pipeline stage {stage}): {total:,.1f} kB = {parts}; {n} micro-batch(es) "
          "in flight").format(stage=mem["stage"], total=mem["total"] / 1e3, parts=parts, n=mem["in_flight"]),
        _("step: {step:.1f} ms = compute {compute:.1f} + bubble {bubble:.1f} + TP {tp:.1f} + PP {pp:.1f} + DP {dp:.1f} "
          "ms per device (one core per rank: {planner:.1f} ms; {ranks} ranks sharing {cores:.1f} cores: {shared:.1f} "
          "ms)").format(step=t["step_s"] * 1e3, compute=t["compute_s"] * 1e3, bubble=t["bubble_s"] * 1e3,
                        tp=t["tp_comm_s"] * 1e3, pp=t["pp_comm_s"] * 1e3, dp=t["dp_comm_s"] * 1e3,
                        planner=t["planner_s"] * 1e3, ranks=cfg.world_size, cores=prediction["cores"],
                        shared=t["shared_s"] * 1e3),
        _("constants measured here: this model at {gflops:.2f} GFLOP/s per rank, all-reduce α {alpha:.0f} µs, "
          "{gbps:.2f} GB/s").format(gflops=prediction["workload_tflops"] * 1e3,
                                    alpha=prediction["constants"]["latency_us"],
                                    gbps=prediction["constants"]["intra_gbps"])])


# ----------------------------------------------------------------------------------------------
# The run and its record.


def digest(record: dict) -> str:
    """sha256 of the record without its digest, as canonical JSON: a checksum, not a secret."""
    body = {k: v for k, v in record.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def measure(cfg, prediction: dict, timeout: float = 90.0) -> dict:
    """Train ``cfg`` on real ranks (``train3d.train``, timed, against one process) and return the
    run's numbers with ``record``, the line the grader reads (``RECORD_PREFIX`` + JSON)."""
    from parallel_lab.parallel3d import train3d

    result = train3d.train(cfg, timed=True, progress=None, timeout=timeout)
    steps_s = [float(s) for s in result["step_s"]]
    measured = {"steps_s": steps_s, "step_s": statistics.median(steps_s[1:]), "losses": result["losses"],
                "max_loss_diff": result["max_loss_diff"], "max_weight_diff": result["max_weight_diff"],
                "optimizer_bytes_per_rank": result["optimizer_bytes_per_rank"]}
    record = {"version": VERSION, "plan": plan_fields(cfg), "prediction": prediction, "measurement": measured,
              "nonce": secrets.token_hex(8)}
    record["digest"] = digest(record)
    return {**measured, "equal": result["losses_equal"] and result["weights_equal"], "record": record,
            "line": RECORD_PREFIX + json.dumps(record, sort_keys=True, separators=(",", ":"))}


def format_measurement(cfg, measurement: dict) -> str:
    """The run as the lesson prints it: equality with one process, the step times, the record."""
    same = _("equal to one process (losses {loss:.1e}, weights {weight:.1e} apart)") if measurement["equal"] else \
        _("NOT equal to one process (losses {loss:.1e}, weights {weight:.1e} apart)")
    return "\n".join([
        _("{plan}, {steps} steps in fp64 on {n} real ranks: ").format(plan=cfg.describe(), steps=cfg.steps,
                                                                      n=cfg.world_size)
        + same.format(loss=measurement["max_loss_diff"], weight=measurement["max_weight_diff"]),
        _("measured step (median without the first): {ms:.1f} ms; each step {steps} ms").format(
            ms=measurement["step_s"] * 1e3, steps=[round(s * 1e3, 1) for s in measurement["steps_s"]]),
        measurement["line"]])


def gap(prediction: dict, measurement: dict) -> dict:
    """Predicted against measured: the step's relative error, and the optimizer state each rank holds
    against the model's optimizer bytes of the busiest device."""
    predicted, measured = prediction["time"]["step_s"], measurement["step_s"]
    held = max(b for b in measurement["optimizer_bytes_per_rank"] if b is not None)
    return {"predicted_s": predicted, "measured_s": measured, "ratio": measured / predicted,
            "error": (predicted - measured) / measured, "optimizer_bytes": held,
            "optimizer_predicted": prediction["memory"]["optimizer"]}


def format_gap(prediction: dict, measurement: dict) -> str:
    g = gap(prediction, measurement)
    return "\n".join([
        _("predicted {p:.1f} ms, measured {m:.1f} ms: the model is off by {e:+.0%} (measured / predicted = "
          "{r:.2f})").format(p=g["predicted_s"] * 1e3, m=g["measured_s"] * 1e3, e=g["error"], r=g["ratio"]),
        _("optimizer state: the busiest rank holds {held:,} bytes, the model says {pred:,.0f}").format(
            held=g["optimizer_bytes"], pred=g["optimizer_predicted"])])


# ----------------------------------------------------------------------------------------------
# The check.


def harness(source: str, name: str) -> dict:
    """On a rank: the answer's plan, as plain data (``{"error": ...}`` when it raised or is not plain)."""
    fn = compile_answer(source, name)
    try:
        plan = fn()
    except Exception as err:  # the answer's own error
        return {"error": f"{type(err).__name__}: {err}"}
    try:
        return {"plan": json.loads(json.dumps(plan))}
    except (TypeError, ValueError) as err:
        return {"error": f"my_plan() returned something that is not plain data ({err})"}


def read_record(text: str) -> dict | str:
    """The last record line in ``text`` (a cell's output), or why there is none that can be read."""
    lines = [line for line in (text or "").splitlines() if line.startswith(RECORD_PREFIX)]
    if not lines:
        return _("no measurement: run the plan (section 3) and keep its output, which holds the line "
                 "'{prefix}...'").format(prefix=RECORD_PREFIX.strip())
    try:
        record = json.loads(lines[-1][len(RECORD_PREFIX):])
    except ValueError:
        return _("the record line is not the one the run printed (it does not parse): run section 3 again")
    if not isinstance(record, dict) or record.get("version") != VERSION:
        return _("the record is not a version-{v} capstone record: run section 3 again").format(v=VERSION)
    return record


def _close(a, b, rel=SAME) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=rel,
                                                                                         abs_tol=1e-15)


def judge_prediction(cfg, record: dict) -> tuple[bool, str]:
    """Case 2: the record's prediction is the model's for this plan and the record's constants."""
    got = record["prediction"]
    try:
        again = model_prediction(cfg, got["constants"], got["workload_tflops"], got["cores"])
    except (KeyError, TypeError, ValueError, ArithmeticError) as err:
        return False, _("the record's prediction cannot be recomputed ({error}): run sections 2 and 3 "
                        "again").format(error=err)
    for part in ("memory", "time"):
        for key, value in again[part].items():
            if not _close(value, got.get(part, {}).get(key)):
                return False, _("the prediction is not the course's model for this plan: its {part} '{key}' is "
                                "{got}, the model gives {want} with the record's constants").format(
                    part=part, key=key, got=got.get(part, {}).get(key), want=value)
    return True, _("the prediction is the course's model for this plan ({mb:,.1f} kB, {ms:.1f} ms with the "
                   "constants measured)").format(mb=again["memory"]["total"] / 1e3,
                                                 ms=again["time"]["step_s"] * 1e3)


def judge_measurement(cfg, record: dict, losses: list) -> tuple[bool, str]:
    """Case 3: the record is unedited, of this plan, and of a real run of it."""
    m = record.get("measurement", {})
    steps = m.get("steps_s")
    if not isinstance(steps, list) or len(steps) != cfg.steps or not all(_positive(s) for s in steps):
        return False, _("the measurement has no wall time for each of the plan's {n} steps").format(n=cfg.steps)
    if not _close(m.get("step_s"), statistics.median(steps[1:])):
        return False, _("the measured step {got} is not the median of the record's steps without the first "
                        "({want})").format(got=m.get("step_s"), want=statistics.median(steps[1:]))
    theirs = m.get("losses")
    if not isinstance(theirs, list) or len(theirs) != len(losses) or \
            not all(isinstance(a, (int, float)) and abs(a - b) <= EXACT for a, b in zip(theirs, losses)):
        return False, _("the measurement is not of a run of this plan: its losses {theirs} are not the losses "
                        "this plan trains to ({losses})").format(
            theirs=theirs if not isinstance(theirs, list) else [round(x, 6) for x in theirs
                                                                if isinstance(x, (int, float))],
            losses=[round(x, 6) for x in losses])
    return True, _("the measurement is a run of this plan ({ms:.1f} ms a step, losses as trained here)").format(
        ms=m["step_s"] * 1e3)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def judge(source: str) -> tuple[bool, list, tuple[int, int]]:
    """The capstone's verdict on a hand-in (``hand_in``'s JSON: the plan cell and the record's text):
    ``(passed, lines, (cases passed, 3))``, the cases of the module doc."""
    from parallel_lab.parallel3d import train3d
    from parallel_lab.runtime import launcher

    hand = _hand(source)
    label = str(LABEL)
    answers = run_answer(harness, hand["plan"], POLICY.name, 1, label)
    if isinstance(answers, str):
        return False, [answers], (0, 3)
    answer = answers[0]
    if "error" in answer:
        line = failure(_("{label}: FAILED: my_plan() {error}").format(label=label, error=answer["error"]))
        return False, [line], (0, 3)
    try:
        cfg = plan_config(answer["plan"])
    except ValueError as err:  # PlanError, the check's ValueError and ScheduleError
        return False, [failure(_("{label}: FAILED: the plan is refused: {reason}").format(
            label=label, reason=str(err).splitlines()[0]))], (0, 3)
    lines, good = [_("{label}: your plan: {plan}").format(label=label, plan=cfg.describe())], 0
    try:
        run = train3d.train(cfg, progress=None)
    except (launcher.RankError, launcher.RanksHung, launcher.RankDied) as err:
        return False, lines + [failure(_("  FAILED: the plan did not run on {n} real ranks: {reason}").format(
            n=cfg.world_size, reason=str(err).splitlines()[0]))], (0, 3)
    if run["losses_equal"] and run["weights_equal"]:
        good += 1
        lines.append(_("  PASSED: it runs on {n} real ranks and equals one process in fp64 (losses {loss:.1e}, "
                       "weights {weight:.1e} apart)").format(n=cfg.world_size, loss=run["max_loss_diff"],
                                                             weight=run["max_weight_diff"]))
    else:
        lines.append(failure(_("  FAILED: on {n} real ranks it does not equal one process (losses {loss:.1e}, weights "
                       "{weight:.1e} apart)").format(n=cfg.world_size, loss=run["max_loss_diff"],
                                                    weight=run["max_weight_diff"])))
    record = read_record(hand.get("record", ""))
    if isinstance(record, str):
        return False, lines + [failure(_("  FAILED: {what}").format(what=record))], (good, 3)
    if record.get("digest") != digest(record):
        return False, lines + [failure(_("  FAILED: the record was edited after the run (its digest does not match "
                                         "its contents): run section 3 again and keep its output as it is"))], (good, 3)
    if record.get("plan") != plan_fields(cfg):
        theirs = record.get("plan") if isinstance(record.get("plan"), dict) else {}
        differ = sorted(k for k in FIELDS if theirs.get(k) != getattr(cfg, k))
        return False, lines + [failure(_("  FAILED: the record is of another plan ({fields} differ from my_plan's): "
                                         "predict and run the plan you hand in").format(
            fields=", ".join(differ)))], (good, 3)
    for judged in (judge_prediction(cfg, record), judge_measurement(cfg, record, run["losses"])):
        good += judged[0]
        lines.append(_("  PASSED: {what}").format(what=judged[1]) if judged[0] else
                     failure(_("  FAILED: {what}").format(what=judged[1])))
    return good == 3, lines, (good, 3)


class Capstone(Exercise):
    """The capstone's exercise: its answer is a hand-in (the plan cell's source and the record's
    text, as JSON), screened on the plan cell; the grader builds it with ``gather``."""

    @staticmethod
    def gather(nb, plan_source: str) -> str:
        """The grader's hand-in from a submitted notebook: the answer cell and its outputs' record."""
        return hand_in(plan_source, outputs_text(nb))

    def screen(self, source: str) -> Verdict | None:
        return super().screen(_hand(source)["plan"])

    def check(self, source: str) -> Verdict:
        screened = self.screen(source)
        if screened is not None:
            return screened
        passed, lines, cases = self.judge(source)
        return Verdict(passed, lines, cases=tuple(cases))


EXERCISE = register(Capstone("capstone", LABEL, POLICY, judge, forbids="the library: write the plan as plain data"))


def _hand(source: str) -> dict:
    """A hand-in's parts; a plain answer cell is a hand-in without a record."""
    try:
        hand = json.loads(source)
    except ValueError:
        hand = None
    if not isinstance(hand, dict) or not isinstance(hand.get("plan"), str):
        return {"plan": source, "record": ""}
    return {"plan": hand["plan"], "record": str(hand.get("record") or "")}


def hand_in(plan_source: str, record_text: str) -> str:
    """The answer the check judges: the plan cell's source and the text holding the record."""
    return json.dumps({"plan": plan_source, "record": record_text or ""})


def outputs_text(nb) -> str:
    """The text of every code cell's outputs in a notebook (where a submission's record is)."""
    parts = []
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        for out in cell.get("outputs", []):
            text = out.get("text") if out.get("output_type") == "stream" else out.get("data", {}).get("text/plain")
            parts.append(text if isinstance(text, str) else "".join(text or []))
    return "\n".join(parts)


def check_capstone(fn, measurement: dict | None) -> Verdict:
    """Lesson 18's check: the plan ``fn`` (``my_plan``), the prediction and the measurement that
    ``measure`` recorded, judged as the grader judges them. Prints and returns the verdict."""
    if getattr(fn, "__name__", None) != POLICY.name:
        raise TypeError(f"{LABEL}: pass the function you wrote, my_plan; got {fn!r}")
    line = (measurement or {}).get("line", "")
    verdict = EXERCISE.check(hand_in(answer_source(fn), line))
    print(verdict)
    return verdict


def plan_from(fn):
    """The notebook's ``plan_config(fn())``, or None with the reason printed (a stub, a refused plan)."""
    from parallel_lab.pipeline.schedules import ScheduleError

    try:
        cfg = plan_config(fn())
    except NotImplementedError:
        print(_("my_plan is not written yet: write it above, run its cell, then this one"))
        return None
    except (ValueError, ScheduleError) as err:
        print(_("plan refused: {reason}").format(reason=err))
        return None
    print(_("plan accepted: {plan}").format(plan=cfg.describe()))
    return cfg

