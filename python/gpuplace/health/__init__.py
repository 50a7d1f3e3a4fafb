"""Health from the evidence operators already have: the readers of each tool's output
(:mod:`gpuplace.health.readers`), the rule table that judges it (``rules.yaml``,
``docs/health-rules.md``) and :func:`ingest`, which applies the verdicts to a state all at once
or not at all (and proposes or applies the affected jobs' repairs)."""

from gpuplace.health.judge import (
    Change,
    Finding,
    IngestReport,
    Source,
    evaluate,
    ingest,
    load_rules,
    parse_source,
    read_sources,
    revert,
)

__all__ = [
    "Change",
    "Finding",
    "IngestReport",
    "Source",
    "evaluate",
    "ingest",
    "load_rules",
    "parse_source",
    "read_sources",
    "revert",
]
