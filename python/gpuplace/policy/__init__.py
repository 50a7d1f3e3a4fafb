"""Who may use what: a job's pool (and the pools lending to it), its priority class and its
hardware rules, turned into the GPUs it may use (:mod:`gpuplace.policy.fence`). The policy is
declared in :mod:`gpuplace.model.policy`."""

from gpuplace.model.policy import (
    AttributeRule,
    AttributeTable,
    ClusterPolicy,
    Comparison,
    JobPolicy,
    Pool,
    PriorityClass,
    Rule,
    attribute_table,
)
from gpuplace.policy.fence import (
    Restriction,
    allowed_gpus,
    can_borrow,
    has_rules,
    job_class,
    pool_masks,
    restrictions,
)

__all__ = [
    "AttributeRule",
    "AttributeTable",
    "ClusterPolicy",
    "Comparison",
    "JobPolicy",
    "Pool",
    "PriorityClass",
    "Restriction",
    "Rule",
    "allowed_gpus",
    "attribute_table",
    "can_borrow",
    "has_rules",
    "job_class",
    "pool_masks",
    "restrictions",
]
