"""Slurm: read a live cluster into a gpuplace state, and submit a job on gpuplace's nodes.

:func:`sync` builds a :class:`~gpuplace.ClusterState` from what Slurm reports: nodes,
their GPUs (GRES, typed or not) and states from ``sinfo --json``; running jobs with their nodes
and GPU indices from ``squeue --json``; the switch tree from ``scontrol show topology`` (or a
topology.conf); the inside of a host from an ``nvidia-smi topo -m`` file or a preset host type.
Hosts keep Slurm's node order (the order of its node table, which is how Slurm's own tree
selection breaks ties inside a leaf).

:func:`submission` turns a placement into an ``sbatch`` command: ``-w <hostlist> --exclusive``
with the job's node and task counts, ``SLURM_HOSTFILE`` (one line per rank, in rank order) so
that ``srun --distribution=arbitrary`` puts rank r on gpuplace's host, and a rank table giving
each rank's ``CUDA_VISIBLE_DEVICES``. :func:`submit` checks the command with
``sbatch --test-only`` first and submits only if Slurm would start it now on exactly those
nodes, so a node taken since the sync is an error and nothing is left queued.

Tested against Slurm 22.05 (Debian's slurmctld/slurmd with munge) on loopback.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from gpuplace._util.documents import (
    describe,
    parse_json,
    source_text,
    text_lines,
    write_atomically,
)
from gpuplace._util.hostlist import HostlistError, compress, expand
from gpuplace.cluster.state import ClusterState
from gpuplace.enums import Condition
from gpuplace.errors import GpuplaceError, InvalidJob, InvalidState, InvalidTopology
from gpuplace.io import read_nvidia_smi_topo, read_slurm_topology
from gpuplace.model.inventory import Fabric
from gpuplace.model.presets import PRESETS, build_preset
from gpuplace.model.topology import Topology
from gpuplace.placement.result import Placement

__all__ = [
    "SlurmError",
    "SlurmJob",
    "SlurmNode",
    "Submission",
    "read_sinfo",
    "read_squeue",
    "read_topology",
    "submission",
    "submit",
    "sync",
]

#: Seconds a Slurm command may take before gpuplace gives up on it.
COMMAND_TIMEOUT = 60.0
_GRES = re.compile(r"^gpu(?::(?P<type>[^:(]+))?:(?P<count>[0-9]{1,9})(?:\((?P<extra>[^)]*)\))?$")
#: Most GPUs one node's GRES may list (a GB200 NVL72 tray has 4, the largest hosts 16).
MAX_NODE_GPUS = 1024
_TEST_ONLY = re.compile(r"to start at (\S+) using \d+ processors on nodes (\S+) in partition")
_SUBMITTED = re.compile(r"^(\d+)(?:;\S+)?$")
#: Node states (lower case, sinfo's base state or flag) that take a node out of service.
_DOWN = {"down", "fail", "failing", "future", "unknown", "not_responding", "no_respond"}
#: (A node in a reservation, flag RESERVED, stays in service: whether a job may use it depends
#: on the job and the reservation, gpuplace.integrations.slurmctld.eligible decides.)
_DRAIN = {"drain", "drained", "draining", "maint", "reboot_requested"}


#: Most nodes one job may hold (Slurm's largest clusters have tens of thousands).
MAX_JOB_NODES = 200_000


class SlurmError(GpuplaceError):
    """Slurm refused or failed a command. (Output gpuplace cannot read is InvalidState.)"""


@dataclass
class SlurmNode:
    """One node as ``sinfo --json`` reports it."""

    name: str
    #: base state, lower case: idle, mixed, allocated, down, ...
    state: str
    flags: list[str] = field(default_factory=list)
    gpus: int = 0
    gpu_type: str | None = None
    #: indices of the GPUs in use (from ``gres_used``)
    gpus_used: list[int] = field(default_factory=list)
    #: partitions the node is in, and its active features (``-C`` matches these)
    partitions: list[str] = field(default_factory=list)
    features: list[str] = field(default_factory=list)
    #: True when the node has no gpu GRES and its GPUs come from the host type: a job on it
    #: holds it whole
    whole_node: bool = False

    @property
    def out_of_service(self) -> str | None:
        """'failed', 'drained' (the labels of :class:`gpuplace.Condition`) or None."""
        words = {self.state, *(f.lower() for f in self.flags)}
        if words & _DOWN:
            return Condition.Failed.label
        if words & _DRAIN:
            return Condition.Drained.label
        return None


@dataclass
class SlurmJob:
    """A running job as ``squeue --json`` reports it."""

    job_id: int
    name: str
    state: str
    nodes: list[str]
    #: per node (same order as ``nodes``), the GPU indices it holds, or None when not given
    gpus: list[list[int] | None]


def _indices(text: str, where: str) -> list[int]:
    """``0-2,5`` -> [0, 1, 2, 5]; ``N/A`` -> []."""
    if text in ("", "N/A"):
        return []
    out: list[int] = []
    for part in text.split(","):
        m = _INDEX_RANGE.match(part)
        if m is None:
            raise InvalidState(f"{where}: expected GPU indices like 0-2,5, got {describe(text)}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo or hi >= MAX_NODE_GPUS or len(out) + hi - lo + 1 > MAX_NODE_GPUS:
            raise InvalidState(
                f"{where}: GPU indices {describe(part)} run backwards or beyond {MAX_NODE_GPUS}"
            )
        out.extend(range(lo, hi + 1))
    return out


_INDEX_RANGE = re.compile(r"^([0-9]{1,9})(?:-([0-9]{1,9}))?$")


def _top_level_items(text: str) -> list[str]:
    """``text`` split at the commas outside parentheses (``gpu:a:1(IDX:0,2),gpu:b:1`` -> two
    items), in one pass: a lookahead for the closing parenthesis after each comma is
    quadratic on a long run of commas."""
    if "(" not in text:
        return text.split(",")
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def _gres_gpus(text: str, where: str) -> tuple[int, str | None, list[int]]:
    """GPU count, type and indices of a GRES string (``gpu:h100:8(S:0-1)``,
    ``gpu:3(IDX:0-2)``, ``gpu:a:1(IDX:0),gpu:b:2(IDX:4-5)``, ``(null)``)."""
    count, kind, used = 0, None, []
    for item in _top_level_items(text or ""):
        item = item.strip()
        if not item.startswith("gpu"):
            continue
        m = _GRES.match(item)
        if m is None:
            raise InvalidState(f"{where}: cannot read GRES {describe(item)}")
        count += int(m.group("count"))
        kind = kind or m.group("type")
        extra = m.group("extra") or ""
        if extra.startswith("IDX:"):
            used.extend(_indices(extra[4:], where))
    return count, kind, used


def _text(source: Any, what: str, error: type[GpuplaceError]) -> tuple[str, str]:
    """(name, text) of a path or an open file holding the output of ``what``, within the
    size limit of every reader."""
    return source_text(source, what, error)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    """``item[key]`` as text: a string, or nothing (absent, null)."""
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidState(f"{where}: {key}: expected a string, got {describe(value)}")
    return value


def _strings(item: dict[str, Any], key: str, where: str) -> list[str]:
    """``item[key]`` as a list of strings (absent or null: empty)."""
    value = item.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidState(f"{where}: {key}: expected a list of strings, got {describe(value)}")
    return value


def _load(source: Any, what: str) -> tuple[str, Any]:
    if isinstance(source, (dict, list)):
        return what, source
    name, text = _text(source, what, InvalidState)
    return name, parse_json(text, name, InvalidState)


def _reported_errors(doc: Any, name: str) -> None:
    """Slurm's ``--json`` answers carry an ``errors`` array (and exit 0) when slurmctld could
    not answer in full: say what it says instead of reading a partial answer."""
    errors = doc.get("errors") if isinstance(doc, dict) else None
    if not errors:
        return
    words = []
    for err in errors if isinstance(errors, list) else [errors]:
        if isinstance(err, dict):
            text = err.get("description") or err.get("error") or ""
            code = err.get("error_number") or err.get("error_code")
            words.append(f"{text} (error {code})" if code else str(text))
        else:
            words.append(str(err))
    raise SlurmError(f"{name}: Slurm reported errors: {'; '.join(w for w in words if w)}")


def read_sinfo(source: Any) -> list[SlurmNode]:
    """Read ``sinfo --json`` (a path, an open file or the parsed object), nodes in Slurm's
    order."""
    name, doc = _load(source, "sinfo --json")
    _reported_errors(doc, name)
    raw = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(raw, list):
        raise InvalidState(f'{name}: expected an object with "nodes" (sinfo --json)')
    nodes: list[SlurmNode] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"{name}: nodes[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidState(f"{where}: expected a node with a name")
        if item["name"] in seen:
            continue  # sinfo lists a node once per partition
        seen.add(item["name"])
        state = item.get("state")
        flags = _strings(item, "state_flags", where)
        if isinstance(state, list):  # newer Slurm: state is a list of words
            state, flags = (state[0] if state else "unknown"), [*state[1:], *flags]
        if not isinstance(state, str) or not all(isinstance(f, str) for f in flags):
            raise InvalidState(f"{where} ({item['name']}): state: expected a state string")
        gpus, kind, _ = _gres_gpus(_string(item, "gres", where), f"{where} gres")
        _, _, used = _gres_gpus(_string(item, "gres_used", where), f"{where} gres_used")
        if any(u >= gpus for u in used):
            raise InvalidState(f"{where} ({item['name']}): gres_used names GPUs beyond {gpus}")
        partitions = _strings(item, "partitions", where)
        features = item.get("active_features") or item.get("features") or ""
        if isinstance(features, list):
            if not all(isinstance(f, str) for f in features):
                raise InvalidState(f"{where}: features: expected strings, got {describe(features)}")
            features = ",".join(features)
        elif features is not None and not isinstance(features, str):
            raise InvalidState(f"{where}: features: expected a string, got {describe(features)}")
        nodes.append(
            SlurmNode(
                item["name"],
                state.lower(),
                list(flags),
                gpus,
                kind,
                used,
                partitions=list(partitions),
                features=[f for f in (features or "").split(",") if f],
            )
        )
    if not nodes:
        raise InvalidState(f"{name}: no nodes")
    return nodes


def read_squeue(source: Any) -> list[SlurmJob]:
    """Read ``squeue --json``: the jobs holding nodes (running, completing, suspended)."""
    name, doc = _load(source, "squeue --json")
    _reported_errors(doc, name)
    raw = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(raw, list):
        raise InvalidState(f'{name}: expected an object with "jobs" (squeue --json)')
    jobs = []
    for i, item in enumerate(raw):
        where = f"{name}: jobs[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("job_id"), int):
            raise InvalidState(f"{where}: expected a job with a job_id")
        state = item.get("job_state")
        state = state[0] if isinstance(state, list) and state else state
        if state not in ("RUNNING", "COMPLETING", "SUSPENDED"):
            continue
        hostlist = _string(item, "nodes", where)
        try:
            nodes = expand(hostlist, limit=MAX_JOB_NODES) if hostlist else []
        except HostlistError as exc:
            raise InvalidState(f"{where}: nodes: {exc}") from None
        detail = item.get("gres_detail") or []
        if not isinstance(detail, list):
            raise InvalidState(f"{where}: gres_detail: expected a list, got {describe(detail)}")
        gpus: list[list[int] | None] = [None] * len(nodes)
        if detail:
            if len(detail) != len(nodes):
                raise InvalidState(
                    f"{where}: gres_detail has {len(detail)} entries for {len(nodes)} nodes"
                )
            for k, d in enumerate(detail):
                if not isinstance(d, str):
                    raise InvalidState(
                        f"{where}: gres_detail[{k}]: expected a string, got {describe(d)}"
                    )
            gpus = [_gres_gpus(d, f"{where} gres_detail[{k}]")[2] for k, d in enumerate(detail)]
        jobs.append(SlurmJob(item["job_id"], str(item.get("name") or ""), state, nodes, gpus))
    return jobs


def read_topology(source: Any) -> Any:
    """Read ``scontrol show topology`` output or a topology.conf/topology.yaml into a
    :class:`gpuplace.io.Fabric`. scontrol's extra fields (``Level=``, and ``Nodes=`` on a
    switch that has ``Switches=``) are dropped first."""

    name, text = _text(source, "scontrol show topology", InvalidTopology)
    if "SwitchName=" in text and "Level=" in text:
        lines = []
        for line in text_lines(text):
            tokens = [t for t in line.split() if not t.startswith("Level=")]
            if any(t.startswith("Switches=") for t in tokens):
                tokens = [t for t in tokens if not t.startswith("Nodes=")]
            lines.append(" ".join(tokens))
        text = ""  # the original goes before the rewrite is joined
        text = "\n".join(lines) + "\n"
    source_of_text: Any = _TextSource(text, Path(name).name)
    return read_slurm_topology(source_of_text)


class _TextSource:
    """Text handed to a reader as an open file, without io.StringIO's copy of it (up to four
    bytes a character; a 64 MiB topology must stay within the readers' memory)."""

    def __init__(self, text: str, name: str):
        self.text, self.name = text, name

    def read(self, size: int = -1) -> str:
        return self.text if size < 0 or size >= len(self.text) else self.text[:size]


def _host_types() -> dict[str, dict[str, Any]]:
    """Node types of the presets, by name (dgx-h100, gb200-tray, ...)."""

    out: dict[str, dict[str, Any]] = {}
    for preset in PRESETS:
        try:
            doc = build_preset(preset)
        except GpuplaceError:
            continue
        out.update(doc["node_types"])
    return out


def sync(
    sinfo: Any,
    squeue: Any | None,
    topology: Any,
    *,
    name: str = "slurm",
    nvidia_smi: str | None = None,
    host_type: str | None = None,
    gpus_per_node: int | None = None,
) -> ClusterState:
    """Build the state of a Slurm cluster from ``sinfo --json``, ``squeue --json`` (None: GPU
    use from sinfo's ``gres_used`` only) and its topology (``scontrol show topology`` output or
    a topology.conf path, or a Fabric). Hosts keep Slurm's node order. Running jobs are
    allocated as ``slurm-<jobid>`` (GPUs of nodes a job holds whole, where Slurm gives no
    indices); GPUs in use that no job explains as ``slurm-busy-<node>``; down nodes are failed,
    drained ones drained.

    GRES is optional: on nodes without ``gpu`` GRES (a whole-node cluster) the GPUs per node
    come from ``gpus_per_node``, the host type or the nvidia-smi file, and any job on such a
    node holds all of them."""

    nodes = read_sinfo(sinfo)
    jobs = read_squeue(squeue) if squeue is not None else []
    fabric = topology if isinstance(topology, Fabric) else read_topology(topology)
    missing = [n.name for n in nodes if n.name not in fabric.hosts]
    if missing:
        raise InvalidTopology(
            f"{name}: Slurm nodes not in the topology: {compress(missing)} "
            "(give the topology.conf that covers every node)"
        )
    # Slurm's node order, and only the nodes Slurm reports.
    fabric.hosts = {n.name: fabric.hosts[n.name] for n in nodes}
    if nvidia_smi is not None and host_type is not None:
        raise InvalidTopology("give an nvidia-smi file or a host type, not both")
    node_type: Any = None
    types = _host_types() if host_type is not None else {}
    if host_type is not None and host_type not in types:
        raise InvalidTopology(
            f"unknown host type {host_type!r}; expected one of {', '.join(sorted(types))}"
        )
    if nvidia_smi is not None:
        node_type = read_nvidia_smi_topo(nvidia_smi)
    declared = (
        gpus_per_node
        if gpus_per_node is not None
        else types[host_type]["gpus"]
        if host_type is not None
        else node_type.gpus
        if node_type is not None
        else None
    )
    without_gpus = [n.name for n in nodes if n.gpus == 0]
    if without_gpus:
        if declared is None:
            raise InvalidTopology(
                f"{name}: nodes without gpu GRES: {compress(without_gpus)}; on a cluster that "
                "does not count GPUs as GRES give the GPUs per node (--gpus-per-node, "
                "--host-type or --nvidia-smi)"
            )
        for n in nodes:
            if n.gpus == 0:
                n.gpus, n.whole_node = int(declared), True
    source = (
        f"{nvidia_smi}: {declared} GPUs per host"
        if nvidia_smi is not None
        else f"host type {host_type} has {declared} GPUs"
        if host_type is not None
        else f"--gpus-per-node {declared}"
    )
    wrong = [n.name for n in nodes if declared is not None and n.gpus != declared]
    if wrong:
        raise InvalidTopology(f"{source}, but Slurm's GRES says otherwise on {compress(wrong)}")
    for n in nodes:
        fabric.hosts[n.name].gpus = n.gpus
    doc_topology = Topology.from_parts(
        node_type, fabric, name=name, sources=["sinfo --json", "slurm topology"]
    )
    if host_type is not None:
        doc = doc_topology.to_dict()
        doc["node_types"] = {host_type: types[host_type]}
        doc["nodes"] = [{**group, "type": host_type} for group in doc["nodes"]]
        doc_topology = Topology.from_dict(doc, source=name)
    state = ClusterState(doc_topology)

    by_name = {n.name: n for n in nodes}
    explained: dict[str, set[int]] = {n.name: set() for n in nodes}
    for job in jobs:
        gpus: list[int] = []
        for host, held in zip(job.nodes, job.gpus, strict=True):
            if host not in by_name:
                continue
            node = by_name[host]
            if node.whole_node:
                held = list(range(node.gpus))  # no GRES: any job holds the node whole
            elif held is None:
                # No GRES detail: the job holds the node whole only if Slurm says allocated.
                held = list(range(node.gpus)) if node.state == "allocated" else []
            base = state.topology.host_gpus(host)
            gpus.extend(int(base[i]) for i in held if i < node.gpus)
            explained[host].update(held)
        if gpus:
            state.allocate(name=f"slurm-{job.job_id}", gpus=sorted(set(gpus)))
    for node in nodes:
        base = state.topology.host_gpus(node.name)
        busy = set(node.gpus_used)
        if node.whole_node and node.state in ("mixed", "completing"):
            busy = set(range(node.gpus))
        if node.state == "allocated" and not busy:
            busy = set(range(node.gpus))  # held whole by a job without GRES
        rest = sorted(busy - explained[node.name])
        if rest:
            state.allocate(name=f"slurm-busy-{node.name}", gpus=[int(base[i]) for i in rest])
    failed = [n.name for n in nodes if n.out_of_service == Condition.Failed.label]
    drained = [n.name for n in nodes if n.out_of_service == Condition.Drained.label]
    if failed:
        state.fail(host=failed, reason="slurm: down")
    if drained:
        state.drain(host=drained, reason="slurm: drained")
    return state


# ---------------------------------------------------------------------------------- submit
@dataclass
class Submission:
    """What ``gpuplace slurm submit`` runs: the sbatch command and the files it needs."""

    argv: list[str]
    #: file name -> content; written into the submission directory before sbatch runs
    files: dict[str, str]
    #: environment added to sbatch's (SLURM_HOSTFILE and the rank table's path)
    env: dict[str, str]
    nodes: list[str]

    def render(self) -> str:
        """The exact command and files, as ``--dry-run`` prints them."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        out = [f"{env} {shlex.join(self.argv)}"]
        for fname, text in self.files.items():
            out.append(f"--- {fname}")
            out.append(text.rstrip("\n"))
        return "\n".join(out) + "\n"


#: What a job name may keep in a file name; anything else becomes "_".
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def file_stem(job_name: str) -> str:
    """A file name stem for one submission of ``job_name``, unique and harmless: the name
    with anything but letters, digits, ``.``, ``_`` and ``-`` replaced (so ``../../x`` or
    ``/etc/x`` cannot leave the directory), then the time and a random suffix (so submitting
    the same job twice never overwrites the files the first submission's job still reads)."""
    safe = _UNSAFE.sub("_", job_name).lstrip(".")[:80] or "job"
    return f"{safe}.{datetime.now():%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


def submission(
    placement: Placement,
    sbatch_args: Sequence[str],
    *,
    directory: str | Path,
    partition: str | None = None,
    gres: bool = True,
    clusters: str | None = None,
) -> Submission:
    """The sbatch command for a placement. ``sbatch_args`` end with the batch script; the
    files go into ``directory`` (``<job>.<time>-<random>.hostfile``: one host per rank in rank
    order for ``SLURM_HOSTFILE``; ``....ranks``: ``rank host CUDA_VISIBLE_DEVICES`` per rank).
    ``gres=False`` (a cluster without gpu GRES) asks for whole nodes only; ``clusters`` is
    passed as ``--clusters``."""
    if not sbatch_args:
        raise InvalidJob("give the batch script (and any sbatch options before it) after --")
    for flag in (
        "-w",
        "--nodelist",
        "-N",
        "--nodes",
        "-n",
        "--ntasks",
        "-m",
        "--distribution",
        "-M",
        "--clusters",
    ):
        if any(a == flag or a.startswith(flag + "=") for a in sbatch_args[:-1]):
            where = "give it to gpuplace (-M)" if flag in ("-M", "--clusters") else "leave it out"
            raise InvalidJob(f"{flag} is set by gpuplace from the placement; {where}")
    job = placement.job.name
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in job):
        raise InvalidJob(f"job name {job!r}: control characters are not allowed")
    topo = placement.topology
    rows = placement.rank_table()
    hosts = placement.nodes
    whole = all(
        sum(1 for r in rows if r["host"] == h)
        == topo.node_types[topo.host_types[topo.hosts.index(h)]].gpus
        for h in hosts
    )
    directory = Path(directory).resolve()
    stem = file_stem(job)
    hostfile = directory / f"{stem}.hostfile"
    ranks = directory / f"{stem}.ranks"
    if hostfile.parent != directory or ranks.parent != directory:  # pragma: no cover - by design
        raise InvalidJob(f"job name {job!r} would write outside {directory}")
    files = {
        str(hostfile): "".join(f"{r['host']}\n" for r in rows),
        str(ranks): "".join(f"{r['rank']} {r['host']} {r['device']}\n" for r in rows),
    }
    gpus_per_node = max(topo.node_types[topo.host_types[topo.hosts.index(h)]].gpus for h in hosts)
    argv = [
        "sbatch",
        "--parsable",
        "--exclusive",
        f"--nodelist={compress(hosts)}",
        f"--nodes={len(hosts)}",
        f"--ntasks={len(rows)}",
        "--distribution=arbitrary",
    ]
    if gres:
        argv.append(f"--gres=gpu:{gpus_per_node}")
    argv.append(f"--job-name={job}")
    if partition:
        argv.append(f"--partition={partition}")
    if clusters:
        argv.append(f"--clusters={clusters}")
    argv += list(sbatch_args)
    env = {"SLURM_HOSTFILE": str(hostfile), "GPUPLACE_RANKS": str(ranks)}
    if not whole:
        # Ranks do not fill their nodes: each rank must pick its own GPU.
        env["GPUPLACE_PER_RANK_CUDA"] = "1"
    return Submission(argv, files, env, hosts)


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
        )
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found: is Slurm's client installed?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {COMMAND_TIMEOUT:.0f} s") from None


def run_json(command: str, *args: str) -> Any:
    """Run ``command args --json`` and return its parsed answer."""
    out = _run([command, *args, "--json"], dict(os.environ))
    if out.returncode != 0:
        raise SlurmError(f"{command} --json failed: {out.stderr.strip() or out.stdout.strip()}")
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError as exc:
        raise SlurmError(f"{command} --json: not JSON ({exc.msg})") from None


def show_topology() -> str:
    """``scontrol show topology`` of the live cluster."""
    out = _run(["scontrol", "show", "topology"], dict(os.environ))
    if out.returncode != 0 or "SwitchName=" not in out.stdout:
        raise SlurmError(
            "scontrol show topology gave no switches (is TopologyPlugin=topology/tree set?); "
            "give the topology.conf with --topology"
        )
    return out.stdout


def submit(
    sub: Submission,
    *,
    start_within: float = 60.0,
    explain: Callable[[list[str]], str] | None = None,
) -> int:
    """Check with ``sbatch --test-only`` that Slurm would start the job now on exactly the
    planned nodes, write the files, submit; returns the job id. On any refusal raises
    :class:`SlurmError` and leaves nothing behind (no files, no queued job). ``explain``
    (the planned nodes -> a sentence) names the node that stands in the way and why."""
    env = {**os.environ, **sub.env}
    written: list[Path] = []

    def why() -> str:
        if explain is None:
            return ""
        try:
            text = explain(sub.nodes)
        except GpuplaceError as exc:
            text = f"(could not ask Slurm why: {exc})"
        return f"; {text}" if text else ""

    try:
        for fname, text in sub.files.items():
            path = Path(fname)
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():  # the names are unique: never overwrite another job's file
                raise SlurmError(f"{path} exists already; submit again")
            written.append(path)
            write_atomically(path, text)
        test = _run([sub.argv[0], "--test-only", *sub.argv[1:]], env)
        answer = (test.stderr + test.stdout).strip()
        match = _TEST_ONLY.search(answer)
        if test.returncode != 0 or match is None:
            raise SlurmError(f"Slurm refused the job on {compress(sub.nodes)}: {answer}{why()}")
        start = datetime.fromisoformat(match.group(1))
        if start > datetime.now() + timedelta(seconds=start_within):
            raise SlurmError(
                f"Slurm would not start the job on {compress(sub.nodes)} now (earliest "
                f"{match.group(1)}){why() or ': a node was taken since the state was read; sync again'}"
            )
        out = _run(sub.argv, env)
        job_id = _SUBMITTED.match(out.stdout.strip())
        if out.returncode != 0 or job_id is None:
            raise SlurmError(f"sbatch refused the job: {(out.stderr or out.stdout).strip()}")
        return int(job_id.group(1))
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
