"""The grading queue, in the database: the submissions table is the job table.

    job = claim(Session, "host:pid:thread", lease_s=30)     # or None when nothing is waiting
    renew(Session, job, lease_s=30)                         # while grading: keep the lease
    complete(Session, job, rows)                            # False: the lease was lost; nothing written

**Exactly once.** An upload is committed (``enqueue``, in the same transaction as its bytes) before
anything grades it. ``claim`` takes the oldest queued submission, or one whose lease expired (its
worker died), in one write transaction (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite's
``BEGIN IMMEDIATE``), records a ``GradingRun`` and makes it the lease holder. ``complete`` writes the
verdicts only if that run still holds the lease (a fenced write): a worker that lost its lease
(stopped long enough for another to take the job over) writes nothing, so a grade is recorded once.
A run whose lease expired is marked ``lost``; after ``max_attempts`` runs that did not complete (a
submission that brings its grader down every time) the submission is marked ``failed`` with the
reason, instead of blocking the queue.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

from sqlalchemy import and_, func, or_, select, update

from parallel_lab.service.models import CheckResult, Course, GradingRun, Submission, Upload, User, now

MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class Job:
    submission_id: str
    run_id: int
    lesson: str
    user_id: int
    content: bytes
    student: str = ""  # the learner's student id (their email): their graded quiz is drawn from it
    policy: str = "{}"  # the course's policy (JSON, ``grading.CoursePolicy``)


def waiting(session) -> int:
    """Submissions not graded yet (queued or being graded): the queue's length."""
    return session.scalar(select(func.count()).select_from(Submission)
                          .where(Submission.state.in_(("queued", "grading"))))


def enqueue(session, *, course_id: int, user_id: int, lesson: str, content: bytes, sha256: str,
            late: bool) -> Submission:
    """Store an upload and its submission (queued) in ``session``'s transaction."""
    upload = Upload(size=len(content), sha256=sha256, content=content)
    session.add(upload)
    session.flush()
    submission = Submission(course_id=course_id, user_id=user_id, lesson=lesson, upload_id=upload.id,
                            late=late, state="queued", attempts=0, submitted_at=now())
    session.add(submission)
    session.flush()
    return submission


def claim(Session, worker: str, lease_s: float, max_attempts: int = MAX_ATTEMPTS) -> Job | None:
    """The next submission to grade, leased to a new run of ``worker``; None when none is waiting."""
    while True:
        with Session.begin() as s:
            t = now()
            stmt = (select(Submission)
                    .where(or_(Submission.state == "queued",
                               and_(Submission.state == "grading", Submission.lease_expires < t)))
                    .order_by(Submission.submitted_at, Submission.id).limit(1)
                    .with_for_update(skip_locked=True))
            sub = s.scalars(stmt).first()
            if sub is None:
                return None
            if sub.state == "grading":  # its worker died or stalled: that run is lost
                s.execute(update(GradingRun).where(GradingRun.id == sub.run_id, GradingRun.outcome.is_(None))
                          .values(outcome="lost", finished_at=t))
                if sub.attempts >= max_attempts:
                    sub.state, sub.run_id, sub.lease_expires = "failed", None, None
                    sub.error = (f"grading was started {sub.attempts} times and never completed (the grader "
                                 "stopped each time); ask the instructor")
                    continue  # committed; look for the next one
            run = GradingRun(submission_id=sub.id, worker=worker[:200], started_at=t)
            s.add(run)
            s.flush()
            sub.state, sub.attempts, sub.run_id = "grading", sub.attempts + 1, run.id
            sub.lease_expires = t + dt.timedelta(seconds=lease_s)
            content = s.scalar(select(Upload.content).where(Upload.id == sub.upload_id))
            student = s.scalar(select(User.email).where(User.id == sub.user_id))
            policy = s.scalar(select(Course.policy).where(Course.id == sub.course_id))
            return Job(sub.id, run.id, sub.lesson, sub.user_id, content, student, policy)


def renew(Session, job: Job, lease_s: float) -> bool:
    """Extend the lease of ``job``'s run; False if it no longer holds it."""
    with Session.begin() as s:
        done = s.execute(update(Submission)
                         .where(Submission.id == job.submission_id, Submission.run_id == job.run_id,
                                Submission.state == "grading")
                         .values(lease_expires=now() + dt.timedelta(seconds=lease_s)))
        return done.rowcount == 1


def complete(Session, job: Job, rows, error: str | None = None) -> bool:
    """Record ``job``'s verdicts (``course.grading`` rows) and mark it graded, or failed with
    ``error``; only if its run still holds the lease. True when written."""
    with Session.begin() as s:
        sub = s.scalars(select(Submission).where(Submission.id == job.submission_id)
                        .with_for_update()).first()
        if sub is None or sub.state != "grading" or sub.run_id != job.run_id:
            return False
        t = now()
        for r in rows:
            s.add(CheckResult(submission_id=sub.id, check=r.exercise, passed=r.passed, points=r.points,
                              max_points=r.max_points, reason=r.reason, detail=r.detail, sandbox=r.sandbox,
                              category=r.category, cases_passed=r.cases[0], cases_tried=r.cases[1],
                              answer=r.answer, feedback=json.dumps(list(r.feedback), ensure_ascii=False)))
        sub.state = "failed" if error else "graded"
        sub.error = error
        sub.points = sum(r.points for r in rows) if not error else None
        sub.max_points = sum(r.max_points for r in rows) if not error else None
        sub.graded_at, sub.run_id, sub.lease_expires = t, None, None
        s.execute(update(GradingRun).where(GradingRun.id == job.run_id)
                  .values(outcome="failed" if error else "graded", finished_at=t))
        return True
