"""Type stubs of the private native module ``gpuplace._core`` (the PyO3 bindings of
gpuplace-core). The public API is re-exported from ``gpuplace``; these classes hold the
flat arrays the Rust core solves over."""

from typing import final

import numpy as np
import numpy.typing as npt

__all__ = [
    "ClusterState",
    "JobSpec",
    "Topology",
    "__version__",
    "collective_terms",
    "evaluate",
    "loss_factor",
    "map_ranks",
    "pair_bandwidth_matrix",
    "place",
    "pricing_view",
    "refine",
    "rust_solvers",
]

__version__: str

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
    @property
    def bandwidth_gbps(self) -> list[float]: ...
    @property
    def latency_us(self) -> list[float]: ...
    def domain_count(self, level: int) -> int: ...
    def domain_sizes(self, level: int) -> npt.NDArray[np.int64]: ...
    def parents(self, level: int) -> npt.NDArray[np.int64]: ...
    def path(self) -> npt.NDArray[np.int64]: ...
    def bandwidth_matrix(self, gpus: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]: ...
    @property
    def effective_bandwidth_gbps(self) -> list[float]: ...
    def collective_seconds_by_level(self, kind: int, n: int, bytes: float) -> list[float]: ...
    def lca(self, a: int, b: int) -> int: ...
    def pair_bandwidth(self, a: int, b: int) -> float: ...

@final
class JobSpec:
    def __new__(
        cls,
        topology: Topology,
        num_ranks: int,
        dim_names: list[str],
        dim_sizes: list[int],
        dim_confine: list[int],
        max_span: int,
        group_offsets: npt.NDArray[np.int64],
        group_ranks: npt.NDArray[np.int64],
        coll_group: npt.NDArray[np.int64],
        coll_kind: npt.NDArray[np.int64],
        coll_bytes: npt.NDArray[np.float64],
        coll_count: npt.NDArray[np.float64],
        coll_class: npt.NDArray[np.int64],
        coll_dim: npt.NDArray[np.int64],
        traffic_src: npt.NDArray[np.int64],
        traffic_dst: npt.NDArray[np.int64],
        traffic_bytes: npt.NDArray[np.float64],
    ) -> JobSpec: ...
    @property
    def num_ranks(self) -> int: ...
    def layout_order(self) -> list[int]: ...

@final
class ClusterState:
    def __new__(
        cls, topology: Topology, gpu_nic: npt.NDArray[np.int64] | None = None
    ) -> ClusterState: ...
    def copy(self) -> ClusterState: ...
    def allocate(self, name: str, gpus: npt.NDArray[np.int64]) -> None: ...
    def release(self, name: str) -> npt.NDArray[np.int64]: ...
    def set_health(
        self, gpus: npt.NDArray[np.int64], code: int
    ) -> list[tuple[str, npt.NDArray[np.int64]]]: ...
    def health(self) -> npt.NDArray[np.uint8]: ...
    def free_mask(self) -> npt.NDArray[np.bool_]: ...
    def free_counts(self, level: int) -> npt.NDArray[np.int64]: ...
    def recount(self) -> list[npt.NDArray[np.int64]]: ...
    @property
    def total_free(self) -> int: ...
    def owner_of(self, gpu: int) -> str | None: ...
    def jobs(self) -> dict[str, npt.NDArray[np.int64]]: ...
    def job_gpus(self, name: str) -> npt.NDArray[np.int64] | None: ...
    def memory_bytes(self) -> int: ...
    def set_condition(
        self,
        kinds: npt.NDArray[np.int64],
        a: npt.NDArray[np.int64],
        b: npt.NDArray[np.int64],
        code: int,
        factor: float,
        reason: str,
    ) -> list[tuple[str, npt.NDArray[np.int64]]]: ...
    def components(self) -> list[tuple[int, int, int, int, float, str]]: ...
    def set_spare(self, gpus: npt.NDArray[np.int64], spare: bool) -> None: ...
    def spare_mask(self) -> npt.NDArray[np.bool_]: ...
    def degraded_mask(self) -> npt.NDArray[np.bool_]: ...
    def spare_counts(self, level: int) -> npt.NDArray[np.int64]: ...
    def check(self) -> None: ...
    def replace_allocation(self, name: str, gpus: npt.NDArray[np.int64]) -> None: ...
    def repair(
        self,
        job: JobSpec,
        name: str,
        max_moves: int = 0,
        spares: str = "allow",
        max_evaluations: int = 24,
        time_limit: float | None = None,
    ) -> dict[str, object]: ...

def evaluate(
    topology: Topology,
    job: JobSpec,
    gpus: npt.NDArray[np.int64],
    state: ClusterState | None = None,
) -> dict[str, object]: ...
def loss_factor(loss: float) -> float: ...
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
) -> tuple[npt.NDArray[np.int64], float, int, float]: ...
def place(
    state: ClusterState,
    job: JobSpec,
    solver: str,
    seed: int = 0,
    time_limit: float | None = None,
) -> npt.NDArray[np.int64]: ...
def refine(
    state: ClusterState,
    job: JobSpec,
    start: npt.NDArray[np.int64],
    time_limit: float = 0.5,
    seed: int = 0,
    max_iterations: int = 200000,
) -> tuple[npt.NDArray[np.int64], float, float, int, int]: ...
def rust_solvers() -> list[str]: ...

# Pricing view (rust/py/src/pricing.rs)
def pricing_view(
    state: ClusterState,
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_], npt.NDArray[np.float32]]: ...
def pair_bandwidth_matrix(
    state: ClusterState, gpus: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]: ...
def collective_terms(kind: int, n: int, bytes: float) -> tuple[float, float]: ...
