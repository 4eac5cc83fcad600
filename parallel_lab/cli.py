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
                        help="launcher, collectives, tensor, pipeline (default: all)")


COMMANDS = {
    "doctor": (_doctor, "check the installation: torch, gloo, start method, cores, widgets/plotly", None),
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
