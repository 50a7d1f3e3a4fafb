"""Sweeps of simulations (seeds x policies x clusters) on Ray, the optional ``ray`` extra
(``pip install 'gpuplace[ray]'``): one Ray task per run, on a local Ray started for the sweep
(``workers`` CPUs) or on an existing Ray cluster (``address``). Without Ray, :func:`run_all`
runs the same tasks one after another in this process.

A task carries how to *build* its inputs (cluster and workload specs), not the built objects:
topologies and cluster states hold native objects that are rebuilt in the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuplace.errors import InvalidJob
from gpuplace.model.topology import Topology
from gpuplace.sim import metrics
from gpuplace.sim.engine import SimConfig, SimResult, simulate
from gpuplace.sim.traces import Workload

__all__ = ["Task", "run_all", "run_on_ray"]


@dataclass(frozen=True)
class Task:
    """One run: a label, how to build the topology and the workload, and the config."""

    label: str
    build_topology: Callable[[], Topology]
    build_workload: Callable[[], Workload]
    config: SimConfig
    #: The cluster whose empty-cluster step time defines the jobs' work (a what-if's first).
    build_reference: Callable[[], Topology] | None = None


def _run(task: Task) -> tuple[SimResult, dict[str, Any]]:
    topology = task.build_topology()
    reference = None if task.build_reference is None else task.build_reference()
    result = simulate(topology, task.build_workload(), task.config, reference=reference)
    return result, metrics.summary(result)


def run_all(
    tasks: list[Task], progress: Callable[[int], None] | None = None
) -> dict[str, tuple[SimResult, dict[str, Any]]]:
    """Run the tasks here, in order."""
    out = {}
    for i, task in enumerate(tasks):
        out[task.label] = _run(task)
        if progress is not None:
            progress(i + 1)
    return out


def run_on_ray(
    tasks: list[Task],
    *,
    workers: int | None = None,
    address: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, tuple[SimResult, dict[str, Any]]]:
    """Run the tasks as Ray tasks: on a local Ray with ``workers`` CPUs (default: all), or on
    the Ray cluster at ``address``. Results come back in the tasks' order."""
    try:
        import ray
    except ImportError:
        raise InvalidJob("--workers and --address need Ray: pip install 'gpuplace[ray]'") from None
    started = False
    if not ray.is_initialized():
        if address is not None:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1)(_run)
        refs = [remote.remote(task) for task in tasks]
        pending = list(refs)
        done_count = 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            done_count += len(ready)
            if progress is not None:
                progress(done_count)
        results = ray.get(refs)
    finally:
        if started:
            ray.shutdown()
    return {task.label: result for task, result in zip(tasks, results, strict=True)}
