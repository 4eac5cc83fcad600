"""The grading policy, overrides, standings and the LMS exports, from gradebook rows (no process):
partial credit, weights and overrides reach the summary and the certificate; every lesson can be
passed without its predictions under the defaults; Canvas's and Moodle's files carry the roster's
ids under the headers their documentation gives; graded quizzes differ per student."""

import csv

import pytest

from parallel_lab.course.credentials.gradebook import lessons_from_gradebook
from parallel_lab.course.grading import exports, gradebook
from parallel_lab.course.grading.policy import Policy, PolicyError, default_file
from parallel_lab.course.grading.roster import Roster, RosterError, load_overrides
from parallel_lab.course.grading.runner import Row
from parallel_lab.course.quiz import load, load_all
from parallel_lab.course.quiz.variant import graded_params, score_for, variant

L01, L04 = "01_ranks_and_collectives", "04_gpipe_microbatching"


def row(student, lesson, check, passed, points, max_points, cases=(0, 0), category="exercises"):
    return Row(student, lesson, check, passed, points, max_points, "" if passed else "failed", f"{student}.ipynb",
               cases=cases, category=category)


def class_rows(policy=Policy()):
    """Two students, lessons 01 (ring 2 points, quiz 3) and 04 (quiz 3, prediction 1)."""
    pts = lambda cat, m, ok, cases: policy.points(cat, m, ok, cases)  # noqa: E731
    return [
        row("s1", L01, "ring-all-reduce", False, pts("exercises", 2, False, (5, 10)), 2, (5, 10)),
        row("s1", L01, "quiz:01", True, 3, 3, (7, 8), "quizzes"),
        row("s1", L04, "quiz:04", True, 3, 3, (6, 6), "quizzes"),
        row("s1", L04, "predict:gpipe-bubble", False, 0, 1, (0, 1), "predictions"),
        row("s2", L01, "ring-all-reduce", True, 2, 2, (10, 10)),
        row("s2", L01, "quiz:01", False, 0, 3, (4, 8), "quizzes"),
    ]


def test_partial_credit_counts_cases_and_all_or_nothing_does_not():
    policy = Policy()
    assert policy.points("exercises", 3, False, (2, 3)) == 2  # a 1F1B failing only m < p
    assert policy.points("exercises", 3, True, (3, 3)) == 3 and policy.points("exercises", 3, False, (0, 0)) == 0
    assert policy.points("quizzes", 3, False, (7, 8)) == 0  # a quiz counts at its pass mark
    strict = Policy.from_dict({"credit": {"exercises": "all-or-nothing"}})
    assert strict.points("exercises", 3, False, (2, 3)) == 0


def test_the_policy_file_is_checked_and_names_what_is_wrong(tmp_path):
    assert Policy.load(default_file()).as_dict() == Policy().as_dict()  # the course's file: the defaults
    for data, message in [({"weight": {}}, "unknown key"), ({"weights": {"labs": 1}}, "unknown categories labs"),
                          ({"weights": {"quizzes": -1}}, "weights.quizzes must be a number >= 0, got -1"),
                          ({"credit": {"quizzes": "half"}}, "credit.quizzes must be partial or all-or-nothing"),
                          ({"certificate": {"threshold": 1.5}}, "certificate.threshold must be a number in (0, 1]"),
                          ({"weights": {c: 0 for c in ("exercises", "quizzes", "predictions", "capstone")}},
                           "the weights sum to 0")]:
        with pytest.raises(PolicyError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
            Policy.from_dict(data)
    (tmp_path / "p.yaml").write_text("weights: [1\n")
    with pytest.raises(PolicyError, match="p.yaml: not valid YAML"):
        Policy.load(tmp_path / "p.yaml")


def test_every_lesson_can_be_passed_without_its_predictions_under_the_defaults():
    refs = gradebook.load_references()
    maxima = gradebook.lesson_maxima_of(refs, Policy())
    assert {"04", "05"} <= {lesson for lesson, cats in maxima.items() if "predictions" in cats}
    assert Policy().unpassable_without(maxima) == []
    heavy = Policy.from_dict({"weights": {"predictions": 0.3}})
    assert "04" in heavy.unpassable_without(maxima)  # the check names a policy that would not


def test_weights_partial_credit_and_overrides_reach_the_summary_and_the_certificate(tmp_path):
    policy = Policy()
    rows = class_rows(policy)
    table = gradebook.standings(rows, policy)
    s1 = table["s1"]
    # lesson 01: exercises 1/2 (5 of 10 cases), quizzes 3/3: (0.5 * 0.5 + 0.3 * 1) / 0.8 = 0.6875
    assert s1.lessons[L01].score == pytest.approx(0.6875) and not s1.lessons[L01].passed
    # lesson 04: quiz 3/3, prediction wrong: 0.3 / 0.35 = 0.857 >= 0.8, passed without the prediction
    assert s1.lessons[L04].score == pytest.approx(0.3 / 0.35) and s1.lessons_passed == ("04",)
    assert table["s2"].lessons_passed == ()  # no 04 handed in: 0 of it
    overrides = [gradebook.Override("s1", "ring-all-reduce", 2, "regraded: the 4-rank case was a grader bug")]
    regraded = gradebook.standing("s1", rows, policy, overrides)
    assert regraded.lessons_passed == ("01", "04") and regraded.points == s1.points + 1
    assert regraded.overrides == (("ring-all-reduce", "regraded: the 4-rank case was a grader bug (was 1)"),)

    out = tmp_path / "grades.csv"
    (tmp_path / "overrides.csv").write_text("student,check,points,reason\n"
                                            "s1,ring-all-reduce,2,regraded: the 4-rank case was a grader bug\n")
    gradebook.summarize(rows, out, policy, overrides=tmp_path / "overrides.csv")
    summary = {r["student"]: r for r in csv.DictReader(open(out.with_name("grades-summary.csv")))}
    assert summary["s1"][f"{L01} points"] == "5" and summary["s1"]["lessons passed"] == "01 04"
    assert summary["s2"][f"{L04} points"] == "0" and summary["s2"][f"{L04} max"] == "4"
    graded = {(r["student"], r["exercise"]): r for r in csv.DictReader(open(out))}
    ring = graded["s1", "ring-all-reduce"]
    assert ring["points"] == "2" and "grader bug" in ring["override"]
    assert ring["cases_passed"] == "5" and ring["cases_tried"] == "10"
    # A credential decides with the same standing: the policy's threshold, weights and overrides
    raw = tmp_path / "raw.csv"
    gradebook.write_gradebook(rows, raw)
    assert lessons_from_gradebook(out, "s1") == {"01": ["quiz:01"], "04": ["quiz:04"]}  # the final points
    assert list(lessons_from_gradebook(raw, "s1")) == ["04"]
    assert list(lessons_from_gradebook(raw, "s1", overrides=tmp_path / "overrides.csv")) == ["01", "04"]
    assert list(lessons_from_gradebook(raw, "s1", threshold=0.6)) == ["01", "04"]
    strict = Policy.from_dict({"weights": {"predictions": 1}, "certificate": {"threshold": 0.9}})
    assert list(lessons_from_gradebook(raw, "s1", policy=strict)) == []


def test_overrides_that_exceed_the_maximum_or_match_nothing_are_named(tmp_path):
    rows = class_rows()
    with pytest.raises(ValueError, match="5 points for ring-all-reduce of s1, which is worth at most 2"):
        gradebook.apply_overrides(rows, [gradebook.Override("s1", "ring-all-reduce", 5, "why", 2)])
    _, unmatched = gradebook.apply_overrides(rows, [gradebook.Override("s9", "quiz:01", 1, "typo", 3)])
    assert [o.student for o in unmatched] == ["s9"]
    (tmp_path / "o.csv").write_text("student,check,points,reason\ns1,quiz:01,lots,why\n")
    with pytest.raises(RosterError, match="o.csv, line 2: points must be a number, got 'lots'"):
        load_overrides(tmp_path / "o.csv")
    (tmp_path / "o.csv").write_text("student,check,points\n")
    with pytest.raises(RosterError, match="needs the column\\(s\\) reason"):
        load_overrides(tmp_path / "o.csv")


# ----------------------------------------------------------------------------------------------
# The LMS exports. The headers are the formats' own:
# - Canvas: its gradebook export, which its importer reads back -- "Student", "ID", "SIS User ID",
#   "SIS Login ID", "Section", then one column per assignment, and a second row "Points Possible"
#   (instructure/canvas-lms, Course#gradebook_to_csv; Canvas Instructor Guide, "How do I import
#   grades in the Gradebook?"; Ohio State, "Import a CSV file to Carmen grades": the student by
#   name, ID or SIS User ID, and the SIS Login ID and Section columns);
# - Moodle: one header row, an identifier column the import maps to a user field, a column per
#   grade item (moodle/moodle grade/import/csv/classes/load_data.php; its fixture
#   grade/tests/fixtures/grade_import_multiple_mappings.csv: "First name,Last name,Email address,
#   Grade A,..."); the columns of Moodle's own export: "First name", "Last name", "ID number",
#   "Email address".

CANVAS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_HEADER = ["First name", "Last name", "ID number", "Email address"]


def test_canvas_and_moodle_exports_carry_the_rosters_ids(tmp_path):
    (tmp_path / "roster.csv").write_text("folder,student_id,email,first_name,last_name,section\n"
                                         "ada,s1,ada@uni.example,Ada,Lovelace,A\n"
                                         "bob,s2,bob@uni.example,Bob,Babbage,A\n"
                                         "cy,s3,cy@uni.example,Cy,Cray,B\n")
    roster = Roster.load(tmp_path / "roster.csv")
    table = gradebook.standings(class_rows())
    lessons = [L01, L04]
    canvas = exports.canvas_rows(table, lessons, roster)
    assert canvas[0][:5] == CANVAS_HEADER and canvas[0][5:] == [
        "parallel-lab 01 ranks and collectives", "parallel-lab 04 gpipe microbatching", "parallel-lab score (%)"]
    assert canvas[1] == ["Points Possible", "", "", "", "", "5", "4", "100"]
    assert canvas[2][:5] == ["Lovelace, Ada", "", "s1", "ada@uni.example", "A"] and canvas[2][5:7] == ["4", "3"]
    assert canvas[4][:5] == ["Cray, Cy", "", "s3", "cy@uni.example", "B"] and canvas[4][5:] == ["0", "0", "0"]
    moodle = exports.moodle_rows(table, lessons, roster)
    assert moodle[0][:4] == MOODLE_HEADER and moodle[0][4:] == canvas[0][5:]
    assert moodle[1][:4] == ["Ada", "Lovelace", "s1", "ada@uni.example"] and moodle[1][4:] == canvas[2][5:]
    written = exports.write_canvas(tmp_path / "c.csv", table, lessons, roster)
    assert list(csv.reader(open(written))) == canvas


def test_the_roster_is_checked(tmp_path):
    (tmp_path / "r.csv").write_text("folder,student_id,email\nada,s1,a@x\nbob,s1,b@x\n")
    with pytest.raises(RosterError, match="r.csv, line 3: student_id 's1' is also on line 2"):
        Roster.load(tmp_path / "r.csv")
    (tmp_path / "r.csv").write_text("name,email\n")
    with pytest.raises(RosterError, match="needs the column\\(s\\) folder, student_id"):
        Roster.load(tmp_path / "r.csv")


# ----------------------------------------------------------------------------------------------
# Graded quizzes differ per student.


def correct_sheet(bank):
    sheet = {}
    for item in bank.items:
        if item.kind == "numeric":
            sheet[item.id] = item.value()
        else:
            keys = sorted(item.correct_keys())
            sheet[item.id] = keys[0] if item.kind == "single" else keys
    return sheet


def test_two_students_quizzes_differ_and_a_copied_sheet_scores_as_what_it_is():
    bank = load("01")
    ada, bob = variant(bank, "s1001"), variant(bank, "s1002")
    numeric = [item.id for item in bank.items if item.kind == "numeric"]
    assert any(ada.item(i).params != bob.item(i).params for i in numeric)  # their numbers differ
    assert all(ada.item(i).params != bank.item(i).params for i in numeric)  # and neither is the practice quiz's
    assert [o.text for o in ada.items[0].options] != [o.text for o in bob.items[0].options]  # and the order
    sheet = correct_sheet(ada)
    own, copied = score_for(bank, sheet, "s1001"), score_for(bank, sheet, "s1002")
    print(f"ada's sheet: {own.points:g} of {own.total:g} on her quiz, {copied.points:g} on bob's "
          f"(pass mark {copied.needed:g})")
    assert own.passed and own.points == own.total
    assert not copied.passed and copied.points < copied.needed


def test_every_lesson_quiz_has_numbers_drawn_per_student_where_its_answers_are_computed():
    for bank in load_all():
        for item in bank.items:
            if item.kind == "numeric" and item.vary:
                assert len(graded_params(item)) >= 2, item.id
    varying = {bank.lesson for bank in load_all() for item in bank.items if item.vary}
    print(f"lessons whose graded quiz draws numbers per student: {sorted(varying)}")
    assert {"01", "04", "05", "09", "12"} <= varying
