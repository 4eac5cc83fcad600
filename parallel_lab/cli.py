"""The ``parallel-lab`` command: one entry for every technique and every course task.

Contracts (ARCHITECTURE.md, "The command line"): every sub-command that reports numbers takes
``--json`` and then prints exactly one JSON object on stdout; progress goes to stderr; exit 0 on
success, non-zero with a one-line reason on stderr otherwise (2 for bad input, before any process
starts).

Each handler imports what it needs when it runs; only the schedules' names, which the parser needs,
come at the top, from the torch-free ``pipeline.schedules``. The modules behind ``schedule`` import
in a fraction of a second, those behind ``run``, ``plan``, ``grade`` or ``bench`` in seconds (torch);
importing all of them up front would make every command, ``--help`` included, pay that.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from parallel_lab.i18n import LANGUAGES, _, language
from parallel_lab.pipeline.schedules import SCHEDULES  # numpy- and torch-free: ~0.05 s

# Each handler returns (report for --json, text for people, reason to fail or ""); a report of None
# means the handler printed its own output (rank 0 under torchrun).


def _doctor(args):
    from parallel_lab import i18n
    from parallel_lab.doctor import doctor

    if args.lang:
        i18n.set_language(args.lang)
    report = doctor()
    lines = [f"{'ok ' if c['ok'] else 'NO '} {name:13} {c['why']}" for name, c in report["checks"].items()]
    failed = [name for name, c in report["checks"].items() if not c["ok"]]
    why = _("doctor: failed checks: {names}").format(names=", ".join(failed)) if failed else ""
    return report, "\n".join(lines), why


def _bench(args):
    from parallel_lab.bench.suites import format_table, run_suites

    rows = run_suites(args.suites)
    return {"rows": rows}, format_table(rows), ""


def _bench_arguments(parser):
    parser.add_argument("suites", nargs="*", metavar="SUITE",
                        help="launcher, collectives, simulator, search, tensor, pipeline, grading, zero, context "
                             "(default: all), search-gap (only when named: minutes of CP-SAT)")


SCHEDULE_NAMES = tuple(SCHEDULES)  # the parser needs them before any handler runs
PLAN_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v")  # planner.SCHEDULES, unimported


def _ranks_argument(parser) -> None:
    # --stages is the documented contract (ARCHITECTURE.md's command-line table); it always meant
    # pipeline ranks P, so --ranks says so and both fill the same value.
    parser.add_argument("--ranks", "--stages", dest="ranks", type=int, required=True, metavar="P",
                        help="pipeline ranks P (--stages is the same option)")


def _schedule(args):
    from parallel_lab.pipeline.schedules import build
    from parallel_lab.pipeline.simulate import Costs, parse_costs, summary

    if args.name in SCHEDULE_ACTIONS:
        return SCHEDULE_ACTIONS[args.name](args)
    _required(args, f"schedule {args.name}", "ranks", "microbatches")
    costs = parse_costs(args.costs) if args.costs else Costs()
    report = summary(build(args.name, args.ranks, args.microbatches, args.virtual), costs)
    return report, _schedule_text(report), ""


def _required(args, what: str, *names: str) -> None:
    missing = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) is None]
    if missing:
        raise ValueError(f"{what} needs {' and '.join(missing)}")


def _schedule_text(report: dict) -> str:
    from parallel_lab.pipeline.actions import format_grid

    peak = ", ".join(str(n) for n in report["peak_activations"])
    return (f"{format_grid(report['ranks'])}\n\n{report['schedule']}: {report['stages']} ranks, "
            f"{report['model_stages']} model stages, {report['microbatches']} micro-batches\n"
            f"makespan {report['makespan']:g}, bubble {report['bubble_fraction']:.1%}, "
            f"peak activations per stage [{peak}]")


def _search(args):
    """``schedule search`` and ``run pipeline --schedule search``: what the options find."""
    from parallel_lab.pipeline.search.api import search
    from parallel_lab.pipeline.simulate import Costs

    _required(args, "a search", "ranks", "microbatches", "max_activations")
    costs = None
    if args.costs:
        try:
            f, i, w = (float(x) for x in args.costs.split(","))
        except ValueError:
            raise ValueError(f"--costs for a search is 'F,I,W' (three numbers), got {args.costs!r}") from None
        costs = Costs(F=f, B=i + w, I=i, W=w)
    return search(args.ranks, args.microbatches, args.max_activations, args.placement, costs,
                  exact=args.exact, time_limit=args.time_limit)


def _schedule_search(args):
    from parallel_lab.pipeline.search.problem import costs_for_simulation
    from parallel_lab.pipeline.simulate import summary

    found = _search(args)
    report = summary(found.schedule, costs_for_simulation(found.problem)) | found.report()
    if args.save:
        Path(args.save).write_text(json.dumps(found.schedule.to_dict()))
    cap = ", ".join(f"{x:g}" for x in found.problem.max_activations)
    peaks = ", ".join(f"{x:g}" for x in found.peak_rank_activations)
    text = (f"{_schedule_text(report)}\nfound by {found.origin} in {found.seconds:.1f} s; lower bound "
            f"{found.lower_bound:g}{f' (CP-SAT: {found.exact})' if found.exact else ''}; per rank, peak "
            f"activations [{peaks}] of max [{cap}] (micro-batches of a rank's layers, counted until W)"
            + (f"\nsaved to {args.save}" if args.save else ""))
    return report, text, ""


def _load_schedule(args):
    """The schedule ``export`` writes: a name (with --ranks, --microbatches), a JSON file as
    ``schedule search --save`` writes it, or a PyTorch CSV."""
    from parallel_lab.pipeline import pytorch_csv
    from parallel_lab.pipeline.schedules import Schedule, build
    from parallel_lab.pipeline.validate import validate

    if args.target in SCHEDULE_NAMES:
        _required(args, f"schedule export {args.target}", "ranks", "microbatches")
        return build(args.target, args.ranks, args.microbatches, args.virtual)
    path = Path(args.target or "")
    if not path.is_file():
        raise ValueError(f"schedule {args.name} needs a schedule name ({', '.join(SCHEDULE_NAMES)}) or a file, "
                         f"got {args.target!r}")
    if path.suffix == ".json":
        try:
            return validate(Schedule.from_dict(json.loads(path.read_text())))
        except (KeyError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: not a schedule as 'schedule search --save' writes it ({err})") from None
    return pytorch_csv.load(path, microbatches=args.microbatches)


def _schedule_export(args):
    from parallel_lab.pipeline import pytorch_csv

    schedule = _load_schedule(args)
    text = pytorch_csv.to_csv(schedule, args.comms)
    if args.out:
        Path(args.out).write_text(text)
    report = {"schedule": schedule.name, "format": args.format, "comms": args.comms, "ranks": schedule.n_ranks,
              "microbatches": schedule.n_microbatches, "rows": pytorch_csv.to_rows(schedule, args.comms),
              "out": args.out}
    return report, (f"wrote {args.out}" if args.out else text.rstrip("\n")), ""


def _schedule_import(args):
    from parallel_lab.pipeline import pytorch_csv
    from parallel_lab.pipeline.simulate import Costs, parse_costs, summary

    path = Path(args.target or "")
    if not path.is_file():
        raise ValueError(f"schedule import needs a PyTorch schedule CSV file, got {args.target!r}")
    schedule = pytorch_csv.load(path, microbatches=args.microbatches)
    if args.save:
        Path(args.save).write_text(json.dumps(schedule.to_dict()))
    report = summary(schedule, parse_costs(args.costs) if args.costs else Costs())
    report["actions"] = schedule.to_dict()["ranks"]
    return report, _schedule_text(report) + (f"\nsaved to {args.save}" if args.save else ""), ""


SCHEDULE_ACTIONS = {"search": _schedule_search, "export": _schedule_export, "import": _schedule_import}


def _search_arguments(parser) -> None:
    """The options of a search (``schedule search`` and ``run pipeline --schedule search``)."""
    parser.add_argument("--max-activations", type=float, metavar="K",
                        help="search: the most activations a rank may hold, in micro-batches of a rank's "
                             "layers (1F1B holds P on rank 0), counted until W")
    parser.add_argument("--placement", choices=("wave", "v"), default="wave",
                        help="search: one stage per rank (wave) or two in V order (v)")
    parser.add_argument("--time-limit", type=float, metavar="S",
                        help="search: seconds for the exact solver (--exact; default 30) or the local search")
    parser.add_argument("--exact", action="store_true", help="search: refine with OR-Tools' CP-SAT (small cases)")


def _schedule_arguments(parser):
    parser.add_argument("name", choices=(*SCHEDULE_NAMES, *SCHEDULE_ACTIONS), metavar="NAME",
                        help=", ".join(SCHEDULE_NAMES) + "; or search, export NAME|FILE, import FILE")
    parser.add_argument("target", nargs="?", metavar="NAME|FILE",
                        help="export: a schedule name or file (JSON from search --save, or a CSV); import: a CSV")
    parser.add_argument("--ranks", "--stages", dest="ranks", type=int, metavar="P",
                        help="pipeline ranks P (--stages is the same option)")
    parser.add_argument("--microbatches", type=int, help="micro-batches M")
    parser.add_argument("--virtual", type=int, default=1, help="stages per rank (interleaved; zb-v, dualpipe-v: 2)")
    parser.add_argument("--costs", help="F,B,W durations, e.g. 1,2,1 (W splits off B); for search F,I,W")
    _search_arguments(parser)
    parser.add_argument("--save", metavar="FILE", help="search, import: write the schedule as JSON")
    parser.add_argument("--format", choices=("pytorch-csv",), default="pytorch-csv", help="export: the format")
    parser.add_argument("--comms", action="store_true",
                        help="export: PyTorch's compute_comms form (sends, receives, REDUCE_GRAD)")
    parser.add_argument("--out", metavar="FILE", help="export: write the CSV there (default: stdout)")


def _run_tensor(args):
    from parallel_lab.tensor.run import run_tensor

    report = run_tensor(args.tp, args.model, args.sequence_parallel)
    counts = ", ".join(f"{op} x{c['count']}" for op, c in report["collectives"].items())
    text = (f"tensor parallel {args.model}, tp {args.tp}"
            f"{' + sequence parallel' if args.sequence_parallel else ''}: max output diff "
            f"{report['max_output_diff']:.1e}, max grad diff {report['max_grad_diff']:.1e} (fp64, "
            f"against the single-process model)\ncollectives on rank 0: {counts}")
    keys = ("tp", "model", "sequence_parallel", "max_output_diff", "max_grad_diff", "collectives", "loss_diff")
    return {k: report[k] for k in keys if k in report}, text, ""


def _run_pipeline(args):
    from parallel_lab.pipeline.run import run_pipeline

    schedule = _search(args).schedule if args.schedule == "search" else args.schedule
    report = run_pipeline(schedule, args.ranks, args.microbatches, args.model, args.virtual,
                          args.recompute, args.trace)
    text = (f"{args.schedule} on {args.ranks} ranks, {args.microbatches} micro-batches: max grad diff "
            f"{report['max_grad_diff']:.1e}, loss diff {report['loss_diff']:.1e} (fp64, against the "
            f"single-process model)\nbubble measured (virtual clock) {report['bubble_measured']:.1%}, "
            f"predicted {report['bubble_predicted']:.1%}; peak activations {report['peak_activations']}"
            + (f"\ntrace written to {args.trace}" if args.trace else ""))
    keys = ("schedule", "stages", "microbatches", "max_grad_diff", "loss_diff", "bubble_measured",
            "bubble_predicted", "bubble_wall", "peak_activations", "peak_activations_predicted")
    return {k: report[k] for k in keys if k in report}, text, ""


# ``run 3d``: every field of ``parallel3d.train3d.Config`` is an option; None keeps its default.
_3D_INTS = ("dp", "pp", "tp", "microbatches", "virtual", "steps", "batch", "layers", "hidden", "heads",
            "vocab", "seq", "seed", "nodes", "zero")


def _run_3d(args):
    from parallel_lab.parallel3d import train3d
    from parallel_lab.runtime import torchrun

    given = {k: getattr(args, k) for k in (*_3D_INTS, "schedule", "optimizer", "lr", "dtype")}
    cfg = train3d.Config(**{k: v for k, v in given.items() if v is not None},
                         recompute=args.recompute, sequence_parallel=args.sequence_parallel)
    if torchrun.under_torchrun():  # one process per rank: rank 0 prints the JSON object itself
        train3d.train_under_torchrun(cfg, args.memory_limit_gb)
        return None, None, ""
    say = (lambda line: print(line, file=sys.stderr, flush=True))
    result = train3d.train(cfg, progress=say, memory_limit_gb=args.memory_limit_gb)
    c = result["config"]
    text = (f"dp {c['dp']} x pp {c['pp']} x tp {c['tp']} ({result['world_size']} ranks, {c['schedule']}): "
            f"losses equal one process: {result['losses_equal']} (max diff {result['max_loss_diff']:.1e}), "
            f"final weights equal: {result['weights_equal']} (max diff {result['max_weight_diff']:.1e})")
    return result, text, ""


def _collectives_text(collectives: dict) -> str:
    """``{op: {"count", "bytes"}}`` as one line: ``all_reduce x4 (1024 B), ...``."""
    return ", ".join(f"{op} x{c['count']} ({c['bytes']} B)" for op, c in collectives.items())


def _run_moe(args):
    from parallel_lab.moe.run import run_moe

    report = run_moe(args.ep, args.experts, args.top_k, args.capacity_factor)
    counts = _collectives_text(report["collectives"])
    text = (f"expert parallel MoE, {report['experts']} experts on ep {args.ep}, top-{report['top_k']}, "
            f"capacity {report['capacity']} per expert: max output diff {report['max_output_diff']:.1e}, max "
            f"grad diff {report['max_grad_diff']:.1e}, loss diff {report['loss_diff']:.1e} (fp64, against "
            f"the single-process layer)\ntokens per expert {report['tokens_per_expert']}, dropped "
            f"{report['dropped']} of {report['tokens'] * report['top_k']} assignments "
            f"({report['dropped_tokens']} tokens entirely)\ncollectives on rank 0: {counts}")
    keys = ("ep", "experts", "top_k", "capacity_factor", "capacity", "tokens", "max_output_diff",
            "max_grad_diff", "loss_diff", "routing_equal", "tokens_per_expert", "routed_per_expert",
            "dropped", "dropped_tokens", "collectives", "all_to_all_bytes")
    return {k: report[k] for k in keys}, text, ""


def _run_zero(args):
    from parallel_lab.zero.run import run_zero

    report = run_zero(args.stage, args.dp, args.model, args.steps, args.batch, overlap=args.overlap)
    mem = report["memory_per_rank"]
    rows = ", ".join(f"{k} {v['measured'] / 1e3:.1f}/{v['predicted'] / 1e3:.1f} kB" for k, v in mem.items())
    counts = _collectives_text(report["collectives"])
    t = report["traffic_per_step"]
    text = (f"ZeRO stage {args.stage} on dp {args.dp}, {report['steps']} Adam steps of the GPT "
            f"({report['params']} parameters): max param diff {report['max_param_diff']:.1e}, loss diff "
            f"{report['loss_diff']:.1e} (fp64, against one process)\nmodel state per rank, measured/predicted: "
            f"{rows}\ntraffic per step {t['measured'] / 1e3:.1f} kB (predicted {t['predicted'] / 1e3:.1f} kB); "
            f"collectives of one step on rank 0: {counts}\nvirtual clock ({report['link']['name']}): step "
            f"{report['virtual']['step_s'] * 1e3:.2f} ms{' with overlap' if args.overlap else ''}, "
            f"{report['virtual']['serial_step_s'] * 1e3:.2f} ms with every collective waited for at once")
    return report, text, ""


def _run_context(args):
    from parallel_lab.context.run import run_context

    report = run_context(args.cp, args.variant, args.causal, args.seq, args.heads, args.batch)
    scores, sent = report["score_bytes_per_rank"], report["bytes_sent_per_rank"]
    counts = _collectives_text(report["collectives"])
    text = (f"context parallel attention, {args.variant} on cp {args.cp} ({'causal' if args.causal else 'not causal'}, "
            f"seq {report['config']['seq']}, {report['config']['heads']} heads): max output diff "
            f"{report['max_output_diff']:.1e}, max grad diff {report['max_grad_diff']:.1e} (fp64, against the dense "
            f"attention on one process)\nlargest score tensor per rank: {scores['measured']} B measured, "
            f"{scores['predicted']} B predicted (one process: {scores['one_process']} B)\nbytes sent per rank "
            f"{sent['measured']} (predicted {sent['predicted']}); collectives on rank 0 (forward + backward): {counts}")
    return report, text, ""


def _run(args):
    return {"tensor": _run_tensor, "pipeline": _run_pipeline, "3d": _run_3d, "moe": _run_moe,
            "zero": _run_zero, "context": _run_context}[args.what](args)


def _run_arguments(parser):
    sub = parser.add_subparsers(dest="what", required=True)
    tensor = sub.add_parser("tensor", help="Megatron tensor parallelism on real ranks vs the dense model")
    tensor.add_argument("--tp", type=int, required=True, help="tensor-parallel ranks")
    tensor.add_argument("--model", choices=("mlp", "block", "gpt"), default="mlp")
    tensor.add_argument("--sequence-parallel", action="store_true")
    pipe = sub.add_parser("pipeline", help="a pipeline schedule on real ranks vs the single-process model")
    pipe.add_argument("--schedule", required=True, choices=(*SCHEDULE_NAMES, "search"), metavar="NAME",
                      help=", ".join(SCHEDULE_NAMES) + ", or search (with --max-activations)")
    _ranks_argument(pipe)
    pipe.add_argument("--microbatches", type=int, required=True)
    pipe.add_argument("--virtual", type=int, default=1)
    pipe.add_argument("--model", choices=("mlp", "gpt"), default="mlp")
    pipe.add_argument("--recompute", action="store_true", help="activation recomputation")
    pipe.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace")
    pipe.add_argument("--costs", help="search: F,I,W per stage (default 1,1,1)")
    _search_arguments(pipe)
    three = sub.add_parser("3d", help="train the course GPT with dp x pp x tp on real ranks vs one process "
                                      "(under torchrun: one process per rank, NCCL on GPUs)")
    for name in _3D_INTS:
        three.add_argument(f"--{name}", type=int, help=f"(default: train3d.Config's {name})")
    three.add_argument("--schedule", choices=SCHEDULE_NAMES[1:], metavar="NAME", help="(default: 1f1b)")
    three.add_argument("--optimizer", choices=("sgd", "adam"), help="(default: adam)")
    three.add_argument("--lr", type=float)
    three.add_argument("--dtype", choices=("float64", "float32"), help="(default: float64)")
    three.add_argument("--recompute", action="store_true", help="activation recomputation")
    three.add_argument("--sequence-parallel", action="store_true")
    three.add_argument("--memory-limit-gb", type=float, help="refuse a plan that needs more per device")
    moe = sub.add_parser("moe", help="expert parallelism (a MoE layer's experts over ranks) vs the dense layer")
    moe.add_argument("--ep", type=int, required=True, help="expert-parallel ranks N")
    moe.add_argument("--experts", type=int, default=8, help="experts E, divisible by N (default: 8)")
    moe.add_argument("--top-k", type=int, default=2, help="experts per token, <= E (default: 2)")
    moe.add_argument("--capacity-factor", type=float, default=1.25,
                     help="capacity = ceil(C * tokens * top_k / E) per expert (default: 1.25)")
    zero = sub.add_parser("zero", help="ZeRO stage 0-3 / FSDP data parallelism on real ranks vs one process")
    zero.add_argument("--stage", type=int, required=True, help="0 plain DP, 1 optimizer state, 2 + gradients, "
                                                            "3 + parameters sharded (FSDP)")
    zero.add_argument("--dp", type=int, required=True, help="data-parallel ranks N (divides the batch)")
    zero.add_argument("--model", default="gpt", help="gpt (the course GPT)")
    zero.add_argument("--steps", type=int, default=3, help="Adam steps (default: 3)")
    zero.add_argument("--batch", type=int, default=8, help="global batch, divisible by dp (default: 8)")
    zero.add_argument("--overlap", action="store_true",
                      help="collectives in flight during the compute (DDP's buckets, ZeRO-3 prefetch)")
    context = sub.add_parser("context", help="context parallelism (ring attention or Ulysses) vs the dense attention")
    context.add_argument("--cp", type=int, required=True, help="context-parallel ranks N (the sequence split N ways)")
    context.add_argument("--variant", choices=("ring", "ulysses"), default="ring",
                         help="ring attention (zig-zag; seq divisible by 2N) or Ulysses (heads divisible by N)")
    context.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                         help="causal mask (default) or --no-causal")
    context.add_argument("--seq", type=int, help="sequence length (default: 32)")
    context.add_argument("--heads", type=int, help="attention heads, dividing hidden 64 (default: 8)")
    context.add_argument("--batch", type=int, default=2, help="batch (default: 2)")
    for command in (tensor, pipe, three, moe, zero, context):
        command.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _plan(args):
    from parallel_lab.planning import planner

    names = ("layers", "hidden", "heads", "vocab", "seq", "batch", "nodes", "gpus_per_node", "gpu_mem_gb",
             "intra_gbps", "inter_gbps", "tflops", "latency_us", "price", "tokens", "top", "zero1")
    given = {name: getattr(args, name) for name in names}
    if args.overlap is not None:  # else the planner's own default, cost.OVERLAP_SHARE
        given["overlap"] = args.overlap
    for name in ("ep", "cp"):  # else the planner's defaults (every ep dividing E; cp 1 unless seq is long)
        if getattr(args, name) is not None:
            given[name] = tuple(getattr(args, name))
    result = planner.plan_from_args(**given, zero=tuple(args.zero), experts=args.experts, top_k=args.top_k,
                                    schedules=tuple(args.schedules), ends=args.ends)
    return result, planner.format_plans(result), ""


def _plan_arguments(parser):
    for name, kind in (("layers", int), ("hidden", int), ("heads", int), ("vocab", int), ("seq", int),
                       ("batch", int), ("nodes", int), ("gpus-per-node", int), ("gpu-mem-gb", float)):
        parser.add_argument(f"--{name}", type=kind, required=True)
    parser.add_argument("--intra-gbps", type=float, default=450.0,
                        help="GB/s per device and direction inside a node (NVLink 4: 450)")
    parser.add_argument("--inter-gbps", type=float, default=50.0,
                        help="GB/s per device and direction between nodes (InfiniBand NDR: 50)")
    parser.add_argument("--tflops", type=float, default=395.6,
                        help="achieved TFLOP/s per device (40%% of an H100's 989 dense BF16)")
    parser.add_argument("--latency-us", type=float, default=5.0, help="link latency α in µs")
    parser.add_argument("--price", type=float, help="$ per GPU-hour: adds the cost of a training run")
    parser.add_argument("--tokens", type=float, default=300e9, help="training tokens for the cost")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--zero", type=int, nargs="+", choices=(0, 1, 2, 3), default=[0, 1, 2, 3],
                        metavar="STAGE", help="ZeRO stages to search over the DP group (default: 0 1 2 3)")
    parser.add_argument("--zero1", action="store_true", help="only ZeRO-1 (the same as --zero 1)")
    parser.add_argument("--overlap", type=float,
                        help="share of a backward that DP/ZeRO communication can hide behind (0: none; "
                             "default: the planner's, planning.cost.OVERLAP_SHARE)")
    parser.add_argument("--schedules", nargs="+", default=list(PLAN_SCHEDULES), metavar="NAME",
                        help=f"schedules to search (default: all, {' '.join(PLAN_SCHEDULES)})")
    parser.add_argument("--ends", action=argparse.BooleanOptionalAction, default=True,
                        help="the embedding on the first rank, the LM head on its own, and lighter end ranks where "
                             "pp does not divide the layers (default); --no-ends spreads their work over every rank")
    parser.add_argument("--experts", type=int, default=0,
                        help="experts E per block (a mixture of experts in every block; 0: dense)")
    parser.add_argument("--top-k", type=int, default=2, help="experts each token is routed to")
    parser.add_argument("--ep", type=int, nargs="+", metavar="N",
                        help="expert-parallel degrees to search, within dp (default: every divisor of E)")
    parser.add_argument("--cp", type=int, nargs="+", metavar="N",
                        help="context-parallel degrees to search (default: 1; powers of two up to a "
                             "node for seq > planning.planner.LONG_SEQ)")


def _grade_arguments(parser) -> None:
    parser.add_argument("submissions", nargs="*", metavar="SUBMISSION",
                        help="student notebooks (or folders of them); the student is the notebook's folder name")
    parser.add_argument("--out", required=True, help="the gradebook CSV to write")
    parser.add_argument("--policy", metavar="YAML",
                        help="the grading policy (default: grading.yaml of the course, else the built-in defaults)")
    parser.add_argument("--roster", metavar="CSV", help="folder,student_id,email[,first_name,last_name,section]")
    parser.add_argument("--overrides", metavar="CSV", help="regrades: student,check,points,reason")
    parser.add_argument("--from", dest="from_gradebook", metavar="GRADES.csv",
                        help="grade nothing: rewrite the summary, exports and feedback from this gradebook "
                             "(with --policy, --roster, --overrides)")
    parser.add_argument("--summary", metavar="CSV",
                        help="per-student summary for an LMS (default: <out>-summary.csv beside --out)")
    parser.add_argument("--reference", action="append", default=[], metavar="LESSON.ipynb",
                        help="reference lesson(s) with tagged check cells (default: lessons/*.ipynb)")
    parser.add_argument("--feedback", metavar="DIR", help="feedback folder (default: feedback/ beside --out)")
    parser.add_argument("--check-timeout", "--cell-timeout", dest="check_timeout", type=float, default=60,
                        metavar="S", help="seconds for one run of an answer on its ranks (60)")
    parser.add_argument("--timeout", type=float, default=600, metavar="S",
                        help="seconds per submission, all its checks (600)")
    parser.add_argument("--student-from", choices=("parent", "stem"), default="parent",
                        help="student name from the folder (default) or the file name")
    parser.add_argument("--jobs", type=int, default=1, help="submissions graded at once (1)")
    parser.add_argument("--no-bwrap", action="store_true",
                        help="grade without bubblewrap even where it works (a subreaper sandbox; not advised)")


def _grade(args):
    from parallel_lab.course.grading import gradebook
    from parallel_lab.course.grading.policy import Policy, default_file
    from parallel_lab.course.grading.roster import Roster, load_overrides
    from parallel_lab.course.grading.sandbox import Sandbox

    out = Path(args.out)
    feedback = Path(args.feedback) if args.feedback else out.parent / "feedback"
    summary = Path(args.summary) if args.summary else out.with_name(f"{out.stem}-summary.csv")
    # The policy, roster and overrides are read first: a mistake in them stops the run before grading.
    policy = Policy.load(args.policy or (default_file() if default_file().exists() else None))
    roster = Roster.load(args.roster) if args.roster else None
    overrides = load_overrides(args.overrides) if args.overrides else []
    if args.from_gradebook:
        if args.submissions:
            raise ValueError("--from re-reads a gradebook: give no submissions with it")
        rows = gradebook.read_gradebook(args.from_gradebook, policy)
        written = gradebook.summarize(rows, out, policy, roster, overrides, summary=summary, feedback_dir=feedback)
        kind = "from " + str(args.from_gradebook)
    else:
        if not args.submissions:
            raise ValueError("give the submissions to grade (notebooks or folders), or --from GRADES.csv")
        sandbox = Sandbox.detect(prefer_bwrap=not args.no_bwrap)
        rows = gradebook.grade(args.submissions, out, args.reference or None, feedback, args.check_timeout,
                               args.timeout, args.student_from, args.jobs, summary=summary, sandbox=sandbox,
                               policy=policy, roster=roster, overrides=overrides)
        written, kind = {}, sandbox.kind
    rows, _unmatched = gradebook.apply_overrides(rows, overrides)
    table = gradebook.standings(rows, policy)
    report = {"gradebook": str(out), "summary": str(summary), "feedback": str(feedback), "sandbox": kind,
              "policy": policy.as_dict(), "students": len(table), "submissions": len({r.submission for r in rows}),
              "files": {k: str(v) for k, v in written.items()},
              "standings": {s: {"points": t.points, "max_points": t.max_points, "score": round(t.score, 4),
                                "passed": t.passed, "lessons_passed": list(t.lessons_passed)}
                            for s, t in table.items()},
              "rows": [{"student": r.student, "lesson": r.lesson, "exercise": r.exercise, "passed": r.passed,
                        "points": r.points, "max_points": r.max_points, "cases": list(r.cases),
                        "category": r.category, "reason": r.reason, "override": r.override,
                        "sandbox": r.sandbox} for r in rows]}
    width = max((len(s) for s in table), default=1)
    lines = [f"{s:{width}}  {t.points:g} of {t.max_points:g} points, score {100 * t.score:.1f} %"
             for s, t in sorted(table.items())]
    lines.append(f"gradebook: {out}; summary: {summary}; Canvas and Moodle: {out.stem}-canvas.csv, "
                 f"{out.stem}-moodle.csv; similarity.csv; feedback: {feedback}/ ({kind})")
    return report, "\n".join(lines), ""


def _release_arguments(parser) -> None:
    parser.add_argument("dir", metavar="DIR", help="where to write the students' repository (a new folder)")
    parser.add_argument("--force", action="store_true", help="replace a previous release in DIR (its RELEASE.json)")


def _release(args):
    from parallel_lab.course.release import write_release

    report = write_release(args.dir, force=args.force).as_dict()
    left = ", ".join(sorted(report["left_out"]))
    text = (f"students' release written to {report['dir']}: {report['files']} files; "
            f"{report['solution_regions_removed']} solution regions removed from {len(report['stripped'])} lesson "
            f"sources; {len(report['sealed_banks'])} quiz banks sealed; left out: {left}; the audit found no answer")
    return report, text, ""


def _certificate_arguments(parser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    keygen = actions.add_parser("keygen", help="make an Ed25519 key pair: DIR/NAME.key (secret) and DIR/NAME.pub")
    keygen.add_argument("dir", metavar="DIR", help="folder for the key files (created if missing)")
    keygen.add_argument("--name", default="instructor", help="file name stem of the two files (instructor)")
    issue = actions.add_parser("issue", help="issue an Open Badges 3.0 credential, signed with your private key")
    issue.add_argument("--name", required=True, help="the learner's name, as it should be shown")
    who = issue.add_mutually_exclusive_group(required=True)
    who.add_argument("--email", help="the learner's email (stored hashed with a random salt, not in the clear)")
    who.add_argument("--subject-id", metavar="URI", help="a URI of the learner's (did:..., https://...)")
    source = issue.add_mutually_exclusive_group(required=True)
    source.add_argument("--lessons", nargs="+", metavar="NN")
    source.add_argument("--gradebook", metavar="CSV", help="lessons (and checks) the student passed in this gradebook")
    issue.add_argument("--student", help="the student's name in the gradebook")
    issue.add_argument("--threshold", type=float,
                       help="a lesson's score needed to pass it (default: the grading policy's, 0.8)")
    issue.add_argument("--policy", metavar="YAML", help="the grading policy (default: the course's grading.yaml)")
    issue.add_argument("--overrides", metavar="CSV",
                       help="regrades the credential honours: student,check,points,reason")
    issue.add_argument("--key-file", metavar="PRIVATE", required=True, help="your private key (NAME.key from keygen)")
    issue.add_argument("--issuer", required=True, help="who issues it, as shown, e.g. 'Prof. Lin, CS 4xx'")
    issue.add_argument("--issuer-url", metavar="URL", help="the issuer's web page")
    issue.add_argument("--did-web", metavar="DOMAIN", help="issue as did:web:DOMAIN (default: your key's did:key)")
    issue.add_argument("--credential-id", metavar="URI", help="the credential's URI (default urn:uuid:<random>)")
    issue.add_argument("--date", "--valid-from", dest="valid_from", metavar="DATE",
                       help="valid from YYYY-MM-DD or an ISO time with zone (default: now)")
    issue.add_argument("--status-list", metavar="URL", help="make it revocable: your status list's URL ...")
    issue.add_argument("--status-index", type=int, metavar="N", help="... and this credential's index in it")
    issue.add_argument("--out", default="credential.json")
    issue.add_argument("--lang", choices=sorted(LANGUAGES), help="the language of the credential's name, description "
                       "and criteria (default: $PARALLEL_LAB_LANG, else en)")
    status = actions.add_parser("status-list", help="write your signed revocation list (Bitstring Status List)")
    status.add_argument("url", metavar="URL", help="where you publish it (the URL credentials name)")
    status.add_argument("--revoked", type=int, nargs="*", default=[], metavar="N",
                        help="indices of revoked credentials")
    status.add_argument("--key-file", metavar="PRIVATE", required=True, help="your private key")
    status.add_argument("--did-web", metavar="DOMAIN", help="as in issue")
    status.add_argument("--out", default="status-list.json")
    verify = actions.add_parser("verify", help="check an Open Badges 3.0 credential offline: exit 0 if valid, 1 if not")
    verify.add_argument("file")
    verify.add_argument("--public-key", metavar="PUB",
                        help="the issuer's public key (NAME.pub, a did:key, or one line of base64)")
    verify.add_argument("--status-list", metavar="FILE", help="the issuer's status list credential: checks revocation")
    for sub in (keygen, issue, status, verify):  # --json may come after the action too
        sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                         help="print one JSON object on stdout")


def _read_json(path, what: str):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {path}: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"the {what} {path} is not UTF-8 JSON ({str(exc).splitlines()[0][:100]})") from None


def _write_json(document: dict, path) -> None:
    Path(path).write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _certificate(args):
    from parallel_lab.course import credentials as cr
    from parallel_lab.course.credentials.gradebook import lessons_from_gradebook

    if args.action == "keygen":
        made = cr.keygen(args.dir, args.name)
        return made, (f"private key: {made['private_key']} (keep it secret; mode 0600)\n"
                      f"public key:  {made['public_key']} (give it out)\n"
                      f"fingerprint: {made['fingerprint']} (publish it, e.g. on the course page)\n"
                      f"issuer:      {made['did']}"), ""
    if args.action == "verify":
        credential = _read_json(args.file, "credential")
        public = cr.load_public_key(args.public_key) if args.public_key else None
        listed = _read_json(args.status_list, "status list") if args.status_list else None
        result = cr.verify(credential, public, listed).as_dict()
        return result, result["reason"], "" if result["valid"] else _("certificate verify: {reason}").format(
            reason=result["reason"])
    key = cr.load_private_key(args.key_file)
    issuer_id = cr.did_web(args.did_web) if args.did_web else None
    if args.action == "status-list":
        listed = cr.status_list_credential(args.url, args.revoked, key, issuer_id=issuer_id)
        _write_json(listed, args.out)
        revoked = sorted(set(args.revoked))
        return ({"file": args.out, "url": args.url, "revoked": revoked, "issuer": listed["issuer"]},
                f"status list {args.url}: {len(revoked)} revoked; saved to {args.out} (publish it at that URL)", "")
    if args.gradebook:
        if not args.student:
            raise ValueError("--gradebook needs --student (the student's name in the gradebook)")
        from parallel_lab.course.grading.policy import default_file

        policy = args.policy or (default_file() if default_file().exists() else None)
        lessons = lessons_from_gradebook(args.gradebook, args.student, args.threshold, policy=policy,
                                         overrides=args.overrides)
        if not lessons:
            raise ValueError(f"{args.student} passed no lesson in {args.gradebook} (threshold "
                             f"{args.threshold or 'of the grading policy'})")
    else:
        lessons = args.lessons
    if (args.status_list is None) != (args.status_index is None):
        raise ValueError("--status-list and --status-index go together (a revocable credential needs both)")
    entry = cr.status_entry(args.status_list, args.status_index) if args.status_list else None
    issued = cr.issue(args.name, args.email or args.subject_id, cr.Achievement(lessons, lang=args.lang or language()),
                      key, args.issuer,
                      credential_id=args.credential_id, valid_from=args.valid_from, status=entry,
                      issuer_id=issuer_id, issuer_url=args.issuer_url)
    _write_json(issued, args.out)
    fp = cr.fingerprint(key.public_key())
    achievement = issued["credentialSubject"]["achievement"]["name"]
    return ({"file": args.out, "id": issued["id"], "issuer": issued["issuer"]["id"], "fingerprint": fp,
             "achievement": achievement, "lessons": sorted(lessons)},
            _("Open Badges 3.0 credential {id}: {achievement}, for {name}, issued by {issuer} (key {key}); saved to "
              "{file}").format(id=issued["id"], achievement=achievement, name=args.name, issuer=args.issuer, key=fp,
                               file=args.out), "")


def _serve_arguments(parser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (8000)")
    parser.add_argument("--db", metavar="URL", help="database: sqlite:///PATH (default: DATA/service.db) or "
                                                    "postgresql://USER:PASSWORD@HOST/DB")
    parser.add_argument("--data", metavar="DIR", help="the service's folder: SQLite database, issuer key, session "
                                                      "secret (default: ~/.parallel_lab/service)")
    parser.add_argument("--worker", action="store_true", help="only grade (no web pages): one of several "
                                                              "processes sharing the database's queue")
    parser.add_argument("--jobs", type=int, default=1, help="grading workers in this process (1; 0: none here)")
    parser.add_argument("--base-url", help="the address learners use (default: http://HOST:PORT)")
    parser.add_argument("--https-only", action="store_true", help="session cookies only over HTTPS (behind TLS)")
    parser.add_argument("--queue-limit", type=int, default=200,
                        help="submissions waiting at most; more are refused (503, nothing stored) (200)")
    parser.add_argument("--upload-limit-kb", type=int, default=2048, help="largest notebook accepted (2048 kB)")
    parser.add_argument("--lease", type=float, default=30, metavar="S",
                        help="seconds a worker's claim on a job lasts without renewal (30)")
    parser.add_argument("--timeout", type=float, default=300, metavar="S", help="seconds per submission (300)")
    parser.add_argument("--lessons", metavar="DIR", help="reference lessons (default: the course's lessons/)")
    parser.add_argument("--issuer", default="parallel-lab course service", help="the issuer's name on credentials")
    parser.add_argument("--create-instructor", metavar="EMAIL",
                        help="make an instructor account (password from PARALLEL_LAB_PASSWORD or asked), then exit")
    parser.add_argument("--name", help="the instructor's name, with --create-instructor")


def _serve_config(args):
    from parallel_lab.course.grading.sandbox import Limits
    from parallel_lab.service.app import Config
    from parallel_lab.service.run import default_data_dir
    from parallel_lab.service.worker import Settings

    for name in ("port", "queue_limit", "upload_limit_kb"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.jobs < 0 or args.lease <= 0 or args.timeout <= 0:
        raise ValueError(f"--jobs must be >= 0 and --lease, --timeout > 0, got {args.jobs}, {args.lease:g}, "
                         f"{args.timeout:g}")
    settings = Settings(lessons_dir=args.lessons, lease_s=args.lease, limits=Limits(wall_s=args.timeout))
    return Config(data_dir=Path(args.data) if args.data else default_data_dir(), db_url=args.db,
                  base_url=(args.base_url or f"http://{args.host}:{args.port}").rstrip("/"), issuer=args.issuer,
                  jobs=args.jobs, upload_limit=args.upload_limit_kb * 1024, queue_limit=args.queue_limit,
                  https_only=args.https_only, worker=settings)


def _serve(args):
    from parallel_lab.service import run

    config = _serve_config(args)
    if args.create_instructor:
        import getpass
        import os

        password = os.environ.get("PARALLEL_LAB_PASSWORD") or (
            getpass.getpass("password for the new instructor (at least 10 characters): ") if sys.stdin.isatty()
            else sys.stdin.readline().rstrip("\n"))
        email = run.create_instructor(config, args.create_instructor, args.name or "", password)
        return {"instructor": email}, f"instructor account {email} made; sign in at {config.base_url}/login", ""
    if args.worker:
        run.run_workers(config)
    else:
        run.serve(config, args.host, args.port)
    return None, "", ""


def _submit_arguments(parser) -> None:
    parser.add_argument("notebook", metavar="NOTEBOOK", help="the lesson notebook to upload (.ipynb)")
    parser.add_argument("--server", required=True, help="the course service's address, e.g. http://127.0.0.1:8000")
    parser.add_argument("--course", required=True, help="the course's short name (in its address)")
    parser.add_argument("--lesson", required=True, help="the lesson, e.g. 01")
    parser.add_argument("--token", help="your command-line token (default: $PARALLEL_LAB_TOKEN)")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for the verdicts")


def _submit(args):
    import os

    from parallel_lab.service import client

    token = args.token or os.environ.get("PARALLEL_LAB_TOKEN", "")
    try:
        report = client.submit(args.notebook, args.server, args.course, args.lesson, token,
                               say=lambda text: print(f"parallel-lab submit: {text}", file=sys.stderr, flush=True))
        if not args.no_wait:
            report = client.wait(args.server, report["id"], token)
    except client.SubmitError as exc:
        raise ValueError(str(exc)) from None
    failed = (_("submit: {state}: {error}").format(state=client.STATES["failed"], error=report.get("error") or "")
              if report["state"] == "failed" else "")
    return report, client.describe(report), failed


COMMANDS = {
    "doctor": (_doctor, "check the installation: torch, gloo, start method, cores, widgets/plotly",
               lambda parser: parser.add_argument("--lang", choices=("en", "zh-Hant"),
                                                  help="the language of the reasons (default: $PARALLEL_LAB_LANG, "
                                                       "else en)")),
    "schedule": (_schedule, "print a schedule's step x rank grid and its simulated numbers",
                 _schedule_arguments),
    "run": (_run, "run tensor, pipeline, 3D, expert (moe), sharded data (zero) or context parallelism on real "
                  "ranks, checked against one process",
            _run_arguments),
    "plan": (_plan, "rank parallel plans (dp, pp, tp, micro-batches, schedule, recompute)",
             _plan_arguments),
    "grade": (_grade, "grade student notebooks in a sandbox: a gradebook CSV, a summary and feedback per student",
              _grade_arguments),
    "certificate": (_certificate, "issue and verify Open Badges 3.0 credentials (keys, revocation lists)",
                    _certificate_arguments),
    "release": (_release, "write the students' repository: no solution, no readable quiz key", _release_arguments),
    "bench": (_bench, "side-by-side benchmarks against the peers, as ratios", _bench_arguments),
    "serve": (_serve, "the course service: uploads, grading workers, credentials and their verification pages",
              _serve_arguments),
    "submit": (_submit, "upload a lesson notebook to a course service and print its verdicts", _submit_arguments),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parallel-lab", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_run, help_text, add_arguments) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        if add_arguments:
            add_arguments(command)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    handler = COMMANDS[args.command][0]
    try:
        report, text, reason = handler(args)
    except (ValueError, TypeError, RuntimeError, TimeoutError) as exc:  # bad input or a failed run
        print(f"parallel-lab {args.command}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    if report is not None:
        print(json.dumps(report) if args.json else text)
    if reason:
        print(reason, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
