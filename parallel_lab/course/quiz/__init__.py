"""Auto-graded quizzes: one bank per lesson plus the FAQ quiz (``quizzes/*.yaml``, data not code).

    from parallel_lab.course.quiz import show, answer, check_quiz
    show("01")                          # the questions as text (the widget: parallel_lab.show.quizbox)
    answer("01", "ring-bytes", 112)     # text mode: feedback on one answer
    check_quiz("01", my_answers)        # the graded verdict (deterministic; nbval compares it)
    show("faq", lang="zh-Hant")         # the FAQ quiz, in English or Traditional Chinese

Modules: ``bank`` (loading), ``answers`` (computed answers of parametrised items), ``check``
(feedback and scores), ``validate`` (schema and invariants), ``text``, ``progress``. The widget is
``parallel_lab.show.quizbox``; the ``grade`` and ``certificate`` commands are in ``parallel_lab.cli``.
"""

from .bank import BankError, load, load_all
from .check import feedback, score
from .text import answer, check_quiz, quiz_text, sheet_template, show

__all__ = ["show", "answer", "check_quiz", "quiz_text", "sheet_template", "load", "load_all",
           "feedback", "score", "BankError"]
