"""Exercises checked on real ranks: ``check`` (the mechanism) and one module per exercise."""

from parallel_lab.exercises.balanced_cut import check_balanced_cut
from parallel_lab.exercises.g_operator import check_g_operator
from parallel_lab.exercises.one_f_one_b import check_one_f_one_b
from parallel_lab.exercises.ring_all_reduce import check_ring_all_reduce
from parallel_lab.exercises.row_parallel import check_row_parallel_forward

__all__ = ["check_balanced_cut", "check_g_operator", "check_one_f_one_b", "check_ring_all_reduce",
           "check_row_parallel_forward"]
