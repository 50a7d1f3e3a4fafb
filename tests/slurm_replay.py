"""Replay a time-compressed trace through a real Slurm (a :class:`LoopbackSlurm`) and through the
simulator's Slurm policy, and compare them job by job.

The trace is a day of submissions compressed into a few minutes: arrivals follow a daily cycle
(busy afternoon, quiet night), sizes mix sub-node jobs (1, 2, 4 GPUs on shared nodes) and
whole-node ``--exclusive`` jobs (1 to 4 nodes of 8 GPUs), each job is ``sleep`` for its
duration and asks for a time limit (Slurm's estimate for backfill) of a whole number of
minutes, its duration times a user's overestimate, rounded up. Slurm keeps time limits in
minutes and its timestamps in seconds, so durations are tens of seconds to a few minutes and
the makespan several minutes: a second of timestamp is well under 1 % of the makespan; a minute
of time limit is coarse, but the simulator gets the very same limits as its estimates.

Used by ``tests/test_slurm_replay.py`` (reduced size, in CI) and ``benches/bench_slurm_replay.py``
(the larger size). Real start and end times are stamped by the job itself (``date +%s.%N`` at
the top of its script and after its sleep), so they need no accounting database.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import gpuplace
import numpy as np
from gpuplace.sim.engine import SimConfig, SimResult, simulate
from gpuplace.sim.traces import SimJob, Workload
from slurm_harness import LoopbackSlurm, SlurmError

GPUS_PER_NODE = 8

#: slurm.conf for the replay: Slurm's sched/backfill with its defaults except the intervals,
#: which are compressed with the trace (see :func:`slurm_conf`).
BACKFILL_INTERVAL_S = 2
BACKFILL_RESOLUTION_S = 1


def slurm_conf(
    bf_interval: int = BACKFILL_INTERVAL_S, bf_resolution: int = BACKFILL_RESOLUTION_S
) -> tuple[str, ...]:
    """The settings a replay runs Slurm with (replacing the harness's sched/builtin)."""
    return (
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,"
        f"bf_interval={bf_interval},bf_resolution={bf_resolution}",
        "MinJobAge=300",
    )


@dataclass(frozen=True)
class ReplayJob:
    name: str
    submit_s: float
    gpus: int
    duration_s: float
    limit_min: int
    exclusive: bool


def make_trace(
    jobs: int,
    nodes: int,
    span_s: float,
    seed: int = 0,
    durations: tuple[float, float] = (8.0, 60.0),
    max_nodes: int = 4,
) -> list[ReplayJob]:
    """``jobs`` submissions of one day compressed into ``span_s`` seconds (compression factor
    86,400 / span_s). Arrivals: a Poisson process whose rate follows the day (twice the mean in
    the afternoon, half at night). Sizes: 70 % sub-node (1, 2, 4 GPUs), 30 % whole nodes
    (``--exclusive``, 1 to ``min(max_nodes, nodes // 2)`` nodes). Durations log-uniform in
    ``durations`` (s); time limits the duration times 1 to 3, in whole minutes, at least 1."""
    rng = np.random.default_rng(seed)
    # Thinning: draw from the peak rate, keep with the daily profile's ratio.
    day = 86_400.0
    times: list[float] = []
    while len(times) < jobs:
        t = float(rng.uniform(0, day))
        profile = 1.0 + 0.5 * math.sin(2 * math.pi * (t / day - 0.375))  # peak at 15:00
        if rng.uniform(0, 1.5) < profile:
            times.append(t)
    submits = np.sort(np.array(times)) * (span_s / day)
    lo, hi = durations
    max_nodes = max(1, min(max_nodes, nodes // 2))
    out = []
    for i, submit in enumerate(submits):
        if rng.uniform() < 0.7:
            gpus, exclusive = int(rng.choice([1, 2, 4], p=[0.5, 0.3, 0.2])), False
        else:
            gpus, exclusive = GPUS_PER_NODE * int(rng.integers(1, max_nodes + 1)), True
        duration = round(float(math.exp(rng.uniform(math.log(lo), math.log(hi)))), 1)
        limit = max(1, math.ceil(duration * float(rng.uniform(1.0, 3.0)) / 60))
        out.append(
            ReplayJob(f"j{i:04d}", round(float(submit), 2), gpus, duration, limit, exclusive)
        )
    return out


# ------------------------------------------------------------------------------- real Slurm
@dataclass(frozen=True)
class Observed:
    submit_s: float
    start_s: float
    end_s: float
    nodes: str
    #: The Unix time of the replay's time 0 (the same for every job of a run; 0 when not
    #: recorded): Slurm's backfill aligns its windows to its clock, so the simulator needs it.
    origin_s: float = 0.0


def origin(observed: dict[str, Observed]) -> float:
    """The Unix time of a real run's time 0."""
    return next(iter(observed.values())).origin_s if observed else 0.0


_STAMP = re.compile(r"^([SE]) (\d+\.\d+)(?: (\S+))?", re.M)


def _sbatch(job: ReplayJob, out_dir: Path) -> list[str]:
    limit = f"--time={job.limit_min}"
    script = (
        f'echo "S $(date +%s.%N) $SLURM_JOB_NODELIST"; sleep {job.duration_s}; '
        'echo "E $(date +%s.%N)"'
    )
    if job.exclusive:
        shape = ["--exclusive", "-N", str(job.gpus // GPUS_PER_NODE)]
        shape += [f"--gres=gpu:{GPUS_PER_NODE}"]
    else:
        shape = ["-N", "1", "-n", "1", f"--gres=gpu:{job.gpus}"]
    return [
        "sbatch",
        "--parsable",
        "-J",
        job.name,
        limit,
        *shape,
        "-o",
        str(out_dir / f"{job.name}.out"),
        "--wrap",
        script,
    ]


def replay_on_slurm(
    slurm: LoopbackSlurm, trace: list[ReplayJob], timeout_s: float
) -> dict[str, Observed]:
    """Submit ``trace`` at its submit times (relative to now), wait for every job to end, and
    read each job's submit, start and end (s since the replay began) and its nodes."""
    out_dir = slurm.dir / "replay"
    out_dir.mkdir(exist_ok=True)
    t0 = time.time()
    submitted: dict[str, float] = {}
    for job in trace:
        delay = t0 + job.submit_s - time.time()
        if delay > 0:
            time.sleep(delay)
        before = time.time()
        slurm.run(*_sbatch(job, out_dir))
        submitted[job.name] = (before + time.time()) / 2 - t0
    deadline = time.monotonic() + timeout_s
    while slurm.run("squeue", "-h", "-o", "%i").stdout.strip():
        if time.monotonic() > deadline:
            raise SlurmError(f"replay: jobs still queued or running after {timeout_s:.0f} s")
        time.sleep(1.0)
    observed = {}
    for job in trace:
        path = out_dir / f"{job.name}.out"
        text = path.read_text() if path.exists() else ""
        stamps = {m.group(1): m for m in _STAMP.finditer(text)}
        if set(stamps) != {"S", "E"}:
            raise SlurmError(f"replay: {job.name} left no start/end stamps in {path}: {text!r}")
        observed[job.name] = Observed(
            submitted[job.name],
            float(stamps["S"].group(2)) - t0,
            float(stamps["E"].group(2)) - t0,
            stamps["S"].group(3) or "",
            t0,
        )
    return observed


# ------------------------------------------------------------------------------- simulator
def replay_topology(slurm: LoopbackSlurm) -> gpuplace.Topology:
    """The loopback cluster as gpuplace sees it: hosts n01.. in leaf order, 8 GPUs each."""
    per_spine = -(-slurm.leaves // slurm.spines)
    nodes = []
    for leaf in range(slurm.leaves):
        first = leaf * slurm.per_leaf + 1
        domains = {"leaf": f"leaf{leaf + 1}", "spine": f"spine{leaf // per_spine + 1}"}
        if slurm.spines > 1:
            domains["core"] = "core"
        last = first + slurm.per_leaf - 1
        nodes.append({"name": f"n[{first:02d}-{last:02d}]", "type": "hgx", "domains": domains})
    levels = [("node", 370.8), ("leaf", 50.0), ("spine", 50.0)]
    if slurm.spines > 1:
        levels.append(("core", 50.0))
    return gpuplace.Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "name": "slurm-replay",
            "levels": [{"name": n, "bandwidth_gbps": b, "latency_us": 1.0} for n, b in levels],
            "node_level": "node",
            "node_types": {"hgx": {"gpus": GPUS_PER_NODE}},
            "nodes": nodes,
        }
    )


def replay_workload(
    trace: list[ReplayJob], observed: dict[str, Observed], lat: Latency
) -> Workload:
    """The trace as the simulator takes it: submitted when Slurm got it, holding its GPUs for
    its sleep plus Slurm's launch and release latency, its time limit as its estimate, no
    model (speed 1)."""
    jobs = [
        SimJob(
            name=j.name,
            submit_s=observed[j.name].submit_s,
            gpus=j.gpus,
            work_s=j.duration_s + lat.launch_s + lat.release_s,
            estimate_s=60.0 * j.limit_min,
            model="none",
            exclusive=j.exclusive,
        )
        for j in trace
    ]
    return Workload("slurm-replay", tuple(sorted(jobs, key=lambda j: (j.submit_s, j.name))))


def simulate_replay(
    topology: gpuplace.Topology,
    workload: Workload,
    policy: str,
    bf_interval: float,
    origin_s: float = 0.0,
) -> SimResult:
    """``origin_s``: the Unix time of the real replay's time 0 (Slurm's backfill aligns its
    windows to its clock)."""
    return simulate(
        topology,
        workload,
        SimConfig(
            solver="slurm-tree",
            policy=policy,
            backfill_interval_s=bf_interval,
            clock_origin_s=origin_s,
        ),
    )


# ------------------------------------------------------------------------------- comparison
@dataclass(frozen=True)
class Comparison:
    jobs: int
    makespan_real_s: float
    makespan_sim_s: float
    median_start_error_s: float
    same_order: float
    #: The same median over the jobs that waited 2 s or more in Slurm (the rest start at
    #: submission in both, which is easy).
    waited: int = 0
    median_start_error_waited_s: float = 0.0
    #: The share of pairs in the same order among the pairs real Slurm started at least one
    #: backfill interval apart (``apart_s``): real Slurm does not repeat the order of two jobs
    #: it starts within one of its scheduling intervals, so those pairs are ties. Reported
    #: beside :attr:`same_order`, never instead of it.
    same_order_apart: float = 1.0
    apart_s: float = 0.0

    @property
    def median_start_error(self) -> float:
        """Median absolute start-time error over the real makespan."""
        return self.median_start_error_s / self.makespan_real_s

    @property
    def makespan_error(self) -> float:
        """(simulated - real) / real."""
        return self.makespan_sim_s / self.makespan_real_s - 1.0

    def line(self) -> str:
        return (
            f"{self.jobs} jobs: median start error {100 * self.median_start_error:.2f} % of "
            f"makespan ({self.median_start_error_s:.1f} s), makespan real "
            f"{self.makespan_real_s:.1f} s sim {self.makespan_sim_s:.1f} s "
            f"({100 * self.makespan_error:+.2f} %), same order {100 * self.same_order:.1f} % "
            f"of pairs ({100 * self.same_order_apart:.1f} % of those started "
            f">= {self.apart_s:g} s apart); the {self.waited} jobs that waited: median start "
            f"error {100 * self.median_start_error_waited_s / self.makespan_real_s:.2f} %"
        )


def compare(
    observed: dict[str, Observed],
    result: SimResult,
    lat: Latency,
    tie_s: float = 1.0,
    apart_s: float = BACKFILL_INTERVAL_S,
) -> Comparison:
    """Job by job: start-time error, the fraction of job pairs started in the same order (two
    starts within ``tie_s`` count as simultaneous; a pair agrees when both runs order it the
    same way or both start it together), and the makespans (first submit to last end).
    A simulated start is the scheduler's decision: its job's first line comes ``launch_s``
    later, and its last line ``release_s`` before the simulated end."""
    records = {r.job.name: r for r in result.records}
    starts = {n: float(records[n].first_start) + lat.launch_s for n in observed}
    first_sim = min(r.job.submit_s for r in result.records)
    last_end = max(r.finish for r in result.records if r.finish is not None) - lat.release_s
    return _figures(observed, starts, last_end - first_sim, tie_s, apart_s)


def compare_runs(
    first: dict[str, Observed],
    second: dict[str, Observed],
    tie_s: float = 1.0,
    apart_s: float = BACKFILL_INTERVAL_S,
) -> Comparison:
    """Two real runs of one trace, compared as :func:`compare` compares the simulator with
    ``first``: how far real Slurm repeats itself (the noise floor of the comparison)."""
    starts = {n: o.start_s for n, o in second.items()}
    makespan = max(o.end_s for o in second.values()) - min(o.submit_s for o in second.values())
    return _figures(first, starts, makespan, tie_s, apart_s)


def _figures(
    observed: dict[str, Observed],
    starts: dict[str, float],
    makespan_other: float,
    tie_s: float,
    apart_s: float,
) -> Comparison:
    names = sorted(observed)
    real = np.array([observed[n].start_s for n in names])
    other = np.array([starts[n] for n in names], dtype=np.float64)
    first_real = min(o.submit_s for o in observed.values())
    makespan_real = max(o.end_s for o in observed.values()) - first_real
    d_real = real[:, None] - real[None, :]
    d_other = other[:, None] - other[None, :]
    s_real = np.where(np.abs(d_real) < tie_s, 0, np.sign(d_real))
    s_other = np.where(np.abs(d_other) < tie_s, 0, np.sign(d_other))
    upper = np.triu_indices(len(names), k=1)
    waited = real - np.array([observed[n].submit_s for n in names]) >= 2.0
    agree = s_real[upper] == s_other[upper]
    same = float(np.mean(agree)) if len(names) > 1 else 1.0
    apart = np.abs(d_real[upper]) >= apart_s
    same_apart = float(np.mean(agree[apart])) if apart.any() else 1.0
    error = np.abs(other - real)
    return Comparison(
        jobs=len(names),
        makespan_real_s=makespan_real,
        makespan_sim_s=makespan_other,
        median_start_error_s=float(np.median(error)),
        same_order=same,
        waited=int(waited.sum()),
        median_start_error_waited_s=float(np.median(error[waited])) if waited.any() else 0.0,
        same_order_apart=same_apart,
        apart_s=apart_s,
    )


@dataclass(frozen=True)
class Latency:
    """Slurm's own delays, measured in the run: ``launch_s`` from the scheduler's decision to
    the job's first line (median over the jobs that started within 2 s of their submission:
    submit to start), ``release_s`` from a job's last line to its resources going to the next
    job (median, over the jobs that waited, of start minus the latest earlier end, less the
    launch)."""

    launch_s: float
    release_s: float


def latency(observed: dict[str, Observed]) -> Latency:
    lags = [o.start_s - o.submit_s for o in observed.values() if o.start_s - o.submit_s < 2.0]
    launch = float(np.median(lags)) if lags else 0.0
    ends = np.sort([o.end_s for o in observed.values()])
    gaps = []
    for o in observed.values():
        if o.start_s - o.submit_s >= 2.0:
            k = int(np.searchsorted(ends, o.start_s, side="right"))
            if k:
                gaps.append(o.start_s - float(ends[k - 1]))
    release = max(0.0, float(np.median(gaps)) - launch) if gaps else 0.0
    return Latency(launch, release)
