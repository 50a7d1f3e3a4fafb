"""What feeds the service without anyone asking: slurmctld, followed by polling its ``--json``
answers, and kernel logs tailed for XIDs.

:class:`SlurmFollower` reads ``squeue --json``, ``sinfo --json``, ``scontrol show partition``
and ``scontrol show reservation`` every ``interval`` seconds (each under the cluster's command
timeout, so a controller that is down shows as an error in ``status`` within seconds) and hands
them to :meth:`Engine.reconcile_slurm`. :class:`LogFollower` tails kernel logs (or dcgmi health
logs): new complete lines are judged as ``gpuplace health ingest`` judges them, applied, and
the nodes they take out of service are drained in Slurm (or tainted in Kubernetes) at once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuplace.errors import GpuplaceError
from gpuplace.health.readers import KernelLogScanner, ReadResult
from gpuplace.integrations import slurmctld as ctld
from gpuplace.integrations.slurm import read_sinfo, read_squeue
from gpuplace.service.engine import Engine

__all__ = ["LogFollower", "SlurmFollower"]

log = logging.getLogger("gpuplace.serve")


class _Loop:
    """A daemon thread calling ``step`` every ``interval`` seconds until stopped."""

    def __init__(self, name: str, interval: float):
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                self.step()
            except Exception:  # keep following; the error is in the log and the status
                log.exception("%s failed", self._thread.name)
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - start)))

    def step(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class SlurmFollower(_Loop):
    """Polls one Slurm cluster and reconciles the engine's state with it."""

    def __init__(
        self,
        engine: Engine,
        cluster: str,
        interval: float = 2.0,
        on_poll: Callable[[str, float, bool], None] | None = None,
    ):
        super().__init__(f"gpuplace-slurm-{cluster}", interval)
        self.engine = engine
        self.cluster = cluster
        self.on_poll = on_poll

    def step(self) -> None:
        rt = self.engine.cluster(self.cluster)
        slurm = rt.slurm
        if slurm is None:
            return
        start = time.perf_counter()
        ok = False
        try:
            view, nodes, jobs, raw = read_slurm(slurm)
            self.engine.reconcile_slurm(self.cluster, nodes, jobs, raw, view)
            ok = True
            rt.follow.last_ok = time.time()
            rt.follow.last_error = None
        except GpuplaceError as exc:
            rt.follow.last_error = str(exc)
            log.warning("following %s: %s", self.cluster, exc)
        finally:
            elapsed = time.perf_counter() - start
            rt.follow.polls += 1
            rt.follow.last_poll = time.time()
            rt.follow.poll_seconds = elapsed
            if self.on_poll is not None:
                self.on_poll(self.cluster, elapsed, ok)


def read_slurm(slurm: ctld.Slurmctld) -> tuple[ctld.SlurmView, list[Any], list[Any], list[Any]]:
    """One consistent read of a Slurm cluster: the view (nodes, partitions, reservations),
    the running jobs, and squeue's raw job records (for the hold tokens)."""
    queue = slurm.json("squeue")
    info = slurm.json("sinfo")
    nodes = read_sinfo(info)
    view = ctld.SlurmView(
        nodes,
        slurm.partitions(),
        slurm.reservations(),
        gres=any(n.gpus for n in nodes),
        qos=slurm.qos(),
    )
    raw = [j for j in queue.get("jobs", []) if isinstance(j, dict)]
    return view, nodes, read_squeue(queue), raw


@dataclass
class _Tail:
    path: str
    host: str | None
    offset: int = 0
    inode: int | None = None
    scanner: KernelLogScanner | None = None
    pending: list[Any] = field(default_factory=list)


class LogFollower(_Loop):
    """Tails kernel logs (``HOST=PATH`` or a path whose lines name their host) and ingests
    new evidence into one cluster, then drains what it took out of service."""

    def __init__(
        self,
        engine: Engine,
        cluster: str,
        sources: list[str],
        *,
        interval: float = 0.5,
        repair_mode: str = "propose",
        from_start: bool = False,
        on_ingest: Callable[[dict[str, Any]], None] | None = None,
    ):
        super().__init__(f"gpuplace-logs-{cluster}", interval)
        self.engine = engine
        self.cluster = cluster
        self.repair_mode = repair_mode
        self.on_ingest = on_ingest
        self.tails = []
        for spec in sources:
            host, sep, path = spec.partition("=")
            if not sep or os.path.exists(spec):
                host, path = "", spec
            tail = _Tail(path, host or None)
            if not from_start and os.path.exists(path):
                stat = os.stat(path)
                tail.offset, tail.inode = stat.st_size, stat.st_ino
            self.tails.append(tail)

    def step(self) -> None:
        fresh: list[ReadResult] = []
        for tail in self.tails:
            found = self._read(tail)
            if found is not None:
                fresh.append(found)
        if not fresh:
            return
        report, seq = self.engine.ingest(fresh, cluster=self.cluster, repair_mode=self.repair_mode)
        if seq is not None:
            self.engine.journal.wait(seq)
        report["scheduler"] = self.engine.scheduler_actions(report)
        if self.on_ingest is not None:
            self.on_ingest(report)

    def _read(self, tail: _Tail) -> ReadResult | None:
        try:
            stat = os.stat(tail.path)
        except FileNotFoundError:
            return None
        if tail.inode is not None and (stat.st_ino != tail.inode or stat.st_size < tail.offset):
            tail.offset = 0  # rotated or truncated: read the new file from its start
            tail.scanner = None
        tail.inode = stat.st_ino
        if stat.st_size <= tail.offset:
            return None
        if tail.scanner is None:
            tail.scanner = KernelLogScanner(tail.path, host=tail.host)
        with open(tail.path, "rb") as handle:
            handle.seek(tail.offset)
            data = handle.read(stat.st_size - tail.offset)
        tail.offset += len(data)
        found = tail.scanner.feed(data)
        if not found:
            return None
        return ReadResult(
            source=tail.path, format="kernel-log", evidence=list(found), lines=0, host=tail.host
        )
