"""Shared GPUs in a live cluster: nodes whose GPUs requests share, their CPU and memory, and
what is placed on them. The bookkeeping is the core's (``gpuplace_core::share::SharedCluster``):
every change is checked and all or nothing.

A GPU is *fractional* (requests share it by the milli-GPU, time-sliced) or in *MIG* mode
(partitioned into instances under its model's profile rules, :class:`gpuplace.model.mig.MigModel`,
built in or read from ``nvidia-smi mig -lgip/-lgipp``); a whole-GPU request takes an idle GPU
in either mode. Switching an idle GPU's mode is a *reconfiguration* (enabling or disabling MIG
resets the GPU): counted, and costed by whoever reads the count.

Which slot a request should get is a policy's choice: :mod:`gpuplace.placement.share`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplace import _core
from gpuplace._util.documents import Checker
from gpuplace.cluster.mig import gpu_model_of
from gpuplace.enums import GpuMode
from gpuplace.errors import InvalidState, InvalidTopology
from gpuplace.model.mig import MigModel, model_for
from gpuplace.model.share import MILLI, SharedNode, SharedRequest, node_models

__all__ = ["SHARED_JOB", "Placed", "SharedCluster", "enable", "restore"]


@dataclass(frozen=True)
class Placed:
    """A request on a node, on these local GPU indexes (and, on MIG GPUs, instances starting
    at these memory slices)."""

    request: SharedRequest
    node: str
    gpus: tuple[int, ...]
    starts: tuple[int, ...] = ()


class SharedCluster:
    """Nodes with CPU, memory and GPUs shared by the milli-GPU (see the module docs)."""

    def __init__(
        self, nodes: Sequence[SharedNode], *, mig_rules: Mapping[str, MigModel] | None = None
    ):
        nodes = tuple(nodes)
        if not nodes:
            raise InvalidTopology("a shared-GPU cluster needs at least one node")
        self.nodes = nodes
        self._index = {n.name: i for i, n in enumerate(nodes)}
        if len(self._index) != len(nodes):
            dup = next(n.name for i, n in enumerate(nodes) if self._index[n.name] != i)
            raise InvalidTopology(f"node {dup!r} is listed twice")
        self.models = node_models(nodes)
        self._model_id = {m: i for i, m in enumerate(self.models)}
        self._core = _core.SharedCluster(
            [n.name for n in nodes],
            np.array([n.cpu_milli for n in nodes], dtype=np.int64),
            np.array([n.memory_mib for n in nodes], dtype=np.int64),
            np.array([n.gpus for n in nodes], dtype=np.int64),
            np.array([self._model_id[n.model] if n.model else -1 for n in nodes], dtype=np.int64),
            list(self.models),
        )
        self.mig_rules: dict[str, MigModel] = {}
        for model, rules in (mig_rules or {}).items():
            self.set_mig_rules(model, rules)
        self.placements: dict[str, Placed] = {}
        self._reconfigurations_before = 0

    def set_mig_rules(self, model: str, rules: MigModel) -> None:
        """Let GPUs of ``model`` run in MIG mode under ``rules`` (media profiles left out)."""
        if model not in self._model_id:
            raise InvalidTopology(
                f"MIG rules for GPU model {model!r}: no node has it ({', '.join(self.models)})"
            )
        rules.check()
        profiles = [
            (p.name, p.compute, p.size, list(p.starts), p.instances, round(p.memory_gb * 1024))
            for p in rules.profiles.values()
            if not p.media
        ]
        self._core.set_mig_rules(
            self._model_id[model], rules.model, rules.memory_slices, rules.compute_slices, profiles
        )
        self.mig_rules[model] = rules

    def set_mode(self, node: str | int, gpu: int, mode: str) -> None:
        """Put an idle GPU in ``mode`` (``fractional`` or ``mig``; a reconfiguration when it
        changes)."""
        self._core.set_mode(self.node_index(node), int(gpu), GpuMode.from_label(mode))

    def gpu_modes(self, node: str | int) -> list[str]:
        """The modes of a node's GPUs, by local index."""
        return [m.label for m in self._core.gpu_modes(self.node_index(node))]

    @property
    def reconfigurations(self) -> int:
        """Idle GPUs switched between fractional and MIG mode (the state's history included)."""
        return int(self._core.reconfigurations) + self._reconfigurations_before

    # -------------------------------------------------------------- views
    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def num_gpus(self) -> int:
        return int(self._core.num_gpus)

    @property
    def total_gpu_milli(self) -> int:
        return int(self._core.total_gpu_milli)

    @property
    def used_gpu_milli(self) -> int:
        return int(self._core.used_gpu_milli)

    @property
    def unallocated(self) -> float:
        """The share of milli-GPUs not allocated (0-1)."""
        total = self.total_gpu_milli
        return 1.0 - self.used_gpu_milli / total if total else 0.0

    def node_index(self, node: str | int) -> int:
        if isinstance(node, int) and not isinstance(node, bool):
            if not 0 <= node < len(self.nodes):
                raise InvalidState(f"node {node} does not exist ({len(self.nodes)} nodes)")
            return node
        if node not in self._index:
            raise InvalidState(f"unknown node {node!r}")
        return self._index[node]

    def cpu_left(self) -> np.ndarray:
        """Free milli-CPU per node."""
        return self._core.cpu_left()

    def memory_left(self) -> np.ndarray:
        """Free memory (MiB) per node."""
        return self._core.memory_left()

    def gpu_left(self, node: str | int) -> np.ndarray:
        """Free milli-GPUs of a node's GPUs, by local index."""
        return self._core.gpu_left(self.node_index(node))

    def model_mask(self, models: Sequence[str]) -> int | None:
        """The core's bit set of these GPU models (0: any); None when the request names models
        but the cluster has none of them."""
        if not models:
            return 0
        mask = 0
        for m in models:
            if m in self._model_id:
                mask |= 1 << self._model_id[m]
        return mask or None

    def core_args(
        self, request: SharedRequest
    ) -> tuple[tuple[int, int, int, int, int, int], int] | None:
        """The request as the core takes it (its row and model set); None when no node has a
        model it accepts."""
        mask = self.model_mask(request.models)
        if mask is None:
            return None
        return request.row, mask

    def __iter__(self) -> Iterator[Placed]:
        return iter(self.placements.values())

    # -------------------------------------------------------------- changes
    def allocate(
        self,
        request: SharedRequest,
        node: str | int,
        gpus: Sequence[int],
        starts: Sequence[int] | None = None,
        reconfigure: Sequence[int] = (),
    ) -> Placed:
        """Put a request on a node's GPUs (checked: it fits, its GPU model, the GPUs have room
        under their mode; nothing changes otherwise). ``starts``: the first memory slice of its
        MIG instance on each GPU (ignored on fractional GPUs; default 0); ``reconfigure``: idle
        GPUs to switch mode first."""
        if request.name in self.placements:
            raise InvalidState(f"request {request.name!r} is already placed")
        i = self.node_index(node)
        args = self.core_args(request)
        if args is None:
            raise InvalidState(
                f"request {request.name!r} accepts GPU models {', '.join(request.models)}; the "
                f"cluster has {', '.join(self.models) or 'none'}"
            )
        local = [int(g) for g in gpus]
        first = [0] * len(local) if starts is None else [int(s) for s in starts]
        try:
            self._core.allocate(*args, i, local, first, [int(g) for g in reconfigure])
        except OverflowError:
            raise InvalidState(f"GPU or memory slice out of range in {local}, {first}") from None
        placed = Placed(request, self.nodes[i].name, tuple(local), tuple(first))
        self.placements[request.name] = placed
        return placed

    def release(self, name: str) -> Placed:
        """Take a placed request off its node."""
        placed = self.placements.get(name)
        if placed is None:
            raise InvalidState(f"no request named {name!r} is placed")
        args = self.core_args(placed.request)
        assert args is not None  # it was placed
        self._core.release(*args, self._index[placed.node], list(placed.gpus), list(placed.starts))
        del self.placements[name]
        return placed

    def copy(self) -> SharedCluster:
        out = SharedCluster.__new__(SharedCluster)
        out.nodes = self.nodes
        out._index = self._index
        out.models = self.models
        out._model_id = self._model_id
        out._core = self._core.copy()
        out.mig_rules = dict(self.mig_rules)
        out.placements = dict(self.placements)
        out._reconfigurations_before = self._reconfigurations_before
        return out

    # -------------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        mig_gpus = {
            n.name: [g for g, m in enumerate(self.gpu_modes(i)) if m == "mig"]
            for i, n in enumerate(self.nodes)
            if n.model in self.mig_rules
        }
        return {
            **(
                {"mig_rules": {m: r.to_dict() for m, r in self.mig_rules.items()}}
                if self.mig_rules
                else {}
            ),
            **({"mig": {k: v for k, v in mig_gpus.items() if v}} if any(mig_gpus.values()) else {}),
            **({"reconfigurations": self.reconfigurations} if self.reconfigurations else {}),
            "nodes": [
                {
                    "name": n.name,
                    "cpu_milli": n.cpu_milli,
                    "memory_mib": n.memory_mib,
                    **({"gpus": n.gpus, "model": n.model} if n.gpus else {}),
                }
                for n in self.nodes
            ],
            "placements": [
                {
                    **p.request.to_dict(),
                    "node": p.node,
                    "slot": list(p.gpus),
                    **({"starts": list(p.starts)} if any(p.starts) else {}),
                }
                for p in self
            ],
        }

    @classmethod
    def from_dict(cls, raw: Any, c: Checker, path: str) -> SharedCluster:
        """Rebuild from :meth:`to_dict`, checking every node and placement (the error names the
        entry)."""
        doc = c.mapping(raw, path)
        c.keys(doc, path, {"nodes", "placements", "mig_rules", "mig", "reconfigurations"})
        nodes = []
        for i, entry in enumerate(c.sequence(doc.get("nodes"), f"{path}.nodes")):
            p = f"{path}.nodes[{i}]"
            e = c.mapping(entry, p)
            c.keys(e, p, {"name", "cpu_milli", "memory_mib", "gpus", "model"})
            try:
                nodes.append(
                    SharedNode(
                        c.string(e.get("name"), f"{p}.name"),
                        c.integer(e.get("cpu_milli"), f"{p}.cpu_milli", minimum=0),
                        c.integer(e.get("memory_mib", 0), f"{p}.memory_mib", minimum=0),
                        c.integer(e.get("gpus", 0), f"{p}.gpus", minimum=0),
                        None if e.get("model") is None else c.string(e["model"], f"{p}.model"),
                    )
                )
            except InvalidTopology as exc:
                raise c.fail(p, str(exc)) from None
        rules = {
            model: MigModel.from_dict(r, c, f"{path}.mig_rules.{model}")
            for model, r in c.mapping(doc.get("mig_rules", {}), f"{path}.mig_rules").items()
        }
        try:
            cluster = cls(nodes, mig_rules=rules)
        except InvalidTopology as exc:
            raise c.fail(f"{path}.nodes", str(exc)) from None
        for node, gpus in c.mapping(doc.get("mig", {}), f"{path}.mig").items():
            for g in c.sequence(gpus, f"{path}.mig.{node}"):
                try:
                    cluster.set_mode(node, c.integer(g, f"{path}.mig.{node}", minimum=0), "mig")
                except (InvalidState, OverflowError) as exc:
                    raise c.fail(f"{path}.mig.{node}", str(exc)) from None
        done = c.integer(doc.get("reconfigurations", 0), f"{path}.reconfigurations", minimum=0)
        cluster._reconfigurations_before = done - int(cluster._core.reconfigurations)
        for i, entry in enumerate(c.sequence(doc.get("placements", []), f"{path}.placements")):
            p = f"{path}.placements[{i}]"
            e = c.mapping(entry, p)
            fields = {k: v for k, v in e.items() if k not in ("node", "slot", "starts")}
            request = SharedRequest.from_dict(fields, c, p)
            node = c.string(e.get("node"), f"{p}.node")
            slot = [
                c.integer(g, f"{p}.slot", minimum=0, maximum=MILLI)
                for g in c.sequence(e.get("slot", []), f"{p}.slot")
            ]
            starts = [
                c.integer(s, f"{p}.starts", minimum=0, maximum=63)
                for s in c.sequence(e.get("starts", [0] * len(slot)), f"{p}.starts")
            ]
            try:
                cluster.allocate(request, node, slot, starts)
            except InvalidState as exc:
                raise c.fail(p, str(exc)) from None
        return cluster

    def summary(self) -> Mapping[str, Any]:
        """Totals: nodes, GPUs, milli-GPUs used and in all, requests placed."""
        return {
            "nodes": len(self.nodes),
            "gpus": self.num_gpus,
            "used_gpu_milli": self.used_gpu_milli,
            "total_gpu_milli": self.total_gpu_milli,
            "requests": len(self.placements),
        }


# --------------------------------------------------------------------- in a cluster state
#: The job under which a cluster state holds its shared hosts' GPUs, so that no whole-GPU
#: solver gives them to a training gang.
SHARED_JOB = "shared"


def enable(
    state: Any,
    hosts: Iterable[str],
    *,
    cpu_milli: int,
    memory_mib: int,
    mode: str = "fractional",
    mig_rules: MigModel | None = None,
) -> SharedCluster:
    """Put idle hosts of ``state`` in shared mode (all or nothing): their GPUs leave whole-GPU
    placement (held by the job ``shared``, as MIG GPUs are held by ``mig``) and join
    ``state.shared``, each host a node with ``cpu_milli`` CPU and ``memory_mib`` memory for the
    requests, its GPUs ``fractional`` or ``mig`` (rules: ``mig_rules``, else the built-in ones of
    the GPUs' model). Hosts already shared keep what runs on them. Returns ``state.shared``."""
    topo = state.topology
    names = list(dict.fromkeys(str(h) for h in hosts))
    if not names:
        raise InvalidState("name at least one host to share")
    GpuMode.from_label(mode)
    current: SharedCluster | None = state.shared
    have = {n.name for n in current.nodes} if current is not None else set()
    free = state.free_mask()
    added: list[SharedNode] = []
    ids: list[int] = []
    for host in names:
        if host in have:
            continue
        if host not in topo.hosts:
            raise InvalidState(f"unknown host {host!r} in cluster {topo.name!r}")
        gpus = [int(g) for g in topo.host_gpus(host)]
        busy = [g for g in gpus if not free[g]]
        if busy:
            raise InvalidState(
                f"host {host}: GPU {topo.local_index(busy[0])} is not free (allocated, held by MIG "
                "or out of service); only idle hosts can be shared"
            )
        models = {gpu_model_of(state, g) for g in gpus}
        if len(models) != 1:
            raise InvalidState(f"host {host} mixes GPU models {sorted(map(str, models))}")
        model = models.pop()
        if gpus and model is None:
            raise InvalidState(
                f"host {host}: its GPUs have no model (set the node type's gpu_model)"
            )
        added.append(SharedNode(host, cpu_milli, memory_mib, len(gpus), model))
        ids.extend(gpus)
    if not added:
        assert current is not None
        return current
    # Every model with rules (given, or built in) may run MIG, so that a reconfiguration can
    # switch its GPUs later; MIG mode now needs them.
    rules = dict(current.mig_rules) if current is not None else {}
    for node in added:
        if node.model is None or node.model in rules:
            continue
        if mig_rules is not None:
            rules[node.model] = mig_rules
            continue
        try:
            rules[node.model] = model_for(node.model)
        except InvalidTopology as exc:
            if mode == "mig":
                raise InvalidState(str(exc)) from None
    nodes = [*(current.nodes if current is not None else ()), *added]
    cluster = SharedCluster(nodes, mig_rules=rules)
    if current is not None:
        for node in current.nodes:
            for g, m in enumerate(current.gpu_modes(node.name)):
                if m == "mig":
                    cluster.set_mode(node.name, g, "mig")
        cluster._reconfigurations_before = current.reconfigurations - cluster.reconfigurations
        for p in current:
            cluster.allocate(p.request, p.node, p.gpus, p.starts)
    if mode == "mig":
        for node in added:
            for g in range(node.gpus):
                cluster.set_mode(node.name, g, "mig")
    held = state.job_gpus(SHARED_JOB)
    before = [] if held is None else [int(g) for g in held]
    if before:
        state.release(SHARED_JOB)
    try:
        state.allocate(name=SHARED_JOB, gpus=sorted(set(before) | set(ids)))
    except InvalidState:
        if before:
            state.allocate(name=SHARED_JOB, gpus=before)
        raise
    state.shared = cluster
    return cluster


def restore(state: Any, raw: Any, c: Checker) -> None:
    """Rebuild ``state.shared`` from a state file's ``shared`` section, checking that its nodes
    are hosts of the cluster with their GPU counts and that the job ``shared`` holds exactly
    their GPUs (the error names the field)."""
    cluster = SharedCluster.from_dict(raw, c, "shared")
    topo = state.topology
    ids: list[int] = []
    for i, node in enumerate(cluster.nodes):
        if node.name not in topo.hosts:
            raise c.fail(f"shared.nodes[{i}].name", f"{node.name!r} is not a host of the cluster")
        gpus = [int(g) for g in topo.host_gpus(node.name)]
        if len(gpus) != node.gpus:
            raise c.fail(
                f"shared.nodes[{i}].gpus", f"host {node.name} has {len(gpus)} GPUs, not {node.gpus}"
            )
        ids.extend(gpus)
    held = state.job_gpus(SHARED_JOB)
    if sorted(ids) != sorted(int(g) for g in (held if held is not None else [])):
        raise c.fail(
            "shared.nodes",
            f"must be exactly the hosts whose GPUs the job {SHARED_JOB!r} holds",
        )
    state.shared = cluster
