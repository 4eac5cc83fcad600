"""The launcher: real ranks from a process that already used torch, and every failure reported by rank.

Each failure mode of the foundation issue has a test here; the pool is shared between tests (as in
a notebook), so every test also checks that the *next* call works.
"""

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from multiprocessing import forkserver

import psutil
import pytest
import torch

from parallel_lab.i18n import translations, using
from parallel_lab.runtime import demos, launcher, rank_process

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(180)]

# The test process itself uses torch's OpenMP threads first: forking after this would hang.
torch.ones(256, 256) @ torch.ones(256, 256)


def test_hello_on_several_world_sizes():
    for world in (1, 2, 4, 8):
        results = launcher.run(demos.hello, world)
        assert [r["rank"] for r in results] == list(range(world))
        assert all(r["sum"] == world * (world + 1) / 2 for r in results)


def test_tensors_and_plain_objects_travel_both_ways():
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    results = launcher.run(demos.echo, 2, args=(x, "text"), kwargs={"n": [1, 2]})
    for rank, result in enumerate(results):
        assert result["rank"] == rank
        assert torch.equal(result["args"][0], x) and result["args"][1] == "text"
        assert result["kwargs"] == {"n": [1, 2]}


def test_pool_is_reused_and_replaced_for_another_world_size():
    launcher.run(demos.rank_id, 4)
    first = launcher.pool_pids()
    assert launcher.run(demos.rank_id, 4) == [0, 1, 2, 3]
    assert launcher.pool_pids() == first  # no new processes for a re-run
    assert launcher.run(demos.rank_id, 2) == [0, 1]
    assert len(launcher.pool_pids()) == 2
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in first)


def test_exception_names_rank_with_traceback_and_stops_the_others():
    launcher.run(demos.rank_id, 4)
    pids = launcher.pool_pids()
    with pytest.raises(launcher.RankError) as info:
        launcher.run(demos.fail_on, 4, args=(2, "bad shard"))
    error = info.value
    assert error.rank == 2 and error.exc_type == "ValueError"
    assert "rank 2 raised ValueError: bad shard" in str(error)
    assert "demos.py" in error.remote_traceback and "fail_on" in error.remote_traceback
    assert "rank 0: barrier()" in str(error)  # what the others were doing when stopped
    assert not any(psutil.pid_exists(pid) for pid in pids)
    assert launcher.run(demos.rank_id, 4) == [0, 1, 2, 3]


def test_system_exit_and_unpicklable_results_are_reported_not_swallowed():
    with pytest.raises(launcher.RankError, match="rank 0 raised SystemExit"):
        launcher.run(demos.exit_early, 2)
    with pytest.raises(launcher.RankError, match="return value could not be sent back"):
        launcher.run(demos.unpicklable_result, 2)
    assert launcher.run(demos.rank_id, 2) == [0, 1]


@pytest.mark.parametrize("fn, expected", [
    (demos.unmatched_send, {0: "send(dst=1, shape=(4, 8), dtype=float32)", 1: "barrier()"}),
    (demos.skipped_collective, {0: "all_reduce(shape=(3,), dtype=float32", 3: "running skipped_collective"}),
])
def test_a_blocked_rank_is_reported_with_its_operation_within_the_timeout(fn, expected):
    start = time.monotonic()
    with pytest.raises(launcher.RanksHung) as info:
        launcher.run(fn, 4, timeout=3)
    assert time.monotonic() - start < 3 + 15  # the pool start is inside the budget; never frozen
    for rank, text in expected.items():
        assert info.value.blocked[rank].startswith(text), info.value.blocked
        assert f"rank {rank}: {text}" in str(info.value)
    assert launcher.pool_pids() == []
    assert launcher.run(demos.rank_id, 4) == [0, 1, 2, 3]


@pytest.mark.parametrize("how, status", [("kill", -9), ("segfault", -11), ("exit", 3)])
def test_a_rank_that_dies_is_reported_with_its_exit_status(how, status):
    with pytest.raises(launcher.RankDied) as info:
        launcher.run(demos.die_on, 4, args=(1, how))
    assert info.value.rank == 1 and info.value.exitcode == status
    assert f"rank 1 died with exit status {status}" in str(info.value)
    assert launcher.run(demos.rank_id, 4) == [0, 1, 2, 3]


def test_a_dead_rank_is_the_cause_even_when_its_peers_report_first():
    # rank 0's "connection reset by peer" arrives 0.6 s before rank 1's death shows
    with pytest.raises(launcher.RankDied) as info:
        launcher.run(demos.die_after_peer_noticed, 4, kwargs={"delay": 0.6})
    assert info.value.rank == 1 and info.value.exitcode == 3
    assert launcher.run(demos.rank_id, 4) == [0, 1, 2, 3]


@pytest.mark.skipif(launcher.pools.start_method() != "forkserver", reason="the forkserver holds the exit status")
def test_a_dead_rank_is_the_cause_while_its_exit_status_is_still_on_the_way():
    # A rank's exit status reaches us through the forkserver, its parent, which reaps it: on a loaded
    # machine that comes late, after the peers' "connection closed by peer". Stopping the forkserver
    # for a second holds the status back: the rank's closed pipe already tells its death.
    launcher.run(demos.rank_id, 4)
    server = forkserver._forkserver._forkserver_pid
    resume = threading.Timer(1.0, os.kill, (server, signal.SIGCONT))
    os.kill(server, signal.SIGSTOP)
    resume.start()
    try:
        with pytest.raises(launcher.RankDied) as info:
            launcher.run(demos.die_on, 4, args=(1, "exit"))
    finally:
        resume.join()
        os.kill(server, signal.SIGCONT)
    assert info.value.rank == 1 and info.value.exitcode == 3
    assert launcher.run(demos.rank_id, 4) == [0, 1, 2, 3]


def test_ranks_keep_freed_memory_for_the_next_step_instead_of_faulting_it_in_again():
    # 36 MB of 12 MB blocks, freed and allocated again: under glibc's moving thresholds a fresh rank
    # maps the first round's blocks on their own, takes the next from the heap and gives the heap's
    # top back at every free (9,000+ faults a round); with keep_freed_memory the pages stay.
    launcher.shutdown()  # fresh ranks: glibc's thresholds as a new process has them
    for rank, faults in enumerate(launcher.run(demos.heap_refaults, 2)):
        assert max(faults[1:]) < 100, f"rank {rank}: minor faults per round {faults}"


def test_default_timeout_is_at_most_30_seconds():
    assert launcher.DEFAULT_TIMEOUT <= 30


# -------------------------------------------------------------------------------------------------
# Bad arguments fail at once, before any process starts.

def _defined_in_a_cell():
    namespace = {"__name__": "__main__"}
    exec("def my_step():\n    return 1\n", namespace)
    return namespace["my_step"]


def _nested():
    def inner():
        return 1
    return inner


@pytest.mark.parametrize("call, error, words", [
    (lambda: launcher.run(demos.rank_id, 0), ValueError, "world_size must be in 1..8"),
    (lambda: launcher.run(demos.rank_id, 9), ValueError, "got 9"),
    (lambda: launcher.run(demos.rank_id, "4"), TypeError, "must be an int"),
    (lambda: launcher.run(lambda: 1, 2), ValueError, "cannot run a lambda"),
    (lambda: launcher.run(_defined_in_a_cell(), 2), ValueError, "defined in a notebook cell"),
    (lambda: launcher.run(_nested(), 2), ValueError, "defined in another function"),
    (lambda: launcher.run(demos.echo, 2, args=((x for x in "ab"),)), TypeError, "cannot be sent to ranks"),
    (lambda: launcher.run(demos.echo, 2, timeout=0), ValueError, "timeout must be a positive"),
    (lambda: launcher.prepare(demos.rank_id, 9), ValueError, "got 9"),
    (lambda: launcher.start(launcher.prepare(demos.echo, 2), args=((x for x in "ab"),)), TypeError,
     "cannot be sent to ranks"),
    (lambda: launcher.start((demos.rank_id, 2)), TypeError, "takes a Launch from launcher.prepare"),
])
def test_bad_arguments_fail_before_any_process_starts(call, error, words):
    launcher.shutdown()
    before = psutil.Process().children(recursive=True)
    start = time.monotonic()
    with pytest.raises(error, match=words) as info:
        call()
    assert time.monotonic() - start < 1.0
    assert psutil.Process().children(recursive=True) == before == []
    if "defined" in words:
        assert "cells.run(fn, N)" in str(info.value)  # says what to do instead


def test_a_launch_refused_before_it_starts_says_why_in_the_lessons_language():
    zh = translations("zh-Hant").gettext
    with using("zh-Hant"):
        with pytest.raises(ValueError) as lambda_error:
            launcher.run(lambda: 1, 2)
        with pytest.raises(ValueError) as world_error:
            launcher.run(demos.rank_id, 9)
        with pytest.raises(TypeError) as pickle_error:
            launcher.run(demos.echo, 2, args=((x for x in "ab"),))
    assert str(lambda_error.value).startswith(zh("cannot run a lambda on ranks.") + " 每個 rank 都是獨立的行程")
    assert str(world_error.value).startswith("world_size 必須在 1..8 之間")
    assert str(world_error.value).endswith("收到 9")
    assert str(pickle_error.value).startswith("echo 的引數無法送到 rank：")


# -------------------------------------------------------------------------------------------------
# Nothing left behind, and two kernels side by side.

def _footprint():
    """Our processes, shared-memory segments and listening TCP ports."""
    me = psutil.Process()
    children = {p.pid for p in me.children(recursive=True)}
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    ports = {c.laddr.port for c in psutil.net_connections("tcp")
             if c.status == psutil.CONN_LISTEN and c.pid in children | {me.pid}}
    return children, shm, ports


def test_fifty_launches_leave_nothing_behind():
    launcher.shutdown()
    before = _footprint()
    assert before[0] == set() and before[2] == set()
    for i in range(50):
        if i % 10 == 5:  # every tenth launch fails; the pool restarts after it
            with pytest.raises(launcher.RankError):
                launcher.run(demos.fail_on, 2, args=(1,))
        else:
            assert launcher.run(demos.rank_id, 2 if i % 4 else 4)[-1] in (1, 3)
    during = _footprint()
    assert len(during[0]) == len(launcher.pool_pids()) + 2  # the ranks, forkserver, resource tracker
    launcher.shutdown()
    after = _footprint()
    assert after[0] == set(), f"processes left: {after[0]}"
    assert after[1] == before[1], f"shared memory left: {after[1] - before[1]}"
    assert after[2] == set(), f"listening ports left: {after[2]}"


def test_warm_starts_the_forkserver_ahead_and_shutdown_stops_it():
    """notebook.setup() calls warm(): the forkserver imports torch before the first run needs it."""
    launcher.shutdown()
    me = psutil.Process()
    assert me.children(recursive=True) == []
    launcher.warm(wait=True)
    helpers = {p.pid for p in me.children(recursive=True)}
    assert len(helpers) == 2 and launcher.pool_pids() == []  # forkserver, resource tracker; no rank yet
    assert launcher.run(demos.rank_id, 4) == [0, 1, 2, 3]
    assert {p.pid for p in me.children(recursive=True)} == helpers | set(launcher.pool_pids())
    launcher.shutdown()
    assert me.children(recursive=True) == []


KERNEL_LIKE = textwrap.dedent("""
    import json, sys, torch
    torch.ones(256, 256) @ torch.ones(256, 256)
    from parallel_lab.runtime import launcher, demos
    sums = [launcher.run(demos.hello, 4)[0]["sum"] for _ in range(int(sys.argv[1]))]
    print(json.dumps(sums))
""")


def test_two_kernels_running_ranks_at_the_same_time_do_not_collide(tmp_path):
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL_LIKE)
    procs = [subprocess.Popen([sys.executable, str(script), "15"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert json.loads(out) == [10.0] * 15


def test_interrupting_a_jupyter_kernel_stops_all_ranks():
    jupyter_client = pytest.importorskip("jupyter_client")
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(extra_arguments=["--HistoryManager.enabled=False"])
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)

        def execute(code, timeout=60):
            reply = kc.execute_interactive(code, timeout=timeout, output_hook=lambda msg: None)
            return reply["content"]

        setup = ("import torch; torch.ones(256,256) @ torch.ones(256,256)\n"
                 "from parallel_lab.runtime import launcher, demos\n"
                 "launcher.run(demos.rank_id, 4); pids = launcher.pool_pids()")
        assert execute(setup)["status"] == "ok"
        pids = json.loads(_kernel_value(kc, "pids"))
        assert len(pids) == 4
        msg_id = kc.execute("launcher.run(demos.sleep, 4, args=(120,), timeout=300)")
        time.sleep(2.0)
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in pids)
        assert execute("assert launcher.run(demos.rank_id, 4) == [0, 1, 2, 3]")["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _kernel_value(kc, expression):
    outputs = []
    kc.execute_interactive(f"import json; print(json.dumps({expression}))", timeout=30,
                           output_hook=lambda msg: outputs.append(msg["content"].get("text", "")))
    return "".join(outputs)


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_same_function_runs_under_torchrun():
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "parallel_lab.runtime.torchrun",
         "parallel_lab.runtime.demos:hello"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["world_size"] == 2
    assert [r["sum"] for r in result["results"]] == [3.0, 3.0]


def test_task_messages_use_plain_pickle():
    # Tensors come back as copies (plain pickle), never as shared-memory handles that could leak.
    blob = rank_process.encode_task(demos.echo, (torch.ones(2),), {})
    assert pickle.loads(blob)[2][0].sum() == 2
    assert pickle.loads(blob)[4] == "en"  # the language travels as a plain string


def test_what_ranks_print_is_shown_prefixed_in_rank_order(capsys):
    assert launcher.run(demos.say_hello, 3) == [0, 1, 2]
    assert capsys.readouterr().out == "".join(f"[rank {r}] hello from rank {r} of 3\n" for r in range(3))


def test_when_every_rank_raises_the_lowest_rank_is_reported():
    for _ in range(5):  # whichever message arrives first, the report is the same
        with pytest.raises(launcher.RankError) as info:
            launcher.run(demos.fail_on_all, 4)
        assert info.value.rank == 0


# -------------------------------------------------------------------------------------------------
# Ranks speak the language of the process that sent them the task (a lesson's, a grader's block).

def test_ranks_speak_the_language_of_the_process_that_sent_the_task(capsys):
    message = "hello from rank {rank} of {world}"
    chinese = translations("zh-Hant").gettext(message)
    assert chinese != message
    with using("zh-Hant"):
        assert launcher.run(demos.words, 2, args=(message,)) == [chinese, chinese]
        assert launcher.run(demos.words, 2, args=(message,), untrusted=True) == [chinese, chinese]
        launcher.run(demos.say_hello, 2)
    assert capsys.readouterr().out == "".join(f"[rank {r}] {chinese.format(rank=r, world=2)}\n" for r in range(2))
    assert launcher.run(demos.words, 2, args=(message,)) == [message, message]  # the same pool, English again
    assert rank_process.encode_task(demos.words, (), {}, "zh-Hant")  # a language the course has
    with pytest.raises(ValueError, match="not one of the course's"):
        rank_process.encode_task(demos.words, (), {}, "fr")


def test_what_the_launcher_reports_about_ranks_is_in_the_lessons_language():
    launcher.run(demos.rank_id, 4)  # the pool is up: the 3 s are the task's
    with using("zh-Hant"), pytest.raises(launcher.RanksHung) as hung:
        launcher.run(demos.skipped_collective, 4, timeout=3)
    running = translations("zh-Hant").gettext("running {name}").format(name="skipped_collective")
    assert hung.value.blocked[3] == running and running in str(hung.value)
    with using("zh-Hant"), pytest.raises(launcher.RankDied) as died:
        launcher.run(demos.die_on, 4, args=(1, "exit"))
    assert str(died.value).splitlines()[0] == "rank 1 結束了（結束狀態 3），當時正在執行 die_on"
    with using("zh-Hant"), pytest.raises(launcher.RankError) as error:
        launcher.run(demos.fail_on, 4, args=(2, demos.OUT_OF_MEMORY))
    assert error.value.message == "假裝這個 rank 的記憶體用完了"
    assert "rank 0：barrier()（持續 " in error.value.others
    assert launcher.run(demos.rank_id, 4) == [0, 1, 2, 3]
