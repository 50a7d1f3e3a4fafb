"""A live cluster: which GPUs are allocated, failed, drained or degraded, its state file, and
what its running jobs share and cost (fabric contention, power draw, storage traffic, the
pricing view solvers read)."""

from gpuplace.cluster.state import ClusterState

__all__ = ["ClusterState"]
