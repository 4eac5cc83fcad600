"""Grading submitted notebooks: ``reference`` (which checks a lesson grades and their answer cells),
``runner`` (one submission), ``sandbox`` (where its checks run), ``checker`` (the checking process in
the sandbox), ``gradebook`` (many submissions: the CSV, the per-student summary, the feedback)."""
