"""What every lesson runs first: deterministic, quiet, and plots that nbval can compare.

    from parallel_lab.course.notebook import setup
    setup()                  # an English lesson
    setup(lang="zh-Hant")    # its Traditional Chinese edition (lessons/zh-Hant/)
"""

import os
import random
import sys
import warnings

from parallel_lab import i18n
from parallel_lab.runtime import launcher

PLOTLY_RENDERER = "plotly_mimetype"  # figures as JSON: no embedded plotly.js, and nbval compares the data


def setup(seed: int = 0, ranks: bool = True, lang: str = "en") -> None:
    """One thread per process, the ranks' forkserver started in the background (``ranks``: the
    lesson starts ranks), every generator seeded, plotly figures as JSON (notebooks stay small and
    nbval compares figure data), no stray warnings on stderr, and everything the library shows in
    ``lang`` (the lesson's language: "en" or "zh-Hant"; ranks need none, verdicts are made here)."""
    i18n.set_language(lang)
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
