"""Readers of real cluster descriptions into the native topology dictionary, and writers back.

Host readers return a :class:`NodeType`, fabric readers a :class:`Fabric`;
:func:`to_topology_dict` combines them into the ``gpuplace.topology/1`` dictionary that
``gpuplace.Topology.from_dict`` loads. Every reader takes a path or an open file and raises
only :class:`gpuplace.errors.InvalidTopology` on bad input.
"""

from gpuplace.io.cloud import read_ec2_topology, read_k8s_nodes
from gpuplace.io.gpu_query import read_nvidia_smi_query
from gpuplace.io.ibnetdiscover import read_ibnetdiscover
from gpuplace.io.mig import read_nvidia_smi_mig, read_nvidia_smi_mig_instances
from gpuplace.io.nccl_tests import NcclTestsRow, NcclTestsRun, read_nccl_tests
from gpuplace.io.nvidia_smi import read_nvidia_smi_topo
from gpuplace.io.openb import read_openb_nodes, read_openb_pods
from gpuplace.io.placement_table import read_placement_table
from gpuplace.io.qaplib import read_qaplib, read_qaplib_solution
from gpuplace.io.rocm_smi import read_rocm_smi_topo
from gpuplace.io.slurm import read_slurm_topology
from gpuplace.io.writers import (
    k8s_node_affinity,
    rank_table,
    slurm_hostlist,
    write_cuda_visible_devices,
    write_k8s_node_affinity,
    write_openmpi_hostfile,
    write_openmpi_rankfile,
    write_rank_table,
    write_slurm_topology,
    write_torchrun_commands,
)
from gpuplace.model.inventory import Fabric, Host, Link, NodeType, Switch, to_topology_dict

__all__ = [
    "Fabric",
    "Host",
    "Link",
    "NcclTestsRow",
    "NcclTestsRun",
    "NodeType",
    "Switch",
    "k8s_node_affinity",
    "rank_table",
    "read_ec2_topology",
    "read_ibnetdiscover",
    "read_k8s_nodes",
    "read_nccl_tests",
    "read_nvidia_smi_mig",
    "read_nvidia_smi_mig_instances",
    "read_nvidia_smi_query",
    "read_nvidia_smi_topo",
    "read_openb_nodes",
    "read_openb_pods",
    "read_placement_table",
    "read_qaplib",
    "read_qaplib_solution",
    "read_rocm_smi_topo",
    "read_slurm_topology",
    "slurm_hostlist",
    "to_topology_dict",
    "write_cuda_visible_devices",
    "write_k8s_node_affinity",
    "write_openmpi_hostfile",
    "write_openmpi_rankfile",
    "write_rank_table",
    "write_slurm_topology",
    "write_torchrun_commands",
]
