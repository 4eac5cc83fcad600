"""The web application: a Starlette app over the service's database, pages from Jinja2 templates.

    service = Service(Config(data_dir=Path("course-data")))      # database, key, secret, workers
    app = service.app()                                          # uvicorn.run(app, ...)

``Config`` holds every limit. ``Service`` opens the database (``db.connect``), loads or makes the
issuer key and the session secret in the data folder (mode 0600), and owns the grading pool of this
process (``jobs`` workers; 0 when separate ``serve --worker`` processes grade). The routes and what
each page does are in ``views``; this module holds what every request shares: the session, the
language, rendering, refusals, the body-size limit and security headers.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from parallel_lab.service import auth, credentials, db, pages
from parallel_lab.service import grading as grading_adapter
from parallel_lab.service.worker import Pool, Settings

UPLOAD_LIMIT = 2 * 2**20  # a lesson notebook with its outputs is 50-900 kB


@dataclass
class Config:
    data_dir: Path
    db_url: str | None = None  # default: SQLite in data_dir/service.db
    base_url: str = "http://127.0.0.1:8000"
    issuer: str = "parallel-lab course service"
    jobs: int = 1  # grading workers in this process
    upload_limit: int = UPLOAD_LIMIT
    queue_limit: int = 200  # submissions waiting at most; beyond: 503, nothing stored
    uploads_per_minute: int = 10  # per learner; beyond: 429, nothing stored
    https_only: bool = False
    worker: Settings = field(default_factory=Settings)

    @property
    def url(self) -> str:
        return self.db_url or f"sqlite:///{(Path(self.data_dir) / 'service.db').resolve()}"


def private_file(path: Path, make) -> bytes:
    """The content of ``path``, made with ``make()`` and mode 0600 when missing."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(make())
    return path.read_bytes()


def data_folder(config: Config) -> Path:
    """The service's folder, made (mode 0700) when missing."""
    data = Path(config.data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    os.chmod(data, 0o700)
    return data


class Service:
    def __init__(self, config: Config, pool: bool = True):
        self.config = config
        data = data_folder(config)
        self.engine = db.connect(config.url)
        self.Session = db.sessions(self.engine)
        self.key = credentials.issuer_key(data / "keys")
        self.status = credentials.StatusList(f"{config.base_url}/status/1", self.key)
        self.secret = private_file(data / "session.secret", lambda: secrets.token_hex(32).encode()).decode()
        self.lessons = grading_adapter.catalog(config.worker.lessons_dir)
        # the sandbox hides the whole data folder: database, key, secret
        config.worker.hidden = tuple(dict.fromkeys([*config.worker.hidden, str(data)]))
        self.pool = Pool(self.Session, config.worker, config.jobs) if pool and config.jobs > 0 else None

    def app(self) -> Starlette:
        from parallel_lab.service import views

        @contextlib.asynccontextmanager
        async def lifespan(app):
            if self.pool:
                self.pool.start()
            try:
                yield
            finally:
                if self.pool:
                    self.pool.stop()

        middleware = [Middleware(SecurityHeaders), Middleware(BodyLimit, limit=self.config.upload_limit + 2**16),
                      Middleware(SessionMiddleware, secret_key=self.secret, session_cookie="pl_session",
                                 same_site="lax", https_only=self.config.https_only)]
        app = Starlette(routes=views.routes(), middleware=middleware, lifespan=lifespan,
                        exception_handlers={auth.Refused: refused})
        app.state.service = self
        return app


# --- what every request shares ----------------------------------------------------------------------

def service_of(request: Request) -> Service:
    return request.app.state.service


def session_id(request: Request) -> str:
    """The browser's session id (made on its first visit; signed in or not)."""
    sid = request.session.get("sid")
    if not isinstance(sid, str) or len(sid) > 64:
        sid = request.session["sid"] = auth.new_session_id()
    return sid


def locale(request: Request) -> str:
    return pages.negotiate(request.cookies.get("lang"), request.headers.get("accept-language"))


def wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return request.url.path.startswith("/api/") or ("application/json" in accept and "text/html" not in accept)


def render(request: Request, s, name: str, status: int = 200, **context) -> HTMLResponse:
    """Template ``name`` in the request's language. ``form_token()`` in a template makes (once per
    page) the one-time token its forms carry, in ``s``'s transaction."""
    lang = locale(request)
    made = []

    def form_token():
        if not made:
            made.append(auth.form_token(s, session_id(request)))
        return made[0]

    path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    html = pages.environment(lang).get_template(name).render(
        request=request, lang=lang, languages=pages.NAMES, here=path, form_token=form_token, **context)
    return HTMLResponse(html, status_code=status)


async def refused(request: Request, exc: auth.Refused) -> Response:
    headers = {"Retry-After": "30"} if exc.status in (429, 503) else None
    if wants_json(request):
        return JSONResponse({"error": exc.reason}, status_code=exc.status, headers=headers)

    def page():
        service = service_of(request)
        with service.Session.begin() as s:
            user = auth.session_user(s, request.session.get("sid"))
            reason = exc.translated(pages.translator(locale(request)))
            return render(request, s, "error.html", exc.status, user=user, reason=reason)
    response = await run_in_threadpool(page)
    if headers:
        response.headers.update(headers)
    return response


class BodyLimit:
    """Refuse (413) a request whose body is over ``limit`` bytes, before reading more of it."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._too_large(scope, send)
        seen = 0

        async def counting():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise auth.Refused(413, auth.N_("the request is over %(limit)s bytes"), limit=format(self.limit, ","))
            return message

        try:
            await self.app(scope, counting, send)
        except auth.Refused:
            await self._too_large(scope, send)

    async def _too_large(self, scope, send):
        body = json.dumps({"error": f"the request is over {self.limit:,} bytes (a notebook may have at most "
                                    f"{self.limit - 2**16:,})"}).encode()
        response = PlainTextResponse(body, status_code=413, media_type="application/json")
        await response({"type": "http"}, None, send)


class SecurityHeaders:
    HEADERS = [(b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"),
               (b"referrer-policy", b"same-origin"),
               (b"content-security-policy", b"default-src 'self'; style-src 'self'; form-action 'self'; "
                                            b"frame-ancestors 'none'")]

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        async def with_headers(message):
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + self.HEADERS
            await send(message)
        await self.app(scope, receive, with_headers)
