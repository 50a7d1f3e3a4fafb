"""An event-driven cluster simulator: jobs arrive, queue, are placed by a registered solver on a
:class:`gpuplace.ClusterState`, run at the speed their placement gives them, and finish or are
interrupted by hardware and software failures.

Events, in time order (ties: finishes and hardware changes before arrivals, then by sequence):
arrival, finish, failure, repair of failed hardware, link degradation and its end. After the
events of one instant the queue policy starts what it can:

* ``fifo``: in submission order; the first job that cannot be placed blocks the rest;
* ``priority``: by priority class (higher first), then submission, blocking as FIFO;
* ``easy``: FIFO with EASY backfill (Lifka 1995; Slurm's ``sched/backfill``): when the head is
  blocked it gets a reservation at the earliest time the running jobs' *estimated* ends free
  enough GPUs; a later job may start now if it fits and either ends (by its estimate) before
  the reservation or uses only GPUs the head will not need then. At most
  :data:`BACKFILL_DEPTH` jobs are tried per pass (Slurm's ``bf_max_job_test`` default), and a
  pass runs at most every ``backfill_interval_s`` (Slurm's ``bf_interval``, 30 s), while the
  head of the queue is started on every event, as Slurm's main scheduler does;
* ``slurm``: Slurm's ``sched/backfill`` as it behaves (:mod:`gpuplace.sim.slurm`): the main
  scheduler in order on every event, and every ``backfill_interval_s`` on its own clock a
  conservative, node-level backfill pass that reserves for every pending job it tests.

A job's runtime is its work over its speed (:func:`gpuplace.sim.speed.job_speed`, the one speed
model) on its placement; it is re-priced when the hardware under it degrades or recovers, and
with ``reprice_on_change`` (for a cost model that prices contention between jobs) whenever the
allocations change.
Failures (:mod:`gpuplace.sim.failures`) are answered by a response policy:

* ``requeue``: the job loses its work since its last checkpoint, gives its GPUs back and
  returns to the queue in its original position; it pays the restart cost when it starts again;
* ``repair``: the job keeps its surviving GPUs and :func:`gpuplace.repair` replaces the lost
  ranks (reserved spares first, ``max_moves`` more if cheaper); it loses its work since the last
  checkpoint and pays the restart cost, but keeps its place; if no repair exists it is requeued.

With ``evacuate`` a job whose link degrades is repaired off the degraded hardware (drained
until it recovers) instead of running on slowly.

Accounting is exact in GPU-seconds: every job's held GPU-time is split into kept productive
time, time lost to failures per cause (work since the last checkpoint, and restarts) and the
rest; :mod:`gpuplace.sim.metrics` summarises it. Deterministic for a seed (``refine`` with a
time limit is the one solver whose result depends on the machine's speed). Failures are drawn
up to a horizon of the last arrival plus four times the longest job plus 30 days (a job that
failures interrupt faster than it checkpoints would otherwise never end); the result states the
horizon and whether it covers the run (``failure_horizon_s``, ``failures_cover_run``).
"""

from __future__ import annotations

import bisect
import copy
import heapq
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpuplace.cluster.fabric import contention
from gpuplace.cluster.state import ClusterState, nics_of
from gpuplace.enums import Health
from gpuplace.errors import Infeasible, InvalidJob, InvalidState
from gpuplace.model.job import Job
from gpuplace.model.storage import DataAccess, Store
from gpuplace.model.topology import Topology
from gpuplace.placement.place import evaluate, place
from gpuplace.placement.registry import solvers
from gpuplace.placement.repair import repair
from gpuplace.placement.result import gpu_peak_tflops
from gpuplace.sim.failures import Cause, FailureModel
from gpuplace.sim.slurm import backfill_pass, next_pass
from gpuplace.sim.speed import JobProfile, Speed, job_profile, job_speed, peak_flops
from gpuplace.sim.traces import SimJob, Workload, job_template

__all__ = [
    "BACKFILL_DEPTH",
    "CHECKPOINT_BYTES_PER_PARAMETER",
    "CHECKPOINT_GBPS_PER_GPU",
    "POLICIES",
    "RESPONSES",
    "JobRecord",
    "SimConfig",
    "SimResult",
    "cluster_peak_flops",
    "reference_gpus",
    "simulate",
]

POLICIES = ("fifo", "priority", "easy", "slurm")
RESPONSES = ("requeue", "repair")
BACKFILL_DEPTH = 500

_FINISH, _HARDWARE, _RECOVER, _BACKFILL, _DETECT = 0, 1, 2, 3, 4

#: Bytes a checkpoint holds per model parameter: the model and optimizer state of mixed-precision
#: Adam, 2 bytes of bf16/fp16 weights and 12 of fp32 master weights, momentum and variance
#: (Rajbhandari et al., "ZeRO", SC20, section 3.1: 16 bytes per parameter with the gradients,
#: which a checkpoint does not keep). A 405B model: 5.7 TB.
CHECKPOINT_BYTES_PER_PARAMETER = 14.0
#: Write bandwidth of the assumed remote checkpoint store, per GPU of the cluster (GB/s): the
#: Llama 3 report's storage fabric (Tectonic) sustains 2 TB/s for the 16,384-GPU training
#: (Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783, section 3.3.1; peak 7 TB/s,
#: "highly bursty checkpoint writes that saturate the storage fabric"), scaled to the simulated
#: cluster's GPU count (an assumption: a store sized like Meta's for its cluster).
CHECKPOINT_GBPS_PER_GPU = 2000.0 / 16_384
#: Name of the store the simulator adds for checkpoints when the topology has none so named.
CHECKPOINT_STORE = "remote"


@dataclass(frozen=True)
class SimConfig:
    """How to run: the placement ``solver`` (any registered one), the queue ``policy``, the
    failure model and the response, checkpoint interval and restart cost (s), the estimate
    factor for jobs without a declared estimate, the solvers' ``time_limit`` (s, for solvers
    that search), the seed, and how many time bins the time series has."""

    solver: str = "greedy"
    policy: str = "fifo"
    failures: FailureModel | None = None
    response: str = "requeue"
    evacuate: bool = False
    max_moves: int = 0
    spares_per_leaf: int = 0
    checkpoint_interval_s: float = 1800.0
    restart_s: float = 300.0
    #: Where checkpoints are written, which prices their write time (model and optimizer state,
    #: :data:`CHECKPOINT_BYTES_PER_PARAMETER`, over the path from the job's hosts to the store,
    #: a stall in the step: ``rust/core/src/storage.rs``): ``"remote"`` (a store of the
    #: topology so named, else one the simulator adds above the fabric at
    #: :data:`CHECKPOINT_GBPS_PER_GPU` times the cluster's GPUs), another store of the topology
    #: by name, or None: checkpoints cost nothing to write.
    checkpoint_store: str | None = CHECKPOINT_STORE
    #: Restart times are lognormal with mean ``restart_s`` and this standard deviation of their
    #: logarithm (0: every restart takes ``restart_s``); drawn from the seed.
    restart_sigma: float = 0.5
    #: ``gpuplace health ingest`` runs every this many seconds: degraded hardware is seen (and,
    #: with ``evacuate``, evacuated) at its next run. None: no ingest, degraded hardware stays
    #: in its jobs until it recovers or someone notices, ``detect_s`` later.
    health_ingest_s: float | None = None
    detect_s: float = 4 * 3600.0
    estimate_factor: float = 1.0
    #: EASY backfill runs at most once per this many seconds (Slurm's ``bf_interval``
    #: default, 30 s); the in-order start of the queue's head runs on every event. 0: on
    #: every event.
    backfill_interval_s: float = 30.0
    #: ``slurm``: the Unix time at simulated time 0. Slurm's backfill tries a pending job after
    #: groups of running jobs' ends aligned to 30 s of its wall clock (:mod:`gpuplace.sim.slurm`),
    #: so a replay of a real run passes the real run's start time; any value is as likely.
    clock_origin_s: float = 0.0
    #: Seconds per placement for solvers that search (refine, cpsat, auto): short, since a
    #: replay places tens of thousands of jobs (refine's own default is 0.5 s).
    time_limit: float | None = 0.01
    seed: int = 0
    bins: int = 200
    #: Check the invariants (no GPU held twice, none on failed hardware) after every event.
    check: bool = False
    #: Re-price the running jobs that cross the fabric whenever allocations change: needed
    #: once the cost model prices contention between jobs (a job's speed then depends on its
    #: neighbours); without contention it changes nothing and costs time.
    reprice_on_change: bool = False

    def validate(self) -> None:
        if self.solver not in solvers():
            raise InvalidJob(
                f"unknown solver {self.solver!r}; the solvers are {', '.join(solvers())}"
            )
        if self.policy not in POLICIES:
            raise InvalidJob(f"unknown queue policy {self.policy!r}; use {', '.join(POLICIES)}")
        if self.response not in RESPONSES:
            raise InvalidJob(
                f"unknown failure response {self.response!r}; use {', '.join(RESPONSES)}"
            )
        for key in ("checkpoint_interval_s", "estimate_factor"):
            if not getattr(self, key) > 0:
                raise InvalidJob(f"{key} must be > 0, got {getattr(self, key)!r}")
        if not self.backfill_interval_s >= 0:
            raise InvalidJob(f"backfill_interval_s must be >= 0, got {self.backfill_interval_s!r}")
        if self.restart_s < 0 or self.bins < 1 or self.max_moves < 0 or self.spares_per_leaf < 0:
            raise InvalidJob("restart_s, max_moves and spares_per_leaf must be >= 0 and bins >= 1")
        if not (0 <= self.restart_sigma < math.inf and 0 <= self.detect_s < math.inf):
            raise InvalidJob(
                f"restart_sigma and detect_s must be finite numbers >= 0, got "
                f"{self.restart_sigma!r} and {self.detect_s!r}"
            )
        if self.health_ingest_s is not None and not 0 < self.health_ingest_s < math.inf:
            raise InvalidJob(
                f"health_ingest_s must be a number of seconds > 0, got {self.health_ingest_s!r}"
            )


@dataclass
class JobRecord:
    """What happened to one job. Times in seconds from the first arrival; GPU-seconds."""

    job: SimJob
    first_start: float | None = None
    finish: float | None = None
    held_gpu_s: float = 0.0
    kept_gpu_s: float = 0.0
    kept_work_s: float = 0.0
    lost_gpu_s: dict[str, float] = field(default_factory=dict)
    restarts: int = 0
    model_flops: float = 0.0
    reason: str = ""
    #: The cause of the last interruption: its restart cost is lost to it.
    restart_cause: str = ""
    #: Productive running time (s, restarts excluded) and the integrals over it of the step
    #: time's factors from contention and from degraded hardware (see :class:`_Run`).
    running_s: float = 0.0
    contention_s: float = 0.0
    degraded_s: float = 0.0
    #: Interruptions by cause (failures that stopped or moved it).
    interruptions: dict[str, int] = field(default_factory=dict)
    #: Work (s at its reference step) kept inside the steady window, for the window's goodput.
    kept_work_window_s: float = 0.0
    #: The most hosts it ran on at once (a Kubernetes pod: always 1).
    hosts: int = 0
    #: Peak FLOPs of the GPUs it held, over the time it held them (FLOP): the denominator of
    #: its MFU, at the peak of the GPUs it got.
    peak_flop: float = 0.0
    #: GPU-seconds stalled writing checkpoints it kept (not in ``kept_gpu_s``: not progress).
    checkpoint_gpu_s: float = 0.0

    @property
    def mfu(self) -> float | None:
        """Model FLOPs of its kept work over the peak FLOPs of the GPUs it held while it held
        them (None without a model)."""
        return (
            self.model_flops / self.peak_flop if self.model_flops > 0 and self.peak_flop else None
        )

    @property
    def ettr(self) -> float | None:
        """Effective training time ratio (Kokolis et al., HPCA'25): the wall time from its
        first start to its finish spent making progress it kept (not restarting, not redoing
        lost work, not waiting to be placed again); None unless it finished."""
        if self.finish is None or self.first_start is None or self.finish <= self.first_start:
            return None
        return min(1.0, self.kept_gpu_s / self.job.gpus / (self.finish - self.first_start))

    @property
    def contention_slowdown(self) -> float | None:
        """Time-weighted mean factor by which neighbours' traffic lengthened the job's step
        (1.0: never slowed; None if it never ran)."""
        return self.contention_s / self.running_s if self.running_s > 0 else None

    @property
    def degraded_slowdown(self) -> float | None:
        """Time-weighted mean factor by which degraded hardware under the job lengthened its
        step (1.0: never slowed; None if it never ran)."""
        return self.degraded_s / self.running_s if self.running_s > 0 else None

    @property
    def queue_s(self) -> float | None:
        return None if self.first_start is None else self.first_start - self.job.submit_s

    @property
    def jct_s(self) -> float | None:
        return None if self.finish is None else self.finish - self.job.submit_s


class _Run:
    """A running segment of a job: from ``start`` (restart cost first) on ``gpus``."""

    __slots__ = (
        "base_comm",
        "base_step",
        "bytes_per_step",
        "cause",
        "checkpoint_s",
        "crossing",
        "exclusive_rest",
        "factors",
        "gpus",
        "name",
        "peak",
        "profile",
        "record",
        "restart",
        "start",
        "timeline",
        "version",
        "work_left",
    )

    def __init__(
        self, record: JobRecord, gpus: np.ndarray, start: float, restart: float, cause: str
    ):
        self.record = record
        self.name = record.job.name
        self.gpus = gpus
        self.start = start
        self.restart = restart
        self.cause = cause
        self.work_left = record.job.work_s - record.kept_work_s
        # (time, speed) from which each speed holds; speed 0 during the restart.
        self.timeline: list[tuple[float, float]] = []
        #: (contention, degraded) step-time factors from each timeline point on, and the
        #: share of the step spent writing checkpoints.
        self.factors: list[tuple[float, float, float]] = []
        #: Wall seconds one checkpoint stalls the job (its write time), as last priced.
        self.checkpoint_s = 0.0
        #: Step time (s) of this placement alone on healthy hardware, when needed.
        self.base_step: float | None = None
        self.base_comm = 0.0
        #: Whether the job's traffic leaves its NVLink domain (so it can load the fabric).
        self.crossing = False
        #: GPUs of its nodes held with it but unused (an --exclusive job under Slurm).
        self.exclusive_rest = 0
        #: Peak FLOP/s of one GPU of this placement (its slowest host type's).
        self.peak = 0.0
        self.version = 0
        self.profile: JobProfile | None = None
        #: Bytes per step by level (None when the job moves none).
        self.bytes_per_step: np.ndarray | None = None

    def work_between(self, a: float, b: float) -> float:
        done = 0.0
        points = self.timeline
        for i, (t, speed) in enumerate(points):
            end = points[i + 1][0] if i + 1 < len(points) else math.inf
            lo, hi = max(a, t), min(b, end)
            if hi > lo:
                done += speed * (hi - lo)
        return done

    def segment_totals(
        self, now: float, kept_until: float, window: tuple[float, float]
    ) -> tuple[float, float, float, float, float, float, float]:
        """What closing the segment at ``now`` needs, in one pass over the timeline (each sum
        taken in the same order as :meth:`work_between` takes it):
        the work up to ``kept_until`` and up to ``now``, the work inside ``window`` (up to
        ``kept_until``), the running time and the contention and degraded integrals up to
        ``now``, and the time spent writing checkpoints up to ``kept_until``."""
        start = self.start
        w0, w1 = max(window[0], start), min(window[1], kept_until)
        kept = done = in_window = running = cont = degr = writing = 0.0
        points = self.timeline
        last = len(points) - 1
        for i, (t, speed) in enumerate(points):
            end = points[i + 1][0] if i < last else math.inf
            lo = max(start, t)
            hi = min(kept_until, end)
            if hi > lo:
                kept += speed * (hi - lo)
                if speed > 0:
                    writing += self.factors[i][2] * (hi - lo)
            hi = min(now, end)
            if hi > lo:
                done += speed * (hi - lo)
                if speed > 0:
                    c, d, _ = self.factors[i]
                    running += hi - lo
                    cont += c * (hi - lo)
                    degr += d * (hi - lo)
            if w1 > w0:
                lo_w, hi_w = max(w0, t), min(w1, end)
                if hi_w > lo_w:
                    in_window += speed * (hi_w - lo_w)
        return kept, done, in_window, running, cont, degr, writing

    def finish_time(self, now: float) -> float:
        t, speed = self.timeline[-1]
        left = self.work_left - self.work_between(self.start, max(now, t))
        if speed <= 0:
            return math.inf
        return max(now, t) + max(left, 0.0) / speed


def _with_checkpoint_store(topology: Topology, name: str | None) -> tuple[Topology, str | None]:
    """The topology the simulation runs on and the name of its checkpoint store (None:
    checkpoints cost nothing to write). ``"remote"`` without a store so named adds one above
    the fabric at :data:`CHECKPOINT_GBPS_PER_GPU` times the cluster's GPUs, on a copy (the
    caller's topology is left as it is; the compiled topology is shared)."""
    if name is None or name in topology.stores:
        return topology, name
    if name != CHECKPOINT_STORE:
        known = ", ".join(sorted(topology.stores)) or "none"
        raise InvalidJob(
            f"checkpoint_store {name!r}: not a store of {topology.name} (its stores: {known}); "
            f"use {CHECKPOINT_STORE!r} for an assumed remote store or none for free checkpoints"
        )
    gbps = CHECKPOINT_GBPS_PER_GPU * topology.num_gpus
    with_store = copy.copy(topology)
    with_store.stores = {**topology.stores, name: Store(name, "remote", gbps, gbps)}
    return with_store, name


def _type_peak(topology: Topology, host_type: str) -> float | None:
    """Peak FLOP/s of one GPU of a host type: its ``peak_tflops``, else its ``gpu_model`` in
    the core's table; None if unknown."""
    node_type = topology.node_types[host_type]
    peak = node_type.peak_tflops
    if peak is None and node_type.gpu_model:
        peak = gpu_peak_tflops(node_type.gpu_model)
    return None if peak is None else float(peak) * 1e12


def _gpus_by_type(topology: Topology) -> dict[str, np.ndarray]:
    host_of_gpu = topology.path[:, topology.node_level]
    host_types = np.asarray(topology.host_types)
    type_of_gpu = host_types[host_of_gpu]
    return {str(t): np.flatnonzero(type_of_gpu == t) for t in np.unique(type_of_gpu)}


def reference_gpus(topology: Topology) -> np.ndarray | None:
    """On a cluster whose host types differ in GPU peak: a mask of the GPUs of the most common
    peak (by GPU count, ties to the faster), where a job's work is defined (its runtime there,
    see :mod:`gpuplace.sim.speed`); on faster GPUs it runs faster, on slower ones slower.
    None on a cluster whose GPUs all have the same peak."""
    by_peak: dict[float, list[int]] = {}
    for host_type, gpus in _gpus_by_type(topology).items():
        peak = _type_peak(topology, host_type)
        if peak is not None:
            by_peak.setdefault(peak, []).extend(gpus.tolist())
    if len(by_peak) <= 1:
        return None
    peak = max(by_peak, key=lambda p: (len(by_peak[p]), p))
    mask = np.zeros(topology.num_gpus, dtype=bool)
    mask[by_peak[peak]] = True
    return mask


def cluster_peak_flops(topology: Topology) -> float:
    """Mean peak FLOP/s per GPU of the cluster (each host type at its own peak; a type whose
    peak is unknown at :func:`gpuplace.sim.speed.peak_flops`)."""
    fallback = peak_flops(topology)
    total = 0.0
    for host_type, gpus in _gpus_by_type(topology).items():
        peak = _type_peak(topology, host_type)
        total += len(gpus) * (fallback if peak is None else peak)
    return total / topology.num_gpus


def _slowdown_factors(
    step: float, report: Any, base_step: float, base_comm: float
) -> tuple[float, float]:
    """Split the lengthening of a job's step over the same placement alone on healthy
    hardware (``base_step``, ``base_comm`` s) between contention and degraded hardware.

    The core prices the placement on the state (``step``, contended ``comm_seconds``) and
    alone on the state's hardware (``alone_seconds``); the communication added by degraded
    links is ``alone - base_comm`` and by neighbours ``contended - alone``. The step time
    added (``step - base_step``, after overlap with compute) is split between them in that
    proportion. Returns (contention, degraded) factors, each >= 1: the step with that cause
    over the step without it."""
    extra = max(0.0, step - base_step)
    if extra <= 0.0 or base_step <= 0.0:
        return 1.0, 1.0
    contended = float(report.comm_seconds)
    alone = contended if report.alone_seconds is None else float(report.alone_seconds)
    by_degraded = max(0.0, alone - base_comm)
    by_neighbours = max(0.0, contended - alone)
    total = by_degraded + by_neighbours
    # Without a communication difference (a slow GPU) it is all degraded hardware.
    share = by_neighbours / total if total > 0 else 0.0
    extra_contention = extra * share
    contention_factor = step / (step - extra_contention)
    degraded_factor = (base_step + extra - extra_contention) / base_step
    return contention_factor, degraded_factor


@dataclass
class SimResult:
    """The outcome of one simulation (see :mod:`gpuplace.sim.metrics` for the summary)."""

    workload: str
    cluster: str
    config: SimConfig
    num_gpus: int
    records: list[JobRecord]
    #: Step function of the cluster: at times[i] (s), allocated / unusable GPUs, queued and
    #: running jobs, until times[i + 1].
    times: np.ndarray
    allocated: np.ndarray
    unusable: np.ndarray
    queued: np.ndarray
    running: np.ndarray
    #: Fragmentation samples: time, largest tp-8 job placeable, FGD expected unallocated GPUs.
    frag_times: np.ndarray
    largest_tp8: np.ndarray
    fgd_unallocated: np.ndarray
    fabric_bytes: dict[str, float]
    lost_gpu_s: dict[str, float]
    failures: dict[str, int]
    peak_flops: float
    elapsed_s: float
    end_s: float
    #: Failures were drawn up to this time (s; None without a failure model).
    failure_horizon_s: float | None = None
    #: The steady window (s): the middle 80 % of the arrivals.
    window: tuple[float, float] = (0.0, 0.0)


class _Simulator:
    def __init__(
        self,
        topology: Topology,
        workload: Workload,
        config: SimConfig,
        progress: Callable[[float], None] | None,
        reference: Topology | None = None,
    ):
        config.validate()
        topology, self.checkpoint_store = _with_checkpoint_store(topology, config.checkpoint_store)
        self.topology = topology
        self.config = config
        self.workload = workload
        self.state = ClusterState(topology)
        #: Restart times, drawn from their own stream (the failures drawn stay the same).
        self.restart_rng = np.random.default_rng([config.seed, 27])
        self.progress = progress
        self.records = {j.name: JobRecord(j) for j in workload.jobs}
        if len(self.records) != len(workload.jobs):
            raise InvalidJob(f"workload {workload.name}: job names must be unique")
        self.reference = reference
        self.empty: dict[int, ClusterState] = {}
        self.typical: dict[int, np.ndarray | None] = {}
        self.templates: dict[tuple[int, int, int, str, int], Job] = {}
        self.profiles: dict[tuple[int, int, int, str, int], JobProfile] = {}
        self.running: dict[str, _Run] = {}
        self.queue: list[tuple[tuple[Any, ...], str]] = []
        self.events: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.recoveries = 0
        self.release_epoch = 0
        #: (job shape, solver) -> the release epoch at which it last failed to place.
        self.failed_epoch: dict[tuple[Any, str], int] = {}
        self.place_keys: dict[str, tuple[Any, str]] = {}
        self.series: list[tuple[float, int, int, int, int]] = []
        self.allocated = 0
        self.unusable = 0
        self.names = topology.level_names
        self.fabric = np.zeros(len(self.names))
        self.lost: dict[str, float] = {}
        self.failure_counts: dict[str, int] = {}
        self.drained_for: dict[tuple[str, int], list[str]] = {}
        #: Failures are drawn up to here (s); arrivals and ended jobs for progress.
        self.failure_until = 0.0
        self.arrived = 0
        self.ended = 0
        self.next_report = 0
        #: The steady window (s): the middle 80 % of the arrivals (10th to 90th percentile of
        #: the submit times), without the ramp-up and the drain.
        submits = np.array([j.submit_s for j in workload.jobs] or [0.0])
        self.window = (float(np.percentile(submits, 10)), float(np.percentile(submits, 90)))
        #: EASY: when the next backfill pass may run, and whether a wake-up for it is queued.
        self.next_backfill = 0.0
        #: ``slurm``: the state a backfill pass that started nothing last saw.
        self.slurm_backfill_seen: tuple[int, int, int] | None = None
        self.backfill_pending = False
        #: Running jobs to re-price at the end of this instant (their neighbours changed).
        self.dirty: set[str] = set()
        #: Degraded NICs now (their jobs' steps are lengthened by degraded hardware).
        self.degraded: set[str] = set()
        nvl = topology.nvlink_level
        self.nvl_level = nvl
        self.node_level = topology.node_level
        self.peak = cluster_peak_flops(topology)
        sizes = np.array([j.gpus for j in workload.jobs] or [1])
        ks, counts = np.unique(sizes, return_counts=True)
        self.fgd_sizes, self.fgd_weights = ks, counts / counts.sum()
        self.node_capacity = np.asarray(topology.domain_sizes(topology.node_level))
        self.host_of_gpu = topology.path[:, topology.node_level]
        self.frag: list[tuple[float, int, float]] = []
        spares = self._reserve_spares() if config.spares_per_leaf else 0
        usable = topology.num_gpus - spares
        # Jobs that can never start, and why (said at arrival, not "still queued at the end").
        self.over_capacity = {
            j.name: f"needs {j.gpus} GPUs, the cluster has {topology.num_gpus}"
            + (f" of which {spares} are reserved as spares" if spares else "")
            for j in workload.jobs
            if j.gpus > usable
        }
        # A Kubernetes pod never spans hosts: under a pod solver a job larger than the largest
        # host stays pending for good (kube-scheduler moves on to the next pod; it is refused
        # here rather than left at the head of the queue).
        largest_host = int(self.node_capacity.max()) if len(self.node_capacity) else 0
        for j in workload.jobs:
            if j.name not in self.over_capacity and j.gpus > largest_host:
                if self._solver_for(j).endswith("-pod"):
                    self.over_capacity[j.name] = (
                        f"needs {j.gpus} GPUs in one pod, and a pod never spans hosts: the "
                        f"largest host has {largest_host}"
                    )

    # ------------------------------------------------------------------ internals
    def _push(self, t: float, kind: int, payload: Any) -> None:
        self.recoveries += kind == _RECOVER
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, payload))

    def _shape(self, job: SimJob) -> tuple[Job, JobProfile]:
        key = job.shape
        template = self.templates.get(key)
        if template is None:
            template = job_template(job)
            # The reference step (the job's work) is the job's without checkpoints: writing
            # them slows it down from there.
            profile = self.profiles[key] = self._profile(template)
            template = self.templates[key] = self._with_checkpoints(template, profile)
        return template, self.profiles[key]

    def _with_checkpoints(self, template: Job, profile: JobProfile) -> Job:
        """The job writing its checkpoints (model and optimizer state) to the checkpoint store
        every ``checkpoint_interval_s`` of its reference steps, so that the core prices their
        write time over the path to the store into its step (a stall amortized over the
        interval) and their traffic loads the uplinks while it runs."""
        model = template.model
        if self.checkpoint_store is None or model is None or profile.reference_step_seconds <= 0:
            return template
        steps = max(1.0, self.config.checkpoint_interval_s / profile.reference_step_seconds)
        data = DataAccess(
            checkpoint_store=self.checkpoint_store,
            checkpoint_bytes=CHECKPOINT_BYTES_PER_PARAMETER * model.parameters,
            checkpoint_interval_steps=steps,
        )
        return replace(template, data=data)

    def _restart_cost(self) -> float:
        """Seconds one restart takes: lognormal with mean ``restart_s`` (see SimConfig)."""
        mean, sigma = self.config.restart_s, self.config.restart_sigma
        if mean <= 0 or sigma <= 0:
            return mean
        return float(self.restart_rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma))

    def _profile(self, template: Job) -> JobProfile:
        """The job's reference step: alone on the empty reference cluster (this one unless a
        what-if names another), placed by greedy on its most common GPU type (see
        :func:`reference_gpus`); anywhere on it if it does not fit there; this cluster if it
        does not fit on the reference."""
        for reference_topology in dict.fromkeys((self.reference, self.topology)):
            if reference_topology is None:
                continue
            key = id(reference_topology)
            if key not in self.empty:
                # Once per cluster, not per job shape: the empty state and its typical GPUs.
                self.empty[key] = ClusterState(reference_topology)
                self.typical[key] = reference_gpus(reference_topology)
            empty = self.empty[key]
            for view in (empty.fenced_view(self.typical[key]), empty):
                try:
                    report = place(view, template, "greedy").cost
                except Infeasible:
                    continue
                return job_profile(template, self.topology, report, reference_topology)
        return JobProfile(0.0, 0.0, peak_flops(self.topology), 0.0)

    def _queue_key(self, job: SimJob) -> tuple[Any, ...]:
        if self.config.policy == "priority":
            return (-job.priority, job.submit_s, job.name)
        return (job.submit_s, job.name)

    def _enqueue(self, job: SimJob) -> None:
        bisect.insort(self.queue, (self._queue_key(job), job.name))

    def _estimate(self, job: SimJob) -> float:
        return (
            job.estimate_s
            if job.estimate_s is not None
            else job.work_s * self.config.estimate_factor
        )

    def _reserve_spares(self) -> int:
        """Reserve ``spares_per_leaf`` GPUs of every leaf for repairs; how many in all."""
        leaf = min(self.topology.node_level + 1, len(self.names) - 1)
        path = self.topology.path
        gpus = []
        for domain in np.unique(path[:, leaf]):
            members = np.flatnonzero(path[:, leaf] == domain)
            gpus.extend(members[-self.config.spares_per_leaf :].tolist())
        self.state.reserve_spares(gpus=gpus)
        return len(gpus)

    # ------------------------------------------------------------------ running jobs
    def _set_speed(
        self,
        run: _Run,
        now: float,
        speed: Speed,
        factors: tuple[float, float, float] = (1.0, 1.0, 0.0),
    ) -> None:
        t0 = run.start + run.restart
        if now < t0:
            if run.restart > 0:
                run.timeline = [(run.start, 0.0), (t0, speed.speed)]
                run.factors = [(1.0, 1.0, 0.0), factors]
            else:
                run.timeline = [(run.start, speed.speed)]
                run.factors = [factors]
        else:
            run.timeline.append((now, speed.speed))
            run.factors.append(factors)
        # Unique across segments, so a finish event of an earlier segment never matches.
        run.version = self.seq + 1
        finish = run.finish_time(now)
        if finish < math.inf:
            self._push(finish, _FINISH, (run.name, run.version))

    def _price(
        self, run: _Run, now: float, template: Job, profile: JobProfile, report: Any
    ) -> None:
        """Set ``run``'s speed from ``report`` (its placement priced on the state), with the
        factors by which contention and degraded hardware lengthen its step."""
        speed = job_speed(report, profile)
        if speed.mfu is not None and speed.mfu > 1.0 + 1e-9:
            raise InvalidState(
                f"job {run.name}: MFU {speed.mfu:.1%} on its GPUs, above 100 %: the step time "
                "is shorter than the model FLOPs allow at the GPUs' peak"
            )
        slowdown = (1.0, 1.0)
        # Only traffic that leaves the NVLink domain meets an uplink (hot or degraded).
        if run.crossing and (self.degraded or report.hot_uplinks):
            if run.base_step is None:
                # The same placement alone on healthy hardware: what the job would run at
                # without neighbours and without degraded links.
                base = evaluate(self.topology, template, run.gpus)
                run.base_step = job_speed(base, profile).step_seconds
                run.base_comm = float(base.comm_seconds)
            slowdown = _slowdown_factors(speed.step_seconds, report, run.base_step, run.base_comm)
        # Checkpoint writes: the share of the step they stall (amortized in the core's step),
        # and one checkpoint's stall in wall seconds.
        writing = getattr(report, "checkpoint_seconds", None) or 0.0
        share = writing / speed.step_seconds if writing > 0 and speed.step_seconds > 0 else 0.0
        data = template.data
        run.checkpoint_s = (
            writing * data.checkpoint_interval_steps if data is not None and writing > 0 else 0.0
        )
        factors = (*slowdown, share)
        last = run.timeline[-1] if run.timeline else None
        if last is not None and last[1] == speed.speed and run.factors[-1] == factors:
            return
        self._set_speed(run, now, speed, factors)

    def _mark_neighbours(self, name: str, report_uplinks: Iterable[Any]) -> None:
        """Re-price, at the end of this instant, the jobs sharing a hot uplink with ``name``."""
        for uplink in report_uplinks:
            self.dirty.update(uplink.jobs)
        self.dirty.discard(name)

    def _start(
        self,
        record: JobRecord,
        gpus: np.ndarray,
        now: float,
        template: Job,
        profile: JobProfile,
        report: Any,
        restart: float,
        cause: str,
        *,
        allocate: bool = True,
    ) -> None:
        name = record.job.name
        if allocate:
            # With its spec, so its collectives load the fabric's uplinks and its neighbours
            # see it (gpuplace.cluster.fabric). The spec is the shape's shared template (its
            # compiled arrays are cached; a copy named after the job would compile again).
            self.state.allocate(name=name, gpus=gpus, job=template)
        self.allocated += len(gpus)
        run = _Run(record, gpus, now, restart, cause)
        if (
            allocate
            and record.job.exclusive
            and self._solver_for(record.job) == "slurm-tree-exclusive"
        ):
            # Slurm gives an --exclusive job every resource of its nodes: the GPUs it does not
            # use are held with it (and count as allocated), so nobody shares its nodes.
            hosts = np.unique(self.host_of_gpu[gpus])
            rest = np.flatnonzero(np.isin(self.host_of_gpu, hosts) & self.state.free_mask())
            if rest.size:
                self.state.allocate(name=f"{name}/exclusive", gpus=rest)
                self.allocated += len(rest)
                run.exclusive_rest = len(rest)
        run.profile = profile
        per_level = list(report.bytes_by_level.values())
        # A job that moves no bytes (one GPU, or no declared communication) adds nothing to
        # the fabric's totals when it ends (see _end_segment).
        run.bytes_per_step = np.array(per_level, dtype=np.float64) if any(per_level) else None
        run.crossing = any(per_level[self.nvl_level + 1 :])
        peak_tflops = report.peak_tflops
        run.peak = profile.peak_flops if peak_tflops is None else float(peak_tflops) * 1e12
        if run.crossing:
            # Priced again now that it runs: with its neighbours' load and theirs with it.
            report = evaluate(self.topology, template, gpus, state=self.state)
            self._mark_neighbours(name, report.hot_uplinks)
        if record.first_start is None:
            record.first_start = now
        if len(gpus) > 1:
            record.hosts = max(record.hosts, len(set(self.host_of_gpu[gpus].tolist())))
        elif not record.hosts:
            record.hosts = 1
        self.running[run.name] = run
        run.timeline = []
        self._price(run, now, template, profile, report)

    def _end_segment(
        self, run: _Run, now: float, kept_until: float, *, release: bool = True
    ) -> float:
        """Close a segment at ``now`` keeping the work done up to ``kept_until``; returns the
        work kept. Releases the GPUs (unless a repair already moved them)."""
        record = run.record
        gpus = len(run.gpus)
        held = gpus * (now - run.start)
        record.held_gpu_s += held + run.exclusive_rest * (now - run.start)
        record.peak_flop += held * run.peak
        if run.exclusive_rest:
            self.state.release(f"{run.name}/exclusive")
            self.allocated -= run.exclusive_rest
            run.exclusive_rest = 0
        restart_end = min(now, run.start + run.restart)
        if restart_end > run.start:
            self._lose(record, run.cause, gpus * (restart_end - run.start))
        kept, done, in_window, running, cont, degr, writing = run.segment_totals(
            now, kept_until, self.window
        )
        productive_kept = max(0.0, kept_until - restart_end) if kept_until > run.start else 0.0
        # Time stalled writing the checkpoints it kept is not progress (ETTR leaves it out).
        record.kept_gpu_s += gpus * max(0.0, productive_kept - writing)
        record.checkpoint_gpu_s += gpus * min(writing, productive_kept)
        record.kept_work_s += kept
        if min(self.window[1], kept_until) > max(self.window[0], run.start):
            record.kept_work_window_s += in_window
        record.running_s += running
        record.contention_s += cont
        record.degraded_s += degr
        if run.crossing and release:
            self._release_neighbours(run)
        profile = run.profile
        if profile is not None and profile.reference_step_seconds > 0:
            if run.bytes_per_step is not None:
                self.fabric += run.bytes_per_step * (done / profile.reference_step_seconds)
            record.model_flops += (
                profile.model_flops_per_gpu * gpus * kept / profile.reference_step_seconds
            )
        if release:
            self.state.release(run.name)
        self.allocated -= gpus
        self.release_epoch += 1
        del self.running[run.name]
        return kept

    def _release_neighbours(self, run: _Run) -> None:
        """Before ``run`` gives its GPUs back: its neighbours on hot uplinks speed up."""
        spec = self.state.specs.get(run.name)
        if spec is not None:
            self._mark_neighbours(run.name, contention(self.state, spec, run.gpus).uplinks)

    def _lose(self, record: JobRecord, cause: str, gpu_s: float) -> None:
        if gpu_s <= 0:
            return
        record.lost_gpu_s[cause] = record.lost_gpu_s.get(cause, 0.0) + gpu_s
        self.lost[cause] = self.lost.get(cause, 0.0) + gpu_s

    def _last_checkpoint(self, run: _Run, now: float) -> float:
        """When the job's last checkpoint was complete: one every ``checkpoint_interval_s``
        of running plus the checkpoint's own write time."""
        productive = run.start + run.restart
        if now <= productive:
            return run.start
        interval = self.config.checkpoint_interval_s + run.checkpoint_s
        return productive + math.floor((now - productive) / interval) * interval

    def _interrupt(self, run: _Run, now: float, cause: str) -> None:
        """Stop ``run`` at ``now`` because of ``cause``: it keeps its work up to its last
        checkpoint and loses the rest."""
        checkpoint = self._last_checkpoint(run, now)
        lost_from = max(checkpoint, run.start + run.restart)
        self._lose(run.record, cause, len(run.gpus) * max(0.0, now - lost_from))
        self._end_segment(run, now, checkpoint)
        run.record.restarts += 1
        run.record.restart_cause = cause
        run.record.interruptions[cause] = run.record.interruptions.get(cause, 0) + 1

    def _finish(self, name: str, version: int, now: float) -> None:
        run = self.running.get(name)
        if run is None or run.version != version:
            return
        self._end_segment(run, now, now)
        record = run.record
        record.kept_work_s = record.job.work_s  # exactly, not up to rounding
        record.finish = now
        self.ended += 1
        self._report_progress(len(self.workload.jobs))

    # ------------------------------------------------------------------ scheduling
    def _try_start(self, name: str, now: float, restart: float = 0.0, cause: str = "") -> bool:
        record = self.records[name]
        if self._known_infeasible(record.job):
            return False
        template, profile = self._shape(record.job)
        solver = self._solver_for(record.job)
        try:
            placement = place(
                self.state,
                template,
                solver,
                seed=self.config.seed,
                time_limit=self.config.time_limit,
            )
        except Infeasible:
            self.failed_epoch[self.place_keys[name]] = self.release_epoch
            return False
        if record.restarts:
            restart, cause = self._restart_cost(), record.restart_cause
        self._start(record, placement.gpus, now, template, profile, placement.cost, restart, cause)
        return True

    def _known_infeasible(self, job: SimJob) -> bool:
        """A job of the same shape failed to place since anything was last freed: it would
        fail again (starting jobs only takes GPUs away). Without this a backfill pass would
        ask the solver again for every queued job of a shape that cannot fit, hundreds of
        times per event."""
        key = self.place_keys.get(job.name)
        if key is None:
            key = self.place_keys[job.name] = (job.shape, self._solver_for(job))
        return self.failed_epoch.get(key) == self.release_epoch

    def _solver_for(self, job: SimJob) -> str:
        """The configured solver, as its scheduler treats this job: ``slurm-tree`` gives an
        ``--exclusive`` job whole nodes; the topology-blind peers bind a Kubernetes pod to one
        node (kube-scheduler never splits a pod)."""
        solver = self.config.solver
        if job.exclusive and solver == "slurm-tree":
            return "slurm-tree-exclusive"
        if job.pod and solver in ("first-fit", "random"):
            return f"{solver}-pod"
        return solver

    def _reservation(self, gpus: int, now: float, free: int) -> tuple[float, int]:
        if not self.running:
            return math.inf, free
        ends = np.array(
            [
                max(
                    now,
                    r.start
                    + r.restart
                    + self._estimate(r.record.job) * r.work_left / r.record.job.work_s,
                )
                for r in self.running.values()
            ]
        )
        held = np.array([len(r.gpus) for r in self.running.values()])
        order = np.argsort(ends, kind="stable")
        freed = free + np.cumsum(held[order])
        enough = np.flatnonzero(freed >= gpus)
        if enough.size == 0:
            return math.inf, free
        at = int(enough[0])
        return float(ends[order[at]]), int(freed[at] - gpus)

    def _schedule(self, now: float) -> None:
        queue = self.queue
        if not queue:
            return
        free = self.state.free_gpus
        failed, keys, epoch = self.failed_epoch, self.place_keys, self.release_epoch
        i = 0
        shadow, extra, tested = math.inf, 0, 0
        blocked = False
        head_gpus = 0
        reserved = False
        while i < len(queue):
            name = queue[i][1]
            job = self.records[name].job
            if not blocked:
                if job.gpus <= free and self._try_start(name, now):
                    queue.pop(i)
                    free -= job.gpus
                    continue
                if self.config.policy not in ("easy", "slurm"):
                    return
                if self.config.policy == "slurm":
                    # Slurm's backfill thread wakes every bf_interval on its own clock.
                    interval = self.config.backfill_interval_s
                    self.next_backfill = max(self.next_backfill, next_pass(now, interval))
                    if now < self.next_backfill:
                        self._wake_for_backfill()
                        return
                    self.next_backfill = now + interval if interval > 0 else 0.0
                    backfill_pass(self, now, i, BACKFILL_DEPTH)
                    return
                # Slurm's backfill runs every bf_interval, not on every event (its main
                # scheduler does): at most one backfill pass per interval.
                if now < self.next_backfill:
                    self._wake_for_backfill()
                    return
                self.next_backfill = now + self.config.backfill_interval_s
                blocked = True
                head_gpus = job.gpus
                i += 1
                continue
            tested += 1
            if tested > BACKFILL_DEPTH or free <= 0:
                break
            key = keys.get(name)
            if job.gpus <= free and (key is None or failed.get(key) != epoch):
                if not reserved:
                    shadow, extra = self._reservation(head_gpus, now, free)
                    reserved = True
                ends_in_time = now + self._estimate(job) <= shadow
                if (ends_in_time or job.gpus <= extra) and self._try_start(name, now):
                    queue.pop(i)
                    free -= job.gpus
                    if not ends_in_time:
                        extra -= job.gpus
                    continue
            i += 1

    def _wake_for_backfill(self) -> None:
        """A pass was put off by the interval: make sure it happens when the interval ends,
        even if no event comes then."""
        if not self.backfill_pending and self.next_backfill < math.inf:
            self.backfill_pending = True
            self._push(self.next_backfill, _BACKFILL, None)

    # ------------------------------------------------------------------ hardware
    def _hardware(self, now: float, cause: Cause, index: int) -> None:
        state, topology = self.state, self.topology
        self.failure_counts[cause.name] = self.failure_counts.get(cause.name, 0) + 1
        if cause.component == "software":
            owner = state.owner_of(index)
            run = self.running.get(owner) if owner is not None else None
            if run is not None:
                self._respond(run, now, cause.name, hardware=False)
            return
        if cause.component == "nic":
            nics = nics_of(topology)
            if not nics.names:
                return
            nic = nics.names[index % len(nics.names)]
            gpus = np.flatnonzero(nics.gpu_nic == nics.index[nic])
            # The link runs degraded in its jobs until it recovers or is noticed (and, with
            # evacuate, drained and its jobs repaired off it).
            state.degrade(nic=nic, loss=cause.loss, reason=cause.name)
            self.degraded.add(nic)
            self._push(now + cause.repair_s, _RECOVER, ("nic", nic))
            self._reprice({state.owner_of(int(g)) for g in gpus}, now)
            if self.config.evacuate:
                seen = self._detected_at(now)
                if seen < now + cause.repair_s:
                    self._push(seen, _DETECT, (cause, nic))
            return
        if cause.component == "gpu":
            target: dict[str, Any] = {"gpu": int(index)}
            if state.health()[index] != int(Health.Ok):
                return
        else:
            host = topology.hosts[index % len(topology.hosts)]
            nics = nics_of(topology)
            host_nics = [n for n in nics.names if n.startswith(f"{host}:")]
            if cause.component == "network" and host_nics:
                target = {"nic": host_nics}
            else:
                target = {"host": host}
        affected = state.fail(**target, reason=cause.name)
        self._push(now + cause.repair_s, _RECOVER, next(iter(target.items())))
        self.unusable = int(np.count_nonzero(state.health() != int(Health.Ok)))
        for owner in affected:
            run = self.running.get(owner)
            if run is not None:
                self._respond(run, now, cause.name, hardware=True)

    def _detected_at(self, now: float) -> float:
        """When degraded hardware that appeared at ``now`` is seen: at the next run of
        ``gpuplace health ingest`` (every ``health_ingest_s``), else ``detect_s`` later."""
        every = self.config.health_ingest_s
        if every is None:
            return now + self.config.detect_s
        return (math.floor(now / every) + 1) * every

    def _detect(self, now: float, cause: Cause, nic: str) -> None:
        """A degraded link is seen: with ``evacuate`` it is drained until it recovers and its
        jobs are repaired off it."""
        if nic not in self.degraded:
            return  # it recovered before anyone saw it
        state = self.state
        affected = state.drain(nic=nic, reason=cause.name)
        self.degraded.discard(nic)
        self.unusable = int(np.count_nonzero(state.health() != int(Health.Ok)))
        for owner in affected:
            run = self.running.get(owner)
            if run is not None:
                self._respond(run, now, cause.name, hardware=True, force_repair=True)

    def _respond(
        self, run: _Run, now: float, cause: str, *, hardware: bool, force_repair: bool = False
    ) -> None:
        record = run.record
        if not hardware:
            # Software failure: restart in place from the last checkpoint.
            gpus = run.gpus
            template, profile = self._shape(record.job)
            self._interrupt(run, now, cause)
            report = evaluate(self.topology, template, gpus, state=self.state)
            self._start(record, gpus, now, template, profile, report, self._restart_cost(), cause)
            return
        if self.config.response == "repair" or force_repair:
            template, profile = self._shape(record.job)
            named = replace(template, name=record.job.name)
            checkpoint = self._last_checkpoint(run, now)
            if run.crossing:
                self._release_neighbours(run)
            try:
                fixed = repair(self.state, named, max_moves=self.config.max_moves)
            except (Infeasible, InvalidState):
                fixed = None  # no repair exists on the healthy GPUs left: requeue
            if fixed is not None:
                # The repair moved the allocation; close the segment on the old GPUs' count.
                gpus = np.asarray(fixed.placement.gpus, dtype=np.int64)
                lost_from = max(checkpoint, run.start + run.restart)
                self._lose(record, cause, len(run.gpus) * max(0.0, now - lost_from))
                self._end_segment(run, now, checkpoint, release=False)
                record.restarts += 1
                record.interruptions[cause] = record.interruptions.get(cause, 0) + 1
                self._start(
                    record,
                    gpus,
                    now,
                    template,
                    profile,
                    fixed.cost_after,
                    self._restart_cost(),
                    cause,
                    allocate=False,
                )
                return
        self._interrupt(run, now, cause)
        self._enqueue(record.job)

    def _reprice(self, owners: Iterable[str | None], now: float) -> None:
        for owner in sorted(o for o in owners if o is not None):
            run = self.running.get(owner)
            if run is None:
                continue
            template, profile = self._shape(run.record.job)
            report = evaluate(self.topology, template, run.gpus, state=self.state)
            self._price(run, now, template, profile, report)

    def _reprice_fabric_jobs(self, now: float) -> None:
        """Re-price every running job whose traffic leaves its NVLink domain."""
        start = self.nvl_level + 1
        crossing = {
            name
            for name, run in self.running.items()
            if run.bytes_per_step is not None and run.bytes_per_step[start:].any()
        }
        self._reprice(crossing, now)

    def _recover(self, now: float, target: tuple[str, Any]) -> None:
        kind, name = target
        affected_before = set()
        if kind == "nic":
            nics = nics_of(self.topology)
            names = name if isinstance(name, list) else [name]
            for n in names:
                gpus = np.flatnonzero(nics.gpu_nic == nics.index[n])
                affected_before |= {self.state.owner_of(int(g)) for g in gpus}
        self.state.recover(**{kind: name})
        if kind == "nic":
            self.degraded.difference_update(name if isinstance(name, list) else [name])
        self.unusable = int(np.count_nonzero(self.state.health() != int(Health.Ok)))
        self.release_epoch += 1
        self._reprice(affected_before, now)

    # ------------------------------------------------------------------ invariants
    def _check(self) -> None:
        self.state.check()
        health = self.state.health()
        seen = np.zeros(self.topology.num_gpus, dtype=np.int64)
        for run in self.running.values():
            seen[run.gpus] += 1
            held = self.state.job_gpus(run.name)
            assert held is not None and np.array_equal(np.sort(held), np.sort(run.gpus)), run.name
            assert not np.any(health[run.gpus] == int(Health.Failed)), (
                f"{run.name} runs on failed hardware"
            )
        assert seen.max(initial=0) <= 1, "a GPU is held by two jobs"
        assert int(seen.sum()) + sum(r.exclusive_rest for r in self.running.values()) == (
            self.allocated
        )

    # ------------------------------------------------------------------ main loop
    def _sample_fragmentation(self, t: float) -> None:
        nvl = self.state.free_counts(self.nvl_level)
        node = self.state.free_counts(self.node_level)
        largest = int(np.sum(nvl // 8) * 8)
        # FGD (Weng et al., ATC'23): a node's free GPUs count as fragmented for a task it
        # cannot hold, expected over the workload's task sizes; a task larger than a node
        # takes whole nodes, so on each node it needs the node's size.
        need = np.minimum(self.fgd_sizes[None, :], self.node_capacity[:, None])
        unallocated = float(
            np.sum(self.fgd_weights * np.sum(node[:, None] * (node[:, None] < need), axis=0))
        )
        self.frag.append((t, largest, unallocated))

    def _draw_failures(self, until: float) -> None:
        """Draw the failures up to ``until`` (s)."""
        assert self.config.failures is not None
        counts = {
            "gpu": self.topology.num_gpus,
            "host": len(self.topology.hosts),
            "nic": len(nics_of(self.topology).names),
        }
        for t, cause, index in self.config.failures.draw(counts, until, self.config.seed):
            self._push(t, _HARDWARE, (cause, index))
        self.failure_until = until

    def _report_progress(self, total: int) -> None:
        """Progress over the whole run: half for the arrivals, half for the jobs ended
        (finished or given up), so the drain after the last arrival is counted."""
        if self.progress is None or not total:
            return
        step = self.arrived + self.ended
        if step >= self.next_report:
            self.next_report = step + max(1, total // 50)
            self.progress(min(1.0, step / (2 * total)))

    def run(self) -> SimResult:
        started = time.perf_counter()
        jobs = self.workload.jobs
        horizon = (
            (jobs[-1].submit_s + max(j.work_s for j in jobs) * 4 + 30 * 86_400) if jobs else 0.0
        )
        self.failure_until = 0.0
        if self.config.failures is not None:
            self._draw_failures(horizon)
        next_job = 0
        now = 0.0
        last_arrival = jobs[-1].submit_s if jobs else 0.0
        # Fragmentation is sampled about ``bins`` times over the arrivals and the typical job
        # after them, at most once per instant (and not at all while nothing happens).
        typical = float(np.median([j.work_s for j in jobs])) if jobs else 0.0
        sample_every = max(last_arrival + typical, 1.0) / self.config.bins
        next_sample = 0.0
        total = len(jobs)
        while True:
            if next_job >= total and not self.running and (not self.queue or not self.recoveries):
                break  # done, or queued jobs that no recovery can ever start
            t_event = self.events[0][0] if self.events else math.inf
            t_arrival = jobs[next_job].submit_s if next_job < total else math.inf
            now = min(t_event, t_arrival)
            if next_sample <= now:
                self._sample_fragmentation(now)
                next_sample = max(next_sample + sample_every, now)
            allocations = self.release_epoch, self.allocated
            while self.events and self.events[0][0] <= now:
                t, kind, _, payload = heapq.heappop(self.events)
                if kind == _FINISH:
                    self._finish(payload[0], payload[1], t)
                elif kind == _HARDWARE:
                    self._hardware(t, *payload)
                elif kind == _BACKFILL:
                    self.backfill_pending = False  # the pass runs in _schedule below
                elif kind == _DETECT:
                    self._detect(t, *payload)
                else:
                    self.recoveries -= 1
                    self._recover(t, payload)
            while next_job < total and jobs[next_job].submit_s <= now:
                job = jobs[next_job]
                next_job += 1
                if job.name in self.over_capacity:
                    self.records[job.name].reason = self.over_capacity[job.name]
                    self.arrived = next_job
                    self.ended += 1
                    continue
                self._enqueue(job)
                self.arrived = next_job
                self._report_progress(total)
            self._schedule(now)
            if self.dirty:
                dirty, self.dirty = self.dirty, set()
                self._reprice(dirty, now)
            if self.config.reprice_on_change and allocations != (
                self.release_epoch,
                self.allocated,
            ):
                self._reprice_fabric_jobs(now)
            if self.config.check:
                self._check()
            self.series.append(
                (now, self.allocated, self.unusable, len(self.queue), len(self.running))
            )
        end = now if now != math.inf else (self.series[-1][0] if self.series else 0.0)
        for run in list(self.running.values()):
            self._end_segment(run, end, self._last_checkpoint(run, end))
        for _, name in self.queue:
            self.records[name].reason = self.records[name].reason or "still queued at the end"
        for record in self.records.values():
            if record.finish is None and not record.reason:
                record.reason = "unfinished"
        if self.progress is not None:
            self.progress(1.0)
        series = np.array(self.series or [(0.0, 0, 0, 0, 0)], dtype=np.float64)
        frag = np.array(self.frag or [(0.0, 0, 0.0)], dtype=np.float64)
        return SimResult(
            workload=self.workload.name,
            cluster=self.topology.name,
            config=self.config,
            num_gpus=self.topology.num_gpus,
            records=list(self.records.values()),
            times=series[:, 0],
            allocated=series[:, 1].astype(np.int64),
            unusable=series[:, 2].astype(np.int64),
            queued=series[:, 3].astype(np.int64),
            running=series[:, 4].astype(np.int64),
            frag_times=frag[:, 0],
            largest_tp8=frag[:, 1].astype(np.int64),
            fgd_unallocated=frag[:, 2],
            fabric_bytes={n: float(b) for n, b in zip(self.names, self.fabric, strict=True)},
            lost_gpu_s=dict(sorted(self.lost.items())),
            failures=dict(sorted(self.failure_counts.items())),
            peak_flops=self.peak,
            elapsed_s=time.perf_counter() - started,
            end_s=end,
            failure_horizon_s=None if self.config.failures is None else self.failure_until,
            window=self.window,
        )


def simulate(
    topology: Topology,
    workload: Workload,
    config: SimConfig | None = None,
    *,
    progress: Callable[[float], None] | None = None,
    reference: Topology | None = None,
) -> SimResult:
    """Replay ``workload`` on ``topology`` under ``config`` (see the module docstring).
    ``progress`` is called with the fraction of arrivals processed. ``reference``: the cluster
    whose empty-cluster step time defines a job's work (default ``topology``; a what-if passes
    the cluster it compares against, see :mod:`gpuplace.sim.speed`)."""
    return _Simulator(topology, workload, config or SimConfig(), progress, reference).run()
