"""Cluster state: which GPUs are free, allocated to which job, failed or drained.

The counters live in the Rust core and are kept incrementally. Every change is all or
nothing. Snapshots are plain JSON-able dictionaries; state files add a format version and a
checksum and are written atomically, so a crash never leaves a half-written file and a
corrupted file is refused instead of half-loaded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core
from gpuplace._validate import Checker, write_atomically
from gpuplace.errors import InvalidState

if TYPE_CHECKING:
    from gpuplace.placement import Placement
    from gpuplace.topology import Topology

__all__ = ["STATE_FORMAT", "ClusterState"]

STATE_FORMAT = "gpuplace.state/1"
_HEALTH = {"ok": 0, "failed": 1, "drained": 2}


class ClusterState:
    """Allocation and health of every GPU of one topology."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self._core = _core.ClusterState(topology._core)

    def copy(self) -> ClusterState:
        out = ClusterState.__new__(ClusterState)
        out.topology = self.topology
        out._core = self._core.copy()
        return out

    # ----------------------------------------------------------------- queries
    @property
    def free_gpus(self) -> int:
        """Number of GPUs that are unallocated and healthy."""
        return int(self._core.total_free)

    def free_mask(self) -> np.ndarray:
        return self._core.free_mask()

    def free_counts(self, level: int | str) -> np.ndarray:
        """Free healthy GPUs per domain of a level."""
        lvl = level if isinstance(level, int) else self.topology.level_index(level)
        return self._core.free_counts(lvl)

    @property
    def jobs(self) -> dict[str, np.ndarray]:
        """Allocated jobs: name -> GPU of each rank."""
        return dict(self._core.jobs())

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

    def release(self, name: str) -> np.ndarray:
        """Free a job's GPUs; returns them."""
        return self._core.release(name)

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

    # ----------------------------------------------------------------- persistence
    def snapshot(self) -> dict[str, Any]:
        """A JSON-able dictionary of the whole state."""
        health = self.health()
        return {
            "format": STATE_FORMAT,
            "topology": {
                "name": self.topology.name,
                "gpus": self.topology.num_gpus,
                "fingerprint": self.topology.fingerprint,
            },
            "health": {
                "failed": np.flatnonzero(health == _HEALTH["failed"]).tolist(),
                "drained": np.flatnonzero(health == _HEALTH["drained"]).tolist(),
            },
            "jobs": [{"name": name, "gpus": gpus.tolist()} for name, gpus in self.jobs.items()],
        }

    @classmethod
    def restore(
        cls, topology: Topology, snapshot: Any, *, source: str | None = None
    ) -> ClusterState:
        """Rebuild a state from :meth:`snapshot`; raises InvalidState naming the field."""
        c = Checker(InvalidState, source)
        snap = c.mapping(snapshot, "")
        if snap.get("format") != STATE_FORMAT:
            raise c.fail("format", f"expected {STATE_FORMAT!r}, got {snap.get('format')!r}")
        topo = c.mapping(snap.get("topology"), "topology")
        if topo.get("fingerprint") != topology.fingerprint:
            raise c.fail(
                "topology",
                f"the state belongs to topology {topo.get('name')!r} with {topo.get('gpus')} GPUs, "
                f"not to {topology.name!r} with {topology.num_gpus} GPUs (fingerprints differ)",
            )
        state = cls(topology)
        health = c.mapping(snap.get("health", {}), "health")
        for key in ("failed", "drained"):
            ids = [
                c.integer(g, f"health.{key}[{i}]", minimum=0)
                for i, g in enumerate(c.sequence(health.get(key, []), f"health.{key}"))
            ]
            if ids and max(ids) >= topology.num_gpus:
                raise c.fail(f"health.{key}", f"GPU {max(ids)} does not exist")
            state._set_health(ids, _HEALTH[key])
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
        return state

    def save(self, path: str | Path) -> None:
        """Write the state file atomically, with a checksum over its content."""
        body = self.snapshot()
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
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InvalidState(f"{source}: no such state file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidState(f"{source}: cannot read: {exc}") from None
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidState(
                f"{source}: line {exc.lineno}: not a valid state file (truncated or corrupted JSON: {exc.msg})"
            ) from None
        c = Checker(InvalidState, source)
        doc = c.mapping(document, "")
        body = doc.get("state")
        checksum = doc.get("checksum")
        if not isinstance(checksum, str) or not checksum.startswith("sha256:"):
            raise c.fail("checksum", "missing; expected 'sha256:<hex>'")
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        if "sha256:" + hashlib.sha256(text.encode()).hexdigest() != checksum:
            raise c.fail("checksum", "does not match the content: the file is corrupted")
        return cls.restore(topology, body, source=source)

    def __repr__(self) -> str:
        return (
            f"ClusterState({self.topology.name!r}: {len(self.jobs)} jobs, "
            f"{self.free_gpus}/{self.topology.num_gpus} GPUs free)"
        )
