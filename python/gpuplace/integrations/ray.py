"""Ray: placement groups and Ray Train workers on the nodes gpuplace chooses, in rank order.

Ray (>= 2.40, ``pip install 'gpuplace[ray]'``) selects nodes by label. Start each host's Ray
node with the labels :func:`label_nodes` gives (``gpuplace/host`` plus the topology labels of
:mod:`gpuplace.integrations.k8s`); then :func:`placement_group` reserves one bundle per rank, bundle r
carrying a ``bundle_label_selector`` for rank r's host, and :func:`scaling_config` gives Ray
Train one label selector per worker. Ray Train orders worker ranks by the order in which nodes
first appear among the bundles, so gpuplace sets which nodes are used and their order; which
GPU inside a node a worker gets stays Ray's choice.

Only :func:`placement_group` and :func:`scaling_config` import Ray (without it they raise
:class:`gpuplace.MissingExtra`, naming the ``ray`` extra); the rest is plain data. Given a
:class:`~gpuplace.ClusterState`, both record the placement in it like ``gpuplace place
--state`` does, so the state knows what the Ray job holds; release it there when the job ends.
"""

from __future__ import annotations

import importlib
import shlex
from typing import Any

from gpuplace.cluster.state import ClusterState
from gpuplace.errors import InvalidJob, InvalidState, MissingExtra
from gpuplace.integrations.k8s import HOSTNAME_LABEL, node_labels
from gpuplace.model.job import Job
from gpuplace.model.topology import Topology
from gpuplace.placement.place import place
from gpuplace.placement.result import Placement

__all__ = [
    "HOST_LABEL",
    "bundles",
    "label_nodes",
    "placement_group",
    "scaling_config",
    "scaling_config_kwargs",
]

#: The Ray node label naming the gpuplace host a Ray node runs on.
HOST_LABEL = "gpuplace/host"


def _placement(
    cluster_or_state: Topology | ClusterState, job: Job | Placement, solver: str
) -> Placement:
    if isinstance(job, Placement):
        return job
    state = (
        cluster_or_state
        if isinstance(cluster_or_state, ClusterState)
        else ClusterState(cluster_or_state)
    )
    return place(state, job, solver)


def _record(cluster_or_state: Topology | ClusterState, placement: Placement) -> bool:
    """Allocate ``placement`` in the state (as ``gpuplace place --state`` does) unless it is
    already allocated there on the same GPUs in the same order; returns whether this call
    allocated it. InvalidState, and nothing changed, when it cannot be."""
    if not isinstance(cluster_or_state, ClusterState):
        return False
    held = cluster_or_state.job_gpus(placement.job.name)
    if held is not None:
        if [int(g) for g in held] == [int(g) for g in placement.gpus]:
            return False
        raise InvalidState(
            f"job {placement.job.name!r} is already allocated in the state on other GPUs; "
            "release it first"
        )
    cluster_or_state.allocate(placement)
    return True


def _import_ray(module: str, what: str) -> Any:
    """A Ray module, or MissingExtra saying which extra to install."""
    try:
        # The top-level package first: a submodule already in sys.modules would otherwise be
        # returned even when Ray itself is unavailable (blocked, or uninstalled since).
        importlib.import_module(module.partition(".")[0])
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(
            f"{what} needs Ray (>= 2.40), which is not installed: pip install 'gpuplace[ray]'"
        ) from None


def label_nodes(topology: Topology, *, topology_labels: bool = True) -> dict[str, str]:
    """Per host, the ``--labels`` argument of its ``ray start``: ``gpuplace/host=HOST`` and,
    with ``topology_labels``, its Topograph topology labels (NVLink domain, leaf, spine...)."""

    topo_labels: dict[str, dict[str, str]] = {}
    if topology_labels and len(topology.levels) > topology.node_level + 1:
        topo_labels = node_labels(topology)
    out = {}
    for host in topology.hosts:
        labels = {HOST_LABEL: host}
        labels.update({k: v for k, v in topo_labels.get(host, {}).items() if k != HOSTNAME_LABEL})
        out[host] = "--labels " + shlex.quote(",".join(f"{k}={v}" for k, v in labels.items()))
    return out


def bundles(
    placement: Placement, *, cpus_per_rank: float = 1.0, gpus_per_rank: float = 1.0
) -> tuple[list[dict[str, float]], list[dict[str, str]]]:
    """One bundle per rank in rank order, and its label selector (rank r's host)."""
    if gpus_per_rank <= 0 or cpus_per_rank < 0:
        raise InvalidJob("gpus_per_rank must be > 0 and cpus_per_rank >= 0")
    resources: dict[str, float] = {"GPU": gpus_per_rank}
    if cpus_per_rank:
        resources["CPU"] = cpus_per_rank
    hosts = [placement.topology.host_of(int(g)) for g in placement.gpus]
    return [dict(resources) for _ in hosts], [{HOST_LABEL: h} for h in hosts]


def placement_group(
    cluster_or_state: Topology | ClusterState,
    job: Job | Placement,
    *,
    solver: str = "greedy",
    cpus_per_rank: float = 1.0,
    name: str = "",
    strategy: str = "PACK",
    lifetime: str | None = None,
    record: bool = True,
) -> Any:
    """A Ray placement group for the job: bundle r on rank r's host (by ``gpuplace/host``
    label). ``job`` may be a :class:`Placement` already made. Given a :class:`ClusterState`,
    the placement is allocated in it like any other (``record=False``: not), all or nothing:
    if Ray refuses the placement group the allocation is undone. Needs a connected Ray
    (``ray.init``); returns Ray's ``PlacementGroup`` (wait on ``.ready()``). Without Ray
    installed: :class:`gpuplace.MissingExtra`, naming the ``ray`` extra."""
    ray_pg = _import_ray("ray.util.placement_group", "gpuplace.integrations.ray.placement_group")
    placement = _placement(cluster_or_state, job, solver)
    bundle_list, selectors = bundles(placement, cpus_per_rank=cpus_per_rank)
    recorded = record and _record(cluster_or_state, placement)
    try:
        return ray_pg.placement_group(
            bundle_list,
            strategy=strategy,
            name=name or placement.job.name,
            lifetime=lifetime,
            bundle_label_selector=selectors,
        )
    except BaseException:
        if recorded and isinstance(cluster_or_state, ClusterState):
            cluster_or_state.release(placement.job.name)
        raise


def scaling_config_kwargs(
    cluster_or_state: Topology | ClusterState,
    job: Job | Placement,
    *,
    solver: str = "greedy",
    cpus_per_rank: float = 1.0,
) -> dict[str, Any]:
    """The arguments of Ray Train's ``ScalingConfig``: one worker per rank, one GPU each, and
    one label selector per worker naming its host, in rank order."""
    placement = _placement(cluster_or_state, job, solver)
    _, selectors = bundles(placement, cpus_per_rank=cpus_per_rank)
    return {
        "num_workers": len(selectors),
        "use_gpu": True,
        "resources_per_worker": {"GPU": 1.0, "CPU": cpus_per_rank},
        "label_selector": selectors,
    }


def scaling_config(
    cluster_or_state: Topology | ClusterState,
    job: Job | Placement,
    *,
    solver: str = "greedy",
    cpus_per_rank: float = 1.0,
    record: bool = True,
) -> Any:
    """Ray Train's ``ScalingConfig`` from :func:`scaling_config_kwargs` (needs ``ray[train]``;
    without Ray: :class:`gpuplace.MissingExtra`). Given a :class:`ClusterState`, the
    placement is allocated in it like any other (``record=False``: not)."""
    train = _import_ray("ray.train", "gpuplace.integrations.ray.scaling_config")
    placement = _placement(cluster_or_state, job, solver)
    config = train.ScalingConfig(
        **scaling_config_kwargs(cluster_or_state, placement, cpus_per_rank=cpus_per_rank)
    )
    if record:
        _record(cluster_or_state, placement)
    return config
