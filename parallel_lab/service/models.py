"""The service's tables (SQLAlchemy 2 ORM). Times are naive UTC (``now()``), the same on SQLite and
PostgreSQL.

A submission is also its grading job: ``state`` goes queued -> grading -> graded (or failed), and
while it is being graded ``run_id`` names the ``GradingRun`` that holds its lease until
``lease_expires``. A run that ends without completing (its worker died) stays in ``GradingRun``
with outcome ``lost``: the table is the record that every submission was graded once.
"""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import Boolean, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA_VERSION = 2  # 2: verdicts keep category, cases, answer and feedback; overrides are per check


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def new_id() -> str:
    return uuid.uuid4().hex


class Base(DeclarativeBase):
    pass


class Meta(Base):
    """Key/value facts about the database itself (``schema_version``)."""

    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(254), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    password_hash: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))  # "instructor" or "learner"
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=now)


class LoginSession(Base):
    """A signed-in browser: the session cookie carries ``id``; signing out deletes the row, so a
    copied cookie stops working with it."""

    __tablename__ = "login_sessions"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=now)
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime)


class FormToken(Base):
    """A one-time token of one rendered page's forms, bound to the browser's session id: a form
    posted without it, with another session's, or a second time is refused."""

    __tablename__ = "form_tokens"
    token: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=now, index=True)
    used_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)


class ApiToken(Base):
    """A command-line token (``parallel-lab submit``); only its SHA-256 is stored."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=now)


class LoginAttempt(Base):
    """Failed sign-ins, for the rate limit on guessing passwords."""

    __tablename__ = "login_attempts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(254), index=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime, default=now)


class Course(Base):
    __tablename__ = "courses"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slug: Mapped[str] = mapped_column(String(64), unique=True)
    title: Mapped[str] = mapped_column(String(200))
    instructor_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    enrolment: Mapped[str] = mapped_column(String(16))  # "open" or "roster"
    policy: Mapped[str] = mapped_column(Text)  # JSON, grading.Policy
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=now)


class EnrolmentCode(Base):
    """A roster entry: a one-time code the instructor hands to one learner."""

    __tablename__ = "enrolment_codes"
    code: Mapped[str] = mapped_column(String(32), primary_key=True)
    course_id: Mapped[int] = mapped_column(ForeignKey("courses.id"), index=True)
    label: Mapped[str] = mapped_column(String(200))
    used_by: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True)
    used_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)


class Enrolment(Base):
    __tablename__ = "enrolments"
    __table_args__ = (UniqueConstraint("course_id", "user_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    course_id: Mapped[int] = mapped_column(ForeignKey("courses.id"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=now)


class Upload(Base):
    """An uploaded notebook's bytes, in the database: every worker on every machine reads it from
    there, and it is committed with its submission (never under a name the client chose)."""

    __tablename__ = "uploads"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    size: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    content: Mapped[bytes] = mapped_column(LargeBinary)


class Submission(Base):
    __tablename__ = "submissions"
    __table_args__ = (Index("ix_submissions_queue", "state", "submitted_at"),
                      Index("ix_submissions_learner", "course_id", "user_id", "lesson"))
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    course_id: Mapped[int] = mapped_column(ForeignKey("courses.id"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    lesson: Mapped[str] = mapped_column(String(8))
    upload_id: Mapped[str] = mapped_column(ForeignKey("uploads.id"))
    submitted_at: Mapped[dt.datetime] = mapped_column(DateTime, default=now)
    late: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16), default="queued")  # queued, grading, graded, failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    run_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the GradingRun holding the lease
    lease_expires: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    graded_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    points: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_points: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class GradingRun(Base):
    """One attempt at grading a submission: who, when, how it ended (``graded``, ``lost`` when its
    lease expired before it completed, ``failed``)."""

    __tablename__ = "grading_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    submission_id: Mapped[str] = mapped_column(ForeignKey("submissions.id"), index=True)
    worker: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[dt.datetime] = mapped_column(DateTime, default=now)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)


class CheckResult(Base):
    """One check of a graded submission: a gradebook row of ``course.grading`` (``runner.Row``),
    with the answer's source for the similarity report and the quiz's explanations as feedback."""

    __tablename__ = "check_results"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    submission_id: Mapped[str] = mapped_column(ForeignKey("submissions.id"), index=True)
    check: Mapped[str] = mapped_column(String(100))
    passed: Mapped[bool] = mapped_column(Boolean)
    points: Mapped[float] = mapped_column(Float)
    max_points: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text, default="")
    detail: Mapped[str] = mapped_column(Text, default="")
    sandbox: Mapped[str] = mapped_column(String(16), default="")
    category: Mapped[str] = mapped_column(String(16), default="")
    cases_passed: Mapped[int] = mapped_column(Integer, default=0)
    cases_tried: Mapped[int] = mapped_column(Integer, default=0)
    answer: Mapped[str] = mapped_column(Text, default="")
    feedback: Mapped[str] = mapped_column(Text, default="[]")  # JSON list of lines


class Override(Base):
    """An instructor's points for one check of a learner (a regrade), replacing the graded ones,
    with the reason (``course.grading.roster.Override``)."""

    __tablename__ = "overrides"
    __table_args__ = (UniqueConstraint("course_id", "user_id", "lesson", "check"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    course_id: Mapped[int] = mapped_column(ForeignKey("courses.id"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    lesson: Mapped[str] = mapped_column(String(8))
    check: Mapped[str] = mapped_column(String(100))
    points: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)
    by_user: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=now)


class Credential(Base):
    """An issued credential: its public id (``/credentials/<id>``), its index in the service's status
    list, the signed document, and when and why it was revoked."""

    __tablename__ = "credentials"
    __table_args__ = (UniqueConstraint("course_id", "user_id"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    course_id: Mapped[int] = mapped_column(ForeignKey("courses.id"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    status_index: Mapped[int] = mapped_column(Integer, unique=True)
    issued_at: Mapped[dt.datetime] = mapped_column(DateTime, default=now)
    document: Mapped[str] = mapped_column(Text)  # JSON
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    revoked_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
