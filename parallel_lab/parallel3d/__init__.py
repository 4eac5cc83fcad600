"""Data parallelism and 3D (DP x PP x TP) training on a device mesh, checked against one process.

- ``data_parallel``: bucketed gradient all-reduce over a replica group
- ``config``: a 3D run as plain data, and the checks made before any process starts
- ``apply``: tensor, pipeline and data parallelism applied to the dense GPT, one function each
- ``train3d``: train the course GPT with dp x pp x tp on real ranks (``parallel-lab run 3d``)
- ``validate_plans``: the planner's predicted step times against real 3D runs
"""
