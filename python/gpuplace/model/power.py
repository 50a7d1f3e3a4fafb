"""Power domains: racks, PDUs and rows with a budget in W that placement never exceeds.

A topology may declare ``power_domains`` (``docs/topology-format.md``): each names its hosts
(a Slurm hostlist), a budget for the GPUs' draw (W; subtract the hosts' base load from the
breaker or PDU rating) and optionally ``max_synchronized``, the number of jobs with
synchronised peaks whose peaks may coincide in it.

A job may declare ``power`` (``docs/job-format.md``): its per-GPU ``peak_w`` and ``average_w``
and whether its peaks are ``synchronized`` (a training step makes every GPU of a data-parallel
job peak together). Without it a GPU draws its board power (the host type's ``power_w``, else
the GPU model's figure in :data:`BOARD_POWER_W`), peak and average alike, unsynchronised.

The draw of a domain counts synchronised jobs at peak and the others at average. The
topology's ``power_phases`` (P, default 1) lets synchronised jobs be staggered: each gets a
phase slot ``s`` in ``0..P-1`` and starts its steps ``s / P`` of a step later, so only the jobs
of one slot peak together; the domain's draw is then the sum of averages plus, for the worst
slot, its jobs' ``peak - average``, and ``max_synchronized`` bounds the jobs per domain and slot.
With P = 1 every synchronised job peaks together: at most ``max_synchronized`` per domain.

The arithmetic (a job's draw from its declaration, a domain's draw, the budget checks and the
GPUs a job may take per domain and slot) is the core's (``rust/core/src/power.rs``):
:func:`power_model` compiles the declarations for it, :func:`job_power` asks it. How the draw
is accounted and kept within budgets in a live cluster: :mod:`gpuplace.cluster.power`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core
from gpuplace._util.documents import Checker
from gpuplace._util.hostlist import HostlistError, compress, expand

if TYPE_CHECKING:
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = [
    "BOARD_POWER_W",
    "JobPower",
    "PowerDomain",
    "declared_power",
    "gpu_power_w",
    "job_power",
    "parse_job_power",
    "parse_power_domains",
    "power_model",
]

#: Board power (W) per GPU model, from the vendors' datasheets: NVIDIA H100 SXM5 700 W and
#: H100 PCIe 350 W (H100 datasheet), H200 SXM 700 W (H200 datasheet), A100 SXM4 400 W and A100
#: PCIe 300 W (A100 datasheet), B200 1000 W (HGX B200 specification), GB200 1200 W per GPU
#: (GB200 NVL72 specification), L40S 350 W (L40S datasheet), AMD Instinct MI300X 750 W and
#: MI250X 560 W (AMD datasheets). Matched by substring of the host type's ``gpu_model``.
BOARD_POWER_W: dict[str, float] = {
    "H100-PCIE": 350.0,
    "H100": 700.0,
    "H200": 700.0,
    "A100-PCIE": 300.0,
    "A100": 400.0,
    "GB200": 1200.0,
    "B200": 1000.0,
    "L40S": 350.0,
    "MI300X": 750.0,
    "MI250X": 560.0,
}


@dataclass(frozen=True)
class PowerDomain:
    name: str
    kind: str
    budget_w: float
    #: Host indices of the domain.
    hosts: tuple[int, ...]
    max_synchronized: int | None = None

    def to_dict(self, host_names: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "hosts": compress([host_names[h] for h in self.hosts]),
            "budget_w": self.budget_w,
        }
        if self.max_synchronized is not None:
            out["max_synchronized"] = self.max_synchronized
        return out


@dataclass(frozen=True)
class JobPower:
    """A job's per-GPU draw (W) and whether its peaks are synchronised."""

    peak_w: float | None = None
    average_w: float | None = None
    synchronized: bool = True

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"synchronized": self.synchronized}
        if self.peak_w is not None:
            out["peak_w"] = self.peak_w
        if self.average_w is not None:
            out["average_w"] = self.average_w
        return out


def parse_power_domains(c: Checker, raw: Any, hosts: list[str]) -> tuple[PowerDomain, ...]:
    index = {h: i for i, h in enumerate(hosts)}
    out: list[PowerDomain] = []
    names: set[str] = set()
    for i, entry in enumerate(c.sequence(raw, "power_domains")):
        p = f"power_domains[{i}]"
        d = c.mapping(entry, p)
        c.keys(d, p, {"name", "kind", "hosts", "budget_w", "max_synchronized"})
        name = c.string(d.get("name"), f"{p}.name")
        if name in names:
            raise c.fail(f"{p}.name", f"duplicate power domain {name!r}")
        names.add(name)
        kind = c.string(d.get("kind", "rack"), f"{p}.kind")
        if kind not in ("rack", "pdu", "row"):
            raise c.fail(f"{p}.kind", f"expected rack, pdu or row, got {kind!r}")
        try:
            members = expand(c.string(d.get("hosts"), f"{p}.hosts"))
        except HostlistError as exc:
            raise c.fail(f"{p}.hosts", str(exc)) from None
        unknown = [h for h in members if h not in index]
        if unknown or not members:
            raise c.fail(f"{p}.hosts", f"unknown host {unknown[0]!r}" if unknown else "no host")
        limit = d.get("max_synchronized")
        out.append(
            PowerDomain(
                name=name,
                kind=kind,
                budget_w=c.number(d.get("budget_w"), f"{p}.budget_w", positive=True),
                hosts=tuple(sorted({index[h] for h in members})),
                max_synchronized=None
                if limit is None
                else c.integer(limit, f"{p}.max_synchronized", minimum=0),
            )
        )
    return tuple(out)


def parse_job_power(c: Checker, raw: Any) -> JobPower:
    d = c.mapping(raw, "power")
    c.keys(d, "power", {"peak_w", "average_w", "synchronized"})
    peak = None if d.get("peak_w") is None else c.number(d["peak_w"], "power.peak_w", positive=True)
    average = (
        None
        if d.get("average_w") is None
        else c.number(d["average_w"], "power.average_w", positive=True)
    )
    if peak is not None and average is not None and average > peak:
        raise c.fail("power.average_w", f"must be at most peak_w ({peak}), got {average}")
    synced = d.get("synchronized", True)
    if not isinstance(synced, bool):
        raise c.fail("power.synchronized", f"expected true or false, got {synced!r}")
    return JobPower(peak_w=peak, average_w=average, synchronized=synced)


def gpu_power_w(topology: Topology) -> np.ndarray:
    """Board power (W) of every GPU: the host type's ``power_w``, else the model's figure."""
    per_type: dict[str, float] = {}
    for tname, nt in topology.node_types.items():
        watts = nt.power_w
        if watts is None and nt.gpu_model:
            model = nt.gpu_model.upper().replace(" ", "-")
            watts = next((w for key, w in BOARD_POWER_W.items() if key in model), None)
        per_type[tname] = math.nan if watts is None else float(watts)
    return np.repeat(
        [per_type[t] for t in topology.host_types],
        [topology.node_types[t].gpus for t in topology.host_types],
    )


def declared_power(job: Job | None) -> tuple[float | None, float | None, bool] | None:
    """A job's declared draw as the core reads it: ``(peak_w, average_w, synchronized)``, None
    when it declares none."""
    power: JobPower | None = None if job is None else getattr(job, "power", None)
    if power is None:
        return None
    return power.peak_w, power.average_w, power.synchronized


def job_power(job: Job | None, board_w: float) -> tuple[float, float, bool]:
    """(peak W, average W, synchronised) per GPU of a job on a GPU of ``board_w``: its
    declaration, the board power where it declares none (the core's rule)."""
    return _core.job_draw(declared_power(job), float(board_w))


def power_model(topology: Topology) -> _core.PowerModel:
    """The topology's power domains compiled for the core: budgets, ``max_synchronized``,
    phase slots, every GPU's board power and each domain's GPUs."""
    host_of = topology.host_of_gpu
    domains = topology.power_domains
    return _core.PowerModel(
        [float(d.budget_w) for d in domains],
        [d.max_synchronized for d in domains],
        int(topology.power_phases),
        np.ascontiguousarray(gpu_power_w(topology), dtype=np.float64),
        [np.flatnonzero(np.isin(host_of, np.asarray(d.hosts, dtype=np.int64))) for d in domains],
    )
