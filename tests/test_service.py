"""The course service (``parallel-lab serve``): its pages and forms in both languages, bad input
refused with a clear answer and nothing changed, sessions and forms that cannot be forged or
replayed, the grading queue graded by the course's grader, credentials issued, verified offline and
revoked through the status list, and submissions that cannot read the service's database or key.

The heavy runs (50 concurrent uploads, SIGKILL during grading, PostgreSQL with two workers) are in
``test_service_queue.py``; the browser's walk through the pages in ``test_service_browser.py``."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import nbformat
import pytest
from sqlalchemy import func, select

with warnings.catch_warnings():  # Starlette asks for httpx2 instead of httpx; both work
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from parallel_lab.course import credentials as cr
from parallel_lab.course.grading import gradebook
from parallel_lab.service import auth, credentials, pages, queue
from parallel_lab.service.app import Config, Service
from parallel_lab.service.grading import CoursePolicy
from parallel_lab.service.models import Course, Credential, FormToken, GradingRun, Submission, Upload
from parallel_lab.service.worker import Settings, Worker

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from service_support import lesson01, require_bwrap  # noqa: E402


def _summary_row(text: str, student: str) -> tuple:
    """(total points, total max) of a student in the course gradebook's summary CSV."""
    row = next(r for r in csv.DictReader(text.splitlines()) if r["student"] == student)
    return row["total points"], row["total max"]

PASSWORD = "a-long-password"


# ----------------------------------------------------------------------------------------------
# No process, no server.


def test_the_service_messages_keep_their_placeholders_in_chinese():
    """The course's catalog (its completeness test: tests/test_i18n.py) holds the pages' messages;
    theirs are ``%(name)s`` placeholders (Jinja's and the refusals'), which must survive translation."""
    from babel.messages.pofile import read_po

    from parallel_lab.i18n.translate import catalog_path

    with open(catalog_path("zh-Hant"), "rb") as f:
        catalog = [m for m in read_po(f) if m.id and any("service" in where for where, _ in m.locations)]
    assert len(catalog) > 150
    for m in catalog:
        assert m.string and sorted(re.findall(r"%\(\w+\)\w", m.id)) == \
            sorted(re.findall(r"%\(\w+\)\w", m.string)), m.id
    zh = pages.translator("zh-Hant")
    refused = auth.Refused(400, auth.N_("lesson %(lesson)r is not graded in this course (its lessons: %(lessons)s)"),
                           lesson="07", lessons="01")
    assert refused.reason == "lesson '07' is not graded in this course (its lessons: 01)"
    assert refused.translated(zh) == "本課程不評分第 '07' 課（本課程的課：01）"


def test_language_negotiation():
    assert pages.negotiate(None, "zh-TW,zh;q=0.9,en;q=0.8") == "zh-Hant"
    assert pages.negotiate(None, "en-US,en;q=0.9,zh-TW;q=0.5") == "en"
    assert pages.negotiate(None, "fr, zh-Hant;q=0.3") == "zh-Hant"
    assert pages.negotiate(None, None) == "en"
    assert pages.negotiate("en", "zh-TW") == "en" and pages.negotiate("zh-Hant", "en") == "zh-Hant"
    assert pages.negotiate("xx", "de") == "en"


def test_policy_refuses_what_cannot_be_graded():
    known = {"01": None, "02": None}
    with pytest.raises(auth.Refused, match=r"no graded lesson 07 \(graded lessons: 01, 02\)"):
        CoursePolicy.make(["07"]).check(known)
    with pytest.raises(auth.Refused, match=r"the grading policy is wrong: .*certificate.threshold must be a number in "
                                           r"\(0, 1\], got 1.5"):
        CoursePolicy.make(["01"], 1.5).check(known)
    with pytest.raises(auth.Refused, match="a deadline is YYYY-MM-DDTHH:MM"):
        CoursePolicy.make(["01"], deadlines={"01": "next friday"}).check(known)
    assert CoursePolicy.make(["01"], 0.4).threshold == 0.4 and CoursePolicy.make(["01"]).threshold == 0.8


def test_a_database_of_another_schema_version_is_refused(tmp_path):
    from parallel_lab.service import db
    from parallel_lab.service.models import SCHEMA_VERSION, Meta

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = db.connect(url)
    with db.sessions(engine).begin() as s:
        s.get(Meta, "schema_version").value = "0"
    engine.dispose()
    with pytest.raises(db.DatabaseError, match=f"has schema version 0, this service needs {SCHEMA_VERSION}"):
        db.connect(url)
    with pytest.raises(db.DatabaseError, match="--db must be sqlite:///PATH or postgresql://"):
        db.connect("mysql://x/y")


def test_passwords_are_hashed_with_argon2id():
    digest = auth.hash_password(PASSWORD)
    assert digest.startswith("$argon2id$") and PASSWORD not in digest
    assert auth.password_ok(digest, PASSWORD) and not auth.password_ok(digest, PASSWORD + "x")
    with pytest.raises(auth.Refused, match="at least 10 characters, got 5"):
        auth.hash_password("short")


# ----------------------------------------------------------------------------------------------
# The web application, without grading workers (jobs=0): forms, sessions, refusals.


class Visitor:
    """A browser-like client: follows pages, reads each page's form token."""

    def __init__(self, client):
        self.c = client

    def page(self, path, **kw):
        r = self.c.get(path, **kw)
        token = re.search(r'name="form_token" value="([^"]+)"', r.text)
        self.token = token.group(1) if token else None
        return r

    def post(self, path, data=None, token=True, **kw):
        data = dict(data or {})
        if token:
            data["form_token"] = self.token
        return self.c.post(path, data=data, follow_redirects=False, **kw)

    def register(self, name, email):
        self.page("/register")
        r = self.post("/register", {"name": name, "email": email, "password": PASSWORD})
        assert r.status_code == 303, r.text
        return r

    def login(self, email):
        self.page("/login")
        r = self.post("/login", {"email": email, "password": PASSWORD})
        assert r.status_code == 303, r.text


def reason(r) -> str:
    if r.headers.get("content-type", "").startswith("application/json"):
        return r.json()["error"]
    return re.sub(r"&#39;", "'", re.search(r'id="reason">([^<]*)', r.text).group(1))


@pytest.fixture
def service(tmp_path):
    svc = Service(Config(data_dir=tmp_path / "data", jobs=0, base_url="http://testserver", uploads_per_minute=4,
                         queue_limit=6, upload_limit=200_000))
    with svc.Session.begin() as s:
        auth.create_user(s, "lin@example.org", "Prof. Lin", PASSWORD, "instructor")
    yield svc
    svc.engine.dispose()


def counts(svc) -> tuple:
    with svc.Session.begin() as s:
        return tuple(s.scalar(select(func.count()).select_from(t)) for t in (Upload, Submission, Course, Credential))


def make_course(svc, client, slug="mp", enrolment="open", lessons=("01",), threshold="40"):
    teacher = Visitor(client)
    teacher.login("lin@example.org")
    teacher.page("/courses/new")
    data = {"title": "Model parallelism", "slug": slug, "threshold": threshold, "enrolment": enrolment,
            "late": "accept"}
    r = teacher.c.post("/courses/new", data={**data, "form_token": teacher.token, "lessons": list(lessons)},
                       follow_redirects=False)
    assert r.status_code == 303, r.text
    return teacher


def test_learner_enrols_and_bad_uploads_change_nothing(service):
    with TestClient(service.app()) as c1, TestClient(service.app()) as c2:
        make_course(service, c1)
        ada = Visitor(c2)
        ada.register("Ada Lovelace", "ada@example.org")
        ada.page("/courses/mp")
        assert ada.post("/courses/mp/enrol").status_code == 303
        page = ada.page("/courses/mp")
        assert "Upload for grading" in page.text and "0 of 5 points" in page.text
        good = lesson01()
        before = counts(service)

        def upload(filename, content, lesson="01", token=True):
            ada.page("/courses/mp")
            return ada.post("/courses/mp/submissions", {"lesson": lesson}, token=token,
                            files={"notebook": (filename, content, "application/octet-stream")})

        cases = [
            (upload("notes.txt", b"hello"), 400, "only notebooks (.ipynb) are graded, got 'notes.txt'"),
            (upload("01.ipynb", b"\x89PNG not json"), 400, "01.ipynb is not a notebook"),
            (upload("../../etc/01.ipynb", good), 400,
             "a plain notebook name, without folders, got '../../etc/01.ipynb'"),
            (upload("big.ipynb", good + b" " * 200_000), 413, "over the limit of 200,000"),
            (upload("01.ipynb", good, lesson="07"), 400, "lesson '07' is not graded in this course (its lessons: 01)"),
            (upload("02.ipynb", nbformat.writes(nbformat.v4.new_notebook(cells=[
                nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["answer:row-parallel"]})])).encode()),
             400, "02.ipynb is not lesson 01"),
            (upload("01.ipynb", good, token=False), 403, "the form has no form token"),
        ]
        for r, status, words in cases:
            assert r.status_code == status and words in reason(r), (status, reason(r))
        assert counts(service) == before
        # a replayed form: the same token twice
        ada.page("/courses/mp")
        first = ada.post("/courses/mp/submissions", {"lesson": "01"},
                         files={"notebook": ("01_ranks_and_collectives.ipynb", good, "application/json")})
        assert first.status_code == 303 and first.headers["location"].startswith("/submissions/")
        again = ada.post("/courses/mp/submissions", {"lesson": "01"},
                         files={"notebook": ("01_ranks_and_collectives.ipynb", good, "application/json")})
        assert again.status_code == 409 and "already sent once" in reason(again)
        after = counts(service)
        assert after[:2] == (before[0] + 1, before[1] + 1)
        with service.Session.begin() as s:
            sub = s.scalars(select(Submission)).one()
            stored = s.get(Upload, sub.upload_id)
            assert sub.state == "queued" and stored.content == good and sub.lesson == "01"
            assert "ranks_and_collectives" not in stored.id  # a name the service made


def test_sessions_cannot_be_forged_or_reused_after_signing_out(service):
    with TestClient(service.app()) as c1, TestClient(service.app()) as c2, TestClient(service.app()) as c3:
        make_course(service, c1)
        ada = Visitor(c2)
        ada.register("Ada", "ada@example.org")
        assert ada.page("/courses/mp").status_code == 200
        cookie = c2.cookies.get("pl_session")
        # no session at all
        stranger = Visitor(c3)
        r = stranger.c.get("/courses/mp")
        assert r.status_code == 401 and "sign in first" in reason(r)
        # a forged cookie: the right shape, another key
        import base64

        from itsdangerous import TimestampSigner
        forged = TimestampSigner("not-the-secret").sign(base64.b64encode(json.dumps({"sid": "x" * 43}).encode()))
        c3.cookies.set("pl_session", forged.decode())
        assert c3.get("/courses/mp").status_code == 401
        # another session's form token is refused
        stranger.page("/register")
        ada.page("/courses/mp")
        r = c3.post("/courses/mp/enrol", data={"form_token": ada.token}, follow_redirects=False)
        assert r.status_code in (401, 403)
        # a copied cookie stops working once its owner signs out
        ada.page("/")
        assert ada.post("/logout").status_code == 303
        c3.cookies.clear()
        c3.cookies.set("pl_session", cookie)
        assert c3.get("/courses/mp").status_code == 401
        # the form token rows are bound to sessions; the service never kept a password
        with service.Session.begin() as s:
            assert s.scalar(select(func.count()).select_from(FormToken)) > 0


def test_wrong_password_is_refused_and_rate_limited(service):
    with TestClient(service.app()) as c:
        v = Visitor(c)
        for _ in range(auth.FAILED_LOGINS):
            v.page("/login")
            assert v.post("/login", {"email": "lin@example.org", "password": "wrong-password"}).status_code == 401
        v.page("/login")
        r = v.post("/login", {"email": "lin@example.org", "password": PASSWORD})
        assert r.status_code == 429 and "failed sign-ins" in reason(r)


def test_roster_codes_enrol_once(service):
    with TestClient(service.app()) as c1, TestClient(service.app()) as c2, TestClient(service.app()) as c3:
        teacher = make_course(service, c1, slug="closed", enrolment="roster")
        teacher.page("/courses/closed")
        assert teacher.post("/courses/closed/roster", {"names": "Ada\nGrace"}).status_code == 303
        codes = re.findall(r"<code>([0-9a-f]{12})</code>", teacher.page("/courses/closed").text)
        assert len(codes) == 2
        ada, eve = Visitor(c2), Visitor(c3)
        ada.register("Ada", "ada@example.org")
        eve.register("Eve", "eve@example.org")
        ada.page("/courses/closed")
        assert ada.post("/courses/closed/enrol", {"code": "0" * 12}).status_code == 403
        ada.page("/courses/closed")
        assert ada.post("/courses/closed/enrol", {"code": codes[0]}).status_code == 303
        eve.page("/courses/closed")
        r = eve.post("/courses/closed/enrol", {"code": codes[0]})
        assert r.status_code == 409 and "used already" in reason(r)


def test_rate_limit_and_full_queue_refuse_without_storing(service):
    with TestClient(service.app()) as c1:
        make_course(service, c1)
        tokens = []
        with service.Session.begin() as s:
            course = s.scalars(select(Course)).one()
            from parallel_lab.service.models import Enrolment
            for i in range(3):
                user = auth.create_user(s, f"l{i}@example.org", f"L{i}", PASSWORD, "learner")
                s.add(Enrolment(course_id=course.id, user_id=user.id))
                tokens.append(auth.new_api_token(s, user))
        good = lesson01()

        def api(token):
            return c1.post("/api/courses/mp/submissions", data={"lesson": "01"},
                           files={"notebook": ("01.ipynb", good, "application/json")},
                           headers={"Authorization": f"Bearer {token}"})

        assert [api(tokens[0]).status_code for _ in range(4)] == [202] * 4
        r = api(tokens[0])
        assert r.status_code == 429 and "at most 4" in r.json()["error"] and r.headers["retry-after"]
        assert [api(tokens[1]).status_code for _ in range(2)] == [202, 202]
        before = counts(service)
        r = api(tokens[2])
        assert r.status_code == 503 and "queue is full (6 waiting): nothing was stored" in r.json()["error"]
        assert counts(service) == before
        assert c1.post("/api/courses/mp/submissions", data={"lesson": "01"}).status_code == 401
        bad = c1.post("/api/courses/mp/submissions", data={"lesson": "01"},
                      files={"notebook": ("01.ipynb", good, "application/json")},
                      headers={"Authorization": "Bearer plt_forged"})
        assert bad.status_code == 401


def test_pages_in_traditional_chinese(service):
    with TestClient(service.app()) as c:
        r = c.get("/login", headers={"Accept-Language": "zh-TW,zh;q=0.9"})
        assert '<html lang="zh-Hant">' in r.text and "電子郵件地址" in r.text and "登入" in r.text
        r = c.get("/lang?to=en&next=/login", headers={"Accept-Language": "zh-TW"})
        assert c.get("/login", headers={"Accept-Language": "zh-TW"}).text.count("E-mail address") == 1
        c.get("/lang?to=zh-Hant&next=/")
        v = Visitor(c)
        v.page("/register")
        r = v.post("/register", {"name": "A", "email": "not-an-address", "password": PASSWORD})
        assert r.status_code == 400 and "不是電子郵件地址" in r.text
        assert c.get("/lang?to=en&next=//evil.example", follow_redirects=False).headers["location"] == "/"


# ----------------------------------------------------------------------------------------------
# Grading for real (one worker in this process), credentials, revocation, verification.


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_graded_upload_earns_a_credential_that_verifies_offline_until_revoked(service, tmp_path):
    require_bwrap()
    service.config.worker.hidden = (str(service.config.data_dir),)
    worker = Worker(service.Session, service.config.worker, "test-worker")
    with TestClient(service.app()) as c1, TestClient(service.app()) as c2:
        teacher = make_course(service, c1)
        ada = Visitor(c2)
        ada.register("Ada Lovelace", "ada@example.org")
        ada.page("/courses/mp")
        ada.post("/courses/mp/enrol")
        ada.page("/courses/mp")
        r = ada.post("/courses/mp/submissions", {"lesson": "01"},
                     files={"notebook": ("01_ranks_and_collectives.ipynb", lesson01(), "application/json")})
        sub_url = r.headers["location"]
        assert "waiting to be graded" in ada.page(sub_url).text
        assert worker.step() is True and worker.step() is False
        page = ada.page(sub_url).text
        assert "2 / 5" in page and "ring-all-reduce" in page and "passed" in page
        report = c2.get(sub_url, headers={"Accept": "application/json"}).json()
        assert report["state"] == "graded" and [(x["check"], x["passed"]) for x in report["checks"]] == \
            [("ring-all-reduce", True), ("quiz:01", False)]
        ada.page("/courses/mp")
        r = ada.post("/courses/mp/credential")
        cred_url = r.headers["location"]
        cid = cred_url.rsplit("/", 1)[1]
        download = c2.get(f"/credentials/{cid}/download")
        assert download.headers["content-disposition"].startswith("attachment")
        doc = download.json()
        (tmp_path / "credential.json").write_bytes(download.content)
        (tmp_path / "issuer.pub").write_bytes(c2.get("/issuer.pub").content)
        # public verification page, no login: HTML and JSON
        public = TestClient(service.app())
        html = public.get(cred_url).text
        assert "Ada Lovelace" in html and credentials.fingerprint(service.key) in html and 'data-valid="true"' in html
        info = public.get(cred_url + ".json").json()
        assert info["valid"] and not info["revoked"] and info["holder"]["name"] == "Ada Lovelace"
        assert "- lesson 01: ring-all-reduce" in info["holder"]["criteria"]  # the checks passed, not the quiz
        assert doc["id"] == "http://testserver" + cred_url and doc["issuer"]["id"].startswith("did:key:")
        assert doc["credentialStatus"]["statusListCredential"] == "http://testserver/status/1"
        assert "ada@example.org" not in download.text  # the learner's email is stored hashed
        assert info == public.get(cred_url, headers={"Accept": "application/json"}).json()
        # offline, with the public key alone
        out = subprocess.run([str(Path(sys.executable).with_name("parallel-lab")), "certificate", "verify",
                              str(tmp_path / "credential.json"), "--public-key", str(tmp_path / "issuer.pub"),
                              "--json"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and json.loads(out.stdout)["valid"], out.stderr
        edited = json.loads(download.text)
        edited["credentialSubject"]["identifier"][-1]["identityHash"] = "Mallory"
        assert "edited after signing" in cr.verify(edited, service.key.public_key()).reason
        # revoked: the status list's bit, the page and the JSON say so
        teacher.page(cred_url)
        assert teacher.post(f"{cred_url}/revoke", {"reason": "copied work"}).status_code == 303
        info = public.get(cred_url + ".json").json()
        assert not info["valid"] and info["revoked"]
        status = public.get("/status/1").json()
        assert cr.is_revoked(status, info["status"]["index"])
        (tmp_path / "status-list.json").write_text(json.dumps(status))
        out = subprocess.run([str(Path(sys.executable).with_name("parallel-lab")), "certificate", "verify",
                              str(tmp_path / "credential.json"), "--public-key", str(tmp_path / "issuer.pub"),
                              "--status-list", str(tmp_path / "status-list.json"), "--json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 1 and json.loads(out.stdout)["revoked"] is True, out.stdout
        assert "Revoked by the issuer" in public.get(cred_url).text
        assert public.get("/credentials/" + "0" * 32).status_code == 404
        # the instructor's export is the course gradebook's CSV
        csv_text = teacher.c.get("/courses/mp/export/grades.csv").text
        from parallel_lab.course.grading import exports
        assert csv_text.splitlines()[0] == ",".join(gradebook.GRADEBOOK_COLUMNS)
        assert "ada@example.org,01_ranks_and_collectives,ring-all-reduce,true,2,2" in csv_text
        summary = teacher.c.get("/courses/mp/export/grades-summary.csv").text
        assert _summary_row(summary, "ada@example.org")[:2] == ("2", "5")
        canvas = teacher.c.get("/courses/mp/export/canvas.csv").text.splitlines()
        assert canvas[0].startswith(",".join(exports.CANVAS_IDENTITY)) and canvas[1].startswith("Points Possible")
        assert canvas[2].startswith("Ada Lovelace,,ada@example.org,ada@example.org,")
        moodle = teacher.c.get("/courses/mp/export/moodle.csv").text.splitlines()
        assert moodle[0].startswith(",".join(exports.MOODLE_IDENTITY)) and "ada@example.org" in moodle[1]
        assert teacher.c.get("/courses/mp/export/passwords.csv").status_code == 404


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_a_submission_cannot_read_the_database_or_the_key():
    """The probe exercise (tests/grading_probe.py) lets an answer open files: it tries the
    service's database, issuer key and session secret, and a file beside them that is not hidden
    (which it must be able to read, or the test proves nothing)."""
    require_bwrap()
    root = Path(tempfile.mkdtemp(prefix="pl-service-", dir="/var/tmp"))  # outside the sandbox's private /tmp
    lessons = root / "lessons"
    lessons.mkdir()
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def probe():\n    raise NotImplementedError\n", metadata={"tags": ["answer:probe"]}),
        nbformat.v4.new_code_cell("check(probe)", metadata={"tags": ["check:probe", "points:1"]})])
    nbformat.write(nb, lessons / "99_probe.ipynb")
    visible = root / "visible.txt"
    visible.write_text("anyone")
    data = root / "data"
    settings = Settings(lessons_dir=str(lessons), modules=("grading_probe",), env={"PYTHONPATH": str(TESTS)})
    svc = Service(Config(data_dir=data, jobs=0, worker=settings), pool=False)
    try:
        targets = [data / "service.db", data / "keys" / "issuer.key", data / "session.secret", visible]
        assert all(p.exists() for p in targets)
        body = ("out = []\nfor p in %r:\n    try:\n        with open(p, 'rb') as f:\n"
                "            out.append(f.read()[:6].hex())\n    except Exception as e:\n"
                "        out.append(type(e).__name__)\nreturn ';'.join(out)") % [str(p) for p in targets]
        answer = "def probe():\n" + "".join(f"    {line}\n" for line in body.splitlines())
        content = nbformat.writes(nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_code_cell(answer, metadata={"tags": ["answer:probe"]})])).encode()
        with svc.Session.begin() as s:
            teacher = auth.create_user(s, "t@example.org", "T", PASSWORD, "instructor")
            course = Course(slug="probe", title="probe", instructor_id=teacher.id, enrolment="open",
                            policy=CoursePolicy.make(["99"], 1.0).to_json())
            s.add(course)
            s.flush()
            queue.enqueue(s, course_id=course.id, user_id=teacher.id, lesson="99", content=content, sha256="x",
                          late=False)
        worker = Worker(svc.Session, svc.config.worker, "probe-worker")
        assert worker.sandbox.kind == "bwrap" and str(data.resolve()) in worker.sandbox.hidden
        assert worker.step()
        with svc.Session.begin() as s:
            from parallel_lab.service.models import CheckResult
            said = s.scalars(select(CheckResult)).one().reason
        assert said == "probe: FAILED: it said " + ";".join(["FileNotFoundError"] * 3 + ["616e796f6e65"]), said
    finally:
        svc.engine.dispose()
        import shutil
        shutil.rmtree(root, ignore_errors=True)


def test_a_lost_lease_writes_nothing_and_a_dead_run_is_retried(service):
    """Two claims of one job: the first run's lease expires (its worker died), the second takes it
    over; the first run's late completion is refused, the second's recorded: one grade."""
    with service.Session.begin() as s:
        teacher = auth.create_user(s, "t2@example.org", "T", PASSWORD, "instructor")
        course = Course(slug="q", title="q", instructor_id=teacher.id, enrolment="open",
                        policy=CoursePolicy.make(["01"]).to_json())
        s.add(course)
        s.flush()
        queue.enqueue(s, course_id=course.id, user_id=teacher.id, lesson="01", content=b"{}", sha256="x", late=False)
    first = queue.claim(service.Session, "a", lease_s=0.01)
    time.sleep(0.05)
    assert first is not None and queue.claim(service.Session, "b", lease_s=30) is not None  # lease expired: taken over
    from parallel_lab.course.grading.runner import Row
    rows = [Row("x", "01", "ring-all-reduce", True, 2, 2, "")]
    assert queue.complete(service.Session, first, rows) is False
    with service.Session.begin() as s:
        run_b = s.scalars(select(GradingRun).where(GradingRun.worker == "b")).one()
    second = queue.Job(first.submission_id, run_b.id, "01", teacher.id, b"{}")
    assert queue.renew(service.Session, second, 30) and not queue.renew(service.Session, first, 30)
    assert queue.complete(service.Session, second, rows) is True
    assert queue.complete(service.Session, second, rows) is False  # never twice
    with service.Session.begin() as s:
        outcomes = sorted((r.worker, r.outcome) for r in s.scalars(select(GradingRun)))
        sub = s.scalars(select(Submission)).one()
    assert outcomes == [("a", "lost"), ("b", "graded")] and sub.state == "graded" and sub.attempts == 2
    assert queue.claim(service.Session, "c", lease_s=30) is None


def test_a_job_that_keeps_killing_its_grader_is_failed_not_retried_forever(service):
    with service.Session.begin() as s:
        teacher = auth.create_user(s, "t3@example.org", "T", PASSWORD, "instructor")
        course = Course(slug="k", title="k", instructor_id=teacher.id, enrolment="open",
                        policy=CoursePolicy.make(["01"]).to_json())
        s.add(course)
        s.flush()
        queue.enqueue(s, course_id=course.id, user_id=teacher.id, lesson="01", content=b"{}", sha256="x", late=False)
    for _ in range(queue.MAX_ATTEMPTS):
        assert queue.claim(service.Session, "w", lease_s=0.001, max_attempts=queue.MAX_ATTEMPTS) is not None
    time.sleep(0.01)
    assert queue.claim(service.Session, "w", lease_s=30) is None
    with service.Session.begin() as s:
        sub = s.scalars(select(Submission)).one()
    assert sub.state == "failed" and "started 3 times" in sub.error


def test_concurrent_claims_on_sqlite_take_each_job_once(service):
    with service.Session.begin() as s:
        teacher = auth.create_user(s, "t4@example.org", "T", PASSWORD, "instructor")
        course = Course(slug="c", title="c", instructor_id=teacher.id, enrolment="open",
                        policy=CoursePolicy.make(["01"]).to_json())
        s.add(course)
        s.flush()
        for _ in range(30):
            queue.enqueue(s, course_id=course.id, user_id=teacher.id, lesson="01", content=b"{}", sha256="x",
                          late=False)
    taken, lock = [], threading.Lock()

    def claimer(name):
        while (job := queue.claim(service.Session, name, lease_s=60)) is not None:
            with lock:
                taken.append(job.submission_id)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == 30 and len(set(taken)) == 30


def test_resubmission_replaces_the_grade_overrides_replace_both_and_deadlines_hold(service):
    """The latest graded upload of a lesson counts (even when it scores less), an instructor's
    override replaces it with its reason, a late upload is marked late or refused by the policy."""
    from parallel_lab.course.grading.runner import Row

    def graded(points):
        job = queue.claim(service.Session, "w", lease_s=30)
        rows = [Row("x", "01", "ring-all-reduce", points > 0, points, 2, ""),
                Row("x", "01", "quiz:01", False, 0, 3, "")]
        assert queue.complete(service.Session, job, rows)

    with TestClient(service.app()) as c1, TestClient(service.app()) as c2:
        teacher = make_course(service, c1)
        ada = Visitor(c2)
        ada.register("Ada", "ada@example.org")
        ada.page("/courses/mp")
        ada.post("/courses/mp/enrol")
        for points in (2, 0):
            ada.page("/courses/mp")
            r = ada.post("/courses/mp/submissions", {"lesson": "01"},
                         files={"notebook": ("01_ranks_and_collectives.ipynb", lesson01(), "application/json")})
            assert r.status_code == 303
            graded(points)
            time.sleep(0.01)  # distinct upload times
        page = ada.page("/courses/mp").text
        assert "0 of 5 points" in page and "latest graded upload" in page and page.count("/submissions/") == 3
        with service.Session.begin() as s:
            ada_id = s.scalars(select(Submission)).first().user_id
        teacher.page("/courses/mp")
        r = teacher.post("/courses/mp/overrides", {"learner": str(ada_id), "check": "01:ring-all-reduce", "points": "9",
                                                   "reason": "regraded"})
        assert r.status_code == 400 and "from 0 to 2" in reason(r)
        teacher.page("/courses/mp")
        r = teacher.post("/courses/mp/overrides", {"learner": str(ada_id), "check": "01:ring-all-reduce", "points": "2",
                                                   "reason": "the ring was right; the grader timed out"})
        assert r.status_code == 303
        assert "2 of 5 points" in ada.page("/courses/mp").text
        assert "the ring was right" in teacher.page("/courses/mp").text
        summary = teacher.c.get("/courses/mp/export/grades-summary.csv").text
        assert _summary_row(summary, "ada@example.org")[:2] == ("2", "5")
        # deadlines: one past, late accepted and marked; another course refuses late uploads
        with service.Session.begin() as s:
            course = s.scalars(select(Course).where(Course.slug == "mp")).one()
            course.policy = CoursePolicy.make(["01"], 0.4, {"01": "2020-01-01T00:00"}, "accept").to_json()
        ada.page("/courses/mp")
        r = ada.post("/courses/mp/submissions", {"lesson": "01"},
                     files={"notebook": ("01_ranks_and_collectives.ipynb", lesson01(), "application/json")})
        assert r.status_code == 303 and "late" in ada.page(r.headers["location"]).text
        with service.Session.begin() as s:
            assert s.scalars(select(Submission).order_by(Submission.submitted_at.desc())).first().late is True
            course = s.scalars(select(Course).where(Course.slug == "mp")).one()
            course.policy = CoursePolicy.make(["01"], 0.4, {"01": "2020-01-01T00:00"}, "refuse").to_json()
        before = counts(service)
        ada.page("/courses/mp")
        r = ada.post("/courses/mp/submissions", {"lesson": "01"},
                     files={"notebook": ("01_ranks_and_collectives.ipynb", lesson01(), "application/json")})
        assert r.status_code == 400 and "the deadline of lesson 01 (2020-01-01T00:00 UTC) has passed" in reason(r)
        assert counts(service) == before


def test_submit_waits_when_the_service_is_busy_and_tries_again(tmp_path, capsys):
    """A full queue (503) or the rate limit (429) stored nothing and says when to come back:
    ``parallel-lab submit`` waits that long and uploads again."""
    import http.server

    from parallel_lab import cli

    answers = [(503, {"error": "the grading queue is full"}), (429, {"error": "too many"}),
               (202, {"id": "s1", "lesson": "01", "state": "queued", "url": "http://x/submissions/s1"})]
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.path, self.headers["Authorization"], len(body)))
            status, body = answers[len(seen) - 1]
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        nb = tmp_path / "01_ranks_and_collectives.ipynb"
        nb.write_bytes(lesson01("student"))
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert cli.main(["submit", str(nb), "--server", url, "--course", "mp", "--lesson", "01", "--token", "plt_x",
                         "--no-wait", "--json"]) == 0
    finally:
        server.shutdown()
    out = capsys.readouterr()
    assert json.loads(out.out)["state"] == "queued" and "trying again in 0 s (2 of 5)" in out.err
    assert [s[:2] for s in seen] == [("/api/courses/mp/submissions", "Bearer plt_x")] * 3


def test_the_submit_report_speaks_the_language_it_is_run_in():
    """``parallel-lab submit``'s report around the grader's reasons (its state, points, passed and
    FAILED) follows $PARALLEL_LAB_LANG; English is as it was."""
    from parallel_lab import i18n
    from parallel_lab.service import client

    report = {"lesson": "02", "state": "graded", "late": True, "points": 1, "max_points": 3,
              "url": "http://x/submissions/s1",
              "checks": [{"check": "g-operator", "passed": False, "reason": "原因", "points": 0, "max_points": 2},
                         {"check": "row-parallel-forward", "passed": True, "points": 1, "max_points": 1}]}
    assert client.describe(report) == ("lesson 02: graded (late), 1 of 3 points\n  g-operator: FAILED: 原因 (0/2)\n"
                                       "  row-parallel-forward: passed (1/1)\n  http://x/submissions/s1")
    with i18n.using("zh-Hant"):
        chinese = client.describe(report)
    assert chinese.splitlines()[:3] == ["第 02 課：已評分（逾期），3 分中得 1 分", "  g-operator：未通過：原因 (0/2)",
                                        "  row-parallel-forward：通過 (1/1)"], chinese


def test_the_similarity_report_lists_two_learners_with_one_answer(service):
    """The instructor's page and similarity.csv show ``course.grading.similarity``'s pairs: two learners
    whose ring is the same answer (written out differently by nobody)."""
    from test_exercises import RING_SOLUTION

    from parallel_lab.course.grading.runner import Row

    with TestClient(service.app()) as c1:
        teacher = make_course(service, c1)
        with service.Session.begin() as s:
            course = s.scalars(select(Course)).one()
            from parallel_lab.service.models import Enrolment
            for name in ("ada", "bob", "cy"):
                user = auth.create_user(s, f"{name}@example.org", name.title(), PASSWORD, "learner")
                s.add(Enrolment(course_id=course.id, user_id=user.id))
                queue.enqueue(s, course_id=course.id, user_id=user.id, lesson="01", content=b"{}", sha256="x",
                              late=False)
        for answer in (RING_SOLUTION, RING_SOLUTION, "def my_ring_all_reduce(t):\n    return t\n"):
            job = queue.claim(service.Session, "w", lease_s=30)
            rows = [Row(job.student, "01_ranks_and_collectives", "ring-all-reduce", True, 2, 2, "",
                        category="exercises", answer=answer, detail="ring all-reduce: PASSED", cases=(5, 5))]
            assert queue.complete(service.Session, job, rows)
        page = teacher.page("/courses/mp").text
        section = page[page.index('id="similarity"'):page.index('id="roster"')]
        assert "ada@example.org" in section and "bob@example.org" in section and "cy@example.org" not in section
        report = teacher.c.get("/courses/mp/export/similarity.csv").text.splitlines()
        assert len(report) == 2 and "ring-all-reduce" in report[1] and "ada@example.org" in report[1]


def test_a_course_takes_the_rest_of_its_grading_policy_as_yaml(service):
    with TestClient(service.app()) as c1:
        teacher = Visitor(c1)
        teacher.login("lin@example.org")

        def create(slug, rules):
            teacher.page("/courses/new")
            return teacher.c.post("/courses/new", follow_redirects=False, data={
                "form_token": teacher.token, "title": "T", "slug": slug, "threshold": "50", "enrolment": "open",
                "late": "accept", "lessons": ["01"], "rules": rules})

        rules = "weights:\n  exercises: 1\n  quizzes: 0\ncredit:\n  exercises: partial\n"
        assert create("weighted", rules).status_code == 303
        with service.Session.begin() as s:
            policy = CoursePolicy.from_json(s.scalars(select(Course).where(Course.slug == "weighted")).one().policy)
        assert policy.rules.weights["quizzes"] == 0 and policy.threshold == 0.5
        r = create("broken", "weights:\n  homework: 1\n")
        assert r.status_code == 400 and "the grading policy is wrong" in reason(r) and "homework" in reason(r)
        assert create("notyaml", "weights: [1, 2").status_code == 400
