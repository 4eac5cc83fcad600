"""The one check of a count or a size, used wherever the package takes one from a person.

Every message names the broken invariant with its value (ARCHITECTURE.md, "Conventions"), and is raised before
any process starts:

    >>> positive_int("microbatches", 0)
    Traceback (most recent call last):
    ...
    ValueError: microbatches must be a positive integer, got microbatches 0
"""

from __future__ import annotations

import math
import numbers


def positive_int(name: str, value, *, error: type[Exception] = ValueError, context: str = "") -> int:
    """``value`` as an int, or ``error`` ("``context``name must be a positive integer, got name value")
    for anything else: a bool, a float, a string, zero or less."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise error(f"{context}{name} must be a positive integer, got {name} {value!r}")
    return int(value)


def positive_number(name: str, value, *, error: type[Exception] = ValueError, context: str = "") -> float:
    """``value`` as a float, or ``error`` unless it is a finite real number > 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise error(f"{context}{name} must be a positive number, got {name} {value!r}")
    return float(value)
