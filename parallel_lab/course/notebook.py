"""What every lesson runs first: deterministic, quiet, plots that nbval can compare, and ``%%ranks``.

    from parallel_lab.course.notebook import setup
    setup()                  # an English lesson
    setup(lang="zh-Hant")    # its Traditional Chinese edition (lessons/zh-Hant/)

    %%ranks 4                # then: this cell runs on 4 real ranks (parallel_lab.runtime.cells)
"""

import os
import random
import sys
import warnings

from parallel_lab import i18n
from parallel_lab.i18n import N_, _
from parallel_lab.runtime import cells, launcher

PLOTLY_RENDERER = "plotly_mimetype"  # figures as JSON: no embedded plotly.js, and nbval compares the data


def setup(seed: int = 0, ranks: bool = True, lang: str = "en") -> None:
    """One thread per process, the ranks' forkserver started in the background (``ranks``: the
    lesson starts ranks), every generator seeded, plotly figures as JSON (notebooks stay small and
    nbval compares figure data), no stray warnings on stderr, and everything the library shows in
    ``lang`` (the lesson's language: "en" or "zh-Hant"; ranks speak it too, since every task carries
    the language it was sent in, and verdicts are made here)."""
    i18n.set_language(lang)
    os.environ[i18n.translate.ENVIRONMENT] = lang  # a program the lesson starts (parallel-lab plan) speaks it too
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy and torch start their thread pools
    # The forkserver imports torch (~3 s here) while this kernel imports it on the other core: the
    # first cell that runs ranks then only forks them (measured on 2 cores: ~0.1 s for 4 ranks,
    # instead of ~2.4 s when torch is imported first; see parallel_lab.runtime.launcher.warm).
    if ranks:
        launcher.warm()
    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.set_printoptions(precision=4, sci_mode=False)
    # plotly reads PLOTLY_RENDERER when it is first imported (by parallel_lab.show); a kernel that
    # has imported it already is told directly.
    os.environ["PLOTLY_RENDERER"] = PLOTLY_RENDERER
    if "plotly.io" in sys.modules:
        sys.modules["plotly.io"].renderers.default = PLOTLY_RENDERER
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
    register_magics()


RANKS_USAGE = N_("%%ranks N [--with NAME[,NAME...]] [--timeout SECONDS]: run this cell on N ranks (1-8), "
                 "after the cells that define the functions named, e.g. %%ranks 4 --with my_ring_all_reduce")


def _ranks_arguments(line: str) -> tuple[int, list, float]:
    words = line.split()
    try:
        world, rest = int(words[0]), words[1:]
        using, timeout = [], cells.DEFAULT_TIMEOUT
        while rest:
            option, value, rest = rest[0], rest[1], rest[2:]
            if option == "--with":
                using += [name for name in value.split(",") if name]
            elif option == "--timeout":
                timeout = float(value)
            else:
                raise ValueError(option)
    except (IndexError, ValueError):
        raise ValueError(_("{usage}; got %%ranks {line}").format(usage=_(RANKS_USAGE), line=line.strip())) from None
    return world, using, timeout


def register_magics(shell=None) -> None:
    """Register ``%%ranks N`` in IPython (``shell``, or the running one; nothing outside IPython): the
    cell runs on N fresh ranks with ``rank``, ``world_size``, ``torch`` and ``dist`` defined, after
    the definitions of the cells that define the functions ``--with`` names; its last expression's
    value on each rank is the cell's result (``runtime.cells.run_source``). A function that still
    raises NotImplementedError (an exercise's stub) gets a NOT YET line instead of an error."""
    if shell is None:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return

    def ranks(line, cell):
        world, names, timeout = _ranks_arguments(line)
        missing = [name for name in names if not callable(shell.user_ns.get(name))]
        if missing:
            raise NameError(_("%%ranks --with {names}: no such function here yet (run the cell that defines it "
                              "first)").format(names=",".join(missing)))
        # A blank first line keeps the cell's line numbers: line 1 is the %%ranks line.
        name = f"Cell In[{shell.execution_count}]"
        try:
            values = cells.run_source("\n" + cell, world, filename=name, timeout=timeout,
                                      using=[shell.user_ns[n] for n in names])
        except cells.RankError as err:
            if err.exc_type != "NotImplementedError":
                raise
            print(_("NOT YET: rank {rank} raised NotImplementedError: write the function where it says "
                         "# YOUR CODE HERE (and remove that raise), run its cell, then this one").format(rank=err.rank))
            return None
        return None if all(v is None for v in values) else values

    shell.register_magic_function(ranks, magic_kind="cell", magic_name="ranks")
