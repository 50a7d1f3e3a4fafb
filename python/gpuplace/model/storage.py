"""Storage and data locality: where a job's dataset and checkpoints live, and what reading and
writing them costs per step.

A topology may declare ``stores`` (``docs/topology-format.md``): each is attached to every host
(``attach: local``, node-local NVMe read through GPUDirect Storage), to one domain (a leaf's
storage node: ``attach: su003`` or ``leaf:su003``) or above the fabric (``attach: remote``,
the top level's domain), with read and write bandwidth in GB/s. A job may name its dataset's
store and input bytes per step (``data``) and its checkpoint store, bytes and interval in steps
(``checkpoint``, ``docs/job-format.md``). The core prices that traffic over the path from each
host to the store, among the running jobs' load (``rust/core/src/storage.rs``); the report's
``io_seconds`` is added to no other figure (communication stays ``comm_seconds``) and the step
is assumed to wait for both. While the job runs, its storage traffic loads the uplinks on
those paths (:func:`io_demands`, passed to the core's allocation). Pricing it in a state is
:mod:`gpuplace.cluster.storage`; :func:`gpuplace.place` also tries the placement restricted to
the data's domain and keeps it when it lowers ``comm_seconds + io_seconds``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuplace._util.documents import Checker
from gpuplace.errors import InvalidJob

if TYPE_CHECKING:
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = [
    "DataAccess",
    "Store",
    "io_demands",
    "parse_data",
    "parse_stores",
    "store_attachment",
    "store_of",
    "transfers",
]


@dataclass(frozen=True)
class Store:
    name: str
    #: ``local``, ``remote`` or a domain name (``su003`` / ``leaf:su003``).
    attach: str
    read_gbps: float
    write_gbps: float

    def to_dict(self) -> dict[str, Any]:
        return {"attach": self.attach, "read_gbps": self.read_gbps, "write_gbps": self.write_gbps}


@dataclass(frozen=True)
class DataAccess:
    """A job's storage traffic: dataset reads per step, checkpoint writes every few steps."""

    store: str | None = None
    input_bytes_per_step: float = 0.0
    checkpoint_store: str | None = None
    checkpoint_bytes: float = 0.0
    checkpoint_interval_steps: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.store is not None:
            out["data"] = {"store": self.store, "input_bytes_per_step": self.input_bytes_per_step}
        if self.checkpoint_store is not None:
            out["checkpoint"] = {
                "store": self.checkpoint_store,
                "bytes": self.checkpoint_bytes,
                "interval_steps": self.checkpoint_interval_steps,
            }
        return out


def parse_stores(c: Checker, raw: Any) -> dict[str, Store]:
    out: dict[str, Store] = {}
    for name, entry in c.mapping(raw, "stores").items():
        p = f"stores.{name}"
        d = c.mapping(entry, p)
        c.keys(d, p, {"attach", "read_gbps", "write_gbps"})
        out[str(name)] = Store(
            name=str(name),
            attach=c.string(d.get("attach"), f"{p}.attach"),
            read_gbps=c.number(d.get("read_gbps"), f"{p}.read_gbps", positive=True),
            write_gbps=c.number(d.get("write_gbps"), f"{p}.write_gbps", positive=True),
        )
    return out


def parse_data(c: Checker, data: Any, checkpoint: Any) -> DataAccess | None:
    if data is None and checkpoint is None:
        return None
    kwargs: dict[str, Any] = {}
    if data is not None:
        d = c.mapping(data, "data")
        c.keys(d, "data", {"store", "input_bytes_per_step"})
        kwargs["store"] = c.string(d.get("store"), "data.store")
        kwargs["input_bytes_per_step"] = c.number(
            d.get("input_bytes_per_step", 0.0), "data.input_bytes_per_step", minimum=0.0
        )
    if checkpoint is not None:
        d = c.mapping(checkpoint, "checkpoint")
        c.keys(d, "checkpoint", {"store", "bytes", "interval_steps"})
        kwargs["checkpoint_store"] = c.string(d.get("store"), "checkpoint.store")
        kwargs["checkpoint_bytes"] = c.number(d.get("bytes"), "checkpoint.bytes", minimum=0.0)
        kwargs["checkpoint_interval_steps"] = c.number(
            d.get("interval_steps", 1.0), "checkpoint.interval_steps", positive=True
        )
    return DataAccess(**kwargs)


def store_attachment(topology: Topology, store: Store) -> tuple[int, int]:
    """(level, domain) of a store; level -1 for node-local stores."""
    if store.attach == "local":
        return -1, 0
    top = len(topology.levels) - 1
    if store.attach == "remote":
        return top, 0
    wanted, _, short = store.attach.rpartition(":")
    for level in range(topology.node_level, top + 1):
        if wanted and topology.levels[level].name != wanted:
            continue
        names = topology.domain_names[level]
        if short in names:
            return level, names.index(short)
    raise InvalidJob(
        f"store {store.name!r}: attach {store.attach!r} is not local, remote nor a domain "
        f"of {topology.name}"
    )


def store_of(topology: Topology, name: str) -> Store:
    store = topology.stores.get(name)
    if store is None:
        known = ", ".join(topology.stores) or "none"
        raise InvalidJob(f"unknown store {name!r} (the cluster's stores: {known})")
    return store


def transfers(job: Job) -> list[tuple[str, float, float]]:
    """(store, read bytes, write bytes) per step of a job's storage traffic."""
    access: DataAccess | None = getattr(job, "data", None)
    if access is None:
        return []
    out = []
    if access.store is not None and access.input_bytes_per_step > 0:
        out.append((access.store, access.input_bytes_per_step, 0.0))
    if access.checkpoint_store is not None and access.checkpoint_bytes > 0:
        per_step = access.checkpoint_bytes / access.checkpoint_interval_steps
        out.append((access.checkpoint_store, 0.0, per_step))
    return out


def io_demands(
    topology: Topology, job: Job | None
) -> list[tuple[int, int, float, float, float, float]]:
    """A job's storage traffic as the core's allocation takes it, so that it loads the
    uplinks on the paths to its stores while the job runs."""
    if job is None or not topology.stores:
        return []
    out = []
    for name, read, write in transfers(job):
        store = store_of(topology, name)
        level, domain = store_attachment(topology, store)
        out.append((level, domain, store.read_gbps, store.write_gbps, read, write))
    return out
