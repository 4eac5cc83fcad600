"""Every picture, table and widget of the lessons (plotly, ipywidgets). Nothing else in the package
imports this folder: the engine below knows nothing about how it is drawn.

One module per idea it draws: ``collectives``, ``memory``, ``tensor`` and ``tp_cost``, ``pipeline``
(Gantt charts, memory, the schedule panel), ``schedules``, ``recompute``, ``pipedream``,
``balance``, ``mesh``, ``train3d``, ``planner``, ``quizbox`` (the quiz widget), ``predict`` (a
prediction recorded before a run, against the measurement after it).
"""
