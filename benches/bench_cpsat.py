"""Benchmark of the CP-SAT solver: time to a proven optimum, gap at 1 s and 10 s, and greedy's
gap to the proven optimum, on clusters fragmented by a Philly-like workload.

Run: ``python benches/bench_cpsat.py [--quick] [--workers 2] [--repeats 3] [--out FILE.md]``.

Fragmentation: background jobs whose sizes follow the Philly job-size distribution
(``gpuplace.sim.workload.philly_running_mix``; sizes larger than an eighth of the cluster are left out)
are placed with greedy until the cluster is ``high`` full, then random jobs are released until it
is at most ``low`` full; three such rounds leave the holes a busy cluster has.

Timings are wall-clock seconds of ``gpuplace.place(..., "cpsat")`` (greedy hint, model building
and search; or greedy alone where its cost meets the core's lower bound, formulation "bound",
unless ``--no-shortcut``), medians over ``--repeats`` runs with different CP-SAT seeds. "gap" is CP-SAT's own
relative gap (cost - bound) / cost at the time limit; "greedy gap" is greedy's cost over the
proven optimum, minus one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gpuplace
import numpy as np
from gpuplace import Job, Topology, TransformerModel
from gpuplace.placement.solvers import cpsat
from gpuplace.sim import workload
from gpuplace.sim.workload import philly_running_mix

#: The models of the benchmark jobs (shared with the other benchmarks).
LLAMA_13B = workload.DEFAULT_MODEL
MOE = workload.MOE_MODEL


def fragment(
    topo: Topology, seed: int, *, high: float = 0.9, low: float = 0.6, rounds: int = 3
) -> gpuplace.ClusterState:
    """A cluster state after churn of Philly-sized background jobs (see the module docstring)."""
    state = gpuplace.ClusterState(topo)
    mix = philly_running_mix().capped(topo.num_gpus // 8)
    workload.fragment(state, low, seed=seed, mix=mix, rounds=rounds, high_water=high)
    return state


@dataclass
class Case:
    label: str
    cluster: Callable[[], Topology]
    job: Job
    high: float = 0.9
    low: float = 0.6


@dataclass
class Run:
    label: str
    seed: int
    ranks: int
    candidates: int
    sites: int
    formulation: str
    variables: int
    optimal_at_1s: bool
    gap_1s: float | None
    optimal_at_10s: bool
    gap_10s: float | None
    time_to_optimum: float | None
    greedy_gap: float | None
    times: list[float]


def solve_once(state: gpuplace.ClusterState, job: Job, limit: float, seed: int):
    start = time.perf_counter()
    p = gpuplace.place(state, job, "cpsat", time_limit=limit, seed=seed)
    return p, time.perf_counter() - start


def measure(case: Case, seed: int, repeats: int, *, long_limit: float = 10.0) -> Run | None:
    topo = case.cluster()
    state = fragment(topo, seed, high=case.high, low=case.low)
    job = case.job
    try:
        inst = cpsat.analyse(state, job)
    except gpuplace.GpuplaceError as exc:
        print(f"  {case.label} seed {seed}: skipped ({exc})", file=sys.stderr)
        return None
    if inst.infeasible:
        print(f"  {case.label} seed {seed}: infeasible on this state", file=sys.stderr)
        return None
    p1, t1 = solve_once(state, job, 1.0, 0)
    times: list[float] = []
    p10 = p1
    if p1.optimal:
        times.append(t1)
        for r in range(1, repeats):
            p, t = solve_once(state, job, long_limit, r)
            if p.optimal:
                times.append(t)
    else:
        for r in range(repeats):
            p, t = solve_once(state, job, long_limit, r)
            if r == 0:
                p10 = p
            if p.optimal:
                times.append(t)
            elif r == 0:
                break  # the first 10 s run did not prove it: no more repeats
    greedy_gap = None
    if p10.optimal:
        try:
            g = gpuplace.place(state, job, "greedy")
            if g.cost.confinement_ok and p10.cost.comm_seconds > 0:
                greedy_gap = g.cost.comm_seconds / p10.cost.comm_seconds - 1.0
        except gpuplace.Infeasible:
            pass
    return Run(
        label=case.label,
        seed=seed,
        ranks=job.gpus,
        candidates=int(sum(len(g) for g in inst.site_gpus)),
        sites=len(inst.site_ids),
        # The shortcut proves without a model (greedy meets the core's lower bound).
        formulation="bound" if p1.details.get("formulation") == "lower bound" else inst.formulation,
        variables=int(p1.details.get("variables", 0)),
        optimal_at_1s=bool(p1.optimal),
        gap_1s=p1.gap,
        optimal_at_10s=bool(p10.optimal),
        gap_10s=p10.gap,
        time_to_optimum=statistics.median(times) if times and len(times) == repeats else None,
        greedy_gap=greedy_gap,
        times=times,
    )


# --------------------------------------------------------------------------- cases
def superpod(nodes: int) -> Callable[[], Topology]:
    return lambda: Topology.preset("h100-superpod", nodes=nodes)


def a100(nodes: int) -> Callable[[], Topology]:
    return lambda: Topology.preset("a100-pod", nodes=nodes)


def pcie(nodes: int) -> Callable[[], Topology]:
    return lambda: Topology.preset("pcie-cluster", nodes=nodes)


def nvl72(racks: int) -> Callable[[], Topology]:
    return lambda: Topology.preset("gb200-nvl72", racks=racks)


def job(name: str, model: TransformerModel = LLAMA_13B, **degrees: int) -> Job:
    return Job(name, model=model, **degrees)


def target_cases() -> list[Case]:
    big = Case("tp8 pp2 dp2 on h100-superpod-64", superpod(64), job("t32", tp=8, pp=2, dp=2))
    # Up to 16 ranks on up to 128 candidate GPUs: clusters of 128 GPUs (every GPU a candidate
    # at worst), and a 512-GPU superpod filled to leave about 100 free.
    small_shapes: list[dict[str, int]] = [
        {"dp": 16},
        {"tp": 2, "dp": 8},
        {"tp": 4, "dp": 4},
        {"tp": 8, "dp": 2},
        {"tp": 4, "pp": 4},
        {"pp": 4, "dp": 4},
        {"tp": 2, "pp": 2, "dp": 4},
        {"tp": 4, "pp": 2, "dp": 2},
        {"tp": 2, "pp": 8},
        {"ep": 4, "dp": 4},
        {"tp": 2, "ep": 4, "dp": 2},
        {"cp": 2, "dp": 4, "pp": 2},
    ]
    cases = [big]
    for shape in small_shapes:
        name = " ".join(f"{d}{n}" for d, n in shape.items())
        model = MOE if "ep" in shape else LLAMA_13B
        j = job(name.replace(" ", ""), model=model, **shape)
        cases.append(Case(f"{name} on a100-pod-16", a100(16), j, high=0.6, low=0.3))
        cases.append(Case(f"{name} on pcie-cluster-16", pcie(16), j, high=0.6, low=0.3))
        cases.append(Case(f"{name} on h100-superpod-64", superpod(64), j, high=0.95, low=0.8))
    return cases


def scaling_cases() -> list[Case]:
    """Growing instances of both formulations, to find where proofs stop fitting in 10 s."""
    cases = []
    for ranks in (16, 32, 64, 128):
        cases.append(
            Case(
                f"tp8 pp{ranks // 16} dp2 on h100-superpod-256",
                superpod(256),
                job(f"c{ranks}", tp=8, pp=ranks // 16, dp=2),
                high=0.9,
                low=0.5,
            )
        )
    for dp in (8, 16, 32, 64):
        cases.append(
            Case(f"tp2 pp2 dp{dp} on a100-pod-80", a100(80), job(f"d{dp}", tp=2, pp=2, dp=dp))
        )
    for ep, dp in ((2, 4), (4, 4), (4, 8), (8, 8)):
        cases.append(
            Case(
                f"ep{ep} dp{dp} on a100-pod-32",
                a100(32),
                job(f"e{ep}{dp}", model=MOE, ep=ep, dp=dp),
                high=0.7,
                low=0.4,
            )
        )
    for pp in (1, 2, 4):
        cases.append(
            Case(
                f"tp8 pp{pp} dp2 on gb200-nvl72-2",
                nvl72(2),
                job(f"n{pp}", tp=8, pp=pp, dp=2),
                high=0.7,
                low=0.4,
            )
        )
    return cases


def suite_cases(count: int) -> list[tuple[Case, int]]:
    """A seeded suite: random shapes of 4..32 ranks on random fragmented clusters."""
    rng = np.random.default_rng(2024)
    clusters = [
        ("h100-superpod-64", superpod(64), 0.9, 0.6),
        ("a100-pod-40", a100(40), 0.9, 0.6),
        ("pcie-cluster-16", pcie(16), 0.7, 0.4),
        ("a100-pod-16", a100(16), 0.6, 0.3),
    ]
    shapes = [
        {"tp": 8, "dp": 2},
        {"tp": 4, "dp": 4},
        {"tp": 2, "dp": 8},
        {"dp": 8},
        {"dp": 16},
        {"tp": 8, "pp": 2, "dp": 2},
        {"tp": 4, "pp": 2, "dp": 2},
        {"tp": 2, "pp": 2, "dp": 4},
        {"tp": 4, "pp": 4},
        {"pp": 4, "dp": 4},
        {"tp": 2, "pp": 4, "dp": 2},
        {"tp": 8, "pp": 4},
        {"ep": 4, "dp": 2},
        {"tp": 2, "ep": 2, "dp": 2},
    ]
    out = []
    for i in range(count):
        cname, cluster, high, low = clusters[int(rng.integers(len(clusters)))]
        shape = shapes[int(rng.integers(len(shapes)))]
        name = " ".join(f"{d}{n}" for d, n in shape.items())
        model = MOE if "ep" in shape else LLAMA_13B
        j = job(f"s{i}", model=model, **shape)
        out.append((Case(f"{name} on {cname}", cluster, j, high, low), 1000 + i))
    return out


# --------------------------------------------------------------------------- output
def fmt_gap(gap: float | None, optimal: bool) -> str:
    if optimal:
        return "0 (opt)"
    return "-" if gap is None else f"{100 * gap:.2f}%"


def fmt_time(t: float | None) -> str:
    return "> 10 s" if t is None else f"{t:.2f}"


def table(title: str, header: list[str], rows: list[list[str]], lines: list[str]) -> None:
    lines.append(f"\n### {title}\n")
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for r in rows:
        lines.append("| " + " | ".join(r) + " |")
    if not sys.stdout.isatty():
        print("\n".join(lines[-len(rows) - 3 :]), flush=True)
        return
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print("\n".join(lines[-len(rows) - 3 :]), flush=True)
        return
    t = Table(title=title)
    for h in header:
        t.add_column(h)
    for r in rows:
        t.add_row(*r)
    Console(width=max(160, Console().width)).print(t)


def run_rows(runs: list[Run]) -> list[list[str]]:
    return [
        [
            r.label,
            str(r.seed),
            str(r.ranks),
            str(r.candidates),
            str(r.sites),
            r.formulation,
            str(r.variables),
            fmt_time(r.time_to_optimum),
            fmt_gap(r.gap_1s, r.optimal_at_1s),
            fmt_gap(r.gap_10s, r.optimal_at_10s),
            "-" if r.greedy_gap is None else f"{100 * r.greedy_gap:.2f}%",
        ]
        for r in runs
    ]


HEADER = [
    "instance",
    "seed",
    "ranks",
    "candidate GPUs",
    "sites",
    "model",
    "variables",
    "time to optimum (s, median)",
    "gap at 1 s",
    "gap at 10 s",
    "greedy gap",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases (a smoke run)")
    ap.add_argument("--workers", type=int, default=2, help="CP-SAT workers (default 2)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per instance for the median")
    ap.add_argument("--suite", type=int, default=60, help="instances in the greedy-gap suite")
    ap.add_argument("--sections", default="targets,scaling,suite")
    ap.add_argument("--out", type=Path, default=None, help="also write the tables as Markdown")
    ap.add_argument(
        "--no-shortcut",
        action="store_true",
        help="build the model on every instance, as before the lower-bound shortcut",
    )
    args = ap.parse_args(argv)
    import os

    if args.no_shortcut:
        cpsat._meets_bound = lambda *_: None  # type: ignore[assignment]

    os.environ[cpsat.WORKERS_ENV] = str(args.workers)
    lines = [f"CP-SAT benchmark: {args.workers} workers, medians of {args.repeats} runs"]
    sections = set(args.sections.split(","))
    seeds = [0] if args.quick else [0, 1, 2]

    if "targets" in sections:
        runs = []
        for case in target_cases()[: 4 if args.quick else None]:
            for seed in seeds if case.label.startswith("tp8 pp2 dp2") else seeds[:2]:
                r = measure(case, seed, args.repeats)
                if r:
                    runs.append(r)
                    print(f"  {r.label} seed {seed}: {fmt_time(r.time_to_optimum)}", flush=True)
        table("Targets", HEADER, run_rows(runs), lines)
        misses = [r for r in runs if r.time_to_optimum is None or r.time_to_optimum > 10]
        lines.append(
            f"\nTarget misses (not proven optimal within 10 s): {len(misses)} of {len(runs)}"
        )
        for r in misses:
            lines.append(f"- {r.label} (seed {r.seed})")
        print("\n".join(lines[-len(misses) - 1 :]), flush=True)

    if "scaling" in sections:
        runs = []
        for case in scaling_cases()[: 3 if args.quick else None]:
            r = measure(case, 0, args.repeats)
            if r:
                runs.append(r)
                print(f"  {r.label}: {fmt_time(r.time_to_optimum)}", flush=True)
        table("Scaling: instance size vs time to proven optimum", HEADER, run_rows(runs), lines)

    if "suite" in sections:
        runs = []
        for case, seed in suite_cases(10 if args.quick else args.suite):
            r = measure(case, seed, 1)
            if r:
                runs.append(r)
        proven = [r for r in runs if r.optimal_at_10s and r.greedy_gap is not None]
        gaps = np.array([r.greedy_gap for r in proven])

        def pct(x: float) -> str:
            return f"{100 * x:.2f}%" if len(gaps) else "-"

        rows = [
            ["instances (feasible)", str(len(runs))],
            ["proven optimal within 10 s", str(sum(r.optimal_at_10s for r in runs))],
            ["proven optimal within 1 s", str(sum(r.optimal_at_1s for r in runs))],
            ["greedy optimal (gap < 1e-6)", str(int((gaps < 1e-6).sum()))],
            ["greedy gap: median", pct(np.median(gaps)) if len(gaps) else "-"],
            ["greedy gap: mean", pct(gaps.mean()) if len(gaps) else "-"],
            ["greedy gap: 90th percentile", pct(np.quantile(gaps, 0.9)) if len(gaps) else "-"],
            ["greedy gap: max", pct(gaps.max()) if len(gaps) else "-"],
        ]
        table("Greedy's gap to the proven optimum (seeded suite)", ["", "value"], rows, lines)
        table("Suite instances", HEADER, run_rows(runs), lines)

    if args.out:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
