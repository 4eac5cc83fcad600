"""The course service, ``parallel-lab serve``: learners upload lesson notebooks, workers grade them
with the course's sandboxed grader, and learners who meet a course's threshold get a credential
that anyone can check at ``/credentials/<id>``.

- ``models``: the tables (SQLAlchemy 2 ORM), ``db``: engines for SQLite (a file, the default) and
  PostgreSQL (psycopg 3), the schema (``create_all``, versioned);
- ``queue``: the grading queue in the database (claim with a lease, renew, complete, fenced by the
  run that holds the lease); ``worker``: the pool of grading workers (``serve --worker`` alone);
- ``grading``: the thin adapter to ``course.grading`` (lessons, policy, standing, exports),
  ``credentials``: the thin adapter to the course's credentials (issue, verify, status list);
- ``auth``: passwords (argon2id), sessions, one-time form tokens, API tokens;
- ``pages``: the request's language (English, Traditional Chinese) and the templates' Jinja2
  environments, translated with the course's catalog (``parallel_lab.i18n``);
- ``app``: the web application (Starlette, Jinja2 templates), ``client``: ``parallel-lab submit``.
"""
