"""Type stubs of the private native module ``gpuplace._core`` (the PyO3 bindings of
gpuplace-core). The public API is re-exported from ``gpuplace``; these classes hold the
flat arrays the Rust core solves over."""

from typing import ClassVar, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Self

__all__ = [
    "MIN_FACTOR",
    "ArrivalRecord",
    "ClusterState",
    "CollectiveKind",
    "CollisionReport",
    "ComponentKind",
    "Condition",
    "ContentionReport",
    "CostReport",
    "GpuMode",
    "Health",
    "HotUplink",
    "Isolation",
    "JobSpec",
    "LevelCrossing",
    "MoveReason",
    "PlaceResult",
    "PowerLedger",
    "PowerModel",
    "RankMapping",
    "RankMove",
    "RefineResult",
    "RepairPlan",
    "ShareDistribution",
    "ShareScheduler",
    "ShareSlot",
    "SharedCluster",
    "SparePolicy",
    "Topology",
    "__version__",
    "added_to_neighbours",
    "admit",
    "class_names",
    "collective_terms",
    "collisions",
    "contention",
    "evaluate",
    "fabric_load",
    "fence_mask",
    "gpu_peak_tflops",
    "hottest_uplinks",
    "io_seconds",
    "job_draw",
    "job_load",
    "jobs_hurt",
    "loss_factor",
    "lower_bound",
    "map_ranks",
    "pair_bandwidth_matrix",
    "place",
    "pricing_view",
    "rank_groups",
    "refine",
    "replay_arrivals",
    "ring_hops",
    "rust_solvers",
    "set_fence",
    "share_policies",
    "solve",
    "topology_with_fabric",
    "uplinks",
    "uplinks_by_level",
    "with_rail_alignment",
    "with_routing",
    "with_transports",
    "with_uplink_gbps",
]

__version__: str
MIN_FACTOR: float

class _Labelled:
    @property
    def label(self) -> str: ...
    def __int__(self) -> int: ...
    @classmethod
    def members(cls) -> list[Self]: ...
    @classmethod
    def from_label(cls, label: str) -> Self: ...

@final
class CollectiveKind(_Labelled):
    AllReduce: ClassVar[CollectiveKind]
    AllGather: ClassVar[CollectiveKind]
    ReduceScatter: ClassVar[CollectiveKind]
    AllToAll: ClassVar[CollectiveKind]
    PointToPoint: ClassVar[CollectiveKind]

@final
class Health(_Labelled):
    Ok: ClassVar[Health]
    Failed: ClassVar[Health]
    Drained: ClassVar[Health]

@final
class Condition(_Labelled):
    Ok: ClassVar[Condition]
    Degraded: ClassVar[Condition]
    Failed: ClassVar[Condition]
    Drained: ClassVar[Condition]
    @property
    def severity(self) -> int: ...

@final
class ComponentKind(_Labelled):
    Gpu: ClassVar[ComponentKind]
    Host: ClassVar[ComponentKind]
    Nic: ClassVar[ComponentKind]
    Switch: ClassVar[ComponentKind]

@final
class SparePolicy(_Labelled):
    Allow: ClassVar[SparePolicy]
    Forbid: ClassVar[SparePolicy]
    Only: ClassVar[SparePolicy]

@final
class MoveReason:
    Lost: ClassVar[MoveReason]
    GroupMoved: ClassVar[MoveReason]
    Improvement: ClassVar[MoveReason]
    Evacuated: ClassVar[MoveReason]
    @property
    def label(self) -> str: ...
    def __int__(self) -> int: ...

@final
class CostReport:
    @property
    def comm_seconds(self) -> float: ...
    @property
    def class_seconds(self) -> list[float]: ...
    @property
    def traffic_seconds(self) -> float: ...
    @property
    def bytes_by_level(self) -> npt.NDArray[np.float64]: ...
    @property
    def span_level(self) -> int | None: ...
    @property
    def confinement_ok(self) -> bool: ...
    @property
    def violations(self) -> list[str]: ...
    @property
    def class_algorithms(self) -> list[str]: ...
    @property
    def step_seconds(self) -> float | None: ...
    @property
    def exposed_comm_seconds(self) -> float | None: ...
    @property
    def exposed_class_seconds(self) -> list[float] | None: ...
    @property
    def compute_seconds(self) -> float | None: ...
    @property
    def bubble_seconds(self) -> float | None: ...
    @property
    def mfu(self) -> float | None: ...
    @property
    def tokens_per_second(self) -> float | None: ...
    @property
    def peak_tflops(self) -> float | None: ...
    @property
    def input_seconds(self) -> float | None: ...
    @property
    def input_stall_seconds(self) -> float | None: ...
    @property
    def checkpoint_seconds(self) -> float | None: ...
    @property
    def alone_seconds(self) -> float | None: ...
    @property
    def hot_uplinks(self) -> list[HotUplink]: ...
    @property
    def io_seconds(self) -> float: ...

@final
class PlaceResult:
    @property
    def gpus(self) -> npt.NDArray[np.int64]: ...
    @property
    def cost(self) -> CostReport: ...
    @property
    def phase_slot(self) -> int: ...

@final
class RefineResult:
    @property
    def gpus(self) -> npt.NDArray[np.int64]: ...
    @property
    def cost(self) -> CostReport: ...
    @property
    def iterations(self) -> int: ...
    @property
    def accepted(self) -> int: ...

@final
class RankMapping:
    @property
    def perm(self) -> npt.NDArray[np.int64]: ...
    @property
    def cost(self) -> float: ...
    @property
    def iterations(self) -> int: ...
    @property
    def elapsed_s(self) -> float: ...

@final
class RankMove:
    @property
    def rank(self) -> int: ...
    @property
    def old_gpu(self) -> int: ...
    @property
    def new_gpu(self) -> int: ...
    @property
    def reason(self) -> MoveReason: ...
    @property
    def level(self) -> int | None: ...
    @property
    def component(self) -> tuple[ComponentKind, int, int] | None: ...

@final
class RepairPlan:
    @property
    def gpus(self) -> npt.NDArray[np.int64]: ...
    @property
    def moves(self) -> list[RankMove]: ...
    @property
    def cost_before(self) -> float: ...
    @property
    def cost_after(self) -> float: ...
    @property
    def report_before(self) -> CostReport: ...
    @property
    def report_after(self) -> CostReport: ...
    @property
    def evaluations(self) -> int: ...
    @property
    def repair_seconds(self) -> float: ...

def rank_groups(sizes: list[int], d: int) -> npt.NDArray[np.int64]: ...
def class_names(
    dim_names: list[str], dim_sizes: list[int], comm_kind: list[str | None]
) -> list[str]: ...

@final
class Topology:
    def __new__(
        cls,
        level_names: list[str],
        bandwidth_gbps: list[float],
        latency_us: list[float],
        node_level: int,
        nvlink_level: int,
        path: npt.NDArray[np.int64],
        node_type_names: list[str],
        node_type_gpus: list[int],
        node_type_matrices: list[npt.NDArray[np.float64] | None],
        node_type_of_node: npt.NDArray[np.int64],
        gpu_local: npt.NDArray[np.int64],
    ) -> Topology: ...
    @property
    def num_gpus(self) -> int: ...
    @property
    def num_levels(self) -> int: ...
    @property
    def node_level(self) -> int: ...
    @property
    def nvlink_level(self) -> int: ...
    @property
    def level_names(self) -> list[str]: ...
    def domain_count(self, level: int) -> int: ...
    def domain_sizes(self, level: int) -> npt.NDArray[np.int64]: ...
    def parents(self, level: int) -> npt.NDArray[np.int64]: ...
    def path(self) -> npt.NDArray[np.int64]: ...
    def bandwidth_matrix(self, gpus: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]: ...
    @property
    def effective_bandwidth_gbps(self) -> list[float]: ...
    def collective_seconds_by_level(self, kind: str, n: int, bytes: float) -> list[float]: ...

@final
class JobSpec:
    def __new__(
        cls,
        topology: Topology,
        name: str,
        num_ranks: int,
        dim_names: list[str],
        dim_sizes: list[int],
        dim_confine: list[int],
        comm_kind: list[str | None],
        comm_bytes: list[float],
        comm_count: list[float],
        max_span: int,
        traffic_src: npt.NDArray[np.int64],
        traffic_dst: npt.NDArray[np.int64],
        traffic_bytes: npt.NDArray[np.float64],
        step: tuple[float, float, float, float, int, int, int, list[tuple[str, float]]]
        | None = None,
    ) -> JobSpec: ...
    @property
    def num_ranks(self) -> int: ...
    @property
    def class_names(self) -> list[str]: ...
    def coordinates(self) -> npt.NDArray[np.int64]: ...
    def class_groups(self, index: int) -> npt.NDArray[np.int64]: ...

@final
class ClusterState:
    def __new__(
        cls, topology: Topology, gpu_nic: npt.NDArray[np.int64] | None = None
    ) -> ClusterState: ...
    def copy(self) -> ClusterState: ...
    def allocate(
        self,
        name: str,
        gpus: npt.NDArray[np.int64],
        job: JobSpec | None = None,
        io: list[tuple[int, int, float, float, float, float]] | None = None,
    ) -> None: ...
    def release(self, name: str) -> npt.NDArray[np.int64]: ...
    def set_health(
        self, gpus: npt.NDArray[np.int64], status: Health
    ) -> list[tuple[str, npt.NDArray[np.int64]]]: ...
    def health(self) -> npt.NDArray[np.uint8]: ...
    def free_mask(self) -> npt.NDArray[np.bool_]: ...
    def free_counts(self, level: int) -> npt.NDArray[np.int64]: ...
    @property
    def total_free(self) -> int: ...
    def check_capacity(self, num_ranks: int) -> None: ...
    def owner_of(self, gpu: int) -> str | None: ...
    def jobs(self) -> dict[str, npt.NDArray[np.int64]]: ...
    def job_gpus(self, name: str) -> npt.NDArray[np.int64] | None: ...
    def memory_bytes(self) -> int: ...
    def set_condition(
        self,
        kinds: npt.NDArray[np.int64],
        a: npt.NDArray[np.int64],
        b: npt.NDArray[np.int64],
        condition: Condition,
        factor: float,
        reason: str,
    ) -> list[tuple[str, npt.NDArray[np.int64]]]: ...
    def components(self) -> list[tuple[ComponentKind, int, int, Condition, float, str]]: ...
    def set_spare(self, gpus: npt.NDArray[np.int64], spare: bool) -> None: ...
    def spare_mask(self) -> npt.NDArray[np.bool_]: ...
    def degraded_mask(self) -> npt.NDArray[np.bool_]: ...
    def check(self) -> None: ...
    def repair(
        self,
        job: JobSpec,
        name: str,
        max_moves: int = 0,
        spares: SparePolicy = ...,
        max_evaluations: int = 24,
        time_limit: float | None = None,
        io: list[tuple[int, int, float, float, float, float]] | None = None,
    ) -> RepairPlan: ...

def admit(
    state: ClusterState,
    job: JobSpec,
    gpus: npt.NDArray[np.int64],
    solver: str,
    confining: bool,
    io: list[tuple[int, int, float, float, float, float]] | None = None,
) -> CostReport: ...
def lower_bound(state: ClusterState, job: JobSpec) -> float | None: ...
def evaluate(
    topology: Topology,
    job: JobSpec,
    gpus: npt.NDArray[np.int64],
    state: ClusterState | None = None,
    io: list[tuple[int, int, float, float, float, float]] | None = None,
) -> CostReport: ...

# Used only by tests (tests/bindings/): the fence as it stands, to check it is lifted.
def fence_mask(state: ClusterState) -> npt.NDArray[np.bool_]: ...
def loss_factor(loss: float, transport: str = ...) -> float: ...
def map_ranks(
    distance: npt.NDArray[np.float64],
    n: int,
    traffic_dense: npt.NDArray[np.float64] | None = None,
    traffic_src: npt.NDArray[np.int64] | None = None,
    traffic_dst: npt.NDArray[np.int64] | None = None,
    traffic_weight: npt.NDArray[np.float64] | None = None,
    time_limit: float = 1.0,
    seed: int = 0,
    threads: int = 1,
    initial: npt.NDArray[np.int64] | None = None,
    max_iterations: int | None = None,
) -> RankMapping: ...
def place(
    state: ClusterState,
    job: JobSpec,
    solver: str,
    seed: int = 0,
    time_limit: float | None = None,
    neighbours: bool = True,
    io: list[tuple[int, int, float, float, float, float]] | None = None,
    power: tuple[PowerLedger, _Declared] | None = None,
) -> PlaceResult: ...
def solve(
    state: ClusterState,
    job: JobSpec,
    solver: str,
    seed: int = 0,
    time_limit: float | None = None,
    neighbours: bool = True,
) -> npt.NDArray[np.int64]: ...
def refine(
    state: ClusterState,
    job: JobSpec,
    start: npt.NDArray[np.int64],
    time_limit: float = 0.5,
    seed: int = 0,
    max_iterations: int = 200000,
    io: list[tuple[int, int, float, float, float, float]] | None = None,
) -> RefineResult: ...
def rust_solvers() -> list[tuple[str, str, bool]]: ...

# Fabric: uplink capacities, the running jobs' load, contention (rust/py/src/fabric.rs).
def uplinks(
    topology: Topology,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]: ...
def with_uplink_gbps(topology: Topology, capacity: npt.NDArray[np.float64]) -> Topology: ...
def with_routing(
    topology: Topology, routing: list[str], qps_per_connection: list[int]
) -> Topology: ...

@final
class LevelCrossing:
    @property
    def level(self) -> int: ...
    @property
    def routing(self) -> str: ...
    @property
    def qps_per_connection(self) -> int: ...
    @property
    def flows(self) -> float: ...
    @property
    def uplinks(self) -> int: ...
    @property
    def links(self) -> int: ...
    @property
    def fullest(self) -> float: ...
    @property
    def share(self) -> float: ...

@final
class CollisionReport:
    @property
    def levels(self) -> list[LevelCrossing]: ...
    @property
    def seconds(self) -> float: ...
    @property
    def balanced_seconds(self) -> float: ...

def collisions(
    state: ClusterState, job: JobSpec, gpus: npt.NDArray[np.int64]
) -> CollisionReport: ...

# Used only by tests (tests/bindings/): the kept uplink loads and one job's flows.
def fabric_load(state: ClusterState) -> npt.NDArray[np.float64]: ...
def job_load(
    job: JobSpec, gpus: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]: ...

@final
class HotUplink:
    @property
    def uplink(self) -> int: ...
    @property
    def direction(self) -> int: ...
    @property
    def capacity_gbps(self) -> float: ...
    @property
    def own_gbps(self) -> float: ...
    @property
    def others_gbps(self) -> float: ...
    @property
    def jobs(self) -> list[tuple[str, float]]: ...

@final
class ContentionReport:
    @property
    def alone_seconds(self) -> float: ...
    @property
    def contended_seconds(self) -> float: ...
    @property
    def uplinks(self) -> list[HotUplink]: ...

def contention(
    state: ClusterState, job: JobSpec, gpus: npt.NDArray[np.int64]
) -> ContentionReport: ...
def added_to_neighbours(
    state: ClusterState, job: JobSpec, gpus: npt.NDArray[np.int64]
) -> float: ...
def hottest_uplinks(state: ClusterState, count: int) -> list[tuple[int, float, float]]: ...
def uplinks_by_level(
    state: ClusterState, count: int
) -> list[tuple[int, int, int, int, list[tuple[int, float, float]]]]: ...
def jobs_hurt(state: ClusterState) -> list[tuple[str, float, float]]: ...
def io_seconds(
    state: ClusterState,
    gpus: npt.NDArray[np.int64],
    level: int,
    domain: int,
    read_gbps: float,
    write_gbps: float,
    read_bytes: float,
    write_bytes: float,
) -> float: ...
def set_fence(state: ClusterState, gpus: npt.NDArray[np.int64], fenced: bool) -> None: ...

# Power budgets (rust/py/src/power.rs): the compiled power domains and the ledger of a state's
# draw per domain and phase slot.
_Declared = tuple[float | None, float | None, bool] | None

def job_draw(power: _Declared, board_w: float) -> tuple[float, float, bool]: ...

@final
class PowerModel:
    def __new__(
        cls,
        budgets_w: list[float],
        max_synchronized: list[int | None],
        phases: int,
        board_w: npt.NDArray[np.float64],
        domain_gpus: list[npt.NDArray[np.int64]],
    ) -> PowerModel: ...
    def boards_known(self) -> bool: ...
    def ledger(
        self,
        state: ClusterState,
        powers: dict[str, tuple[float | None, float | None, bool]],
        slots: dict[str, int],
    ) -> PowerLedger: ...

@final
class PowerLedger:
    def draws(self) -> list[float]: ...
    def synchronized_jobs(self, d: int) -> list[tuple[str, int]]: ...
    def check(
        self, gpus: npt.NDArray[np.int64], power: _Declared, slot: int
    ) -> tuple[int, str, float, int] | None: ...
    def limits(
        self, free: npt.NDArray[np.bool_], power: _Declared, slot: int
    ) -> list[tuple[int, int, str | None, float]]: ...
    def held(
        self, free: npt.NDArray[np.bool_], power: _Declared, slot: int, relax: list[int]
    ) -> npt.NDArray[np.int64]: ...

# Pricing view: what every solver prices on (rust/py/src/pricing.rs).
def pricing_view(
    state: ClusterState,
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_], npt.NDArray[np.float32]]: ...
def pair_bandwidth_matrix(
    state: ClusterState, gpus: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]: ...
def collective_terms(kind: CollectiveKind, n: int, bytes: float) -> tuple[float, float]: ...

# NCCL side of the topology and the GPU peak table (rust/py/src/nccl.rs, step.rs).
def gpu_peak_tflops(model: str) -> float | None: ...
def topology_with_fabric(
    topology: Topology,
    nvls_gbps: list[float],
    nics: list[int],
    host_count_factors: list[float],
    sharp: list[bool],
    algorithm_efficiency: tuple[float, float, float, float],
    peak_tflops: list[float],
) -> Topology: ...
def with_rail_alignment(topology: Topology, rail_aligned: list[bool]) -> Topology: ...
def with_transports(
    topology: Topology, p2p: list[bool], gpudirect_rdma: list[bool]
) -> Topology: ...

# Used only by tests (tests/bindings/): NCCL's ring order as the cost model lays it out.
def ring_hops(
    topology: Topology, gpus: npt.NDArray[np.int64]
) -> list[tuple[int, int, int, int, int, float]]: ...

# Shared GPUs: milli-GPU requests and MIG instances, the FGD paper's policies and gpuplace's,
# the arrival-only replay (rust/py/src/share.rs). A pod crosses as a row (cpu_milli,
# memory_mib, gpus, gpu_milli, gpu_memory_mib, isolation code) and a model set.

@final
class Isolation(_Labelled):
    Any: ClassVar[Isolation]
    Mig: ClassVar[Isolation]
    Fractional: ClassVar[Isolation]

@final
class GpuMode(_Labelled):
    Fractional: ClassVar[GpuMode]
    Mig: ClassVar[GpuMode]

@final
class SharedCluster:
    def __new__(
        cls,
        names: list[str],
        cpu_milli: npt.NDArray[np.int64],
        memory_mib: npt.NDArray[np.int64],
        gpus: npt.NDArray[np.int64],
        model: npt.NDArray[np.int64],
        models: list[str],
    ) -> Self: ...
    def copy(self) -> SharedCluster: ...
    def set_mig_rules(
        self,
        model: int,
        name: str,
        memory_slices: int,
        compute_slices: int,
        profiles: list[tuple[str, int, int, list[int], int, int]],
    ) -> None: ...
    def set_mode(self, node: int, gpu: int, mode: GpuMode) -> None: ...
    def gpu_modes(self, node: int) -> list[GpuMode]: ...
    @property
    def num_gpus(self) -> int: ...
    @property
    def models(self) -> list[str]: ...
    @property
    def used_gpu_milli(self) -> int: ...
    @property
    def total_gpu_milli(self) -> int: ...
    @property
    def reconfigurations(self) -> int: ...
    def cpu_left(self) -> npt.NDArray[np.int64]: ...
    def memory_left(self) -> npt.NDArray[np.int64]: ...
    def gpu_left(self, node: int) -> npt.NDArray[np.int64]: ...
    def fits(
        self, node: int, pod_row: tuple[int, int, int, int, int, int], models: int
    ) -> bool: ...
    def allocate(
        self,
        pod_row: tuple[int, int, int, int, int, int],
        models: int,
        node: int,
        gpus: list[int],
        starts: list[int],
        reconfigure: list[int] = ...,
    ) -> None: ...
    def release(
        self,
        pod_row: tuple[int, int, int, int, int, int],
        models: int,
        node: int,
        gpus: list[int],
        starts: list[int],
    ) -> None: ...

@final
class ShareDistribution:
    def __new__(
        cls,
        pods_rows: npt.NDArray[np.int64],
        models: npt.NDArray[np.uint64],
        weights: npt.NDArray[np.float64],
        num_models: int,
    ) -> Self: ...
    def fragmentation(self, cluster: SharedCluster) -> npt.NDArray[np.float64]: ...

@final
class ShareSlot:
    @property
    def node(self) -> int: ...
    @property
    def gpus(self) -> list[int]: ...
    @property
    def starts(self) -> list[int]: ...
    @property
    def reconfigure(self) -> list[int]: ...

@final
class ShareScheduler:
    def __new__(
        cls,
        policy: str,
        seed: int,
        distribution: ShareDistribution | None = None,
        prices: npt.NDArray[np.float64] | None = None,
        reconfigure: bool = False,
    ) -> Self: ...
    @property
    def policy(self) -> str: ...
    def choose(
        self, cluster: SharedCluster, pod_row: tuple[int, int, int, int, int, int], models: int
    ) -> ShareSlot | None: ...

@final
class ArrivalRecord:
    @property
    def arrived_gpu_milli(self) -> npt.NDArray[np.int64]: ...
    @property
    def used_gpu_milli(self) -> npt.NDArray[np.int64]: ...
    @property
    def placed(self) -> npt.NDArray[np.bool_]: ...
    @property
    def decision_ns(self) -> npt.NDArray[np.int64]: ...
    @property
    def reconfigurations(self) -> int: ...

def replay_arrivals(
    cluster: SharedCluster,
    pods_rows: npt.NDArray[np.int64],
    models: npt.NDArray[np.uint64],
    orders: list[npt.NDArray[np.int64]],
    policies: list[str],
    seeds: list[int],
    distribution: ShareDistribution | None = None,
    prices: npt.NDArray[np.float64] | None = None,
    reconfigure: bool = False,
) -> list[ArrivalRecord]: ...
def share_policies() -> list[str]: ...
