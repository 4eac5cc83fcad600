"""Starting the service: ``parallel-lab serve`` (web and workers), ``serve --worker`` (workers only),
``serve --create-instructor EMAIL`` (the first instructor's account).

    parallel-lab serve --create-instructor lin@example.edu --name "Prof. Lin"   # asks for a password
    parallel-lab serve                                     # http://127.0.0.1:8000, SQLite in DATA/service.db
    parallel-lab serve --db postgresql://u:pw@db/course --jobs 0 --host 0.0.0.0   # the web process
    parallel-lab serve --db postgresql://u:pw@db/course --worker --jobs 2          # on each grading machine

The data folder (``--data``, default ``$PARALLEL_LAB_HOME/service`` or ``~/.parallel_lab/service``,
mode 0700) holds the SQLite database, the issuer key (``keys/issuer.key``, 0600) and the session
secret (0600); a worker needs none of them but the database.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from sqlalchemy import select

from parallel_lab.service import auth, credentials, db
from parallel_lab.service.app import Config, Service, data_folder
from parallel_lab.service.models import User
from parallel_lab.service.worker import Pool


def default_data_dir() -> Path:
    home = os.environ.get("PARALLEL_LAB_HOME")
    return (Path(home) if home else Path.home() / ".parallel_lab") / "service"


def create_instructor(config: Config, email: str, name: str, password: str) -> str:
    data_folder(config)
    engine = db.connect(config.url)
    try:
        with db.sessions(engine).begin() as s:
            user = auth.create_user(s, email, name or email.split("@")[0], password, "instructor")
            return user.email
    finally:
        engine.dispose()


def run_workers(config: Config, stop: threading.Event | None = None) -> int:
    """Grade until SIGTERM or SIGINT (or ``stop``): ``config.jobs`` workers on the shared queue."""
    data = data_folder(config)
    config.worker.hidden = tuple(dict.fromkeys([*config.worker.hidden, str(data)]))
    engine = db.connect(config.url)
    pool = Pool(db.sessions(engine), config.worker, max(1, config.jobs))
    stop = stop or threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    pool.start()
    print(f"parallel-lab serve --worker: {len(pool.workers)} worker(s) on {engine.url.render_as_string()}",
          file=sys.stderr, flush=True)
    stop.wait()
    pool.stop()
    engine.dispose()
    return 0


def serve(config: Config, host: str, port: int) -> int:
    import uvicorn

    service = Service(config)
    where = service.engine.url.render_as_string(hide_password=True)
    print(f"parallel-lab serve: {config.base_url} (listening on {host}:{port}); database {where}; "
          f"{config.jobs} grading worker(s) here; issuer key {credentials.fingerprint(service.key)}",
          file=sys.stderr, flush=True)
    with service.Session.begin() as s:
        if s.scalar(select(User.id).where(User.role == "instructor").limit(1)) is None:
            print("parallel-lab serve: no instructor account yet: make one with parallel-lab serve --data "
                  f"{config.data_dir} --create-instructor EMAIL --name NAME", file=sys.stderr, flush=True)
    uvicorn.run(service.app(), host=host, port=port, log_level="warning", proxy_headers=False)
    service.engine.dispose()
    return 0
