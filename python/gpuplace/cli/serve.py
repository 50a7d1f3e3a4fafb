"""``gpuplace serve``: run the live placement service; ``gpuplace service ...``: talk to it.

The service listens on a Unix socket (default) or loopback TCP, holds the state of each
cluster it serves (a preset, a topology file, a state file, or a live Slurm cluster it
follows), journals every change to SQLite (WAL) before answering, and answers place, release,
repair, explain, status and health; see docs/schedulers.md for deploying it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Any

import click

from gpuplace.cli.common import (
    emit,
    format_option,
    load_cluster,
    param_option,
    state_or_cluster,
    with_optional_cluster,
)
from gpuplace.cluster.state import ClusterState
from gpuplace.errors import InvalidState
from gpuplace.integrations import slurm as sl
from gpuplace.integrations import slurmctld as ctld
from gpuplace.model.job import Job
from gpuplace.model.topology import Topology
from gpuplace.service.app import Limits, Service
from gpuplace.service.client import Client
from gpuplace.service.engine import Engine
from gpuplace.service.follow import LogFollower, SlurmFollower
from gpuplace.service.journal import Journal
from gpuplace.service.server import Server, listen_tcp, listen_unix, raise_fd_limit

__all__ = ["extender_cmd", "serve_cmd", "service_group"]

DEFAULT_SOCKET = "/run/gpuplace/gpuplace.sock"
#: Collections of generation 1 between two full collections while serving (Python's default
#: is 10).
FULL_GC_EVERY = 1000


def _read_token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise InvalidState(f"{path}: cannot read the token: {exc.strerror}") from None
    if len(token) < 16:
        raise InvalidState(f"{path}: the token is shorter than 16 characters")
    return token


def _slurm_targets(
    follow_slurm: bool, names: tuple[str, ...], timeout: float
) -> list[tuple[str, ctld.Slurmctld]]:
    out: list[tuple[str, ctld.Slurmctld]] = []
    if follow_slurm:
        out.append(("slurm", ctld.Slurmctld(timeout=timeout)))
    for spec in names:
        name, sep, conf = spec.partition("=")
        if not name:
            raise click.BadParameter(f"{spec!r}: expected NAME or NAME=SLURM_CONF")
        target = (
            ctld.Slurmctld(conf=conf, timeout=timeout)
            if sep
            else ctld.Slurmctld(cluster=name, timeout=timeout)
        )
        out.append((name, target))
    return out


@click.command("serve")
@click.option(
    "--journal",
    "journal_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The service's journal (SQLite, WAL); created if missing, replayed at start.",
)
@click.option(
    "--durability",
    type=click.Choice(["process", "power"]),
    default="process",
    show_default=True,
    help="What an acknowledged change survives: 'process', the service's end however it ends "
    "(kill -9, a crash; SQLite synchronous=NORMAL); 'power', a power cut or OS crash too "
    "(an fsync per group commit; synchronous=FULL). See docs/schedulers.md.",
)
@click.option(
    "--socket",
    "socket_path",
    default=None,
    type=click.Path(dir_okay=False),
    help=f"Unix socket to listen on (default {DEFAULT_SOCKET} unless --listen is given).",
)
@click.option("--socket-mode", default="0660", show_default=True, help="Socket permissions.")
@click.option("--socket-group", default=None, help="Group that may connect to the socket.")
@click.option(
    "--listen",
    default=None,
    help="HOST:PORT for TCP (127.0.0.1 unless a token or TLS with client certificates is set).",
)
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option(
    "--tls-client-ca",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Require client certificates signed by this CA (kube-scheduler's extender TLS).",
)
@click.option("--cluster", "-c", "clusters", multiple=True, help="A preset or topology file.")
@click.option("--nodes", type=int, default=None, help="Preset size in hosts.")
@click.option("--racks", type=int, default=None, help="Preset size in racks (gb200-nvl72).")
@param_option
@click.option(
    "--state",
    "state_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Start from this state file (only when the journal is new).",
)
@click.option("--slurm", "follow_slurm", is_flag=True, help="Follow this host's Slurm cluster.")
@click.option(
    "--slurm-cluster",
    "slurm_clusters",
    multiple=True,
    help="Follow another Slurm cluster: NAME (reached with -M) or NAME=SLURM_CONF.",
)
@click.option("--topology", "topology_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--host-type", default=None, help="Host type of the Slurm nodes (dgx-h100, ...).")
@click.option("--nvidia-smi", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--gpus-per-node", type=click.IntRange(1), default=None)
@click.option("--poll", type=click.FloatRange(0.1), default=2.0, show_default=True)
@click.option("--slurm-timeout", type=click.FloatRange(0.5), default=5.0, show_default=True)
@click.option(
    "--follow-log",
    "follow_logs",
    multiple=True,
    help="Kernel log to tail for XIDs (PATH or HOST=PATH); repeat for several.",
)
@click.option(
    "--repair",
    "repair_mode",
    type=click.Choice(["none", "propose", "apply"]),
    default="propose",
    show_default=True,
    help="What to do for jobs hit by a health change.",
)
@click.option(
    "--rules",
    "rules_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Site health rules over the defaults (e.g. pci_bus_ids per host type for XIDs).",
)
@click.option(
    "--k8s-taint-command",
    default=None,
    help="Command that taints Kubernetes nodes (e.g. 'kubectl --context prod').",
)
@click.option(
    "--extender-prefix",
    default="/k8s",
    show_default=True,
    help="URL prefix of the kube-scheduler extender verbs ('' to turn them off).",
)
@click.option("--solver", "-s", default="greedy", show_default=True)
@click.option("--workers", type=click.IntRange(1, 256), default=4, show_default=True)
@click.option("--queue", type=click.IntRange(1), default=256, show_default=True)
@click.option("--max-body", type=click.IntRange(1024), default=1 << 20, show_default=True)
@click.option("--request-timeout", type=click.FloatRange(0.1), default=10.0, show_default=True)
@click.option("--idle-timeout", type=click.FloatRange(0.5), default=5.0, show_default=True)
@click.option("--hold-grace", type=click.FloatRange(1), default=120.0, show_default=True)
@click.option("--snapshot-every", type=click.IntRange(1), default=5000, show_default=True)
@click.option("--log-level", default="info", show_default=True)
@format_option
def serve_cmd(**o: Any) -> None:
    """Run the live placement service (stop it with SIGTERM or Ctrl-C); with --format json,
    where it listens is one JSON line on stdout once it does."""
    builders: list[tuple[str, Any]] = []
    for spec in o["clusters"]:
        topology = load_cluster(spec, o["nodes"], o["racks"])
        builders.append((topology.name, _from_topology(topology, o["state_path"])))
    if not o["clusters"] and o["state_path"] is not None:
        state = state_or_cluster(o["state_path"], None, None, None, new=False)
        builders.append((state.topology.name, lambda: state))

    def announce(urls: list[str], clusters: list[str]) -> None:
        if o["fmt"] == "json":
            emit({"listening": urls, "clusters": clusters, "journal": o["journal_path"]})

    _serve(o, builders, announce)


def _serve(
    o: dict[str, Any],
    builders: list[tuple[str, Any]],
    announce: Any = None,
) -> None:
    """Run the service with the options of ``serve`` (``o``) on the clusters ``builders``
    make; ``announce(urls, clusters)`` is told where it listens, and what it serves, once it
    does."""
    logging.basicConfig(
        level=getattr(logging, str(o["log_level"]).upper(), logging.INFO),
        format="%(asctime)s gpuplace serve: %(levelname)s %(message)s",
    )
    token = _read_token(o["token_file"])
    tls = o["tls_cert"] is not None
    if tls != (o["tls_key"] is not None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    targets = _slurm_targets(o["follow_slurm"], o["slurm_clusters"], o["slurm_timeout"])
    for name, target in targets:
        builders.append((name, _from_slurm(name, target, o)))
    if not builders and not Path(o["journal_path"]).exists():
        raise click.UsageError("give a cluster (--cluster, --slurm or --slurm-cluster)")

    journal = Journal(o["journal_path"], durability=o["durability"])
    engine = Engine.open(
        journal,
        builders,
        snapshot_every=o["snapshot_every"],
        hold_grace=o["hold_grace"],
        rules=o["rules_path"],
    )
    for name, target in targets:
        engine.clusters[name].slurm = target
    if o["k8s_taint_command"]:
        for rt in engine.clusters.values():
            if rt.slurm is None:
                rt.taint_command = o["k8s_taint_command"].split()
    limits = Limits(
        max_body=o["max_body"],
        timeout=o["request_timeout"],
        workers=o["workers"],
        queue=o["queue"],
    )
    service = Service(
        engine,
        limits=limits,
        token=token,
        extender_prefix=o["extender_prefix"] or None,
        solver=o["solver"],
    )
    sockets = []
    if o["listen"] is not None:
        host, _, port = o["listen"].rpartition(":")
        if not host or not port.isdigit():
            raise click.BadParameter("expected HOST:PORT", param_hint="--listen")
        sockets.append(
            listen_tcp(host.strip("[]"), int(port), token=token, tls=o["tls_client_ca"] is not None)
        )
    if o["socket_path"] is not None or o["listen"] is None:
        sockets.append(
            listen_unix(
                o["socket_path"] or DEFAULT_SOCKET,
                mode=int(o["socket_mode"], 8),
                group=o["socket_group"],
            )
        )
    ssl: dict[str, Any] = {}
    if tls:
        ssl = {"ssl_certfile": o["tls_cert"], "ssl_keyfile": o["tls_key"]}
        if o["tls_client_ca"]:
            ssl.update(ssl_ca_certs=o["tls_client_ca"], ssl_cert_reqs=2)  # CERT_REQUIRED
    unix_paths = [s.getsockname() for s in sockets if s.family == socket.AF_UNIX]
    raise_fd_limit()
    followers: list[Any] = [
        SlurmFollower(engine, name, o["poll"], on_poll=service.metrics.on_poll)
        for name, _ in targets
    ]
    if o["follow_logs"]:
        followers.append(
            LogFollower(
                engine, engine.default or "", list(o["follow_logs"]), repair_mode=o["repair_mode"]
            )
        )
    for follower in followers:
        follower.start()
    server = Server(service, sockets, idle_timeout=o["idle_timeout"], ssl=ssl)
    if announce is not None:
        announce(
            [
                str(s.getsockname())
                if s.family == socket.AF_UNIX
                else f"http{'s' if tls else ''}://{s.getsockname()[0]}:{s.getsockname()[1]}"
                for s in sockets
            ],
            list(engine.clusters),
        )
    # What start-up built lives as long as the service: out of the cyclic collector's way,
    # so its full collections stay short (they stalled requests for tens of milliseconds).
    gc.collect()
    gc.freeze()
    # What lives after start-up (the held jobs' specs and holds, the server's machinery: some
    # 20,000 to 80,000 objects) made each full collection cost 8 to 40 ms of CPU, with the GIL
    # held, one every few seconds at 1,000 requests/s. Young cycles are still collected as
    # usual (generations 0 and 1); the oldest generation once per FULL_GC_EVERY collections of
    # generation 1 (minutes at that rate) instead of every ten.
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_GC_EVERY)
    where = ", ".join(str(s.getsockname()) for s in sockets)
    logging.getLogger("gpuplace.serve").info(
        "serving %s on %s (journal %s, event %d)",
        ", ".join(engine.clusters),
        where,
        journal.path,
        journal.committed,
    )
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # uvicorn re-raises the signal that stopped it once it has shut down: let SIGTERM then
    # fall through to the clean-up below instead of killing the process before it.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        for follower in followers:
            follower.stop()
        service.close()
        engine.take_snapshot()
        journal.close()
        for path in unix_paths:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _from_topology(topology: Topology, state_path: str | None) -> Any:
    def build() -> ClusterState:
        if state_path is not None:
            return ClusterState.load(topology, state_path)
        return ClusterState(topology)

    return build


def _from_slurm(name: str, target: ctld.Slurmctld, o: dict[str, Any]) -> Any:
    def build() -> ClusterState:
        topology: Any = o["topology_path"]
        if topology is None:
            topology = _Text(target.topology())
        state = sl.sync(
            target.json("sinfo"),
            target.json("squeue"),
            topology,
            name=name,
            nvidia_smi=o["nvidia_smi"],
            host_type=o["host_type"],
            gpus_per_node=o["gpus_per_node"],
        )
        # Running jobs become the follower's business (slurm-<id> while they run).
        return state

    return build


class _Text:
    def __init__(self, text: str):
        self.text = text

    def read(self, size: int = -1) -> str:
        return self.text if size < 0 else self.text[:size]


# ------------------------------------------------------------------------------- client
def _client(address: str | None, token_file: str | None) -> Client:
    where = address or os.environ.get("GPUPLACE_SERVICE") or DEFAULT_SOCKET
    return Client(where, token=_read_token(token_file))


def _connect(func: Any) -> Any:
    func = click.option(
        "--service",
        "address",
        default=None,
        help=f"Socket path or http://HOST:PORT (default: $GPUPLACE_SERVICE or {DEFAULT_SOCKET}).",
    )(func)
    func = click.option("--token-file", type=click.Path(exists=True, dir_okay=False))(func)
    func = format_option(func)
    func = click.option("--cluster", default=None, help="Cluster (default: the service's first).")(
        func
    )
    return func


def _show(answer: Any, fmt: str, text: str) -> None:
    if fmt == "json":
        emit(answer if isinstance(answer, dict) else {"answer": answer})
    else:
        click.echo(text)


@click.group("service")
def service_group() -> None:
    """Talk to a running `gpuplace serve`."""


@service_group.command("place")
@_connect
@click.option("--job", "-j", "job_path", required=True, type=click.Path(exists=True))
@click.option("--solver", "-s", default="greedy", show_default=True)
@click.option("--dry-run", is_flag=True, help="Where it would go; hold nothing.")
def place_client(
    address: str | None,
    token_file: str | None,
    fmt: str,
    cluster: str | None,
    job_path: str,
    solver: str,
    dry_run: bool,
) -> None:
    """Place a job on the service's live state and hold its GPUs."""
    job = Job.load(job_path)
    answer = _client(address, token_file).place(
        job.to_dict(), cluster=cluster, solver=solver, dry_run=dry_run
    )
    verb = "would place" if dry_run else "placed"
    _show(
        answer, fmt, f"{verb} {answer['job']} on {answer['hostlist']} ({len(answer['gpus'])} GPUs)"
    )


@service_group.command("release")
@_connect
@click.argument("job")
def release_client(
    address: str | None, token_file: str | None, fmt: str, cluster: str | None, job: str
) -> None:
    """Release a job's GPUs."""
    answer = _client(address, token_file).release(job, cluster)
    _show(answer, fmt, f"released {job} ({answer['released_gpus']} GPUs)")


@service_group.command("repair")
@_connect
@click.argument("job")
@click.option("--apply", is_flag=True, help="Apply it (default: propose).")
@click.option("--max-moves", type=click.IntRange(0), default=0, show_default=True)
def repair_client(
    address: str | None,
    token_file: str | None,
    fmt: str,
    cluster: str | None,
    job: str,
    apply: bool,
    max_moves: int,
) -> None:
    """Propose (or apply) the repair of a job hit by failed hardware."""
    answer = _client(address, token_file).repair(
        job, cluster=cluster, apply=apply, max_moves=max_moves
    )
    moved = answer.get("moved", [])
    _show(
        answer,
        fmt,
        f"{'repaired' if apply else 'proposed for'} {job}: {len(moved)} ranks move"
        + "".join(f"\n  rank {m['rank']}: {m['reason']}" for m in moved),
    )


@service_group.command("explain")
@_connect
@click.option("--job", "-j", "job_path", required=True, type=click.Path(exists=True))
def explain_client(
    address: str | None, token_file: str | None, fmt: str, cluster: str | None, job_path: str
) -> None:
    """Why a job does or does not fit the live state."""
    answer = _client(address, token_file).explain(Job.load(job_path).to_dict(), cluster)
    lines = [f"{answer['job']}: {'fits' if answer['placeable'] else 'does not fit'}"]
    lines += [
        f"  {'*' if c['binding'] else ' '} {c['kind']} {c['name']}: {c['detail']}"
        for c in answer["constraints"]
    ]
    _show(answer, fmt, "\n".join(lines))


@service_group.command("status")
@_connect
def status_client(
    address: str | None, token_file: str | None, fmt: str, cluster: str | None
) -> None:
    """Clusters, jobs, holds, unhealthy hardware, the Slurm follower and the journal."""
    answer = _client(address, token_file).status(cluster)
    lines = []
    for c in answer["clusters"]:
        lines.append(
            f"{c['cluster']}: {c['free_gpus']} of {c['gpus']} GPUs free, {len(c['jobs'])} jobs, "
            f"{len(c['unhealthy'])} components out of order"
        )
        if "slurm" in c:
            s = c["slurm"]
            lines.append(f"  slurm: {s['polls']} polls, last error: {s['last_error'] or 'none'}")
    lines.append(f"journal: event {answer['journal']['committed']} on disk")
    _show(answer, fmt, "\n".join(lines))


@service_group.command("health")
@_connect
@click.argument("evidence", type=click.Path(exists=True, dir_okay=False))
@click.option("--host", default=None, help="Host the evidence is about, if its lines do not say.")
@click.option(
    "--repair",
    "repair_mode",
    type=click.Choice(["none", "propose", "apply"]),
    default="propose",
    show_default=True,
)
def health_client(
    address: str | None,
    token_file: str | None,
    fmt: str,
    cluster: str | None,
    evidence: str,
    host: str | None,
    repair_mode: str,
) -> None:
    """Send health evidence (a kernel log, dcgmi or ibstat output, ...) to the service."""
    text = Path(evidence).read_text(errors="replace")
    answer = _client(address, token_file).health(
        text, host=host, cluster=cluster, repair=repair_mode
    )
    lines = [f"{c['kind']} {c['name']}: {c['before']} -> {c['after']}" for c in answer["changes"]]
    lines += [f"drained {a['host']} ({a['reason']})" for a in answer.get("scheduler", [])]
    _show(answer, fmt, "\n".join(lines) or "no change")


# ---------------------------------------------------------------- gpuplace k8s extender
@click.command("extender")
@with_optional_cluster
@click.option(
    "--state",
    "state_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Start from this state, on its cluster (only read: the plans live in the journal).",
)
@click.option(
    "--journal",
    default="gpuplace-extender.db",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Where the gang plans are journaled (they survive a restart).",
)
@click.option("--solver", "-s", default="greedy", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8888, show_default=True)
@click.option("--prefix", default="", help="URL prefix (the extender's urlPrefix path).")
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Bearer token (needed to bind anything but loopback, unless TLS client certs).",
)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--tls-client-ca", type=click.Path(exists=True, dir_okay=False), default=None)
@format_option
@click.pass_context
def extender_cmd(
    ctx: click.Context,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    state_path: str | None,
    journal: str,
    solver: str,
    host: str,
    port: int,
    prefix: str,
    token_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    fmt: str,
) -> None:
    """Serve kube-scheduler extender filter/prioritize verbs that send each pod of a gang
    (annotation gpuplace/job) to the node gpuplace planned for its completion index: the
    placement service (`gpuplace serve`) on HOST:PORT with the verbs under PREFIX (with
    --format json, the address it listens on is one JSON line)."""
    state = state_or_cluster(state_path, cluster, nodes, racks, new=False)
    args = [
        "--journal",
        journal,
        "--solver",
        solver,
        "--listen",
        f"{host}:{port}",
        "--extender-prefix",
        prefix.rstrip("/") or "/",
        "--log-level",
        "warning",
    ]
    for flag, value in (
        ("--token-file", token_file),
        ("--tls-cert", tls_cert),
        ("--tls-key", tls_key),
        ("--tls-client-ca", tls_client_ca),
    ):
        if value is not None:
            args += [flag, value]
    # serve's own parser fills in every other option with its default.
    options = serve_cmd.make_context("serve", args, parent=ctx).params
    verbs_prefix = prefix.rstrip("/")

    def announce(urls: list[str], clusters: list[str]) -> None:
        url = f"{urls[0]}{verbs_prefix}"
        if fmt == "json":
            emit({"listening": url, "verbs": [f"{url}/filter", f"{url}/prioritize"]})
        else:
            click.echo(f"gpuplace extender on {url}/filter and /prioritize")

    _serve(options, [(state.topology.name, lambda: state)], announce)
