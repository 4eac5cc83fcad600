"""The device mesh of 3D parallelism: which rank holds which (data, pipeline, tensor) coordinate.

    dims = ParallelDims(dp=2, pp=2, tp=2, nodes=2)      # 8 ranks, 4 per node; checked at once
    dims.grid()                  # torch.arange(8).view(dp, pp, tp)
    dims.coords(5)               # Coord(dp=1, pp=0, tp=1)
    dims.tp_groups()             # [[0, 1], [2, 3], [4, 5], [6, 7]]
    groups = build_groups(dims)  # on a rank (inside a launcher function): explicit process groups

The rank grid is picotron's: ``torch.arange(world).view(dp, pp, tp)``. Tensor parallelism is the
fastest-varying dimension, so the ranks of a TP group are adjacent numbers, hence on one node (TP
all-reduces twice per layer and needs the fast intra-node links); pipeline stages are ``tp`` ranks
apart and data-parallel replicas ``pp * tp`` apart, so those groups are the ones that cross nodes
(Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", section 3.3). Ranks are numbered node by node: node ``n`` holds ranks
``n*devices_per_node ... (n+1)*devices_per_node - 1``, as torchrun numbers them.

Everything except ``build_groups`` is pure arithmetic: no process is needed to check a layout, and
every error names the broken invariant with its values before anything starts.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist

from parallel_lab.checks import positive_int
from parallel_lab.i18n import N_, _, ngettext

DIMS = ("dp", "pp", "tp")
# The two ways a tensor-parallel group straddles nodes: ParallelDims raises them, the planner rejects a
# layout with them (``tp_crossing``), each translated where it is shown.
TP_OVER_NODE = N_("tp {tp} > devices_per_node {devices}: tensor parallel groups would cross nodes")
TP_SPLITS_NODE = N_("devices_per_node {devices} % tp {tp} != 0: tensor parallel groups would cross nodes "
                    "(ranks {first}..{last} span nodes 0 and 1)")


def tp_crossing(tp: int, devices_per_node: int) -> tuple[str, dict] | None:
    """``(message, values)`` when groups of ``tp`` adjacent ranks would straddle two nodes of
    ``devices_per_node`` devices (``TP_OVER_NODE`` or ``TP_SPLITS_NODE``, English, ``_()`` translates
    it), else None."""
    if tp > devices_per_node:
        return TP_OVER_NODE, {"tp": tp, "devices": devices_per_node}
    if devices_per_node % tp:
        first = devices_per_node - devices_per_node % tp  # the TP group that starts on node 0 and ends on node 1
        return TP_SPLITS_NODE, {"tp": tp, "devices": devices_per_node, "first": first, "last": first + tp - 1}
    return None


class Coord(NamedTuple):
    """Where a rank sits in the grid: data-parallel replica, pipeline stage, tensor-parallel shard."""

    dp: int
    pp: int
    tp: int


@dataclass(frozen=True)
class ParallelDims:
    """Sizes of the three parallel dimensions and of the machines they run on.

    ``world_size = dp * pp * tp`` ranks on ``nodes`` nodes of ``devices_per_node`` devices each
    (default: ``world_size // nodes``). Raises ValueError when the ranks do not fill the nodes
    exactly or when a tensor-parallel group would straddle two nodes.
    """

    dp: int
    pp: int
    tp: int
    nodes: int = 1
    devices_per_node: int | None = None

    def __post_init__(self):
        for name in ("dp", "pp", "tp", "nodes"):
            object.__setattr__(self, name, positive_int(name, getattr(self, name)))
        world = self.world_size
        if self.devices_per_node is None:
            if world % self.nodes:
                raise ValueError(_("world_size {world} (dp {dp} x pp {pp} x tp {tp}) is not divisible by nodes "
                                   "{nodes}").format(world=world, dp=self.dp, pp=self.pp, tp=self.tp,
                                                     nodes=self.nodes))
            object.__setattr__(self, "devices_per_node", world // self.nodes)
        dpn = positive_int("devices_per_node", self.devices_per_node)
        object.__setattr__(self, "devices_per_node", dpn)
        if self.nodes * dpn != world:
            raise ValueError(_("world_size {devices} != dp {dp} x pp {pp} x tp {tp} (nodes {nodes} x "
                               "devices_per_node {per_node} devices for {world} ranks)").format(
                devices=self.nodes * dpn, dp=self.dp, pp=self.pp, tp=self.tp, nodes=self.nodes, per_node=dpn,
                world=world))
        crossing = tp_crossing(self.tp, dpn)
        if crossing:
            message, values = crossing
            raise ValueError(_(message).format(**values))

    @classmethod
    def from_world(cls, world_size: int, tp: int = 1, pp: int = 1, nodes: int = 1) -> "ParallelDims":
        """Infer ``dp = world_size / (pp * tp)``, as launchers do."""
        world_size, tp, pp = (positive_int(n, v) for n, v in (("world_size", world_size), ("tp", tp), ("pp", pp)))
        if world_size % (pp * tp):
            raise ValueError(_("world_size {world} is not divisible by pp {pp} x tp {tp}").format(
                world=world_size, pp=pp, tp=tp))
        return cls(world_size // (pp * tp), pp, tp, nodes)

    # -- the grid -------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    def grid(self) -> torch.Tensor:
        """``(dp, pp, tp)`` tensor of global ranks: ``grid[d, p, t]`` is the rank at that coordinate."""
        return torch.arange(self.world_size).view(self.dp, self.pp, self.tp)

    def check_world_size(self, world_size: int) -> None:
        """Raise unless ``world_size`` (e.g. the launcher's) equals ``dp x pp x tp``."""
        if world_size != self.world_size:
            raise ValueError(f"world_size {world_size} != dp {self.dp} x pp {self.pp} x tp {self.tp}")

    def _check_rank(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in 0..{self.world_size - 1}, got rank {rank!r}")
        return int(rank)

    def coords(self, rank: int) -> Coord:
        """Rank -> ``Coord(dp, pp, tp)``; the inverse of ``rank_of``."""
        rank = self._check_rank(rank)
        d, rest = divmod(rank, self.pp * self.tp)
        return Coord(d, *divmod(rest, self.tp))

    def rank_of(self, dp: int, pp: int, tp: int) -> int:
        """``(dp, pp, tp)`` -> global rank (row-major over the grid, tp fastest)."""
        for name, value, size in (("dp", dp, self.dp), ("pp", pp, self.pp), ("tp", tp, self.tp)):
            if not 0 <= value < size:
                raise ValueError(f"{name} coordinate must be in 0..{size - 1}, got {name} {value}")
        return (dp * self.pp + pp) * self.tp + tp

    def node_of(self, rank: int) -> int:
        return self._check_rank(rank) // self.devices_per_node

    # -- groups ---------------------------------------------------------------------------------

    def groups(self, dim: str) -> list[list[int]]:
        """Every process group of dimension ``dim`` ("dp", "pp" or "tp"), each a sorted list of ranks,
        in a fixed order (the order ``build_groups`` creates them in on every rank)."""
        grid = self.grid()
        if dim == "tp":
            rows = grid.reshape(-1, self.tp)  # fix (dp, pp), vary tp
        elif dim == "pp":
            rows = grid.permute(0, 2, 1).reshape(-1, self.pp)  # fix (dp, tp), vary pp
        elif dim == "dp":
            rows = grid.permute(1, 2, 0).reshape(-1, self.dp)  # fix (pp, tp), vary dp
        else:
            raise ValueError(f"unknown dimension {dim!r}; choose one of {', '.join(DIMS)}")
        return rows.tolist()

    def tp_groups(self) -> list[list[int]]:
        return self.groups("tp")

    def pp_groups(self) -> list[list[int]]:
        return self.groups("pp")

    def dp_groups(self) -> list[list[int]]:
        return self.groups("dp")

    def group_of(self, dim: str, rank: int) -> list[int]:
        """The ranks that share ``rank``'s group of dimension ``dim`` (``rank`` included)."""
        c = self.coords(rank)
        index = {"tp": (c.dp * self.pp + c.pp), "pp": (c.dp * self.tp + c.tp), "dp": (c.pp * self.tp + c.tp)}
        if dim not in index:
            raise ValueError(f"unknown dimension {dim!r}; choose one of {', '.join(DIMS)}")
        return self.groups(dim)[index[dim]]

    def pp_neighbours(self, rank: int) -> tuple[int | None, int | None]:
        """Global ranks of the previous and next pipeline stage (None at the first / last stage)."""
        c = self.coords(rank)
        prev = self.rank_of(c.dp, c.pp - 1, c.tp) if c.pp > 0 else None
        nxt = self.rank_of(c.dp, c.pp + 1, c.tp) if c.pp < self.pp - 1 else None
        return prev, nxt

    def crosses_nodes(self, dim: str) -> bool:
        """True when some group of dimension ``dim`` holds ranks of more than one node."""
        return any(len({r // self.devices_per_node for r in g}) > 1 for g in self.groups(dim))

    def table(self) -> list[dict]:
        """One row per rank: ``rank``, ``node``, ``dp``, ``pp``, ``tp`` (for printing and drawing)."""
        return [{"rank": r, "node": self.node_of(r), **self.coords(r)._asdict()} for r in range(self.world_size)]

    def __str__(self) -> str:
        return _("dp {dp} x pp {pp} x tp {tp} = {world} ranks on {nodes_devices}").format(
            dp=self.dp, pp=self.pp, tp=self.tp, world=self.world_size,
            nodes_devices=ngettext("{nodes} node x {devices} devices", "{nodes} nodes x {devices} devices",
                                   self.nodes).format(nodes=self.nodes, devices=self.devices_per_node))


# ----------------------------------------------------------------------------------------------
# On a rank: real process groups.


@dataclass
class Groups:
    """This rank's view of the mesh: its coordinates, its three process groups and its pipeline
    neighbours (global ranks, None at the ends). Built by ``build_groups`` on every rank; layers and
    schedules receive it (or one of its groups) explicitly -- nothing is read from globals."""

    dims: ParallelDims
    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    tp_group: object = field(repr=False)
    pp_group: object = field(repr=False)
    dp_group: object = field(repr=False)
    pp_prev: int | None
    pp_next: int | None
    tp_ranks: list[int]
    pp_ranks: list[int]
    dp_ranks: list[int]
    _created: list = field(default_factory=list, repr=False)

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.dims.pp - 1

    def destroy(self) -> None:
        """Destroy the process groups this object created (call on every rank, e.g. in ``finally``)."""
        for group in self._created:
            dist.destroy_process_group(group)
        self._created.clear()


def build_groups(dims: ParallelDims) -> Groups:
    """Create every TP, PP and DP group with ``dist.new_group`` -- all of them, in the same order, on
    every rank, as torch.distributed requires -- and return this rank's ``Groups``.

    Call it on every rank of an initialised world whose size is ``dims.world_size``.
    """
    dims.check_world_size(dist.get_world_size())
    rank = dist.get_rank()
    mine, created = {}, []
    for dim in ("tp", "pp", "dp"):
        for ranks in dims.groups(dim):
            group = dist.new_group(ranks=ranks)
            created.append(group)
            if rank in ranks:
                mine[dim] = (group, ranks)
    c = dims.coords(rank)
    prev, nxt = dims.pp_neighbours(rank)
    return Groups(dims, rank, c.dp, c.pp, c.tp, mine["tp"][0], mine["pp"][0], mine["dp"][0], prev, nxt,
                  mine["tp"][1], mine["pp"][1], mine["dp"][1], created)


def check_groups(dp: int, pp: int, tp: int, nodes: int = 1) -> dict:
    """Rank function: build the groups, then discover each group's members with an all-reduce of a
    one-hot vector over that group, and pass a token along the pipeline (prev -> this -> next).

    Returns plain data for comparison with the pure ``ParallelDims`` answers.
    """
    dims = ParallelDims(dp, pp, tp, nodes)
    groups = build_groups(dims)
    try:
        found = {}
        for dim in ("tp", "pp", "dp"):
            onehot = torch.zeros(dims.world_size)
            onehot[groups.rank] = 1.0
            dist.all_reduce(onehot, group=getattr(groups, f"{dim}_group"))
            found[dim] = onehot.nonzero().flatten().tolist()
        # A token travels down the pipeline: each stage receives its predecessor's rank.
        token = torch.tensor([float(groups.rank)])
        received = None
        if groups.pp_prev is not None:
            inbox = torch.zeros(1)
            dist.recv(inbox, src=groups.pp_prev)
            received = int(inbox.item())
        if groups.pp_next is not None:
            dist.send(token, dst=groups.pp_next)
        return {"rank": groups.rank, "coords": (groups.dp_rank, groups.pp_rank, groups.tp_rank),
                "found": found, "listed": {"tp": groups.tp_ranks, "pp": groups.pp_ranks, "dp": groups.dp_ranks},
                "pp_prev": groups.pp_prev, "pp_next": groups.pp_next, "received_from_prev": received}
    finally:
        dist.barrier()
        groups.destroy()
