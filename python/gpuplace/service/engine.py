"""The service's engine: the live state of every cluster it serves, its one writer.

Every change (a placement, a release, a repair, a health change, what the Slurm follower saw)
is an *event*: the engine applies it to the in-memory :class:`~gpuplace.ClusterState` under its
lock and appends it to the :class:`~gpuplace.service.journal.Journal` in the same order; the
caller acknowledges only once the journal has it on disk. A restart replays the journal's last
snapshot and the events after it through the same :meth:`Engine.apply`, so the state it resumes
is the state it acknowledged.

Placements are *held* until released: a hold names where it came from (the API, a Slurm job
submitted through the ``job_submit/lua`` plugin, a Kubernetes gang) and, for Slurm, the token
the plugin put in the job's ``admin_comment``; the Slurm follower turns a hold into the
running job's allocation when the job starts and releases it when the job ends or is cancelled,
or never reached the queue.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gpuplace._util.documents import parse_yaml
from gpuplace._util.hostlist import compress
from gpuplace.cluster.state import ClusterState
from gpuplace.errors import GpuplaceError, Infeasible, InvalidJob, InvalidState
from gpuplace.health.judge import apply_findings, load_rules
from gpuplace.health.judge import evaluate as judge_evidence
from gpuplace.integrations import slurmctld as ctld
from gpuplace.integrations.slurm import SlurmJob, SlurmNode
from gpuplace.model.job import Job
from gpuplace.model.topology import Topology
from gpuplace.placement.explain import explain
from gpuplace.placement.place import place
from gpuplace.placement.repair import repair
from gpuplace.placement.result import Placement
from gpuplace.service.journal import Journal, JournalError

__all__ = [
    "ClusterRuntime",
    "Conflict",
    "Engine",
    "Hold",
    "NotFound",
    "RequestCancelled",
    "Ticket",
    "Unavailable",
    "build_topology",
    "topology_ref",
]

#: Slurm job states after which a job holds nothing.
_ENDED = {
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "REVOKED",
    "SPECIAL_EXIT",
}
_RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STAGE_OUT", "SIGNALING"}
_TOKEN = re.compile(r"gpuplace:hold=([0-9a-f]{16})")
#: Size of a job document taken from a Slurm submission (#GPUPLACE lines or the comment).
MAX_SPEC_BYTES = 64 << 10
#: Jobs whose node lists status remembers (then it starts again).
NODES_CACHE = 1 << 16


class Conflict(GpuplaceError):
    """The request clashes with the live state (a job name in use); HTTP 409."""


class NotFound(GpuplaceError):
    """No such cluster or job; HTTP 404."""


class Unavailable(GpuplaceError):
    """The engine cannot take changes now (its journal failed, or no Slurm view yet); 503."""


class RequestCancelled(GpuplaceError):
    """The request ran out of time before its change was applied; nothing changed."""


class Ticket:
    """One request's claim to change the state: either it commits (under the engine's lock,
    before the change is applied) or it is cancelled (its caller gave up); never both."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state = "open"

    def begin_commit(self) -> None:
        with self._lock:
            if self.state == "cancelled":
                raise RequestCancelled(
                    "the request timed out before it was applied; nothing changed"
                )
            self.state = "committed"

    def cancel(self) -> bool:
        """True when cancelled in time (nothing was or will be applied)."""
        with self._lock:
            if self.state == "committed":
                return False
            self.state = "cancelled"
            return True


@dataclass(frozen=True)
class Hold:
    """A placement the service holds for someone until it is released. Immutable: a change
    is a new Hold (``dataclasses.replace``), so a snapshot or a status that took the mapping
    of holds keeps what it took, and each hold's document is made once (:attr:`doc`)."""

    name: str
    origin: str  # api | slurm | k8s
    created: float
    token: str = ""
    #: The Slurm job it became, once the follower saw it.
    slurm_job_id: int | None = None
    started: bool = False
    #: The name the submitter gave (a Slurm job name, a Kubernetes gang).
    label: str = ""
    user: str | None = None
    #: Seconds since ``created`` after which a hold whose job never showed up is released.
    grace: float | None = None

    @functools.cached_property
    def doc(self) -> dict[str, Any]:
        """The hold's document (read only: shared by the snapshots and status answers that
        include it; made once, where a thousand holds made afresh were most of a snapshot's
        time)."""
        # Every field is a plain value: no deep copy (``asdict``) needed.
        values = ((k, getattr(self, k)) for k in self.__dataclass_fields__)
        return {k: v for k, v in values if v not in (None, "", False)}

    def to_dict(self) -> dict[str, Any]:
        return dict(self.doc)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Hold:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


@dataclass
class FollowStatus:
    """What the Slurm follower last did."""

    polls: int = 0
    last_poll: float | None = None
    last_ok: float | None = None
    last_error: str | None = None
    poll_seconds: float | None = None


@dataclass
class ClusterRuntime:
    name: str
    state: ClusterState
    topology_ref: dict[str, Any]
    holds: dict[str, Hold] = field(default_factory=dict)
    slurm: ctld.Slurmctld | None = None
    view: ctld.SlurmView | None = None
    follow: FollowStatus = field(default_factory=FollowStatus)
    #: Command that taints a Kubernetes node (``kubectl`` and its options), if configured.
    taint_command: list[str] | None = None
    #: Repairs proposed for jobs hit by health changes, by job.
    proposals: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The spec document each job was journaled with (``Job.to_dict()``), by job: a snapshot
    #: reuses them instead of making a thousand again.
    spec_docs: dict[str, dict[str, Any]] = field(default_factory=dict)


def topology_ref(topology: Topology) -> dict[str, Any]:
    """How to rebuild a topology at restart: its preset and parameters, or its document."""
    origin = getattr(topology, "origin", None) or {}
    if isinstance(origin.get("preset"), str):
        return {"origin": dict(origin)}
    return {"document": topology.to_dict()}


def build_topology(ref: dict[str, Any]) -> Topology:
    if "origin" in ref:
        return Topology.from_origin(ref["origin"])
    return Topology.from_dict(ref["document"], source="journal")


class Engine:
    """The live state of the clusters a service serves. Thread-safe; one lock orders every
    change, and the journal records them in that order."""

    def __init__(
        self,
        journal: Journal,
        *,
        snapshot_every: int = 5000,
        hold_grace: float = 120.0,
        on_change: Callable[[str, str], None] | None = None,
        rules: Any = None,
    ):
        self.journal = journal
        self.snapshot_every = snapshot_every
        self.hold_grace = hold_grace
        self.lock = threading.RLock()
        self.clusters: dict[str, ClusterRuntime] = {}
        self.default: str | None = None
        self._since_snapshot = 0
        #: Called (cluster, outcome) after each placement, for the metrics.
        self.on_change = on_change
        #: The health rules (defaults, with the site's overrides: ``load_rules``).
        self.rules = load_rules(rules)
        self.started = time.time()
        #: (cluster, job) -> (its GPUs as bytes, the hostlist of its nodes), for status.
        self._nodes_cache: dict[tuple[str, str], tuple[bytes, str]] = {}

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls,
        journal: Journal,
        clusters: Iterable[tuple[str, Callable[[], ClusterState]]] = (),
        **options: Any,
    ) -> Engine:
        """Replay the journal, then add each cluster the journal does not know yet (its
        initial state built by the callable, only then)."""
        engine = cls(journal, **options)
        recovered = journal.recover()
        if recovered.snapshot is not None:
            engine._load_snapshot(recovered.snapshot)
        for seq, event in recovered.events:
            try:
                engine.apply(event)
            except GpuplaceError as exc:
                raise JournalError(
                    f"{journal.path}: event {seq} ({event.get('op')}) does not replay: {exc}"
                ) from None
        for name, build in clusters:
            if name not in engine.clusters:
                state = build()
                with engine.lock:
                    engine._record(
                        {
                            "op": "cluster",
                            "cluster": name,
                            "topology": topology_ref(state.topology),
                            "state": state.snapshot(),
                        }
                    )
        if engine.default is None and engine.clusters:
            engine.default = next(iter(engine.clusters))
        return engine

    def _load_snapshot(self, body: dict[str, Any]) -> None:
        for name, doc in body.get("clusters", {}).items():
            self._create(name, doc["topology"], doc["state"])
            rt = self.clusters[name]
            rt.holds = {h["name"]: Hold.from_dict(h) for h in doc.get("holds", [])}

    def _create(self, name: str, ref: dict[str, Any], snapshot: dict[str, Any]) -> None:
        topology = build_topology(ref)
        state = ClusterState.restore(topology, snapshot, source=f"journal cluster {name}")
        rt = ClusterRuntime(name, state, ref)
        # The documents the state was restored from are its jobs' specs (checked by restore).
        for job in snapshot.get("jobs", ()):
            if isinstance(job, dict) and isinstance(job.get("spec"), dict):
                rt.spec_docs[job["name"]] = job["spec"]
        self.clusters[name] = rt
        if self.default is None:
            self.default = name

    def snapshot_body(self) -> Callable[[], dict[str, Any]]:
        """A function building a snapshot of the state now. What it needs is copied under the
        lock, cheaply (the core state is one copy of its arrays; holds are never changed in
        place, so a copy of the mapping is a copy of them; spec documents are reused), and
        built later on the journal's snapshot thread, off every request's path."""
        with self.lock:
            copies = {
                name: (rt.topology_ref, rt.state.copy(), dict(rt.holds), dict(rt.spec_docs))
                for name, rt in self.clusters.items()
            }

        def build() -> dict[str, Any]:
            return {
                "clusters": {
                    name: {
                        "topology": ref,
                        "state": state.snapshot(spec_docs=docs),
                        "holds": [h.doc for h in holds.values()],
                    }
                    for name, (ref, state, holds, docs) in copies.items()
                }
            }

        return build

    def take_snapshot(self) -> int:
        """Queue a snapshot of the state now in the journal; returns the event it covers."""
        with self.lock:
            return self.journal.snapshot(self.snapshot_body())

    # ------------------------------------------------------------------ events
    def apply(self, event: dict[str, Any], job: Job | None = None) -> None:
        """Apply one event to the in-memory state (live, or replaying the journal). ``job``:
        the live caller's parsed spec, saving a re-parse."""
        op = event.get("op")
        if op == "cluster":
            self._create(event["cluster"], event["topology"], event["state"])
            return
        rt = self.clusters[event["cluster"]]
        state = rt.state
        if op == "allocate":
            spec = job
            if spec is None and event.get("spec") is not None:
                spec = Job.from_dict(event["spec"], source=f"journal job {event['name']}")
            state.allocate(
                name=event["name"],
                gpus=np.asarray(event["gpus"], dtype=np.int64),
                job=spec,
                phase_slot=int(event.get("slot", 0)),
            )
            if spec is not None and isinstance(event.get("spec"), dict):
                rt.spec_docs[event["name"]] = event["spec"]
            if "hold" in event:
                rt.holds[event["name"]] = Hold.from_dict(event["hold"])
        elif op == "release":
            if state.job_gpus(event["name"]) is not None:
                state.release(event["name"])
            rt.holds.pop(event["name"], None)
            rt.proposals.pop(event["name"], None)
            rt.spec_docs.pop(event["name"], None)
        elif op == "replace":
            spec = job if job is not None else state.specs.get(event["name"])
            if event.get("spec") is not None and job is None:
                spec = Job.from_dict(event["spec"], source=f"journal job {event['name']}")
            if state.job_gpus(event["name"]) is not None:
                state.release(event["name"])
            rt.spec_docs.pop(event["name"], None)  # made again at the next snapshot
            if spec is not None and spec.gpus != len(event["gpus"]):
                spec = None  # Slurm ran it elsewhere: keep the GPUs, not the rank layout
            state.allocate(
                name=event["name"], gpus=np.asarray(event["gpus"], dtype=np.int64), job=spec
            )
        elif op == "hold":
            hold = rt.holds.get(event["name"])
            if hold is not None:  # a new Hold: a snapshot being built may hold the old one
                rt.holds[event["name"]] = dataclasses.replace(hold, **event["set"])
        elif op == "health":
            for c in event["changes"]:
                target = {c["kind"]: c["name"]}
                if c["condition"] == "failed":
                    state.fail(**target, reason=c.get("reason", ""))
                elif c["condition"] == "drained":
                    state.drain(**target, reason=c.get("reason", ""))
                elif c["condition"] == "degraded":
                    state.degrade(
                        factor=c["factor"], reason=c.get("reason") or "degraded", **target
                    )
                else:
                    state.recover(**target)
        else:
            raise InvalidState(f"unknown journal event {op!r}")

    def _record(self, event: dict[str, Any], job: Job | None = None) -> int:
        """Apply and journal one event (the caller holds the lock); returns its number."""
        self.journal.check()  # a failed journal: change nothing it would not record
        self.apply(event, job)
        seq = self.journal.append(event)
        self._since_snapshot += 1
        if self._since_snapshot >= self.snapshot_every:
            self._since_snapshot = 0
            self.journal.snapshot(self.snapshot_body())  # under the lock (an RLock)
        return seq

    # ------------------------------------------------------------------ queries
    def cluster(self, name: str | None) -> ClusterRuntime:
        key = name or self.default
        if key is None or key not in self.clusters:
            known = ", ".join(self.clusters) or "none"
            raise NotFound(f"no cluster {name!r} (clusters: {known})")
        return self.clusters[key]

    def status(self, cluster: str | None = None) -> dict[str, Any]:
        """Each cluster's GPUs, jobs (with their holds), unhealthy hardware, proposed repairs
        and Slurm follower, and the journal. What it reports is taken under the lock as
        copies that later changes do not touch (the core state copied on write, the holds
        immutable, the mappings copied): tens of microseconds with a thousand jobs. The
        answer is built from them after the lock is released, so a status poller never holds
        placements up while it is written."""
        with self.lock:
            names = [cluster] if cluster else list(self.clusters)
            views = []
            for name in names:
                rt = self.cluster(name)
                views.append(
                    (
                        rt.name,
                        rt.state.copy(),
                        dict(rt.holds),
                        dict(rt.proposals),
                        self._slurm_status(rt) if rt.slurm else None,
                    )
                )
            committed = self.journal.committed
        out = []
        for name, state, holds, proposals, slurm in views:
            topo = state.topology
            jobs: dict[str, Any] = {}
            for job, gpus in state.jobs.items():
                entry: dict[str, Any] = {
                    "gpus": len(gpus),
                    "nodes": self._nodes(name, job, gpus, topo),
                }
                hold = holds.get(job)
                if hold is not None:
                    entry["hold"] = hold.doc
                jobs[job] = entry
            out.append(
                {
                    "cluster": name,
                    "topology": topo.name,
                    "gpus": topo.num_gpus,
                    "free_gpus": state.free_gpus,
                    "jobs": jobs,
                    "unhealthy": state.unhealthy(),
                    "repairs_proposed": proposals,
                    **({"slurm": slurm} if slurm is not None else {}),
                }
            )
        return {
            "clusters": out,
            "journal": {
                "path": str(self.journal.path),
                "committed": committed,
                "queued": self.journal.pending(),
            },
            "uptime_s": time.time() - self.started,
        }

    def _nodes(self, cluster: str, job: str, gpus: np.ndarray, topology: Topology) -> str:
        """The hostlist of a job's nodes, remembered while its GPUs stay the same (status
        answers list every job; most did not change since the last one)."""
        key = (cluster, job)
        tag = gpus.tobytes()
        known = self._nodes_cache.get(key)
        if known is not None and known[0] == tag:
            return known[1]
        hosts = topology.hosts
        nodes = compress(sorted({hosts[h] for h in topology.host_of_gpu[gpus].tolist()}))
        if len(self._nodes_cache) >= NODES_CACHE:
            self._nodes_cache.clear()
        self._nodes_cache[key] = (tag, nodes)
        return nodes

    @staticmethod
    def _slurm_status(rt: ClusterRuntime) -> dict[str, Any]:
        f = rt.follow
        return {
            "target": rt.slurm.label if rt.slurm else None,
            "polls": f.polls,
            "last_poll": f.last_poll,
            "last_ok": f.last_ok,
            "last_error": f.last_error,
            "view_read_at": rt.view.read_at.isoformat() if rt.view else None,
        }

    def state_document(self, cluster: str | None = None) -> dict[str, Any]:
        with self.lock:
            return self.cluster(cluster).state.snapshot()

    def explain(self, job: Job, cluster: str | None = None) -> dict[str, Any]:
        with self.lock:
            return explain(self.cluster(cluster).state, job).to_dict()

    # ------------------------------------------------------------------ changes
    def place(
        self,
        job: Job,
        *,
        cluster: str | None = None,
        solver: str = "greedy",
        ticket: Ticket | None = None,
        dry_run: bool = False,
        slurm: ctld.SlurmRequest | None = None,
        hold: Hold | None = None,
        time_limit: float | None = None,
        per_node: int | None = None,
    ) -> tuple[Placement, int | None]:
        """Place ``job`` and hold its GPUs (unless ``dry_run``); returns the placement and the
        journal number to wait for. Solvers other than greedy run on a copy outside the lock,
        and the result is allocated only if its GPUs are still free (else placed again)."""
        rt = self.cluster(cluster)
        for attempt in range(3):
            fast = solver == "greedy" or attempt == 2
            with self.lock:
                if rt.state.job_gpus(job.name) is not None:
                    raise Conflict(f"job name {job.name!r} is in use on cluster {rt.name}")
                base = rt.state if fast else rt.state.scratch_copy()
                if fast:
                    placement = self._solve(rt, base, job, solver, slurm, time_limit, per_node)
                    if dry_run:
                        return placement, None
                    return placement, self._hold(rt, placement, ticket, hold)
            placement = self._solve(rt, base, job, solver, slurm, time_limit, per_node)
            if dry_run:
                return placement, None
            with self.lock:
                if rt.state.job_gpus(job.name) is not None:
                    raise Conflict(f"job name {job.name!r} is in use on cluster {rt.name}")
                free = rt.state.free_mask()
                if bool(free[placement.gpus].all()):
                    return placement, self._hold(rt, placement, ticket, hold)
        raise Conflict("the cluster kept changing under the solver; try again")  # pragma: no cover

    def _solve(
        self,
        rt: ClusterRuntime,
        state: ClusterState,
        job: Job,
        solver: str,
        slurm: ctld.SlurmRequest | None,
        time_limit: float | None,
        per_node: int | None = None,
    ) -> Placement:
        if slurm is not None and rt.view is not None:
            return ctld.place_slurm_job(
                state, job, slurm, rt.view, solver=solver, per_node=per_node
            ).placement
        return place(state, job, solver, time_limit=time_limit)

    def _hold(
        self, rt: ClusterRuntime, placement: Placement, ticket: Ticket | None, hold: Hold | None
    ) -> int:
        if ticket is not None:
            ticket.begin_commit()
        hold = hold or Hold(placement.job.name, "api", time.time())
        event: dict[str, Any] = {
            "op": "allocate",
            "cluster": rt.name,
            "name": placement.job.name,
            "gpus": placement.gpus.tolist(),
            "spec": placement.job.to_dict(),
            "hold": hold.to_dict(),
        }
        slot = int(placement.details.get("phase_slot", 0))
        if slot:
            event["slot"] = slot
        seq = self._record(event, placement.job)
        if self.on_change is not None:
            self.on_change(rt.name, "placed")
        return seq

    def release(
        self, name: str, *, cluster: str | None = None, ticket: Ticket | None = None
    ) -> tuple[dict[str, Any], int]:
        rt = self.cluster(cluster)
        with self.lock:
            gpus = rt.state.job_gpus(name)
            if gpus is None:
                raise NotFound(f"no job {name!r} on cluster {rt.name}")
            if ticket is not None:
                ticket.begin_commit()
            seq = self._record({"op": "release", "cluster": rt.name, "name": name})
        return {"cluster": rt.name, "job": name, "released_gpus": len(gpus)}, seq

    def repair(
        self,
        name: str,
        *,
        cluster: str | None = None,
        apply: bool = False,
        max_moves: int = 0,
        spares: bool | str | None = None,
        ticket: Ticket | None = None,
    ) -> tuple[dict[str, Any], int | None]:
        """Repair a job: proposed (computed on a copy) or applied (journaled)."""
        rt = self.cluster(cluster)
        with self.lock:
            if rt.state.job_gpus(name) is None:
                raise NotFound(f"no job {name!r} on cluster {rt.name}")
            trial = rt.state.copy()
            result = repair(trial, name, max_moves=max_moves, spares=spares)
            out = {**result.to_dict(), "applied": apply, **self._rank_hosts(result.placement)}
            if not apply:
                rt.proposals[name] = out
                return out, None
            if ticket is not None:
                ticket.begin_commit()
            seq = self._record(
                {
                    "op": "replace",
                    "cluster": rt.name,
                    "name": name,
                    "gpus": [int(g) for g in result.placement.gpus],
                },
                result.placement.job,
            )
            rt.proposals.pop(name, None)
        return out, seq

    @staticmethod
    def _rank_hosts(placement: Placement) -> dict[str, Any]:
        return {"rank_hosts": [r["host"] for r in placement.rank_table()]}

    # ------------------------------------------------------------------ health
    def ingest(
        self,
        results: list[Any],
        *,
        cluster: str | None = None,
        repair_mode: str = "propose",
        drain: bool = True,
        ticket: Ticket | None = None,
    ) -> tuple[dict[str, Any], int | None]:
        """Apply health evidence (readers' results) as ingest does, all or nothing; propose
        or apply the repair of every job hit. Returns the report and the journal number; the
        caller then drains the nodes in the scheduler (:meth:`scheduler_actions`)."""
        rt = self.cluster(cluster)
        with self.lock:
            findings, unmapped = judge_evidence(rt.state.topology, results, self.rules)
            trial = rt.state.copy()
            changes, unchanged, affected = apply_findings(trial, findings)
            seq = None
            if changes:
                if ticket is not None:
                    ticket.begin_commit()
                seq = self._record(
                    {
                        "op": "health",
                        "cluster": rt.name,
                        "changes": [
                            {
                                "kind": c.kind,
                                "name": c.name,
                                "condition": c.after,
                                "factor": c.factor,
                                "reason": c.reason,
                            }
                            for c in changes
                        ],
                    }
                )
            repairs: dict[str, Any] = {}
            for name in sorted(affected):
                try:
                    result, rseq = self.repair(name, cluster=rt.name, apply=repair_mode == "apply")
                    repairs[name] = result
                    seq = rseq or seq
                except GpuplaceError as exc:
                    repairs[name] = {"error": str(exc)}
            report = {
                "cluster": rt.name,
                "changes": [asdict(c) for c in changes],
                "unchanged": unchanged,
                "unmapped": unmapped,
                "affected": {k: [int(r) for r in v] for k, v in affected.items()},
                "repairs": repairs,
                "repair_mode": repair_mode,
                "hosts": sorted(
                    {
                        host
                        for c in changes
                        if c.after in ("failed", "drained")
                        and (host := self._host_of(rt.state, c.kind, c.name)) is not None
                    }
                ),
            }
        return report, seq

    @staticmethod
    def _host_of(state: ClusterState, kind: str, name: str) -> str | None:
        if kind == "host":
            return name
        if kind in ("gpu", "nic"):
            host = name.split(":", 1)[0]
            return host if host in state.topology.hosts else None
        return None

    def scheduler_actions(self, report: dict[str, Any]) -> list[dict[str, Any]]:
        """Drain the hosts an ingest failed or drained in Slurm (with a gpuplace reason), or
        taint them in Kubernetes; returns what was done, with the time each took."""
        rt = self.cluster(report["cluster"])
        done: list[dict[str, Any]] = []
        reasons: dict[str, str] = {}
        for c in report["changes"]:
            if c["after"] not in ("failed", "drained"):
                continue
            host = self._host_of(rt.state, c["kind"], c["name"])
            if host is not None and host not in reasons:
                # "gpuplace: XID 79 on GPU n01:4" (the full evidence stays in gpuplace's state).
                rule = str(c["reason"]).split(": ", 1)[0] or c["after"]
                reasons[host] = f"gpuplace: {rule} on {c['kind'].upper()} {c['name']}"
        for host, reason in sorted(reasons.items()):
            start = time.perf_counter()
            entry: dict[str, Any] = {"host": host, "reason": reason}
            try:
                if rt.slurm is not None:
                    rt.slurm.drain([host], reason)
                    entry["action"] = "slurm drain"
                elif rt.taint_command:
                    _taint(rt.taint_command, host, reason)
                    entry["action"] = "kubernetes taint"
                else:
                    continue
            except GpuplaceError as exc:
                entry["error"] = str(exc)
            entry["seconds"] = time.perf_counter() - start
            done.append(entry)
        return done

    # ------------------------------------------------------------------ Slurm
    def slurm_submit(
        self, body: dict[str, Any], *, ticket: Ticket | None = None
    ) -> tuple[dict[str, Any], int]:
        """Place a job a Slurm submission asks for (from the job_submit plugin) and hold it
        under a token the plugin writes into the job; answers with the nodes, the host of each
        rank and its GPU. Never calls Slurm: slurmctld is waiting on this answer."""
        rt = self.cluster(body.get("cluster") or None)
        if rt.view is None:
            raise Unavailable(
                f"cluster {rt.name}: no view of Slurm yet (the follower has not read slurmctld)"
            )
        request = ctld.SlurmRequest.from_dict(body)
        label = str(body.get("job_name") or "slurm-job")[:200]
        token = secrets.token_hex(8)
        name = f"slurm-hold-{token}"
        spec = body.get("spec")
        per = _gpus_per_node(rt.state.topology)
        asked = body.get("gres_per_node")
        if asked is not None and (not isinstance(asked, int) or not 0 < asked <= per):
            raise InvalidJob(f"gres_per_node: expected 1 to {per}, got {asked!r}")
        if spec:
            job = _job_from_text(str(spec), name)
        else:
            nodes = body.get("min_nodes")
            if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
                raise InvalidJob(
                    "give -N (whole nodes) or the job in #GPUPLACE lines of the batch script"
                )
            job = Job(name=name, tp=asked or per, dp=nodes)
        hold = Hold(
            name,
            "slurm",
            time.time(),
            token=token,
            label=label,
            user=request.user,
            grace=float(body.get("grace") or self.hold_grace),
        )
        # Slurm grants GPUs per node alike (--gres=gpu:k): the plan takes the same count on
        # every node, whole nodes first. Without GRES, Slurm hands out whole nodes only.
        gres = rt.view.gres
        if asked is not None:
            counts = [asked]
        elif not gres:
            if job.gpus % per:
                raise InvalidJob(
                    f"cluster {rt.name} has no gpu GRES: Slurm allocates whole nodes of {per} "
                    f"GPUs, and the job has {job.gpus} ranks"
                )
            counts = [per]
        else:
            counts = [k for k in range(min(per, job.gpus), 0, -1) if job.gpus % k == 0]
        placement: Placement | None = None
        seq: int | None = None
        problems: list[str] = []
        for k in counts:
            try:
                placement, seq = self.place(
                    job, cluster=rt.name, slurm=request, hold=hold, ticket=ticket, per_node=k
                )
                break
            except Infeasible as exc:
                problems.append(f"{k} per node: {exc}")
        if placement is None or seq is None:
            raise Infeasible(f"{label}: " + " | ".join(problems[:3]))
        per_node = job.gpus // len(placement.nodes)
        topo = placement.topology
        rows = placement.rank_table()
        whole = all(
            sum(1 for r in rows if r["host"] == h)
            == topo.node_types[topo.host_types[topo.hosts.index(h)]].gpus
            for h in placement.nodes
        )
        return {
            "cluster": rt.name,
            "token": token,
            "hold": name,
            "nodes": placement.nodes,
            "hostlist": placement.hostlist(),
            "rank_hosts": [r["host"] for r in rows],
            "rank_devices": [int(r["device"]) for r in rows],
            "ntasks": len(rows),
            "whole_nodes": whole,
            "gres_per_node": per_node if gres else None,
            "exclusive": whole,
        }, seq

    def reconcile_slurm(
        self,
        cluster: str,
        nodes: list[SlurmNode],
        jobs: list[SlurmJob],
        raw_jobs: list[dict[str, Any]],
        view: ctld.SlurmView,
    ) -> list[int]:
        """Bring the state in line with what slurmctld says: holds follow their jobs, jobs
        gpuplace did not place are allocated as ``slurm-<id>`` while they run, nodes Slurm
        drains or downs are out of service. Returns the journal numbers written."""
        rt = self.cluster(cluster)
        seqs: list[int] = []
        now = time.time()
        with self.lock:
            rt.view = view
            state = rt.state
            topo = state.topology
            by_token: dict[str, dict[str, Any]] = {}
            for record in raw_jobs:
                text = f"{record.get('admin_comment') or ''} {record.get('comment') or ''}"
                match = _TOKEN.search(text)
                if match:
                    by_token[match.group(1)] = record
            running = {j.job_id: j for j in jobs}
            # Holds: follow the job they became.
            claimed: set[int] = set()
            for hold in list(rt.holds.values()):
                if hold.origin != "slurm":
                    continue
                item = by_token.get(hold.token)
                if item is None:
                    gone = hold.slurm_job_id is not None or now - hold.created > (
                        hold.grace or self.hold_grace
                    )
                    if gone:
                        seqs.append(
                            self._record({"op": "release", "cluster": rt.name, "name": hold.name})
                        )
                    continue
                job_id = int(item["job_id"])
                claimed.add(job_id)
                job_state = _state_word(item.get("job_state"))
                changes: dict[str, Any] = {}
                if hold.slurm_job_id != job_id:
                    changes["slurm_job_id"] = job_id
                if job_state in _ENDED:
                    seqs.append(
                        self._record({"op": "release", "cluster": rt.name, "name": hold.name})
                    )
                    continue
                if job_state in _RUNNING and job_id in running and not hold.started:
                    changes["started"] = True
                    actual = _job_gpus(state, running[job_id], {n.name: n for n in nodes})
                    planned = state.job_gpus(hold.name)
                    planned_set = set() if planned is None else {int(g) for g in planned}
                    if actual and set(actual) != planned_set:
                        # Slurm chose the GPU indices inside the nodes (or other nodes): its
                        # truth is what is held from now on.
                        seqs.append(
                            self._record(
                                {
                                    "op": "replace",
                                    "cluster": rt.name,
                                    "name": hold.name,
                                    "gpus": actual,
                                }
                            )
                        )
                if changes:
                    seqs.append(
                        self._record(
                            {"op": "hold", "cluster": rt.name, "name": hold.name, "set": changes}
                        )
                    )
            # Jobs gpuplace did not place.
            by_node = {n.name: n for n in nodes}
            for job in jobs:
                if job.job_id in claimed:
                    continue
                name = f"slurm-{job.job_id}"
                if state.job_gpus(name) is not None:
                    continue
                gpus = _job_gpus(state, job, by_node)
                free = state.free_mask()
                usable = [g for g in gpus if free[g]]
                if usable:
                    seqs.append(
                        self._record(
                            {"op": "allocate", "cluster": rt.name, "name": name, "gpus": usable}
                        )
                    )
            for name in list(state.jobs):
                if (
                    name.startswith("slurm-")
                    and name[6:].isdigit()
                    and int(name[6:]) not in running
                ):
                    seqs.append(self._record({"op": "release", "cluster": rt.name, "name": name}))
            # Node health as Slurm sees it (gpuplace's own findings are left alone).
            current = {(u["kind"], u["name"]): u for u in state.unhealthy()}
            changes_out: list[dict[str, Any]] = []
            for node in nodes:
                if node.name not in topo.hosts:
                    continue
                mine = current.get(("host", node.name))
                wanted = node.out_of_service
                if wanted is not None and mine is None:
                    changes_out.append(
                        {
                            "kind": "host",
                            "name": node.name,
                            "condition": wanted,
                            "factor": 1.0,
                            "reason": f"slurm: {node.state}",
                        }
                    )
                elif (
                    wanted is None
                    and mine is not None
                    and str(mine.get("reason", "")).startswith("slurm:")
                ):
                    changes_out.append(
                        {"kind": "host", "name": node.name, "condition": "ok", "factor": 1.0}
                    )
            if changes_out:
                seqs.append(
                    self._record({"op": "health", "cluster": rt.name, "changes": changes_out})
                )
        return seqs


def _taint(command: list[str], host: str, reason: str) -> None:
    argv = [
        *command,
        "taint",
        "nodes",
        host,
        "gpuplace.io/unhealthy=true:NoSchedule",
        "--overwrite",
    ]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuplaceError(f"taint of {host} failed: {exc}") from None
    if out.returncode != 0:
        raise GpuplaceError(f"taint of {host} failed: {(out.stderr or out.stdout).strip()}")
    del reason


def _state_word(value: Any) -> str:
    if isinstance(value, list):
        return str(value[0]) if value else ""
    return str(value or "")


def _job_gpus(state: ClusterState, job: SlurmJob, nodes: dict[str, SlurmNode]) -> list[int]:
    """The GPUs a running Slurm job holds: its GRES indices, or whole nodes where Slurm gives
    none (a job without GRES on an exclusive or GRES-less node)."""
    topo = state.topology
    out: list[int] = []
    for host, held in zip(job.nodes, job.gpus, strict=True):
        if host not in topo.hosts:
            continue
        base = topo.host_gpus(host)
        node = nodes.get(host)
        if held is None or (node is not None and node.gpus == 0):
            indices = list(range(len(base)))
        else:
            indices = [i for i in held if i < len(base)]
        out.extend(int(base[i]) for i in indices)
    return sorted(set(out))


def _gpus_per_node(topology: Topology) -> int:
    counts = {topology.node_types[t].gpus for t in topology.host_types}
    return max(counts)


def _job_from_text(text: str, name: str) -> Job:
    """A job document given inline (YAML or JSON, or ``tp=8,pp=2,dp=4``), named ``name``."""
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise InvalidJob(f"the job document is over {MAX_SPEC_BYTES} bytes")
    stripped = text.strip()
    if re.fullmatch(r"[a-z]+=[0-9]{1,9}(,[a-z]+=[0-9]{1,9})*", stripped):
        dims = {k: int(v) for k, v in (p.split("=") for p in stripped.split(","))}
        doc: Any = {"parallelism": dims}
    else:
        doc = parse_yaml(stripped, "the job document", InvalidJob)
    if not isinstance(doc, dict):
        raise InvalidJob("the job document must be a mapping (as in a job file)")
    doc = {**doc, "name": name}
    return Job.from_dict(doc, source="#GPUPLACE job")
