"""Realistic cluster occupancy: jobs drawn from a real trace, placed and released until the
free GPUs are fragmented the way a busy cluster's are.

Benchmarks of every solver start from states made here, so they compare placements on the
same, reproducible (seeded) clusters.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources

import numpy as np

from gpuplace.cluster.state import ClusterState
from gpuplace.errors import Infeasible, InvalidState
from gpuplace.model.job import Job, TransformerModel
from gpuplace.placement.place import place

__all__ = ["JobSizeMix", "fragment", "philly_running_mix", "training_job"]


@dataclass(frozen=True)
class JobSizeMix:
    """GPU counts and the probability of each among the jobs running at one moment."""

    sizes: np.ndarray
    probabilities: np.ndarray

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return rng.choice(self.sizes, size=count, p=self.probabilities)

    def capped(self, max_gpus: int) -> JobSizeMix:
        """The same mix without the jobs larger than ``max_gpus``."""
        keep = self.sizes <= max(1, max_gpus)
        weight = self.probabilities[keep]
        return JobSizeMix(self.sizes[keep], weight / weight.sum())


def philly_running_mix() -> JobSizeMix:
    """Sizes of the jobs running at one moment in Microsoft's Philly cluster (ATC'19 trace):
    by Little's law, proportional to the summed duration of the jobs of each size."""
    text = resources.files("gpuplace.sim").joinpath("data/philly_job_sizes.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    sizes = np.array([int(r["num_gpus"]) for r in rows], dtype=np.int64)
    weight = np.array([float(r["total_duration_s"]) for r in rows])
    return JobSizeMix(sizes, weight / weight.sum())


#: A Llama-2-13B-like transformer (40 layers, hidden 5120, 4k context, 8 micro-batches per
#: step): gives benchmark jobs realistic bytes per collective.
DEFAULT_MODEL = TransformerModel(
    parameters=13e9,
    layers=40,
    hidden_size=5120,
    sequence_length=4096,
    micro_batch_size=1,
    micro_batches=8,
)


#: A mixture-of-experts transformer: Mixtral 8x7B (Jiang et al. 2024: 46.7B parameters, 12.9B
#: active per token, 32 layers, model dimension 4096, 8 experts in every layer, top-2 routing).
#: The workload model ``mixtral-8x7b`` is this one.
MOE_MODEL = TransformerModel(
    parameters=46.7e9,
    layers=32,
    hidden_size=4096,
    sequence_length=4096,
    micro_batch_size=1,
    micro_batches=8,
    moe_top_k=2,
    active_parameters=12.9e9,
    experts=8,
)


def training_job(
    name: str, gpus: int, *, pp: int = 1, model: TransformerModel | None = DEFAULT_MODEL
) -> Job:
    """A data/tensor/pipeline-parallel training job of ``gpus`` GPUs: tp up to 8 (a divisor of
    the size), then pipeline stages, then data parallel replicas."""
    tp = next(t for t in (8, 4, 2, 1) if gpus % t == 0)
    rest = gpus // tp
    if rest % pp:
        pp = 1
    return Job(name=name, tp=tp, pp=pp, dp=rest // pp, model=model)


def fragment(
    state: ClusterState,
    occupancy: float,
    *,
    seed: int = 0,
    mix: JobSizeMix | None = None,
    rounds: int = 3,
    solver: str = "greedy",
    high_water: float | None = None,
) -> int:
    """Bring ``state`` to ``occupancy`` (fraction of GPUs allocated) the way a busy cluster
    gets there: fill it above the target with jobs drawn from ``mix``, release random jobs
    down to the target, and repeat ``rounds`` times. Jobs end at random, so the free GPUs are
    left scattered across nodes and leaves whatever solver placed them. Returns the number of
    jobs allocated. ``high_water`` is the fill level before each release (default: 60 % of the
    way from ``occupancy`` to full). Deterministic for a seed."""
    if not 0.0 <= occupancy < 1.0:
        raise InvalidState(f"occupancy: expected a fraction in [0, 1), got {occupancy!r}")
    mix = mix or philly_running_mix()
    rng = np.random.default_rng(seed)
    total = state.topology.num_gpus
    target = int(occupancy * total)
    if high_water is None:
        high_water = occupancy + 0.6 * (1.0 - occupancy)
    if not occupancy <= high_water < 1.0:
        raise InvalidState(
            f"high_water: expected a fraction in [occupancy {occupancy!r}, 1), got {high_water!r}"
        )
    high_water_gpus = int(high_water * total)
    counter = 0
    sizes: dict[str, int] = {name: len(g) for name, g in state.jobs.items()}

    def fill(limit: int) -> None:
        nonlocal counter
        misses = 0
        allocated = sum(sizes.values())
        while allocated < limit and misses < 50:
            size = max(1, min(int(mix.sample(rng, 1)[0]), limit - allocated))
            counter += 1
            job = training_job(f"bg{seed}-{counter}", size, model=None)
            try:
                p = place(state, job, solver, seed=counter)
            except Infeasible:
                misses += 1
                continue
            state.allocate(p)
            sizes[job.name] = size
            allocated += size

    def drain(limit: int) -> None:
        allocated = sum(sizes.values())
        names = list(sizes)
        order = rng.permutation(len(names))
        for i in order:
            if allocated <= limit:
                break
            state.release(names[i])
            allocated -= sizes.pop(names[i])

    if occupancy == 0.0:
        return 0
    for _ in range(max(1, rounds)):
        fill(high_water_gpus)
        drain(target)
    return len(state.jobs)
