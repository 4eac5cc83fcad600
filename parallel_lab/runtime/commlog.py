"""What every rank says on the wire: each torch.distributed call, described, counted and timed.

Installed in every rank process by the launcher (``install``), this module wraps the public
point-to-point and collective functions of ``torch.distributed`` so that

- the launcher can say, for a hung rank, which operation it is blocked in
  (``recv(src=1, shape=(4, 8), dtype=float64, tag=0)``), and
- lessons can *measure* communication: ``with recording() as log: ...`` gives per op and group the
  number of calls and the bytes handed to them (lesson 01; the tensor-parallel lesson uses it to show
  a transformer layer does two all-reduces forward and two backward).

Bytes are the size of the tensor(s) a rank passes in (for ``all_gather`` its own shard, for
``reduce_scatter`` its full input), i.e. what the rank contributes, not what the algorithm moves on
each link.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

# Functions wrapped, in both torch.distributed and distributed_c10d (so identity checks such as
# ``op.op is isend`` inside batch_isend_irecv keep working).
WRAPPED = (
    "send", "recv", "isend", "irecv", "batch_isend_irecv",
    "broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single",
    "gather", "scatter", "barrier",
)

_PEER_ARGS = ("dst", "src", "group_dst", "group_src")
_local = threading.local()  # .depth: nesting of wrapped calls (only the outermost is recorded)
_status = None  # callable(str | None): tells the launcher what this rank is blocked in
_activity = None  # what the rank's own code says it is doing (set_activity), prefixed to the status
_logs: list["CommLog"] = []  # active recording() blocks


@dataclass
class CommLog:
    """Counts of communication calls on one rank: ``(op, group) -> [calls, bytes]``."""

    ops: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0]))

    def add(self, op: str, group: str, nbytes: int) -> None:
        entry = self.ops[(op, group)]
        entry[0] += 1
        entry[1] += nbytes

    def calls(self, op: str) -> int:
        return sum(c for (name, _), (c, _) in self.ops.items() if name == op)

    def bytes(self, op: str | None = None) -> int:
        return sum(b for (name, _), (_, b) in self.ops.items() if op in (None, name))

    def as_dict(self) -> dict:
        """``{op: {"count": n, "bytes": b}}`` summed over groups (plain data, picklable, JSON-able)."""
        out: dict = {}
        for (op, _), (count, nbytes) in sorted(self.ops.items()):
            row = out.setdefault(op, {"count": 0, "bytes": 0})
            row["count"] += count
            row["bytes"] += nbytes
        return out


@contextmanager
def recording():
    """Record every wrapped call made on this rank inside the block: ``with recording() as log:``."""
    log = CommLog()
    _logs.append(log)
    try:
        yield log
    finally:
        _logs.remove(log)


def install(status=None) -> None:
    """Wrap torch.distributed's communication functions (idempotent). ``status(text|None)`` is told
    what the rank is blocked in; None means it left the call."""
    global _status
    _status = status
    for name in WRAPPED:
        original = getattr(c10d, name, None)
        if original is None:  # not in this torch release
            continue
        if getattr(original, "_parallel_lab_original", None) is not None:
            continue
        wrapper = _wrap(name, original)
        setattr(c10d, name, wrapper)
        setattr(dist, name, wrapper)


def _wrap(name, original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if getattr(_local, "depth", 0):  # called from inside another wrapped call: the outer one speaks for it
            return original(*args, **kwargs)
        bound = signature.bind_partial(*args, **kwargs).arguments
        text = describe(name, bound)
        with _inside(text, name, bound):
            result = original(*args, **kwargs)
        return _traced(result, text)

    wrapper._parallel_lab_original = original
    return wrapper


@contextmanager
def speaking_for(op: str, tensor, group=None):
    """Record one ``op`` call on ``tensor`` (its bytes, its group) and run the block as its inside:
    for a collective built from other calls (``transport.all_reduce``'s one-shot algorithm is
    sends and receives), so that logs and hang reports name what the caller asked for."""
    bound = {"tensor": tensor, "group": group}
    with _inside(describe(op, bound) if not getattr(_local, "depth", 0) else "", op, bound):
        yield


def count(op: str, **bound) -> None:
    """Record one ``op`` call made another way than through torch.distributed (a pipeline message
    through shared memory: ``count("isend", tensor=t, dst=1)``), as its wrapper would."""
    if _logs and not getattr(_local, "depth", 0):
        for log in _logs:
            log.add(op, _group_name(bound.get("group")), _nbytes(op, bound))


@contextmanager
def aside(text: str):
    """Run the block as the library's own bookkeeping, not the program's communication: the calls
    inside are not recorded (a shared-memory channel's one-time setup), and a hang report reads
    ``text``."""
    with _inside(text, None, None):
        yield


@contextmanager
def _inside(text: str, op: str | None, bound: dict | None):
    """The block is one call: recorded as ``op`` (unless None), the status says ``text``, and the
    calls made inside are not recorded (nor inside a block that is already one call)."""
    if getattr(_local, "depth", 0):
        yield
        return
    if op is not None:
        for log in _logs:
            log.add(op, _group_name(bound.get("group")), _nbytes(op, bound))
    _local.depth = 1
    _set_status(text)
    try:
        yield
    finally:
        _local.depth = 0
        _set_status(None)


def _traced(result, text):
    """Async calls return Work handles; wrap them so that ``wait()`` reports where it blocks."""
    if isinstance(result, list):
        return [_traced(work, text) for work in result]
    if isinstance(result, dist.Work):
        return TracedWork(result, text)
    return result


class TracedWork:
    """A ``dist.Work`` whose ``wait()`` tells the launcher what this rank waits for."""

    def __init__(self, work, text):
        self._work, self._text = work, text

    def wait(self, *args, **kwargs):
        _set_status(f"wait({self._text})")
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            _set_status(None)

    def __getattr__(self, name):
        return getattr(self._work, name)


def set_activity(text: str | None) -> None:
    """Say what this rank is doing in its own terms (e.g. "pipeline action 1B3 (...)"); a hang report
    then reads "<activity>: recv(src=2, ...)". None clears it. Cheap enough for a hot loop: the
    status line is only written when the next communication call starts."""
    global _activity
    _activity = text


@contextmanager
def unwrapped():
    """torch.distributed's own functions inside the block (no descriptions, no counts): for timing
    against peers that pay no such bookkeeping, as under torchrun. The wrappers come back after."""
    restored = {}
    for name in WRAPPED:
        wrapper = getattr(c10d, name, None)
        original = getattr(wrapper, "_parallel_lab_original", None)
        if original is not None:
            restored[name] = wrapper
            setattr(c10d, name, original)
            setattr(dist, name, original)
    try:
        yield
    finally:
        for name, wrapper in restored.items():
            setattr(c10d, name, wrapper)
            setattr(dist, name, wrapper)


def _set_status(text):
    if _status is None:
        return
    if _activity is None:
        _status(text)
    else:
        _status(f"{_activity}: {text}" if text else _activity)


def merge_counts(*logs: dict) -> dict:
    """Sum ``{op: {"count", "bytes"}}`` dicts (``as_dict`` of several recordings: a forward and a
    backward), ops in name order."""
    out: dict = {}
    for log in logs:
        for op, row in log.items():
            total = out.setdefault(op, {"count": 0, "bytes": 0})
            total["count"] += row["count"]
            total["bytes"] += row["bytes"]
    return dict(sorted(out.items()))


def describe(op: str, bound: dict) -> str:
    """One line saying what a call does: ``recv(src=1, shape=(4, 8), dtype=float64, tag=0)``."""
    parts = [f"{key}={bound[key]}" for key in _PEER_ARGS if bound.get(key) is not None]
    tensors = _tensors(bound)
    if tensors:
        t = tensors[0]
        shape = tuple(t.shape)
        parts.append(f"shape={shape}" + (f" x{len(tensors)}" if len(tensors) > 1 else ""))
        parts.append(f"dtype={str(t.dtype).removeprefix('torch.')}")
    if "op" in bound and op != "batch_isend_irecv":
        parts.append(f"op={getattr(bound['op'], 'name', bound['op'])}")
    if bound.get("tag"):
        parts.append(f"tag={bound['tag']}")
    if op == "batch_isend_irecv":
        ops = bound.get("p2p_op_list") or []
        parts = [", ".join(f"{p.op.__name__}(peer={p.peer}, shape={tuple(p.tensor.shape)})" for p in ops)]
    group = _group_name(bound.get("group"))
    if group != "world":
        parts.append(f"group={group}")
    return f"{op}({', '.join(parts)})"


def _tensors(bound: dict) -> list:
    found = []
    for value in bound.values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def _nbytes(op: str, bound: dict) -> int:
    def size(t):
        return t.numel() * t.element_size()

    if op == "batch_isend_irecv":
        return sum(size(p.tensor) for p in bound.get("p2p_op_list") or [])
    if op in ("all_gather", "all_gather_into_tensor", "all_gather_single"):
        t = bound.get("tensor", bound.get("input_tensor"))
        return size(t) if isinstance(t, torch.Tensor) else 0
    if op in ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single"):
        t = bound.get("input_list", bound.get("input"))
        return sum(size(x) for x in t) if isinstance(t, (list, tuple)) else size(t)
    if op == "all_to_all":
        return sum(size(t) for t in bound.get("input_tensor_list", []))
    if op == "all_to_all_single":  # its first tensor is the output: what the rank receives
        t = bound.get("input")
        return size(t) if isinstance(t, torch.Tensor) else 0
    tensors = _tensors(bound)  # the call's first tensor is the one this rank contributes
    return size(tensors[0]) if tensors else 0


def _group_name(group) -> str:
    if group is None or group is dist.GroupMember.WORLD:
        return "world"
    try:
        return "ranks" + ",".join(map(str, dist.get_process_group_ranks(group)))
    except (RuntimeError, ValueError):
        return str(group)
