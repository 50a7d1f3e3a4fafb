"""Cluster state: which GPUs are free, allocated to which job, failed, drained or degraded.

The counters live in the Rust core and are kept incrementally. Every change is all or
nothing. Snapshots are plain JSON-able dictionaries; state files add a format version and a
checksum and are written atomically, so a crash never leaves a half-written file and a
corrupted file is refused instead of half-loaded.

Health is tracked per component: a GPU (its id, or ``"host:index"``), a host (``"dgx017"``),
a NIC (``"dgx017:mlx5_3"``, from the host type's ``nics``; its GPUs are those whose
``gpu_nic`` points at it) and a switch (a domain of any level above the host, named by
``topology.domain_names[level]``; write ``"leaf:su003"`` when a name is used at two levels).
A component is ok, degraded (a bandwidth factor in (0, 1] and a reason), failed or drained.
A GPU is usable only when nothing on its path failed or is drained; degraded components slow
every path through them down in the one cost model (``rust/core/src/cost.rs``).

State files (``gpuplace.state/2``; ``/1`` is still read) also hold the component health, the
reserved spares, each job's spec (so ``repair`` knows its communication) and, when known,
the cluster it belongs to (a preset and its parameters, or a topology file path relative to
the state file), so the CLI need not be told ``--cluster`` again.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core
from gpuplace._util.documents import exclusive_lock
from gpuplace.cluster import fabric, power, pricing, state_file
from gpuplace.cluster.state_file import STATE_FORMAT
from gpuplace.enums import ComponentKind, Condition, Health
from gpuplace.errors import InvalidState, InvalidTopology
from gpuplace.model.policy import ClusterPolicy
from gpuplace.model.storage import io_demands
from gpuplace.model.topology import Nics, Topology, nics_of

if TYPE_CHECKING:
    from gpuplace.model.job import Job
    from gpuplace.placement.result import Placement

__all__ = ["STATE_FORMAT", "ClusterState", "Nics", "QueuedJob", "loss_factor", "nics_of"]

#: The hardware keywords of fail/drain/recover/degrade (``node=`` is ``host=``): the labels of
#: the core's ComponentKind, defined once there.
_KINDS = {k.label: k for k in ComponentKind.members()} | {"node": ComponentKind.Host}
#: Bandwidth factor of a component degraded by ECC errors or heat when no figure is given: a
#: mild penalty, so the hardware is used only when it pays.
DEFAULT_SOFT_FACTOR = 0.9


def loss_factor(rate: float, transport: str = "roce") -> float:
    """The bandwidth factor the cost model gives a link of ``transport`` (``roce``: end-to-end
    go-back-N; ``infiniband``: link-level retransmission) losing ``rate`` of its packets (its
    loss model and sources are in ``rust/core/src/cost.rs``)."""
    return float(_core.loss_factor(rate, transport))


class ClusterState:
    """Allocation and health of every GPU of one topology."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self._core = _core.ClusterState(topology._core, nics_of(topology).gpu_nic)
        #: Job name -> its spec, for jobs allocated from a placement (repair uses it).
        self.specs: dict[str, Job] = {}
        #: Job name -> the power phase slot of a staggered synchronised job (``gpuplace.cluster.power``).
        self.phase_slots: dict[str, int] = {}
        #: Pools, priority classes and attributes kept in the state file (``gpuplace.policy``).
        self.policy = ClusterPolicy()
        #: MIG-mode GPUs and their instances (``gpuplace.cluster.mig``), if any.
        self.mig: Any = None
        #: State file (resolved path) -> the checksum it had when this state last loaded or
        #: saved it: :meth:`save` refuses to overwrite a file another process changed since.
        self.file_checksums: dict[str, str] = {}
        #: Shared hosts and the requests on them (``gpuplace.cluster.share``), if any.
        self.shared: Any = None
        #: Jobs waiting to be placed (requeued ones), by name, in queue order.
        self.queue: dict[str, QueuedJob] = {}

    def copy(self) -> ClusterState:
        out = ClusterState.__new__(ClusterState)
        out.topology = self.topology
        out._core = self._core.copy()
        out.specs = dict(self.specs)
        out.phase_slots = dict(self.phase_slots)
        out.policy = self.policy
        out.mig = None if self.mig is None else copy.deepcopy(self.mig)
        out.file_checksums = dict(self.file_checksums)
        out.shared = None if self.shared is None else self.shared.copy()
        out.queue = dict(self.queue)
        return out

    # ----------------------------------------------------------------- queries
    @property
    def free_gpus(self) -> int:
        """Number of GPUs that are unallocated and healthy."""
        return int(self._core.total_free)

    def free_mask(self) -> np.ndarray:
        return self._core.free_mask()

    def pricing_view(self) -> pricing.PricingView:
        """What solvers price on: usable GPUs, degraded GPUs, side factors and path
        bandwidths, derived by the core (see :mod:`gpuplace.cluster.pricing`)."""
        return pricing.pricing_view(self)

    def free_counts(self, level: int | str) -> np.ndarray:
        """Free healthy GPUs per domain of a level."""
        lvl = level if isinstance(level, int) else self.topology.level_index(level)
        return self._core.free_counts(lvl)

    @property
    def jobs(self) -> dict[str, np.ndarray]:
        """Allocated jobs: name -> GPU of each rank."""
        return dict(self._core.jobs())

    def job_gpus(self, name: str) -> np.ndarray | None:
        """GPU of each rank of one allocated job (None if no such job); unlike :attr:`jobs`
        it does not copy every job."""
        return self._core.job_gpus(name)

    def owner_of(self, gpu: int) -> str | None:
        return self._core.owner_of(int(gpu))

    def health(self) -> np.ndarray:
        """Health code per GPU (the codes of :class:`gpuplace.Health`: 0 ok, 1 failed,
        2 drained)."""
        return self._core.health()

    @property
    def occupancy(self) -> float:
        """Fraction of the cluster's GPUs that are allocated."""
        allocated = sum(len(g) for g in self.jobs.values())
        return allocated / self.topology.num_gpus

    def hottest_uplinks(self, count: int = 5) -> list[dict[str, Any]]:
        """The most loaded fabric uplinks (:func:`gpuplace.cluster.fabric.hottest_uplinks`)."""
        return fabric.hottest_uplinks(self, count)

    def uplinks_by_level(self, count: int = 5) -> list[dict[str, Any]]:
        """The load of each uplink level and its hottest uplinks
        (:func:`gpuplace.cluster.fabric.uplinks_by_level`)."""
        return fabric.uplinks_by_level(self, count)

    def fabric_loaded(self) -> bool:
        """Whether any running job loads a fabric uplink (so that placements here contend)."""
        return bool(_core.hottest_uplinks(self._core, 1))

    def power_headroom(self) -> list[dict[str, Any]]:
        """Per power domain: budget, draw and headroom (W), synchronised jobs and their phase
        offsets (:func:`gpuplace.cluster.power.power_report`)."""
        return power.power_report(self)

    def jobs_hurt(self, count: int = 5) -> list[dict[str, Any]]:
        """Running jobs by slowdown from contention (:func:`gpuplace.cluster.fabric.jobs_hurt`)."""
        return fabric.jobs_hurt(self, count)

    def effective_policy(self) -> ClusterPolicy:
        """The policy in force: the topology's, then the state's own (which wins by name)."""
        base = getattr(self.topology, "policy", None) or ClusterPolicy()
        return base.merged(self.policy or ClusterPolicy())

    # ----------------------------------------------------------------- views
    def scratch_copy(self) -> ClusterState:
        """A copy whose allocation and health may change independently (its own core state and
        job specs); the policy and MIG geometry are shared, not copied, so that a solver's
        scratch view stays cheap. Change MIG instances only on a :meth:`copy`."""
        view = copy.copy(self)
        view._core = self._core.copy()
        view.specs = dict(self.specs)
        view.file_checksums = dict(self.file_checksums)
        view.phase_slots = dict(self.phase_slots)
        view.queue = dict(self.queue)
        return view

    def fenced_view(self, allowed: np.ndarray | None) -> ClusterState:
        """A copy in which every GPU outside ``allowed`` is fenced off: what every solver is
        given for a job with a pool or hardware rules. This state is unchanged."""
        if allowed is None or allowed.all():
            return self
        view = self.scratch_copy()
        _core.set_fence(view._core, np.flatnonzero(~allowed).astype(np.int64), True)
        return view

    @contextlib.contextmanager
    def fenced(self, allowed: np.ndarray | None) -> Iterator[ClusterState]:
        """Fence off, in this state itself, every GPU outside ``allowed`` for the duration of
        the block (for a repair, which changes the state in place); the fence is lifted on
        exit, whatever happens."""
        if allowed is None or allowed.all():
            yield self
            return
        outside = np.flatnonzero(~allowed).astype(np.int64)
        _core.set_fence(self._core, outside, True)
        try:
            yield self
        finally:
            _core.set_fence(self._core, outside, False)

    # ----------------------------------------------------------------- changes
    def allocate(
        self,
        placement: Placement | None = None,
        *,
        name: str | None = None,
        gpus: Any = None,
        job: Job | None = None,
        phase_slot: int = 0,
    ) -> None:
        """Allocate a placement (or ``name`` + ``gpus``, with the ``job`` spec and power
        ``phase_slot`` it was placed with when known, as a journal replays a placement); raises
        InvalidState and changes nothing if any GPU is taken, failed or drained, or the job
        name is in use."""
        slot = int(phase_slot)
        if placement is not None:
            if placement.topology is not self.topology:
                raise InvalidState("the placement was made for another topology than this state's")
            name, gpus, job = placement.job.name, placement.gpus, placement.job
            slot = int(placement.details.get("phase_slot", 0))
        if name is None or gpus is None:
            raise InvalidState("allocate needs a placement, or a name and GPUs")
        if job is not None and job.gpus != len(gpus):
            raise InvalidState(
                f"job {name!r}: its spec has {job.gpus} ranks, given {len(gpus)} GPUs"
            )
        # A power budget is never exceeded, whoever chose the GPUs (gpuplace.cluster.power).
        if self.topology.power_domains and self.job_gpus(name) is None:
            power.check_budgets(self, name, job, np.asarray(gpus, dtype=np.int64), slot)
        # With its spec, the job's flows (collectives and storage traffic) load the fabric's
        # uplinks (gpuplace.cluster.fabric, gpuplace.model.storage).
        spec = None if job is None else job.compile(self.topology)
        io = io_demands(self.topology, job)
        self._core.allocate(name, np.asarray(gpus, dtype=np.int64), spec, io or None)
        if job is not None:
            self.specs[name] = job
        if slot:
            self.phase_slots[name] = slot

    def release(self, name: str) -> np.ndarray:
        """Free a job's GPUs; returns them."""
        gpus = self._core.release(name)
        self.specs.pop(name, None)
        self.phase_slots.pop(name, None)
        return gpus

    # ----------------------------------------------------------------- the queue
    def enqueue(self, job: Job, reason: str = "") -> None:
        """Put a job at the end of the queue of jobs waiting to be placed; InvalidState when
        a job of that name runs or waits already."""
        if job.name in self.queue:
            raise InvalidState(f"job {job.name!r} is already queued")
        if self.job_gpus(job.name) is not None:
            raise InvalidState(f"job {job.name!r} is running; release or requeue it first")
        self.queue[job.name] = QueuedJob(job, reason)

    def dequeue(self, name: str) -> Job:
        """Take a job out of the queue (to place it, or to cancel it); returns its spec."""
        if name not in self.queue:
            raise InvalidState(f"no job named {name!r} is queued{_listing(self.queue)}")
        return self.queue.pop(name).job

    def requeue(self, name: str, reason: str = "") -> Job:
        """Stop a running job and queue it again (its GPUs are freed, its spec waits at the
        end of the queue, to be placed again); all or nothing. InvalidState when no such job
        runs or the state does not know its spec (allocated by GPUs only)."""
        if self.job_gpus(name) is None:
            raise InvalidState(f"no job named {name!r} is running{_listing(self.jobs)}")
        spec = self.specs.get(name)
        if spec is None:
            raise InvalidState(
                f"job {name!r} was allocated without its spec; it cannot be queued again "
                "(release it, then place its job file)"
            )
        if name in self.queue:
            raise InvalidState(f"job {name!r} is already queued")
        self.release(name)
        self.queue[name] = QueuedJob(spec, reason)
        return spec

    def _set_health(self, gpus: Iterable[int], status: Health) -> dict[str, np.ndarray]:
        affected = self._core.set_health(np.asarray(list(gpus), dtype=np.int64), status)
        return {name: ranks for name, ranks in affected}

    def fail_gpus(self, gpus: Iterable[int]) -> dict[str, np.ndarray]:
        """Mark GPUs failed; returns the jobs holding any of them -> affected ranks."""
        return self._set_health(gpus, Health.Failed)

    def drain_gpus(self, gpus: Iterable[int]) -> dict[str, np.ndarray]:
        """Take GPUs out of service (an operator's drain); returns the affected jobs."""
        return self._set_health(gpus, Health.Drained)

    def recover_gpus(self, gpus: Iterable[int]) -> None:
        """Return GPUs to service."""
        self._set_health(gpus, Health.Ok)

    # ----------------------------------------------------------------- health events
    def fail(self, **targets: Any) -> dict[str, np.ndarray]:
        """Mark hardware failed: ``gpu=``, ``host=`` (or ``node=``), ``nic=``, ``switch=``,
        each one name or a list, and an optional ``reason=``. All or nothing: an unknown name
        raises InvalidState naming it and changes nothing. Returns the jobs on the GPUs
        affected -> their ranks there."""
        return self._event(Condition.Failed, targets)

    def drain(self, **targets: Any) -> dict[str, np.ndarray]:
        """Take hardware out of service (an operator's drain); as :meth:`fail`. Jobs keep
        running on drained GPUs until repaired or released, but no solver uses them."""
        return self._event(Condition.Drained, targets)

    def recover(self, **targets: Any) -> dict[str, np.ndarray]:
        """Return hardware to ok (clears failed, drained and degraded); as :meth:`fail`."""
        return self._event(Condition.Ok, targets)

    def degrade(
        self,
        *,
        loss: float | str | None = None,
        factor: float | None = None,
        width: tuple[float, float] | None = None,
        speed: tuple[float, float] | None = None,
        **targets: Any,
    ) -> dict[str, np.ndarray]:
        """Mark hardware degraded: it stays usable but every path through it is slower.

        The bandwidth factor comes from ``loss`` (packet loss rate, 0.01 or ``"1%"``; mapped
        by the cost model's loss model for the ``transport`` of the links the hardware sits
        on: 1 % leaves 45 % on RoCE, 94 % on InfiniBand with link-level retry), ``factor`` (0 < f <= 1, a
        measured goodput ratio), ``width=(trained, nominal)`` or ``speed=(trained, nominal)``
        of a link that trained below its rating; the smallest applies. With only a
        ``reason`` naming ECC errors or heat the factor is a mild 0.9. Targets as in
        :meth:`fail`."""
        reason = targets.pop("reason", None)
        factors: list[float] = []
        words: list[str] = []
        if loss is not None:
            rate = parse_fraction(loss, "loss")
            if not 0 <= rate < 1:
                raise InvalidState(f"loss: expected a rate in [0, 1), got {loss!r}")
            factors.extend(loss_factor(rate, t) for t in self._loss_transports(targets))
            words.append(f"packet loss {rate * 100:.3g}%")
        if factor is not None:
            f = _number(factor, "factor")
            if not 0 < f <= 1:
                raise InvalidState(f"factor: expected a number in (0, 1], got {factor!r}")
            factors.append(f)
        for key, pair in (("width", width), ("speed", speed)):
            if pair is None:
                continue
            try:
                trained, nominal = (float(v) for v in pair)
            except (TypeError, ValueError):
                raise InvalidState(f"{key}: expected (trained, nominal), got {pair!r}") from None
            if not 0 < trained <= nominal:
                raise InvalidState(f"{key}: expected 0 < trained <= nominal, got {pair!r}")
            factors.append(trained / nominal)
            words.append(f"link {key} {trained:g} of {nominal:g}")
        if not factors:
            text = str(reason or "").lower()
            if "ecc" in text or "therm" in text:
                factors.append(DEFAULT_SOFT_FACTOR)
            else:
                raise InvalidState(
                    "degrade needs loss=, factor=, width= or speed= (or a reason naming ECC "
                    "errors or heat)"
                )
        text = str(reason) if reason else "; ".join(words) or "degraded"
        return self._event(
            Condition.Degraded, targets, factor=max(min(factors), _core.MIN_FACTOR), reason=text
        )

    def _event(
        self,
        condition: Condition,
        targets: dict[str, Any],
        *,
        factor: float = 1.0,
        reason: str | None = None,
    ) -> dict[str, np.ndarray]:
        if reason is None:
            reason = str(targets.pop("reason", "") or "")
        parts = self._components(targets)
        if not parts:
            raise InvalidState("name the hardware: gpu=, host=, nic= or switch=")
        kinds, a, b = (np.asarray(col, dtype=np.int64) for col in zip(*parts, strict=True))
        affected = self._core.set_condition(kinds, a, b, condition, factor, reason)
        return {name: ranks for name, ranks in affected}

    def _loss_transports(self, targets: dict[str, Any]) -> set[str]:
        """The transports of the links lossy hardware sits on: a switch's level's, and for a
        NIC, host or GPU the first level a NIC reaches (the one above the NVLink domain)."""
        topo = self.topology
        out: set[str] = set()
        for key, value in targets.items():
            if value is None:
                continue
            if _KINDS.get(key) == ComponentKind.Switch:
                values = value if isinstance(value, list | tuple | set | np.ndarray) else [value]
                out.update(topo.levels[self.resolve_switch(v)[0]].transport for v in values)
            else:
                out.add(topo.nic_transport)
        return out or {topo.nic_transport}

    def _components(self, targets: dict[str, Any]) -> list[tuple[int, int, int]]:
        """Resolve ``gpu=/host=/node=/nic=/switch=`` names to (kind, a, b) triples."""
        out: list[tuple[int, int, int]] = []
        for key, value in targets.items():
            if value is None:
                continue
            values = value if isinstance(value, list | tuple | set | np.ndarray) else [value]
            for v in values:
                kind = _KINDS.get(key)
                if kind == ComponentKind.Gpu:
                    out.append((int(kind), self.resolve_gpu(v), 0))
                elif kind == ComponentKind.Host:
                    out.append((int(kind), self.topology.resolve_host(v), 0))
                elif kind == ComponentKind.Nic:
                    out.append((int(kind), self.topology.resolve_nic(v), 0))
                elif kind == ComponentKind.Switch:
                    out.append((int(kind), *self.resolve_switch(v)))
                else:
                    raise InvalidState(
                        f"unknown hardware kind {key!r}; use gpu, host, nic or switch"
                    )
        return out

    def resolve_gpu(self, gpu: Any) -> int:
        """A GPU id from an int or ``"host:index"`` (see :meth:`Topology.resolve_gpu`)."""
        return self.topology.resolve_gpu(gpu)

    def resolve_switch(self, name: Any) -> tuple[int, int]:
        """(level, domain) of a switch (see :meth:`Topology.resolve_switch`)."""
        return self.topology.resolve_switch(name)

    def component_name(self, kind: ComponentKind, a: int, b: int) -> str:
        return self.topology.component_name(kind, a, b)

    def unhealthy(self) -> list[dict[str, Any]]:
        """Hardware that is not ok: kind, name, condition, factor, reason."""
        return [
            {
                "kind": kind.label,
                "name": self.component_name(kind, a, b),
                "condition": condition.label,
                "factor": factor,
                "reason": reason,
            }
            for kind, a, b, condition, factor, reason in self._core.components()
        ]

    def degraded_mask(self) -> np.ndarray:
        """GPUs whose paths cross a degraded component."""
        return self._core.degraded_mask()

    # ----------------------------------------------------------------- spares
    def reserve_spares(
        self,
        *,
        gpus: Iterable[Any] | None = None,
        hosts: Iterable[str] | None = None,
        per: str | None = None,
        count: int = 1,
    ) -> np.ndarray:
        """Hold GPUs back for repairs only: normal placement never uses them, a repair may.

        Give ``gpus`` or ``hosts``, or ``per=<level>`` to reserve ``count`` whole free hosts
        in every domain of that level (the last ones, so the first stay for normal use).
        Returns the GPUs reserved. All or nothing."""
        chosen: list[int] = []
        for g in gpus or ():
            chosen.append(self.resolve_gpu(g))
        for h in hosts or ():
            chosen.extend(
                int(g)
                for g in self.topology.host_gpus(self.topology.hosts[self.topology.resolve_host(h)])
            )
        if per is not None:
            try:
                level = self.topology.level_index(per)
            except InvalidTopology:
                raise InvalidState(f"per: {per!r} is not a level of {self.topology.name}") from None
            if level < self.topology.node_level:
                raise InvalidState(
                    "per: spares are whole hosts; name the host level or one above it"
                )
            free = self.free_mask()
            path = self.topology.path
            hosts_of = path[:, self.topology.node_level]
            for d in range(self.topology.domain_count(level)):
                in_domain = np.unique(hosts_of[path[:, level] == d])
                taken = 0
                for h in in_domain[::-1]:
                    host_gpus = np.flatnonzero(hosts_of == h)
                    if taken < count and free[host_gpus].all():
                        chosen.extend(int(g) for g in host_gpus)
                        taken += 1
        self._core.set_spare(np.asarray(chosen, dtype=np.int64), True)
        return np.asarray(sorted(set(chosen)), dtype=np.int64)

    def release_spares(self, gpus: Iterable[Any] | None = None) -> None:
        """Return spares (all of them by default) to normal use."""
        ids = self.spares if gpus is None else [self.resolve_gpu(g) for g in gpus]
        self._core.set_spare(np.asarray(ids, dtype=np.int64), False)

    @property
    def spares(self) -> np.ndarray:
        """GPU ids reserved as spares."""
        return np.flatnonzero(self._core.spare_mask())

    def check(self) -> None:
        """Check every incremental counter against a recount (raises InvalidState)."""
        self._core.check()

    # ----------------------------------------------------------------- persistence
    # (the state file format lives in gpuplace.cluster.state_file)
    def snapshot(self, *, spec_docs: Mapping[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """A JSON-able dictionary of the whole state. ``spec_docs``: documents of job specs
        made already (``Job.to_dict()`` by job name), used instead of making them again."""
        return state_file.snapshot(self, spec_docs=spec_docs)

    @classmethod
    def restore(
        cls, topology: Topology, snapshot: Any, *, source: str | None = None
    ) -> ClusterState:
        """A state from :meth:`snapshot`'s form, every field checked (InvalidState naming the
        field otherwise)."""
        return state_file.restore(cls(topology), snapshot, source=source)

    @staticmethod
    def cluster_of(path: str | Path) -> dict[str, Any] | None:
        """The cluster a state file remembers; see :func:`gpuplace.cluster.state_file.cluster_of`."""
        return state_file.cluster_of(path)

    def save(self, path: str | Path) -> None:
        """Write the state file atomically, with a checksum over its content."""
        state_file.save(self, path)

    @classmethod
    def load(cls, topology: Topology, path: str | Path) -> ClusterState:
        """Read a state file written by :meth:`save`; a truncated, corrupted or foreign file is
        refused with InvalidState and nothing is loaded."""
        return state_file.load(cls(topology), path)

    @classmethod
    @contextlib.contextmanager
    def transaction(
        cls, path: str | Path, topology: Topology | None = None
    ) -> Iterator[ClusterState]:
        """Change a state file safely from several processes::

            with gpuplace.ClusterState.transaction("state.json") as state:
                state.allocate(gpuplace.place(state, job))

        The file's lock (``<path>.lock``, the one the CLI takes) is held from the load to the
        save, so concurrent transactions run one after the other and none loses another's
        change. The state is saved when the block ends normally; on an exception nothing is
        written. ``topology`` is needed when the file does not exist yet or does not name its
        cluster (a preset, or a topology file, as ``gpuplace slurm sync`` records)."""
        with exclusive_lock(path):
            if topology is None:
                topology = _cluster_topology(path)
            state = cls.load(topology, path) if Path(path).exists() else cls(topology)
            yield state
            state.save(path)

    def __repr__(self) -> str:
        return (
            f"ClusterState({self.topology.name!r}: {len(self.jobs)} jobs, "
            f"{self.free_gpus}/{self.topology.num_gpus} GPUs free)"
        )


def _cluster_topology(path: str | Path) -> Topology:
    """The topology a state file names (its preset and parameters, or its topology file)."""
    if not Path(path).exists():
        raise InvalidState(f"{path}: no such state file; give the topology to start a new one")
    cluster = state_file.cluster_of(path)
    if cluster is None:
        raise InvalidState(f"{path}: the state file does not name its cluster; give the topology")
    try:
        return Topology.from_origin(cluster)
    except InvalidTopology as exc:
        raise InvalidState(f"{path}: the cluster it names cannot be read: {exc}") from None


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting in a state's queue, and why it waits (free text)."""

    job: Job
    reason: str = ""


def _listing(names: Iterable[str]) -> str:
    names = list(names)
    if not names:
        return " (there are none)"
    shown = ", ".join(repr(n) for n in names[:10])
    return f" (there are {shown}{' ...' if len(names) > 10 else ''})"


def parse_fraction(value: Any, what: str) -> float:
    """A rate from 0.01, "0.01" or "1%"."""
    text = str(value).strip()
    try:
        if text.endswith("%"):
            return float(text[:-1]) / 100.0
        return _number(value, what)
    except ValueError:
        raise InvalidState(f"{what}: expected a number or a percentage, got {value!r}") from None


def _number(value: Any, what: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise InvalidState(f"{what}: expected a number, got {value!r}") from None
    if out != out or out in (float("inf"), float("-inf")):
        raise InvalidState(f"{what}: expected a finite number, got {value!r}")
    return out
