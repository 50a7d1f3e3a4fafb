"""gpuplace: topology-aware placement of distributed GPU jobs.

>>> import gpuplace
>>> topo = gpuplace.Topology.preset("h100-superpod", nodes=64)
>>> state = gpuplace.ClusterState(topo)
>>> job = gpuplace.Job(name="llama", tp=8, pp=4, dp=4)
>>> placement = gpuplace.place(state, job)
>>> state.allocate(placement)
"""

from gpuplace._core import __version__
from gpuplace.errors import (
    GpuplaceError,
    Infeasible,
    InvalidJob,
    InvalidState,
    InvalidTopology,
)
from gpuplace.job import Communication, Job, TransformerModel
from gpuplace.placement import (
    CostReport,
    Placement,
    SolveResult,
    evaluate,
    place,
    register_solver,
    solvers,
)
from gpuplace.state import ClusterState
from gpuplace.topology import Level, NodeType, Topology

__all__ = [
    "ClusterState",
    "Communication",
    "CostReport",
    "GpuplaceError",
    "Infeasible",
    "InvalidJob",
    "InvalidState",
    "InvalidTopology",
    "Job",
    "Level",
    "NodeType",
    "Placement",
    "SolveResult",
    "Topology",
    "TransformerModel",
    "__version__",
    "evaluate",
    "place",
    "register_solver",
    "solvers",
]

# Register the Python solvers (cpsat, auto); last, because they import the modules above.
# The package shares its name with the ``solvers()`` function above and importing it rebinds
# ``gpuplace.solvers``; the package is callable (it forwards to that function), so both
# ``gpuplace.solvers()`` and ``gpuplace.solvers.cpsat`` work.
import gpuplace.solvers  # noqa: F401
