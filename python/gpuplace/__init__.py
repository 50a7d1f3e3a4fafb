"""gpuplace: topology-aware placement of distributed GPU jobs.

>>> import gpuplace
>>> topo = gpuplace.Topology.preset("h100-superpod", nodes=64)
>>> state = gpuplace.ClusterState(topo)
>>> job = gpuplace.Job(name="llama", tp=8, pp=4, dp=4)
>>> placement = gpuplace.place(state, job)
>>> state.allocate(placement)
"""

# The solvers written in Python (gpuplace.placers) register themselves on import.
from gpuplace import health
from gpuplace import placers as _placers  # noqa: F401
from gpuplace._core import __version__
from gpuplace.admission import apply_preemption
from gpuplace.calibrate import calibrate
from gpuplace.enums import CollectiveKind, ComponentKind, Condition, Health, MoveReason, SparePolicy
from gpuplace.errors import (
    GpuplaceError,
    Infeasible,
    InvalidJob,
    InvalidState,
    InvalidTopology,
)
from gpuplace.explain import Explanation, explain
from gpuplace.job import Communication, Job, TransformerModel
from gpuplace.mapping import Mapping, map_ranks
from gpuplace.placement import (
    CostReport,
    Placement,
    SolveResult,
    evaluate,
    place,
    refine,
    register_solver,
    solvers,
)
from gpuplace.repair import MovedRank, Repair, repair
from gpuplace.state import ClusterState
from gpuplace.topology import Level, NodeType, Topology

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
    "MoveReason",
    "MovedRank",
    "NodeType",
    "Placement",
    "Repair",
    "SolveResult",
    "SparePolicy",
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
