"""The pricing view of a cluster state: what every solver prices on.

The Rust core derives it from the state (``rust/core/src/pricing.rs``) with the same side
factors its cost model applies, so a solver written in Python reads which GPUs it may use and
how fast each path is here, and never restates a health rule:

* ``usable``: per GPU, a normal placement may take it (unallocated, not a reserved spare,
  nothing on its path failed or drained);
* ``degraded``: per GPU, some degraded component (the GPU, its host, its NIC, a switch above
  it) slows a path leaving it; a placement on GPUs none of which is degraded is priced at the
  healthy level bandwidths;
* ``side_factors``: per GPU and level, the smallest bandwidth factor on its half of a path
  whose lowest common level is that level (``num_gpus x levels``; all 1 when healthy);
* :meth:`PricingView.bandwidth_matrix`: the bandwidth (GB/s) of every path among some GPUs,
  degradation and host bandwidth matrices included: what the cost model divides by.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState

__all__ = ["PricingView", "collective_terms", "pricing_view"]


@dataclass(frozen=True, eq=False)
class PricingView:
    """One state's usable GPUs and path prices (see the module docstring)."""

    usable: np.ndarray
    degraded: np.ndarray
    side_factors: np.ndarray
    _state: Any = field(repr=False)

    def bandwidth_matrix(self, gpus: Any) -> np.ndarray:
        """Bandwidth (GB/s) between every two of ``gpus`` (``k x k``; infinite diagonal)."""
        return _core.pair_bandwidth_matrix(self._state, np.asarray(gpus, dtype=np.int64))

    def any_degraded(self, gpus: Any) -> bool:
        """Some of ``gpus`` has a degraded component on its paths."""
        return bool(self.degraded[np.asarray(gpus, dtype=np.int64)].any())


def pricing_view(state: ClusterState) -> PricingView:
    """The pricing view of ``state``: take it, price with it, drop it (its masks are taken
    now; :meth:`PricingView.bandwidth_matrix` reads the state when called)."""
    usable, degraded, factors = _core.pricing_view(state._core)
    return PricingView(usable, degraded, factors, state._core)


def collective_terms(kind: str, n: int, size_bytes: float) -> tuple[float, float]:
    """(latency steps, bytes each rank sends) of one call of a collective of ``kind`` over
    ``n`` ranks moving ``size_bytes`` per rank. A point-to-point call, or an all-to-all inside one
    NVLink domain, costs ``steps * latency(span) + bytes / bandwidth(slowest pair)``, as in the
    core's cost model (an all-to-all across domains is priced there per domain: its fabric bytes
    over its NIC shares plus its NVLink rounds, ``nccl::alltoall_bytes_seconds``);
    ring collectives are priced there in NCCL's ring order, with NIC shares on fabric hops and,
    for all-reduce, the fastest of NCCL's algorithms (``rust/core/src/nccl.rs``)."""
    return _core.collective_terms(_core.CollectiveKind.from_label(kind), int(n), float(size_bytes))
