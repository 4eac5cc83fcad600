"""The practice quiz (ipywidgets): instant feedback with the explanation, a live score, retry and a
language switch for bilingual banks. What a student hands in is the graded quiz drawn for their
student id (``course.quiz.variant``: the same questions, the options in another order, other
numbers), answered in the notebook's answer sheet, so the widget offers no sheet to paste.

What reaches the browser: prompts, option labels, the student's own choices and the feedback on
them. The widget is built from ``PublicItem`` views that carry no answer, explanation or hint, and
every check calls back into the kernel (``parallel_lab.course.quiz.check.feedback``), so the widget
state JupyterLab or nbclient save into a notebook's metadata holds no answer key (tests/test_quizzes.py
inspects that state). In the students' release the kernel holds no readable key either: the banks
are sealed (``course.quiz.seal``) and feedback comes from salted hashes. Where widgets do not
render, the text form is shown instead (``text/plain``).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import ipywidgets as widgets
from ipywidgets.widgets.widget_bool import CheckboxStyle
from ipywidgets.widgets.widget_description import DescriptionStyle
from ipywidgets.widgets.widget_string import HTMLStyle, LabelStyle, TextStyle

from parallel_lab.course.quiz import progress
from parallel_lab.course.quiz.bank import LANGUAGES, Bank, Item, load, localize
from parallel_lab.course.quiz.check import feedback, score
from parallel_lab.course.quiz.text import kind_note, quiz_text
from parallel_lab.i18n import _l, language, using

COLOURS = {"correct": "#1a7f37", "wrong": "#b35900", "invalid": "#b35900", "unanswered": "#555"}
# The widget's own words: the library's catalog (parallel_lab.i18n), in the language the switch shows.
LABELS = {
    "check": _l("Check"), "retry": _l("Try again"), "number": _l("a number"),
    "score": _l("Score: {points} of {total} points (pass mark {needed})"),
    "passed": _l("Passed! It is recorded on this computer: <code>my_progress()</code> (from "
                 "parallel_lab.show.progress) lists what you have passed. A credential anyone can verify comes from "
                 "whoever grades your notebook: hand it in, or submit it to the course's grading service."),
    "title": _l("Quiz: {title}"),
}


@dataclass(frozen=True)
class PublicItem:
    """What the browser may see of an item: no answer, no explanation, no hint."""

    id: str
    kind: str
    points: float
    unit: dict      # lang -> the numeric answer's unit ("" when none)
    prompt: dict    # lang -> prompt with parameters filled in
    options: tuple  # ((key, {lang: text}), ...)


def public_item(item: Item, languages) -> PublicItem:
    return PublicItem(item.id, item.kind, item.points, {lang: item.unit_text(lang) for lang in languages},
                      {lang: item.prompt_text(lang) for lang in languages},
                      tuple((o.key, {lang: localize(o.text, lang) for lang in languages}) for o in item.options))


def _label(lang: str, key: str, **fields) -> str:
    with using(lang):
        return str(LABELS[key]).format(**fields)


class Shared:
    """One Layout and one Style model per kind, shared by every widget of a quiz: the saved widget
    state (and the notebook) stays small -- a quiz has a hundred widgets."""

    def __init__(self):
        self._made = {}

    def __call__(self, cls, **traits):
        key = (cls, tuple(sorted(traits.items())))
        if key not in self._made:
            self._made[key] = cls(**traits)
        return self._made[key]

    def kw(self, style_cls, **layout) -> dict:
        return {"layout": self(widgets.Layout, **layout), "style": self(style_cls)}


class ItemView:
    """The widgets of one question; ``response()`` reads the student's current answer."""

    def __init__(self, item: PublicItem, number: int, on_check, shared: Shared):
        self.item, self.number, self.status = item, number, "unanswered"
        html_kw = shared.kw(HTMLStyle)
        self.prompt = widgets.HTML(**html_kw)
        if item.kind == "single":
            self.choice = widgets.RadioButtons(options=[(k, k) for k, _ in item.options], value=None,
                                               **shared.kw(DescriptionStyle, width="auto"))
            self.input = self.choice
        elif item.kind == "multiple":
            self.boxes = [widgets.Checkbox(value=False, indent=False, **shared.kw(CheckboxStyle, width="auto"))
                          for _ in item.options]
            self.input = widgets.VBox(self.boxes, layout=shared(widgets.Layout))
        else:
            self.number_box = widgets.Text(**shared.kw(TextStyle, width="12em"))
            self.unit = widgets.Label(**shared.kw(LabelStyle))
            self.input = widgets.HBox([self.number_box, self.unit],
                                      layout=shared(widgets.Layout))
        self.check_button = widgets.Button(button_style="primary", **shared.kw(widgets.ButtonStyle))
        self.retry_button = widgets.Button(**shared.kw(widgets.ButtonStyle))
        self.feedback = widgets.HTML(**html_kw)
        self.check_button.on_click(lambda _: on_check(self))
        self.retry_button.on_click(lambda _: self.reset())
        buttons = widgets.HBox([self.check_button, self.retry_button], layout=shared(widgets.Layout))
        self.box = widgets.VBox([self.prompt, self.input, buttons, self.feedback],
                                layout=shared(widgets.Layout, margin="0 0 1em 0"))
        # CSS classes the browser test (tests/browser_support.py, HOOKS) finds them by.
        self.box.add_class("pl-quiz")
        self.feedback.add_class("pl-quiz-feedback")

    def set_language(self, lang: str) -> None:
        item = self.item
        note = kind_note(item.kind, lang)
        self.prompt.value = (f"<b>Q{self.number}</b> <small>({html.escape(note)})</small> "
                             f"{html.escape(item.prompt.get(lang) or item.prompt['en'])}")
        labels = [f"({k}) {texts.get(lang) or texts['en']}" for k, texts in item.options]
        if item.kind == "single":
            value = self.choice.value
            self.choice.options = list(zip(labels, [k for k, _ in item.options]))
            self.choice.value = value
        elif item.kind == "multiple":
            for box, label in zip(self.boxes, labels):
                box.description = label
        else:
            self.number_box.placeholder = _label(lang, "number")
            self.unit.value = item.unit.get(lang) or item.unit.get("en", "")
        self.check_button.description = _label(lang, "check")
        self.retry_button.description = _label(lang, "retry")

    def response(self):
        if self.item.kind == "single":
            return self.choice.value
        if self.item.kind == "multiple":
            return [k for (k, _), box in zip(self.item.options, self.boxes) if box.value] or None
        return self.number_box.value.strip() or None

    def show(self, status: str, message: str) -> None:
        self.status = status
        text = html.escape(message).replace("\n", "<br>")
        self.feedback.value = f'<div style="color:{COLOURS[status]}">{text}</div>' if text else ""

    def reset(self) -> None:
        if self.item.kind == "single":
            self.choice.value = None
        elif self.item.kind == "multiple":
            for box in self.boxes:
                box.value = False
        else:
            self.number_box.value = ""
        self.show("unanswered", "")


class QuizBox(widgets.VBox):
    """The quiz of one bank. Python-side attributes (``views``, ``answers``) are not widget traits
    and never reach the browser."""

    def __init__(self, bank: Bank, lang: str = "en"):
        self._bank, self.lang, self.answers, shared = bank, lang, {}, Shared()
        self.views = [ItemView(public_item(item, bank.languages), n, self._check, shared)
                      for n, item in enumerate(bank.items, 1)]
        html_kw = shared.kw(HTMLStyle)
        self.header_html = widgets.HTML(**html_kw)
        self.language = widgets.ToggleButtons(options=[(LANGUAGES[c], c) for c in bank.languages], value=lang)
        self.language.observe(lambda change: self.set_language(change["new"]), names="value")
        self.score_line = widgets.HTML(**html_kw)
        header = [self.header_html] + ([self.language] if len(bank.languages) > 1 else [])
        super().__init__(header + [v.box for v in self.views] + [self.score_line], layout=shared(widgets.Layout))
        self.set_language(lang)

    def set_language(self, lang: str) -> None:
        self.lang = lang
        title = html.escape(localize(self._bank.title, lang))
        self.header_html.value = f"<h3>{_label(lang, 'title', title=title)}</h3>"
        for view in self.views:
            view.set_language(lang)
            if view.status != "unanswered":
                self._check(view)
        self._update()

    def _check(self, view: ItemView) -> None:
        response = view.response()
        result = feedback(self._bank.item(view.item.id), response, self.lang)
        self.answers[view.item.id] = response
        view.show(result.status, result.message)
        self._update()

    def _update(self) -> None:
        result = score(self._bank, self.answers)
        line = _label(self.lang, "score", points=f"{result.points:g}", total=f"{result.total:g}",
                      needed=f"{result.needed:g}")
        if result.passed:
            progress.record_pass(self._bank.id, self._bank.lesson, result.points, result.total)
            line += "<br>" + _label(self.lang, "passed")
        self.score_line.value = f"<b>{line}</b>"

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:  # where the widget cannot render, the text quiz is what shows
            bundle["text/plain"] = quiz_text(self._bank, self.lang)
        return bundle


def quiz(lesson: str, lang: str | None = None) -> QuizBox:
    """The quiz widget of a lesson (``"01"``) or bank (``"faq"``), in ``lang`` (default: the lesson's
    language, ``parallel_lab.i18n``). Display it as the last expression of a cell;
    ``parallel_lab.course.quiz.show`` prints the same questions as text."""
    bank = load(str(lesson))
    lang = lang or language()
    if lang not in bank.languages:
        raise ValueError(f"quiz {bank.id} is available in {', '.join(bank.languages)}, not {lang!r}")
    return QuizBox(bank, lang)
