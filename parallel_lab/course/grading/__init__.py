"""Grading submitted notebooks: ``reference`` (which cells are graded), ``runner`` (one submission),
``gradebook`` (many submissions: the CSV and the feedback), ``plugin`` (inside the nbval process)."""
