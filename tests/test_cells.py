"""A student's own code on real ranks (parallel_lab.runtime.cells and the %%ranks magic): a function
written in a cell runs on 2 and 4 ranks; an exception names the rank and the line in the cell; a hang
says what each rank is blocked in; nothing is left behind; a verdict keeps the answer's line."""

import linecache
import os
import textwrap

import pytest
import torch

from parallel_lab.runtime import cells, launcher

pytestmark = pytest.mark.ranks


def cell(source: str, number: int = 7) -> dict:
    """Run ``source`` as IPython would run notebook cell ``number``: its text in linecache under a
    file name of its own, its definitions in a namespace; the namespace."""
    source = textwrap.dedent(source).lstrip("\n")
    filename = f"/tmp/ipykernel_0/{number}.py"  # what IPython 8 calls a cell's file
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"torch": torch, "__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def alive(pids) -> list:
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            out.append(pid)
        except OSError:
            pass
    return out


def test_only_the_cells_definitions_travel_and_keep_their_line_numbers():
    source = "import torch\nN = 3\nprint('hello')\n\ndef f(x):\n    return x + N\n\ncells.run(f, 2)\n"
    sent = cells.definitions(source)
    assert sent.splitlines() == ["import torch", "N = 3", "", "", "def f(x):", "    return x + N", "", ""]
    with pytest.raises(SyntaxError):
        cells.definitions("def f(:\n")


@pytest.mark.parametrize("world", [2, 4])
def test_a_function_written_in_a_cell_runs_on_real_ranks(world):
    ns = cell("""
        import torch.distributed as dist

        SCALE = 10

        def my_all_reduce(n):
            x = torch.full((n,), float(dist.get_rank()) * SCALE)
            dist.all_reduce(x)
            return {"rank": dist.get_rank(), "sum": x}
        """)
    results = cells.run(ns["my_all_reduce"], world, args=(3,))
    expected = torch.full((3,), float(sum(range(world)) * 10))
    assert [r["rank"] for r in results] == list(range(world))
    assert all(torch.equal(r["sum"], expected) and r["sum"].dtype == torch.float32 for r in results)


def test_an_exception_names_the_rank_and_the_line_in_the_cell():
    ns = cell("""
        import torch.distributed as dist

        def my_step():
            rank = dist.get_rank()
            if rank == 1:
                return 1 / 0
            return rank
        """, number=12)
    with pytest.raises(launcher.RankError) as caught:
        cells.run(ns["my_step"], 2, timeout=20)
    err = caught.value
    assert err.rank == 1 and err.exc_type == "ZeroDivisionError"
    text = str(err)
    assert 'File "/tmp/ipykernel_0/12.py", line 6, in my_step' in text and "return 1 / 0" in text
    assert "parallel_lab" not in err.remote_traceback  # the harness's frames are left out
    shown = err._render_traceback_()  # what IPython shows instead of the kernel's own traceback
    assert shown[0].startswith("RankError: rank 1 raised ZeroDivisionError") and "return 1 / 0" in "\n".join(shown)
    assert launcher.pool_pids() == []


def test_a_hang_says_what_each_rank_is_blocked_in_and_leaves_nothing_behind():
    ns = cell("""
        import torch.distributed as dist

        def my_exchange():
            x = torch.zeros(1)
            dist.recv(x, src=(dist.get_rank() + 1) % dist.get_world_size())  # everyone waits: no one sends
            return x
        """)
    with pytest.raises(launcher.RanksHung) as caught:
        cells.run(ns["my_exchange"], 2, timeout=4)
    assert set(caught.value.blocked) == {0, 1}
    assert caught.value.blocked[0].startswith("recv(src=1") and caught.value.blocked[1].startswith("recv(src=0")
    assert launcher.pool_pids() == []


def test_a_whole_cell_runs_on_every_rank_and_gives_its_last_value():
    source = "\nx = torch.ones(2) * rank\ndist.all_reduce(x)\nprint('done', rank)\nx.tolist()\n"
    assert cells.run_source(source, 2, filename="Cell In[3]") == [[1.0, 1.0], [1.0, 1.0]]
    with pytest.raises(launcher.RankError) as caught:
        cells.run_source("\nundefined_name + 1\n", 2, filename="Cell In[4]")
    assert 'File "Cell In[4]", line 2' in str(caught.value) and "undefined_name + 1" in str(caught.value)


def test_the_magic_runs_the_cell_on_the_ranks_it_names(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    from parallel_lab.course import notebook

    shell = InteractiveShell.instance()
    notebook.register_magics(shell)
    result = shell.run_cell("%%ranks 4\nx = torch.tensor([float(rank)])\ndist.all_reduce(x)\nprint(int(x))\nint(x)\n")
    assert result.success and result.result == [6, 6, 6, 6]
    out = capsys.readouterr().out
    assert "[rank 0] 6" in out and "[rank 3] 6" in out
    failed = shell.run_cell("%%ranks 2\ny = 1\nraise ValueError(f'bad rank {rank}')\n")
    assert not failed.success and isinstance(failed.error_in_exec, launcher.RankError)
    assert "line 3" in str(failed.error_in_exec) and "raise ValueError" in str(failed.error_in_exec)
    bad = shell.run_cell("%%ranks many\nx = 1\n")
    assert not bad.success and "%%ranks N" in str(bad.error_in_exec)


def test_the_magic_runs_with_a_function_from_another_cell_and_says_not_yet_for_a_stub(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    from parallel_lab.course import notebook

    shell = InteractiveShell.instance()
    notebook.register_magics(shell)
    assert shell.run_cell("import torch\nimport torch.distributed as dist\n\ndef my_double(x):\n"
                          "    dist.all_reduce(x)\n    return x\n").success
    done = shell.run_cell("%%ranks 2 --with my_double\nmy_double(torch.tensor([float(rank)])).tolist()\n")
    assert done.success and done.result == [[1.0], [1.0]]
    assert shell.run_cell("def my_stub(x):\n    # YOUR CODE HERE\n    raise NotImplementedError\n").success
    capsys.readouterr()
    stub = shell.run_cell("%%ranks 2 --with my_stub\nmy_stub(rank)\n")
    assert stub.success and stub.result is None
    assert "NOT YET: rank 0 raised NotImplementedError" in capsys.readouterr().out
    unknown = shell.run_cell("%%ranks 2 --with nothing_here\n1\n")
    assert not unknown.success and "no such function here yet" in str(unknown.error_in_exec)


def test_a_verdict_for_an_answer_that_raises_shows_the_line_of_the_answer():
    from parallel_lab.exercises import one_f_one_b, ring_all_reduce

    ring = ("import torch\nimport torch.distributed as dist\n\n\ndef my_ring_all_reduce(tensor):\n"
            "    rank = dist.get_rank()\n    scale = 1 / (rank - rank)\n    return tensor * scale\n")
    verdict = ring_all_reduce.EXERCISE.check(ring)
    assert not verdict.passed
    text = str(verdict)
    assert "rank 0 raised ZeroDivisionError: division by zero" in text
    assert "  your answer, line 7, in my_ring_all_reduce: scale = 1 / (rank - rank)" in text
    assert "parallel_lab" not in text  # the harness's own frames are not the student's business
    order = "def my_one_f_one_b(p, m):\n    ranks = []\n    return ranks[p]\n"
    verdict = one_f_one_b.EXERCISE.check(order)
    assert "  your answer, line 3, in my_one_f_one_b: return ranks[p]" in str(verdict), str(verdict)


def test_a_malformed_ranks_line_is_explained_in_the_lessons_language():
    from parallel_lab.course import notebook
    from parallel_lab.i18n import using

    with pytest.raises(ValueError, match=r"^%%ranks N \[--with NAME.*; got %%ranks four$"):
        notebook._ranks_arguments("four")
    with using("zh-Hant"), pytest.raises(ValueError) as info:
        notebook._ranks_arguments("4 --width f")
    assert str(info.value).startswith("%%ranks N [--with NAME[,NAME...]] [--timeout SECONDS]：在 N 個 rank")
    assert str(info.value).endswith("；收到的是 %%ranks 4 --width f")
