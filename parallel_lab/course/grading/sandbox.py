"""Running one submission's checks where nothing it does reaches the grader or outlives it.

    box = Sandbox.detect()                      # bubblewrap when it works here, else a subreaper
    result = box.run(argv, stdin=job, scratch=Path(tmp), limits=Limits(wall_s=120))
    result.data, result.returncode, result.killed_for, box.kind

Layers, outermost first:

- **bubblewrap** (``bwrap``, Debian's ``bubblewrap``) when it is installed and works: its own PID
  namespace (when its first process ends, the kernel ends every other: a double-forked sleeper
  does not survive), no network but loopback, a read-only view of the whole system (the course and
  its virtual environment included), a private scratch directory (the only writable place besides
  a private /tmp and /dev/shm), an unprivileged user, no capabilities, a new session, and death
  with the grader.
- **Without bwrap** (macOS, locked-down hosts): a warning names what is missing; what follows
  still holds.
- **A reaper per job** (``REAPER``, a few lines of Python first in the job's chain): a child
  subreaper (``PR_SET_CHILD_SUBREAPER`` on Linux), so that double-forked processes are reparented
  to it instead of init, found in the job's tree, killed when the job's first process ends, and
  reaped there -- never left as zombies of the grader, which stays an ordinary process.
- **Always**: a scrubbed environment (an allow-list: nothing of the grader's own variables, its
  secrets included, reaches the submission), rlimits per process (address space, CPU seconds, file
  size, no core dumps, processes), a control group limiting processes and memory where one can be
  made (Linux, root or a delegated cgroup), a watchdog that ends the whole job when it starts too
  many processes or uses too much memory, and the wall-clock limit.

The verdicts come back through a pipe only the checker holds (``result_fd``): not stdout, which the
ranks share, so that no rank can print a verdict of its own.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from parallel_lab.i18n import _

ROOT = Path(__file__).resolve().parents[3]
ENV_TOKEN = "PARALLEL_LAB_GRADE_JOB"  # marks every process of one job (found even when orphaned)
ALLOWED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
# The first process of every job: becomes the subreaper of the job's tree, runs the job, and when
# the job's first process has ended kills (SIGKILL) and reaps whatever of the tree is left.
REAPER = r"""
import ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
main = os.fork()
if main == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
code, me = 1, str(os.getpid())
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        break
    if pid == main:
        code = os.waitstatus_to_exitcode(status)
    if pid == main or main is None:
        main = None
        for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[1] == me:
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
sys.exit(code if code >= 0 else 128 - code)
"""


@dataclass(frozen=True)
class Limits:
    """What one submission may use. Per process: ``memory_bytes`` of address space, ``cpu_s`` of CPU
    time, ``file_bytes`` per file written; for the whole job: ``wall_s`` seconds, ``processes`` at
    once and ``total_memory_bytes`` of resident memory."""

    wall_s: float = 600.0
    cpu_s: int = 600
    memory_bytes: int = 6 * 2**30  # a rank maps ~2.5 GB of address space for torch alone
    total_memory_bytes: int = 8 * 2**30
    file_bytes: int = 64 * 2**20
    processes: int = 64


@dataclass
class Result:
    """How a sandboxed job ended: its exit status, what it wrote on the result pipe (``data``), its
    stdout and stderr (bounded), and ``killed_for`` when the grader had to stop it."""

    returncode: int | None
    data: bytes
    stdout: bytes
    stderr: bytes
    killed_for: str | None = None
    seconds: float = 0.0


def scrubbed_env(scratch: Path, extra: dict | None = None) -> dict:
    """The environment a submission sees: the allow-list, HOME and TMPDIR in its scratch directory,
    one thread per process, and ``extra`` (the grader's own settings for the checker)."""
    env = {k: os.environ[k] for k in ALLOWED_ENV if k in os.environ}
    env.setdefault("PATH", "/usr/bin:/bin")
    env.update({"HOME": str(scratch), "TMPDIR": str(scratch / "tmp"), "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
                "PARALLEL_LAB_HOME": str(scratch / "home"), "GLOO_SOCKET_IFNAME": "lo"})
    env.update(extra or {})
    return env


def _prlimit_args(limits: Limits) -> list[str]:
    return [f"--as={limits.memory_bytes}", f"--cpu={limits.cpu_s}", f"--fsize={limits.file_bytes}",
            "--core=0", f"--nproc={limits.processes + _processes_of_this_user()}"]


def _processes_of_this_user() -> int:
    """RLIMIT_NPROC counts every process of the user, the grader's own included."""
    uid = os.getuid()
    return sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid)


class _Cgroup:
    """A control group of the job (v2, or v1 pids + memory), when this process may make one."""

    def __init__(self, name: str, limits: Limits):
        self.dirs: list[Path] = []
        base = Path("/sys/fs/cgroup")
        candidates = [(base / "unified", {"pids.max": limits.processes, "memory.max": limits.total_memory_bytes})] \
            if (base / "unified" / "cgroup.controllers").exists() and "pids" in \
            (base / "unified" / "cgroup.controllers").read_text() else []
        candidates += [(base, {"pids.max": limits.processes, "memory.max": limits.total_memory_bytes})] \
            if (base / "cgroup.controllers").exists() else []
        candidates += [(base / "pids", {"pids.max": limits.processes}),
                       (base / "memory", {"memory.limit_in_bytes": limits.total_memory_bytes})]
        for root, settings in candidates:
            if not root.is_dir() or not os.access(root, os.W_OK):
                continue
            path = root / name
            try:
                path.mkdir()
                for key, value in settings.items():
                    (path / key).write_text(str(value))
            except OSError:
                self._remove(path)
                continue
            self.dirs.append(path)
            if root.name in ("unified", "cgroup"):
                break  # v2 holds both limits

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def _read(self, *names: str) -> int | None:
        """The first of the controller files ``names`` that exists in the job's cgroups, as an int."""
        for d in self.dirs:
            for name in names:
                f = d / name
                if f.exists():
                    try:
                        return int(f.read_text())
                    except (OSError, ValueError):
                        return None
        return None

    def count(self) -> int | None:
        return self._read("pids.current")

    def memory(self) -> int | None:
        """Bytes the job's processes use, counted once (shared pages of forked copies are not
        multiplied, as a sum of RSS would); None without a memory controller."""
        return self._read("memory.current", "memory.usage_in_bytes")

    def kill(self) -> None:
        for d in self.dirs:
            try:
                for pid in (d / "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, PermissionError, ValueError):
                        pass
            except OSError:
                pass

    def close(self) -> None:
        self.kill()
        for d in self.dirs:
            self._remove(d)

    @staticmethod
    def _remove(path: Path) -> None:
        for _attempt in range(50):
            try:
                path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # processes still leaving
                time.sleep(0.02)


@dataclass
class Sandbox:
    """How submissions are isolated here: ``kind`` is "bwrap" or "subreaper"; ``missing`` says what
    a subreaper sandbox lacks (the warning the grader prints)."""

    kind: str
    missing: str = ""
    mounts: list = field(default_factory=list)
    hidden: list = field(default_factory=list)  # paths bubblewrap hides (the course service's data)

    @classmethod
    def detect(cls, prefer_bwrap: bool = True) -> "Sandbox":
        """bubblewrap when it is installed and runs a trivial command here, else a subreaper."""
        bwrap = shutil.which("bwrap")
        if prefer_bwrap and bwrap:
            probe = subprocess.run([bwrap, *_bwrap_base(Path("/"), []), "--", "/bin/true"],
                                   capture_output=True, timeout=30)
            if probe.returncode == 0:
                return cls("bwrap")
            why = f"bwrap is installed but does not run here ({probe.stderr.decode(errors='replace').strip()[:120]})"
        else:
            why = "bubblewrap (bwrap) is not installed" if prefer_bwrap else "bubblewrap was not asked for"
        missing = (f"{why}: grading runs without a private view of the file system, without its own PID and "
                   f"network namespaces; a child subreaper, a scrubbed environment and rlimits remain "
                   f"(install Debian's bubblewrap for the full sandbox)")
        return cls("subreaper", missing)

    def run(self, argv: list[str], stdin: bytes, scratch: Path, limits: Limits = Limits(),
            env: dict | None = None) -> Result:
        """Run ``argv`` (it gets ``--result-fd N``) with ``stdin``; return how it ended."""
        scratch = scratch.resolve()
        for sub in ("tmp", "home"):
            (scratch / sub).mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        environ = scrubbed_env(scratch, {**(env or {}), ENV_TOKEN: token})
        read_fd, write_fd = os.pipe()
        command = [*argv, "--result-fd", str(write_fd)]
        if self.kind == "bwrap":
            command = [shutil.which("bwrap"), *_bwrap_base(scratch, self.mounts, self.hidden),
                       *(a for k, v in environ.items() for a in ("--setenv", k, v)), "--", *command]
        cgroup = _Cgroup(f"parallel-lab-{token[:12]}", limits)
        wrapper = []
        if cgroup.procs_files:  # join the job's cgroup before anything starts
            joins = "; ".join(f'echo $$ > "{f}"' for f in cgroup.procs_files)
            wrapper = ["/bin/sh", "-c", f'{joins}; exec "$@"', "sh"]
        if shutil.which("prlimit"):
            wrapper += [shutil.which("prlimit"), *_prlimit_args(limits), "--"]
        wrapper += [sys.executable, "-I", "-S", "-c", REAPER]
        start = time.monotonic()
        out_path, err_path = scratch.parent / f"{scratch.name}.out", scratch.parent / f"{scratch.name}.err"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            process = subprocess.Popen([*wrapper, *command], stdin=subprocess.PIPE, stdout=out, stderr=err,
                                       env=environ, cwd=scratch, pass_fds=(write_fd,), start_new_session=True)
        os.close(write_fd)
        chunks: list[bytes] = []
        reader = threading.Thread(target=_drain, args=(read_fd, chunks), daemon=True)
        reader.start()
        killed_for = _supervise(process, stdin, limits, cgroup, token, start)
        reader.join(5)
        cgroup.close()
        _kill_job(process, token)
        data = b"".join(chunks)
        stdout, stderr = (_tail(p) for p in (out_path, err_path))
        for p in (out_path, err_path):
            p.unlink(missing_ok=True)
        return Result(process.returncode, data, stdout, stderr, killed_for, time.monotonic() - start)


def _bwrap_base(scratch: Path, mounts, hidden=()) -> list[str]:
    """bubblewrap's view: all of / read-only, private /tmp, /dev/shm and /proc, the scratch directory
    writable, the course and its Python (which may live under /tmp) read-only, no network but
    loopback, its own PID namespace and an unprivileged user; each ``hidden`` folder an empty
    tmpfs, each hidden file empty (``/dev/null``)."""
    args = ["--unshare-user", "--uid", "1000", "--gid", "1000", "--unshare-pid", "--unshare-net",
            "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox", "--die-with-parent", "--new-session",
            "--ro-bind", "/", "/", "--dev", "/dev", "--tmpfs", "/dev/shm", "--proc", "/proc", "--tmpfs", "/tmp",
            "--clearenv"]
    for path in dict.fromkeys([Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), ROOT, *mounts]):
        if str(path).startswith("/tmp/"):  # hidden by the private /tmp: bind it back, read-only
            args += ["--ro-bind", str(path), str(path)]
    for path in map(Path, hidden):
        if path.is_dir():
            args += ["--tmpfs", str(path)]
        elif path.exists():
            args += ["--ro-bind", "/dev/null", str(path)]
    if scratch != Path("/"):
        args += ["--bind", str(scratch), str(scratch), "--chdir", str(scratch)]
    return args


def _drain(fd: int, chunks: list) -> None:
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(65536):
            chunks.append(chunk)
            if sum(map(len, chunks)) > 8 * 2**20:  # a verdict is a few kB: more is not one
                break


def _tail(path: Path, limit: int = 20000) -> bytes:
    try:
        data = path.read_bytes()
    except OSError:
        return b""
    return data[-limit:]


def _job_processes(process, token: str) -> list:
    """Every process of the job: descendants of its first process, and any process carrying its
    token (orphans reparented elsewhere keep their environment)."""
    found = {}
    try:
        for p in psutil.Process(process.pid).children(recursive=True):
            found[p.pid] = p
    except psutil.NoSuchProcess:
        pass
    for p in psutil.process_iter():
        try:
            if p.pid not in found and p.pid != os.getpid() and p.environ().get(ENV_TOKEN) == token:
                found[p.pid] = p
        except (psutil.Error, OSError):
            continue
    return list(found.values())


def _supervise(process, stdin: bytes, limits: Limits, cgroup: _Cgroup, token: str, start: float) -> str | None:
    """Feed ``stdin``, then watch the job until it ends or must be stopped; why it was stopped."""
    try:
        process.stdin.write(stdin)
        process.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    while process.poll() is None:
        if time.monotonic() - start > limits.wall_s:
            return _("exceeded its {seconds:g} s limit").format(seconds=limits.wall_s)
        procs = _job_processes(process, token)
        count = cgroup.count()
        count = len(procs) if count is None else count
        if count > limits.processes:
            return _("started more than {n} processes at once (a fork bomb?)").format(n=limits.processes)
        rss = cgroup.memory()
        if rss is None:  # no memory controller: private memory per process (forked copies share the rest)
            rss = 0
            for p in procs:
                try:
                    info = p.memory_info()
                    rss += info.rss - getattr(info, "shared", 0)
                except psutil.Error:
                    pass
        if rss > limits.total_memory_bytes:
            return _("used more than {gib:g} GiB of memory").format(gib=limits.total_memory_bytes / 2**30)
        time.sleep(0.1)
    return None


def _kill_job(process, token: str) -> None:
    """Stop the job and everything it started: its session, its descendants, its orphans (found
    first: once the reaper is gone they would be init's)."""
    first = _job_processes(process, token)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for round in range(3):  # orphans may fork while we kill; a few rounds catch them
        victims = first if round == 0 else _job_processes(process, token)
        for p in victims:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(victims, timeout=2)
        if not victims:
            break
    if process.poll() is None:
        process.kill()
    process.wait()
