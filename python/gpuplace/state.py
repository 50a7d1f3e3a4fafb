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

import hashlib
import json
import os
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core
from gpuplace._validate import Checker, write_atomically
from gpuplace.errors import InvalidState

if TYPE_CHECKING:
    from gpuplace.job import Job
    from gpuplace.placement import Placement
    from gpuplace.pricing import PricingView
    from gpuplace.topology import Topology

__all__ = ["STATE_FORMAT", "ClusterState", "Nics", "nics_of"]

STATE_FORMAT = "gpuplace.state/2"
_READABLE = ("gpuplace.state/1", STATE_FORMAT)
_HEALTH = {"ok": 0, "failed": 1, "drained": 2}
#: Component kinds and condition codes of the core (``ClusterState.set_condition``).
_KINDS = {"gpu": 0, "host": 1, "nic": 2, "switch": 3}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}
_CONDITIONS = {"ok": 0, "degraded": 1, "failed": 2, "drained": 3}
_CONDITION_NAMES = {v: k for k, v in _CONDITIONS.items()}
#: Bandwidth factor of a component degraded by ECC errors or heat when no figure is given: a
#: mild penalty, so the hardware is used only when it pays.
DEFAULT_SOFT_FACTOR = 0.9


class Nics:
    """The NICs of a topology: dense ids, names (``host:nic``) and each GPU's NIC."""

    def __init__(self, topology: Topology):
        names: list[str] = []
        gpu_nic = np.full(topology.num_gpus, -1, dtype=np.int64)
        first_gpu = 0
        for host, tname in zip(topology.hosts, topology.host_types, strict=True):
            nt = topology.node_types[tname]
            base = len(names)
            names.extend(f"{host}:{nic}" for nic in nt.nics)
            if nt.nics and nt.gpu_nic is not None:
                gpu_nic[first_gpu : first_gpu + nt.gpus] = base + np.asarray(nt.gpu_nic)
            first_gpu += nt.gpus
        self.names = names
        self.index = {n: i for i, n in enumerate(names)}
        self.gpu_nic = gpu_nic


_NICS: weakref.WeakKeyDictionary[Topology, Nics] = weakref.WeakKeyDictionary()


def nics_of(topology: Topology) -> Nics:
    """The NIC table of a topology (cached)."""
    nics = _NICS.get(topology)
    if nics is None:
        nics = _NICS[topology] = Nics(topology)
    return nics


class ClusterState:
    """Allocation and health of every GPU of one topology."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self._core = _core.ClusterState(topology._core, nics_of(topology).gpu_nic)
        #: Job name -> its spec, for jobs allocated from a placement (repair uses it).
        self.specs: dict[str, Job] = {}

    def copy(self) -> ClusterState:
        out = ClusterState.__new__(ClusterState)
        out.topology = self.topology
        out._core = self._core.copy()
        out.specs = dict(self.specs)
        return out

    # ----------------------------------------------------------------- queries
    @property
    def free_gpus(self) -> int:
        """Number of GPUs that are unallocated and healthy."""
        return int(self._core.total_free)

    def free_mask(self) -> np.ndarray:
        return self._core.free_mask()

    def pricing_view(self) -> PricingView:
        """What solvers price on: usable GPUs, degraded GPUs, side factors and path
        bandwidths, derived by the core (see :mod:`gpuplace.pricing`)."""
        from gpuplace.pricing import pricing_view

        return pricing_view(self)

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
        """Health code per GPU: 0 ok, 1 failed, 2 drained."""
        return self._core.health()

    @property
    def occupancy(self) -> float:
        """Fraction of the cluster's GPUs that are allocated."""
        allocated = sum(len(g) for g in self.jobs.values())
        return allocated / self.topology.num_gpus

    # ----------------------------------------------------------------- changes
    def allocate(
        self, placement: Placement | None = None, *, name: str | None = None, gpus: Any = None
    ) -> None:
        """Allocate a placement (or ``name`` + ``gpus``); raises InvalidState and changes
        nothing if any GPU is taken, failed or drained, or the job name is in use."""
        if placement is not None:
            if placement.topology is not self.topology:
                raise InvalidState("the placement was made for another topology than this state's")
            name, gpus = placement.job.name, placement.gpus
        if name is None or gpus is None:
            raise InvalidState("allocate needs a placement, or a name and GPUs")
        self._core.allocate(name, np.asarray(gpus, dtype=np.int64))
        if placement is not None:
            self.specs[name] = placement.job

    def release(self, name: str) -> np.ndarray:
        """Free a job's GPUs; returns them."""
        gpus = self._core.release(name)
        self.specs.pop(name, None)
        return gpus

    def _set_health(self, gpus: Iterable[int], code: int) -> dict[str, np.ndarray]:
        affected = self._core.set_health(np.asarray(list(gpus), dtype=np.int64), code)
        return {name: ranks for name, ranks in affected}

    def fail_gpus(self, gpus: Iterable[int]) -> dict[str, np.ndarray]:
        """Mark GPUs failed; returns the jobs holding any of them -> affected ranks."""
        return self._set_health(gpus, _HEALTH["failed"])

    def drain_gpus(self, gpus: Iterable[int]) -> dict[str, np.ndarray]:
        """Take GPUs out of service (an operator's drain); returns the affected jobs."""
        return self._set_health(gpus, _HEALTH["drained"])

    def recover_gpus(self, gpus: Iterable[int]) -> None:
        """Return GPUs to service."""
        self._set_health(gpus, _HEALTH["ok"])

    # ----------------------------------------------------------------- health events
    def fail(self, **targets: Any) -> dict[str, np.ndarray]:
        """Mark hardware failed: ``gpu=``, ``host=`` (or ``node=``), ``nic=``, ``switch=``,
        each one name or a list, and an optional ``reason=``. All or nothing: an unknown name
        raises InvalidState naming it and changes nothing. Returns the jobs on the GPUs
        affected -> their ranks there."""
        return self._event("failed", targets)

    def drain(self, **targets: Any) -> dict[str, np.ndarray]:
        """Take hardware out of service (an operator's drain); as :meth:`fail`. Jobs keep
        running on drained GPUs until repaired or released, but no solver uses them."""
        return self._event("drained", targets)

    def recover(self, **targets: Any) -> dict[str, np.ndarray]:
        """Return hardware to ok (clears failed, drained and degraded); as :meth:`fail`."""
        return self._event("ok", targets)

    def degrade(
        self,
        *,
        loss: float | str | None = None,
        factor: float | None = None,
        width: tuple[int, int] | None = None,
        speed: tuple[float, float] | None = None,
        **targets: Any,
    ) -> dict[str, np.ndarray]:
        """Mark hardware degraded: it stays usable but every path through it is slower.

        The bandwidth factor comes from ``loss`` (packet loss rate, 0.01 or ``"1%"``; mapped
        by the cost model's loss curve, 1 % halves the goodput), ``factor`` (0 < f <= 1, a
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
            factors.append(_core.loss_factor(rate))
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
        return self._event("degraded", targets, factor=max(min(factors), 1e-3), reason=text)

    def _event(
        self,
        condition: str,
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
        affected = self._core.set_condition(kinds, a, b, _CONDITIONS[condition], factor, reason)
        return {name: ranks for name, ranks in affected}

    def _components(self, targets: dict[str, Any]) -> list[tuple[int, int, int]]:
        """Resolve ``gpu=/host=/node=/nic=/switch=`` names to (kind, a, b) triples."""
        out: list[tuple[int, int, int]] = []
        for key, value in targets.items():
            if value is None:
                continue
            values = value if isinstance(value, list | tuple | set | np.ndarray) else [value]
            for v in values:
                if key == "gpu":
                    out.append((0, self.resolve_gpu(v), 0))
                elif key in ("host", "node"):
                    out.append((1, self._host(v), 0))
                elif key == "nic":
                    nics = nics_of(self.topology)
                    if v not in nics.index:
                        raise InvalidState(
                            f"unknown NIC {v!r} (NICs are named host:nic, "
                            f"e.g. {_example(nics.names)})"
                        )
                    out.append((2, nics.index[v], 0))
                elif key == "switch":
                    out.append((3, *self.resolve_switch(v)))
                else:
                    raise InvalidState(
                        f"unknown hardware kind {key!r}; use gpu, host, nic or switch"
                    )
        return out

    def _host(self, name: Any) -> int:
        index = self.topology._host_index.get(str(name))
        if index is None:
            raise InvalidState(f"unknown host {name!r} in cluster {self.topology.name!r}")
        return index

    def resolve_gpu(self, gpu: Any) -> int:
        """A GPU id from an int or ``"host:index"``."""
        if isinstance(gpu, int | np.integer) and not isinstance(gpu, bool):
            if not 0 <= int(gpu) < self.topology.num_gpus:
                raise InvalidState(
                    f"GPU {gpu} does not exist (the cluster has {self.topology.num_gpus})"
                )
            return int(gpu)
        text = str(gpu)
        if text.isdigit():
            return self.resolve_gpu(int(text))
        host, _, local = text.rpartition(":")
        gpus = self.topology.host_gpus(host) if host in self.topology._host_index else None
        if gpus is None or not local.isdigit() or int(local) >= len(gpus):
            raise InvalidState(
                f"unknown GPU {gpu!r} (give an id or host:index, e.g. {self.topology.hosts[0]}:0)"
            )
        return int(gpus[int(local)])

    def resolve_switch(self, name: Any) -> tuple[int, int]:
        """(level, domain) of a switch named ``"su003"`` or ``"leaf:su003"``."""
        text = str(name)
        topo = self.topology
        levels = range(topo.node_level + 1, len(topo.levels))
        wanted_level, _, short = text.partition(":") if ":" in text else ("", "", text)
        hits = [
            (lvl, topo.domain_names[lvl].index(short))
            for lvl in levels
            if (not wanted_level or topo.levels[lvl].name == wanted_level)
            and short in topo.domain_names[lvl]
        ]
        if not hits:
            above = ", ".join(topo.levels[lvl].name for lvl in levels) or "none"
            raise InvalidState(
                f"unknown switch {name!r} "
                f"(switches are domains of the levels above the host: {above})"
            )
        if len(hits) > 1:
            raise InvalidState(f"switch {name!r} names domains at several levels; write level:name")
        return hits[0]

    def component_name(self, kind: int, a: int, b: int) -> str:
        if kind == 0:
            return f"{self.topology.host_of(a)}:{self.topology.local_index(a)}"
        if kind == 1:
            return self.topology.hosts[a]
        if kind == 2:
            return nics_of(self.topology).names[a]
        return f"{self.topology.levels[a].name}:{self.topology.domain_names[a][b]}"

    def unhealthy(self) -> list[dict[str, Any]]:
        """Hardware that is not ok: kind, name, condition, factor, reason."""
        return [
            {
                "kind": _KIND_NAMES[kind],
                "name": self.component_name(kind, a, b),
                "condition": _CONDITION_NAMES[code],
                "factor": factor,
                "reason": reason,
            }
            for kind, a, b, code, factor, reason in self._core.components()
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
                int(g) for g in self.topology.host_gpus(self.topology.hosts[self._host(h)])
            )
        if per is not None:
            try:
                level = self.topology.level_index(per)
            except KeyError:
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
    def snapshot(self) -> dict[str, Any]:
        """A JSON-able dictionary of the whole state."""
        components = []
        for kind, a, b, code, factor, reason in self._core.components():
            entry: dict[str, Any] = {"kind": _KIND_NAMES[kind], "condition": _CONDITION_NAMES[code]}
            if kind == 0:
                entry["gpu"] = a
            elif kind == 3:
                entry["level"] = self.topology.levels[a].name
                entry["name"] = self.topology.domain_names[a][b]
            else:
                entry["name"] = self.component_name(kind, a, b)
            if code == _CONDITIONS["degraded"]:
                entry["factor"] = factor
            if reason:
                entry["reason"] = reason
            components.append(entry)
        jobs = []
        for name, gpus in self.jobs.items():
            job: dict[str, Any] = {"name": name, "gpus": gpus.tolist()}
            if name in self.specs:
                job["spec"] = self.specs[name].to_dict()
            jobs.append(job)
        out: dict[str, Any] = {
            "format": STATE_FORMAT,
            "topology": {
                "name": self.topology.name,
                "gpus": self.topology.num_gpus,
                "fingerprint": self.topology.fingerprint,
            },
            "health": {"components": components},
            "spares": self.spares.tolist(),
            "jobs": jobs,
        }
        origin = getattr(self.topology, "origin", None)
        if origin is not None:
            out["cluster"] = dict(origin)
        return out

    @classmethod
    def restore(
        cls, topology: Topology, snapshot: Any, *, source: str | None = None
    ) -> ClusterState:
        """Rebuild a state from :meth:`snapshot` (format /1 or /2); raises InvalidState
        naming the field."""
        from gpuplace.errors import InvalidJob
        from gpuplace.job import Job

        c = Checker(InvalidState, source)
        snap = c.mapping(snapshot, "")
        if snap.get("format") not in _READABLE:
            raise c.fail(
                "format", f"expected one of {', '.join(_READABLE)}, got {snap.get('format')!r}"
            )
        topo = c.mapping(snap.get("topology"), "topology")
        if topo.get("fingerprint") != topology.fingerprint:
            raise c.fail(
                "topology",
                f"the state belongs to topology {topo.get('name')!r} with {topo.get('gpus')} GPUs, "
                f"not to {topology.name!r} with {topology.num_gpus} GPUs (fingerprints differ)",
            )
        state = cls(topology)
        # Jobs first: a job may still hold GPUs that failed under it, waiting for a repair.
        for i, job in enumerate(c.sequence(snap.get("jobs", []), "jobs")):
            entry = c.mapping(job, f"jobs[{i}]")
            name = c.string(entry.get("name"), f"jobs[{i}].name")
            gpus = [
                c.integer(g, f"jobs[{i}].gpus[{k}]", minimum=0)
                for k, g in enumerate(c.sequence(entry.get("gpus"), f"jobs[{i}].gpus"))
            ]
            try:
                state._core.allocate(name, np.asarray(gpus, dtype=np.int64))
            except InvalidState as exc:
                raise c.fail(f"jobs[{i}]", str(exc)) from None
            if "spec" in entry:
                try:
                    spec = Job.from_dict(entry["spec"], source=f"jobs[{i}].spec")
                except InvalidJob as exc:
                    raise c.fail(f"jobs[{i}].spec", str(exc)) from None
                if spec.gpus != len(gpus):
                    raise c.fail(
                        f"jobs[{i}].spec",
                        f"has {spec.gpus} ranks but the job holds {len(gpus)} GPUs",
                    )
                state.specs[name] = spec
        health = c.mapping(snap.get("health", {}), "health")
        for key in ("failed", "drained"):
            ids = [
                c.integer(g, f"health.{key}[{i}]", minimum=0)
                for i, g in enumerate(c.sequence(health.get(key, []), f"health.{key}"))
            ]
            if ids and max(ids) >= topology.num_gpus:
                raise c.fail(f"health.{key}", f"GPU {max(ids)} does not exist")
            if ids:
                state._set_health(ids, _HEALTH[key])
        for i, raw in enumerate(c.sequence(health.get("components", []), "health.components")):
            p = f"health.components[{i}]"
            entry = c.mapping(raw, p)
            kind = entry.get("kind")
            condition = entry.get("condition")
            if kind not in _KINDS:
                raise c.fail(f"{p}.kind", f"expected one of {', '.join(_KINDS)}, got {kind!r}")
            if condition not in ("degraded", "failed", "drained"):
                raise c.fail(
                    f"{p}.condition", f"expected degraded, failed or drained, got {condition!r}"
                )
            if kind == "gpu":
                target = c.integer(entry.get("gpu"), f"{p}.gpu", minimum=0)
            elif kind == "switch":
                level = c.string(entry.get("level"), f"{p}.level")
                target = f"{level}:{c.string(entry.get('name'), f'{p}.name')}"
            else:
                target = c.string(entry.get("name"), f"{p}.name")
            reason = entry.get("reason", "")
            try:
                if condition == "degraded":
                    factor = c.number(entry.get("factor"), f"{p}.factor", positive=True)
                    state.degrade(factor=factor, reason=str(reason) or "degraded", **{kind: target})
                else:
                    state._event(condition, {kind: target}, reason=str(reason))
            except InvalidState as exc:
                raise c.fail(p, str(exc)) from None
        spares = [
            c.integer(g, f"spares[{i}]", minimum=0)
            for i, g in enumerate(c.sequence(snap.get("spares", []), "spares"))
        ]
        if spares:
            try:
                state._core.set_spare(np.asarray(spares, dtype=np.int64), True)
            except InvalidState as exc:
                raise c.fail("spares", str(exc)) from None
        return state

    @staticmethod
    def cluster_of(path: str | Path) -> dict[str, Any] | None:
        """The cluster a state file remembers (``{"preset": name, "params": {...}}`` or
        ``{"file": path}`` with the path resolved against the state file), or None. The file
        is checked as :meth:`load` does."""
        body = _read_state_document(path)
        cluster = body.get("cluster") if isinstance(body, dict) else None
        if not isinstance(cluster, dict):
            return None
        out = dict(cluster)
        if isinstance(out.get("file"), str):
            out["file"] = str(Path(path).parent / out["file"])
        return out

    def save(self, path: str | Path) -> None:
        """Write the state file atomically, with a checksum over its content. A topology
        file the cluster came from is recorded relative to the state file's directory."""
        body = self.snapshot()
        cluster = body.get("cluster")
        if cluster and isinstance(cluster.get("file"), str):
            target = Path(path).resolve().parent
            cluster["file"] = os.path.relpath(Path(cluster["file"]).resolve(), target)
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        document = {
            "checksum": "sha256:" + hashlib.sha256(text.encode()).hexdigest(),
            "state": body,
        }
        write_atomically(path, json.dumps(document, sort_keys=True) + "\n")

    @classmethod
    def load(cls, topology: Topology, path: str | Path) -> ClusterState:
        """Read a state file written by :meth:`save`; a truncated, corrupted or foreign file is
        refused with InvalidState and nothing is loaded."""
        return cls.restore(topology, _read_state_document(path), source=str(path))

    def __repr__(self) -> str:
        return (
            f"ClusterState({self.topology.name!r}: {len(self.jobs)} jobs, "
            f"{self.free_gpus}/{self.topology.num_gpus} GPUs free)"
        )


def _read_state_document(path: str | Path) -> Any:
    """The checked body of a state file: refuses truncated or corrupted files."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidState(f"{source}: no such state file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidState(f"{source}: cannot read: {exc}") from None
    try:
        document = json.loads(text)
    except RecursionError:
        raise InvalidState(f"{source}: not a valid state file (nested too deeply)") from None
    except json.JSONDecodeError as exc:
        raise InvalidState(
            f"{source}: line {exc.lineno}: not a valid state file "
            f"(truncated or corrupted JSON: {exc.msg})"
        ) from None
    c = Checker(InvalidState, source)
    doc = c.mapping(document, "")
    body = doc.get("state")
    checksum = doc.get("checksum")
    if not isinstance(checksum, str) or not checksum.startswith("sha256:"):
        raise c.fail("checksum", "missing; expected 'sha256:<hex>'")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if "sha256:" + hashlib.sha256(canonical.encode()).hexdigest() != checksum:
        raise c.fail("checksum", "does not match the content: the file is corrupted")
    return body


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


def _example(names: list[str]) -> str:
    return names[0] if names else "host:mlx5_0"
