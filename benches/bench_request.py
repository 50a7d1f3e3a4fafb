"""One request in, one report out: what a placement costs through the Python API, measured
against a previous version of gpuplace in the same run.

    python benches/bench_request.py                      # this checkout against the installed gpuplace
    python benches/bench_request.py --peer ../old/python # against another checkout's python/
    python benches/bench_request.py --runs 3 --quick     # a smoke run

Every figure is measured in a fresh process per run (so imports and cluster construction are
not timed), alternating this checkout and the peer run by run, and reported as the median of
``--runs`` runs with the ratio to the peer's median:

- ``place + allocate``: ``gpuplace.place`` then ``state.allocate`` of small training jobs (1 to
  32 GPUs, sizes drawn uniformly from 1, 2, 4, 8, 16, 32, seeded) on a 16,384-GPU
  ``h100-superpod``, the oldest job released once 600 run (about 40 % occupancy), per second.
  Two workloads: jobs that declare only their parallelism (no communication volume, so the
  fabric stays unloaded), and jobs that declare a model (their data-parallel traffic loads the
  fabric's uplinks, so every placement is priced against its neighbours). Also per second of
  the calling thread's CPU time, which other work on a shared machine inflates less.
- ``place + allocate with power``: the same parallelism-only jobs on the same cluster with a
  power budget per scalable unit (``power.leaf.budget_w=120000``: 120 kW for 256 GPUs of 700 W,
  two thirds of their board power) and two phase slots (``power_phases=2``); every other job
  declares a synchronised draw (700 W peak, 450 W average per GPU), so ``place`` tries both
  slots on a power-limited view of the state and ``allocate`` checks the budgets
  (``gpuplace.cluster.power``). A job no slot fits (``Infeasible``) counts as placed and
  allocates nothing.
- ``repair``: the 405B case of ``bench_repair.py`` (tp8 pp16 dp128 on 16,896 GPUs, a NIC at
  1 % loss under rank 800, ``max_moves=8``): wall time of ``gpuplace.repair`` through the API,
  the CPU time of the calling thread in that call (which other work on a shared machine does
  not inflate), and the wall and CPU time of the binding call alone (``state._core.repair``
  called from Python with the arguments the API passes it, the same span in both versions:
  ``Repair.elapsed_s`` is not, as the previous version timed its fencing with the call and
  this one times the repair inside the core), median over repeats on fresh copies.
- ``greedy``: ``gpuplace.place(state, job)`` of 8-, 256- and 4,096-GPU training jobs on empty
  16,384- and 131,072-GPU clusters (median of repeats, the state unchanged between them).
- ``philly``: wall time of the simulator replaying the first ``--philly-jobs`` jobs of the
  Philly trace on 16,384 GPUs with the greedy solver (``gpuplace.sim.simulate``).

Targets (issue 21): place + allocate >= 20,000 per second; repair < 10 ms through the API;
nothing slower than the peer. This script only measures and prints.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SIZES = (1, 2, 4, 8, 16, 32)
WINDOW = 600


# ------------------------------------------------------------------ the measurements
def _small_jobs(count: int, model: bool) -> list[Any]:
    import gpuplace
    from gpuplace.sim.workload import training_job

    rng = random.Random(0)
    jobs = []
    for i in range(count):
        size = rng.choice(SIZES)
        if model:
            jobs.append(training_job(f"j{i}", size))
        else:
            tp = min(size, 8)
            jobs.append(gpuplace.Job(name=f"j{i}", tp=tp, dp=size // tp))
    return jobs


def place_allocate(model: bool, count: int) -> dict[str, float]:
    """Jobs per second through place + allocate (after a warm-up of WINDOW jobs)."""
    import gpuplace

    state = gpuplace.ClusterState(gpuplace.Topology.preset("h100-superpod", nodes=2048))
    return _place_and_allocate(state, _small_jobs(count + WINDOW, model), count)


def _place_and_allocate(
    state: Any, jobs: list[Any], count: int, *, refused: bool = False
) -> dict[str, float]:
    """Place and allocate ``jobs`` in turn, each released WINDOW jobs later; time the last
    ``count`` of them (the first WINDOW are the warm-up). With ``refused``, a job no placement
    fits is skipped (power budgets refuse some) instead of failing the run."""
    import gpuplace

    running: list[str] = []

    def run(batch: list[Any]) -> None:
        for job in batch:
            try:
                placement = gpuplace.place(state, job)
            except gpuplace.Infeasible:
                if not refused:
                    raise
                continue
            state.allocate(placement)
            running.append(job.name)
            if len(running) > WINDOW:
                state.release(running.pop(0))

    run(jobs[:WINDOW])
    start, start_cpu = time.perf_counter(), time.thread_time()
    run(jobs[WINDOW:])
    return {
        "per_s": count / (time.perf_counter() - start),
        "per_cpu_s": count / (time.thread_time() - start_cpu),
    }


def place_power(count: int) -> dict[str, float]:
    """Jobs per second through place + allocate within power budgets (after a warm-up of
    WINDOW jobs)."""
    import gpuplace
    from gpuplace.model.power import JobPower

    options = {"nodes": 2048, "power.leaf.budget_w": 120_000.0, "power_phases": 2}
    state = gpuplace.ClusterState(gpuplace.Topology.from_spec("h100-superpod", options))
    synced = JobPower(peak_w=700.0, average_w=450.0, synchronized=True)
    jobs = [
        gpuplace.Job(name=j.name, tp=j.tp, dp=j.dp, power=synced if i % 2 else None)
        for i, j in enumerate(_small_jobs(count + WINDOW, False))
    ]
    return _place_and_allocate(state, jobs, count, refused=True)


def _repair_binding_args(job: Any, topology: Any) -> tuple[Any, ...]:
    """The arguments ``gpuplace.repair(state, "llama", max_moves=8)`` hands the native
    module's ``ClusterState.repair`` (the binding call), in this version or in one from before
    the package was grouped by concept (b6ce999: ``gpuplace.repair._POLICY``, no storage
    argument)."""
    spec = job.compile(topology)
    try:
        from gpuplace.placement.repair import spare_policy
    except ImportError:  # the previous layout
        from gpuplace.repair import _POLICY  # type: ignore[import-not-found]

        return (spec, "llama", 8, _POLICY[None], 24, None)
    return (spec, "llama", 8, spare_policy(None), 24, None, None)


def repair(repeats: int) -> dict[str, float]:
    """The 405B NIC-loss evacuation: milliseconds through the API, and of the binding call
    alone (the same span in either version: the native ``repair`` call from Python, with the
    arguments the API passes it), each on fresh copies of the state."""
    import gpuplace
    from bench_repair import degrade_nic, evacuation_case  # the same case, one definition

    topo, base, job = evacuation_case()
    degrade_nic(topo, base)
    copies = [base.copy() for _ in range(repeats)]
    api, cpu = [], []
    for state in copies:
        start, start_cpu = time.perf_counter(), time.thread_time()
        gpuplace.repair(state, "llama", max_moves=8)
        api.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
    args = _repair_binding_args(job, topo)
    natives = [base.copy()._core for _ in range(repeats)]
    call, call_cpu = [], []
    for native in natives:
        start, start_cpu = time.perf_counter(), time.thread_time()
        native.repair(*args)
        call.append(time.perf_counter() - start)
        call_cpu.append(time.thread_time() - start_cpu)
    return {
        "api_ms": statistics.median(api) * 1e3,
        "api_cpu_ms": statistics.median(cpu) * 1e3,
        "call_ms": statistics.median(call) * 1e3,
        "call_cpu_ms": statistics.median(call_cpu) * 1e3,
    }


def greedy(nodes: int, repeats: int) -> dict[str, float]:
    """Milliseconds of gpuplace.place(state, job) per job size on an empty cluster."""
    import gpuplace
    from gpuplace.sim.workload import training_job

    state = gpuplace.ClusterState(gpuplace.Topology.preset("h100-superpod", nodes=nodes))
    out = {}
    for size in (8, 256, 4096):
        job = training_job(f"g{size}", size, pp=4 if size >= 256 else 1)
        gpuplace.place(state, job)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            gpuplace.place(state, job)
            times.append(time.perf_counter() - start)
        out[f"{size}_ms"] = statistics.median(times) * 1e3
    return out


def philly(jobs: int) -> dict[str, float]:
    """Wall seconds of the simulator replaying the first ``jobs`` Philly jobs with greedy."""
    import gpuplace
    from gpuplace.sim.engine import SimConfig, simulate
    from gpuplace.sim.traces import philly as philly_trace

    workload = philly_trace().head(jobs)
    topology = gpuplace.Topology.preset("h100-superpod", nodes=2048)
    start = time.perf_counter()
    simulate(topology, workload, SimConfig(solver="greedy"))
    return {"wall_s": time.perf_counter() - start}


def worker(name: str, args: argparse.Namespace) -> dict[str, float]:
    if name == "place-bare":
        return place_allocate(False, args.jobs)
    if name == "place-model":
        return place_allocate(True, args.model_jobs)
    if name == "place-power":
        return place_power(args.power_jobs)
    if name == "repair":
        return repair(args.repeats)
    if name == "greedy-16k":
        return greedy(2048, args.repeats)
    if name == "greedy-131k":
        return greedy(16384, args.repeats)
    if name == "philly":
        return philly(args.philly_jobs)
    raise SystemExit(f"unknown measurement {name!r}")


# ------------------------------------------------------------------ the driver
def _run(name: str, pythonpath: str | None, args: argparse.Namespace) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, __file__, "--worker", name]
    cmd += ["--jobs", str(args.jobs), "--model-jobs", str(args.model_jobs)]
    cmd += ["--repeats", str(args.repeats), "--philly-jobs", str(args.philly_jobs)]
    cmd += ["--power-jobs", str(args.power_jobs)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} ({pythonpath or 'installed'}) failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


ROWS = [
    ("place-bare", "per_s", "place + allocate /s, 1-32 GPUs, parallelism only", True),
    ("place-bare", "per_cpu_s", "  the same per CPU second", True),
    ("place-model", "per_s", "place + allocate /s, 1-32 GPUs, with a model", True),
    ("place-model", "per_cpu_s", "  the same per CPU second", True),
    ("place-power", "per_s", "place + allocate /s, 1-32 GPUs, power budgets", True),
    ("place-power", "per_cpu_s", "  the same per CPU second", True),
    ("repair", "api_ms", "repair 405B NIC loss, API ms", False),
    ("repair", "api_cpu_ms", "repair 405B NIC loss, API CPU ms", False),
    ("repair", "call_ms", "repair 405B NIC loss, binding call ms", False),
    ("repair", "call_cpu_ms", "repair 405B NIC loss, binding call CPU ms", False),
    ("greedy-16k", "8_ms", "greedy 8 GPUs on 16k, ms", False),
    ("greedy-16k", "256_ms", "greedy 256 GPUs on 16k, ms", False),
    ("greedy-16k", "4096_ms", "greedy 4096 GPUs on 16k, ms", False),
    ("greedy-131k", "8_ms", "greedy 8 GPUs on 131k, ms", False),
    ("greedy-131k", "256_ms", "greedy 256 GPUs on 131k, ms", False),
    ("greedy-131k", "4096_ms", "greedy 4096 GPUs on 131k, ms", False),
    ("philly", "wall_s", "Philly replay wall s", False),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=6000, help="jobs timed, parallelism only")
    ap.add_argument("--model-jobs", type=int, default=1500, help="jobs timed, with a model")
    ap.add_argument("--power-jobs", type=int, default=1500, help="jobs timed, within power budgets")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--philly-jobs", type=int, default=20_000)
    ap.add_argument(
        "--peer",
        default="",
        help="PYTHONPATH of the version to compare against (default: the installed gpuplace)",
    )
    ap.add_argument("--only", default="", help="comma-separated measurements to run")
    ap.add_argument("--quick", action="store_true", help="fewer jobs, a short replay")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return
    if args.quick:
        args.jobs, args.model_jobs, args.philly_jobs, args.repeats = 2000, 300, 3000, 5
        args.power_jobs = 300
    here = str(Path(__file__).resolve().parents[1] / "python")
    names = list(dict.fromkeys(name for name, *_ in ROWS))
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for run in range(args.runs):
        for name in names:
            # Alternate which version goes first, so drift on a shared machine hits both.
            order = [("this", here), ("peer", args.peer)]
            for label, path in order if run % 2 == 0 else order[::-1]:
                results.setdefault((name, label), []).append(_run(name, path, args))
        print(f"run {run + 1}/{args.runs} done", file=sys.stderr)
    header = f"{'measurement':48} {'peer':>12} {'this':>12} {'this/peer':>10} {'faster':>7}"
    print(f"median of {args.runs} runs, each in a fresh process, alternating")
    print(header)
    print("-" * len(header))
    for name, key, title, higher_better in ROWS:
        if (name, "this") not in results:
            continue
        this = statistics.median(r[key] for r in results[(name, "this")])
        peer = statistics.median(r[key] for r in results[(name, "peer")])
        ratio = this / peer if peer else float("nan")
        speedup = ratio if higher_better else (1 / ratio if ratio else float("nan"))
        print(f"{title:48} {peer:12.3f} {this:12.3f} {ratio:10.3f} {speedup:6.2f}x")


if __name__ == "__main__":
    main()
