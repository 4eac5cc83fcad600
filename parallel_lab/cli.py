"""The ``parallel-lab`` command. Contracts in shared/DESIGN.md: every sub-command that reports numbers
takes ``--json`` and then prints exactly one JSON object on stdout; progress goes to stderr; exit 0 on
success, non-zero with a one-line reason on stderr otherwise."""

from __future__ import annotations

import argparse
import json
import sys

# Each handler returns (report for --json, text for people, reason to fail or "").


def _doctor(args):
    from parallel_lab.doctor import doctor

    report = doctor()
    lines = [f"{'ok ' if c['ok'] else 'NO '} {name:13} {c['why']}" for name, c in report["checks"].items()]
    failed = [name for name, c in report["checks"].items() if not c["ok"]]
    return report, "\n".join(lines), f"doctor: failed checks: {', '.join(failed)}" if failed else ""


def _bench(args):
    from parallel_lab.bench import format_table, run_suites

    rows = run_suites(args.suites)
    return {"rows": rows}, format_table(rows), ""


def _bench_arguments(parser):
    parser.add_argument("suites", nargs="*", metavar="SUITE",
                        help="launcher, collectives, simulator, tensor, pipeline (default: all)")


def _schedule(args):
    from parallel_lab.schedules import build, format_grid
    from parallel_lab.simulate import Costs, parse_costs, summary

    costs = parse_costs(args.costs) if args.costs else Costs()
    report = summary(build(args.name, args.stages, args.microbatches, args.virtual), costs)
    peak = ", ".join(str(n) for n in report["peak_activations"])
    text = (f"{format_grid(report['ranks'])}\n\n{report['schedule']}: {report['stages']} ranks, "
            f"{report['model_stages']} model stages, {report['microbatches']} micro-batches\n"
            f"makespan {report['makespan']:g}, bubble {report['bubble_fraction']:.1%}, "
            f"peak activations per stage [{peak}]")
    return report, text, ""


def _schedule_arguments(parser):
    from parallel_lab.schedules import SCHEDULES

    parser.add_argument("name", choices=sorted(SCHEDULES), metavar="NAME", help=", ".join(SCHEDULES))
    parser.add_argument("--stages", type=int, required=True, help="pipeline ranks P")
    parser.add_argument("--microbatches", type=int, required=True, help="micro-batches M")
    parser.add_argument("--virtual", type=int, default=1, help="stages per rank (interleaved, zb-v)")
    parser.add_argument("--costs", help="F,B,W durations, e.g. 1,2,1 (W splits off B)")


def _run(args):
    if args.what == "tensor":
        from parallel_lab.tensor.run import run_tensor

        report = run_tensor(args.tp, args.model, args.sequence_parallel)
        counts = ", ".join(f"{op} x{c['count']}" for op, c in report["collectives"].items())
        text = (f"tensor parallel {args.model}, tp {args.tp}"
                f"{' + sequence parallel' if args.sequence_parallel else ''}: max output diff "
                f"{report['max_output_diff']:.1e}, max grad diff {report['max_grad_diff']:.1e} (fp64, "
                f"against the single-process model)\ncollectives on rank 0: {counts}")
        summary = {k: report[k] for k in ("tp", "model", "sequence_parallel", "max_output_diff",
                                          "max_grad_diff", "collectives") if k in report}
        return {**summary, **{k: v for k, v in report.items() if k == "loss_diff"}}, text, ""
    from parallel_lab.pipeline.run import run_pipeline

    report = run_pipeline(args.schedule, args.stages, args.microbatches, args.model, args.virtual,
                          args.recompute, args.trace)
    text = (f"{args.schedule} on {args.stages} ranks, {args.microbatches} micro-batches: max grad diff "
            f"{report['max_grad_diff']:.1e}, loss diff {report['loss_diff']:.1e} (fp64, against the "
            f"single-process model)\nbubble measured (virtual clock) {report['bubble_measured']:.1%}, "
            f"predicted {report['bubble_predicted']:.1%}; peak activations {report['peak_activations']}"
            + (f"\ntrace written to {args.trace}" if args.trace else ""))
    keys = ("schedule", "stages", "microbatches", "max_grad_diff", "loss_diff", "bubble_measured",
            "bubble_predicted", "bubble_wall", "peak_activations", "peak_activations_predicted")
    return {k: report[k] for k in keys if k in report}, text, ""


def _run_arguments(parser):
    sub = parser.add_subparsers(dest="what", required=True)
    tensor = sub.add_parser("tensor", help="Megatron tensor parallelism on real ranks vs the dense model")
    tensor.add_argument("--tp", type=int, required=True, help="tensor-parallel ranks")
    tensor.add_argument("--model", choices=("mlp", "block", "gpt"), default="mlp")
    tensor.add_argument("--sequence-parallel", action="store_true")
    pipe = sub.add_parser("pipeline", help="a pipeline schedule on real ranks vs the single-process model")
    pipe.add_argument("--schedule", required=True, help="naive, gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v")
    pipe.add_argument("--stages", type=int, required=True, help="pipeline ranks P")
    pipe.add_argument("--microbatches", type=int, required=True)
    pipe.add_argument("--virtual", type=int, default=1)
    pipe.add_argument("--model", choices=("mlp", "gpt"), default="mlp")
    pipe.add_argument("--recompute", action="store_true", help="activation recomputation")
    pipe.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace")
    for command in (tensor, pipe):
        command.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _plan(args):
    from parallel_lab import planner

    names = ("layers", "hidden", "heads", "vocab", "seq", "batch", "nodes", "gpus_per_node", "gpu_mem_gb",
             "intra_gbps", "inter_gbps", "tflops", "latency_us", "price", "tokens", "top", "zero1")
    result = planner.plan_from_args(**{name: getattr(args, name) for name in names})
    return result, planner.format_plans(result), ""


def _plan_arguments(parser):
    for name, kind in (("layers", int), ("hidden", int), ("heads", int), ("vocab", int), ("seq", int),
                       ("batch", int), ("nodes", int), ("gpus-per-node", int), ("gpu-mem-gb", float)):
        parser.add_argument(f"--{name}", type=kind, required=True)
    parser.add_argument("--intra-gbps", type=float, default=300.0, help="intra-node GB/s per device")
    parser.add_argument("--inter-gbps", type=float, default=25.0, help="inter-node GB/s per device")
    parser.add_argument("--tflops", type=float, default=150.0, help="achieved TFLOP/s per device")
    parser.add_argument("--latency-us", type=float, default=5.0, help="link latency α in µs")
    parser.add_argument("--price", type=float, help="$ per GPU-hour: adds the cost of a training run")
    parser.add_argument("--tokens", type=float, default=300e9, help="training tokens for the cost")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--zero1", action="store_true", help="shard optimizer state over DP (ZeRO-1)")


def _grade(args):
    from parallel_lab.quiz import cli as quiz_cli

    return quiz_cli.grade(args)


def _certificate(args):
    from parallel_lab.quiz import cli as quiz_cli

    return quiz_cli.certificate(args)


def _quiz_arguments(name):
    def add(parser):
        from parallel_lab.quiz import cli as quiz_cli

        getattr(quiz_cli, f"{name}_arguments")(parser)
    return add


COMMANDS = {
    "doctor": (_doctor, "check the installation: torch, gloo, start method, cores, widgets/plotly", None),
    "schedule": (_schedule, "print a schedule's step x rank grid and its simulated numbers",
                 _schedule_arguments),
    "run": (_run, "run tensor or pipeline parallelism on real ranks, checked against one process",
            _run_arguments),
    "plan": (_plan, "rank parallel plans (dp, pp, tp, micro-batches, schedule, recompute)",
             _plan_arguments),
    "grade": (_grade, "grade student notebooks with nbval: a gradebook CSV and feedback per student",
              _quiz_arguments("grade")),
    "certificate": (_certificate, "verify, issue, or make keys for course certificates",
                    _quiz_arguments("certificate")),
    "bench": (_bench, "side-by-side benchmarks against the peers, as ratios", _bench_arguments),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parallel-lab", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text, add_arguments) in COMMANDS.items():
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
    print(json.dumps(report) if args.json else text)
    if reason:
        print(reason, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
