"""MIG packing on the Alibaba openb pods: FGD vs best-fit vs first-fit.

The pods of the openb trace (Weng et al., ATC'23; ``benches/data/README.md``) that ask for
one GPU or a share of one are turned into MIG requests on A100 80 GB GPUs: ``gpu_milli /
1000`` is mapped to the non-media profile whose compute fraction (g/7) is nearest, ties to
the larger (``gpuplace.cluster.mig.profile_for_share``): 50-210 -> 1g.10gb, 220-350 -> 2g.20gb,
360-500 -> 3g.40gb, 510-710 -> 4g.40gb, 720-999 -> 7g.80gb. Pods with no GPU, with a whole
GPU (``gpu_milli`` 1000) or with several are left out: they are not MIG requests (a cluster
serves them from GPUs outside MIG mode).

For each trace (``default``, ``gpushare100``) and seed, the requests arrive in a random order
(the same order for every policy) on an empty cluster, and each policy places them until the
first request fails. Reported: the unallocated GPU share when the first request fails (free
compute slices / 7, summed over GPUs, as a % of the cluster) and the pods placed; medians
over the seeds. FGD's request distribution is the trace's profile mix. Best-fit is the peer
measured in the same run; the target is >= 20 % fewer unallocated GPUs than best-fit.

Run with ``python benches/bench_mig.py`` (about a minute; ``--quick`` for a smaller run).
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import random
import statistics
import time
from pathlib import Path

from gpuplace.cluster.mig import MigCluster
from gpuplace.errors import Infeasible
from gpuplace.model.mig import MODELS, Request, profile_for_share
from rich.console import Console
from rich.table import Table

DATA = Path(__file__).resolve().parent / "data" / "openb_pods.csv.gz"
POLICIES = ("fgd", "best-fit", "first-fit")


def load_requests(trace: str) -> list[str]:
    """Profile name per MIG-eligible pod of one trace, in trace order."""
    model = MODELS["A100-80GB"]
    out = []
    with gzip.open(DATA, "rt", newline="") as fh:
        for row in csv.DictReader(fh):
            if row["trace"] != trace:
                continue
            num_gpu, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if num_gpu != 1 or not 0 < milli < 1000:
                continue
            out.append(profile_for_share(model, milli / 1000).name)
    return out


def run(profiles: list[str], gpus: int, policy: str, seed: int) -> dict[str, float]:
    order = list(profiles)
    random.Random(seed).shuffle(order)
    mix = collections.Counter(profiles)
    cluster = MigCluster(MODELS["A100-80GB"], gpus, distribution=mix)
    placed = 0
    start = time.perf_counter()
    for i, name in enumerate(order):
        try:
            cluster.place(Request(f"pod{i}", name), policy)
        except Infeasible:
            break
        placed += 1
    elapsed = time.perf_counter() - start
    cluster.check()
    return {
        "unallocated": cluster.free_share() / gpus * 100,
        "placed": placed,
        "ms_per_pod": elapsed / max(placed, 1) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gpus", type=int, default=None)
    parser.add_argument("--seeds", type=int, default=None)
    args = parser.parse_args()
    gpus = args.gpus or (200 if args.quick else 1000)
    seeds = args.seeds or (3 if args.quick else 7)
    console = Console()
    table = Table(
        "trace",
        "policy",
        "unallocated at first failure (%)",
        "pods placed",
        "ms per pod",
        "vs best-fit",
        title=f"MIG packing of openb pods on {gpus} A100 80 GB GPUs, medians over {seeds} seeds",
    )
    for trace in ("default", "gpushare100"):
        profiles = load_requests(trace)
        results = {p: [run(profiles, gpus, p, seed) for seed in range(seeds)] for p in POLICIES}
        median = {
            p: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for p, rs in results.items()
        }
        peer = median["best-fit"]["unallocated"]
        for p in POLICIES:
            m = median[p]
            change = (1 - m["unallocated"] / peer) * 100 if peer else 0.0
            table.add_row(
                f"{trace} ({len(profiles)} pods)",
                p,
                f"{m['unallocated']:.2f}",
                f"{m['placed']:.0f}",
                f"{m['ms_per_pod']:.3f}",
                "-" if p == "best-fit" else f"{change:+.1f} % fewer",
            )
    console.print(table)


if __name__ == "__main__":
    main()
