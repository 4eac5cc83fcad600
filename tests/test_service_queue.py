"""The course service's queue under load and crashes, for real: ``parallel-lab serve`` processes on
loopback, 50 concurrent uploads from 10 learners, the service (or a worker) killed with SIGKILL while
it grades and started again. Every upload is stored, and graded exactly once: one ``graded`` run and
one set of verdicts per submission, the killed run recorded as ``lost``. Then the same with
PostgreSQL and two ``serve --worker`` processes sharing the queue (``SELECT ... FOR UPDATE SKIP
LOCKED``).

Each learner uploads one lesson-01 notebook with a correct ring (graded on real ranks in the
sandbox, ~3 s) and four untouched student editions (graded at once from their source: the stub)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from parallel_lab.service import db
from parallel_lab.service.models import CheckResult, GradingRun, Submission, Upload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service_support import (  # noqa: E402
    ServiceProcess,
    api_upload,
    exe,
    lesson01,
    postgres_or_skip,
    require_bwrap,
    setup_course,
    wait_for,
)

LEARNERS, PER_LEARNER = 10, 5


def upload_all(url: str, course: dict) -> dict:
    """50 uploads at once (one thread each, released together); submission id -> sha256 sent."""
    good, stub = lesson01("solutions"), lesson01("student")
    jobs = [(token, good if k == 0 else stub) for token in course["tokens"] for k in range(PER_LEARNER)]
    barrier, results, lock = threading.Barrier(len(jobs)), {}, threading.Lock()

    def one(token, content):
        barrier.wait()
        status, body = api_upload(url, token, course["course"], "01", content, "01_ranks_and_collectives.ipynb")
        with lock:
            results[body.get("id", f"refused-{len(results)}")] = (status, hashlib.sha256(content).hexdigest(),
                                                                 content is good, body)

    threads = [threading.Thread(target=one, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = [body for status, _, _, body in results.values() if status != 202]
    assert refused == [], refused
    assert len(results) == LEARNERS * PER_LEARNER
    return results


def grading_now(Session, good_ids, worker_part: str = "") -> bool:
    """A correct-ring submission is being graded (by a worker whose name contains ``worker_part``)."""
    with Session.begin() as s:
        runs = s.scalars(select(GradingRun).where(GradingRun.outcome.is_(None),
                                                  GradingRun.submission_id.in_(good_ids))).all()
        return any(worker_part in r.worker for r in runs)


def all_done(Session) -> bool:
    with Session.begin() as s:
        return all(sub.state in ("graded", "failed") for sub in s.scalars(select(Submission)))


def check_graded_once(Session, sent: dict) -> Counter:
    """Every upload stored as sent and graded exactly once; the runs' outcomes."""
    with Session.begin() as s:
        subs = {sub.id: sub for sub in s.scalars(select(Submission))}
        assert set(subs) == set(sent)
        for sid, sub in subs.items():
            status, digest, good, _ = sent[sid]
            assert sub.state == "graded", (sid, sub.state, sub.error)
            upload = s.get(Upload, sub.upload_id)
            assert hashlib.sha256(upload.content).hexdigest() == digest == upload.sha256
            checks = {c.check: c for c in s.scalars(select(CheckResult).where(CheckResult.submission_id == sid))}
            assert sorted(checks) == ["quiz:01", "ring-all-reduce"]  # one set of verdicts, no duplicate
            assert s.scalars(select(CheckResult).where(CheckResult.submission_id == sid)).all().__len__() == 2
            assert checks["ring-all-reduce"].passed is good, checks["ring-all-reduce"].reason
            assert sub.points == (2 if good else 0)
        runs = s.scalars(select(GradingRun)).all()
        graded = Counter(r.submission_id for r in runs if r.outcome == "graded")
        assert set(graded) == set(sent) and set(graded.values()) == {1}
        assert all(r.outcome in ("graded", "lost") for r in runs), Counter(r.outcome for r in runs)
        return Counter(r.outcome for r in runs)


@pytest.mark.ranks
@pytest.mark.timeout(1200)
def test_fifty_uploads_a_sigkill_and_a_restart_on_sqlite(tmp_path):
    require_bwrap()
    data = tmp_path / "data"
    url = f"sqlite:///{data / 'service.db'}"
    data.mkdir()
    course = setup_course(url, LEARNERS)
    engine = db.connect(url)
    Session = db.sessions(engine)
    server = ServiceProcess(data, ["--jobs", "2", "--lease", "5"], name="sqlite-serve")
    try:
        server.start()
        sent = upload_all(server.url, course)
        good_ids = [sid for sid, (_, _, good, _) in sent.items() if good]
        wait_for(lambda: grading_now(Session, good_ids), 300, 0.05, "a correct ring being graded")
        server.kill()
        with Session.begin() as s:
            states = Counter(sub.state for sub in s.scalars(select(Submission)))
        assert states["grading"] >= 1 and sum(states.values()) == 50, states
        server.start()
        wait_for(lambda: all_done(Session), 900, 1, "every submission graded after the restart")
        outcomes = check_graded_once(Session, sent)
        assert outcomes["lost"] >= 1 and outcomes["graded"] == 50, outcomes
        # parallel-lab submit, from the command line, against the same service
        token = course["tokens"][0]
        nb = tmp_path / "01_ranks_and_collectives.ipynb"
        nb.write_bytes(lesson01("solutions"))
        out = subprocess.run([exe(), "submit", str(nb), "--server", server.url, "--course", course["course"],
                              "--lesson", "01", "--token", token, "--json"], capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["state"] == "graded" and report["points"] == 2
        assert [(c["check"], c["passed"]) for c in report["checks"]] == [("ring-all-reduce", True), ("quiz:01", False)]
        bad = subprocess.run([exe(), "submit", str(nb), "--server", server.url, "--course", course["course"],
                              "--lesson", "07", "--token", token], capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and "lesson '07' is not graded in this course" in bad.stderr
    finally:
        server.stop()
        engine.dispose()


@pytest.mark.ranks
@pytest.mark.timeout(1200)
def test_postgresql_with_two_workers_and_one_killed(tmp_path):
    require_bwrap()
    with postgres_or_skip() as pg:
        web = ServiceProcess(tmp_path / "web", ["--db", pg.url, "--jobs", "0"], name="pg-web")
        workers = [ServiceProcess(tmp_path / f"worker{i}", ["--db", pg.url, "--jobs", "1", "--lease", "5"],
                                  worker=True, name=f"pg-worker{i}") for i in range(2)]
        engine = None
        try:
            for w in workers:  # all three at once on the empty database: one of them makes the schema
                w.start()
            web.start()
            course = setup_course(pg.url, LEARNERS)
            engine = db.connect(pg.url)
            Session = db.sessions(engine)
            sent = upload_all(web.url, course)
            good_ids = [sid for sid, (_, _, good, _) in sent.items() if good]
            victim = workers[0]
            wait_for(lambda: grading_now(Session, good_ids, f":{victim.process.pid}:"), 300, 0.05,
                     "worker 0 grading a correct ring")
            victim.kill()
            time.sleep(1)
            victim.start()
            wait_for(lambda: all_done(Session), 900, 1, "every submission graded by the two workers")
            outcomes = check_graded_once(Session, sent)
            assert outcomes["lost"] >= 1 and outcomes["graded"] == 50, outcomes
            with Session.begin() as s:
                by_process = Counter(r.worker.split(":")[1] for r in s.scalars(select(GradingRun))
                                     if r.outcome == "graded")
            assert len(by_process) >= 2, by_process  # the queue was shared
        finally:
            for w in workers:
                w.stop()
            web.stop()
            if engine is not None:
                engine.dispose()
