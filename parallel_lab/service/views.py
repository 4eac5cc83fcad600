"""The service's pages and API, one function per route (``routes()``).

Every view runs its database work in one transaction (``Service.Session.begin()``) in a worker
thread (``run_in_threadpool``: SQLAlchemy's calls block), and every form it accepts is checked with
``auth.consume`` in that same transaction, so a refused form changes nothing.

Learners: ``/`` (their courses), ``/register``, ``/login``, ``/courses/<slug>`` (enrol, upload,
verdicts, credential), ``/submissions/<id>``. Instructors: ``/courses/new``, the same course page
with the gradebook, overrides, roster, exports and revocations. Public: ``/credentials/<id>``
(HTML, or JSON with ``.json`` or ``Accept: application/json``), ``/status/1`` (the status list),
``/issuer.pub``. Command line: ``/api/courses/<slug>/submissions`` and ``/api/submissions/<id>``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
from pathlib import Path

import yaml
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from parallel_lab.course.grading import gradebook
from parallel_lab.course.grading.roster import Override as RosterOverride
from parallel_lab.course.grading.runner import Row
from parallel_lab.service import auth, credentials, pages, queue
from parallel_lab.service import grading as grading_adapter
from parallel_lab.service.app import locale, render, service_of, wants_json
from parallel_lab.service.grading import CoursePolicy
from parallel_lab.service.models import (
    CheckResult,
    Course,
    Credential,
    Enrolment,
    EnrolmentCode,
    Override,
    Submission,
    User,
    new_id,
    now,
)

Refused, N_ = auth.Refused, auth.N_
SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")


def view(fn):
    """A route: the form (if any) read here, the rest of ``fn(request, form)`` in a thread."""
    async def endpoint(request: Request):
        form = None
        if request.method == "POST" and "form" in request.headers.get("content-type", ""):
            limit = service_of(request).config.upload_limit
            form = await request.form(max_files=1, max_fields=200, max_part_size=limit + 1)
        try:
            return await run_in_threadpool(fn, request, form)
        finally:
            if form is not None:
                await form.close()
    endpoint.__name__ = fn.__name__
    return endpoint


def redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def signed_in(request, s, role: str | None = None) -> User:
    user = auth.session_user(s, request.session.get("sid"))
    if user is None:
        raise Refused(401, N_("sign in first (no session, or it has ended)"))
    if role and user.role != role:
        if role == "instructor":
            raise Refused(403, N_("this page is for instructors"))
        raise Refused(403, N_("this page is for learners"))
    return user


def checked_form(request, s, form) -> None:
    auth.consume(s, request.session.get("sid"), form.get("form_token") if form else None)


def course_or_404(s, slug: str) -> Course:
    course = s.scalars(select(Course).where(Course.slug == slug)).first()
    if course is None:
        raise Refused(404, N_("no such course"))
    return course


def enrolled(s, course: Course, user: User) -> bool:
    return s.scalar(select(Enrolment.id).where(Enrolment.course_id == course.id, Enrolment.user_id == user.id)) \
        is not None


# --- signing in ---------------------------------------------------------------------------------------

@view
def home(request, form):
    service = service_of(request)
    with service.Session.begin() as s:
        user = auth.session_user(s, request.session.get("sid"))
        courses = s.scalars(select(Course).order_by(Course.created_at)).all()
        mine = set()
        if user is not None:
            mine = set(s.scalars(select(Enrolment.course_id).where(Enrolment.user_id == user.id)))
        return render(request, s, "home.html", user=user, courses=courses, mine=mine)


@view
def register(request, form):
    service = service_of(request)
    with service.Session.begin() as s:
        if form is None:
            return render(request, s, "register.html", user=None, error=None)
        checked_form(request, s, form)
        user = auth.create_user(s, str(form.get("email", "")), str(form.get("name", "")),
                                str(form.get("password", "")), "learner")
        request.session["sid"] = auth.open_session(s, user)
    return redirect("/")


@view
def login(request, form):
    service = service_of(request)
    if form is None:
        with service.Session.begin() as s:
            return render(request, s, "login.html", user=None)
    with service.Session.begin() as s:
        checked_form(request, s, form)
    failed = None
    with service.Session.begin() as s:  # a failed attempt is recorded (committed), then refused
        try:
            user = auth.sign_in(s, str(form.get("email", "")), str(form.get("password", "")))
        except Refused as exc:
            failed = exc
        else:
            auth.close_session(s, request.session.get("sid"))
            request.session["sid"] = auth.open_session(s, user)
    if failed is not None:
        raise failed
    return redirect(safe_next(form.get("next")))


@view
def logout(request, form):
    with service_of(request).Session.begin() as s:
        checked_form(request, s, form)
        auth.close_session(s, request.session.get("sid"))
    request.session["sid"] = auth.new_session_id()
    return redirect("/")


def safe_next(target) -> str:
    target = str(target or "/")
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/"


async def language(request: Request):
    lang = request.query_params.get("to", "en")
    response = redirect(safe_next(request.query_params.get("next")))
    if lang in pages.LOCALES:
        response.set_cookie("lang", lang, max_age=365 * 86400, httponly=True, samesite="lax")
    return response


@view
def tokens(request, form):
    with service_of(request).Session.begin() as s:
        user = signed_in(request, s)
        token = None
        if form is not None:
            checked_form(request, s, form)
            token = auth.new_api_token(s, user)
        return render(request, s, "token.html", user=user, token=token,
                      base_url=service_of(request).config.base_url)


# --- courses ------------------------------------------------------------------------------------------

@view
def new_course(request, form):
    service = service_of(request)
    with service.Session.begin() as s:
        user = signed_in(request, s, "instructor")
        if form is None:
            return render(request, s, "course_new.html", user=user, lessons=service.lessons)
        checked_form(request, s, form)
        slug, title = str(form.get("slug", "")).strip().lower(), " ".join(str(form.get("title", "")).split())
        if not SLUG.match(slug):
            raise Refused(400, N_("a course's short name is 2-63 lowercase letters, digits and dashes, got %(slug)r"),
                          slug=slug[:70])
        if not title:
            raise Refused(400, N_("a course needs a title"))
        if s.scalar(select(Course.id).where(Course.slug == slug)) is not None:
            raise Refused(400, N_("a course %(slug)r exists already"), slug=slug)
        try:
            threshold = float(form.get("threshold", "80")) / 100
        except ValueError:
            raise Refused(400, N_("the threshold is a number of percent, got %(text)r"),
                          text=str(form.get("threshold"))[:20]) from None
        deadlines = {x: str(form.get(f"deadline-{x}")) for x in form.getlist("lessons") if form.get(f"deadline-{x}")}
        try:  # the rest of the grading policy, as grading.yaml holds it (weights, credit, similarity)
            rules = yaml.safe_load(str(form.get("rules", "") or "")) or {}
        except yaml.YAMLError as err:
            raise Refused(400, N_("the grading policy is wrong: %(why)s"), why=f"not valid YAML: {err}") from None
        if not isinstance(rules, dict):
            raise Refused(400, N_("the grading policy is wrong: %(why)s"), why="it is not a mapping")
        policy = CoursePolicy.make(sorted(form.getlist("lessons")), threshold, deadlines,
                                   str(form.get("late", "accept")), rules).check(service.lessons)
        enrolment = str(form.get("enrolment", "open"))
        if enrolment not in ("open", "roster"):
            raise Refused(400, N_("enrolment is open or roster, got %(text)r"), text=enrolment[:20])
        s.add(Course(slug=slug, title=title, instructor_id=user.id, enrolment=enrolment, policy=policy.to_json()))
    return redirect(f"/courses/{slug}")


def latest_graded(s, course: Course, user_id: int | None = None) -> dict:
    """(user id, lesson) -> the latest graded submission (by upload time): it replaces earlier ones."""
    stmt = select(Submission).where(Submission.course_id == course.id, Submission.state == "graded")
    if user_id is not None:
        stmt = stmt.where(Submission.user_id == user_id)
    latest = {}
    for sub in s.scalars(stmt.order_by(Submission.submitted_at, Submission.id)):
        latest[(sub.user_id, sub.lesson)] = sub
    return latest


class Gradebook:
    """A course's gradebook as ``course.grading`` computes it: the verdicts of the upload that counts
    for every learner and lesson (``runner.Row``, the learner's email as their student id), the
    instructor's overrides, and every learner's ``gradebook.Standing`` under the course's policy."""

    def __init__(self, service, s, course: Course, learners):
        self.policy = CoursePolicy.from_json(course.policy)
        self.lessons = {x: service.lessons[x] for x in self.policy.lessons}
        self.learners = list(learners)
        emails = {u.id: u.email for u in self.learners}
        self.latest = {key: sub for key, sub in latest_graded(s, course).items() if key[0] in emails}
        self.rows = []
        for (uid, lesson), sub in sorted(self.latest.items()):
            if lesson not in self.lessons:
                continue
            for c in s.scalars(select(CheckResult).where(CheckResult.submission_id == sub.id).order_by(CheckResult.id)):
                self.rows.append(Row(emails[uid], self.lessons[lesson].name, c.check, c.passed, c.points,
                                     c.max_points, c.reason, sub.id, c.detail, c.sandbox,
                                     (c.cases_passed, c.cases_tried), c.category, "", c.answer,
                                     tuple(json.loads(c.feedback or "[]"))))
        self.overrides = {(o.user_id, o.lesson, o.check): o for o in s.scalars(
            select(Override).where(Override.course_id == course.id)) if o.user_id in emails}
        self.applied = [RosterOverride(emails[uid], check, o.points, o.reason) for (uid, _, check), o in
                        self.overrides.items()]
        self.table = grading_adapter.standings(self.policy, service.lessons, self.rows, list(emails.values()),
                                               self.applied)
        self.final = gradebook.apply_overrides(self.rows, self.applied)[0]

    def standing(self, user: User):
        return self.table[user.email]


@view
def course_page(request, form):
    service = service_of(request)
    with service.Session.begin() as s:
        user = signed_in(request, s)
        course = course_or_404(s, request.path_params["slug"])
        policy = CoursePolicy.from_json(course.policy)
        lessons = [service.lessons[x] for x in policy.lessons]
        if user.role == "instructor" and course.instructor_id == user.id:
            return instructor_page(request, s, service, user, course, policy, lessons)
        if not enrolled(s, course, user):
            return render(request, s, "enrol.html", user=user, course=course)
        submissions = s.scalars(select(Submission).where(Submission.course_id == course.id,
                                                         Submission.user_id == user.id)
                                .order_by(Submission.submitted_at.desc()).limit(100)).all()
        book = Gradebook(service, s, course, [user])
        standing = book.standing(user)
        credential = s.scalars(select(Credential).where(Credential.course_id == course.id,
                                                        Credential.user_id == user.id)).first()
        pending = any(sub.state in ("queued", "grading") for sub in submissions)
        return render(request, s, "course.html", user=user, course=course, policy=policy, lessons=lessons,
                      submissions=submissions, standing=standing, credential=credential, pending=pending,
                      counted={lesson: sub for (_, lesson), sub in book.latest.items()},
                      overridden={lesson for (_, lesson, _) in book.overrides})


def instructor_page(request, s, service, user, course, policy, lessons):
    learners = s.scalars(select(User).join(Enrolment, Enrolment.user_id == User.id)
                         .where(Enrolment.course_id == course.id).order_by(User.name)).all()
    book = Gradebook(service, s, course, learners)
    rows = [(learner, book.standing(learner)) for learner in learners]
    creds = {c.user_id: c for c in s.scalars(select(Credential).where(Credential.course_id == course.id))}
    codes = s.scalars(select(EnrolmentCode).where(EnrolmentCode.course_id == course.id)
                      .order_by(EnrolmentCode.label)).all()
    counts = dict(s.execute(select(Submission.state, func.count()).where(Submission.course_id == course.id)
                            .group_by(Submission.state)).all())
    checks = [(lesson, c.id, c.points) for lesson in lessons for c in lesson.reference.checks]
    return render(request, s, "instructor.html", user=user, course=course, policy=policy, lessons=lessons,
                  rows=rows, credentials=creds, codes=codes, counts=counts, overrides=book.overrides,
                  latest=book.latest, checks=checks, exports=EXPORTS,
                  pairs=grading_adapter.similar(policy, service.lessons, book.final))


@view
def enrol(request, form):
    with service_of(request).Session.begin() as s:
        user = signed_in(request, s)
        course = course_or_404(s, request.path_params["slug"])
        checked_form(request, s, form)
        if enrolled(s, course, user):
            return redirect(f"/courses/{course.slug}")
        if course.enrolment == "roster":
            code = str(form.get("code", "")).strip()
            row = s.scalars(select(EnrolmentCode).where(EnrolmentCode.code == code,
                                                        EnrolmentCode.course_id == course.id)
                            .with_for_update()).first()
            if row is None:
                raise Refused(403, N_("this enrolment code is not one of this course's"))
            if row.used_by is not None:
                raise Refused(409, N_("this enrolment code was used already (each code enrols one learner)"))
            row.used_by, row.used_at = user.id, now()
        s.add(Enrolment(course_id=course.id, user_id=user.id))
    return redirect(f"/courses/{course.slug}")


@view
def roster(request, form):
    with service_of(request).Session.begin() as s:
        user = signed_in(request, s, "instructor")
        course = course_or_404(s, request.path_params["slug"])
        if course.instructor_id != user.id:
            raise Refused(403, N_("only the course's instructor can change its roster"))
        checked_form(request, s, form)
        for label in str(form.get("names", "")).splitlines():
            if label.strip():
                s.add(EnrolmentCode(code=secrets.token_hex(6), course_id=course.id, label=label.strip()[:200]))
    return redirect(f"/courses/{course.slug}#roster")


# --- submissions --------------------------------------------------------------------------------------

def accept_upload(service, s, course: Course, user: User, lesson_id: str, upload) -> Submission:
    """Check an upload against the course, the limits and the notebook's lesson, then store it and
    queue it, in ``s``'s transaction. Refused, with nothing stored, when any check fails."""
    if not enrolled(s, course, user):
        raise Refused(403, N_("you are not enrolled in this course"))
    policy = CoursePolicy.from_json(course.policy)
    if lesson_id not in policy.lessons:
        raise Refused(400, N_("lesson %(lesson)r is not graded in this course (its lessons: %(lessons)s)"),
                      lesson=lesson_id[:8], lessons=", ".join(policy.lessons))
    if not isinstance(upload, UploadFile):
        raise Refused(400, N_("no notebook file in the upload (field 'notebook')"))
    content = upload.file.read(service.config.upload_limit + 1)
    digest = grading_adapter.screen_upload(upload.filename or "", content, service.lessons[lesson_id],
                                           service.config.upload_limit)
    t = now()
    late = grading_adapter.is_late(policy, lesson_id, t)
    if late and policy.late == "refuse":
        raise Refused(400, N_("the deadline of lesson %(lesson)s (%(deadline)s UTC) has passed"), lesson=lesson_id,
                      deadline=policy.deadlines[lesson_id])
    recent = s.scalar(select(func.count()).select_from(Submission)
                      .where(Submission.user_id == user.id, Submission.submitted_at > t - dt.timedelta(minutes=1)))
    if recent >= service.config.uploads_per_minute:
        raise Refused(429, N_("%(recent)s uploads in the last minute (at most %(limit)s): wait a minute, then upload "
                           "again"), recent=recent, limit=service.config.uploads_per_minute)
    if queue.waiting(s) >= service.config.queue_limit:
        raise Refused(503, N_("the grading queue is full (%(limit)s waiting): nothing was stored; upload again in a "
                           "minute"), limit=service.config.queue_limit)
    return queue.enqueue(s, course_id=course.id, user_id=user.id, lesson=lesson_id, content=content,
                         sha256=digest, late=late)


@view
def upload(request, form):
    service = service_of(request)
    with service.Session.begin() as s:
        user = signed_in(request, s)
        course = course_or_404(s, request.path_params["slug"])
        checked_form(request, s, form)
        sub = accept_upload(service, s, course, user, str(form.get("lesson", "")), form.get("notebook"))
        sid = sub.id
    if service.pool:
        service.pool.notify()
    return redirect(f"/submissions/{sid}")


@view
def api_upload(request, form):
    service = service_of(request)
    with service.Session.begin() as s:
        user = auth.api_user(s, request.headers.get("authorization"))
        if user is None:
            raise Refused(401, N_("no valid token (Authorization: Bearer TOKEN; make one on the service's Token page)"))
        course = course_or_404(s, request.path_params["slug"])
        if form is None:
            raise Refused(400, N_("send the notebook as multipart/form-data (fields lesson and notebook)"))
        sub = accept_upload(service, s, course, user, str(form.get("lesson", "")), form.get("notebook"))
        report = submission_json(service, s, sub)
    if service.pool:
        service.pool.notify()
    return JSONResponse(report, status_code=202)


def submission_json(service, s, sub: Submission) -> dict:
    checks = s.scalars(select(CheckResult).where(CheckResult.submission_id == sub.id).order_by(CheckResult.id)).all()
    return {"id": sub.id, "lesson": sub.lesson, "state": sub.state, "late": sub.late,
            "submitted_at": sub.submitted_at.isoformat() + "Z", "points": sub.points, "max_points": sub.max_points,
            "error": sub.error, "url": f"{service.config.base_url}/submissions/{sub.id}",
            "checks": [{"check": c.check, "passed": c.passed, "points": c.points, "max_points": c.max_points,
                        "reason": c.reason, "detail": c.detail, "category": c.category,
                        "cases": [c.cases_passed, c.cases_tried], "feedback": json.loads(c.feedback or "[]")}
                       for c in checks]}


def visible_submission(request, s, sub_id: str):
    user = auth.session_user(s, request.session.get("sid")) or auth.api_user(s, request.headers.get("authorization"))
    if user is None:
        raise Refused(401, N_("sign in first (no session, or it has ended)"))
    sub = s.get(Submission, sub_id)
    course = s.get(Course, sub.course_id) if sub else None
    if sub is None or (sub.user_id != user.id and course.instructor_id != user.id):
        raise Refused(404, N_("no such submission"))
    return user, sub, course


@view
def submission_page(request, form):
    service = service_of(request)
    with service.Session.begin() as s:
        user, sub, course = visible_submission(request, s, request.path_params["sid"])
        if wants_json(request):
            return JSONResponse(submission_json(service, s, sub))
        checks = s.scalars(select(CheckResult).where(CheckResult.submission_id == sub.id)
                           .order_by(CheckResult.id)).all()
        lesson = service.lessons.get(sub.lesson)
        feedback = {c.id: json.loads(c.feedback or "[]") for c in checks}
        return render(request, s, "submission.html", user=user, sub=sub, course=course, checks=checks,
                      lesson=lesson, feedback=feedback)


@view
def api_submission(request, form):
    service = service_of(request)
    with service.Session.begin() as s:
        _, sub, _ = visible_submission(request, s, request.path_params["sid"])
        return JSONResponse(submission_json(service, s, sub))


# --- the instructor's tools ---------------------------------------------------------------------------

def own_course(request, s):
    user = signed_in(request, s, "instructor")
    course = course_or_404(s, request.path_params["slug"])
    if course.instructor_id != user.id:
        raise Refused(403, N_("only the course's instructor can do this"))
    return user, course


@view
def override(request, form):
    """An instructor's points for one check of a learner, with the reason (a regrade): it replaces the
    graded points in the standing, the exports and the credential (``course.grading``'s overrides)."""
    service = service_of(request)
    with service.Session.begin() as s:
        user, course = own_course(request, s)
        checked_form(request, s, form)
        policy = CoursePolicy.from_json(course.policy)
        lesson, _, check = str(form.get("check", "")).partition(":")
        learner = s.get(User, int(form.get("learner", "0") or 0)) if str(form.get("learner", "")).isdigit() else None
        known = {c.id: c for c in service.lessons[lesson].reference.checks} if lesson in policy.lessons else {}
        if check not in known or learner is None or not enrolled(s, course, learner):
            raise Refused(400, N_("an override names an enrolled learner and a check of the course's lessons"))
        top = known[check].points
        try:
            points = float(form.get("points", ""))
        except ValueError:
            raise Refused(400, N_("points must be a number from 0 to %(top)g"), top=top) from None
        reason = " ".join(str(form.get("reason", "")).split())
        if not 0 <= points <= top or not reason:
            raise Refused(400, N_("an override needs points from 0 to %(top)g and a reason, got %(points)g and "
                                  "%(reason)r"),
                          top=top, points=points, reason=reason[:40])
        row = s.scalars(select(Override).where(Override.course_id == course.id, Override.user_id == learner.id,
                                               Override.lesson == lesson, Override.check == check)).first()
        if row is None:
            s.add(Override(course_id=course.id, user_id=learner.id, lesson=lesson, check=check, points=points,
                           reason=reason, by_user=user.id))
        else:
            row.points, row.reason, row.by_user, row.created_at = points, reason, user.id, now()
    return redirect(f"/courses/{course.slug}#gradebook")


EXPORTS = ("grades.csv", "grades-summary.csv", "canvas.csv", "moodle.csv", "similarity.csv")


@view
def export(request, form):
    """The course's gradebook as ``course.grading`` writes it: ``grades.csv`` (every check of the
    upload that counts, overrides applied), ``grades-summary.csv``, ``canvas.csv`` and ``moodle.csv``
    (the LMSs' import formats), ``similarity.csv`` (the similarity report)."""
    service = service_of(request)
    which = request.path_params["which"]
    if which not in EXPORTS:
        raise Refused(404, N_("the exports are %(names)s"), names=", ".join(EXPORTS))
    with service.Session.begin() as s:
        _, course = own_course(request, s)
        learners = s.scalars(select(User).join(Enrolment, Enrolment.user_id == User.id)
                             .where(Enrolment.course_id == course.id).order_by(User.name)).all()
        book = Gradebook(service, s, course, learners)
        files = grading_adapter.exports(book.policy, service.lessons, book.final, book.table,
                                        grading_adapter.roster_of(learners))
    return Response(files[which].encode("utf-8"), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="{course.slug}-{which}"'})


# --- credentials --------------------------------------------------------------------------------------

@view
def get_credential(request, form):
    service = service_of(request)
    with service.Session.begin() as s:
        user = signed_in(request, s)
        course = course_or_404(s, request.path_params["slug"])
        checked_form(request, s, form)
        existing = s.scalars(select(Credential).where(Credential.course_id == course.id,
                                                      Credential.user_id == user.id)).first()
        if existing is not None:
            return redirect(f"/credentials/{existing.id}")
        if not enrolled(s, course, user):
            raise Refused(403, N_("you are not enrolled in this course"))
        book = Gradebook(service, s, course, [user])
        standing = book.standing(user)
        if not standing.passed:
            raise Refused(400, N_("not yet: a score of %(score)s, the course needs %(share)s"),
                          score=format(standing.score, ".0%"), share=format(book.policy.threshold, ".0%"))
        issued, cid, base = now(), new_id(), service.config.base_url
        index = (s.scalar(select(func.max(Credential.status_index))) or 0) + 1
        lessons = {}  # the lessons passed, each with the checks passed in it (overrides applied)
        for x in standing.lessons_passed:
            name = service.lessons[x].name
            lessons[x] = [r.exercise for r in book.final if r.lesson == name and (r.passed or r.points >= r.max_points)]
        document = credentials.issue(service.key, name=user.name, email=user.email, lessons=lessons,
                                     course=course.title, issuer=service.config.issuer, issuer_url=base,
                                     credential_url=f"{base}/credentials/{cid}", status_url=service.status.url,
                                     status_index=index, issued=issued)
        s.add(Credential(id=cid, course_id=course.id, user_id=user.id, status_index=index, issued_at=issued,
                         document=json.dumps(document, ensure_ascii=False)))
    return redirect(f"/credentials/{cid}")


def revoked_indices(s) -> list[int]:
    return list(s.scalars(select(Credential.status_index).where(Credential.revoked_at.is_not(None))))


def credential_report(service, s, cred: Credential) -> dict:
    """What the verification page shows: the course's verifier run with the service's public key and
    its current status list, and whom, what and when the credential says."""
    document = json.loads(cred.document)
    result = credentials.verify(document, service.key, service.status.document(revoked_indices(s)))
    base = service.config.base_url
    subject, achievement = result["subject"] or {}, result["achievement"] or {}
    return {"id": cred.id, "url": f"{base}/credentials/{cred.id}", "valid": result["valid"],
            "reason": result["reason"], "revoked": bool(result["revoked"]),
            "revoked_at": cred.revoked_at.isoformat() + "Z" if cred.revoked_at else None,
            "holder": {"name": subject.get("name"), "achievement": achievement.get("name"),
                       "criteria": achievement.get("criteria"), "valid_from": result["valid_from"]},
            "issuer": {"name": (result["issuer"] or {}).get("name"), "id": (result["issuer"] or {}).get("id"),
                       "fingerprint": result["fingerprint"], "public_key": f"{base}/issuer.pub"},
            "status": {"list": service.status.url, "index": cred.status_index, "purpose": "revocation"},
            "credential": document}


@view
def credential_page(request, form):
    service = service_of(request)
    cid = request.path_params["cid"]
    as_json = cid.endswith(".json") or wants_json(request)
    cid = cid.removesuffix(".json")
    with service.Session.begin() as s:
        cred = s.get(Credential, cid)
        if cred is None:
            raise Refused(404, N_("no credential with this ID was issued here"))
        report = credential_report(service, s, cred)
        if as_json:
            return JSONResponse(report)
        user = auth.session_user(s, request.session.get("sid"))
        course = s.get(Course, cred.course_id)
        can_revoke = user is not None and course.instructor_id == user.id and not report["revoked"]
        return render(request, s, "credential.html", user=user, report=report, cred=cred, can_revoke=can_revoke)


@view
def credential_download(request, form):
    service = service_of(request)
    with service.Session.begin() as s:
        cred = s.get(Credential, request.path_params["cid"])
        user = signed_in(request, s)
        course = s.get(Course, cred.course_id) if cred else None
        if cred is None or (cred.user_id != user.id and course.instructor_id != user.id):
            raise Refused(404, N_("no such credential"))
        body = json.dumps(json.loads(cred.document), indent=2, ensure_ascii=False) + "\n"
    return Response(body.encode(), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="credential-{cred.id}.json"'})


@view
def revoke(request, form):
    with service_of(request).Session.begin() as s:
        user = signed_in(request, s, "instructor")
        cred = s.get(Credential, request.path_params["cid"])
        if cred is None or s.get(Course, cred.course_id).instructor_id != user.id:
            raise Refused(404, N_("no such credential of your courses"))
        checked_form(request, s, form)
        reason = " ".join(str(form.get("reason", "")).split())
        if not reason:
            raise Refused(400, N_("say why the credential is revoked"))
        if cred.revoked_at is None:
            cred.revoked_at, cred.revoked_reason = now(), reason[:500]
    return redirect(f"/credentials/{cred.id}")


@view
def status_list(request, form):
    service = service_of(request)
    with service.Session.begin() as s:
        revoked = revoked_indices(s)
    return JSONResponse(service.status.document(revoked), headers={"Cache-Control": "no-cache"})


async def issuer_pub(request: Request):
    key = service_of(request).key
    return Response(credentials.public_pem(key), media_type="application/x-pem-file",
                    headers={"X-Fingerprint": credentials.fingerprint(key)})


async def health(request: Request):
    return JSONResponse({"ok": True, "locale": locale(request)})


def routes() -> list:
    return [
        Route("/", home), Route("/health", health),
        Route("/register", register, methods=["GET", "POST"]), Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]), Route("/lang", language), Route("/tokens", tokens,
                                                                                     methods=["GET", "POST"]),
        Route("/courses/new", new_course, methods=["GET", "POST"]),
        Route("/courses/{slug}", course_page),
        Route("/courses/{slug}/enrol", enrol, methods=["POST"]),
        Route("/courses/{slug}/roster", roster, methods=["POST"]),
        Route("/courses/{slug}/submissions", upload, methods=["POST"]),
        Route("/courses/{slug}/overrides", override, methods=["POST"]),
        Route("/courses/{slug}/credential", get_credential, methods=["POST"]),
        Route("/courses/{slug}/export/{which:str}", export),
        Route("/submissions/{sid}", submission_page),
        Route("/credentials/{cid}/download", credential_download),
        Route("/credentials/{cid}/revoke", revoke, methods=["POST"]),
        Route("/credentials/{cid}", credential_page),
        Route("/status/1", status_list), Route("/issuer.pub", issuer_pub),
        Route("/api/courses/{slug}/submissions", api_upload, methods=["POST"]),
        Route("/api/submissions/{sid}", api_submission),
        Mount("/static", app=StaticFiles(directory=Path(__file__).resolve().parent / "static"), name="static"),
    ]

