"""The machine model: devices, and the links between them as the α–β model sees them.

One description serves every part of the course that costs a message or a step: the pipeline
executor's virtual clock (``Link.cost`` of each activation it sends), the simulator's link term,
the planner's cluster (``Cluster``: intra-node and inter-node links, memory, FLOP/s), and the
lessons' pictures of why tensor parallelism stays inside a node. Calibration on this machine's
ranks (``parallel_lab.planning.calibration``) produces the same objects.

The α–β (latency–bandwidth, "Hockney") model: one message of n bytes costs ``α + n·β``, with β the
inverse bandwidth, seconds per byte (``1 / Link.bandwidth``), as in lesson 01. A ring
all-reduce over p ranks sends 2(p−1) messages of n/p bytes per rank (Patarasuk & Yuan 2009, the
algorithm behind NCCL's and gloo's large all-reduces), so

    t_allreduce(n) = 2(p−1)·α + 2(p−1)/p · n·β

Pure arithmetic: no torch, no processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from parallel_lab.checks import positive_int, positive_number
from parallel_lab.i18n import N_


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
        """Seconds of one message of ``nbytes``: α + n·β, β = 1 / bandwidth."""
        return self.latency + nbytes / self.bandwidth

    def all_reduce(self, nbytes: float, world_size: int) -> float:
        """Seconds of a ring all-reduce of ``nbytes`` over ``world_size`` devices on this link."""
        return ring_all_reduce_time(nbytes, world_size, self.latency, self.bandwidth)


# Presets. PCIE4 is the executor's default modelled link between two simulated devices.
# Bandwidths per GPU and per direction (datasheets quote both directions: "900 GB/s" NVLink 4 is
# 450 GB/s each way). α: the order of a small NCCL message inside a node / across the network.
PCIE4 = Link("PCIe 4.0 x16", 25e9, 10e-6)
# IEEE 802.3ab (1000BASE-T): 1 Gb/s, 125 MB/s each way; α of the order of a TCP message between two
# hosts. Lesson 12 prices its CPU ranks' collectives on it: the ranks compute thousands of times
# slower than a GPU, and this link is thousands of times slower than NVLink, which keeps the proportion.
GIGABIT_ETHERNET = Link("Gigabit Ethernet", 125e6, 50e-6)
# A preset's name is English (N_: JSON, the command line); a table or figure shows it as _(link.name).
LINKS = {
    # NVIDIA A100 Tensor Core GPU datasheet (2020): 3rd-generation NVLink, 600 GB/s per GPU, both
    # directions together; DGX A100: one ConnectX-6 port per GPU, InfiniBand HDR 200 Gb/s (25 GB/s).
    "nvlink3": Link(N_("NVLink 3 (A100, in an 8-GPU node)"), 300e9, 3e-6),
    "hdr": Link(N_("InfiniBand HDR (200 Gb/s per GPU, between nodes)"), 25e9, 10e-6),
    # NVIDIA H100 Tensor Core GPU datasheet (2022) and H200 datasheet (2024): 4th-generation NVLink,
    # 900 GB/s per GPU, both directions together.
    "nvlink4": Link(N_("NVLink 4 (H100/H200, in an 8-GPU node)"), 450e9, 3e-6),
    # NVIDIA Blackwell architecture technical brief (2024), DGX B200 and GB200 NVL72 datasheets:
    # 5th-generation NVLink, 1.8 TB/s per GPU, both directions together.
    "nvlink5": Link("NVLink 5 (B200/GB200)", 900e9, 3e-6),
    # NVIDIA DGX H100 / DGX B200 datasheets: one ConnectX-7 port per GPU, InfiniBand NDR 400 Gb/s
    # (50 GB/s); also the GPU's scale-out port in GB200 NVL72.
    "ndr": Link(N_("InfiniBand NDR (400 Gb/s per GPU, between nodes)"), 50e9, 10e-6),
    # NVIDIA GB300 NVL72 (Blackwell Ultra, shipping since the second half of 2025) and DGX B300: one
    # ConnectX-8 SuperNIC per GPU at 800 Gb/s (100 GB/s); "NVIDIA GB300 NVL72 Enterprise Reference
    # Architecture", System Hardware & Components: 4 ConnectX-8 per compute tray of 4 GPUs.
    "xdr": Link(N_("ConnectX-8 (800 Gb/s per GPU, between NVLink domains)"), 100e9, 10e-6),
}
# The share of the datasheet's dense BF16 peak a large training run achieves, as model FLOPs
# utilisation (MFU: the model's own FLOPs per second over the peak): 38-43 % for Llama 3 405B on 16K
# H100s (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4). Megatron-LM's often quoted 52 % on
# A100s for GPT 1T (Narayanan et al. 2021) is not an MFU: its FLOP count (the paper's appendix,
# 96·B·s·l·h²·(1 + s/6h + V/16lh) per iteration) includes the extra forward pass of full activation
# recomputation, four passes where the model needs three, so it is hardware FLOPs utilisation (HFU).
# Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", section 6
# and abstract) separate the two: MFU 54.2 % with selective recomputation against 42.1 % with full
# recomputation for the 530B model.
ACHIEVED_SHARE = 0.40


@dataclass(frozen=True)
class System:
    """A GPU system as the course models it: ``domain`` GPUs joined by ``nvlink`` (the fast domain
    tensor parallelism stays in), ``network`` to the other domains, ``gpu_mem_gb`` of HBM per GPU
    and the datasheet's dense BF16 peak ``peak_tflops``; ``tflops`` is what training achieves
    (``ACHIEVED_SHARE`` of the peak)."""

    name: str
    gpu_mem_gb: float
    peak_tflops: float
    nvlink: Link
    domain: int
    network: Link
    source: str

    @property
    def tflops(self) -> float:
        return round(ACHIEVED_SHARE * self.peak_tflops, 1)

    def cluster(self, domains: int, latency_us: float = 5.0) -> "Cluster":
        """``domains`` of these NVLink domains as the planner's Cluster (a "node" is one domain)."""
        return Cluster(domains, self.domain, self.gpu_mem_gb, self.nvlink.bandwidth / 1e9,
                       self.network.bandwidth / 1e9, self.tflops, latency_us)


SYSTEMS = {s.name: s for s in (
    System("DGX A100", 80, 312, LINKS["nvlink3"], 8, LINKS["hdr"],
           "NVIDIA A100 datasheet: 312 TFLOPS BF16 dense, 80 GB HBM2e; DGX A100: 8 GPUs (Megatron-LM's "
           "2021 runs, Narayanan et al.)"),
    System("DGX H100", 80, 989, LINKS["nvlink4"], 8, LINKS["ndr"],
           "NVIDIA H100 datasheet: 989 TFLOPS BF16 dense (1979 with sparsity), 80 GB HBM3; DGX H100: 8 GPUs"),
    System("DGX H200", 141, 989, LINKS["nvlink4"], 8, LINKS["ndr"],
           "NVIDIA H200 datasheet: H100's compute with 141 GB HBM3e"),
    System("DGX B200", 180, 2250, LINKS["nvlink5"], 8, LINKS["ndr"],
           "NVIDIA DGX B200 datasheet: 8 B200, 1440 GB HBM3e; 2.25 PFLOPS BF16 dense per GPU"),
    System("GB200 NVL72", 186, 2500, LINKS["nvlink5"], 72, LINKS["ndr"],
           "NVIDIA GB200 NVL72 datasheet: 72 GPUs in one NVLink domain, 13.4 TB HBM3e, 360 PFLOPS "
           "FP16/BF16 with sparsity (2.5 PFLOPS dense per GPU; a B200 in a DGX B200: 2.25)"),
    System("DGX B300", 288, 2250, LINKS["nvlink5"], 8, LINKS["xdr"],
           "NVIDIA DGX B300 / HGX B300 datasheets: 8 Blackwell Ultra GPUs of 288 GB HBM3e, 36 PFLOPS FP16/BF16 "
           "with sparsity per 8 GPUs (2.25 PFLOPS dense per GPU), one ConnectX-8 (800 Gb/s) per GPU"),
    System("GB300 NVL72", 288, 2500, LINKS["nvlink5"], 72, LINKS["xdr"],
           "NVIDIA GB300 NVL72 datasheet (shipping since the second half of 2025): 72 Blackwell Ultra GPUs of "
           "288 GB HBM3e in one NVLink domain, 360 PFLOPS FP16/BF16 with sparsity (2.5 PFLOPS dense per GPU), "
           "one ConnectX-8 SuperNIC (800 Gb/s) per GPU"),
)}


@dataclass(frozen=True)
class Cluster:
    """``nodes`` machines of ``gpus_per_node`` devices with ``gpu_mem_gb`` GB each (10^9 bytes).

    Bandwidths are per device and per direction in GB/s (bytes, not bits): ``intra_gbps`` over the
    node's links (NVLink), ``inter_gbps`` over the network (one 400 Gb/s InfiniBand NDR port per GPU
    is 50). ``tflops`` is the *achieved* dense throughput per device, not the datasheet peak
    (``ACHIEVED_SHARE`` of it). ``latency_us`` is the α of one message, on either link. The defaults
    are a DGX H100 node (``SYSTEMS["DGX H100"].cluster(nodes)`` builds the same).
    """

    nodes: int
    gpus_per_node: int
    gpu_mem_gb: float
    intra_gbps: float = 450.0
    inter_gbps: float = 50.0
    tflops: float = 395.6
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
