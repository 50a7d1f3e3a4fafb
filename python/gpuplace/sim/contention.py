"""The contention benchmark: placing a new job on a loaded cluster with an oversubscribed fabric.

Each instance is a cluster whose leaf uplinks are 2:1 oversubscribed, brought to an occupancy
the way a busy cluster gets there: jobs drawn from a mix of mixture-of-experts (expert-parallel
all-to-all across hosts) and dense training jobs are placed by the site's scheduler
(``slurm-tree``, whole nodes) until the cluster is nearly full, then random jobs end, several
rounds over, so free nodes are scattered and running jobs straddle leaves. Every running job is
allocated with its spec, so its collectives load the uplinks.

A new job is then placed by each solver on the same state, and each placement is priced with
the same contention-aware cost model (``gpuplace.cluster.fabric``): the new job's communication time
per step with its neighbours, its slowdown over the same placement alone on the fabric, and the
time it adds to the running jobs. gpuplace's solvers count that last term in their objective
(the default); the peers do not know about the fabric's load. Communication time is reported
(the step-time model is not part of this branch). Timing is measured, never asserted.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuplace.cluster.fabric import added_to_neighbours, contention
from gpuplace.cluster.state import ClusterState
from gpuplace.errors import Infeasible
from gpuplace.model.job import Job
from gpuplace.model.topology import Topology
from gpuplace.placement.place import place
from gpuplace.sim.workload import DEFAULT_MODEL, MOE_MODEL

__all__ = [
    "CONTENTION_CLUSTERS",
    "CONTENTION_SOLVERS",
    "ContentionResult",
    "ContentionSuite",
    "LoadedInstance",
    "contention_suite",
    "loaded_state",
    "new_job",
    "quick_contention_suite",
    "run_contention_suite",
]

#: gpuplace's solvers and the peers, each priced with the same model.
CONTENTION_SOLVERS = ("greedy", "refine", "slurm-tree", "kueue-bestfit", "first-fit")
#: (label, preset, parameters): 2:1 leaf uplinks.
CONTENTION_CLUSTERS: tuple[tuple[str, str, dict[str, int]], ...] = (
    ("a100-pod-80 2:1", "a100-pod", {"nodes": 80, "oversubscription": 2}),
    ("h100-superpod-128 2:1", "h100-superpod", {"nodes": 128, "oversubscription": 2}),
)
#: New jobs: label -> (GPUs, mixture of experts).
NEW_JOBS: dict[str, tuple[int, bool]] = {
    "moe-128 (tp8 ep16)": (128, True),
    "moe-256 (tp8 ep16 dp2)": (256, True),
    "dense-128 (tp8 dp16)": (128, False),
}


def new_job(name: str, gpus: int, moe: bool) -> Job:
    """A tp-8 job: experts spread over up to 16 hosts (all-to-all) for a mixture of experts,
    else data parallel."""
    rest = gpus // 8
    if moe and rest >= 2:
        ep = min(rest, 16)
        return Job(name=name, tp=8, ep=ep, dp=rest // ep, model=MOE_MODEL)
    return Job(name=name, tp=8, dp=rest, model=DEFAULT_MODEL)


def loaded_state(
    topology: Topology,
    occupancy: float,
    *,
    seed: int = 0,
    scheduler: str = "slurm-tree",
    rounds: int = 4,
    moe_share: float = 0.8,
    sizes: Sequence[int] = (64, 128, 256),
) -> ClusterState:
    """A state at about ``occupancy``: fill to 95 % with jobs placed by ``scheduler``, end
    random jobs down to the target, ``rounds`` times. Deterministic for a seed."""
    rng = np.random.default_rng(seed)
    state = ClusterState(topology)
    counter = 0
    for _ in range(rounds):
        misses = 0
        while state.occupancy < 0.95 and misses < 20:
            counter += 1
            size = int(rng.choice(list(sizes)))
            moe = bool(rng.random() < moe_share)
            job = new_job(f"bg{counter}", size, moe)
            try:
                state.allocate(place(state, job, scheduler, seed=counter))
            except Infeasible:
                misses += 1
        names = list(state.jobs)
        for i in rng.permutation(len(names)):
            if state.occupancy <= occupancy:
                break
            state.release(names[i])
    return state


@dataclass(frozen=True)
class LoadedInstance:
    cluster: str
    preset: str
    params: dict[str, int]
    occupancy: float
    job: str
    seed: int

    def build(self) -> tuple[ClusterState, Job]:
        topology = Topology.preset(self.preset, **self.params)
        state = loaded_state(topology, self.occupancy, seed=self.seed)
        gpus, moe = NEW_JOBS[self.job]
        return state, new_job("new", gpus, moe)


def contention_suite(seeds: Sequence[int] = (0, 1, 2, 3)) -> list[LoadedInstance]:
    return [
        LoadedInstance(label, preset, params, occupancy, job, seed)
        for label, preset, params in CONTENTION_CLUSTERS
        for occupancy in (0.6, 0.75)
        for job in NEW_JOBS
        for seed in seeds
    ]


def quick_contention_suite() -> list[LoadedInstance]:
    label, preset, params = CONTENTION_CLUSTERS[0]
    return [
        LoadedInstance(label, preset, params, 0.75, job, seed)
        for job in ("moe-128 (tp8 ep16)", "dense-128 (tp8 dp16)")
        for seed in (0, 1)
    ]


@dataclass(frozen=True)
class ContentionResult:
    cluster: str
    occupancy: float
    job: str
    seed: int
    solver: str
    status: str
    #: The new job's communication time per step with its neighbours (s).
    comm_seconds: float | None = None
    #: The same placement alone on the fabric (s).
    alone_seconds: float | None = None
    #: Seconds per step the new job adds to the running jobs, summed.
    added_seconds: float | None = None
    #: ``added_seconds`` over the running jobs' total communication time before.
    added_fraction: float | None = None
    leaves: int | None = None
    solve_ms: float | None = None

    @property
    def slowdown(self) -> float | None:
        if self.comm_seconds is None or not self.alone_seconds:
            return None
        return self.comm_seconds / self.alone_seconds

    @property
    def total_seconds(self) -> float | None:
        """The new job's seconds plus what it adds to the running jobs: its whole cost to
        the cluster per step."""
        if self.comm_seconds is None or self.added_seconds is None:
            return None
        return self.comm_seconds + self.added_seconds


@dataclass
class ContentionSuite:
    results: list[ContentionResult]
    solvers: list[str]

    def geomean(self, solver: str, metric: str = "comm_seconds") -> float | None:
        values = [
            getattr(r, metric)
            for r in self.results
            if r.solver == solver and r.status == "ok" and getattr(r, metric)
        ]
        return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None

    def ratio(
        self, solver: str, peer: str, metric: str = "comm_seconds"
    ) -> tuple[float | None, int]:
        """Geometric mean of ``solver``'s ``metric`` over ``peer``'s on the instances both
        placed, and how many."""
        by_key: dict[tuple[Any, ...], dict[str, float]] = {}
        for r in self.results:
            value = getattr(r, metric)
            if r.status == "ok" and value:
                key = (r.cluster, r.occupancy, r.job, r.seed)
                by_key.setdefault(key, {})[r.solver] = value
        logs = [math.log(v[solver] / v[peer]) for v in by_key.values() if solver in v and peer in v]
        return (math.exp(sum(logs) / len(logs)) if logs else None), len(logs)

    def summary(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name in self.solvers:
            rows = [r for r in self.results if r.solver == name and r.status == "ok"]
            slow = [r.slowdown for r in rows if r.slowdown is not None]
            added = [r.added_fraction for r in rows if r.added_fraction is not None]
            ratio, count = self.ratio("greedy", name)
            total_ratio, _ = self.ratio("greedy", name, "total_seconds")
            out[name] = {
                "placed": len(rows),
                "infeasible": sum(
                    1 for r in self.results if r.solver == name and r.status == "infeasible"
                ),
                "geomean_comm_seconds": self.geomean(name),
                "mean_slowdown": statistics.fmean(slow) if slow else None,
                "max_slowdown": max(slow) if slow else None,
                "mean_added_fraction": statistics.fmean(added) if added else None,
                "greedy_over_solver": ratio,
                "greedy_over_solver_total": total_ratio,
                "instances_compared": count,
                "median_solve_ms": statistics.median(r.solve_ms for r in rows if r.solve_ms)
                if rows
                else None,
            }
        return out

    def to_json(self) -> dict[str, Any]:
        """Every result (with its slowdown and total seconds) and the summary per solver."""
        return {
            "solvers": self.solvers,
            "results": [
                asdict(r) | {"slowdown": r.slowdown, "total_seconds": r.total_seconds}
                for r in self.results
            ],
            "summary": self.summary(),
        }

    def write(self, out: Path) -> list[Path]:
        out.mkdir(parents=True, exist_ok=True)
        document = self.to_json()
        rows = document["results"]
        csv_path = out / "contention.csv"
        with csv_path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        json_path = out / "contention.json"
        json_path.write_text(
            json.dumps({"results": rows, "summary": document["summary"]}, indent=1)
        )
        return [csv_path, json_path]


def _median_solve(state: ClusterState, job: Job, solver: str, runs: int) -> tuple[Any, float]:
    times = []
    placement = None
    for _ in range(runs):
        start = time.perf_counter()
        placement = place(state, job, solver, seed=0)
        times.append(time.perf_counter() - start)
    return placement, statistics.median(times) * 1e3


def run_contention_suite(
    instances: Sequence[LoadedInstance],
    solver_names: Sequence[str] = CONTENTION_SOLVERS,
    *,
    runs: int = 3,
    progress: Callable[[str], None] | None = None,
) -> ContentionSuite:
    """Place the new job of every instance with every solver and price it with neighbours."""
    results: list[ContentionResult] = []
    for inst in instances:
        state, job = inst.build()
        specs = state.specs
        before = sum(
            contention(state, specs[n], gpus).contended_seconds
            for n, gpus in state.jobs.items()
            if n in specs
        )
        if progress:
            progress(
                f"{inst.cluster} {inst.occupancy:.0%} seed {inst.seed} {inst.job}: "
                f"{len(state.jobs)} running jobs"
            )
        for solver in solver_names:
            base: dict[str, Any] = {
                "cluster": inst.cluster,
                "occupancy": inst.occupancy,
                "job": inst.job,
                "seed": inst.seed,
                "solver": solver,
            }
            try:
                placement, solve_ms = _median_solve(state, job, solver, runs)
            except Infeasible:
                results.append(ContentionResult(**base, status="infeasible"))
                continue
            seen = contention(state, job, placement.gpus)
            added = added_to_neighbours(state, job, placement.gpus)
            leaf = state.topology.level_index("leaf")
            leaves = len({int(d) for d in state.topology.path[placement.gpus, leaf]})
            results.append(
                ContentionResult(
                    **base,
                    status="ok",
                    comm_seconds=seen.contended_seconds,
                    alone_seconds=seen.alone_seconds,
                    added_seconds=added,
                    added_fraction=added / before if before > 0 else 0.0,
                    leaves=leaves,
                    solve_ms=solve_ms,
                )
            )
    return ContentionSuite(results=results, solvers=list(solver_names))
