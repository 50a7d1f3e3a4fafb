"""Placing requests on shared GPUs: the FGD paper's policies and gpuplace's, the pod mix FGD
weighs fragmentation by, the prices gpuplace charges, and the arrival-only replay of many runs.

The policies (``gpuplace_core::share::policy``; docs/share.md):

- ``random``, ``dotprod``, ``clustering``, ``packing``, ``bestfit``, ``fgd``: the baselines and
  the policy of Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
  Fragmentation Gradient Descent" (USENIX ATC'23, section 6.1), each scored as the authors'
  simulator (hkust-adsl/kubernetes-scheduler-simulator) scores it;
- ``gpuplace``: FGD's fragmentation, plus the GPUs a node strands for lack of CPU, plus the
  opportunity cost of scarce GPU models at the prices of a fluid plan (:func:`node_prices`).

Scores are computed in the core; only the one-time plan (a small linear program, OR-Tools GLOP)
is solved here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplace import _core
from gpuplace.cluster.share import Placed, SharedCluster
from gpuplace.errors import Infeasible, InvalidJob
from gpuplace.model.share import SharedRequest, typical_mix

__all__ = [
    "BASELINES",
    "POLICIES",
    "ShareScheduler",
    "Slot",
    "fragmentation",
    "node_prices",
    "pod_mix",
    "replay",
    "why_not",
]

#: Every policy, the paper's in its order, gpuplace's last.
POLICIES: tuple[str, ...] = tuple(_core.share_policies())
#: The FGD paper's policies.
BASELINES: tuple[str, ...] = tuple(p for p in POLICIES if p != "gpuplace")
#: The core's model set that names no model (bit 63; a cluster has at most 63 models).
NO_MODEL = 1 << 63
#: The policies that weigh fragmentation over a pod mix.
_NEEDS_MIX = ("fgd", "gpuplace")


def _check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise InvalidJob(f"unknown shared-GPU policy {policy!r} (policies: {', '.join(POLICIES)})")
    return policy


def pod_mix(
    cluster: SharedCluster,
    mix: Iterable[tuple[SharedRequest, float]],
) -> _core.ShareDistribution:
    """The core's pod distribution of ``mix`` (requests and weights, e.g. :func:`typical_mix`)
    over the cluster's GPU models. A request accepting only models the cluster lacks can run
    nowhere, so it counts as accepting none."""
    rows, masks, weights = [], [], []
    for request, weight in mix:
        args = cluster.core_args(request)
        if args is None:  # models absent from the cluster: blind to every node
            continue
        rows.append(args[0])
        masks.append(args[1])
        weights.append(weight)
    if not rows:
        raise InvalidJob("the pod mix has no request that can run on this cluster")
    return _core.ShareDistribution(
        np.array(rows, dtype=np.int64).reshape(-1, 6),
        np.array(masks, dtype=np.uint64),
        np.array(weights, dtype=np.float64),
        len(cluster.models),
    )


def fragmentation(cluster: SharedCluster, requests: Sequence[SharedRequest]) -> np.ndarray:
    """FGD's expected fragmentation (milli-GPUs) of every node as it is, under the typical mix
    of ``requests``."""
    return pod_mix(cluster, typical_mix(requests)).fragmentation(cluster._core)


def node_prices(cluster: SharedCluster, requests: Iterable[SharedRequest]) -> np.ndarray | None:
    """The prices gpuplace charges per node: the dual values of a fluid plan.

    The plan treats requests as divisible: it finds the largest scale ``t`` at which the
    workload's mix (each request shape at its count, scaled so that ``t = 1`` asks for every
    GPU of the cluster) fits the node groups' GPUs, CPU and memory, each shape only on the GPU
    models it accepts. The dual value of each group's GPU, CPU and memory row is what a unit of
    it is worth to that plan; the core scales them (``NodePrice::from_duals``). Returns an
    ``(nodes, 3)`` array (milli-GPU, milli-CPU, MiB), or None when the workload asks for no GPU.
    """
    from ortools.linear_solver import pywraplp

    shapes: Counter[tuple[int, int, int, int, int]] = Counter()
    for request in requests:
        args = cluster.core_args(request)
        if args is not None:
            (cpu, mem, gpus, milli, _, _), mask = args
            shapes[cpu, mem, gpus, milli, mask] += 1
    demand = sum(count * gpus * milli for (_, _, gpus, milli, _), count in shapes.items())
    if not demand:
        return None
    groups: dict[tuple[str | None, int, int, int], list[int]] = {}
    for i, n in enumerate(cluster.nodes):
        groups.setdefault((n.model, n.gpus, n.cpu_milli, n.memory_mib), []).append(i)
    scale = cluster.total_gpu_milli / demand
    solver = pywraplp.Solver.CreateSolver("GLOP")
    t = solver.NumVar(0.0, solver.infinity(), "t")
    placed: dict[tuple[int, int], Any] = {}
    keys = list(groups)
    bit = {m: 1 << i for i, m in enumerate(cluster.models)}
    for k, (_, _, gpus, _, mask) in enumerate(shapes):
        for g, (model, n_gpus, _, _) in enumerate(keys):
            if gpus and (model is None or n_gpus < gpus or (mask and not mask & bit[model])):
                continue
            placed[k, g] = solver.NumVar(0.0, solver.infinity(), f"x{k}_{g}")
    rows: dict[tuple[int, int], Any] = {}
    shape_list = list(shapes)
    for g, key in enumerate(keys):
        count = len(groups[key])
        _, n_gpus, n_cpu, n_mem = key
        for resource, capacity in enumerate((n_gpus * 1000 * count, n_cpu * count, n_mem * count)):
            row = solver.Constraint(-solver.infinity(), float(capacity))
            for k, (cpu, mem, gpus, milli, _) in enumerate(shape_list):
                if (k, g) in placed:
                    row.SetCoefficient(placed[k, g], float((gpus * milli, cpu, mem)[resource]))
            rows[g, resource] = row
    for k, shape in enumerate(shape_list):
        row = solver.Constraint(0.0, 0.0)
        row.SetCoefficient(t, -shapes[shape] * scale)
        for g in range(len(keys)):
            if (k, g) in placed:
                row.SetCoefficient(placed[k, g], 1.0)
    objective = solver.Objective()
    objective.SetCoefficient(t, 1.0)
    objective.SetMaximization()
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    out = np.zeros((len(cluster.nodes), 3))
    for g, key in enumerate(keys):
        duals = [max(0.0, rows[g, r].dual_value()) for r in range(3)]
        out[groups[key]] = duals
    return out


def why_not(cluster: SharedCluster, request: SharedRequest) -> str:
    """Why no node takes the request now: how many nodes fail each of its needs (GPU model,
    GPUs in the mode it accepts, GPU room, CPU, memory)."""
    what = (
        f"{request.kind}"
        + (f" of {request.gpu_milli} milli-GPUs" if request.shared else "")
        + f", {request.cpu_milli / 1000:g} CPUs, {request.memory_mib} MiB"
        + (f", {request.isolation} isolation" if request.isolation != "any" else "")
    )
    args = cluster.core_args(request)
    if args is None:
        return (
            f"request {request.name!r} ({what}) accepts GPU models {', '.join(request.models)}; "
            f"the cluster has {', '.join(cluster.models) or 'none'}"
        )
    row, mask = args
    gpu_only = (0, 0, *row[2:])
    cpu, memory = cluster.cpu_left(), cluster.memory_left()
    counts: Counter[str] = Counter()
    for i, node in enumerate(cluster.nodes):
        if request.gpus:
            if not node.gpus or (request.models and node.model not in request.models):
                counts["GPU model"] += 1
                continue
            if not cluster._core.fits(i, gpu_only, mask):
                modes = cluster.gpu_modes(i)
                if request.isolation != "any" and request.isolation not in modes:
                    counts[f"GPUs in {request.isolation} mode"] += 1
                else:
                    counts["GPU room"] += 1
                continue
        if cpu[i] < request.cpu_milli:
            counts["CPU"] += 1
        elif memory[i] < request.memory_mib:
            counts["memory"] += 1
    reasons = ", ".join(f"{n} short of {k}" for k, n in counts.most_common())
    return f"request {request.name!r} ({what}) fits no node of {len(cluster)}: {reasons}"


class ShareScheduler:
    """Chooses a slot for each request under one policy, on one cluster.

    ``workload``: the requests whose mix FGD and gpuplace weigh (their typical requests,
    :func:`typical_mix`) and that gpuplace's prices are planned for; required by those two.
    ``seed``: the ranking that breaks ties (and the draws of ``random``). ``reconfigure``:
    switch idle GPUs between fractional and MIG mode for a request that must run in the other
    mode and fits no GPU as they are."""

    def __init__(
        self,
        cluster: SharedCluster,
        policy: str = "gpuplace",
        *,
        workload: Sequence[SharedRequest] = (),
        seed: int = 0,
        reconfigure: bool = False,
    ):
        self.cluster = cluster
        self.policy = _check_policy(policy)
        mix = None
        prices = None
        if policy in _NEEDS_MIX:
            if not workload:
                raise InvalidJob(
                    f"policy {policy} weighs fragmentation over a workload; none given"
                )
            mix = pod_mix(cluster, typical_mix(workload))
            if policy == "gpuplace":
                prices = node_prices(cluster, workload)
        self._core = _core.ShareScheduler(policy, seed, mix, prices, reconfigure)

    def choose(self, request: SharedRequest) -> Slot | None:
        """The slot the policy picks, or None when nothing fits."""
        args = self.cluster.core_args(request)
        if args is None:
            return None
        slot = self._core.choose(self.cluster._core, *args)
        if slot is None:
            return None
        return Slot(
            int(slot.node),
            tuple(int(g) for g in slot.gpus),
            tuple(int(s) for s in slot.starts),
            tuple(int(g) for g in slot.reconfigure),
        )

    def place(self, request: SharedRequest) -> Placed:
        """Choose and allocate; Infeasible (saying why) when no node fits."""
        slot = self.choose(request)
        if slot is None:
            raise Infeasible(why_not(self.cluster, request))
        return self.cluster.allocate(request, slot.node, slot.gpus, slot.starts, slot.reconfigure)


@dataclass(frozen=True)
class Slot:
    """Where a request goes: a node (index), its local GPUs, the first memory slice of its MIG
    instance on each (0 on fractional GPUs), and the idle GPUs switched to the mode it needs
    first."""

    node: int
    gpus: tuple[int, ...]
    starts: tuple[int, ...]
    reconfigure: tuple[int, ...] = ()


def replay(
    cluster: SharedCluster,
    requests: Sequence[SharedRequest],
    runs: Sequence[tuple[np.ndarray, str, int]],
    *,
    workload: Sequence[SharedRequest] | None = None,
    reconfigure: bool = False,
) -> list[_core.ArrivalRecord]:
    """Arrival-only runs on copies of ``cluster`` (left as it is), in parallel in the core:
    each run is (arrival order as indexes into ``requests``, policy, seed). ``workload`` (default:
    ``requests``) gives the mix and the prices; ``reconfigure`` as for :class:`ShareScheduler`."""
    workload = requests if workload is None else workload
    policies = [_check_policy(p) for _, p, _ in runs]
    rows, masks = [], []
    for r in requests:
        args = cluster.core_args(r)
        rows.append(r.row)
        # A request for models the cluster lacks accepts only bit 63, which names no model.
        masks.append(NO_MODEL if args is None else args[1])
    mix = (
        pod_mix(cluster, typical_mix(workload)) if any(p in _NEEDS_MIX for p in policies) else None
    )
    prices = node_prices(cluster, workload) if "gpuplace" in policies else None
    return _core.replay_arrivals(
        cluster._core,
        np.array(rows, dtype=np.int64).reshape(-1, 6),
        np.array(masks, dtype=np.uint64),
        [np.asarray(order, dtype=np.int64) for order, _, _ in runs],
        policies,
        [int(seed) for _, _, seed in runs],
        mix,
        prices,
        reconfigure,
    )
