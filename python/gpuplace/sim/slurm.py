"""Slurm's ``sched/backfill`` as slurmctld 22.05 runs it: the simulator's ``slurm`` queue policy.

Two schedulers share the queue, in priority order (FIFO here: ``priority/basic``):

* the **main scheduler** runs on every event (submission, job end) and starts jobs in order
  until the first one that cannot start, which blocks the partition for the rest of its pass
  (the engine's head-of-queue loop);
* the **backfill scheduler** runs every ``bf_interval`` seconds on its own clock (a pass at
  each multiple of the interval while a job is blocked, not at the events). It is
  *conservative*: with ``bf_job_part_count_reserve=0`` (the default, ``man slurm.conf``:
  "reserve resources for any pending job and delay initiation of lower priority jobs") every
  pending job it tests, up to ``bf_max_job_test`` (500), either starts now or gets a
  reservation at its earliest start, and a later job may start only where it delays none of
  those reservations. Running jobs are expected to end at their start plus their time limit
  (the estimate), and a pending job is tried after them in groups (``bf_window_linear``: the
  soonest end and every end within 30 s of it, then the next with 60 s, doubling). A
  reservation holds whole nodes for the job's time limit (an assumption, from the backfill map
  of node bitmaps; a variant holding only its GPUs measured the same on the replays), while
  running jobs free GPUs node by node (``select/cons_tres`` shares nodes). The nodes of a reservation and of a start are chosen as ``slurm-tree`` chooses
  them (:func:`gpuplace.placement.solvers.baselines.slurm_tree_nodes`). Reservations reach at
  most ``bf_window`` (1,440 minutes) ahead.

Checked against a real slurmctld and slurmd on loopback by ``tests/test_slurm_replay.py``
(``benches/bench_slurm_replay.py`` at a larger size).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from gpuplace.errors import Infeasible
from gpuplace.placement.place import place
from gpuplace.placement.solvers.baselines import _switch_tree, slurm_tree_nodes

if TYPE_CHECKING:
    from gpuplace.sim.engine import _Simulator

#: The first window of running jobs' ends the backfill scheduler tries together (s; ``man
#: slurm.conf``, ``bf_window_linear``: "the precision starts at 30 seconds").
END_WINDOW_S = 30.0

#: Slurm's ``bf_window`` default: reservations are looked for this far ahead (s).
BF_WINDOW_S = 1440 * 60.0


def next_pass(now: float, interval: float) -> float:
    """The backfill clock: the first multiple of ``interval`` at or after ``now``."""
    if interval <= 0:
        return now
    grid = math.ceil(now / interval - 1e-9) * interval
    return max(grid, now)


def backfill_pass(sim: _Simulator, now: float, first: int, depth: int) -> None:
    """One conservative backfill pass over ``sim.queue[first:]`` (at most ``depth`` jobs).

    A pass changes nothing but the jobs it starts, so when nothing was freed, started or
    submitted since a pass that started nothing, the next one is skipped (it would find the
    same; only the passing of time differs, and that only narrows the gaps before the
    reservations)."""
    signature = (sim.release_epoch, sim.allocated, len(sim.queue))
    if sim.slurm_backfill_seen == signature:
        return
    state = sim.state
    cap = np.asarray(sim.node_capacity, dtype=np.int64)
    hosts = len(cap)
    host_of_gpu = sim.host_of_gpu
    free = np.bincount(host_of_gpu[state.free_mask()], minlength=hosts).astype(np.int64)
    # Running jobs: expected end (start + time limit) and the GPUs they hold per node.
    ends: list[float] = []
    held: list[np.ndarray] = []
    for run in sim.running.values():
        job = run.record.job
        expected = run.start + run.restart + sim._estimate(job) * run.work_left / job.work_s
        on = np.bincount(host_of_gpu[run.gpus], minlength=hosts)
        if run.exclusive_rest:
            on = np.where(on > 0, cap, 0)
        ends.append(max(now, expected))
        held.append(on)
    order = np.argsort(np.array(ends), kind="stable")
    end_times = np.array(ends)[order] if ends else np.zeros(0)
    freed_by = np.cumsum(np.array(held)[order], axis=0) if held else np.zeros((0, hosts))
    ends_grouped = (
        _end_groups(end_times, now)
        if END_WINDOW_S > 0
        else [float(t) for t in end_times if t > now]
    )
    per_node_max = int(cap.max())
    tree = _switch_tree(sim.topology)
    # The freed GPUs per node once the first k running jobs (by expected end) have ended.
    freed = np.vstack([np.zeros((1, hosts), dtype=np.int64), freed_by.astype(np.int64)])
    groups = np.array(ends_grouped, dtype=np.float64)
    # Reservations made in this pass: start, end, and the nodes they hold (whole nodes), grown
    # as needed.
    r_start = np.empty(64)
    r_end = np.empty(64)
    r_nodes = np.zeros((64, hosts), dtype=np.float32)
    count = 0
    queue = sim.queue
    i, tested = first, 0
    while i < len(queue) and tested < depth:
        tested += 1
        name = queue[i][1]
        job = sim.records[name].job
        nodes = -(-job.gpus // per_node_max)
        per_node = -(-job.gpus // nodes)
        whole = job.exclusive or sim._solver_for(job) == "slurm-tree-exclusive"
        limit = sim._estimate(job)
        ends_r = r_end[:count]
        times = np.unique(np.concatenate(([now], groups, ends_r[ends_r > now])))
        times = times[times <= now + BF_WINDOW_S]
        at = free + freed[np.searchsorted(end_times, times, side="right")]
        usable = (at == cap) if whole else (at >= per_node)
        if count:
            overlap = (r_start[None, :count] < (times + limit)[:, None]) & (
                ends_r[None, :] > times[:, None]
            )
            usable &= (overlap.astype(np.float32) @ r_nodes[:count]) == 0
        started = False
        for at_index in np.flatnonzero(usable.sum(axis=1) >= nodes):
            t = float(times[at_index])
            try:
                chosen = slurm_tree_nodes(tree, usable[at_index], nodes)
            except Infeasible:
                continue
            if t == now:
                if not _start_fenced(sim, name, now, usable[at_index]):
                    continue
                queue.pop(i)
                free = np.bincount(host_of_gpu[state.free_mask()], minlength=hosts).astype(np.int64)
                started = True
            else:
                if count == len(r_start):
                    r_start = np.resize(r_start, 2 * count)
                    r_end = np.resize(r_end, 2 * count)
                    r_nodes = np.vstack([r_nodes, np.zeros_like(r_nodes)])
                r_start[count], r_end[count] = t, t + limit
                r_nodes[count] = 0
                r_nodes[count, chosen] = 1
                count += 1
            break
        if not started:
            i += 1
    sim.slurm_backfill_seen = (sim.release_epoch, sim.allocated, len(sim.queue))


def _end_groups(end_times: np.ndarray, now: float) -> list[float]:
    """The times at which the backfill scheduler tries a pending job against the running ones
    (``man slurm.conf``, ``bf_window_linear``): the job ending soonest and every job ending
    within 30 s of it, then the next one and those within 60 s, the window doubling each time;
    the job can start once the last of a group has ended."""
    out: list[float] = []
    j, window = 0, END_WINDOW_S
    while j < len(end_times):
        k = int(np.searchsorted(end_times, end_times[j] + window, side="right"))
        if end_times[k - 1] > now:
            out.append(float(end_times[k - 1]))
        j, window = k, window * 2
    return out


def _start_fenced(sim: _Simulator, name: str, now: float, nodes: np.ndarray) -> bool:
    """Start ``name`` now on the given nodes only (the others are reserved for jobs ahead)."""
    record = sim.records[name]
    template, profile = sim._shape(record.job)
    solver = sim._solver_for(record.job)
    allowed = nodes[sim.host_of_gpu]
    try:
        with sim.state.fenced(allowed) as fenced:
            placement = place(
                fenced, template, solver, seed=sim.config.seed, time_limit=sim.config.time_limit
            )
    except Infeasible:
        return False
    restart, cause = 0.0, ""
    if record.restarts:
        restart, cause = sim.config.restart_s, record.restart_cause
    sim._start(record, placement.gpus, now, template, profile, placement.cost, restart, cause)
    return True
