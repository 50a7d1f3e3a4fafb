"""Repair latency and quality: one failed node inside a 4,096-GPU job on 16,384 GPUs
(h100-superpod nodes=2048, fragmented to 50 % by gpuplace.sim.workload.fragment), then the
same with a degraded leaf switch under the job; then the evacuation of a 405B-like job
(tp8 pp16 dp128 = 16,384 GPUs on h100-superpod nodes=2112) off a NIC with 1 % loss under rank
800, with ``max_moves=8`` (one tp group).

For each case: the median repair time over several runs (each on a fresh copy of the state;
wall time through the API, the CPU time of that call, which a machine shared with other work
does not inflate, and the wall time inside the Rust core),
the communication time per step before the failure and after the repair, and the cost of a
fresh greedy placement of the same job on the same state (with the job's own GPUs released and
the failed node out), as the peer measured in the same run. Run with
``nice python benches/bench_repair.py``.
"""

from __future__ import annotations

import statistics
import time

import gpuplace
from gpuplace.sim.workload import fragment, training_job
from rich.console import Console
from rich.table import Table

RUNS = 15


def _case(
    base: gpuplace.ClusterState, job: gpuplace.Job, degrade_leaf: bool
) -> dict[str, float | str]:
    topo = base.topology
    gpus = base.jobs[job.name]
    victim = topo.host_of(int(gpus[len(gpus) // 2]))
    prepared = base.copy()
    if degrade_leaf:
        leaf = topo.domain_of(int(gpus[len(gpus) // 2]), "leaf")
        prepared.degrade(switch=leaf, loss="1%")
    prepared.fail(host=victim)
    times, cpu, core, result = [], [], [], None
    for _ in range(RUNS):
        state = prepared.copy()
        start, start_cpu = time.perf_counter(), time.process_time()
        result = gpuplace.repair(state, job.name)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        core.append(result.elapsed_s)
        state.check()
    assert result is not None
    case = "failed node" + (" + degraded leaf (1 % loss)" if degrade_leaf else "")
    return _row(case, result, times, cpu, core, prepared, job)


def _row(
    case: str,
    result: gpuplace.Repair,
    times: list[float],
    cpu: list[float],
    core: list[float],
    prepared: gpuplace.ClusterState,
    job: gpuplace.Job,
) -> dict[str, float | str]:
    """One table row, with a fresh greedy placement of the job on the prepared state (its
    own GPUs released) as the peer measured in the same run."""
    fresh_state = prepared.copy()
    fresh_state.release(job.name)
    start = time.perf_counter()
    fresh = gpuplace.place(fresh_state, job)
    fresh_s = time.perf_counter() - start
    return {
        "case": case,
        "moved": len(result.moved),
        "core_ms": statistics.median(core) * 1e3,
        "repair_ms": statistics.median(times) * 1e3,
        "cpu_ms": statistics.median(cpu) * 1e3,
        "before_ms": result.cost_before.comm_seconds * 1e3,
        "after_ms": result.cost_after.comm_seconds * 1e3,
        "fresh_ms": fresh.cost.comm_seconds * 1e3,
        "fresh_time_ms": fresh_s * 1e3,
    }


def evacuation_case() -> tuple[gpuplace.Topology, gpuplace.ClusterState, gpuplace.Job]:
    """The 405B evacuation case (also timed by bench_request.py): Llama 3 405B (tp8 pp16
    dp128) on 16,896 GPUs, one NIC under rank 800 at 1 % loss, nothing failed. Returns the
    topology, the state (before the NIC degrades: ``degrade_nic`` below) and the job."""
    topo = gpuplace.Topology.preset("h100-superpod", nodes=2112)
    base = gpuplace.ClusterState(topo)
    job = gpuplace.Job(
        name="llama",
        tp=8,
        pp=16,
        dp=128,
        model=gpuplace.TransformerModel(
            parameters=405e9,
            layers=126,
            hidden_size=16384,
            sequence_length=8192,
            micro_batches=16,
        ),
    )
    base.allocate(gpuplace.place(base, job))
    return topo, base, job


def degrade_nic(topo: gpuplace.Topology, state: gpuplace.ClusterState) -> None:
    """The lossy NIC of :func:`evacuation_case`."""
    state.degrade(nic=f"{topo.host_of(int(state.jobs['llama'][800]))}:mlx5_0", loss="1%")


def _evacuation() -> dict[str, float | str]:
    """The issue's 405B case: nothing failed, one NIC lossy, ``repair(max_moves=8)``."""
    topo, base, job = evacuation_case()
    healthy = gpuplace.evaluate(topo, job, base.jobs["llama"]).comm_seconds
    degrade_nic(topo, base)
    times, cpu, core, result = [], [], [], None
    for _ in range(RUNS):
        state = base.copy()
        start, start_cpu = time.perf_counter(), time.process_time()
        result = gpuplace.repair(state, "llama", max_moves=8)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        core.append(result.elapsed_s)
        state.check()
    assert result is not None
    case = f"405B job, NIC at 1 % loss, max_moves=8 (healthy {healthy * 1e3:.1f} ms)"
    return _row(case, result, times, cpu, core, base, job)


def main() -> None:
    topo = gpuplace.Topology.preset("h100-superpod", nodes=2048)
    state = gpuplace.ClusterState(topo)
    start = time.perf_counter()
    jobs = fragment(state, 0.5, seed=0)
    print(
        f"{topo.num_gpus} GPUs at 50%: {jobs} jobs, {state.free_gpus} free, "
        f"made in {time.perf_counter() - start:.1f} s"
    )
    job = training_job("big", 4096, pp=4)
    state.allocate(gpuplace.place(state, job))
    rows = [_case(state, job, False), _case(state, job, True), _evacuation()]
    table = Table(
        title=f"repair of a 4,096-GPU job (tp8 pp4 dp128) on {topo.num_gpus} GPUs, and "
        f"evacuation of a 16,384-GPU job on 16,896 GPUs (median of {RUNS})"
    )
    for col in (
        "case",
        "ranks moved",
        "repair ms (API)",
        "CPU ms (API)",
        "core ms",
        "comm before ms",
        "comm after repair ms",
        "fresh greedy comm ms",
        "after/fresh",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["case"]),
            str(r["moved"]),
            f"{r['repair_ms']:.2f}",
            f"{r['cpu_ms']:.2f}",
            f"{r['core_ms']:.2f}",
            f"{r['before_ms']:.3f}",
            f"{r['after_ms']:.3f}",
            f"{r['fresh_ms']:.3f}",
            f"{float(r['after_ms']) / float(r['fresh_ms']):.4f}",
        )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
