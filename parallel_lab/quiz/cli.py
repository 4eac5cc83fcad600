"""The ``grade`` and ``certificate`` sub-commands of ``parallel-lab`` (registered in
``parallel_lab/cli.py``'s COMMANDS). Each handler returns (report for --json, text, reason to fail).

    parallel-lab grade SUBMISSION... --out grades.csv [--reference LESSON.ipynb]... [--feedback DIR]
                       [--cell-timeout S] [--timeout S] [--student-from parent|stem] [--jobs N]
    parallel-lab certificate verify FILE [--key-file KEY] [--accept-self-issued]
    parallel-lab certificate issue --name NAME (--lessons NN... | --gradebook CSV --student S
                       [--threshold T]) [--out FILE] [--key-file KEY] [--issuer TEXT] [--date D]
    parallel-lab certificate keygen FILE
"""

from __future__ import annotations

import argparse
from pathlib import Path


def grade_arguments(parser) -> None:
    parser.add_argument("submissions", nargs="+", metavar="SUBMISSION",
                        help="student notebooks (or folders of them); the student is the notebook's folder name")
    parser.add_argument("--out", required=True, help="the gradebook CSV to write")
    parser.add_argument("--reference", action="append", default=[], metavar="LESSON.ipynb",
                        help="reference lesson(s) with tagged check cells (default: lessons/*.ipynb)")
    parser.add_argument("--feedback", metavar="DIR", help="feedback folder (default: feedback/ beside --out)")
    parser.add_argument("--cell-timeout", type=float, default=60, metavar="S", help="seconds per cell (60)")
    parser.add_argument("--timeout", type=float, default=600, metavar="S", help="seconds per notebook (600)")
    parser.add_argument("--student-from", choices=("parent", "stem"), default="parent",
                        help="student name from the folder (default) or the file name")
    parser.add_argument("--jobs", type=int, default=1, help="submissions graded at once (1)")


def grade(args):
    from parallel_lab.grading import grade as run_grade

    out = Path(args.out)
    feedback = Path(args.feedback) if args.feedback else out.parent / "feedback"
    rows = run_grade(args.submissions, out, args.reference or None, feedback, args.cell_timeout,
                     args.timeout, args.student_from, args.jobs)
    students = sorted({r.student for r in rows})
    report = {"gradebook": str(out), "feedback": str(feedback), "students": len(students),
              "submissions": len({r.submission for r in rows}),
              "rows": [{"student": r.student, "lesson": r.lesson, "exercise": r.exercise, "passed": r.passed,
                        "points": r.points, "max_points": r.max_points, "reason": r.reason} for r in rows]}
    width = max(len(s) for s in students)
    lines = [f"{s:{width}}  {sum(r.points for r in rows if r.student == s):g} of "
             f"{sum(r.max_points for r in rows if r.student == s):g} points" for s in students]
    lines.append(f"gradebook: {out}; feedback: {feedback}/")
    return report, "\n".join(lines), ""


def certificate_arguments(parser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    verify = actions.add_parser("verify", help="check a certificate: exit 0 if valid, 1 if not")
    verify.add_argument("file")
    verify.add_argument("--accept-self-issued", action="store_true",
                        help="with an instructor key, also accept certificates signed with the public key")
    issue = actions.add_parser("issue", help="issue a certificate (with an instructor key: unforgeable)")
    issue.add_argument("--name", required=True)
    source = issue.add_mutually_exclusive_group(required=True)
    source.add_argument("--lessons", nargs="+", metavar="NN")
    source.add_argument("--gradebook", metavar="CSV", help="lessons the student passed in this gradebook")
    issue.add_argument("--student", help="the student's name in the gradebook")
    issue.add_argument("--threshold", type=float, default=0.8, help="share of a lesson's points to pass (0.8)")
    issue.add_argument("--out", default="certificate.json")
    issue.add_argument("--issuer", help="who issues it, e.g. 'Prof. Lin, CS 4xx' (default: instructor/self-issued)")
    issue.add_argument("--date", help="YYYY-MM-DD (default: today)")
    keygen = actions.add_parser("keygen", help="write a new instructor key file (keep it secret)")
    keygen.add_argument("file")
    for sub in (verify, issue):
        sub.add_argument("--key-file", help="instructor key (default: $PARALLEL_LAB_CERT_KEY_FILE or "
                                            "$PARALLEL_LAB_CERT_KEY; else the public course key)")
    for sub in (verify, issue, keygen):  # --json may come after the action too
        sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                         help="print one JSON object on stdout")


def certificate(args):
    from parallel_lab import certificate as cert

    if args.action == "keygen":
        key = cert.keygen(args.file)
        return ({"file": args.file, "key_id": key.key_id},
                f"wrote instructor key {key.key_id} to {args.file} (keep it secret; set "
                f"PARALLEL_LAB_CERT_KEY_FILE={args.file} or pass --key-file)", "")
    key = cert.load_key(args.key_file)
    if args.action == "verify":
        result = cert.verify(args.file, key, accept_self_issued=args.accept_self_issued)
        return result, result["reason"], "" if result["valid"] else f"certificate verify: {result['reason']}"
    if args.gradebook:
        if not args.student:
            raise ValueError("--gradebook needs --student (the student's name in the gradebook)")
        lessons = cert.lessons_from_gradebook(args.gradebook, args.student, args.threshold)
        if not lessons:
            raise ValueError(f"{args.student} passed no lesson at threshold {args.threshold:g} in {args.gradebook}")
    else:
        lessons = args.lessons
    issued = cert.issue(args.name, lessons, key, date=args.date, issuer=args.issuer)
    cert.save(issued, args.out)
    return ({**issued, "file": args.out},
            f"{cert.Certificate(issued)}\nsaved to {args.out}", "")
