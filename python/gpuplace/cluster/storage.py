"""Storage traffic priced in a live cluster: the seconds per step a job spends reading its
dataset and writing its checkpoints over its paths to their stores, among the running jobs'
load (``rust/core/src/storage.rs``), and the views of the state next to the data. The stores
and a job's data are declared in :mod:`gpuplace.model.storage`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core
from gpuplace.model.storage import DataAccess, store_attachment, store_of, transfers

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job

__all__ = ["io_seconds", "near_data_views"]


def io_seconds(state: ClusterState, job: Job, gpus: Any) -> float:
    """Seconds per step ``job`` on ``gpus`` spends on its dataset reads and checkpoint writes."""
    topology = state.topology
    gpus = np.asarray(gpus, dtype=np.int64)
    total = 0.0
    for name, read, write in transfers(job):
        store = store_of(topology, name)
        level, domain = store_attachment(topology, store)
        total += _core.io_seconds(
            state._core, gpus, level, domain, store.read_gbps, store.write_gbps, read, write
        )
    return total


def near_data_views(state: ClusterState, job: Job) -> list[ClusterState]:
    """Copies of ``state`` with only the GPUs under the job's dataset's (then checkpoint's)
    domain free: the placements a solver should also try. None for local or remote stores."""
    access: DataAccess | None = getattr(job, "data", None)
    if access is None:
        return []
    topology = state.topology
    views = []
    for name in (access.store, access.checkpoint_store):
        if name is None:
            continue
        level, domain = store_attachment(topology, store_of(topology, name))
        if level < 0 or level == len(topology.levels) - 1:
            continue
        outside = np.flatnonzero((topology.path[:, level] != domain) & state.free_mask())
        view = state.copy()
        if len(outside):
            view.drain(gpu=[int(g) for g in outside], reason="far from the data")
        views.append(view)
    return views
