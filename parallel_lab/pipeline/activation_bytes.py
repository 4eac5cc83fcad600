"""The bytes activations hold: one rule for a stage's worker, the executor's records and the profiler.

    counter = ByteCounter(exclude=module.parameters())
    with counter.saved():                  # every tensor autograd saves for the backward
        out = module(x)
    counter.add(x)                         # and anything else kept
    counter.total                          # bytes

A tensor counts the bytes of its storage it can reach: from its first element to its last (its own
size when it is contiguous). Tensors that share a storage count once, as one extent from the lowest
to the highest byte any of them reaches: a micro-batch that is a slice of the whole batch counts its
slice, not the batch; the query, key and value cut from one projection count that projection once.
Storages of ``exclude`` (the parameters) are left out.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

import torch


class ByteCounter:
    """Bytes of the tensors ``add`` has seen (see the module's rule), parameters in ``exclude`` left out."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self.skip = {t.untyped_storage().data_ptr() for t in exclude}
        self.extents: dict[int, tuple[int, int]] = {}  # storage address -> (first byte, past the last)

    def add(self, t):
        """Count ``t`` (anything that is not a tensor is ignored); returns ``t`` (a pack hook)."""
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return t
        address = t.untyped_storage().data_ptr()
        if address in self.skip:
            return t
        size = t.element_size()
        first = t.storage_offset()
        last = first + sum((n - 1) * stride for n, stride in zip(t.shape, t.stride()))
        lo, hi = self.extents.get(address, (first * size, (last + 1) * size))
        self.extents[address] = (min(lo, first * size), max(hi, (last + 1) * size))
        return t

    @property
    def total(self) -> int:
        return sum(hi - lo for lo, hi in self.extents.values())

    @contextmanager
    def saved(self) -> Iterator["ByteCounter"]:
        """Count every tensor autograd saves for the backward inside the block."""
        with torch.autograd.graph.saved_tensors_hooks(self.add, lambda t: t):
            yield self


def tensor_bytes(tensors: Iterable, exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes ``tensors`` hold together (None entries skipped), by the module's rule."""
    counter = ByteCounter(exclude)
    for t in tensors:
        counter.add(t)
    return counter.total
