"""Peer placement policies, re-implemented from their documented behaviour to be measured against.

Each baseline follows the public documentation and source of the scheduler it stands for, down
to its tie-breaking, so that a comparison with gpuplace's solvers is a comparison with what those
schedulers really do (``tests/test_slurm_tree.py`` checks ``slurm-tree`` against a running Slurm).
None of them reads the job's communication: they see only its size, as their originals do.

* ``slurm-tree``: Slurm's ``topology/tree`` plugin with ``select/cons_tres``, nodes shared;
  ``slurm-tree-exclusive`` the same with ``--exclusive`` (whole nodes).
* ``first-fit-pod``, ``random-pod``: kube-scheduler binding one pod to one node (the first, or
  a random one, with enough free GPUs), the NVIDIA device plugin choosing GPUs inside it.
* ``kueue-bestfit``: Kueue Topology Aware Scheduling, BestFit profile, with the NVIDIA device
  plugin choosing GPUs inside each node.
* ``gpuallocator``: NVIDIA go-gpuallocator's best-effort policy inside a node, nodes first-fit.

All three map a cluster onto their own vocabulary the same way: a gpuplace host is a Slurm node or
a Kubernetes node, and every level above the host is a level of switches (Slurm) or of topology
domains (Kueue). Levels below the host (PCIe switches, NUMA) exist only for go-gpuallocator, which
reads them as PCIe link types. Free capacity is the state's free, healthy GPUs: failed and
drained GPUs are never handed out, and a job that does not fit raises :class:`Infeasible`.
"""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from typing import TYPE_CHECKING

import numpy as np

from gpuplace.errors import Infeasible
from gpuplace.placement.registry import register_solver
from gpuplace.placement.result import SolveResult

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = [
    "SwitchTree",
    "gpuallocator_best_effort",
    "kueue_bestfit_nodes",
    "slurm_tree_nodes",
]


# --------------------------------------------------------------------------- shared views
@dataclass(frozen=True)
class _Hosts:
    """Per-host arrays of a topology, computed once per topology."""

    #: GPUs of each host.
    gpus: np.ndarray
    #: First GPU id of each host (GPU ids run host by host).
    first_gpu: np.ndarray
    #: Domain id of each host at each level above the host level, shape (hosts, levels above).
    domains: np.ndarray
    #: Names of those levels, bottom-up.
    level_names: tuple[str, ...]


_HOSTS: weakref.WeakKeyDictionary[Topology, _Hosts] = weakref.WeakKeyDictionary()


def _hosts(topology: Topology) -> _Hosts:
    cached = _HOSTS.get(topology)
    if cached is None:
        gpus = np.bincount(topology.host_of_gpu, minlength=len(topology.hosts)).astype(np.int64)
        first = np.concatenate(([0], np.cumsum(gpus)[:-1])).astype(np.int64)
        above = topology.path[first][:, topology.node_level + 1 :]
        names = tuple(topology.level_names[topology.node_level + 1 :])
        cached = _Hosts(gpus, first, np.ascontiguousarray(above), names)
        _HOSTS[topology] = cached
    return cached


def _host_free(state: ClusterState) -> np.ndarray:
    """Free, healthy GPUs of each host."""
    return state.free_counts(state.topology.node_level).astype(np.int64)


def _pod_gpus(job_gpus: int, hosts: _Hosts) -> int:
    """GPUs per pod when a job of ``job_gpus`` runs as identical pods, one GPU request each,
    as Kubernetes training operators launch it: the largest size that divides the job and fits
    the smallest host (8 for a multiple of 8 on HGX nodes; 4 on GB200 trays)."""
    return math.gcd(job_gpus, int(hosts.gpus.min()))


# --------------------------------------------------------------------------- slurm-tree
@dataclass(frozen=True)
class SwitchTree:
    """The switches Slurm's ``topology/tree`` plugin builds from ``topology.conf``.

    Switches are numbered as topology.conf lists them: the leaf switches (the first level above
    the host) by domain id, then the next level's, up to the top. ``level[s]`` is Slurm's switch
    level (0 for leaves), ``parent[s]`` the switch above (-1 at the top).
    """

    level: np.ndarray
    parent: np.ndarray
    #: First switch index of each level.
    offsets: np.ndarray
    #: Switch index of each host's leaf switch.
    host_leaf: np.ndarray
    #: Switch of each host at every switch level, shape (hosts, levels).
    host_switches: np.ndarray

    @classmethod
    def of(cls, topology: Topology) -> SwitchTree:
        hosts = _hosts(topology)
        levels = hosts.domains.shape[1]
        if levels == 0:
            raise Infeasible(
                f"{topology.name}: slurm-tree needs at least one switch level above the hosts"
            )
        counts = [topology.domain_count(topology.node_level + 1 + i) for i in range(levels)]
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        level = np.repeat(np.arange(levels), counts)
        parent = np.full(int(offsets[-1]), -1, dtype=np.int64)
        for i in range(levels - 1):
            up = topology.parents(topology.node_level + 1 + i)
            parent[offsets[i] : offsets[i + 1]] = offsets[i + 1] + up
        host_switches = hosts.domains + offsets[:levels]
        return cls(level, parent, offsets, host_switches[:, 0], host_switches)


_TREES: weakref.WeakKeyDictionary[Topology, SwitchTree] = weakref.WeakKeyDictionary()


def _switch_tree(topology: Topology) -> SwitchTree:
    tree = _TREES.get(topology)
    if tree is None:
        tree = _TREES[topology] = SwitchTree.of(topology)
    return tree


def slurm_tree_nodes(tree: SwitchTree, idle: np.ndarray, nodes: int) -> np.ndarray:
    """The hosts Slurm 22.05 gives an exclusive job of ``nodes`` nodes, in node order.

    Follows ``_eval_nodes_topo`` of ``src/plugins/select/cons_tres/job_test.c`` (Slurm 22.05,
    "Allocate resources to job using a minimal leaf switch count") with its helpers
    ``_topo_choose_best_switch``, ``_topo_compare_switches`` and ``_topo_add_dist``, for a job
    without required nodes on nodes of equal scheduling weight:

    1. The top switch is the highest-level switch holding enough idle nodes (the last such one
       when several share that level); nodes outside it are dropped. None: the job cannot run.
    2. Leaf switches are then taken one at a time. Every switch's idle-node count is fixed at
       this point; a used leaf's count drops to 0. Among leaves with idle nodes, scanned in
       switch order, a leaf replaces the current best when it is closer to the leaves already
       used (summed switch hops) and compares no worse, or equally close and compares better.
       Comparing two leaves: if both hold the remaining nodes, the smaller one wins (best fit);
       if one does, it wins; if neither, their parents are compared the same way while the
       parents differ; then the larger count wins, then the lower level.
    3. From the chosen leaf, idle nodes are taken in node order until the job has enough.

    ``idle`` marks hosts that are entirely free (an exclusive job takes whole nodes).
    """
    idle = np.asarray(idle, dtype=bool)
    if nodes == 1:
        return _slurm_tree_one_node(tree, idle)
    return _slurm_tree_general(tree, idle, nodes)


def _slurm_tree_general(tree: SwitchTree, idle: np.ndarray, nodes: int) -> np.ndarray:
    """:func:`slurm_tree_nodes` for any node count (the steps of its docstring)."""
    levels = tree.host_switches.shape[1]
    switch_count = len(tree.level)
    counts = np.zeros(switch_count, dtype=np.int64)
    for lv in range(levels):
        counts += np.bincount(tree.host_switches[idle, lv], minlength=switch_count)
    top_level = int(tree.level.max())
    candidates = np.flatnonzero(counts >= nodes)
    if nodes < 1 or candidates.size == 0:
        raise Infeasible(
            f"slurm-tree: needs {nodes} idle nodes under one switch; "
            f"the most any switch has is {int(counts.max()) if counts.size else 0}"
        )
    # Highest level first; at equal level the later switch wins (the `>=` of the original).
    best_level = int(tree.level[candidates].max())
    top = int(candidates[tree.level[candidates] == best_level][-1])
    under_top = idle & (tree.host_switches[:, best_level] == top)
    counts = np.zeros(switch_count, dtype=np.int64)
    for lv in range(levels):
        counts += np.bincount(tree.host_switches[under_top, lv], minlength=switch_count)

    leaves = np.arange(tree.offsets[0], tree.offsets[1])
    leaf_counts = counts[leaves].copy()
    # Hops between leaves: two per level up to their lowest common switch.
    leaf_up = np.empty((levels, len(leaves)), dtype=np.int64)
    leaf_up[0] = leaves
    for lv in range(1, levels):
        leaf_up[lv] = tree.parent[leaf_up[lv - 1]]
    distance = np.zeros(len(leaves), dtype=np.int64)

    def compare(i: int, j: int, remaining: int) -> int:
        a, b, lv = int(leaves[i]), int(leaves[j]), 0
        count_a, count_b = int(leaf_counts[i]), int(leaf_counts[j])
        while True:
            fit_a, fit_b = count_a >= remaining, count_b >= remaining
            if fit_a and fit_b:
                if count_a != count_b:
                    return 1 if count_a < count_b else -1
                break
            if fit_a or fit_b:
                return 1 if fit_a else -1
            if lv < top_level and tree.parent[a] != tree.parent[b]:
                a, b, lv = int(tree.parent[a]), int(tree.parent[b]), lv + 1
                count_a, count_b = int(counts[a]), int(counts[b])
                continue
            break
        if count_a != count_b:
            return 1 if count_a > count_b else -1
        return 0

    chosen: list[np.ndarray] = []
    remaining = nodes
    while remaining > 0:
        best = -1
        for i in np.flatnonzero(leaf_counts > 0):
            if best == -1:
                best = int(i)
                continue
            order = compare(int(i), best, remaining)
            if (distance[i] < distance[best] and order >= 0) or (
                distance[i] == distance[best] and order > 0
            ):
                best = int(i)
        if best == -1:  # cannot happen: the top switch holds enough idle nodes
            raise Infeasible(f"slurm-tree: ran out of idle nodes with {remaining} still needed")
        lca = np.argmax(leaf_up == leaf_up[:, best : best + 1], axis=0)
        distance += 2 * lca
        members = np.flatnonzero(under_top & (tree.host_leaf == leaves[best]))[:remaining]
        chosen.append(members)
        remaining -= len(members)
        leaf_counts[best] = 0
    return np.sort(np.concatenate(chosen))


def _slurm_tree_one_node(tree: SwitchTree, idle: np.ndarray) -> np.ndarray:
    """:func:`slurm_tree_nodes` for one node, without its general loop: the top switch is the
    last top-level switch with an idle node; every leaf under it holds the one node needed, so
    the best fit is the first leaf (in switch order) with the fewest idle nodes, and the node
    is its first idle one. The same choice, in a few array operations (a one-node job is most
    jobs of a trace, and the backfill scheduler asks for each of them on every pass)."""
    top_of = tree.host_switches[:, -1]
    idle_hosts = np.flatnonzero(idle)
    if idle_hosts.size == 0:
        raise Infeasible("slurm-tree: needs 1 idle nodes under one switch; the most any has is 0")
    top = int(top_of[idle_hosts].max())
    under_top = idle_hosts[top_of[idle_hosts] == top]
    leaf_counts = np.bincount(tree.host_leaf[under_top], minlength=len(tree.level))
    # Positive counts only; ties to the first leaf (argmin takes the first minimum).
    masked = np.where(leaf_counts > 0, leaf_counts, np.iinfo(np.int64).max)
    leaf = int(np.argmin(masked))
    return under_top[tree.host_leaf[under_top] == leaf][:1]


@register_solver(
    "slurm-tree",
    "peer baseline: Slurm 22.05 select/cons_tres with topology/tree, nodes shared (a job "
    "within a node takes the free GPUs of one node; larger jobs whole nodes' worth): top "
    "switch, then best-fit leaf switches by hop distance, ranks in node order",
)
def slurm_tree(state: ClusterState, job: Job, seed: int, time_limit: float | None) -> SolveResult:
    """Slurm's choice for ``sbatch -N n --gpus-per-node=k`` without ``--exclusive``
    (``select/cons_tres`` shares nodes): ``n = ceil(gpus / gpus_per_node)`` nodes, ``k =
    ceil(gpus / n)``. A node is available when it has ``k`` free, healthy GPUs; among those
    :func:`slurm_tree_nodes` picks the nodes (``_eval_nodes_topo`` counts available nodes per
    switch, as it counts idle ones for an exclusive job). On each node the GRES plugin gives
    the lowest free GPU indices; ranks fill the nodes in node order, local index fastest, as
    ``srun`` numbers tasks with the default block distribution."""
    topology = state.topology
    hosts = _hosts(topology)
    per_node = int(hosts.gpus.max())
    nodes = -(-job.gpus // per_node)
    per_host = -(-job.gpus // nodes)
    free_per_host = _host_free(state)
    chosen = slurm_tree_nodes(_switch_tree(topology), free_per_host >= per_host, nodes)
    free = state.free_mask()
    gpus = np.concatenate(
        [
            hosts.first_gpu[h]
            + np.flatnonzero(free[hosts.first_gpu[h] : hosts.first_gpu[h] + hosts.gpus[h]])[
                :per_host
            ]
            for h in chosen
        ]
    )
    if len(gpus) < job.gpus:  # hosts smaller than the largest: Slurm would need more nodes
        raise Infeasible(f"slurm-tree: {nodes} nodes hold fewer than {job.gpus} free GPUs")
    return SolveResult(gpus=gpus[: job.gpus].astype(np.int64), details={"nodes": nodes})


@register_solver(
    "slurm-tree-exclusive",
    "peer baseline: Slurm 22.05 topology/tree with --exclusive (whole idle nodes; top switch, "
    "then best-fit leaf switches by hop distance), ranks in node order",
)
def slurm_tree_exclusive(
    state: ClusterState, job: Job, seed: int, time_limit: float | None
) -> SolveResult:
    """Slurm's choice for ``sbatch --exclusive -N ceil(gpus / gpus_per_node)``: whole idle
    nodes (every GPU free and healthy) chosen by :func:`slurm_tree_nodes`; ranks fill the nodes'
    GPUs in node order, local index fastest, as ``srun`` numbers tasks with the default block
    distribution."""
    topology = state.topology
    hosts = _hosts(topology)
    tree = _switch_tree(topology)
    per_node = int(hosts.gpus.max())
    nodes = -(-job.gpus // per_node)
    idle = _host_free(state) == hosts.gpus
    chosen = slurm_tree_nodes(tree, idle, nodes)
    gpus = np.concatenate([np.arange(hosts.gpus[h]) + hosts.first_gpu[h] for h in chosen])
    if len(gpus) < job.gpus:  # hosts smaller than the largest: Slurm would need more nodes
        raise Infeasible(f"slurm-tree: {nodes} nodes hold fewer than {job.gpus} GPUs")
    return SolveResult(gpus=gpus[: job.gpus].astype(np.int64), details={"nodes": nodes})


def _pod_host(state: ClusterState, job: Job, seed: int, *, at_random: bool) -> SolveResult:
    """One pod on one node, as kube-scheduler binds it: a node with ``gpus`` free, healthy
    GPUs (the first in node order, or one at random), the NVIDIA device plugin handing out its
    lowest free GPU indices. A pod never spans nodes."""
    hosts = _hosts(state.topology)
    fits = np.flatnonzero(_host_free(state) >= job.gpus)
    if fits.size == 0:
        raise Infeasible(
            f"a pod of {job.gpus} GPUs needs one node with {job.gpus} free GPUs; the most "
            f"free on a node is {int(_host_free(state).max(initial=0))}"
        )
    # Random per call yet deterministic for a seed and a state.
    rng = np.random.default_rng([seed, state.free_gpus, int(fits.size)])
    host = int(rng.choice(fits)) if at_random else int(fits[0])
    first = hosts.first_gpu[host]
    free = np.flatnonzero(state.free_mask()[first : first + hosts.gpus[host]])[: job.gpus]
    return SolveResult(gpus=(first + free).astype(np.int64), details={"node": host})


@register_solver(
    "first-fit-pod",
    "peer baseline: a Kubernetes pod on the first node (in node order) with enough free GPUs",
)
def first_fit_pod(
    state: ClusterState, job: Job, seed: int, time_limit: float | None
) -> SolveResult:
    return _pod_host(state, job, seed, at_random=False)


@register_solver(
    "random-pod",
    "peer baseline: a Kubernetes pod on a random node with enough free GPUs",
)
def random_pod(state: ClusterState, job: Job, seed: int, time_limit: float | None) -> SolveResult:
    return _pod_host(state, job, seed, at_random=True)


# --------------------------------------------------------------------------- kueue-bestfit
@dataclass(frozen=True)
class _KueueLevels:
    """Kueue's view of the topology: levels top-down ending at the hostname level."""

    #: Domain of each host at each Kueue level, shape (hosts, levels), top level first.
    host_domain: np.ndarray
    #: Per level, each domain's rank in the lexicographic order of its level values.
    lex_rank: tuple[np.ndarray, ...]
    #: Per level below the top, each domain's parent domain at the level above.
    parent: tuple[np.ndarray, ...]


_KUEUE: weakref.WeakKeyDictionary[Topology, _KueueLevels] = weakref.WeakKeyDictionary()


def _kueue_levels(topology: Topology) -> _KueueLevels:
    cached = _KUEUE.get(topology)
    if cached is not None:
        return cached
    hosts = _hosts(topology)
    host_ids = np.arange(len(topology.hosts), dtype=np.int64)
    # Bottom-up: host, then the levels above it; Kueue lists them top-down.
    bottom_up = np.column_stack([host_ids, hosts.domains])
    host_domain = np.ascontiguousarray(bottom_up[:, ::-1])
    names = [topology.domain_names[topology.node_level + i] for i in range(bottom_up.shape[1])]
    names = names[::-1]
    lex_rank: list[np.ndarray] = []
    parent: list[np.ndarray] = []
    for lv in range(host_domain.shape[1]):
        count = len(names[lv])
        first_host = np.full(count, -1, dtype=np.int64)
        # A domain's level values are the names on its path from the top.
        order = np.unique(host_domain[:, lv], return_index=True)
        first_host[order[0]] = order[1]
        values = [tuple(names[up][host_domain[h, up]] for up in range(lv + 1)) for h in first_host]
        ranks = np.empty(count, dtype=np.int64)
        ranks[sorted(range(count), key=values.__getitem__)] = np.arange(count)
        lex_rank.append(ranks)
        if lv > 0:
            up = np.empty(count, dtype=np.int64)
            up[host_domain[:, lv]] = host_domain[:, lv - 1]
            parent.append(up)
    cached = _KueueLevels(host_domain, tuple(lex_rank), (np.zeros(0, dtype=np.int64), *parent))
    _KUEUE[topology] = cached
    return cached


def _sorted_domains(domains: np.ndarray, state: np.ndarray, lex_rank: np.ndarray) -> np.ndarray:
    """Kueue's ``sortedDomains`` for BestFit: most free pods first, ties by level values."""
    return domains[np.lexsort((lex_rank[domains], -state[domains]))]


def _best_fit_index(states: np.ndarray, count: int) -> int:
    """Kueue's ``findBestFitDomainIdx``: the first domain with the least state >= count, among
    domains sorted by decreasing state; 0 when none holds ``count``."""
    fits = np.flatnonzero(states >= count)
    if fits.size == 0:
        return 0
    least = states[fits].min()
    return int(fits[states[fits] == least][0])


def _counts_to_minimum(
    domains: np.ndarray, states: np.ndarray, count: int
) -> list[tuple[int, int]]:
    """Kueue's ``updateCountsToMinimum`` with BestFit: whole domains in order until the rest
    fits in one, then the tightest domain that holds the rest."""
    out: list[tuple[int, int]] = []
    remaining = count
    for i in range(len(domains)):
        pick = i
        if states[i] >= remaining:
            pick = i + _best_fit_index(states[i:], remaining)
        if states[pick] >= remaining:
            out.append((int(domains[pick]), remaining))
            return out
        remaining -= int(states[pick])
        out.append((int(domains[pick]), int(states[pick])))
    raise Infeasible(f"kueue-bestfit: {remaining} pods left without a domain")


def kueue_bestfit_nodes(
    topology: Topology, pods_per_host: np.ndarray, pods: int
) -> list[tuple[int, int]]:
    """Hosts and pod counts Kueue TAS (BestFit profile) assigns to a PodSet of ``pods`` pods
    whose topology request is ``podset-preferred-topology: kubernetes.io/hostname``.

    Follows ``findTopologyAssignment`` in ``pkg/cache/tas_flavor_snapshot.go`` (Kueue
    v0.11-v0.12) and the Kueue documentation, "Topology Aware Scheduling"
    (kueue.sigs.k8s.io/docs/concepts/topology_aware_scheduling/): with a preferred level "the
    levels are evaluated one-by-one going up from the level indicated by the annotation. If the
    PodSet cannot fit within a given topology domain then the next topology level up is
    considered. If the PodSet cannot fit at the highest topology level, then it gets admitted as
    distributed among multiple topology domains."

    1. Every domain's state is the number of pods that fit in it (``fillInCounts``).
    2. From the hostname level up, domains are sorted by decreasing state, then by their level
       values; the first level whose first domain fits takes the tightest fitting domain (first
       of the least state >= pods). At the top level, if none fits, domains are taken in order,
       the last one best-fit.
    3. Down level by level, the children of all chosen domains are sorted together the same
       way and taken whole until the rest of the PodSet fits in one, which is chosen best-fit
       (``updateCountsToMinimum``). The whole PodSet's count is spread again at every level:
       how many pods each parent was given is not carried down.
    4. The assignment lists hosts by their level values.
    """
    view = _kueue_levels(topology)
    levels = view.host_domain.shape[1]
    state = [
        np.bincount(
            view.host_domain[:, lv], weights=pods_per_host, minlength=len(view.lex_rank[lv])
        ).astype(np.int64)
        for lv in range(levels)
    ]
    total = int(state[0].sum())
    if total < pods:
        raise Infeasible(
            f"kueue-bestfit: needs {pods} pods; the free GPUs hold only {total} such pods"
        )
    chosen: list[tuple[int, int]] | None = None
    fit_level = 0
    for lv in range(levels - 1, -1, -1):
        order = _sorted_domains(np.arange(len(state[lv])), state[lv], view.lex_rank[lv])
        states = state[lv][order]
        if states[0] >= pods:
            pick = _best_fit_index(states, pods)
            chosen, fit_level = [(int(order[pick]), pods)], lv
            break
        if lv == 0:
            chosen, fit_level = _counts_to_minimum(order, states, pods), 0
    assert chosen is not None
    for lv in range(fit_level + 1, levels):
        parents = np.array([d for d, _ in chosen], dtype=np.int64)
        children = np.flatnonzero(np.isin(view.parent[lv], parents) & (state[lv] > 0))
        order = _sorted_domains(children, state[lv], view.lex_rank[lv])
        chosen = _counts_to_minimum(order, state[lv][order], pods)
    host_level = levels - 1
    chosen.sort(key=lambda pair: int(view.lex_rank[host_level][pair[0]]))
    return chosen


@register_solver(
    "kueue-bestfit",
    "peer baseline: Kueue TAS BestFit (lowest level with one domain that fits, tightest "
    "domains) for pods of 8 GPUs (4 on GB200 trays); device plugin picks GPUs in a node",
)
def kueue_bestfit(
    state: ClusterState, job: Job, seed: int, time_limit: float | None
) -> SolveResult:
    """The job as one PodSet of identical pods (see :func:`_pod_gpus`), placed by
    :func:`kueue_bestfit_nodes`; inside each node, the NVIDIA device plugin's preferred
    allocation (go-gpuallocator best effort) chooses each pod's GPUs. Ranks follow the pods in
    assignment order."""
    topology = state.topology
    hosts = _hosts(topology)
    pod = _pod_gpus(job.gpus, hosts)
    free = _host_free(state)
    assignment = kueue_bestfit_nodes(topology, free // pod, job.gpus // pod)
    gpus = _fill_pods(state, [(h, n) for h, n in assignment], pod)
    return SolveResult(gpus=gpus, details={"pod_gpus": pod, "hosts": len(assignment)})


# --------------------------------------------------------------------------- gpuallocator
#: go-gpuallocator ``calculateGPUPairScore``: points per link of each type.
_LINK_POINTS = {"SOC": 10, "SYS": 10, "NODE": 20, "PHB": 30, "PXB": 40, "PIX": 50, "PSB": 60}
_NVLINK = re.compile(r"^NV(\d+)$")


def _link_points(link_class: str) -> int:
    match = _NVLINK.match(link_class)
    if match:
        return 100 * int(match.group(1))
    return _LINK_POINTS.get(link_class, 0)


_SCORES: weakref.WeakKeyDictionary[Topology, dict[str, np.ndarray]] = weakref.WeakKeyDictionary()


def _pair_scores(topology: Topology, node_type: str) -> np.ndarray:
    """go-gpuallocator pair scores between the local GPUs of one node type.

    From the type's ``nvidia-smi topo -m`` link classes when it has them (what go-gpuallocator
    reads through NVML); otherwise from where a pair meets inside the host: hosts without
    sublevels are NVSwitch boxes whose pairs are all alike (NV18 on HGX H100); with sublevels,
    the lowest one is a PCIe switch (PIX), the ones above it the CPU's PCIe hierarchy (NODE),
    and the host itself the socket interconnect (SYS)."""
    per_type = _SCORES.setdefault(topology, {})
    if node_type in per_type:
        return per_type[node_type]
    nt = topology.node_types[node_type]
    g = nt.gpus
    if nt.link_classes is not None:
        scores = np.array(
            [[_link_points(c) for c in row] for row in nt.link_classes], dtype=np.int64
        )
    elif not nt.sublevels:
        scores = np.full((g, g), _link_points("NV18"), dtype=np.int64)
    else:
        below = topology.level_names[: topology.node_level]
        meet = np.full((g, g), len(below), dtype=np.int64)
        for lv in range(len(below) - 1, -1, -1):
            dom = np.asarray(nt.sublevels[below[lv]])
            meet[dom[:, None] == dom[None, :]] = lv
        points = np.array(
            [_LINK_POINTS["PIX"]]
            + [_LINK_POINTS["NODE"]] * (len(below) - 1)
            + [_LINK_POINTS["SYS"]]
        )
        scores = points[meet]
    np.fill_diagonal(scores, 0)
    per_type[node_type] = scores
    return scores


def _partitions(items: tuple[int, ...], size: int) -> Iterator[list[tuple[int, ...]]]:
    """go-gpuallocator ``iterateGPUPartitions``: every split of ``items`` (padded with -1 to a
    multiple of ``size``) into sets of ``size``, the first item of each set increasing; a set
    holds either no padding or all of it."""
    padded = items + (-1,) * (-len(items) % size)
    padding = len(padded) - len(items)

    def walk(
        rest: tuple[int, ...], accum: list[tuple[int, ...]]
    ) -> Iterator[list[tuple[int, ...]]]:
        if len(rest) == size:
            yield [*accum, rest]
            return
        head, tail = rest[0], rest[1:]
        for combo in combinations(tail, size - 1):  # iterateGPUSets' order
            chosen = (head, *combo)
            pads = chosen.count(-1)
            if pads not in (0, padding):
                continue
            yield from walk(_remove(rest, chosen), [*accum, chosen])

    yield from walk(padded, [])


def _remove(items: tuple[int, ...], chosen: tuple[int, ...]) -> tuple[int, ...]:
    rest = list(items)
    for x in chosen:
        rest.remove(x)
    return tuple(rest)


@lru_cache(maxsize=4096)
def _best_effort(
    scores_key: bytes, g: int, available: tuple[int, ...], size: int
) -> tuple[int, ...]:
    scores = np.frombuffer(scores_key, dtype=np.int64).reshape(g, g)

    def set_score(s: tuple[int, ...]) -> int:
        real = [x for x in s if x >= 0]
        idx = np.array(real, dtype=np.int64)
        return int(scores[np.ix_(idx, idx)].sum() // 2) if len(real) > 1 else 0

    if size == 1:
        return (available[0],)
    best_partition: list[tuple[int, ...]] | None = None
    best_score = 0
    for partition in _partitions(available, size):
        score = sum(set_score(s) for s in partition)
        if best_partition is None or score > best_score:
            best_partition, best_score = partition, score
    assert best_partition is not None
    # The best set of the best partition; a padded set is not an allocation.
    full = [s for s in best_partition if -1 not in s]
    best = full[0]
    for s in full[1:]:
        if set_score(s) > set_score(best):
            best = s
    return best


def gpuallocator_best_effort(
    topology: Topology, host: int, available: np.ndarray, size: int
) -> np.ndarray:
    """GPUs (global ids) go-gpuallocator's best-effort policy picks for a request of ``size``
    from ``available`` GPUs of one host.

    Follows ``Allocate`` in ``gpuallocator/besteffort_policy.go`` (NVIDIA/go-gpuallocator, the
    policy behind the NVIDIA Kubernetes device plugin's preferred allocation): consider every
    partition of the available GPUs into sets of ``size``, keep the partition with the highest
    summed pair score (the first found on ties), and return its highest-scoring set. Pair scores
    are ``calculateGPUPairScore``'s: 100 per NVLink, 60 same board, 50 one PCIe switch, 40
    several switches, 30 host bridge, 20 same CPU, 10 across CPUs."""
    hosts = _hosts(topology)
    first = int(hosts.first_gpu[host])
    local = tuple(int(g) - first for g in np.sort(available))
    if size > len(local):
        raise Infeasible(f"gpuallocator: needs {size} GPUs in a node with {len(local)} free")
    if size == len(local):
        return np.asarray(available, dtype=np.int64)[np.argsort(available)]
    scores = _pair_scores(topology, topology.host_types[host])
    chosen = _best_effort(scores.tobytes(), scores.shape[0], local, size)
    return np.array(sorted(chosen), dtype=np.int64) + first


def _fill_pods(state: ClusterState, host_pods: list[tuple[int, int]], pod: int) -> np.ndarray:
    """GPU ids of each pod, pods in the given host order, each pod's GPUs chosen by the device
    plugin (best effort) from what the earlier pods left."""
    topology = state.topology
    hosts = _hosts(topology)
    free_mask = state.free_mask()
    out: list[np.ndarray] = []
    for host, count in host_pods:
        first = int(hosts.first_gpu[host])
        available = first + np.flatnonzero(free_mask[first : first + int(hosts.gpus[host])])
        for _ in range(count):
            taken = gpuallocator_best_effort(topology, host, available, pod)
            out.append(taken)
            available = np.setdiff1d(available, taken, assume_unique=True)
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, dtype=np.int64)


@register_solver(
    "gpuallocator",
    "peer baseline: NVIDIA go-gpuallocator best effort inside a node (max summed link score), "
    "nodes first-fit, pods of 8 GPUs (4 on GB200 trays)",
)
def gpuallocator(state: ClusterState, job: Job, seed: int, time_limit: float | None) -> SolveResult:
    """Nodes first-fit in host order, each taking as many whole pods (see :func:`_pod_gpus`)
    as its free GPUs hold; each pod's GPUs by :func:`gpuallocator_best_effort`. Ranks follow the
    pods in node order."""
    topology = state.topology
    hosts = _hosts(topology)
    pod = _pod_gpus(job.gpus, hosts)
    pods = job.gpus // pod
    capacity = _host_free(state) // pod
    before = np.cumsum(capacity) - capacity
    take = np.clip(pods - before, 0, capacity)
    used = np.flatnonzero(take)
    if int(take.sum()) < pods:
        raise Infeasible(
            f"gpuallocator: needs {pods} pods of {pod} GPUs; the nodes' free GPUs hold "
            f"only {int(capacity.sum())}"
        )
    gpus = _fill_pods(state, [(int(h), int(take[h])) for h in used], pod)
    return SolveResult(gpus=gpus, details={"pod_gpus": pod, "hosts": len(used)})
