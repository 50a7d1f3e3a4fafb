"""What the policy layer costs a placement: greedy on a 16,384-GPU h100-superpod
(nodes=2048, fragmented to 50 % with the Philly running-job mix), a 64-GPU job (tp 8, dp 8)
with no policy (the peer, measured in the same run), then in a pool of half the scalable
units, then in that pool with an ``avoid`` firmware rule matching an eighth of the hosts,
and the same for a preemption proposal when the pool is full of preemptible batch jobs.
Medians over several runs. Run with ``python benches/bench_policy.py``.
"""

from __future__ import annotations

import statistics
import time

import gpuplace
from gpuplace._util.documents import Checker
from gpuplace.errors import InvalidState
from gpuplace.model.policy import ClusterPolicy
from gpuplace.sim.workload import fragment
from rich.console import Console
from rich.table import Table

RUNS = 15


def timed(state: gpuplace.ClusterState, job: gpuplace.Job, **kw: object) -> tuple[float, int]:
    times = []
    placement = None
    for _ in range(RUNS):
        start = time.perf_counter()
        placement = gpuplace.place(state, job, **kw)  # type: ignore[arg-type]
        times.append(time.perf_counter() - start)
    assert placement is not None
    return statistics.median(times) * 1e3, len(
        placement.details.get("preemption", {}).get("victims", [])
    )


def main() -> None:
    topo = gpuplace.Topology.preset("h100-superpod", nodes=2048)
    state = gpuplace.ClusterState(topo)
    fragment(state, 0.5, seed=1)
    leaves = topo.domain_names[topo.level_index("leaf")]
    half = leaves[: len(leaves) // 2]
    c = Checker(InvalidState, None)
    state.policy = ClusterPolicy.from_dict(
        {
            "pools": {"training": half, "inference": leaves[len(leaves) // 2 :]},
            "priority_classes": {
                "batch": {"priority": 1, "preemptible": True},
                "production": {"priority": 100},
            },
            "attributes": [{"hosts": h, "firmware": "96.00.74"} for h in topo.hosts[::8]],
        },
        c,
    )
    plain = gpuplace.Job(name="j", tp=8, dp=8)
    pooled = gpuplace.Job.from_dict(
        {"name": "j", "parallelism": {"tp": 8, "dp": 8}, "policy": {"pool": "training"}}
    )
    ruled = gpuplace.Job.from_dict(
        {
            "name": "j",
            "parallelism": {"tp": 8, "dp": 8},
            "policy": {"pool": "training", "avoid": {"firmware": "<96.00.99"}},
        }
    )
    bare = gpuplace.ClusterState(topo)
    fragment(bare, 0.5, seed=1)
    rows = [
        ("no policy (peer)", *timed(bare, plain)),
        ("pool", *timed(state, pooled)),
        ("pool + avoid rule", *timed(state, ruled)),
    ]
    full = state.copy()
    training = gpuplace.Job.from_dict(
        {
            "name": "fill",
            "parallelism": {"tp": 8, "dp": 1},
            "policy": {"pool": "training", "priority_class": "batch"},
        }
    )
    k = 0
    while True:
        try:
            p = gpuplace.place(
                full, gpuplace.Job.from_dict({**training.to_dict(), "name": f"fill{k}"})
            )
        except gpuplace.Infeasible:
            break
        if p.details.get("policy", {}).get("borrowed_gpus"):
            break
        full.allocate(p)
        k += 1
    urgent = gpuplace.Job.from_dict(
        {
            "name": "urgent",
            "parallelism": {"tp": 8, "dp": 8},
            "policy": {"pool": "training", "priority_class": "production"},
        }
    )
    rows.append(
        ("preemption proposal (pool full of batch jobs)", *timed(full, urgent, preempt=True))
    )
    table = Table(
        "case",
        "median ms",
        "victims",
        title=f"gpuplace.place, 64-GPU job on {topo.num_gpus} GPUs at 50 %",
    )
    for name, ms, victims in rows:
        table.add_row(name, f"{ms:.2f}", str(victims))
    Console().print(table)


if __name__ == "__main__":
    main()
