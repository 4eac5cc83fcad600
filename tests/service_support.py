"""Helpers for the course service's tests: lesson-01 notebooks, a service process on a free loopback
port (started, killed with SIGKILL, started again), learners and tokens made in its database, and a
throw-away PostgreSQL cluster (Debian's postgresql, run as the ``postgres`` user when we are root).

    with ServiceProcess(data_dir, ["--jobs", "1"]) as server: ...
    with PostgresCluster(tmp) as pg: pg.url
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import nbformat
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import build_lessons  # noqa: E402
from browser_support import free_port, in_ci, wait_for  # noqa: E402

LESSON01 = ROOT / "lessons" / "src" / "01_ranks_and_collectives.py"
LOGS = ROOT / "artifacts" / "service"


def lesson01(edition: str = "solutions") -> bytes:
    """Lesson 01 as a learner would upload it: the solution edition has a correct ring (its quiz
    sheet left empty); the student edition is the untouched stub."""
    return nbformat.writes(build_lessons.notebook(LESSON01, edition)).encode()


def exe() -> str:
    return str(Path(sys.executable).with_name("parallel-lab"))


class ServiceProcess:
    """``parallel-lab serve`` (or ``serve --worker``) as a child process with its own session."""

    def __init__(self, data_dir: Path, extra=(), worker: bool = False, port: int | None = None, name: str = "serve"):
        self.data_dir, self.extra, self.worker = Path(data_dir), list(extra), worker
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = name
        self.process = None
        self.seen: dict[int, psutil.Process] = {}

    def command(self) -> list[str]:
        cmd = [exe(), "serve", "--data", str(self.data_dir), *self.extra]
        return cmd + ["--worker"] if self.worker else cmd + ["--port", str(self.port)]

    def start(self, timeout: float = 60) -> "ServiceProcess":
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log = open(LOGS / f"{self.name}.log", "a")
        self.process = subprocess.Popen(self.command(), stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if not self.worker:
            wait_for(self.ready, timeout, 0.25, f"{self.name} up at {self.url}")
        return self

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited ({self.process.returncode}):\n{self.log_text()}")
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def log_text(self) -> str:
        self.log.flush()
        return (LOGS / f"{self.name}.log").read_text()[-4000:]

    def remember(self) -> None:
        try:
            root = psutil.Process(self.process.pid)
            for p in [root, *root.children(recursive=True)]:
                self.seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass

    def kill(self) -> None:
        """SIGKILL the service process alone, as a crash would (its sandboxed jobs are orphaned)."""
        self.remember()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process is None:
            return
        self.remember()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for p in self.seen.values():  # orphaned sandbox jobs of a killed service: ours to end
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    p.kill()
            except psutil.Error:
                pass
        self.log.close()
        self.process = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def api_upload(url: str, token: str, course: str, lesson: str, content: bytes, filename: str) -> tuple[int, dict]:
    from parallel_lab.service import client

    body, kind = client._multipart({"lesson": lesson}, filename, content)
    request = urllib.request.Request(f"{url}/api/courses/{course}/submissions", data=body, method="POST",
                                     headers={"Content-Type": kind, "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def setup_course(url: str, learners: int, slug: str = "demo", threshold: float = 0.4, lessons=("01",),
                 enrolment: str = "open") -> dict:
    """An instructor, a course and ``learners`` enrolled learners with API tokens, made in the
    database at ``url`` with the service's own functions; {"tokens": [...], "course": slug}."""
    from parallel_lab.service import auth, db
    from parallel_lab.service.grading import CoursePolicy
    from parallel_lab.service.models import Course, Enrolment

    engine = db.connect(url)
    tokens = []
    with db.sessions(engine).begin() as s:
        teacher = auth.create_user(s, f"teacher-{slug}@example.org", "Teacher", "a-long-password", "instructor")
        course = Course(slug=slug, title="Model parallelism", instructor_id=teacher.id, enrolment=enrolment,
                        policy=CoursePolicy.make(list(lessons), threshold).to_json())
        s.add(course)
        s.flush()
        for i in range(learners):
            user = auth.create_user(s, f"learner{i}-{slug}@example.org", f"Learner {i}", "a-long-password", "learner")
            s.add(Enrolment(course_id=course.id, user_id=user.id))
            tokens.append(auth.new_api_token(s, user))
    engine.dispose()
    return {"tokens": tokens, "course": slug}


def require_bwrap() -> None:
    """The service grades only in bubblewrap: skip without it, except under CI (.ci/run installs it)."""
    import pytest

    from parallel_lab.course.grading.sandbox import Sandbox

    box = Sandbox.detect()
    if box.kind != "bwrap":
        (pytest.fail if in_ci() else pytest.skip)(f"the course service grades only in bubblewrap: {box.missing}")


def initdb_path() -> str | None:
    found = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))[::-1]), None)
    return found


class PostgresCluster:
    """A fresh PostgreSQL cluster in a temporary folder, on a free loopback port, trust
    authentication for loopback only; stopped and removed at exit. As root it runs as ``postgres``."""

    def __init__(self):
        self.initdb = initdb_path()
        if self.initdb is None:
            raise FileNotFoundError("PostgreSQL's initdb is not installed (Debian: apt-get install postgresql)")
        self.bindir = Path(self.initdb).parent
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_owner(self, argv) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *argv]
        return list(argv)

    def __enter__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="pl-postgres-", dir="/var/tmp"))
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        data = self.dir / "data"
        subprocess.run(self._as_owner([self.initdb, "-D", str(data), "-U", "postgres", "--auth=trust",
                                       "--no-sync", "-E", "UTF8"]), check=True, capture_output=True, timeout=120)
        options = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.dir} " \
                  f"-c fsync=off -c max_connections=100"
        subprocess.run(self._as_owner([str(self.bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l",
                                       str(self.dir / "log"), "-w", "start"]), check=True, capture_output=True,
                       timeout=120)
        return self

    def __exit__(self, *exc):
        subprocess.run(self._as_owner([str(self.bindir / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate",
                                       "stop"]), capture_output=True, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


def postgres_or_skip():
    """A PostgresCluster; skipped where PostgreSQL is missing, a failure under CI (.ci/run installs it)."""
    import pytest

    if initdb_path() is None:
        (pytest.fail if in_ci() else pytest.skip)("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    return PostgresCluster()
