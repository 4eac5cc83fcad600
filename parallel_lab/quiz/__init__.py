"""Auto-graded quizzes: one bank per lesson plus the FAQ quiz (``quizzes/*.yaml``, data not code).

    from parallel_lab.quiz import quiz, show, answer, check_quiz
    quiz("01")                          # the widget: instant feedback, score, retry (JupyterLab)
    show("01")                          # the same questions as text, where widgets do not render
    answer("01", "ring-bytes", 112)     # text mode: feedback on one answer
    check_quiz("01", my_answers)        # the graded verdict (deterministic; nbval compares it)
    quiz("faq", lang="zh-Hant")         # the FAQ quiz, in English or Traditional Chinese

Modules: ``bank`` (loading), ``answers`` (computed answers of parametrised items), ``check``
(feedback and scores), ``validate`` (schema and invariants), ``text``, ``widget``, ``progress``,
``cli`` (the ``grade`` and ``certificate`` sub-commands).
"""

from .bank import BankError, load, load_all
from .check import feedback, score
from .text import answer, check_quiz, quiz_text, sheet_template, show

__all__ = ["quiz", "show", "answer", "check_quiz", "quiz_text", "sheet_template", "load", "load_all",
           "feedback", "score", "BankError"]


def quiz(lesson: str, lang: str = "en"):
    """The quiz widget of a lesson (``"01"``) or bank (``"faq"``); the text form if ipywidgets is
    missing. Display it as the last expression of a cell."""
    bank = load(str(lesson))
    if lang not in bank.languages:
        raise ValueError(f"quiz {bank.id} is available in {', '.join(bank.languages)}, not {lang!r}")
    try:
        from .widget import QuizBox
    except ImportError:
        show(bank, lang)
        return None
    return QuizBox(bank, lang)
