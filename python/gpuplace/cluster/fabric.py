"""Jobs sharing the fabric: uplink capacities, the running jobs' load and contention.

Every domain from the NVLink domain up to below the top level has an *uplink* to its parent
(a host's NICs, a leaf's links to the spine). Its capacity (GB/s, each direction) is its GPUs
times the bandwidth of the level above, divided by the level's ``oversubscription`` (2 for
2:1 leaf uplinks), unless the topology's ``uplink_gbps`` names it explicitly. The Rust state
keeps, per uplink and direction, the load of every running job's collectives (the flows of
their rings and all-to-alls) and updates it on allocate, release and repair; ``check()``
recounts it. A collective whose path crosses an uplink over capacity gets its fair share
there, in the one cost model (``rust/core/src/fabric.rs`` documents the model and what it
leaves out, such as phase shifts between jobs). Where a level hashes flows onto its uplinks'
parallel links (``routing: ecmp`` or ``static``) they collide, and a collective runs at the pace
of the fullest link: :func:`collisions` says, level by level, what that costs a placement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = [
    "Collisions",
    "Contention",
    "HotUplink",
    "LevelCrossing",
    "collisions",
    "contention",
    "hot_uplinks",
    "hottest_uplinks",
    "jobs_hurt",
    "uplink_capacity",
    "uplink_name",
    "uplinks_by_level",
]

_DIRECTIONS = ("up", "down")


def uplink_name(topology: Topology, uplink: int) -> str:
    """``level:domain`` of an uplink id (``leaf:su003``)."""
    levels, domains, _ = _core.uplinks(topology._core)
    level = int(levels[uplink])
    return f"{topology.levels[level].name}:{topology.domain_names[level][int(domains[uplink])]}"


def uplink_capacity(topology: Topology) -> dict[str, float]:
    """Capacity (GB/s each direction) of every uplink, by ``level:domain`` name."""
    levels, domains, capacity = _core.uplinks(topology._core)
    return {
        f"{topology.levels[int(lv)].name}:{topology.domain_names[int(lv)][int(d)]}": float(c)
        for lv, d, c in zip(levels, domains, capacity, strict=True)
    }


@dataclass(frozen=True)
class HotUplink:
    """An uplink direction over capacity on a job's path."""

    uplink: str
    direction: str
    capacity_gbps: float
    #: The job's own demand (its heaviest class), GB/s.
    own_gbps: float
    #: Every other running job's demand, GB/s.
    others_gbps: float
    #: The other jobs loading it, heaviest first: name -> GB/s.
    jobs: dict[str, float]

    @property
    def utilisation(self) -> float:
        """Demand over capacity (above 1 means the flows share it)."""
        return (self.own_gbps + self.others_gbps) / self.capacity_gbps

    def to_dict(self) -> dict[str, Any]:
        return {
            "uplink": self.uplink,
            "direction": self.direction,
            "capacity_gbps": self.capacity_gbps,
            "own_gbps": self.own_gbps,
            "others_gbps": self.others_gbps,
            "utilisation": self.utilisation,
            "jobs": self.jobs,
        }


@dataclass(frozen=True)
class Contention:
    """A placement priced with its neighbours: alone and contended communication seconds per
    step, and the uplinks responsible for the difference."""

    alone_seconds: float
    contended_seconds: float
    uplinks: tuple[HotUplink, ...]

    @property
    def slowdown(self) -> float:
        """Contended over alone (1.0 = not slowed)."""
        return self.contended_seconds / self.alone_seconds if self.alone_seconds > 0 else 1.0


def contention(state: ClusterState, job: Job, gpus: Any) -> Contention:
    """Price ``job`` on ``gpus`` alone and with the running jobs of ``state``; when the job
    is running on exactly those GPUs its own load is not counted against it."""
    topology = state.topology
    raw = _core.contention(state._core, job.compile(topology), np.asarray(gpus, dtype=np.int64))
    return Contention(
        alone_seconds=raw.alone_seconds,
        contended_seconds=raw.contended_seconds,
        uplinks=hot_uplinks(topology, raw.uplinks),
    )


def hot_uplinks(topology: Topology, raw: Any) -> tuple[HotUplink, ...]:
    """The core's hot uplinks (``_core.HotUplink``), named in the topology's words."""
    if not raw:
        return ()
    levels, domains, _ = _core.uplinks(topology._core)

    def name(uplink: int) -> str:
        level = int(levels[uplink])
        return f"{topology.levels[level].name}:{topology.domain_names[level][int(domains[uplink])]}"

    return tuple(
        HotUplink(
            uplink=name(u.uplink),
            direction=_DIRECTIONS[u.direction],
            capacity_gbps=u.capacity_gbps,
            own_gbps=u.own_gbps,
            others_gbps=u.others_gbps,
            jobs=dict(u.jobs),
        )
        for u in raw
    )


@dataclass(frozen=True)
class LevelCrossing:
    """One level's uplinks (a host's NICs, a leaf's links to the spine) as a job's flows cross
    them."""

    level: str
    #: ``adaptive``, ``ecmp``, ``static`` or ``sharp`` (docs/topology-format.md).
    routing: str
    qps_per_connection: int
    #: Connections at the link rate (one per NIC share) of the job's heaviest class leaving
    #: domains of this level, summed over them.
    flows: float
    #: Uplinks of this level the job's flows leave by.
    uplinks: int
    #: Parallel links of the worst of them.
    links: int
    #: On the worst of them, the expected load of its fullest link in flows at the link rate
    #: (the running jobs' included) where the level hashes flows; the mean load per link where
    #: it balances them.
    fullest: float
    #: The smallest share of a link's rate one of the job's flows gets here (1: line rate).
    share: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "routing": self.routing,
            "qps_per_connection": self.qps_per_connection,
            "flows": self.flows,
            "uplinks": self.uplinks,
            "links": self.links,
            "fullest": self.fullest,
            "share": self.share,
        }


@dataclass(frozen=True)
class Collisions:
    """What the fabric's routing costs a placed job: its flows level by level, and its
    communication seconds per step as routed and as they would be with every level balanced
    (adaptive routing, the fair share)."""

    levels: tuple[LevelCrossing, ...]
    seconds: float
    balanced_seconds: float

    @property
    def slowdown(self) -> float:
        """As routed over balanced (1.0: hashing costs this placement nothing)."""
        return self.seconds / self.balanced_seconds if self.balanced_seconds > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "levels": [lv.to_dict() for lv in self.levels],
            "seconds": self.seconds,
            "balanced_seconds": self.balanced_seconds,
            "slowdown": self.slowdown,
        }


def collisions(state: ClusterState, job: Job, gpus: Any) -> Collisions:
    """The flows of ``job`` on ``gpus`` crossing each uplink level of ``state``'s fabric, the
    share they get there among the running jobs' flows (hash collisions included), and the
    job's communication time as routed and balanced."""
    topology = state.topology
    raw = _core.collisions(state._core, job.compile(topology), np.asarray(gpus, dtype=np.int64))
    return Collisions(
        levels=tuple(
            LevelCrossing(
                level=topology.levels[c.level].name,
                routing=c.routing,
                qps_per_connection=c.qps_per_connection,
                flows=c.flows,
                uplinks=c.uplinks,
                links=c.links,
                fullest=c.fullest,
                share=c.share,
            )
            for c in raw.levels
        ),
        seconds=raw.seconds,
        balanced_seconds=raw.balanced_seconds,
    )


def added_to_neighbours(state: ClusterState, job: Job, gpus: Any) -> float:
    """Seconds per step that placing ``job`` on ``gpus`` would add to the running jobs."""
    return float(
        _core.added_to_neighbours(
            state._core, job.compile(state.topology), np.asarray(gpus, dtype=np.int64)
        )
    )


def hottest_uplinks(state: ClusterState, count: int = 5) -> list[dict[str, Any]]:
    """The most loaded uplink directions: name, direction, load and capacity (GB/s),
    utilisation, highest first."""
    return [
        {
            "uplink": uplink_name(state.topology, slot // 2),
            "direction": _DIRECTIONS[slot % 2],
            "load_gbps": load,
            "capacity_gbps": cap,
            "utilisation": load / cap,
        }
        for slot, load, cap in _core.hottest_uplinks(state._core, int(count))
    ]


def uplinks_by_level(state: ClusterState, count: int = 5) -> list[dict[str, Any]]:
    """Per uplink level, bottom-up (host NICs, then leaf uplinks, ...): its uplink
    directions, how many carry load and how many are over capacity, the highest
    utilisation, and its ``count`` hottest directions (as :func:`hottest_uplinks` gives
    them). Ranked level by level, so saturated NICs do not hide a hot leaf or spine.
    Empty while no running job loads the fabric."""
    topology = state.topology
    out = []
    for level, directions, loaded, over, hottest in _core.uplinks_by_level(state._core, int(count)):
        rows = [
            {
                "uplink": uplink_name(topology, slot // 2),
                "direction": _DIRECTIONS[slot % 2],
                "load_gbps": load,
                "capacity_gbps": cap,
                "utilisation": load / cap,
            }
            for slot, load, cap in hottest
        ]
        out.append(
            {
                "level": topology.levels[level].name,
                "uplinks_to": topology.levels[level + 1].name,
                "routing": topology.levels[level].routing,
                "directions": directions,
                "loaded": loaded,
                "over_capacity": over,
                "max_utilisation": rows[0]["utilisation"] if rows else 0.0,
                "hottest": rows,
            }
        )
    return out


def jobs_hurt(state: ClusterState, count: int = 5) -> list[dict[str, Any]]:
    """Running jobs by slowdown from contention, most hurt first (jobs allocated without
    their spec are not priced)."""
    rows = [
        {
            "job": name,
            "alone_seconds": alone,
            "contended_seconds": contended,
            "slowdown": contended / alone if alone > 0 else 1.0,
        }
        for name, alone, contended in _core.jobs_hurt(state._core)
    ]
    return rows[: int(count)]
