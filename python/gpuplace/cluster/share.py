"""Shared GPUs in a live cluster: nodes whose GPUs requests share by the milli-GPU, their CPU
and memory, and what is placed on them. The bookkeeping is the core's
(``gpuplace_core::share::SharedCluster``): every change is checked and all or nothing.

Which slot a request should get is a policy's choice: :mod:`gpuplace.placement.share`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplace import _core
from gpuplace._util.documents import Checker
from gpuplace.errors import InvalidState, InvalidTopology
from gpuplace.model.share import MILLI, SharedNode, SharedRequest, node_models

__all__ = ["Placed", "SharedCluster"]


@dataclass(frozen=True)
class Placed:
    """A request on a node, on these local GPU indexes."""

    request: SharedRequest
    node: str
    gpus: tuple[int, ...]


class SharedCluster:
    """Nodes with CPU, memory and GPUs shared by the milli-GPU (see the module docs)."""

    def __init__(self, nodes: Sequence[SharedNode]):
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
        self.placements: dict[str, Placed] = {}

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

    def core_args(self, request: SharedRequest) -> tuple[int, int, int, int, int] | None:
        """The request as the core takes it; None when no node has a model it accepts."""
        mask = self.model_mask(request.models)
        if mask is None:
            return None
        return (request.cpu_milli, request.memory_mib, request.gpus, request.gpu_milli, mask)

    def __iter__(self) -> Iterator[Placed]:
        return iter(self.placements.values())

    # -------------------------------------------------------------- changes
    def allocate(self, request: SharedRequest, node: str | int, gpus: Sequence[int]) -> Placed:
        """Put a request on a node's GPUs (checked: it fits, its GPU model, the GPUs have
        room; nothing changes otherwise)."""
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
        try:
            self._core.allocate(*args, i, local)
        except OverflowError:
            raise InvalidState(f"GPU index out of range in {local}") from None
        placed = Placed(request, self.nodes[i].name, tuple(local))
        self.placements[request.name] = placed
        return placed

    def release(self, name: str) -> Placed:
        """Take a placed request off its node."""
        placed = self.placements.get(name)
        if placed is None:
            raise InvalidState(f"no request named {name!r} is placed")
        args = self.core_args(placed.request)
        assert args is not None  # it was placed
        self._core.release(*args, self._index[placed.node], list(placed.gpus))
        del self.placements[name]
        return placed

    def copy(self) -> SharedCluster:
        out = SharedCluster.__new__(SharedCluster)
        out.nodes = self.nodes
        out._index = self._index
        out.models = self.models
        out._model_id = self._model_id
        out._core = self._core.copy()
        out.placements = dict(self.placements)
        return out

    # -------------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        return {
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
                {**p.request.to_dict(), "node": p.node, "slot": list(p.gpus)} for p in self
            ],
        }

    @classmethod
    def from_dict(cls, raw: Any, c: Checker, path: str) -> SharedCluster:
        """Rebuild from :meth:`to_dict`, checking every node and placement (the error names the
        entry)."""
        doc = c.mapping(raw, path)
        c.keys(doc, path, {"nodes", "placements"})
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
        try:
            cluster = cls(nodes)
        except InvalidTopology as exc:
            raise c.fail(f"{path}.nodes", str(exc)) from None
        for i, entry in enumerate(c.sequence(doc.get("placements", []), f"{path}.placements")):
            p = f"{path}.placements[{i}]"
            e = c.mapping(entry, p)
            fields = {k: v for k, v in e.items() if k not in ("node", "slot")}
            request = SharedRequest.from_dict(fields, c, p)
            node = c.string(e.get("node"), f"{p}.node")
            slot = [
                c.integer(g, f"{p}.slot", minimum=0, maximum=MILLI)
                for g in c.sequence(e.get("slot", []), f"{p}.slot")
            ]
            try:
                cluster.allocate(request, node, slot)
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
