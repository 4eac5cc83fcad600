"""``parallel-lab bench``: our pieces side by side with the named peers, in one run, as ratios.

``suites`` lists them and formats the table; one module per suite: ``launcher``, ``collectives``,
``simulator``, ``tensor`` (DTensor), ``pipeline`` (torch.distributed.pipelining).
"""
