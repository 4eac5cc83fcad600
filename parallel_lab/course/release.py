"""The students' release: ``parallel-lab release DIR`` writes the repository students get (what a
course's Binder link points at), with no answer in it.

    report = write_release("../parallel-lab-students")      # then audit(...) finds nothing
    problems = audit("../parallel-lab-students")             # [] or ["lessons/src/01_...py: line ..."]

This repository is the instructor's: the lesson sources hold the solutions, the quiz banks their
keys, the tests solutions of their own. The release takes from it, by the rules in ``RULES``:

- the built student editions (``lessons/*.ipynb``, every language), which hold stubs where the
  solutions are and the "not yet" verdicts of the checks;
- the lesson sources with every solution region (``### BEGIN SOLUTION`` ... ``### END SOLUTION``)
  replaced by the stub the student edition shows (a prediction's region is dropped, leaving
  ``my_prediction = None``), so that a source opened as a notebook is the student edition too;
- the quiz banks sealed (``course.quiz.seal``): prompts, options, hints and the graded quizzes'
  numbers, but the keys only as salted hashes and every explanation as a ciphertext keyed by its
  answer; the practice widget gives the same feedback, and nothing says which option is right;
- the package, less ``course/quiz/answers.py`` (the map from each numeric question to the function
  that computes it; the functions themselves are the course's models, which the lessons teach);
- what running the course needs (``pyproject.toml``, ``environment.yml``, ``binder/``,
  ``course.py``), the article's FAQ (``quizzes/faq_source.md``: lesson 17's reading, which the FAQ
  quiz asks the student to apply), and a README for students.

It leaves out the tests (their exercises' solutions), ``tools/`` (the build and its solution
edition), the grading policy, the instructor's docs and ``ARCHITECTURE.md``, and anything no rule
names. After writing, ``audit`` reads every file of the release for a line of a solution region,
a quiz key or explanation in plain text, and a file of the kinds left out; the release is moved
into place only when it finds nothing. ``RELEASE.json`` lists what was released, sealed, stripped
and left out, and the commit it came from. docs/instructors.md says what stays reachable anyway.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import yaml

from parallel_lab.course.quiz.bank import bank_files, load_file, localize
from parallel_lab.course.quiz.seal import seal_bank

ROOT = Path(__file__).resolve().parents[2]
# The solution grammar of the lesson sources (tools/build_lessons.py writes the editions with it).
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
SOLUTION = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION[ \t]*\n.*?^[ \t]*### END SOLUTION[ \t]*$", re.S | re.M)
STUB = "# YOUR CODE HERE\nraise NotImplementedError"
PREDICTION_CELL = re.compile(r'^# %% tags=\[[^\]]*"answer:predict:', re.M)

# First match wins: (glob, what happens). Anything no rule names is left out.
RULES = (
    ("tests/*", "leave out: the tests hold every exercise's solution"),
    ("tools/*", "leave out: the build writes the solution edition"),
    (".ci/*", "leave out"),
    ("*.egg-info/*", "leave out"),
    ("ARCHITECTURE.md", "leave out: the instructor's and developers' map"),
    ("docs/instructors.md", "leave out: the instructor's guide"),
    ("grading.yaml", "leave out: the grading policy"),
    ("README.md", "replace: the students' README"),
    ("quizzes/schema.json", "leave out: the instructor's bank format"),
    ("parallel_lab/course/quiz/answers.py", "leave out: which function computes each numeric answer"),
    ("lessons/src/*.py", "strip: solution regions replaced by the student edition's stubs"),
    ("quizzes/*.yaml", "seal: keys as salted hashes, explanations as ciphertexts"),
    ("quizzes/faq_source.md", "copy: the article's FAQ, lesson 17's reading"),
    ("parallel_lab/*", "copy"),
    ("lessons/*.ipynb", "copy: the student edition"),
    ("lessons/*/*.ipynb", "copy: the student edition"),
    ("lessons/sanitize.cfg", "copy"),
    ("lessons/locale/*", "copy: the lessons' translations"),
    ("docs/students.md", "copy"),
    ("docs/frameworks*.md", "copy: the frameworks' names of every technique (lesson 18 links it)"),
    ("binder/*", "copy"),
    ("pyproject.toml", "copy"),
    ("environment.yml", "copy"),
    ("course.py", "copy"),
    (".gitignore", "copy"),
)
FORBIDDEN = ("tests/", "tools/", "grading.yaml", "ARCHITECTURE.md", "docs/instructors.md", "quizzes/schema.json",
             "parallel_lab/course/quiz/answers.py")

README = """# parallel-lab: model parallelism you run for real

An interactive course on model parallelism (tensor, pipeline, sharded data, expert and context
parallelism) whose notebooks run real ranks on your CPU. This is the students' copy of the course:
your instructor grades what you hand in.

## Start

```bash
python3 course.py start    # sets up .venv (a few minutes the first time), opens JupyterLab at lesson 00
```

or open the course's Binder link. The lessons are `lessons/NN_*.ipynb`.

## Exercises, predictions and quizzes

- **Exercises**: write your code where it says `# YOUR CODE HERE` and run the check cell below it;
  the check runs your code on real ranks and tells you what is right and what is not.
- **Predictions**: write your number in `my_prediction` before you run the cell that measures it.
- **Quizzes**: practise in the quiz widget (instant feedback, retry at will). Your graded quiz asks
  the same questions with the options in your own order and your own numbers: write your student
  id in `my_student_id` (exactly as your instructor's roster has it), answer in `my_answers`, run
  the check cell. It tells you your points on the choice questions; your instructor's grader
  scores the numeric ones.

Hand in the lesson notebooks you worked in (JupyterLab: *File → Download*), unchanged in name, as
your instructor asks.
"""


class ReleaseError(ValueError):
    """The release cannot be written (the target is not empty, an audit found an answer, ...)."""


@dataclass
class Report:
    target: str
    commit: str = ""
    files: list = field(default_factory=list)
    stripped: dict = field(default_factory=dict)   # lesson source -> solution regions removed
    sealed: list = field(default_factory=list)
    left_out: dict = field(default_factory=dict)   # path -> why
    problems: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"dir": self.target, "commit": self.commit, "files": len(self.files),
                "solution_regions_removed": sum(self.stripped.values()), "stripped": self.stripped,
                "sealed_banks": self.sealed, "left_out": self.left_out, "problems": self.problems}


def rule_for(path: str) -> str:
    for pattern, action in RULES:
        if fnmatch.fnmatch(path, pattern):
            return action
    return "leave out: no rule names it"


def source_files(root: Path = ROOT) -> list[str]:
    """The course's files: git's (tracked, and new ones it does not ignore), else a walk of ``root``."""
    try:
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"],
                                capture_output=True, check=True, timeout=60).stdout.decode()
        return sorted(p for p in listed.split("\0") if p and (root / p).is_file())
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", "__pycache__", ".ipynb_checkpoints", ".pytest_cache"}
        return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                      if p.is_file() and not skip & set(p.relative_to(root).parts))


def commit_of(root: Path = ROOT) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, check=True,
                              text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def strip_solutions(source: str) -> tuple[str, int]:
    """A lesson source with every solution region replaced by the stub (same indentation), and a
    prediction's region dropped (it comes after ``my_prediction = None``); and how many there were."""
    cells = re.split(r"(?m)^(?=# %%)", source)
    out, count = [], 0
    for cell in cells:
        found = len(SOLUTION.findall(cell))
        count += found
        if found and PREDICTION_CELL.match(cell):
            body = SOLUTION.sub("", cell)
            cell = re.sub(r"\n{3,}", "\n\n", body)
        elif found:
            cell = SOLUTION.sub(lambda m: "\n".join(m["indent"] + line for line in STUB.splitlines()), cell)
        out.append(cell)
    return "".join(out), count


def solution_lines(root: Path = ROOT, min_length: int = 12) -> set[str]:
    """Every line of the lesson sources' solution regions that could only come from one: stripped,
    at least ``min_length`` long, not a comment, and found in no released file of the library."""
    found = set()
    for path in sorted((root / "lessons" / "src").glob("*.py")):
        for region in SOLUTION.finditer(path.read_text(encoding="utf-8")):
            for line in region.group(0).splitlines()[1:-1]:
                line = line.strip()
                if len(line) >= min_length and not line.startswith("#"):
                    found.add(line)
    library = set()
    for path in (root / "parallel_lab").rglob("*.py"):
        library |= {line.strip() for line in path.read_text(encoding="utf-8").splitlines()}
    return found - library


def key_texts(root: Path = ROOT, min_length: int = 24) -> set[str]:
    """What a quiz key looks like in plain text: every explanation of the banks (an option's why,
    a numeric item's explanation and its mistakes' whys), in every language, as its first
    ``min_length`` or more characters before any placeholder."""
    found = set()
    for path in bank_files(root / "quizzes"):
        bank = load_file(path)
        for item in bank.items:
            texts = [o.why for o in item.options] + [item.explanation] + [m.why for m in item.mistakes]
            for text in texts:
                for lang in bank.languages:
                    if text is None:
                        continue
                    head = localize(text, lang).split("{")[0].strip()
                    if len(head) >= min_length:
                        found.add(head[:80])
    return found


def _text_of(path: Path) -> list[str]:
    """A released file's text as lines (a notebook: its cells' sources and outputs); [] for binary."""
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        lines = []
        for cell in nb.cells:
            lines += cell.source.splitlines()
            for output in cell.get("outputs", []):
                text = output.get("text") or "".join(str(v) for v in output.get("data", {}).values())
                lines += str(text).splitlines()
        return lines
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (UnicodeDecodeError, OSError):
        return []


def audit(target, root: Path = ROOT) -> list[str]:
    """What in the release at ``target`` holds an answer: a file of a kind left out, a line of a
    solution region, a quiz key (a ``correct:`` mark, a numeric answer's value or function) or an
    explanation in plain text. [] when it finds nothing."""
    target = Path(target)
    problems = []
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    for name in files:
        if any(name == f or name.startswith(f) for f in FORBIDDEN):
            problems.append(f"{name}: a file the release leaves out (it holds answers)")
    lines, keys = solution_lines(root), key_texts(root)
    for name in files:
        text = _text_of(target / name)
        for number, line in enumerate(text, 1):
            if line.strip() in lines:
                problems.append(f"{name}: line {number} is a line of a solution region: {line.strip()[:80]}")
        joined = "\n".join(text)
        for key in keys:
            if key in joined:
                problems.append(f"{name}: holds a quiz explanation in plain text: {key[:60]}...")
        if name.startswith("quizzes/") and name.endswith(".yaml"):
            data = yaml.safe_load(joined)
            for item in data.get("items", []):
                if any("correct" in o or "why" in o for o in item.get("options", ())):
                    problems.append(f"{name}: item {item.get('id')} marks its right option or explains options")
                answer = item.get("answer") or {}
                if "value" in answer or "function" in answer or "explanation" in item or "mistakes" in item:
                    problems.append(f"{name}: item {item.get('id')} holds its answer, function or explanation")
    return problems


def write_release(target, root: Path = ROOT, force: bool = False) -> Report:
    """Write the students' release into ``target`` (new, empty, or with ``force`` a previous
    release, which is replaced); ReleaseError when the audit finds an answer in it (nothing is
    left at ``target`` then)."""
    target = Path(target).resolve()
    root = Path(root).resolve()
    if target == root or root in target.parents:
        raise ReleaseError(f"{target} is inside the course ({root}); write the release outside it: it is a "
                           f"repository of its own")
    if target.exists() and any(target.iterdir()):
        if not (force and (target / "RELEASE.json").exists()):
            raise ReleaseError(f"{target} is not empty; give a new folder (or --force to replace a previous release, "
                               f"one that holds RELEASE.json)")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    report = Report(str(target), commit_of(root))
    try:
        for name in source_files(root):
            action = rule_for(name)
            if action.startswith("leave out") or action.startswith("replace"):
                if not action.startswith("replace"):
                    folder = name.split("/", 1)[0] + "/" if any(
                        name.startswith(p[:-1]) for p, a in RULES if p.endswith("/*") and a == action) else name
                    report.left_out[folder] = action.split(": ", 1)[-1]
                continue
            source, dest = root / name, partial / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if action.startswith("strip"):
                text, count = strip_solutions(source.read_text(encoding="utf-8"))
                dest.write_text(text, encoding="utf-8")
                report.stripped[name] = count
            elif action.startswith("seal"):
                sealed = seal_bank(load_file(source))
                header = f"# Sealed for the students' release ({name}): keys as salted hashes (course.quiz.seal).\n"
                dest.write_text(header + yaml.safe_dump(sealed, allow_unicode=True, sort_keys=False, width=100),
                                encoding="utf-8")
                report.sealed.append(name)
            else:
                shutil.copy2(source, dest)
            report.files.append(name)
        (partial / "README.md").write_text(README, encoding="utf-8")
        report.files.append("README.md")
        report.problems = audit(partial, root)
        (partial / "RELEASE.json").write_text(json.dumps(report.as_dict(), indent=1, ensure_ascii=False) + "\n",
                                              encoding="utf-8")
        if report.problems:
            raise ReleaseError(f"the release would hold answers ({len(report.problems)} problem(s)); the first: "
                               f"{report.problems[0]}")
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return report
