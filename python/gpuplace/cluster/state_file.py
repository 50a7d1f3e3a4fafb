"""The state file: a checksummed JSON snapshot of a :class:`gpuplace.ClusterState` (jobs and
their specs, unhealthy hardware, spares, the policy, MIG geometry and shared hosts, the
queue of jobs waiting to be placed, and the cluster it belongs to), written atomically;
a truncated, corrupted or foreign file is refused with InvalidState naming the field."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core
from gpuplace._util.documents import (
    MAX_DOCUMENT_BYTES,
    Checker,
    describe,
    directory_lock,
    parse_json,
    read_bytes,
    write_atomically,
)
from gpuplace.cluster import mig, share
from gpuplace.enums import ComponentKind, Condition, Health
from gpuplace.errors import InvalidJob, InvalidState, StateConflict
from gpuplace.model.job import Job
from gpuplace.model.policy import ClusterPolicy
from gpuplace.model.storage import io_demands

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState

__all__ = ["STATE_FORMAT", "cluster_of", "load", "restore", "save", "snapshot"]

STATE_FORMAT = "gpuplace.state/2"
_READABLE = ("gpuplace.state/1", STATE_FORMAT)
_KINDS = {k.label: k for k in ComponentKind.members()}
#: The conditions a component is recorded with (a component that is ok is not recorded).
_RECORDED = {c.label: c for c in Condition.members() if c != Condition.Ok}


def snapshot(
    state: ClusterState, *, spec_docs: Mapping[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A JSON-able dictionary of the whole state. ``spec_docs``: documents of job specs made
    already (``Job.to_dict()`` by job name; a long-running service keeps the ones it journaled),
    used instead of making them again (the bulk of the time for a thousand jobs)."""
    docs = spec_docs or {}
    components = []
    for kind, a, b, condition, factor, reason in state._core.components():
        entry: dict[str, Any] = {"kind": kind.label, "condition": condition.label}
        if kind == _core.ComponentKind.Gpu:
            entry["gpu"] = a
        elif kind == _core.ComponentKind.Switch:
            entry["level"] = state.topology.levels[a].name
            entry["name"] = state.topology.domain_names[a][b]
        else:
            entry["name"] = state.component_name(kind, a, b)
        if condition == _core.Condition.Degraded:
            entry["factor"] = factor
        if reason:
            entry["reason"] = reason
        components.append(entry)
    jobs = []
    for name, gpus in state.jobs.items():
        job: dict[str, Any] = {"name": name, "gpus": gpus.tolist()}
        if name in state.specs:
            doc = docs.get(name)
            job["spec"] = doc if doc is not None else state.specs[name].to_dict()
        if state.phase_slots.get(name):
            job["phase_slot"] = state.phase_slots[name]
        jobs.append(job)
    out: dict[str, Any] = {
        "format": STATE_FORMAT,
        "topology": {
            "name": state.topology.name,
            "gpus": state.topology.num_gpus,
            "fingerprint": state.topology.fingerprint,
        },
        "health": {"components": components},
        "spares": state.spares.tolist(),
        "jobs": jobs,
    }
    origin = getattr(state.topology, "origin", None)
    if origin is not None:
        out["cluster"] = dict(origin)
    if state.policy:
        out["policy"] = state.policy.to_dict()
    if state.mig is not None:
        out["mig"] = state.mig.to_dict()
    if state.shared is not None:
        out["shared"] = state.shared.to_dict()
    if state.queue:
        out["queue"] = [
            {"spec": q.job.to_dict(), **({"reason": q.reason} if q.reason else {})}
            for q in state.queue.values()
        ]
    return out


def _written_with(cluster: Any) -> str:
    """`` (it was written with preset P -p K=V ...)`` from a state's ``cluster`` record, or
    "" when it has none (values shown bounded: the file is not trusted)."""
    if not isinstance(cluster, dict):
        return ""
    parts = []
    if "preset" in cluster:
        parts.append(f"preset {_short(cluster['preset'])}")
    elif "file" in cluster:
        parts.append(f"the topology file {_short(cluster['file'])}")
    params = cluster.get("params")
    if isinstance(params, dict):
        parts += [f"-p {_short(k)}={_short(v)}" for k, v in list(params.items())[:8]]
    return f" (it was written with {' '.join(parts)})" if parts else ""


def _short(value: Any) -> str:
    """A scalar as written (at most 60 characters), anything else :func:`describe`d."""
    if isinstance(value, str | int | float | bool):
        text = str(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return describe(value)


def restore(state: ClusterState, snapshot: Any, *, source: str | None = None) -> ClusterState:
    """Fill the empty ``state`` from :func:`snapshot`'s form (format /1 or /2); raises
    InvalidState naming the field."""

    topology = state.topology

    c = Checker(InvalidState, source)
    snap = c.mapping(snapshot, "")
    if snap.get("format") not in _READABLE:
        raise c.fail(
            "format", f"expected one of {', '.join(_READABLE)}, got {snap.get('format')!r}"
        )
    topo = c.mapping(snap.get("topology"), "topology")
    if topo.get("fingerprint") != topology.fingerprint:
        if topo.get("name") == topology.name and topo.get("gpus") == topology.num_gpus:
            # Same name and size: an option or a file changed (bandwidths, routing, ...).
            how = _written_with(snap.get("cluster"))
            raise c.fail(
                "topology",
                f"the state belongs to another description of topology {topology.name!r} "
                f"({topology.num_gpus} GPUs): its hardware differs (levels, bandwidths, "
                f"routing, node types or options){how}; load it with the topology it was "
                "written with",
            )
        raise c.fail(
            "topology",
            f"the state belongs to topology {topo.get('name')!r} with {topo.get('gpus')} GPUs, "
            f"not to {topology.name!r} with {topology.num_gpus} GPUs (fingerprints differ)",
        )
    if "policy" in snap:
        state.policy = ClusterPolicy.from_dict(c.mapping(snap["policy"], "policy"), c, "policy.")
        state.policy.check(topology, c, "policy.")
    # Jobs first: a job may still hold GPUs that failed under it, waiting for a repair.
    for i, job in enumerate(c.sequence(snap.get("jobs", []), "jobs")):
        entry = c.mapping(job, f"jobs[{i}]")
        name = c.string(entry.get("name"), f"jobs[{i}].name")
        gpus = [
            c.integer(g, f"jobs[{i}].gpus[{k}]", minimum=0)
            for k, g in enumerate(c.sequence(entry.get("gpus"), f"jobs[{i}].gpus"))
        ]
        spec = None
        if "spec" in entry:
            try:
                spec = Job.from_dict(entry["spec"], source=f"jobs[{i}].spec")
                compiled = spec.compile(topology)
            except InvalidJob as exc:
                raise c.fail(f"jobs[{i}].spec", str(exc)) from None
            if spec.gpus != len(gpus):
                raise c.fail(
                    f"jobs[{i}].spec",
                    f"has {spec.gpus} ranks but the job holds {len(gpus)} GPUs",
                )
        # With its spec, the job's flows (collectives and storage traffic) load the fabric.
        try:
            io = io_demands(topology, spec)
            state._core.allocate(
                name,
                np.asarray(gpus, dtype=np.int64),
                None if spec is None else compiled,
                io or None,
            )
        except (InvalidState, InvalidJob) as exc:
            raise c.fail(f"jobs[{i}]", str(exc)) from None
        if spec is not None:
            state.specs[name] = spec
        if "phase_slot" in entry:
            state.phase_slots[name] = c.integer(
                entry["phase_slot"], f"jobs[{i}].phase_slot", minimum=0
            )
    health = c.mapping(snap.get("health", {}), "health")
    for status in (Health.Failed, Health.Drained):
        key = status.label
        ids = [
            c.integer(g, f"health.{key}[{i}]", minimum=0)
            for i, g in enumerate(c.sequence(health.get(key, []), f"health.{key}"))
        ]
        if ids and max(ids) >= topology.num_gpus:
            raise c.fail(f"health.{key}", f"GPU {max(ids)} does not exist")
        if ids:
            state._set_health(ids, status)
    for i, raw in enumerate(c.sequence(health.get("components", []), "health.components")):
        p = f"health.components[{i}]"
        entry = c.mapping(raw, p)
        kind = entry.get("kind")
        condition = _RECORDED.get(str(entry.get("condition")))
        if kind not in _KINDS:
            raise c.fail(f"{p}.kind", f"expected one of {', '.join(_KINDS)}, got {kind!r}")
        if condition is None:
            raise c.fail(
                f"{p}.condition",
                f"expected one of {', '.join(_RECORDED)}, got {entry.get('condition')!r}",
            )
        target: int | str
        if _KINDS[kind] == ComponentKind.Gpu:
            target = c.integer(entry.get(kind), f"{p}.{kind}", minimum=0)
        elif _KINDS[kind] == ComponentKind.Switch:
            level = c.string(entry.get("level"), f"{p}.level")
            target = f"{level}:{c.string(entry.get('name'), f'{p}.name')}"
        else:
            target = c.string(entry.get("name"), f"{p}.name")
        targets: dict[str, Any] = {kind: target, "reason": str(entry.get("reason", ""))}
        try:
            if condition == Condition.Degraded:
                factor = c.number(entry.get("factor"), f"{p}.factor", positive=True)
                state.degrade(factor=factor, **targets)
            else:
                state._event(condition, targets)
        except InvalidState as exc:
            raise c.fail(p, str(exc)) from None
    if "mig" in snap:
        mig.restore(state, snap["mig"], c)
    if "shared" in snap:
        share.restore(state, snap["shared"], c)
    for i, raw in enumerate(c.sequence(snap.get("queue", []), "queue")):
        entry = c.mapping(raw, f"queue[{i}]")
        c.keys(entry, f"queue[{i}]", {"spec", "reason"})
        try:
            queued = Job.from_dict(entry.get("spec"), source=f"queue[{i}].spec")
            queued.compile(topology)
            state.enqueue(queued, str(entry.get("reason", "")))
        except (InvalidJob, InvalidState) as exc:
            raise c.fail(f"queue[{i}]", str(exc)) from None
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


def cluster_of(path: str | Path) -> dict[str, Any] | None:
    """The cluster a state file remembers (``{"preset": name, "params": {...}}`` or
    ``{"file": path}`` with the path resolved against the state file), or None. The file
    is checked as :func:`load` does."""
    body = _read_state_document(path)
    cluster = body.get("cluster") if isinstance(body, dict) else None
    if not isinstance(cluster, dict):
        return None
    out = dict(cluster)
    if isinstance(out.get("file"), str):
        out["file"] = str(Path(path).parent / out["file"])
    return out


def save(state: ClusterState, path: str | Path) -> None:
    """Write the state file atomically, with a checksum over its content. A topology
    file the cluster came from is recorded relative to the state file's directory.

    If this state was loaded from ``path`` (or last saved there) and the file has changed
    since, another process wrote it: :class:`gpuplace.errors.StateConflict` is raised and
    nothing is written. The check and the write happen under a lock on the file's directory,
    so no other ``save`` slips in between."""
    body = snapshot(state)
    cluster = body.get("cluster")
    if cluster and isinstance(cluster.get("file"), str):
        target = Path(path).resolve().parent
        cluster["file"] = os.path.relpath(Path(cluster["file"]).resolve(), target)
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    checksum = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    document = {"checksum": checksum, "state": body}
    key = str(Path(path).resolve())
    with directory_lock(path):
        if key in state.file_checksums:
            on_disk = _checksum_on_disk(path)
            if on_disk != state.file_checksums[key]:
                raise StateConflict(
                    f"{path}: the state file changed since this state was "
                    f"{'loaded' if on_disk else 'loaded, and was removed'} (another process "
                    "wrote it); nothing was written: load it again and redo the change, or use "
                    "ClusterState.transaction()"
                )
        write_atomically(path, json.dumps(document, sort_keys=True) + "\n")
        state.file_checksums[key] = checksum


_CHECKSUM_HEAD = re.compile(r'^\{"checksum": "(sha256:[0-9a-f]{64})"')


def _checksum_on_disk(path: str | Path) -> str | None:
    """The checksum a state file declares (read from its first bytes, where ``save`` puts it),
    or None when there is no file."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            head = handle.read(128)
    except FileNotFoundError:
        return None
    match = _CHECKSUM_HEAD.match(head)
    if match is not None:
        return match.group(1)
    try:
        data = read_bytes(path, InvalidState, limit=MAX_DOCUMENT_BYTES)
        document = parse_json(data.decode("utf-8"), str(path), InvalidState)
    except (InvalidState, ValueError):
        return "unreadable"
    value = document.get("checksum") if isinstance(document, dict) else None
    return value if isinstance(value, str) else "unreadable"


def load(state: ClusterState, path: str | Path) -> ClusterState:
    """Fill the empty ``state`` from a state file written by :func:`save`; a truncated,
    corrupted or foreign file is refused with InvalidState and nothing is loaded. The file's
    checksum is remembered, so that :func:`save` to the same path can tell whether another
    process wrote it in between."""
    document = _read_state_document(path, with_checksum=True)
    body, checksum = document
    restore(state, body, source=str(path))
    state.file_checksums[str(Path(path).resolve())] = checksum
    return state


def _read_state_document(path: str | Path, *, with_checksum: bool = False) -> Any:
    """The checked body of a state file (with its checksum when asked): refuses truncated or
    corrupted files."""
    source = str(path)
    if not Path(path).exists():
        raise InvalidState(f"{source}: no such state file")
    data = read_bytes(path, InvalidState)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InvalidState(
            f"{source}: line {line}: not a valid state file (not UTF-8: corrupted)"
        ) from None
    document = parse_json(
        text, source, InvalidState, what="not a valid state file (truncated or corrupted JSON)"
    )
    c = Checker(InvalidState, source)
    doc = c.mapping(document, "")
    body = doc.get("state")
    checksum = doc.get("checksum")
    if not isinstance(checksum, str) or not checksum.startswith("sha256:"):
        raise c.fail("checksum", "missing; expected 'sha256:<hex>'")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if "sha256:" + hashlib.sha256(canonical.encode()).hexdigest() != checksum:
        raise c.fail("checksum", "does not match the content: the file is corrupted")
    return (body, checksum) if with_checksum else body
