"""What a job may use under the cluster's policy: its pool (and the pools lending to it), its
priority class, its ``require`` and ``avoid`` rules over hardware attributes.

The rules are declared in :mod:`gpuplace.model.policy`; this module turns them, for one job on
one state, into the mask of GPUs the job may use. Every solver and the repair then run on a
state whose other GPUs are fenced off (:meth:`gpuplace.ClusterState.fenced_view`), so they
honour pools and exclusions without knowing about them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace._util.documents import Checker
from gpuplace.errors import InvalidJob, InvalidState
from gpuplace.model.policy import (
    DEFAULT_CLASS,
    ClusterPolicy,
    PriorityClass,
    attribute_table,
    pool_mask,
)

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = [
    "Restriction",
    "allowed_gpus",
    "can_borrow",
    "has_rules",
    "job_class",
    "pool_masks",
    "restrictions",
]


_POOL_MASKS: weakref.WeakKeyDictionary[Topology, tuple[Any, dict[str, np.ndarray]]] = (
    weakref.WeakKeyDictionary()
)


def pool_masks(state: ClusterState) -> dict[str, np.ndarray]:
    """Pool name -> mask of its GPUs, under the state's effective policy (cached per
    topology while the pools are the same; do not modify the masks)."""
    pools = state.effective_policy().pools
    cached = _POOL_MASKS.get(state.topology)
    if cached is None or cached[0] != pools:
        c = Checker(InvalidState, None)
        masks = {
            name: pool_mask(state.topology, pool, c, f"pools.{name}")
            for name, pool in pools.items()
        }
        cached = _POOL_MASKS[state.topology] = (dict(pools), masks)
    return cached[1]


def job_class(policy: ClusterPolicy, job: Job) -> PriorityClass:
    """The priority class of a job (``default`` when it names none); an unknown class is an
    InvalidJob naming it."""
    jp = job.policy
    if jp is None or jp.priority_class is None:
        return DEFAULT_CLASS
    klass = policy.classes.get(jp.priority_class)
    if klass is None:
        known = ", ".join(policy.classes) or "none are defined"
        raise InvalidJob(
            f"policy.priority_class: unknown class {jp.priority_class!r} (classes: {known})"
        )
    return klass


# --------------------------------------------------------------------- what a job may use
@dataclass(frozen=True)
class Restriction:
    """What one rule of a job's policy removes from the GPUs it may use."""

    constraint: str  # "pool" or "exclusion"
    rule: str
    excluded: np.ndarray = field(repr=False)


def restrictions(state: ClusterState, job: Job, *, borrow: bool = False) -> list[Restriction]:
    """The job's restrictions, each with the GPUs it excludes: its pool (with ``borrow``, the
    pools lending to it added), then every ``require`` and ``avoid`` rule."""
    policy = state.effective_policy()
    topology = state.topology
    n = topology.num_gpus
    jp = job.policy
    out: list[Restriction] = []
    if policy.pools or (jp is not None and jp.pool is not None):
        pool_name = jp.pool if jp is not None else None
        masks = pool_masks(state)
        if pool_name is None:
            inside = np.zeros(n, dtype=bool)
            for m in masks.values():
                inside |= m
            out.append(Restriction("pool", "no pool: only GPUs outside every pool", inside))
        else:
            if pool_name not in policy.pools:
                known = ", ".join(policy.pools) or "none are defined"
                raise InvalidJob(f"policy.pool: unknown pool {pool_name!r} (pools: {known})")
            usable = masks[pool_name].copy()
            lenders = []
            if borrow:
                for name, pool in policy.pools.items():
                    if name != pool_name and pool.lends_to(pool_name):
                        usable |= masks[name]
                        lenders.append(name)
            text = f"pool {pool_name}" + (
                f" (borrowing from {', '.join(lenders)})" if lenders else ""
            )
            out.append(Restriction("pool", text, ~usable))
    if jp is not None and jp.rules:
        table = attribute_table(topology, policy)
        for rule in jp.rules:
            out.append(Restriction("exclusion", str(rule), table.rule_mask(rule)))
    return out


def allowed_gpus(state: ClusterState, job: Job, *, borrow: bool = False) -> np.ndarray:
    """Mask of the GPUs the job's policy lets it use (free or not)."""
    allowed = np.ones(state.topology.num_gpus, dtype=bool)
    for r in restrictions(state, job, borrow=borrow):
        allowed &= ~r.excluded
    return allowed


def can_borrow(state: ClusterState, job: Job) -> bool:
    """A job may borrow other pools' GPUs only when its class is preemptible and some pool
    lends to its pool."""
    policy = state.effective_policy()
    jp = job.policy
    if jp is None or jp.pool is None or not job_class(policy, job).preemptible:
        return False
    return any(name != jp.pool and pool.lends_to(jp.pool) for name, pool in policy.pools.items())


def has_rules(state: ClusterState, job: Job) -> bool:
    """Whether anything restricts the job (a pool, hardware rules, pools in the cluster)."""
    jp = job.policy
    if jp is not None and (jp.pool is not None or jp.rules):
        return True
    # The effective policy's pools are the topology's and the state's together: look at both
    # without merging them (this runs once per placement).
    base = getattr(state.topology, "policy", None)
    return bool(
        (base is not None and base.pools) or (state.policy is not None and state.policy.pools)
    )
