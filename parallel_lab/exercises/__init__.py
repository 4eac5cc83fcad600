"""Exercises checked on real ranks: ``check`` (the mechanism), ``policy`` (what an answer may use) and
one module per exercise. ``REGISTRY`` maps each exercise's check id (``check:<id>`` in its lesson)
to it; the grader looks checks up there."""

from parallel_lab.exercises.balanced_cut import check_balanced_cut
from parallel_lab.exercises.bubble_share import check_bubble_share
from parallel_lab.exercises.capstone import check_capstone
from parallel_lab.exercises.check import REGISTRY, Exercise, Verdict, reveal
from parallel_lab.exercises.device_memory import check_device_memory
from parallel_lab.exercises.g_operator import check_g_operator
from parallel_lab.exercises.hand_schedule import check_hand_schedule
from parallel_lab.exercises.lse_merge import check_lse_merge
from parallel_lab.exercises.mesh_groups import check_mesh_groups
from parallel_lab.exercises.moe_dispatch import check_moe_dispatch
from parallel_lab.exercises.one_f_one_b import check_one_f_one_b
from parallel_lab.exercises.ring_all_reduce import check_ring_all_reduce
from parallel_lab.exercises.row_parallel import check_row_parallel_forward
from parallel_lab.exercises.schedule_design import check_schedule_design
from parallel_lab.exercises.zb_h1_order import check_zb_h1_order
from parallel_lab.exercises.zero2_step import check_zero2_step

__all__ = ["REGISTRY", "Exercise", "Verdict", "check_balanced_cut", "check_bubble_share", "check_capstone",
           "check_device_memory", "check_g_operator", "check_hand_schedule", "check_lse_merge", "check_mesh_groups",
           "check_moe_dispatch", "check_one_f_one_b", "check_ring_all_reduce", "check_row_parallel_forward",
           "check_schedule_design", "check_zb_h1_order", "check_zero2_step", "reveal"]
