"""``parallel-lab submit``: upload a lesson notebook to a course service and wait for its verdicts.

    PARALLEL_LAB_TOKEN=plt_... parallel-lab submit 01_ranks_and_collectives.ipynb \\
        --server https://course.example.edu --course cs-4xx --lesson 01 [--no-wait] [--json]

The token comes from the service's "Command-line token" page. Only the standard library is used
(urllib), so a learner's environment needs nothing more to submit.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.request
from pathlib import Path

from parallel_lab.i18n import _, _l


class SubmitError(RuntimeError):
    pass


class TryLater(SubmitError):
    """The service is busy (503: its queue is full; 429: too many uploads): nothing was stored."""

    def __init__(self, reason: str, after: float):
        super().__init__(reason)
        self.after = after


def _multipart(fields: dict, filename: str, content: bytes) -> tuple[bytes, str]:
    boundary = "----parallel-lab-" + secrets.token_hex(12)
    parts = []
    for name, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="notebook"; filename="{filename}"\r\n'
                 f"Content-Type: application/x-ipynb+json\r\n\r\n".encode() + content + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def _call(request: urllib.request.Request, timeout: float = 60) -> dict:
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        try:
            reason = json.loads(err.read()).get("error", "")
        except ValueError:
            reason = ""
        words = _("the service refused ({code}): {reason}").format(code=err.code, reason=reason or err.reason)
        if err.code in (429, 503):
            after = err.headers.get("Retry-After", "30")
            raise TryLater(words, float(after) if after.isdigit() else 30.0) from None
        raise SubmitError(words) from None
    except urllib.error.URLError as err:
        raise SubmitError(_("cannot reach {url}: {reason}").format(url=request.full_url, reason=err.reason)) from None


def submit(path, server: str, course: str, lesson: str, token: str, tries: int = 5, say=None) -> dict:
    """Upload ``path``; the service's answer (``id``, ``state``, ``url``, ...). A busy service (its
    queue full, or too many uploads a minute) stored nothing: wait as it asks (Retry-After) and try
    again, ``tries`` times in all."""
    path = Path(path)
    if not token:
        raise SubmitError(_("no token: set PARALLEL_LAB_TOKEN or pass --token (the service's Token page makes one)"))
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise SubmitError(_("cannot read {path}: {reason}").format(path=path, reason=exc.strerror)) from None
    body, kind = _multipart({"lesson": lesson}, path.name, content)
    request = urllib.request.Request(f"{server.rstrip('/')}/api/courses/{course}/submissions", data=body,
                                     method="POST", headers={"Content-Type": kind,
                                                             "Authorization": f"Bearer {token}"})
    for attempt in range(1, tries + 1):
        try:
            return _call(request)
        except TryLater as busy:
            if attempt == tries:
                raise
            if say:
                say(_("{busy}; trying again in {after:g} s ({attempt} of {tries})").format(
                    busy=busy, after=busy.after, attempt=attempt, tries=tries))
            time.sleep(busy.after)
    raise AssertionError("unreachable")


def status(server: str, submission: str, token: str) -> dict:
    request = urllib.request.Request(f"{server.rstrip('/')}/api/submissions/{submission}",
                                     headers={"Authorization": f"Bearer {token}"})
    return _call(request)


def wait(server: str, submission: str, token: str, timeout: float = 900, every: float = 2.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        report = status(server, submission, token)
        if report["state"] in ("graded", "failed") or time.monotonic() > deadline:
            return report
        time.sleep(every)


# A submission's states as describe says them (the service stores the English word).
STATES = {"queued": _l("queued"), "grading": _l("grading"), "graded": _l("graded"), "failed": _l("failed")}


def describe(report: dict) -> str:
    """A graded submission as ``parallel-lab submit`` prints it, in the language of $PARALLEL_LAB_LANG
    (the reasons are the grader's, already in the submission's language)."""
    state = str(STATES.get(report["state"], report["state"]))
    head = _("lesson {lesson}: {state}").format(lesson=report["lesson"], state=state)
    if report.get("late"):
        head += _(" (late)")
    if report.get("points") is not None:
        head += _(", {points:g} of {max_points:g} points").format(points=report["points"],
                                                                 max_points=report["max_points"])
    lines = [head]
    if report.get("error"):
        lines.append(f"  {report['error']}")
    for c in report.get("checks", []):
        verdict = (_("{check}: passed") if c["passed"] else _("{check}: FAILED: {reason}")).format(
            check=c["check"], reason=c.get("reason"))
        lines.append(f"  {verdict} ({c['points']:g}/{c['max_points']:g})")
    lines.append(f"  {report['url']}")
    return "\n".join(lines)
