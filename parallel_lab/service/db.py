"""The service's database: SQLite in a file by default, PostgreSQL by URL (psycopg 3).

    engine = connect("sqlite:///course.db")            # or "postgresql+psycopg://user:pw@host/db"
    Session = sessions(engine)
    with Session.begin() as s: ...

**Transactions.** On SQLite every transaction starts with ``BEGIN IMMEDIATE``: it takes the
database's write lock at once (waiting up to ``busy_timeout``), so two processes never both read
and then both try to write (SQLite's deferred transactions fail at once with "database is locked"
when they do), and claiming a job is one write transaction. The journal is WAL (readers do not
block the writer). On PostgreSQL, claiming uses ``SELECT ... FOR UPDATE SKIP LOCKED`` (see
``queue``): several workers on several machines take different jobs without waiting.

**Schema.** ``create_all`` (no migration tool yet): tables are created when missing, and the
schema's version is kept in ``meta``; a database of another version is refused with a clear
message rather than used half-right.
"""

from __future__ import annotations

from sqlalchemy import create_engine, event, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from parallel_lab.service.models import SCHEMA_VERSION, Base, Meta

SQLITE_BUSY_MS = 60_000
SCHEMA_LOCK = 0x70617261  # the advisory lock held while the schema is made ("para")


class DatabaseError(RuntimeError):
    """The database cannot be used (wrong URL, another schema version)."""


def is_sqlite(engine_or_url) -> bool:
    url = engine_or_url.url if isinstance(engine_or_url, Engine) else engine_or_url
    return str(url).startswith("sqlite")


def connect(url: str) -> Engine:
    """An engine for ``url`` (``sqlite:///PATH`` or ``postgresql+psycopg://...``), tables created
    and the schema's version checked."""
    if url.startswith("postgresql://"):  # psycopg 3, not SQLAlchemy's default psycopg2
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    if is_sqlite(url):
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_MS / 1000, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_connection, record):
            dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(connection):
            connection.exec_driver_sql("BEGIN IMMEDIATE")
    elif url.startswith("postgresql+psycopg://"):
        engine = create_engine(url, pool_pre_ping=True)
    else:
        raise DatabaseError("--db must be sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB, "
                            f"got {url.split(':')[0]}:...")
    init_schema(engine)
    return engine


def sessions(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)


def init_schema(engine: Engine) -> None:
    """Create the tables that are missing; refuse a database of another schema version. One process
    at a time: a web process and workers started together on a new PostgreSQL database would
    otherwise race to create the same tables (an advisory lock; SQLite's write lock)."""
    with engine.begin() as connection:
        if not is_sqlite(engine):
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")
        Base.metadata.create_all(connection)
        s = Session(bind=connection)
        row = s.scalars(select(Meta).where(Meta.key == "schema_version")).first()
        if row is None:
            s.add(Meta(key="schema_version", value=str(SCHEMA_VERSION)))
            s.flush()
        elif row.value != str(SCHEMA_VERSION):
            raise DatabaseError(f"the database has schema version {row.value}, this service needs "
                                f"{SCHEMA_VERSION}: use a new database or the service's version that made it")
