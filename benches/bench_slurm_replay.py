"""The simulator's Slurm against a real Slurm 22.05 on loopback, at the larger size.

A day of submissions (300 jobs by default, 70 % of 1, 2 or 4 GPUs on shared nodes, 30 % of 1
to 3 whole nodes with ``--exclusive``) compressed into 180 s (factor 480), each ``sleep`` of 5
to 50 s with a time limit of 1 to 3 times its duration in whole minutes, is submitted to
slurmctld (``sched/backfill``, ``select/cons_tres``, ``topology/tree``; 16 slurmd nodes of 8
fake GPUs in 4 leaves) at its submit times; each job stamps its start and end. The same trace,
with the submit times Slurm saw, runs through ``simulate`` with ``slurm-tree`` under the
``slurm`` queue policy (and ``easy`` and ``fifo`` for comparison). Printed per policy: the
median absolute start-time error as a share of the real makespan, the makespan error, and the
share of job pairs started in the same order. Targets (issue 27): <= 2 %, within 3 %, >= 95 %.

    python benches/bench_slurm_replay.py                 # about 6 minutes, needs root
    python benches/bench_slurm_replay.py --save run.json # keep the observations
    python benches/bench_slurm_replay.py --load run.json # re-simulate without Slurm

Results: benches/results/bench_slurm_replay.txt (and .json, the observations).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from slurm_harness import LoopbackSlurm, missing_daemons  # noqa: E402
from slurm_replay import (  # noqa: E402
    BACKFILL_INTERVAL_S,
    Latency,
    Observed,
    ReplayJob,
    compare,
    compare_runs,
    latency,
    make_trace,
    origin,
    replay_on_slurm,
    replay_topology,
    replay_workload,
    simulate_replay,
    slurm_conf,
)


class _Shape:
    """The cluster's shape, for :func:`replay_topology` when re-simulating saved runs."""

    def __init__(self, leaves: int, per_leaf: int) -> None:
        self.leaves, self.per_leaf, self.spines = leaves, per_leaf, 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--span", type=float, default=180.0, help="submission window (s)")
    ap.add_argument("--durations", default="5,50", help="sleep range (s), log-uniform")
    ap.add_argument("--max-nodes", type=int, default=3)
    ap.add_argument("--leaves", type=int, default=4)
    ap.add_argument("--per-leaf", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--repeat", action="store_true", help="replay the trace twice: real Slurm against itself"
    )
    ap.add_argument("--save", type=Path, help="write the trace and observations here")
    ap.add_argument("--load", type=Path, help="re-simulate observations saved by --save")
    args = ap.parse_args()
    if args.load:
        saved = json.loads(args.load.read_text())
        trace = [ReplayJob(**j) for j in saved["trace"]]
        observed = {k: Observed(**v) for k, v in saved["observed"].items()}
        shape = _Shape(saved["leaves"], saved["per_leaf"])
        wall = saved.get("wall_s", 0.0)
        again = saved.get("again")
        repeat = {k: Observed(**v) for k, v in again.items()} if again else None
    else:
        missing = missing_daemons()
        if missing or os.geteuid() != 0:
            print(f"needs Slurm, munge and root (missing: {', '.join(missing) or 'root'})")
            return 2
        lo, hi = (float(x) for x in args.durations.split(","))
        nodes = args.leaves * args.per_leaf
        trace = make_trace(args.jobs, nodes, args.span, args.seed, (lo, hi), args.max_nodes)
        started = time.time()
        runs = []
        for _ in range(2 if args.repeat else 1):
            with tempfile.TemporaryDirectory(prefix="slurm-replay-") as work:
                with LoopbackSlurm(
                    Path(work), args.leaves, args.per_leaf, gpus=8, extra_conf=slurm_conf()
                ) as slurm:
                    runs.append(replay_on_slurm(slurm, trace, timeout_s=3600))
        wall = (time.time() - started) / len(runs)
        observed = runs[0]
        repeat = runs[1] if len(runs) > 1 else None
        shape = _Shape(args.leaves, args.per_leaf)
        if args.save:
            args.save.write_text(
                json.dumps(
                    {
                        "leaves": args.leaves,
                        "per_leaf": args.per_leaf,
                        "wall_s": wall,
                        "trace": [asdict(j) for j in trace],
                        "observed": {k: asdict(v) for k, v in observed.items()},
                        "again": {k: asdict(v) for k, v in repeat.items()} if repeat else None,
                    }
                )
            )
    topology = replay_topology(shape)  # type: ignore[arg-type]
    lat = latency(observed)
    workload = replay_workload(trace, observed, lat)
    gpu_s = sum(j.gpus * j.duration_s for j in trace)
    span = max(o.submit_s for o in observed.values()) - min(o.submit_s for o in observed.values())
    print(
        f"{len(trace)} jobs on {topology.num_gpus} GPUs ({len(topology.hosts)} nodes), "
        f"submitted over {span:.0f} s (a day compressed {86_400 / span:.0f}x), "
        f"{gpu_s / 3600:.1f} GPU-h of sleep, {sum(j.exclusive for j in trace)} --exclusive; "
        f"Slurm wall {wall:.0f} s; launch {lat.launch_s:.2f} s, release {lat.release_s:.2f} s"
    )
    clock = origin(observed)
    if not clock:
        print("(no clock origin recorded: the simulator's backfill windows use Unix time 0)")
    for policy in ("slurm", "easy", "fifo"):
        result = simulate_replay(topology, workload, policy, BACKFILL_INTERVAL_S, clock)
        print(f"{policy:>5}: {compare(observed, result, lat).line()}")
        zero = Latency(0.0, 0.0)
        plain = simulate_replay(
            topology, replay_workload(trace, observed, zero), policy, BACKFILL_INTERVAL_S, clock
        )
        print(f"{'':>5}  without Slurm's latency: {compare(observed, plain, zero).line()}")
    if repeat is not None:
        print(f"real Slurm against itself (second run): {compare_runs(observed, repeat).line()}")
        lat2 = latency(repeat)
        again = simulate_replay(
            topology,
            replay_workload(trace, repeat, lat2),
            "slurm",
            BACKFILL_INTERVAL_S,
            origin(repeat),
        )
        print(f"slurm against the second run: {compare(repeat, again, lat2).line()}")
    print(f"load: {os.getloadavg()[0]:.2f} (1 min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
