"""The HTTP face of ``gpuplace serve``: a FastAPI application (OpenAPI schema at
``/openapi.json``, browsable at ``/docs``) over the :class:`~gpuplace.service.engine.Engine`.

Limits, in this order: a bearer token when one is configured (required when the service is
bound to anything but loopback or a Unix socket), a request body size limit (413), a bounded
queue in front of a bounded worker pool (503 with ``Retry-After`` when full: a burst never
piles up unbounded work), and a time limit per request (504; a change that had not been
applied when the time ran out is never applied, one that had is answered). A change is
answered only once the journal has it on disk.

The hot path: ``/v1/place`` and ``/v1/release`` with a JSON body that validates against their
schema are answered by :class:`_Guard` without FastAPI's routing and dependency layers, and a
greedy placement of a small job (or a release) runs on the event loop itself when the engine's
lock is free at that instant (else on the pool). Everything else, and every body that does not
validate, goes through the FastAPI routes, which answer it as they always did.

Routes: ``/v1/place``, ``/v1/release``, ``/v1/repair``, ``/v1/explain``, ``/v1/health``
(evidence in, nodes drained, repairs proposed), ``/v1/status``, ``/v1/state``,
``/v1/slurm/job_submit`` (the ``job_submit/lua`` plugin's call), the kube-scheduler
extender's ``filter``/``prioritize`` (and ``release``) under its prefix, ``/metrics``
(Prometheus) and ``/healthz``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import hmac
import io
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from pydantic import BaseModel, Field, ValidationError

from gpuplace._util.documents import loads_json
from gpuplace._util.hostlist import compress
from gpuplace.errors import GpuplaceError, Infeasible
from gpuplace.health.readers import read_evidence
from gpuplace.integrations import slurmctld as ctld
from gpuplace.integrations.extender import (
    MAX_BODY,
    BadRequest,
    Extender,
    gang_job_name,
    parse_body,
)
from gpuplace.model.job import Job
from gpuplace.placement.result import Placement
from gpuplace.service.engine import (
    Conflict,
    Engine,
    Hold,
    NotFound,
    RequestCancelled,
    Ticket,
    Unavailable,
)
from gpuplace.service.journal import JournalError

__all__ = ["EnginePlanner", "Limits", "Service", "build_app"]

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


@dataclass
class Limits:
    """Request size and time limits and the worker pool."""

    #: Largest request body (bytes).
    max_body: int = MAX_BODY
    #: Seconds a request may take, queueing included.
    timeout: float = 10.0
    #: Threads that run requests (placement, repair, ...).
    workers: int = 4
    #: Requests waiting for or running on a worker before new ones get 503.
    queue: int = 256


# ----------------------------------------------------------------------------- schemas
class PlaceRequest(BaseModel):
    """Place a job and hold its GPUs until it is released."""

    job: dict[str, Any] = Field(description="A job document, as in a job file (name required).")
    cluster: str | None = Field(None, description="Cluster to place on (default: the first).")
    solver: str = "greedy"
    dry_run: bool = Field(False, description="Answer where it would go; hold nothing.")
    time_limit: float | None = Field(None, gt=0, description="Seconds for refine/cpsat.")
    slurm: dict[str, Any] | None = Field(
        None,
        description="Slurm options honoured when placing: partition, constraint, "
        "reservation, qos, time_limit (minutes or Slurm time), user, account.",
    )


class JobRef(BaseModel):
    job: str = Field(description="The job's name.")
    cluster: str | None = None


class RepairRequest(BaseModel):
    job: str
    cluster: str | None = None
    apply: bool = Field(False, description="Apply the repair (default: propose it only).")
    max_moves: int = Field(0, ge=0)
    spares: Literal["allow", "forbid", "only"] = "allow"


class ExplainRequest(BaseModel):
    job: dict[str, Any]
    cluster: str | None = None


class HealthRequest(BaseModel):
    """Health evidence (a kernel log excerpt, dcgmi/nvidia-smi/ibstat output, ...)."""

    text: str = Field(description="The tool's output, as text.")
    host: str | None = Field(None, description="Host the text is about, when its lines do not say.")
    format: str | None = Field(None, description="Reader (default: recognised from the text).")
    cluster: str | None = None
    repair: Literal["none", "propose", "apply"] = "propose"
    drain: bool = Field(True, description="Drain (Slurm) or taint (Kubernetes) what failed.")


class SlurmSubmitRequest(BaseModel):
    """What the job_submit/lua plugin sends for a tagged job."""

    cluster: str | None = None
    job_name: str | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    constraint: str | None = Field(None, description="-C feature expression.")
    reservation: str | None = None
    qos: str | None = None
    time_limit: int | str | None = Field(None, description="Minutes (or a Slurm time).")
    min_nodes: int | None = None
    gres_per_node: int | None = Field(None, description="GPUs per node the job asked for.")
    timeout_ms: int | None = Field(
        None, gt=0, description="The caller gives up after this long: nothing is held then."
    )
    spec: str | None = Field(None, description="The job document (#GPUPLACE lines) or tp=..,dp=..")


_SPARES: dict[str, bool | str] = {"allow": True, "forbid": False, "only": "only"}


class _Error(Exception):
    def __init__(self, status: int, message: str, **extra: Any):
        super().__init__(message)
        self.status = status
        self.extra = extra


# ----------------------------------------------------------------------------- planner
class EnginePlanner:
    """Kubernetes gang plans held in the engine (they survive a restart)."""

    def __init__(self, engine: Engine, cluster: str | None, solver: str = "greedy"):
        self.engine = engine
        self.cluster = cluster
        self.solver = solver
        #: Journal numbers of the plans made by the current thread's request.
        self.last_seq: int | None = None

    def rank_hosts(self, gang: str) -> list[str] | None:
        rt = self.engine.cluster(self.cluster)
        with self.engine.lock:
            gpus = rt.state.job_gpus(gang_job_name(gang))
            if gpus is None:
                return None
            return [rt.state.topology.host_of(int(g)) for g in gpus]

    def plan(self, gang: str, job: Job) -> list[str]:
        hold = Hold(job.name, "k8s", time.time(), label=gang)
        placement, seq = self.engine.place(job, cluster=self.cluster, solver=self.solver, hold=hold)
        if seq is not None:
            self.engine.journal.wait(seq)
        return [placement.topology.host_of(int(g)) for g in placement.gpus]

    def release(self, gang: str) -> bool:
        try:
            _, seq = self.engine.release(gang_job_name(gang), cluster=self.cluster)
        except NotFound:
            return False
        self.engine.journal.wait(seq)
        return True


# ----------------------------------------------------------------------------- metrics
class _StateCollector:
    """State size per cluster, read at scrape time."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self) -> Any:
        gpus = GaugeMetricFamily("gpuplace_state_gpus", "GPUs in the cluster", labels=["cluster"])
        free = GaugeMetricFamily(
            "gpuplace_state_free_gpus", "Free healthy GPUs", labels=["cluster"]
        )
        jobs = GaugeMetricFamily("gpuplace_state_jobs", "Jobs holding GPUs", labels=["cluster"])
        holds = GaugeMetricFamily("gpuplace_state_holds", "Placements held", labels=["cluster"])
        bad = GaugeMetricFamily(
            "gpuplace_state_unhealthy_components", "Components not ok", labels=["cluster"]
        )
        with self.engine.lock:
            for name, rt in self.engine.clusters.items():
                gpus.add_metric([name], rt.state.topology.num_gpus)
                free.add_metric([name], rt.state.free_gpus)
                jobs.add_metric([name], len(rt.state.jobs))
                holds.add_metric([name], len(rt.holds))
                bad.add_metric([name], len(rt.state.unhealthy()))
        committed = GaugeMetricFamily(
            "gpuplace_journal_committed_events", "Number of the last event on disk"
        )
        committed.add_metric([], self.engine.journal.committed)
        return [gpus, free, jobs, holds, bad, committed]


class Metrics:
    def __init__(self, engine: Engine):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gpuplace_requests", "Requests answered", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "gpuplace_request_seconds",
            "Request latency (queueing included)",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.placements = Counter(
            "gpuplace_placements", "Placements by outcome", ["cluster", "outcome"], registry=r
        )
        self.queue = Gauge("gpuplace_queue_depth", "Requests queued or running", registry=r)
        self.commit = Histogram(
            "gpuplace_journal_commit_seconds",
            "Seconds per group commit",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch = Histogram(
            "gpuplace_journal_batch_events",
            "Events per group commit",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.slurm_poll = Histogram(
            "gpuplace_slurm_poll_seconds",
            "Seconds per Slurm poll",
            ["cluster"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.slurm_up = Gauge(
            "gpuplace_slurm_up", "1 when the last Slurm poll succeeded", ["cluster"], registry=r
        )
        r.register(_StateCollector(engine))
        #: (route, status) -> the request counter's and the latency histogram's children.
        self._answered: dict[tuple[str, int], tuple[Any, Any]] = {}

    def answered(self, route: str, status: int, seconds: float) -> None:
        """Count one request and its latency (the labelled children looked up once)."""
        key = (route, status)
        children = self._answered.get(key)
        if children is None:
            children = (self.requests.labels(route, str(status)), self.latency.labels(route))
            self._answered[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def on_commit(self, events: int, seconds: float) -> None:
        self.commit.observe(seconds)
        self.batch.observe(events)

    def on_poll(self, cluster: str, seconds: float, ok: bool) -> None:
        self.slurm_poll.labels(cluster).observe(seconds)
        self.slurm_up.labels(cluster).set(1 if ok else 0)


# ----------------------------------------------------------------------------- service
class Service:
    """The application and what it runs requests on."""

    def __init__(
        self,
        engine: Engine,
        *,
        limits: Limits | None = None,
        token: str | None = None,
        extender_prefix: str | None = "/k8s",
        extender_cluster: str | None = None,
        solver: str = "greedy",
    ):
        self.engine = engine
        self.limits = limits or Limits()
        self.token = token
        self.pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix="gpuplace-worker")
        self.pending = 0
        self.jobs = JobCache()
        self.metrics = Metrics(engine)
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The thread running ``_loop``, and whether a journal flush is scheduled on it.
        self._loop_thread: int | None = None
        self._flush_scheduled = False
        #: Requests waiting for their event to reach the disk: (seq, order, future).
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = 0
        engine.journal.on_commit = self._on_commit
        engine.journal.on_failure = self._on_failure
        engine.on_change = lambda cluster, outcome: self.metrics.placements.labels(
            cluster, outcome
        ).inc()
        self.extender_prefix = extender_prefix.rstrip("/") if extender_prefix is not None else None
        self.extender_routes = (
            {f"{self.extender_prefix}/{v}" for v in ("filter", "prioritize", "release")}
            if self.extender_prefix is not None
            else set()
        )
        self.extender = Extender(
            planner=EnginePlanner(engine, extender_cluster, solver), solver=solver
        )
        self.app = build_app(self)
        #: What the server runs: the application behind the token, size and metrics guard.
        self.asgi = _Guard(self, self.app)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    # Waiting for the journal without holding a worker. With ``process`` durability the event
    # loop commits what its own requests appended, once per turn of the loop (a write into the
    # page cache); what other threads append (the pool, the followers), and everything with
    # ``power`` durability, the committer thread writes, and then wakes the loop.
    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Remember the running loop (the committer wakes it); with ``process`` durability,
        have the journal leave the events appended on it to :meth:`_flush`."""
        if self._loop is loop:
            return
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._flush_scheduled = False
        journal = self.engine.journal
        if journal.inline:
            journal.defer_to(self._loop_thread, self._schedule_flush)

    def _schedule_flush(self) -> bool:
        """An event was appended on the loop's thread: commit it (and the rest of this
        turn's) once the requests ready now have run. False when that thread is not running
        the loop now (the committer writes the event then)."""
        loop = self._loop
        try:
            if loop is None or asyncio.get_running_loop() is not loop:
                return False
        except RuntimeError:  # no loop running on this thread
            return False
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return True

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.engine.journal.flush():
            self._wake()
        # else a commit was under way on the committer thread: it writes these next and
        # wakes the loop (``_on_commit``).

    def _on_commit(self, events: int, seconds: float) -> None:
        self.metrics.on_commit(events, seconds)
        loop = self._loop
        if loop is not None and threading.get_ident() != self._loop_thread and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake)

    def _on_failure(self, exc: BaseException) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake, exc)

    def _wake(self, failure: BaseException | None = None) -> None:
        committed = self.engine.journal.committed
        while self._waiters and (failure is not None or self._waiters[0][0] <= committed):
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                if failure is not None:
                    future.set_exception(JournalError(f"the journal failed: {failure}"))
                else:
                    future.set_result(None)

    async def durable(self, seq: int | None) -> None:
        """Return once event ``seq`` is on disk."""
        journal = self.engine.journal
        if seq is None or journal.committed >= seq:
            return
        loop = asyncio.get_running_loop()
        self._bind(loop)
        future: asyncio.Future[None] = loop.create_future()
        self._order += 1
        heapq.heappush(self._waiters, (seq, self._order, future))
        self._wake()  # it may have committed meanwhile
        journal.check()
        await future

    async def run(
        self,
        route: str,
        work: Callable[[Ticket], Any],
        *,
        timeout: float | None = None,
    ) -> Any:
        """Run ``work`` on the pool within the limits (and ``timeout``, when shorter); returns
        its result (once on disk, for a :class:`Durable`: the worker is free meanwhile) or
        raises _Error. Short placements and releases use :meth:`run_here` instead."""
        limit = self.limits.timeout if timeout is None else min(timeout, self.limits.timeout)
        if self.pending >= self.limits.queue:
            self.metrics.placements.labels("-", "refused busy").inc()
            raise _Error(503, f"busy: {self.pending} requests queued; retry shortly", retry_after=1)
        self.pending += 1
        self.metrics.queue.set(self.pending)
        ticket = Ticket()
        loop = asyncio.get_running_loop()
        self._bind(loop)
        future = loop.run_in_executor(self.pool, _call, work, ticket)
        try:
            try:
                result = await asyncio.wait_for(asyncio.shield(future), limit)
            except asyncio.TimeoutError:
                if ticket.cancel():
                    raise _Error(
                        504, f"{route}: no answer within {limit:g} s; nothing was changed"
                    ) from None
                # The change was applied already: answer it (only the journal write is left).
                result = await future
            if isinstance(result, Durable):
                await self.durable(result.seq)
                return result.value
            return result
        finally:
            self.pending -= 1
            self.metrics.queue.set(self.pending)

    async def run_here(self, route: str, work: Callable[[Ticket], Any]) -> Any:
        """Run short work (a greedy placement of a small job, a release) on the event loop
        itself when the engine's lock is free at once: no hop to a worker thread and back,
        which cost more than the placement. When another thread holds the lock (a Slurm
        poll, a snapshot being copied, a request on the pool), the work goes to the pool
        like any other (:meth:`run`), so the loop never waits for the lock. It counts in the
        same bound (``Limits.queue``) while it waits for the disk: a full service answers 503
        here as there."""
        self._bind(asyncio.get_running_loop())
        lock = self.engine.lock
        if self.pending >= self.limits.queue or not lock.acquire(blocking=False):
            return await self.run(route, work)
        self.pending += 1
        self.metrics.queue.set(self.pending)
        try:
            try:
                result = work(Ticket())
            finally:
                lock.release()
            if isinstance(result, Durable):
                await self.durable(result.seq)
                return result.value
            return result
        finally:
            self.pending -= 1
            self.metrics.queue.set(self.pending)


@dataclass
class Durable:
    """A request's answer, to be sent once journal event ``seq`` is on disk."""

    value: Any
    seq: int | None


def _call(work: Callable[[Ticket], Any], ticket: Ticket) -> Any:
    return work(ticket)


def _durable(engine: Engine, seq: int | None) -> None:
    if seq is not None:
        engine.journal.wait(seq)


def _dumps(out: Any) -> bytes:
    """JSON bytes: orjson (numpy arrays and scalars too), or the standard library for what
    orjson refuses (integers over 64 bits, say)."""
    try:
        return orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(out, separators=(",", ":")).encode()


def _encode(out: Any) -> Response:
    """A JSON response encoded where the work ran (not by FastAPI's encoder)."""
    return Response(_dumps(out), media_type="application/json")


def _status_of(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """HTTP status and body of an error: the message and the kind, never a traceback."""
    message = " ".join(str(exc).split())
    body: dict[str, Any] = {"error": message, "kind": type(exc).__name__}
    if isinstance(exc, _Error):
        return exc.status, body
    if isinstance(exc, Infeasible):
        if exc.explanation is not None:
            body["explanation"] = exc.explanation.to_dict()
        return 409, body
    if isinstance(exc, Conflict):
        return 409, body
    if isinstance(exc, NotFound):
        return 404, body
    if isinstance(exc, RequestCancelled):
        return 504, body
    if isinstance(exc, ctld.SlurmUnavailable | Unavailable | JournalError):
        return 503, body
    if isinstance(exc, ctld.SlurmError):
        return 409, body
    if isinstance(exc, GpuplaceError | ValueError):
        return 400, body
    return 500, {
        "error": f"internal error ({type(exc).__name__}); see the service log",
        "kind": "InternalError",
    }


def _job(doc: dict[str, Any], where: str = "job") -> Job:
    return Job.from_dict(doc, source=where)


class JobCache:
    """Jobs parsed from place requests, by their document less the name: schedulers send the
    same few shapes again and again, and parsing one costs more than placing it. A hit is the
    cached job renamed (:func:`_renamed`); a document with ``alternatives``
    (whose jobs carry the name) or that does not parse is parsed in full every time, so its
    errors are the parser's."""

    def __init__(self, size: int = 512):
        self.size = size
        self._jobs: dict[bytes, Job] = {}

    def job(self, doc: Any) -> Job:
        name = doc.get("name") if isinstance(doc, dict) else None
        if not isinstance(name, str) or not name or "alternatives" in doc:
            return _job(doc)
        try:
            key = orjson.dumps(
                {k: v for k, v in doc.items() if k != "name"}, option=orjson.OPT_SORT_KEYS
            )
        except TypeError:  # something orjson does not write (an integer over 64 bits)
            return _job(doc)
        template = self._jobs.get(key)
        if template is None:
            job = _job(doc)
            if job.elastic is None:
                if len(self._jobs) >= self.size:
                    self._jobs.clear()
                self._jobs[key] = job
            return job
        return _renamed(template, name)


#: The fields of a Job (what a renamed copy carries over).
_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job))


def _renamed(template: Job, name: str) -> Job:
    """``template`` under another name (a non-empty string, as the caller checked: the one
    check ``Job`` makes of a name): its other fields were checked when it was parsed, and are
    not checked again (``dataclasses.replace`` would, at a third of a hit's cost); its
    mappings are copied, its caches (the compiled spec carries the name) are not."""
    job: Job = Job.__new__(Job)
    fields = template.__dict__
    values = {f: fields[f] for f in _JOB_FIELDS}
    values["name"] = name
    values["communication"] = dict(template.communication)
    values["confine"] = dict(template.confine)
    job.__dict__.update(values)
    return job


def _place_work(
    service: Service, body: PlaceRequest, job: Job | None = None
) -> Callable[[Ticket], Durable]:
    """What a place request does (``job``: its spec, when the caller parsed it already)."""
    engine = service.engine

    def work(ticket: Ticket) -> Durable:
        spec = job if job is not None else service.jobs.job(body.job)
        request = ctld.SlurmRequest.from_dict(body.slurm) if body.slurm else None
        try:
            placement, seq = engine.place(
                spec,
                cluster=body.cluster,
                solver=body.solver,
                ticket=ticket,
                dry_run=body.dry_run,
                slurm=request,
                time_limit=body.time_limit,
            )
        except Infeasible:
            service.metrics.placements.labels(body.cluster or "-", "infeasible").inc()
            raise
        return Durable(_encode(placement_answer(placement, seq)), seq)

    return work


def _release_work(service: Service, body: JobRef) -> Callable[[Ticket], Durable]:
    def work(ticket: Ticket) -> Durable:
        out, seq = service.engine.release(body.job, cluster=body.cluster, ticket=ticket)
        return Durable(_encode(out), seq)

    return work


def placement_answer(placement: Placement, seq: int | None) -> dict[str, Any]:
    """The answer to a place request: ``placement.to_dict()`` with the rank table, whether it
    is held and its journal number. Built from one pass over the ranks (``to_dict`` and
    ``rank_table`` look every rank's host up two or three times: half the request's Python
    time for an 8-GPU job); tests/test_service.py holds it equal to those."""
    topo = placement.topology
    gpus = placement.gpus.tolist()
    hosts = topo.hosts
    host_index = topo.host_of_gpu[placement.gpus].tolist()
    rows = []
    local_rank: dict[int, int] = {}
    for rank, (g, h) in enumerate(zip(gpus, host_index, strict=True)):
        lr = local_rank.get(h, 0)
        local_rank[h] = lr + 1
        rows.append(
            {"rank": rank, "host": hosts[h], "local_rank": lr, "device": topo.local_index(g)}
        )
    nodes = [hosts[h] for h in local_rank]  # dicts keep insertion order: first rank first
    out: dict[str, Any] = {
        "job": placement.job.name,
        "gpus": gpus,
        "nodes": nodes,
        "hostlist": compress(sorted(nodes)),
        "cost": placement.cost.to_dict(),
        "solver": placement.solver,
        "optimal": placement.optimal,
        "bound": placement.bound,
        "gap": placement.gap,
        "elapsed_s": placement.elapsed_s,
    }
    if placement.details:
        out["details"] = placement.details
    out["rank_table"] = rows
    out["held"] = seq is not None
    out["journal_seq"] = seq
    return out


def build_app(service: Service) -> FastAPI:
    engine = service.engine
    app = FastAPI(
        title="gpuplace",
        summary="Topology-aware placement of distributed GPU jobs, as a live service.",
        version="1",
    )
    app.router.route_class = _StrictRoute

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for err in exc.errors():
            if err.get("type") == "json_invalid":
                problems.append(_json_problem(err, exc.body))
                continue
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            problems.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
        return JSONResponse({"error": "; ".join(problems), "kind": "InvalidRequest"}, 400)

    async def failed(request: Request, exc: Exception) -> JSONResponse:
        status, body = _status_of(exc)
        headers = {"Retry-After": "1"} if status == 503 else None
        return JSONResponse(body, status, headers=headers)

    for kind in (_Error, GpuplaceError, ValueError):
        app.add_exception_handler(kind, failed)

    # ---------------------------------------------------------------- routes
    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, Any]:
        """Liveness: answers without touching the state."""
        return {"ok": True, "journal_committed": engine.journal.committed}

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    async def metrics() -> Response:
        """Prometheus metrics: requests, latencies, placements, queue depth, state size,
        journal commits, Slurm polls."""
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/status", tags=["state"])
    async def status(cluster: str | None = None) -> dict[str, Any]:
        """Jobs, holds, unhealthy hardware, proposed repairs, the Slurm follower and the
        journal."""
        return await service.run("status", lambda t: engine.status(cluster))

    @app.get("/v1/state", tags=["state"])
    async def state(cluster: str | None = None) -> dict[str, Any]:
        """The cluster's state as a state-file body (``ClusterState.restore`` reads it)."""
        return await service.run("state", lambda t: engine.state_document(cluster))

    @app.post("/v1/place", tags=["placement"], response_model=None)
    async def place_route(body: PlaceRequest) -> Response:
        """Place a job and hold its GPUs; answered once the hold is on disk."""
        return await service.run("place", _place_work(service, body))

    @app.post("/v1/release", tags=["placement"], response_model=None)
    async def release_route(body: JobRef) -> Response:
        """Release a held placement (or a job's GPUs)."""
        return await service.run("release", _release_work(service, body))

    @app.post("/v1/repair", tags=["placement"], response_model=None)
    async def repair_route(body: RepairRequest) -> Response:
        """Re-place only what broke of a job: proposed, or applied with ``apply``."""

        def work(ticket: Ticket) -> Durable:
            out, seq = engine.repair(
                body.job,
                cluster=body.cluster,
                apply=body.apply,
                max_moves=body.max_moves,
                spares=_SPARES[body.spares],
                ticket=ticket,
            )
            return Durable(_encode(out), seq)

        return await service.run("repair", work)

    @app.post("/v1/explain", tags=["placement"])
    async def explain_route(body: ExplainRequest) -> dict[str, Any]:
        """Why a job does or does not fit now, constraint by constraint."""
        return await service.run("explain", lambda t: engine.explain(_job(body.job), body.cluster))

    @app.post("/v1/health", tags=["health"])
    async def health_route(body: HealthRequest) -> dict[str, Any]:
        """Health evidence in: applied as ``gpuplace health ingest`` judges it; nodes taken out
        of service are drained in Slurm (reason ``gpuplace: ...``) or tainted in Kubernetes;
        the jobs hit get a repair proposed (or applied)."""

        def work(ticket: Ticket) -> dict[str, Any]:
            start = time.perf_counter()
            source = io.StringIO(body.text)
            source.name = f"posted evidence{f' of {body.host}' if body.host else ''}"
            result = read_evidence(source, format=body.format, host=body.host)
            report, seq = engine.ingest(
                [result], cluster=body.cluster, repair_mode=body.repair, ticket=ticket
            )
            _durable(engine, seq)
            report["scheduler"] = engine.scheduler_actions(report) if body.drain else []
            report["seconds"] = time.perf_counter() - start
            return report

        return await service.run("health", work)

    @app.post("/v1/slurm/job_submit", tags=["slurm"])
    async def slurm_submit(body: SlurmSubmitRequest, request: Request) -> Response:
        """For the job_submit/lua plugin: place a tagged job and hold its nodes until the job
        runs or ends. With ``Accept: text/plain`` the answer is ``key value`` lines (Lua reads
        them without a JSON library)."""

        def work(ticket: Ticket) -> Durable:
            out, seq = engine.slurm_submit(body.model_dump(), ticket=ticket)
            return Durable(out, seq)

        plain = "text/plain" in (request.headers.get("accept") or "")
        try:
            out = await service.run(
                "slurm_submit",
                work,
                timeout=None if body.timeout_ms is None else body.timeout_ms / 1000,
            )
        except Exception as exc:
            if not plain:
                raise
            status, err = _status_of(exc)
            return PlainTextResponse(f"error {err['error']}\n", status)
        if not plain:
            return JSONResponse(out)
        lines = [
            f"token {out['token']}",
            f"hold {out['hold']}",
            f"nodes {','.join(out['nodes'])}",
            f"hostlist {out['hostlist']}",
            f"ntasks {out['ntasks']}",
            f"whole {1 if out['whole_nodes'] else 0}",
            f"exclusive {1 if out['exclusive'] else 0}",
            *([f"gres_per_node {out['gres_per_node']}"] if out["gres_per_node"] else []),
            f"rank_hosts {','.join(out['rank_hosts'])}",
            f"rank_devices {','.join(str(d) for d in out['rank_devices'])}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n")

    # ---------------------------------------------------------------- extender
    prefix = service.extender_prefix
    if prefix is not None:

        async def verb(request: Request, name: str) -> Response:
            raw = await request.body()

            def work(ticket: Ticket) -> Any:
                args = parse_body(raw)
                if name == "filter":
                    return service.extender.filter(args)
                if name == "prioritize":
                    return service.extender.prioritize(args)
                if not isinstance(args, dict) or not isinstance(args.get("gang"), str):
                    raise BadRequest('expected {"gang": "namespace/name"}')
                return {"released": service.extender.release(args["gang"])}

            if not raw:
                return JSONResponse({"Error": "expected a JSON body (ExtenderArgs)"}, 400)
            try:
                return JSONResponse(await service.run(f"extender {name}", work))
            except BadRequest as exc:
                return JSONResponse({"Error": " ".join(str(exc).split())}, 400)
            except Exception as exc:
                status, body = _status_of(exc)
                return JSONResponse({"Error": body["error"]}, status)

        for name in ("filter", "prioritize", "release"):

            async def endpoint(request: Request, _name: str = name) -> Response:
                return await verb(request, _name)

            endpoint.__doc__ = {
                "filter": "kube-scheduler extender filter: ExtenderArgs -> ExtenderFilterResult "
                "(a gpuplace pod keeps only its rank's planned node).",
                "prioritize": "kube-scheduler extender prioritize: ExtenderArgs -> "
                "HostPriorityList (the planned node scores 10).",
                "release": 'Forget a gang\'s plan and free its GPUs: {"gang": "ns/name"} (call '
                "when the Job ends or fails).",
            }[name]
            app.add_api_route(f"{prefix}/{name}", endpoint, methods=["POST"], tags=["kubernetes"])

    return app


class _Guard:
    """Outermost ASGI layer: the token, the body size limit, and the request metrics."""

    def __init__(self, service: Service, app: Any):
        self.service = service
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        service = self.service
        start = time.perf_counter()
        path = scope.get("path", "")
        status_box = [0]

        async def send_counted(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
            await send(message)

        try:
            problem = _check(service, scope)
            if problem is not None:
                await _reply(send_counted, *problem)
                return
            try:
                limited = _limit_body(receive, service.limits.max_body)
                if path in _LEAN_ROUTES and scope.get("method") == "POST":
                    await self.lean(scope, limited, send_counted)
                else:
                    await self.app(scope, limited, send_counted)
            except _BodyTooLarge:
                if status_box[0] == 0:
                    await _reply(
                        send_counted,
                        413,
                        {"error": f"request body over {service.limits.max_body} bytes"},
                    )
        finally:
            route = path if path in _ROUTES or path in service.extender_routes else "other"
            service.metrics.answered(route, status_box[0], time.perf_counter() - start)

    async def lean(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """``/v1/place`` and ``/v1/release`` without FastAPI's routing and dependency layers
        (most of a request's time on the event loop): a JSON body that parses and validates
        against the route's model (the same pydantic model, so the same acceptance) is
        answered here; anything else (no or another content type, bad JSON, a field that
        fails validation) goes to the FastAPI route, which answers it exactly as before."""
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        path = scope["path"]
        model = PlaceRequest if path == "/v1/place" else JobRef
        body = _lean_body(scope, raw, model)
        if body is None:
            await self.app(scope, _replay(raw, receive), send)
            return
        service = self.service
        try:
            if isinstance(body, PlaceRequest):
                job = service.jobs.job(body.job)
                work = _place_work(service, body, job)
                here = (
                    body.solver == "greedy"
                    and body.slurm is None
                    and body.time_limit is None
                    and job.gpus <= INLINE_MAX_GPUS
                )
                route = "place"
            else:
                work = _release_work(service, body)
                here = True
                route = "release"
            if here:
                response = await service.run_here(route, work)
            else:
                response = await service.run(route, work)
        except Exception as exc:
            status, answer = _status_of(exc)
            if status == 500:
                _log.error("%s failed", path, exc_info=exc)
            headers = {"Retry-After": "1"} if status == 503 else None
            response = JSONResponse(answer, status, headers=headers)
        await response(scope, receive, send)


#: Largest job (GPUs) a lean place request solves on the event loop itself; larger ones (a
#: greedy placement of 4,096 GPUs takes over a millisecond, its answer more) go to the pool.
INLINE_MAX_GPUS = 256
_LEAN_ROUTES = {"/v1/place", "/v1/release"}
_log = logging.getLogger("gpuplace.serve")


def _lean_body(
    scope: dict[str, Any], raw: bytes, model: type[PlaceRequest] | type[JobRef]
) -> PlaceRequest | JobRef | None:
    """The request's body as ``model``, when FastAPI would take it as JSON (a content type
    ``application/json`` or ``application/*+json``, as its rule reads it) and it parses and
    validates; else None."""
    if not raw:
        return None
    ctype = None
    for key, value in scope.get("headers") or ():
        if key == b"content-type":
            ctype = value.decode("latin-1")
    if not ctype:
        return None
    media = ctype.partition(";")[0].strip().lower()
    if media.count("/") != 1:
        return None
    main, sub = media.split("/")
    if main != "application" or not (sub == "json" or sub.endswith("+json")):
        return None
    try:
        return model.model_validate(loads_json(raw))
    except (json.JSONDecodeError, ValidationError):
        return None


class _StrictRequest(Request):
    """A request whose JSON body is read with the limits of every other document gpuplace
    reads (:func:`loads_json`: a key given twice in one object, a number of more than 1,000
    digits and deep nesting are refused), where Starlette's ``json.loads`` keeps the last of
    two keys silently. Its errors are :class:`json.JSONDecodeError`, which FastAPI answers as
    invalid JSON."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_json(await self.body())
        return self._json


class _StrictRoute(APIRoute):
    """The service's routes: FastAPI's, reading bodies as :class:`_StrictRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictRequest(request.scope, request.receive))

        return strict


def _json_problem(err: dict[str, Any], body: Any) -> str:
    """``body: line L: invalid JSON: <why>`` of FastAPI's ``json_invalid`` error (its ``loc``
    holds the offset into the body text)."""
    why = (err.get("ctx") or {}).get("error", "not JSON")
    loc = err.get("loc") or ()
    pos = loc[-1] if loc and isinstance(loc[-1], int) else None
    if isinstance(body, str) and pos is not None:
        return f"body: line {body.count(chr(10), 0, pos) + 1}: invalid JSON: {why}"
    return f"body: invalid JSON: {why}"


def _replay(raw: bytes, receive: Any) -> Callable[[], Awaitable[dict[str, Any]]]:
    """A ``receive`` that gives the body read already, then the connection's own."""
    sent = [False]

    async def replay() -> dict[str, Any]:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": raw, "more_body": False}
        message: dict[str, Any] = await receive()
        return message

    return replay


_ROUTES = {
    "/healthz",
    "/metrics",
    "/v1/status",
    "/v1/state",
    "/v1/place",
    "/v1/release",
    "/v1/repair",
    "/v1/explain",
    "/v1/health",
    "/v1/slurm/job_submit",
    "/openapi.json",
    "/docs",
}


def _check(service: Service, scope: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """Refuse before reading the body: no token, a body announced too large."""
    headers = dict(scope.get("headers") or [])
    if service.token is not None and scope.get("path") != "/healthz":
        given = headers.get(b"authorization", b"").decode("latin-1")
        expected = f"Bearer {service.token}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return 401, {"error": "missing or wrong bearer token (Authorization: Bearer ...)"}
    length = headers.get(b"content-length")
    if length is not None:
        try:
            size = int(length)
        except ValueError:
            return 400, {"error": "Content-Length is not a number"}
        if size > service.limits.max_body:
            return 413, {"error": f"request body over {service.limits.max_body} bytes"}
    return None


class _BodyTooLarge(Exception):
    pass


def _limit_body(receive: Any, limit: int) -> Callable[[], Awaitable[dict[str, Any]]]:
    seen = [0]

    async def limited() -> dict[str, Any]:
        message = await receive()
        if message["type"] == "http.request":
            seen[0] += len(message.get("body", b""))
            if seen[0] > limit:
                raise _BodyTooLarge
        return message

    return limited


async def _reply(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if status == 503:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
