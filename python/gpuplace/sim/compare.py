"""The solver comparison benchmark: every registered solver on a fixed, seeded suite.

The suite crosses clusters (DGX H100 SuperPODs of 256 and 2,048 nodes, 32 GB200 NVL72 racks, a
PCIe-only cluster), occupancies (fresh; 50 % and 85 % allocated and fragmented by
:func:`gpuplace.sim.workload.fragment`, which draws jobs from the Philly running-job size mix)
and jobs (tp-8 training jobs of 8 to 2,048 GPUs with pipeline and data parallelism, a small tp-4
job, a mixture-of-experts job with expert parallelism, and a job given by an explicit traffic
matrix). Every solver places every job on the same state; costs come from the one cost model.

A solver that raises :class:`gpuplace.Infeasible` for a job is skipped for it with a note (the
peer baselines need whole idle nodes or whole pods); a placement the gate in :func:`place`
refuses is recorded as ``invalid`` with the gate's reason. ``cpsat`` runs only on small instances,
and only when it is registered; where it proves an optimum, every solver's gap to it is given.
Timing is measured, never asserted.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpuplace.cluster.state import ClusterState
from gpuplace.errors import Infeasible, InvalidJob, InvalidState
from gpuplace.model.job import Job
from gpuplace.model.topology import Topology
from gpuplace.placement.place import place
from gpuplace.placement.registry import solvers
from gpuplace.placement.result import Placement
from gpuplace.sim.workload import DEFAULT_MODEL, MOE_MODEL, fragment, training_job

__all__ = [
    "CLUSTERS",
    "CONFINING_SOLVERS",
    "JOBS",
    "OCCUPANCIES",
    "Instance",
    "Result",
    "SuiteReport",
    "quick_suite",
    "run_suite",
    "suite",
]


@dataclass(frozen=True)
class ClusterSpec:
    label: str
    preset: str
    params: dict[str, int] = field(default_factory=dict)

    def build(self) -> Topology:
        return Topology.preset(self.preset, **self.params)


CLUSTERS: tuple[ClusterSpec, ...] = (
    ClusterSpec("h100-superpod-256", "h100-superpod", {"nodes": 256}),
    ClusterSpec("h100-superpod-2048", "h100-superpod", {"nodes": 2048}),
    ClusterSpec("gb200-nvl72-32", "gb200-nvl72", {"racks": 32}),
    ClusterSpec("pcie-cluster-32", "pcie-cluster", {"nodes": 32}),
)
OCCUPANCIES: tuple[float, ...] = (0.0, 0.5, 0.85)


def _traffic_job(name: str, ranks: int, seed: int) -> Job:
    """A job known only by its traffic matrix (bytes per step): a halo exchange on a ring of
    ranks (1 GB to each neighbour), a stride-8 exchange (256 MB), and a few heavy seeded pairs
    (2 GB), as a solver-agnostic quadratic-assignment instance."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(ranks):
        rows.append((i, (i + 1) % ranks, 1e9))
        rows.append((i, (i + 8) % ranks, 2.56e8))
    for _ in range(ranks // 4):
        a, b = rng.choice(ranks, size=2, replace=False)
        rows.append((int(a), int(b), 2e9))
    return Job.from_traffic(name, np.array(rows, dtype=np.float64), ranks=ranks)


@dataclass(frozen=True)
class JobSpec:
    label: str
    build: Callable[[int], Job]
    gpus: int


def _training(gpus: int, pp: int) -> Callable[[int], Job]:
    return lambda seed: training_job(f"train-{gpus}", gpus, pp=pp, model=DEFAULT_MODEL)


JOBS: tuple[JobSpec, ...] = (
    JobSpec("train-4 (tp4)", _training(4, 1), 4),
    JobSpec("train-8 (tp8)", _training(8, 1), 8),
    JobSpec("train-64 (tp8 pp4 dp2)", _training(64, 4), 64),
    JobSpec("train-512 (tp8 pp4 dp16)", _training(512, 4), 512),
    JobSpec("train-2048 (tp8 pp8 dp32)", _training(2048, 8), 2048),
    JobSpec(
        "moe-64 (tp2 ep8 dp4)",
        lambda seed: Job(name="moe-64", tp=2, ep=8, dp=4, model=MOE_MODEL),
        64,
    ),
    JobSpec("traffic-32 (explicit matrix)", lambda seed: _traffic_job("traffic-32", 32, seed), 32),
)

#: Solvers that honour the job's confinement rules (tp inside an NVLink domain by default);
#: the others are topology-blind or place whole nodes/pods as their originals do.
CONFINING_SOLVERS = frozenset({"greedy", "refine", "cpsat", "auto"})

#: cpsat runs only where an exact model is small: few ranks on a small cluster.
CPSAT_MAX_RANKS = 16
CPSAT_MAX_GPUS = 512
CPSAT_TIME_LIMIT_S = 10.0


@dataclass(frozen=True)
class Instance:
    cluster: ClusterSpec
    occupancy: float
    job: JobSpec

    @property
    def key(self) -> str:
        return f"{self.cluster.label} @{self.occupancy:.0%} {self.job.label}"


def suite() -> list[Instance]:
    """The full suite, in a fixed order."""
    return [Instance(c, o, j) for c in CLUSTERS for o in OCCUPANCIES for j in JOBS]


def quick_suite() -> list[Instance]:
    """A small slice for a smoke run: the smaller clusters, fresh and 50 %, small jobs."""
    small = {"h100-superpod-256", "gb200-nvl72-32", "pcie-cluster-32"}
    jobs = {
        "train-4 (tp4)",
        "train-8 (tp8)",
        "train-64 (tp8 pp4 dp2)",
        "moe-64 (tp2 ep8 dp4)",
        "traffic-32 (explicit matrix)",
    }
    return [
        i
        for i in suite()
        if i.cluster.label in small and i.occupancy in (0.0, 0.5) and i.job.label in jobs
    ]


@dataclass
class Result:
    """One solver on one instance. Costs are per training step: seconds and bytes."""

    cluster: str
    cluster_gpus: int
    occupancy: float
    free_gpus: int
    job: str
    job_gpus: int
    solver: str
    status: str  # "ok", "infeasible", "invalid" (refused by the placement gate) or "skipped"
    comm_seconds: float | None = None
    fabric_bytes: float | None = None
    spine_bytes: float | None = None
    solve_seconds: float | None = None
    optimal: bool | None = None
    gap_to_optimum: float | None = None
    ratio_to_best: float | None = None
    confinement_ok: bool | None = None
    gpus_valid: bool | None = None
    note: str = ""
    #: Step time and MFU from the core's step model, for jobs that declare their compute.
    step_seconds: float | None = None
    mfu: float | None = None

    @property
    def instance(self) -> tuple[str, float, str]:
        return (self.cluster, self.occupancy, self.job)


@dataclass
class SuiteReport:
    results: list[Result]
    seed: int
    solvers: list[str]
    #: Per solver: geometric-mean ratio to the best per instance, and instances placed.
    summary: dict[str, dict[str, Any]]
    #: greedy's geometric-mean comm_seconds over each other solver's, on fragmented instances
    #: both placed (below 1: greedy's placements communicate faster).
    greedy_vs: dict[str, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "solvers": self.solvers,
            "note": "costs per training step from the one cost model; no overlap assumed",
            "results": [asdict(r) for r in self.results],
            "summary": self.summary,
            "greedy_vs": self.greedy_vs,
        }

    def write(self, out: Path) -> list[Path]:
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / "compare.csv", out / "compare.json"]
        with paths[0].open("w", newline="", encoding="utf-8") as fh:
            names = list(asdict(self.results[0])) if self.results else []
            writer = csv.DictWriter(fh, fieldnames=names)
            writer.writeheader()
            for r in self.results:
                writer.writerow({k: ("" if v is None else v) for k, v in asdict(r).items()})
        paths[1].write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        return paths


def _applies(solver: str, instance: Instance, topology: Topology) -> str | None:
    """Why a solver is not run on an instance (None: it is)."""
    if solver == "cpsat" and (
        instance.job.gpus > CPSAT_MAX_RANKS or topology.num_gpus > CPSAT_MAX_GPUS
    ):
        return f"cpsat runs only up to {CPSAT_MAX_RANKS} ranks on up to {CPSAT_MAX_GPUS} GPUs"
    return None


def _valid(state: ClusterState, placement: Placement) -> bool:
    gpus = placement.gpus
    return (
        len(gpus) == placement.job.gpus
        and len(np.unique(gpus)) == len(gpus)
        and bool(state.free_mask()[gpus].all())
    )


def _geomean(values: Iterable[float | None]) -> float | None:
    logs = [math.log(v) for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(logs) / len(logs)) if logs else None


def run_suite(
    instances: Sequence[Instance],
    *,
    solver_names: Sequence[str] | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> SuiteReport:
    """Run the solvers on the instances; every state is made once per cluster and occupancy."""
    registered = list(solvers())
    names = list(solver_names) if solver_names else registered
    unknown = [n for n in names if n not in registered]
    if unknown:
        raise InvalidJob(f"unknown solver {unknown[0]!r}; the solvers are {', '.join(registered)}")
    results: list[Result] = []
    topologies: dict[str, Topology] = {}
    states: dict[tuple[str, float], ClusterState] = {}
    for instance in instances:
        spec = instance.cluster
        topology = topologies.get(spec.label)
        if topology is None:
            topology = topologies[spec.label] = spec.build()
        state = states.get((spec.label, instance.occupancy))
        if state is None:
            state = ClusterState(topology)
            start = time.perf_counter()
            if instance.occupancy:
                fragment(state, instance.occupancy, seed=seed)
            states[(spec.label, instance.occupancy)] = state
            if progress:
                progress(
                    f"{spec.label} at {instance.occupancy:.0%}: {len(state.jobs)} jobs, "
                    f"{state.free_gpus} of {topology.num_gpus} GPUs free "
                    f"({time.perf_counter() - start:.1f} s)"
                )
        job = instance.job.build(seed)
        base: dict[str, Any] = dict(
            cluster=spec.label,
            cluster_gpus=topology.num_gpus,
            occupancy=instance.occupancy,
            free_gpus=state.free_gpus,
            job=instance.job.label,
            job_gpus=job.gpus,
        )
        for name in names:
            why_not = _applies(name, instance, topology)
            if why_not:
                results.append(Result(**base, solver=name, status="skipped", note=why_not))
                continue
            limit = CPSAT_TIME_LIMIT_S if name in ("cpsat", "auto") else None
            try:
                placement = place(state, job, name, seed=seed, time_limit=limit)
            except Infeasible as exc:
                results.append(Result(**base, solver=name, status="infeasible", note=str(exc)))
                continue
            except InvalidState as exc:  # the placement gate refused what the solver returned
                results.append(Result(**base, solver=name, status="invalid", note=str(exc)))
                continue
            cost = placement.cost
            results.append(
                Result(
                    **base,
                    solver=name,
                    status="ok",
                    comm_seconds=cost.comm_seconds,
                    fabric_bytes=cost.fabric_bytes,
                    spine_bytes=cost.bytes_above("spine"),
                    solve_seconds=placement.elapsed_s,
                    optimal=placement.optimal,
                    confinement_ok=cost.confinement_ok,
                    gpus_valid=_valid(state, placement),
                    note="" if cost.confinement_ok else "; ".join(cost.violations[:2]),
                    step_seconds=cost.step_seconds,
                    mfu=cost.mfu,
                )
            )
    _fill_ratios(results)
    summary, greedy_vs = _summaries(results, names)
    return SuiteReport(results, seed, names, summary, greedy_vs)


def _fill_ratios(results: list[Result]) -> None:
    by_instance: dict[tuple[str, float, str], list[Result]] = {}
    for r in results:
        by_instance.setdefault(r.instance, []).append(r)
    for rows in by_instance.values():
        placed = [r for r in rows if r.status == "ok" and r.comm_seconds is not None]
        if not placed:
            continue
        # The best placement that keeps the job's rules: one that breaks confinement (a tp
        # group split over hosts) can be cheaper and is not a placement the job accepts.
        valid = [r for r in placed if r.confinement_ok is not False] or placed
        best = min(r.comm_seconds for r in valid if r.comm_seconds is not None)
        optimum = next((r.comm_seconds for r in placed if r.solver == "cpsat" and r.optimal), None)
        for r in placed:
            assert r.comm_seconds is not None
            if best > 0:
                r.ratio_to_best = r.comm_seconds / best
            elif r.comm_seconds == 0:
                r.ratio_to_best = 1.0
            if optimum is not None:
                r.gap_to_optimum = (r.comm_seconds - optimum) / optimum if optimum > 0 else 0.0


def _summaries(
    results: list[Result], names: Sequence[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    instances = {r.instance for r in results}
    summary: dict[str, dict[str, Any]] = {}
    for name in names:
        rows = [r for r in results if r.solver == name]
        ok = [r for r in rows if r.status == "ok" and r.ratio_to_best is not None]
        fragmented = [r for r in ok if r.occupancy > 0]
        summary[name] = {
            "geomean_ratio_to_best": _geomean(r.ratio_to_best for r in ok),
            "geomean_ratio_fragmented": _geomean(r.ratio_to_best for r in fragmented),
            "placed": len(ok),
            "infeasible": sum(r.status == "infeasible" for r in rows),
            "skipped": sum(r.status == "skipped" for r in rows),
            "instances": len(instances),
            "median_solve_ms": (
                float(np.median([r.solve_seconds for r in ok if r.solve_seconds is not None]) * 1e3)
                if ok
                else None
            ),
            "confinement_broken": sum(r.confinement_ok is False for r in ok),
            "mean_mfu": (
                float(np.mean([r.mfu for r in ok if r.mfu is not None]))
                if any(r.mfu is not None for r in ok)
                else None
            ),
        }
    greedy_vs: dict[str, dict[str, Any]] = {}
    if "greedy" in names:
        greedy = {
            r.instance: r.comm_seconds
            for r in results
            if r.solver == "greedy" and r.status == "ok" and r.occupancy > 0
        }
        for name in names:
            if name == "greedy":
                continue
            pairs = [
                (greedy[r.instance], r.comm_seconds)
                for r in results
                if r.solver == name and r.status == "ok" and r.instance in greedy and r.comm_seconds
            ]
            ratio = _geomean(g / o for g, o in pairs if g is not None and o)
            greedy_vs[name] = {"greedy_over_solver": ratio, "instances": len(pairs)}
    return summary, greedy_vs
