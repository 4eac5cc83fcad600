"""Auto-graded quizzes: one bank per lesson plus the FAQ quiz (``quizzes/*.yaml``, data not code).

    from parallel_lab.course.quiz import show, answer, graded_quiz, check_quiz
    show("01")                          # practice: the questions as text (the widget: parallel_lab.show.quizbox)
    answer("01", "ring-bytes", 112)     # practice: feedback on one answer
    graded_quiz("01", "s1234567")       # the student's graded quiz (own option order, own numbers)
    check_quiz("01", my_answers, "s1234567")   # the graded check: points, not which answers are wrong
    show("faq", lang="zh-Hant")         # the FAQ quiz, in English or Traditional Chinese

Modules: ``bank`` (loading), ``answers`` (computed answers of parametrised items), ``check``
(feedback and scores), ``variant`` (each student's graded quiz), ``seal`` (the students' release:
keys as salted hashes), ``validate`` (schema and invariants), ``text``, ``progress``. The widget is
``parallel_lab.show.quizbox``; the ``grade`` and ``certificate`` commands are in ``parallel_lab.cli``.
"""

from .bank import BankError, load, load_all
from .check import feedback, score
from .text import answer, check_quiz, graded_quiz, quiz_text, sheet_template, show

__all__ = ["show", "answer", "check_quiz", "graded_quiz", "quiz_text", "sheet_template", "load", "load_all",
           "feedback", "score", "BankError"]
