"""Course administration: what runs around the lessons, not inside the parallelism.

- ``notebook``: what every lesson runs first (``setup``)
- ``quiz``: the question banks (``quizzes/*.yaml``), answers, scores, progress
- ``predictions``: the graded predictions of the lessons (registry), read and scored as data
- ``grading``: grading submitted notebooks (reference, runner, sandbox, checker, gradebook)
- ``credentials``: Open Badges 3.0 credentials (issue, verify offline, revoke)
"""
