"""The parts a topology is built from: its levels and its host (node) types, with the file
format's name and the NCCL algorithms a topology may tune."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ALGORITHMS", "FORMAT", "ROUTINGS", "TRANSPORTS", "Level", "NodeType"]

FORMAT = "gpuplace.topology/1"
#: NCCL's algorithms the cost model prices (``rust/core/src/nccl.rs``), for
#: ``algorithm_efficiency``.
ALGORITHMS = ("ring", "tree", "nvls", "collnet")
#: How a level's switches spread flows over its uplinks' parallel links
#: (``rust/core/src/fabric.rs``, "Routing and hash collisions"); the first is the default.
ROUTINGS = ("adaptive", "ecmp", "static", "sharp")
#: How a level's links recover a lost packet (``rust/core/src/cost.rs``, the loss model):
#: ``roce``, end-to-end go-back-N (also InfiniBand without link-level retry), the default;
#: ``infiniband``, link-level retransmission.
TRANSPORTS = ("roce", "infiniband")


@dataclass(frozen=True)
class Level:
    """One level of the hierarchy, bottom-up.

    ``bandwidth_gbps`` is the per-GPU, one-direction bandwidth (GB/s) of traffic whose lowest
    common level is this one; ``latency_us`` the latency of one message at this level (µs).
    ``oversubscription`` (>= 1) divides the capacity of this level's uplinks (the links of
    each of its domains to the level above): 2 means 2:1, half of what its GPUs could send
    (``gpuplace.cluster.fabric``).
    """

    name: str
    bandwidth_gbps: float
    latency_us: float
    oversubscription: float = 1.0
    #: The level's switches reduce in the network (SHARP), so NCCL can run CollNet over it.
    sharp: bool = False
    #: How flows leaving a domain of this level spread over its uplink's parallel links: one
    #: of :data:`ROUTINGS` (``adaptive``: the fair share; ``ecmp``: hashed per flow and queue
    #: pair; ``static``: by destination; ``sharp``: in-network reduction, else adaptive).
    routing: str = "adaptive"
    #: Queue pairs per connection (NCCL_IB_QPS_PER_CONNECTION): ECMP hashes each separately.
    qps_per_connection: int = 1
    #: How the level's links recover lost packets, one of :data:`TRANSPORTS`: what packet
    #: loss on a NIC or switch of this level costs (``ClusterState.degrade(loss=...)``).
    transport: str = "roce"
    #: Whether the level's switches are cabled rail by rail (NIC ``i`` of every host to the
    #: switches of rail ``i``): where the host types list their NICs, a hashed flow then takes
    #: only its own rail's uplink links. False: every NIC of a host reaches the same switch
    #: (a top-of-rack leaf) and a flow may hash onto any link of the uplink.
    rail_aligned: bool = True


@dataclass(frozen=True)
class NodeType:
    """A kind of host: its GPUs and what connects them."""

    name: str
    gpus: int
    gpu_model: str | None = None
    power_w: float | None = None
    #: Level name -> domain index of each local GPU, for levels below the node level.
    sublevels: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: Optional ``gpus x gpus`` bandwidth (GB/s) overriding the levels inside the host.
    bandwidth_gbps: tuple[tuple[float, ...], ...] | None = None
    #: Optional ``gpus x gpus`` nvidia-smi link classes (X, NV#, PIX, ...), informational.
    link_classes: tuple[tuple[str, ...], ...] | None = None
    nics: tuple[str, ...] = ()
    #: Per local GPU, the index into ``nics`` of its NIC (its rail).
    gpu_nic: tuple[int, ...] | None = None
    #: Dense peak TFLOPS per GPU, overriding the table looked up by ``gpu_model``.
    peak_tflops: float | None = None
    #: NVLink SHARP (NVLS) all-reduce bus bandwidth (GB/s) inside the NVLink domain, if the
    #: NVSwitches have it; None: NCCL cannot use NVLS on these hosts.
    nvls_gbps: float | None = None
    #: Whether the GPUs have peer-to-peer access to each other (False: NCCL's SHM transport
    #: through host memory, as on GeForce boards; rust/core/src/nccl.rs, "Transports").
    p2p: bool = True
    #: Whether the NICs reach GPU memory directly (False: network hops staged through host
    #: memory, as on EC2 g4dn).
    gpudirect_rdma: bool = True

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpus": self.gpus}
        if self.gpu_model:
            out["gpu_model"] = self.gpu_model
        if self.power_w is not None:
            out["power_w"] = self.power_w
        if self.sublevels:
            out["sublevels"] = {k: list(v) for k, v in self.sublevels.items()}
        if self.bandwidth_gbps is not None:
            out["bandwidth_gbps"] = [list(r) for r in self.bandwidth_gbps]
        if self.link_classes is not None:
            out["link_classes"] = [list(r) for r in self.link_classes]
        if self.nics:
            out["nics"] = list(self.nics)
        if self.gpu_nic is not None:
            out["gpu_nic"] = list(self.gpu_nic)
        if self.peak_tflops is not None:
            out["peak_tflops"] = self.peak_tflops
        if self.nvls_gbps is not None:
            out["nvls_gbps"] = self.nvls_gbps
        if not self.p2p:
            out["p2p"] = False
        if not self.gpudirect_rdma:
            out["gpudirect_rdma"] = False
        return out
