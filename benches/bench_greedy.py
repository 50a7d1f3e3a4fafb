"""Greedy placement latency, state memory and placement quality on fragmented clusters.

    python benches/bench_greedy.py            # full table (16,384 and 131,072 GPUs)
    python benches/bench_greedy.py --quick    # small clusters, for a smoke run

For each cluster and occupancy (0 %, 50 %, 90 %; occupancy made by placing and releasing jobs
drawn from the Philly running-job size mix, so the free GPUs are fragmented), it times greedy
placement of 8-, 64-, 1,024- and 4,096-GPU training jobs (median of several runs, the state
unchanged between runs) next to first-fit timed in the same run, and the end-to-end
``gpuplace.place(state, job, "greedy")`` a user calls (the solver, the placement gate and the
cost report; on a build before the gate: the solver call, then evaluate), and compares the
communication time per step and the bytes crossing the fabric of greedy, first-fit and random
placements of the same jobs on the same states. Timing is never asserted anywhere; this script
only measures and prints.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import gpuplace
import numpy as np
from gpuplace.sim.workload import DEFAULT_MODEL, fragment, training_job
from rich.console import Console
from rich.table import Table

JOB_SIZES = (8, 64, 1024, 4096)


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small clusters only")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    clusters = [256] if args.quick else [2048, 16384]
    occupancies = (0.0, 0.5, 0.9)
    console = Console(highlight=False, width=200)
    latency = Table(title="greedy placement latency (median ms; first-fit timed in the same run)")
    for col in (
        "GPUs",
        "occupancy",
        "state MiB",
        "job",
        "greedy ms",
        "first-fit ms",
        "greedy/first-fit",
        "place() ms",
    ):
        latency.add_column(col, justify="right")
    quality = Table(title="placement quality on the same states (comm s/step; fabric GB/step)")
    for col in (
        "GPUs",
        "occupancy",
        "job",
        "greedy comm",
        "first-fit comm",
        "random comm",
        "greedy fabric",
        "first-fit fabric",
        "random fabric",
        "greedy vs first-fit",
    ):
        quality.add_column(col, justify="right")
    ratios: dict[tuple[int, float], list[float]] = {}
    for nodes in clusters:
        topo = gpuplace.Topology.preset("h100-superpod", nodes=nodes)
        for occ in occupancies:
            state = gpuplace.ClusterState(topo)
            t0 = time.perf_counter()
            if occ:
                fragment(state, occ, seed=7)
            setup = time.perf_counter() - t0
            mem = state._core.memory_bytes() / 2**20
            console.print(
                f"[dim]{topo.num_gpus} GPUs at {occ:.0%}: {len(state.jobs)} jobs, "
                f"{state.free_gpus} free, made in {setup:.1f} s[/dim]"
            )
            for size in JOB_SIZES:
                if size > state.free_gpus:
                    continue
                job = training_job(
                    f"bench{size}", size, pp=4 if size >= 64 else 1, model=DEFAULT_MODEL
                )
                spec = job.compile(topo)
                results = {}
                for solver in ("greedy", "first-fit", "random"):
                    try:
                        results[solver] = gpuplace.place(state, job, solver, seed=1)
                    except gpuplace.Infeasible:
                        results[solver] = None
                if results["greedy"] is None:
                    latency.add_row(
                        str(topo.num_gpus),
                        f"{occ:.0%}",
                        f"{mem:.2f}",
                        str(size),
                        "infeasible",
                        "",
                        "",
                        "",
                    )
                    continue
                g_ms, f_ms = (
                    median_ms(
                        lambda s=solver, st=state, sp=spec: gpuplace._core.place(
                            st._core, sp, s, 0
                        ),
                        args.repeats,
                    )
                    for solver in ("greedy", "first-fit")
                )
                p_ms = median_ms(
                    lambda st=state, jb=job: gpuplace.place(st, jb, "greedy"), args.repeats
                )
                latency.add_row(
                    str(topo.num_gpus),
                    f"{occ:.0%}",
                    f"{mem:.2f}",
                    str(size),
                    f"{g_ms:.3f}",
                    f"{f_ms:.3f}",
                    f"{g_ms / f_ms:.2f}",
                    f"{p_ms:.3f}",
                )
                comm = {k: (v.cost.comm_seconds if v else float("nan")) for k, v in results.items()}
                fab = {
                    k: (v.cost.fabric_bytes / 1e9 if v else float("nan"))
                    for k, v in results.items()
                }
                better = 1 - comm["greedy"] / comm["first-fit"]
                ratios.setdefault((topo.num_gpus, occ), []).append(better)
                quality.add_row(
                    str(topo.num_gpus),
                    f"{occ:.0%}",
                    str(size),
                    f"{comm['greedy']:.3f}",
                    f"{comm['first-fit']:.3f}",
                    f"{comm['random']:.3f}",
                    f"{fab['greedy']:.1f}",
                    f"{fab['first-fit']:.1f}",
                    f"{fab['random']:.1f}",
                    f"{100 * better:.0f} % lower",
                )
    console.print(latency)
    console.print(quality)
    for (gpus, occ), values in ratios.items():
        console.print(
            f"{gpus} GPUs at {occ:.0%}: greedy's mean comm_seconds is "
            f"{100 * float(np.mean(values)):.0f} % below first-fit's (over {len(values)} jobs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
