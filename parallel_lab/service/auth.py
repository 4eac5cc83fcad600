"""Who is asking: passwords, sessions, one-time form tokens, command-line tokens.

- **Passwords** are hashed with argon2id (argon2-cffi's defaults: 64 MiB, 3 passes), never stored.
- **Sessions**: the cookie (Starlette's ``SessionMiddleware``: signed with the service's secret,
  HttpOnly, SameSite=Lax, Secure behind ``--https-only``) holds only a random session id. A signed-in
  session is a ``LoginSession`` row: signing out deletes it, so a copied cookie dies with it; signing
  in makes a new id (no session fixation). A forged cookie fails its signature and is ignored.
- **Forms**: every page that shows a form makes one ``FormToken`` bound to the session id; a POST
  must carry it, unused, from the same session (``consume``), in the same transaction as what the form
  does. So a form from another site (CSRF) or a replayed one changes nothing.
- **API tokens** (``parallel-lab submit``): shown once, stored as SHA-256, sent as ``Authorization:
  Bearer``. A bearer token is not sent by a browser on its own, so those requests need no form token.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import delete, func, select

from parallel_lab.service.models import ApiToken, FormToken, LoginAttempt, LoginSession, User, now

HASHER = PasswordHasher()  # argon2id
SESSION_DAYS = 14
FORM_TOKEN_HOURS = 12
MIN_PASSWORD = 10
FAILED_LOGINS = 10  # per email in LOGIN_WINDOW, then sign-in waits
LOGIN_WINDOW = dt.timedelta(minutes=15)


def N_(message: str) -> str:
    """Marks a message for the catalog (Babel's no-op keyword); translated where it is shown."""
    return message


class Refused(ValueError):
    """A request refused, with an HTTP status and the reason: ``message`` is a gettext message (its
    ``%(name)s`` filled from ``values``), translated on the page (``translated``), English in logs."""

    def __init__(self, status: int, message: str, **values):
        super().__init__(message % values if values else message)
        self.status, self.message, self.values = status, message, values

    @property
    def reason(self) -> str:
        return str(self)

    def translated(self, gettext) -> str:
        return gettext(self.message) % self.values if self.values else gettext(self.message)


def hash_password(password: str) -> str:
    if len(password) < MIN_PASSWORD:
        raise Refused(400, N_("a password needs at least %(least)s characters, got %(got)s"), least=MIN_PASSWORD,
                      got=len(password))
    return HASHER.hash(password)


def password_ok(stored: str, password: str) -> bool:
    try:
        return HASHER.verify(stored, password)
    except (VerificationError, InvalidHashError):
        return False


def normal_email(email: str) -> str:
    email = email.strip().lower()
    if "@" not in email or len(email) > 254 or any(c.isspace() for c in email):
        raise Refused(400, N_("not an e-mail address: %(email)r"), email=email[:60])
    return email


def new_session_id() -> str:
    return secrets.token_urlsafe(32)


def create_user(s, email: str, name: str, password: str, role: str) -> User:
    email = normal_email(email)
    if role not in ("instructor", "learner"):
        raise ValueError(f"role must be instructor or learner, got {role!r}")
    if not name.strip():
        raise Refused(400, N_("a name is needed (it is printed on the credential)"))
    if s.scalar(select(User.id).where(User.email == email)) is not None:
        raise Refused(400, N_("%(email)s already has an account: sign in"), email=email)
    user = User(email=email, name=" ".join(name.split())[:200], password_hash=hash_password(password), role=role)
    s.add(user)
    s.flush()
    return user


def sign_in(s, email: str, password: str) -> User:
    """The user with these credentials; Refused after too many failed attempts or on a mismatch."""
    email = normal_email(email)
    recent = s.scalar(select(func.count()).select_from(LoginAttempt)
                      .where(LoginAttempt.email == email, LoginAttempt.at > now() - LOGIN_WINDOW))
    if recent >= FAILED_LOGINS:
        raise Refused(429, N_("%(count)s failed sign-ins for this address in %(minutes)s minutes: wait, then try "
                              "again"),
                      count=FAILED_LOGINS, minutes=LOGIN_WINDOW.seconds // 60)
    user = s.scalars(select(User).where(User.email == email)).first()
    if user is None or not password_ok(user.password_hash, password):
        s.add(LoginAttempt(email=email))
        raise Refused(401, N_("wrong e-mail address or password"))
    return user


def open_session(s, user: User) -> str:
    sid = new_session_id()
    s.add(LoginSession(id=sid, user_id=user.id, expires_at=now() + dt.timedelta(days=SESSION_DAYS)))
    return sid


def close_session(s, sid: str | None) -> None:
    if sid:
        s.execute(delete(LoginSession).where(LoginSession.id == sid))


def session_user(s, sid: str | None) -> User | None:
    if not sid:
        return None
    row = s.get(LoginSession, sid)
    if row is None or row.expires_at < now():
        return None
    return s.get(User, row.user_id)


def form_token(s, sid: str) -> str:
    """A new one-time token for the forms of one page, bound to session ``sid``."""
    if secrets.randbelow(50) == 0:  # now and then, forget the expired ones
        s.execute(delete(FormToken).where(FormToken.created_at < now() - dt.timedelta(hours=FORM_TOKEN_HOURS)))
    token = secrets.token_urlsafe(32)
    s.add(FormToken(token=token, session_id=sid))
    return token


def consume(s, sid: str | None, token: str | None) -> None:
    """Use up a form token; Refused (403) when it is missing, unknown, another session's or too old,
    and (409) when it was used already."""
    if not token:
        raise Refused(403, N_("the form has no form token (forms are only accepted from this service's own pages)"))
    row = s.scalars(select(FormToken).where(FormToken.token == token).with_for_update()).first()
    if row is None or not sid or not secrets.compare_digest(row.session_id, sid):
        raise Refused(403, N_("the form's token is not this session's (reload the page and send the form again)"))
    if row.used_at is not None:
        raise Refused(409, N_("this form was already sent once (each form is good for one submission): reload the "
                           "page to send it again"))
    if row.created_at < now() - dt.timedelta(hours=FORM_TOKEN_HOURS):
        raise Refused(403, N_("the form is too old: reload the page and send it again"))
    row.used_at = now()


def new_api_token(s, user: User) -> str:
    token = "plt_" + secrets.token_urlsafe(32)
    s.add(ApiToken(user_id=user.id, token_hash=hashlib.sha256(token.encode()).hexdigest()))
    return token


def api_user(s, header: str | None) -> User | None:
    if not header or not header.startswith("Bearer "):
        return None
    digest = hashlib.sha256(header[len("Bearer "):].strip().encode()).hexdigest()
    row = s.scalars(select(ApiToken).where(ApiToken.token_hash == digest)).first()
    return s.get(User, row.user_id) if row else None
