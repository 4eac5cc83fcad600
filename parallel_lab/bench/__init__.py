"""``parallel-lab bench``: our pieces side by side with the named peers, in one run, as ratios.

``suites`` lists the suites and formats the table; ``measure`` is what every row is (the median
wall time, the ratio, the machine's limit). One module per suite:

- ``launcher``: our forkserver pool against ``torch.multiprocessing.spawn``;
- ``collectives``: lesson 01's ring and ``runtime.transport``'s all-reduces against gloo's own;
- ``simulator``: the schedule simulator at the course's caps (no peer simulates schedules);
- ``tensor``: tensor parallelism against DTensor's ``parallelize_module``;
- ``pipeline``: the pipeline executor against ``torch.distributed.pipelining``;
- ``grading``: how fast the sandboxed grader grades a class;
- ``zero``: ZeRO-3 against FSDP2's ``fully_shard``;
- ``context``: context parallelism against one process and PyTorch's own, where it runs.
"""
