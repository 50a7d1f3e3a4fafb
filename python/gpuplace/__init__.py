"""gpuplace: topology-aware placement of distributed GPU jobs.

>>> import gpuplace
>>> topo = gpuplace.Topology.preset("h100-superpod", nodes=64)
>>> state = gpuplace.ClusterState(topo)
>>> job = gpuplace.Job(name="llama", tp=8, pp=4, dp=4)
>>> placement = gpuplace.place(state, job)
>>> state.allocate(placement)

The package is grouped by concept, each layer using only those below it (the contracts are in
``pyproject.toml``, checked in CI): :mod:`gpuplace.model` (what clusters and jobs are),
:mod:`gpuplace.cluster` (a live cluster's state and what it prices), :mod:`gpuplace.policy`
(who may use what), :mod:`gpuplace.placement` (solvers, place, repair, explain),
:mod:`gpuplace.health`, :mod:`gpuplace.io` (readers and writers), :mod:`gpuplace.sim`,
:mod:`gpuplace.integrations` (Slurm, Ray, Kubernetes) and :mod:`gpuplace.cli`.
"""

from gpuplace import _deprecated, health
from gpuplace._core import __version__
from gpuplace.calibrate import calibrate
from gpuplace.cluster.state import ClusterState
from gpuplace.enums import CollectiveKind, ComponentKind, Condition, Health, MoveReason, SparePolicy
from gpuplace.errors import (
    GpuplaceError,
    Infeasible,
    InvalidJob,
    InvalidState,
    InvalidTopology,
    MissingExtra,
    StateConflict,
)
from gpuplace.model.job import Communication, Job, TransformerModel
from gpuplace.model.topology import Level, NodeType, Topology
from gpuplace.placement import (
    CostReport,
    Mapping,
    MovedRank,
    Placement,
    Repair,
    SolveResult,
    apply_preemption,
    evaluate,
    explain,
    map_ranks,
    place,
    refine,
    register_solver,
    repair,
    solvers,
)
from gpuplace.placement.explain import Explanation

_deprecated.install()

__all__ = [
    "ClusterState",
    "CollectiveKind",
    "Communication",
    "ComponentKind",
    "Condition",
    "CostReport",
    "Explanation",
    "GpuplaceError",
    "Health",
    "Infeasible",
    "InvalidJob",
    "InvalidState",
    "InvalidTopology",
    "Job",
    "Level",
    "Mapping",
    "MissingExtra",
    "MoveReason",
    "MovedRank",
    "NodeType",
    "Placement",
    "Repair",
    "SolveResult",
    "SparePolicy",
    "StateConflict",
    "Topology",
    "TransformerModel",
    "__version__",
    "apply_preemption",
    "calibrate",
    "evaluate",
    "explain",
    "health",
    "map_ranks",
    "place",
    "refine",
    "register_solver",
    "repair",
    "solvers",
]
