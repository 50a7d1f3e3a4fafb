"""Cluster-simulator speed: the full Philly trace (82,247 jobs) replayed on a 16,384-GPU
``h100-superpod`` (2,048 nodes) per placement policy, against the issue's target of 60 s per
policy (at least 1,400 jobs/s), and an LLM mix with Llama 3 failure rates on a 100,000-GPU
cluster (12,500 nodes).

The peer measured in the same run is a minimal topology-blind simulator of the same trace (the
kind Tiresias- and Philly-style studies use: a heap of finish times, FIFO, GPUs as one counter,
no placement, no cost model), so the ratio is what topology-aware placement and pricing cost per
job. Medians over ``--runs`` runs (default 3). Run with ``nice python benches/bench_sim.py``;
``--quick`` replays the first 20,000 Philly jobs and skips the 100,000-GPU run; ``--queue``
picks the queue policy of the Philly runs (default fifo).
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import time

import gpuplace
from gpuplace.sim import metrics
from gpuplace.sim.engine import SimConfig, simulate
from gpuplace.sim.failures import llama3
from gpuplace.sim.traces import Workload, llm_mix, philly
from rich.console import Console
from rich.table import Table


def count_only_fifo(workload: Workload, gpus: int) -> float:
    """The peer: FIFO on a GPU counter; returns the mean JCT (s)."""
    free = gpus
    finishing: list[tuple[float, int]] = []
    queue: list[tuple[float, int, float]] = []
    jct = 0.0
    head = 0
    jobs = workload.jobs
    for job in jobs:
        now = job.submit_s
        while finishing and finishing[0][0] <= now:
            t, g = heapq.heappop(finishing)
            free += g
            while head < len(queue) and queue[head][1] <= free:
                submit, need, work = queue[head]
                head += 1
                free -= need
                heapq.heappush(finishing, (t + work, need))
                jct += t + work - submit
        queue.append((job.submit_s, job.gpus, job.work_s))
        while head < len(queue) and queue[head][1] <= free:
            submit, need, work = queue[head]
            head += 1
            free -= need
            heapq.heappush(finishing, (now + work, need))
            jct += now + work - submit
    while finishing:
        t, g = heapq.heappop(finishing)
        free += g
        while head < len(queue) and queue[head][1] <= free:
            submit, need, work = queue[head]
            head += 1
            free -= need
            heapq.heappush(finishing, (t + work, need))
            jct += t + work - submit
    return jct / len(jobs)


def _median_time(func, runs: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(runs):
        start = time.perf_counter()
        out = func()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--policies", default="greedy,first-fit,slurm-tree,kueue-bestfit")
    parser.add_argument(
        "--queue",
        default="fifo",
        help="queue policy of the Philly runs (fifo, priority, easy, slurm)",
    )
    args = parser.parse_args()
    console = Console(highlight=False, width=150)

    workload = philly()
    if args.quick:
        workload = workload.head(20_000)
    topology = gpuplace.Topology.preset("h100-superpod", nodes=2048)
    peer_s, _ = _median_time(lambda: count_only_fifo(workload, topology.num_gpus), args.runs)
    table = Table(
        title=f"Philly replay: {len(workload):,} jobs on {topology.num_gpus:,} GPUs, "
        f"--queue {args.queue}, median of {args.runs} runs (target: < 60 s, >= 1,400 jobs/s)",
        title_justify="left",
    )
    for col in (
        "policy",
        "wall s",
        "jobs/s",
        "x peer",
        "goodput",
        "JCT mean h",
        "JCT p99 h",
        "spine+core PB",
    ):
        table.add_column(col, justify="right")
    table.add_row(
        "peer: count-only FIFO",
        f"{peer_s:.2f}",
        f"{len(workload) / peer_s:,.0f}",
        "1.0",
        "",
        "",
        "",
        "",
    )
    for policy in args.policies.split(","):
        wall, result = _median_time(
            lambda policy=policy: simulate(
                topology, workload, SimConfig(solver=policy, policy=args.queue)
            ),
            args.runs,
        )
        s = metrics.summary(result)  # type: ignore[arg-type]
        fabric = s["fabric_bytes_by_level"]
        upper = sum(v for k, v in fabric.items() if k in ("spine", "core"))
        table.add_row(
            policy,
            f"{wall:.2f}",
            f"{len(workload) / wall:,.0f}",
            f"{wall / peer_s:.1f}",
            f"{100 * s['goodput']:.2f} %",
            f"{s['jct_mean_s'] / 3600:.2f}",
            f"{s['jct_p99_s'] / 3600:.2f}",
            f"{upper / 1e15:,.1f}",
        )
    console.print(table)

    if args.quick:
        return
    big = gpuplace.Topology.preset("h100-superpod", nodes=12_500)
    mix = llm_mix(2_000, cluster_gpus=big.num_gpus, seed=0)
    wall, result = _median_time(lambda: simulate(big, mix, SimConfig(failures=llama3())), 1)
    s = metrics.summary(result)  # type: ignore[arg-type]
    console.print(
        f"LLM mix: {len(mix):,} jobs (8 to 16,384 GPUs) with Llama 3 failures on {big.num_gpus:,} GPUs: "
        f"{wall:.1f} s, {s['jobs_finished']:,} finished, goodput {100 * s['goodput']:.1f} %, "
        f"MFU {100 * (s['mfu'] or 0):.1f} %, {s['gpu_hours_lost']:,.0f} GPU-hours lost"
    )


if __name__ == "__main__":
    main()
