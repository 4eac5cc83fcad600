"""What a learner has passed so far, as a card in the notebook: their own record, not a credential.

    from parallel_lab.show.progress import my_progress
    my_progress()

The record is ``progress.json`` in the learner's own folder (``parallel_lab.course.quiz.progress``):
anyone can edit it, so it proves nothing to anyone else, and the card says so. A credential that
anyone can verify (Open Badges 3.0, ``parallel_lab.course.credentials``) is issued by whoever grades
the notebooks, with a key the learner does not hold; the card says how to get one.
"""

from __future__ import annotations

import html

from parallel_lab.course.quiz import progress
from parallel_lab.i18n import _


class ProgressCard:
    """The quizzes passed on this computer (``rows``: lesson or bank, bank, points, total, date)."""

    def __init__(self, rows, path):
        self.rows, self.path = rows, path

    def _lines(self) -> list[str]:
        if not self.rows:
            return [_("No quiz passed yet: pass a lesson's quiz (its check cell, or the quiz widget) and it "
                      "is recorded here.")]
        return [_("lesson {lesson}: quiz {bank}, {points:g} of {total:g} points ({date})").format(
            lesson=lesson, bank=bank, points=points, total=total, date=date)
            for lesson, bank, points, total, date in self.rows]

    def _notes(self) -> list[str]:
        return [_("This record is yours, kept in {path}. It shows you what you have done; it is not a "
                  "credential, and it proves nothing to anyone else (anyone can edit it).").format(path=self.path),
                _("A credential that anyone can verify (Open Badges 3.0, signed with your course's key) comes "
                  "from whoever grades your notebooks: hand them in to your instructor, or submit them to the "
                  "course's grading service.")]

    def __str__(self) -> str:
        return "\n".join([_("Your progress on this computer"), *("  " + line for line in self._lines()),
                          *self._notes()])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in self._lines())
        notes = "".join(f"<p>{html.escape(note)}</p>" for note in self._notes())
        return (f'<div style="border:1px solid #999;padding:0.6em 1.2em;max-width:40em">'
                f'<b>{html.escape(_("Your progress on this computer"))}</b><ul>{items}</ul>'
                f'<small>{notes}</small></div>')


def my_progress() -> ProgressCard:
    """The card of every quiz passed on this computer (best score of each), by lesson."""
    rows = []
    for bank, entry in progress.load().items():
        if not isinstance(entry, dict):
            continue  # the learner's own file: whatever else is in it is not a pass
        try:
            points, total = float(entry.get("points", 0)), float(entry.get("total", 0))
        except (TypeError, ValueError):
            continue
        rows.append((str(entry.get("lesson") or bank), str(bank), points, total, str(entry.get("date", ""))))
    return ProgressCard(sorted(rows), progress.home() / "progress.json")
