#!/usr/bin/env python3
"""The course's two commands, for a fresh machine that has only Python 3.10+:

    python3 course.py start    # set up .venv, then open JupyterLab at the first lesson
    python3 course.py start --lang zh-Hant    # the Traditional Chinese edition, JupyterLab's menus in Chinese
    python3 course.py test     # set up .venv, then run the whole test suite (unit, ranks, notebooks, browser)

Both are idempotent: the environment is rebuilt only when pyproject.toml changed since the last run.
Extra arguments after ``test`` go to pytest (e.g. ``python3 course.py test -k launcher``).

Stopping ``start`` (Ctrl-C, or SIGTERM from a process manager) stops JupyterLab and everything it
started: the server shuts its kernels down, and whatever outlives it (a kernel's forkserver, its
ranks) is terminated too, so that no process of the course is left holding a port or a core.
"""

import ast
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
FIRST_LESSON = "lessons/00_why_split_a_model.ipynb"
# The course's JupyterLab settings (no "get notified about Jupyter news?" pop-up over the first
# lesson, no update check): JupyterLab reads them from <prefix>/share/jupyter/lab/settings, where
# binder/postBuild copies the same file on Binder.
LAB_OVERRIDES = ROOT / "binder" / "overrides.json"
# The course's languages -> JupyterLab's locale (its language pack, jupyterlab-language-pack-zh-TW).
LAB_LOCALES = {"en": "en", "zh-Hant": "zh_TW"}
CATALOG = ROOT / "parallel_lab" / "i18n" / "locale" / "zh_Hant" / "LC_MESSAGES" / "messages.po"
LANG = os.environ.get("PARALLEL_LAB_LANG") or "en"  # --lang sets it, before any message


def _(message: str) -> str:
    """``message`` in the chosen language, from the library's catalog (parallel_lab.i18n), read
    here with the standard library: this script runs before the environment (and Babel) exists."""
    return _catalog().get(message, message) if LANG != "en" else message


def _catalog(cache={}) -> dict:
    """msgid -> msgstr of the library's .po (no context, no plural; fuzzy and empty ones left out)."""
    if not cache and CATALOG.exists():
        entry, key, fuzzy = {}, None, False
        for line in CATALOG.read_text(encoding="utf-8").splitlines() + [""]:
            if line.startswith("#,"):
                fuzzy = "fuzzy" in line
            match = re.match(r'^(msgctxt|msgid|msgid_plural|msgstr)\s+(".*")$', line)
            if match:
                key = match[1]
                entry[key] = ast.literal_eval(match[2])
            elif line.startswith('"') and key:
                entry[key] += ast.literal_eval(line)
            elif not line.strip():
                if entry.get("msgid") and entry.get("msgstr") and "msgctxt" not in entry and not fuzzy:
                    cache[entry["msgid"]] = entry["msgstr"]
                entry, key, fuzzy = {}, None, False
    return cache


def say(text):
    print(f"[course] {text}", file=sys.stderr, flush=True)


def _fingerprint(extra: str) -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extra.encode()).hexdigest()


def up_to_date(extra: str) -> bool:
    """True when .venv holds the package with ``extra`` for the current pyproject.toml."""
    stamp = VENV / f".installed-{extra}"
    return PYTHON.exists() and stamp.exists() and stamp.read_text() == _fingerprint(extra)


def setup(extra: str) -> None:
    """Create .venv and install the package with ``extra`` unless it is already done for this
    pyproject.toml (a stamp file records what was installed)."""
    if sys.version_info < (3, 10):
        sys.exit("[course] " + _("Python 3.10 or newer is needed, this is {version}").format(
            version=sys.version.split()[0]))
    if up_to_date(extra):
        say(_("environment up to date ({venv}, [{extra}])").format(venv=VENV.name, extra=extra))
        return
    if not PYTHON.exists():
        say(_("creating {venv}").format(venv=VENV))
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    say(_("installing parallel-lab[{extra}] (first time: a few minutes)").format(extra=extra))
    subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "-e", f".[{extra}]"], cwd=ROOT, check=True)
    (VENV / f".installed-{extra}").write_text(_fingerprint(extra))


def install_lab_settings(prefix: Path = VENV, lang: str = "en") -> Path:
    """Copy the course's JupyterLab settings into the environment (every start: cheap, and a
    changed file takes effect without a reinstall). Another language's start reads its own folder
    (``--LabApp.app_settings_dir``): the same settings, and JupyterLab's locale set to that
    language's pack; the English start's folder stays as it is."""
    settings = json.loads(LAB_OVERRIDES.read_text())  # fail here, not in the browser, on a broken file
    folder = "settings" if lang == "en" else f"settings-{lang}"
    target = prefix / "share" / "jupyter" / "lab" / folder / "overrides.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    if lang == "en":
        shutil.copyfile(LAB_OVERRIDES, target)
    else:
        settings["@jupyterlab/translation-extension:plugin"] = {"locale": LAB_LOCALES[lang]}
        target.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return target


def first_lesson(lang: str = "en") -> str:
    """The lesson ``start`` opens: lesson 00 of the language's edition, else its first lesson."""
    if lang == "en":
        return FIRST_LESSON
    edition = ROOT / "lessons" / lang
    lessons = sorted(edition.glob("[0-9][0-9]_*.ipynb"))
    chosen = edition / Path(FIRST_LESSON).name
    if not chosen.exists():
        if not lessons:
            sys.exit("[course] " + _("no {lang} edition is built (lessons/{lang}/)").format(lang=lang))
        chosen = lessons[0]
    return chosen.relative_to(ROOT).as_posix()


def language(args: list) -> tuple[str, list]:
    """``--lang L`` (or ``--lang=L``) taken out of ``args``: (L or "en", the rest, for JupyterLab)."""
    rest, lang, args = [], "en", list(args)
    while args:
        arg = args.pop(0)
        if arg == "--lang" and args:
            lang = args.pop(0)
        elif arg.startswith("--lang="):
            lang = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if lang not in LAB_LOCALES:
        sys.exit("[course] " + _("--lang must be one of {languages}, got {lang!r}").format(
            languages=", ".join(LAB_LOCALES), lang=lang))
    return lang, rest


def env() -> dict:
    """One thread per process: N ranks on few cores stay honest (the same as binder/start); the
    course's language for every process it starts (a kernel's library messages follow it)."""
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "PYTHONNOUSERSITE": "1", "PARALLEL_LAB_LANG": LANG}


def start(args) -> int:
    global LANG
    LANG, args = language(args)
    setup("course")
    settings = install_lab_settings(lang=LANG)
    lesson = first_lesson(LANG)
    say(_("opening JupyterLab at {lesson} (Ctrl-C stops it and every kernel and rank)").format(lesson=lesson))
    # Containers often run as root, which JupyterLab refuses unless told it is on purpose.
    root = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    # Served from the repository (as on Binder), opened at the first lesson, with the language's settings.
    where = [f"--ServerApp.root_dir={ROOT}", f"--LabApp.default_url=/lab/tree/{lesson}"]
    if LANG != "en":
        where.append(f"--LabApp.app_settings_dir={settings.parent}")
    return supervise([str(BIN / "jupyter"), "lab", *where, *root, *args])


def _become_subreaper() -> bool:
    """Linux: orphans of our tree (a kernel's forkserver, its ranks) are re-parented to us instead
    of init, so that we can still find and stop them after JupyterLab has exited."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    """Our live child processes (Linux /proc; elsewhere none are known)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        if int(fields[1]) == me and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _reap() -> bool:
    """Collect the children that have exited; True when none is left, running or not (the kernel's
    own count: one call, unlike a scan of /proc, which a process can be re-parented to us during)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def _stop_leftovers(grace: float = 5.0, limit: float = 60.0) -> None:
    """SIGTERM every process still under us, SIGKILL those still there ``grace`` s later. Rounds
    repeat: when a kernel ends, its forkserver is re-parented to us, and then its ranks."""
    told: dict[int, float] = {}
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if _reap():
            return
        # Not "no pids, so done": a kernel that exits while /proc is read hands its forkserver to us
        # after the scan passed it and before it reaches the kernel, and the scan finds neither.
        pids = _children()
        now = time.monotonic()
        fresh = [pid for pid in pids if pid not in told]
        if fresh:
            say(_("stopping {n} process(es) JupyterLab left behind: {pids}").format(
                n=len(fresh), pids=" ".join(map(str, fresh))))
        for pid in pids:
            sig = signal.SIGTERM if pid not in told else signal.SIGKILL if now - told[pid] > grace else None
            told.setdefault(pid, now)
            if sig is not None:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        time.sleep(0.1)
    if not _reap():
        say(_("could not stop within {limit:g} s: {pids}").format(limit=limit, pids=" ".join(map(str, _children()))))


def supervise(command: list[str], grace: float = 20.0) -> int:
    """Run JupyterLab until it exits or we are told to stop (SIGINT, SIGTERM, SIGHUP): then SIGTERM
    it (it shuts its kernels down), wait ``grace`` seconds, and stop whatever of its tree is left."""
    subreaper = _become_subreaper()
    proc = subprocess.Popen(command, cwd=ROOT, env=env())
    stopping = []

    def stop(signum, frame):
        if not stopping:
            say(_("{signal}: stopping JupyterLab, its kernels and their ranks").format(
                signal=signal.Signals(signum).name))
        stopping.append(signum)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM if len(stopping) == 1 else signal.SIGKILL)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5 if not stopping else grace)
                break
            except subprocess.TimeoutExpired:
                if stopping:  # SIGTERM was not enough
                    proc.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if subreaper:
            _stop_leftovers()
    return 128 + stopping[0] if stopping else code


def test(args) -> int:
    setup("test")
    install_lab_settings()  # the browser tests open the course's JupyterLab as a student would
    return subprocess.call([str(PYTHON), "-m", "pytest", *args], cwd=ROOT, env=env())


def main() -> int:
    commands = {"start": start, "test": test}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(_("usage: python3 course.py start [--lang zh-Hant] (set up .venv, open the course in JupyterLab) | "
                "python3 course.py test [pytest arguments] (set up .venv, run the whole test suite)"),
              file=sys.stderr)
        return 2
    return commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
