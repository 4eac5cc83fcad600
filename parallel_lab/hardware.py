"""The machine model: devices, and the links between them as the α–β model sees them.

One description serves every part of the course that costs a message or a step: the pipeline
executor's virtual clock (``Link.cost`` of each activation it sends), the simulator's link term,
the planner's cluster (``Cluster``: intra-node and inter-node links, memory, FLOP/s), and the
lessons' pictures of why tensor parallelism stays inside a node. Calibration on this machine's
ranks (``parallel_lab.planning.calibration``) produces the same objects.

The α–β (latency–bandwidth, "Hockney") model: one message of n bytes costs ``α + n / B``. A ring
all-reduce over p ranks sends 2(p−1) messages of n/p bytes per rank (Patarasuk & Yuan 2009, the
algorithm behind NCCL's and gloo's large all-reduces), so

    t_allreduce(n) = 2(p−1)·α + 2(p−1)/p · n / B

Pure arithmetic: no torch, no processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from parallel_lab.checks import positive_int, positive_number


def ring_all_reduce_time(n_bytes: float, world_size: int, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """Seconds of a ring all-reduce of ``n_bytes`` over ``world_size`` ranks (α–β model); 0 on one rank."""
    p = world_size
    if p == 1:
        return 0.0
    return 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * n_bytes / bandwidth_bytes_per_s


@dataclass(frozen=True)
class Link:
    """What one device sees of a link: ``bandwidth`` in bytes/s per device and direction, and
    ``latency`` α in seconds per message."""

    name: str
    bandwidth: float
    latency: float

    def __post_init__(self):
        positive_number("bandwidth", self.bandwidth)
        if not 0 <= self.latency < math.inf:
            raise ValueError(f"latency must be >= 0 seconds, got latency {self.latency!r}")

    def cost(self, nbytes: float) -> float:
        """Seconds of one message of ``nbytes``: α + n / B."""
        return self.latency + nbytes / self.bandwidth

    def all_reduce(self, nbytes: float, world_size: int) -> float:
        """Seconds of a ring all-reduce of ``nbytes`` over ``world_size`` devices on this link."""
        return ring_all_reduce_time(nbytes, world_size, self.latency, self.bandwidth)


# Presets. PCIE4 is the executor's default modelled link between two simulated devices.
PCIE4 = Link("PCIe 4.0 x16", 25e9, 10e-6)
LINKS = {
    "nvlink": Link("NVLink-class (inside a node)", 300e9, 3e-6),
    "infiniband": Link("InfiniBand-class (between nodes)", 25e9, 10e-6),
}


@dataclass(frozen=True)
class Cluster:
    """``nodes`` machines of ``gpus_per_node`` devices with ``gpu_mem_gb`` GB each (10^9 bytes).

    Bandwidths are per device and per direction in GB/s (bytes, not bits): ``intra_gbps`` over the
    node's links (NVLink), ``inter_gbps`` over the network (one 200 Gb/s InfiniBand port per GPU is 25).
    ``tflops`` is the *achieved* dense throughput per device (not the datasheet peak; ~50% of an
    A100's 312). ``latency_us`` is the α of one message, on either link.
    """

    nodes: int
    gpus_per_node: int
    gpu_mem_gb: float
    intra_gbps: float = 300.0
    inter_gbps: float = 25.0
    tflops: float = 150.0
    latency_us: float = 5.0

    def __post_init__(self):
        for name in ("nodes", "gpus_per_node"):
            positive_int(name, getattr(self, name))
        for name in ("gpu_mem_gb", "intra_gbps", "inter_gbps", "tflops"):
            positive_number(name, getattr(self, name))
        if not 0 <= self.latency_us < math.inf:
            raise ValueError(f"latency_us must be >= 0, got latency_us {self.latency_us!r}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def intra(self) -> Link:
        """The links inside a node."""
        return Link("intra-node", self.intra_gbps * 1e9, self.latency_us * 1e-6)

    @property
    def inter(self) -> Link:
        """The network between nodes."""
        return Link("inter-node", self.inter_gbps * 1e9, self.latency_us * 1e-6)
