"""The grading workers: each takes the next submission from the queue (``queue.claim``), grades it
with the course's grader in its sandbox (``grading.grade``), keeps its lease while it does, and
records the verdicts (``queue.complete``).

    pool = Pool(Session, settings, jobs=2); pool.start() ... pool.stop()     # in ``serve``
    run_workers(Session, settings, jobs=2, stop=event)                       # ``serve --worker``

A worker never holds the signing key (credentials are issued by the web process), and the
sandbox's view of the file system hides the service's data folder (database, key, secret) and
PostgreSQL's socket folders: no submission can read them (``Settings.hidden``).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from parallel_lab.course.grading.sandbox import Limits, Sandbox
from parallel_lab.service import grading, queue

POSTGRES_SOCKETS = ("/run/postgresql", "/var/run/postgresql")


@dataclass
class Settings:
    """What a worker needs: where the lessons are, how long a lease lasts, the sandbox's limits, the
    paths the sandbox must hide, and (tests, extra exercises) checker modules and environment."""

    lessons_dir: str | None = None
    lease_s: float = 30.0
    poll_s: float = 1.0
    max_attempts: int = queue.MAX_ATTEMPTS
    limits: Limits = field(default_factory=lambda: Limits(wall_s=300))
    hidden: tuple = ()
    modules: tuple = ()
    env: dict = field(default_factory=dict)


def sandbox_for(settings: Settings) -> Sandbox:
    """bubblewrap with the service's paths hidden; without it the worker refuses to start (a
    subreaper sandbox runs submissions with the service's own view of the files)."""
    box = Sandbox.detect()
    if box.kind != "bwrap":
        raise RuntimeError("the course service grades only in bubblewrap, which hides its database and key from "
                           f"submissions: {box.missing.split(':')[0]} (Debian: apt-get install bubblewrap)")
    hidden = [*settings.hidden, *(p for p in POSTGRES_SOCKETS if os.path.isdir(p))]
    box.hidden = [str(Path(p).resolve()) for p in hidden]
    return box


class Worker:
    def __init__(self, Session, settings: Settings, name: str, wake: threading.Event | None = None):
        self.Session, self.settings, self.name = Session, settings, name
        self.wake = wake or threading.Event()
        self.sandbox = sandbox_for(settings)
        self.graded = 0

    def step(self) -> bool:
        """Grade one submission if one is waiting; False when the queue was empty."""
        job = queue.claim(self.Session, self.name, self.settings.lease_s, self.settings.max_attempts)
        if job is None:
            return False
        stop_renewing = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(job, stop_renewing), daemon=True)
        renewer.start()
        try:
            rows, error = self._grade(job), None
        except Exception as exc:  # the grader itself failed: record why, do not retry forever
            traceback.print_exc(file=sys.stderr)
            words = str(exc).splitlines()[0][:300] if str(exc) else ""
            rows, error = [], f"the grader failed: {type(exc).__name__}: {words}"
        finally:
            stop_renewing.set()
            renewer.join()
        if queue.complete(self.Session, job, rows, error):
            self.graded += 1
        return True

    def _grade(self, job: queue.Job):
        lesson = grading.catalog(self.settings.lessons_dir).get(job.lesson)
        if lesson is None:
            raise RuntimeError(f"lesson {job.lesson} is not among this worker's lessons ({self.settings.lessons_dir})")
        rules = grading.CoursePolicy.from_json(job.policy).rules
        return grading.grade(job.content, lesson, job.student, self.sandbox, self.settings.limits, rules,
                             self.settings.modules, self.settings.env)

    def _renew(self, job: queue.Job, stop: threading.Event) -> None:
        while not stop.wait(self.settings.lease_s / 3):
            try:
                if not queue.renew(self.Session, job, self.settings.lease_s):
                    return
            except Exception:  # a database hiccup: try again at the next beat
                traceback.print_exc(file=sys.stderr)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                busy = self.step()
            except Exception:  # the database went away for a moment: wait, then go on
                traceback.print_exc(file=sys.stderr)
                busy = False
            if not busy:
                self.wake.wait(self.settings.poll_s)
                self.wake.clear()


class Pool:
    """``jobs`` workers in threads of this process (each grading runs in its own sandboxed processes)."""

    def __init__(self, Session, settings: Settings, jobs: int):
        self.stop_event, self.wake = threading.Event(), threading.Event()
        base = f"{socket.gethostname()}:{os.getpid()}"
        self.workers = [Worker(Session, settings, f"{base}:{i}", self.wake) for i in range(jobs)]
        self.threads = [threading.Thread(target=w.run, args=(self.stop_event,), daemon=True, name=w.name)
                        for w in self.workers]

    def start(self) -> "Pool":
        for t in self.threads:
            t.start()
        return self

    def notify(self) -> None:
        self.wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop taking jobs. A grading still running is left to its lease: another worker, or this
        service started again, retries it once the lease expires."""
        self.stop_event.set()
        self.wake.set()
        for t in self.threads:
            t.join(timeout)
