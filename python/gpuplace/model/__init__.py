"""What a cluster and a job are, as declared: the topology (levels, host types, hosts,
domains, routing, power domains, stores, policy), the built-in presets, the hardware a reader
discovers, and the job (its parallel layout, communication, compute, power, data and policy).

Nothing here holds a cluster's state: that is :mod:`gpuplace.cluster`.
"""

from gpuplace.model.job import Communication, Job, TransformerModel
from gpuplace.model.topology import Level, NodeType, Topology

__all__ = ["Communication", "Job", "Level", "NodeType", "Topology", "TransformerModel"]
