"""What every lesson runs first: deterministic, quiet, and plots that nbval can compare.

    from parallel_lab.course.notebook import setup
    setup()
"""

import os
import random
import warnings


def setup(seed: int = 0) -> None:
    """Seed every generator, one thread per process, plotly as JSON (no embedded plotly.js, so
    notebooks stay small and nbval compares figure data), no stray warnings on stderr; and start
    the ranks' forkserver in the background, so that the first cell that runs ranks does not wait
    for it to import torch (see ``parallel_lab.runtime.launcher.warm``)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from parallel_lab.runtime import launcher

    launcher.warm()
    import numpy as np
    import plotly.io as pio
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.set_printoptions(precision=4, sci_mode=False)
    pio.renderers.default = "plotly_mimetype"
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
