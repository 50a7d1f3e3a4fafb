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
  (the estimate; whole seconds, as Slurm keeps job times), and a pending job is tried after
  the running jobs on the nodes it may use, in groups: ``select/cons_tres``'s will-run test
  (``_will_run_test``, ``src/plugins/select/cons_common/job_test.c`` in 22.05) rounds the
  soonest end up to a 30 s mark of the wall clock and takes every end up to 30 s past that
  mark, then every end up to 60 s, 120 s, ... past it, and tries the job after the last end
  of each group (:func:`_end_groups`). On a replay's time scale these groups are coarse: a
  job waiting for whole nodes is reserved at the end of the last job of its group, which
  leaves room for short jobs to be backfilled before it. A
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

#: The first window of running jobs' ends the backfill scheduler tries together (s): the
#: ``time_window`` of ``_will_run_test`` (``select/cons_common/job_test.c``), which doubles
#: unless ``bf_window_linear`` is set.
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
    if not free.any():
        # No free GPU: no job can start, and a pass changes nothing else (its reservations
        # last only for the pass).
        sim.slurm_backfill_seen = signature
        return
    # Running jobs: expected end (start + time limit) and the GPUs they hold per node.
    runs = list(sim.running.values())
    origin = sim.config.clock_origin_s
    ends = [
        max(
            now,
            # Slurm's job times are whole seconds of the Unix clock: its start (time(NULL) at
            # the decision) plus the time limit.
            math.floor(
                origin
                + run.start
                + run.restart
                + sim._estimate(run.record.job) * run.work_left / run.record.job.work_s
            )
            - origin,
        )
        for run in runs
    ]
    if runs:
        sizes = [len(run.gpus) for run in runs]
        row = np.repeat(np.arange(len(runs)), sizes)
        cell = row * hosts + host_of_gpu[np.concatenate([run.gpus for run in runs])]
        held = np.bincount(cell, minlength=len(runs) * hosts).reshape(len(runs), hosts)
        for k, run in enumerate(runs):
            if run.exclusive_rest:
                held[k] = np.where(held[k] > 0, cap, 0)
    else:
        held = np.zeros((0, hosts), dtype=np.int64)
    order = np.argsort(np.array(ends), kind="stable")
    end_times = np.array(ends)[order] if ends else np.zeros(0)
    freed_by = np.cumsum(held[order], axis=0)
    # Each running job's nodes (by expected end), for the end windows of a pending job, which
    # count only the running jobs on nodes it may use.
    on_node = held[order] > 0
    run_nodes = np.flatnonzero(on_node.ravel()) % hosts if len(runs) else np.zeros(0, np.int64)
    node_counts = on_node.sum(axis=1)
    run_first = np.concatenate(([0], np.cumsum(node_counts)[:-1])) if len(runs) else node_counts
    everywhere = np.ones((1, hosts), dtype=bool)
    per_node_max = int(cap.max())
    tree = _switch_tree(sim.topology)
    top_of = tree.host_switches[:, -1]
    tops = len(tree.level)
    # The freed GPUs per node once the first k running jobs (by expected end) have ended.
    freed = np.vstack([np.zeros((1, hosts), dtype=np.int64), freed_by.astype(np.int64)])
    plan = _Reservations(hosts)
    all_groups = np.array(_end_groups(end_times, now, origin), dtype=np.float64)
    groups_seen: dict[tuple[int, float], np.ndarray] = {}
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
        if plan.count and len(runs):
            key = (plan.count, limit)
            groups = groups_seen.get(key)
            if groups is None:
                # The nodes no reservation holds while the job would run from now: the
                # running jobs on them are the ones whose ends it is tried after.
                open_now = everywhere.copy()
                plan.unblocked(open_now, np.array([now]), limit)
                hits = _runs_on(open_now[0], run_nodes, run_first)
                groups = np.array(_end_groups(end_times[hits], now, origin), dtype=np.float64)
                groups_seen[key] = groups
        else:
            groups = all_groups
        times = plan.times(now, groups)
        at = free + freed[np.searchsorted(end_times, times, side="right")]
        usable = (at == cap) if whole else (at >= per_node)
        plan.unblocked(usable, times, limit)
        started = False
        for at_index in np.flatnonzero(usable.sum(axis=1) >= nodes):
            t = float(times[at_index])
            row = usable[at_index]
            if t == now:
                # Starting now needs only that some switch holds the nodes (the nodes are
                # the solver's choice among the usable ones, below).
                if nodes < 1 or np.bincount(top_of[row], minlength=tops).max() < nodes:
                    continue
                if not _start_fenced(sim, name, now, row):
                    continue
                queue.pop(i)
                free = np.bincount(host_of_gpu[state.free_mask()], minlength=hosts).astype(np.int64)
                started = True
                if not free.any():
                    # Full: nothing later in the queue can start in this pass, and the
                    # reservations it would still make end with it.
                    i = len(queue)
            else:
                try:
                    chosen = slurm_tree_nodes(tree, row, nodes)
                except Infeasible:
                    continue
                plan.add(t, t + limit, chosen)
            break
        if not started:
            i += 1
    sim.slurm_backfill_seen = (sim.release_epoch, sim.allocated, len(sim.queue))


class _Reservations:
    """The reservations of one backfill pass (Slurm's backfill map: whole nodes held from a
    start to a start plus the job's time limit), and which nodes they leave free for a job.

    A node is blocked for a job that would run over ``[t, t + limit)`` when a reservation on it
    starts before ``t + limit`` and ends after ``t``. Counted per node as (reservations
    starting before ``t + limit``) minus (those ending by ``t``): every reservation that ends
    by ``t`` also started before ``t + limit`` when the limit and the reservations are longer
    than zero, so the difference counts exactly the overlapping ones. Both counts come from
    cumulative sums over the reservations sorted by start and by end, so a job costs
    O((times + reservations) x nodes) instead of O(times x reservations x nodes). A job
    or a reservation of zero length is checked against every reservation directly."""

    def __init__(self, hosts: int) -> None:
        self.hosts = hosts
        self.start = np.empty(64)
        self.end = np.empty(64)
        self.nodes = np.zeros((64, hosts), dtype=np.int32)
        self.count = 0
        self.empty_one = False
        self._sums: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def times(self, now: float, groups: np.ndarray) -> np.ndarray:
        """When a job may start: now, the running jobs' end groups and the reservations' ends
        (within ``bf_window``). Reservations start at such times, so their starts are in."""
        ends = self.end[: self.count]
        times = np.unique(np.concatenate(([now], groups, ends[ends > now])))
        return times[times <= now + BF_WINDOW_S]

    def add(self, start: float, end: float, chosen: np.ndarray) -> None:
        if self.count == len(self.start):
            self.start = np.resize(self.start, 2 * self.count)
            self.end = np.resize(self.end, 2 * self.count)
            self.nodes = np.vstack([self.nodes, np.zeros_like(self.nodes)])
        self.start[self.count], self.end[self.count] = start, end
        self.nodes[self.count] = 0
        self.nodes[self.count, chosen] = 1
        self.count += 1
        self.empty_one |= not end > start
        self._sums = None

    def unblocked(self, usable: np.ndarray, times: np.ndarray, limit: float) -> None:
        """Clear in ``usable`` (times x nodes) the nodes a reservation holds during
        ``[t, t + limit)`` for each time ``t``."""
        count = self.count
        if not count:
            return
        starts, ends, held = self.start[:count], self.end[:count], self.nodes[:count]
        if not limit > 0 or self.empty_one:
            overlap = (starts[None, :] < (times + limit)[:, None]) & (
                ends[None, :] > times[:, None]
            )
            usable &= (overlap.astype(np.int32) @ held) == 0
            return
        if self._sums is None:
            by_start, by_end = np.argsort(starts, kind="stable"), np.argsort(ends, kind="stable")
            zero = np.zeros((1, self.hosts), dtype=np.int32)
            self._sums = (
                starts[by_start],
                np.vstack([zero, np.cumsum(held[by_start], axis=0, dtype=np.int32)]),
                ends[by_end],
                np.vstack([zero, np.cumsum(held[by_end], axis=0, dtype=np.int32)]),
            )
        sorted_starts, started, sorted_ends, ended = self._sums
        begun = started[np.searchsorted(sorted_starts, times + limit, side="left")]
        over = ended[np.searchsorted(sorted_ends, times, side="right")]
        usable &= begun == over


def _end_groups(end_times: np.ndarray, now: float, origin: float = 0.0) -> list[float]:
    """The times at which the backfill scheduler tries a pending job against the running ones
    (``end_times``, sorted: the running jobs on nodes it may use), as ``select/cons_tres``'s
    will-run test does (``_will_run_test`` in ``select/cons_common/job_test.c``, Slurm
    22.05): the jobs end in groups, and the job is tried once the last of a group has ended.
    The first group ends at a barrier: the soonest end rounded up to the next multiple of 30 s
    of the Unix clock (``origin`` is the Unix time at simulated time 0), plus 30 s; each
    later group reaches the barrier plus a window that doubles (60, 120, ... s) until it takes
    in the next end."""
    out: list[float] = []
    n = len(end_times)
    if not n or not END_WINDOW_S > 0:
        return [float(t) for t in end_times if t > now]
    first = float(end_times[0])
    # end + (30 - end % 30): a multiple of 30 s after the first end, 30 s on when it is one.
    barrier = first + (END_WINDOW_S - (first + origin) % END_WINDOW_S)
    window, j = END_WINDOW_S, 0
    while j < n:
        k = max(j + 1, int(np.searchsorted(end_times, barrier + window, side="right")))
        if end_times[k - 1] > now:
            out.append(float(end_times[k - 1]))
        if k < n:
            window *= 2
            while end_times[k] > barrier + window:
                window *= 2
        j = k
    return out


def _runs_on(open_nodes: np.ndarray, run_nodes: np.ndarray, run_first: np.ndarray) -> np.ndarray:
    """Which running jobs hold a GPU on one of ``open_nodes`` (a bool per node): job ``k``'s
    nodes are ``run_nodes[run_first[k]:run_first[k + 1]]`` (every job holds at least one)."""
    if not len(run_first):
        return np.zeros(0, dtype=bool)
    return np.add.reduceat(open_nodes[run_nodes].astype(np.int64), run_first) > 0


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
