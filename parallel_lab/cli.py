"""The ``parallel-lab`` command. Contracts in shared/DESIGN.md: every sub-command that reports numbers
takes ``--json`` and then prints exactly one JSON object on stdout; progress goes to stderr; exit 0 on
success, non-zero with a one-line reason on stderr otherwise."""

from __future__ import annotations

import argparse
import json
import sys


def _doctor(args) -> tuple[dict, str, str]:
    """(report, text for people, reason to fail or "")"""
    from parallel_lab.doctor import doctor

    report = doctor()
    lines = [f"{'ok ' if c['ok'] else 'NO '} {name:13} {c['why']}" for name, c in report["checks"].items()]
    failed = [name for name, c in report["checks"].items() if not c["ok"]]
    reason = f"doctor: failed checks: {', '.join(failed)}" if failed else ""
    return report, "\n".join(lines), reason


COMMANDS = {
    "doctor": (_doctor, "check the installation: torch, gloo, start method, cores, widgets/plotly"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parallel-lab", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text)
        command.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    handler, _ = COMMANDS[args.command]
    try:
        report, text, reason = handler(args)
    except (ValueError, TypeError, RuntimeError) as exc:  # bad input or a failed run: one line
        print(f"parallel-lab {args.command}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(json.dumps(report) if args.json else text)
    if reason:
        print(reason, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
