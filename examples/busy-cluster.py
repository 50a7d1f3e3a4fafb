"""Build ``examples/busy-h100-superpod.json``: a loaded, fragmented cluster for the README's demo.

A 256-node DGX H100 SuperPOD whose leaves hash flows onto their spine uplinks (RoCE-style ECMP,
one queue pair per connection: ``-p levels.leaf.routing=ecmp``), brought to about 75 %
occupancy the way a busy cluster gets there: jobs from a mix of mixture-of-experts and dense
training jobs (16 to 64 GPUs) are placed by Slurm's topology/tree plugin until it is nearly
full, then random jobs end, six rounds over (``gpuplace.sim.contention.loaded_state``), so
free nodes are scattered over the leaves (none holds a 256-GPU job) and running jobs' flows
load the spine uplinks.

    python examples/busy-cluster.py            # writes examples/busy-h100-superpod.json
    cp examples/busy-h100-superpod.json state.json
    gpuplace place --state state.json -j examples/llama3-70b.yaml

Deterministic for a seed (``--seed``, default 0).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuplace import Topology
from gpuplace.sim.contention import loaded_state

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--occupancy", type=float, default=0.75)
    ap.add_argument("-o", "--out", type=Path, default=HERE / "busy-h100-superpod.json")
    args = ap.parse_args()
    topology = Topology.from_spec("h100-superpod", {"nodes": 256, "levels.leaf.routing": "ecmp"})
    state = loaded_state(topology, args.occupancy, seed=args.seed, sizes=(16, 32, 64), rounds=6)
    state.save(args.out)
    print(
        f"{args.out.name}: {len(state.jobs)} running jobs, "
        f"{state.free_gpus} of {topology.num_gpus} GPUs free"
    )


if __name__ == "__main__":
    main()
