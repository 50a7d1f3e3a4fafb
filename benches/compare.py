"""The solver comparison benchmark, as ``gpuplace bench`` runs it.

    python benches/compare.py --quick                  # a small slice
    python benches/compare.py --out benches/results    # the full suite, CSV + JSON
    python benches/compare.py --solvers greedy,slurm-tree,kueue-bestfit --seed 1

The suite and the metrics are in ``gpuplace.sim.compare``; this script only calls the CLI
command, so the two can never drift apart. Timing is measured, never asserted.
"""

from __future__ import annotations

import sys

from gpuplace.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
