"""Export of a topology to networkx (a tree of domains and GPUs) and back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuplace.errors import InvalidTopology
from gpuplace.model.parts import FORMAT, Level

if TYPE_CHECKING:
    from gpuplace.model.topology import Topology

__all__ = ["from_networkx", "to_networkx"]


def to_networkx(self: Topology) -> Any:
    """A directed tree (networkx.DiGraph): one vertex per domain and per GPU, edges from
    parent to child. Vertices carry ``kind`` ("domain"/"gpu"), ``level`` and ``name``; the
    graph carries the levels and node types, so :meth:`from_networkx` restores the
    topology."""
    import networkx as nx

    g = nx.DiGraph(
        name=self.name,
        levels=[(lv.name, lv.bandwidth_gbps, lv.latency_us) for lv in self.levels],
        sharp_levels=[lv.name for lv in self.levels if lv.sharp],
        routing={lv.name: (lv.routing, lv.qps_per_connection) for lv in self.levels},
        transport={lv.name: lv.transport for lv in self.levels},
        not_rail_aligned=[lv.name for lv in self.levels if not lv.rail_aligned],
        host_count_factors=list(self.host_count_factors),
        algorithm_efficiency=dict(self.algorithm_efficiency),
        node_level=self.node_level,
        nvlink_level=self.nvlink_level,
        node_types={t: nt.to_dict() for t, nt in self.node_types.items()},
    )
    nl = len(self.levels)
    for level in range(nl):
        parents = self.parents(level) if level + 1 < nl else None
        for d, dname in enumerate(self.domain_names[level]):
            v = ("domain", level, d)
            attrs: dict[str, Any] = {
                "kind": "domain",
                "level": self.levels[level].name,
                "name": dname,
            }
            if level == self.node_level:
                attrs["node_type"] = self.host_types[d]
            g.add_node(v, **attrs)
            if parents is not None:
                g.add_edge(("domain", level + 1, int(parents[d])), v)
    path = self.path
    for gpu in range(self.num_gpus):
        g.add_node(
            ("gpu", gpu),
            kind="gpu",
            level="gpu",
            name=f"{self.host_of(gpu)}:{self.local_index(gpu)}",
        )
        g.add_edge(("domain", 0, int(path[gpu, 0])), ("gpu", gpu))
    return g


def from_networkx(cls: type[Topology], graph: Any) -> Topology:
    """Inverse of :meth:`to_networkx`."""
    try:
        sharp = set(graph.graph.get("sharp_levels", ()))
        routing = graph.graph.get("routing", {})
        transport = graph.graph.get("transport", {})
        not_rail_aligned = set(graph.graph.get("not_rail_aligned", ()))
        levels = [
            Level(
                n,
                float(b),
                float(lat),
                sharp=n in sharp,
                routing=routing.get(n, ("adaptive", 1))[0],
                qps_per_connection=int(routing.get(n, ("adaptive", 1))[1]),
                transport=str(transport.get(n, "roce")),
                rail_aligned=n not in not_rail_aligned,
            )
            for n, b, lat in graph.graph["levels"]
        ]
        node_level = int(graph.graph["node_level"])
        names = [lv.name for lv in levels]
        doc: dict[str, Any] = {
            "format": FORMAT,
            "name": graph.graph.get("name", "topology"),
            "levels": [
                {
                    "name": lv.name,
                    "bandwidth_gbps": lv.bandwidth_gbps,
                    "latency_us": lv.latency_us,
                }
                | ({"sharp": True} if lv.sharp else {})
                | ({"routing": lv.routing} if lv.routing != "adaptive" else {})
                | (
                    {"qps_per_connection": lv.qps_per_connection}
                    if lv.qps_per_connection != 1
                    else {}
                )
                | ({"transport": lv.transport} if lv.transport != "roce" else {})
                | ({"rail_aligned": False} if not lv.rail_aligned else {})
                for lv in levels
            ],
            "node_level": names[node_level],
            "nvlink_domain": names[int(graph.graph["nvlink_level"])],
            "node_types": graph.graph["node_types"],
        }
        hosts = sorted(
            (
                v
                for v, a in graph.nodes(data=True)
                if a.get("kind") == "domain" and a.get("level") == names[node_level]
            ),
            key=lambda v: v[2],
        )
        nodes = []
        for v in hosts:
            domains = {}
            cur = v
            for lname in names[node_level + 1 :]:
                (cur,) = list(graph.predecessors(cur))
                domains[lname] = graph.nodes[cur]["name"]
            nodes.append(
                {
                    "name": graph.nodes[v]["name"],
                    "type": graph.nodes[v]["node_type"],
                    "domains": domains,
                }
            )
        doc["nodes"] = nodes
        if graph.graph.get("host_count_factors"):
            doc["host_count_factors"] = list(graph.graph["host_count_factors"])
        if graph.graph.get("algorithm_efficiency"):
            doc["algorithm_efficiency"] = dict(graph.graph["algorithm_efficiency"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise InvalidTopology(
            f"networkx graph: not a gpuplace topology graph (missing or bad {exc})"
        ) from None
    return cls.from_dict(doc, source="networkx graph")
