"""The policy a cluster and a job declare: hardware attributes, job rules over them, pools and
priority classes (what :mod:`gpuplace.policy.fence` enforces).

A cluster's policy (:class:`ClusterPolicy`) comes from its topology file and from its state
file (the state's entries win by name); both use the same three sections, documented in
``docs/policy.md``:

- ``attributes``: hardware attributes (``model``, ``stepping``, ``driver``, ``firmware`` and
  free ``labels``) of hosts and GPUs, selected by hostlist, node type or domain;
- ``pools``: named sets of domains at any level (``training: "su[01-12]"``), disjoint, each
  optionally lending its free GPUs to the preemptible jobs of other pools;
- ``priority_classes``: a priority and whether jobs of the class may be preempted.

A job's rules (:class:`JobPolicy`: its pool, its class, ``require`` and ``avoid`` over
attributes) restrict which GPUs it may use; :mod:`gpuplace.policy.fence` turns them into the
mask that is fenced off in the state before any solver or the repair runs.
"""

from __future__ import annotations

import fnmatch
import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace._util.documents import Checker
from gpuplace._util.hostlist import HostlistError, expand
from gpuplace.errors import InvalidJob

if TYPE_CHECKING:
    from gpuplace.model.topology import Topology

__all__ = [
    "ATTRIBUTES",
    "DEFAULT_CLASS",
    "AttributeRule",
    "AttributeTable",
    "ClusterPolicy",
    "Comparison",
    "JobPolicy",
    "Pool",
    "PriorityClass",
    "Rule",
    "attribute_table",
    "pool_mask",
    "version_key",
]

#: Attributes every host and GPU may carry; ``labels.<key>`` names a free label.
ATTRIBUTES = ("model", "stepping", "driver", "firmware")
_OPS = ("==", "!=", ">=", "<=", ">", "<", "=")
_TOKEN = re.compile(r"(\d+)|([^\d.\-_]+)")


def version_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key comparing version strings part by part, numbers numerically
    (``96.00.99`` > ``96.00.9``; ``550.54.15`` > ``550``); letters compare as text and sort
    before numbers (``A1`` < ``A2`` < ``1``)."""
    out: list[tuple[int, int | str]] = []
    for number, word in _TOKEN.findall(text.strip().lower()):
        out.append((1, int(number)) if number else (0, word))
    return tuple(out)


@dataclass(frozen=True)
class Comparison:
    """One comparison of an attribute value: ``>=550``, ``<96.00.99``, ``!=A0``, ``H100*``.

    Without an operator the value is a glob pattern (``*`` and ``?``) matched exactly."""

    op: str
    value: str

    @classmethod
    def parse(cls, text: str) -> Comparison:
        text = text.strip()
        for op in _OPS:
            if text.startswith(op):
                value = text[len(op) :].strip()
                if not value:
                    raise InvalidJob(f"{text!r}: nothing after {op!r}")
                return cls("==" if op == "=" else op, value)
        if not text:
            raise InvalidJob("an empty condition")
        return cls("glob", text)

    def holds(self, actual: str) -> bool:
        if self.op == "glob":
            return fnmatch.fnmatchcase(actual.lower(), self.value.lower())
        a, b = version_key(actual), version_key(self.value)
        return {
            "==": a == b,
            "!=": a != b,
            ">=": a >= b,
            "<=": a <= b,
            ">": a > b,
            "<": a < b,
        }[self.op]

    def __str__(self) -> str:
        return self.value if self.op == "glob" else f"{self.op}{self.value}"


@dataclass(frozen=True)
class Rule:
    """A job's rule over hardware attributes.

    ``require``: every GPU the job gets satisfies every condition (an attribute a GPU lacks
    fails it). ``avoid``: the job gets no GPU that matches all of the rule's conditions.
    Comparisons on one attribute are separated by commas and must all hold
    (``driver: ">=550,<560"``)."""

    kind: str
    conditions: tuple[tuple[str, tuple[Comparison, ...]], ...]

    def __str__(self) -> str:
        body = ", ".join(
            f"{attr} {','.join(str(c) for c in conds)}" for attr, conds in self.conditions
        )
        return f"{self.kind} {body}"

    def to_dict(self) -> dict[str, str]:
        return {attr: ",".join(str(c) for c in conds) for attr, conds in self.conditions}


@dataclass(frozen=True)
class JobPolicy:
    """What a job may use: its ``pool``, its ``priority_class`` and hardware rules."""

    pool: str | None = None
    priority_class: str | None = None
    require: tuple[Rule, ...] = ()
    avoid: tuple[Rule, ...] = ()

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self.require + self.avoid

    @classmethod
    def from_dict(cls, raw: Any, c: Checker, path: str = "policy") -> JobPolicy:
        """Parse the ``policy`` section of a job file, naming the field on error."""
        doc = c.mapping(raw, path)
        c.keys(doc, path, {"pool", "priority_class", "require", "avoid"})
        pool = c.string(doc["pool"], f"{path}.pool") if "pool" in doc else None
        klass = (
            c.string(doc["priority_class"], f"{path}.priority_class")
            if "priority_class" in doc
            else None
        )
        require: list[Rule] = []
        if "require" in doc:
            for attr, cond in _rule_body(c, doc["require"], f"{path}.require"):
                require.append(Rule("require", ((attr, cond),)))
        avoid: list[Rule] = []
        if "avoid" in doc:
            raw_avoid = doc["avoid"]
            entries = raw_avoid if isinstance(raw_avoid, list | tuple) else [raw_avoid]
            for i, entry in enumerate(entries):
                p = (
                    f"{path}.avoid"
                    if not isinstance(raw_avoid, list | tuple)
                    else f"{path}.avoid[{i}]"
                )
                avoid.append(Rule("avoid", tuple(_rule_body(c, entry, p))))
        return cls(pool, klass, tuple(require), tuple(avoid))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.pool is not None:
            out["pool"] = self.pool
        if self.priority_class is not None:
            out["priority_class"] = self.priority_class
        if self.require:
            merged: dict[str, str] = {}
            for rule in self.require:
                merged.update(rule.to_dict())
            out["require"] = merged
        if self.avoid:
            out["avoid"] = [rule.to_dict() for rule in self.avoid]
        return out


def _rule_body(c: Checker, raw: Any, path: str) -> list[tuple[str, tuple[Comparison, ...]]]:
    body = c.mapping(raw, path)
    if not body:
        raise c.fail(path, "expected at least one attribute condition")
    out = []
    for attr, value in body.items():
        p = f"{path}.{attr}"
        if attr not in ATTRIBUTES and not attr.startswith("labels."):
            raise c.fail(
                p, f"unknown attribute; expected one of {', '.join(ATTRIBUTES)} or labels.<key>"
            )
        text = _scalar(c, value, p)
        try:
            conds = tuple(Comparison.parse(part) for part in text.split(","))
        except InvalidJob as exc:
            raise c.fail(p, f"expected conditions like '>=550' or '<96.00.99': {exc}") from None
        out.append((attr, conds))
    return out


def _scalar(c: Checker, value: Any, path: str) -> str:
    """An attribute value: YAML reads ``driver: 550`` as a number; keep it as text."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise c.fail(path, f"expected a string, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise c.fail(path, "expected a non-empty string")
    return text


# --------------------------------------------------------------------- cluster policy
@dataclass(frozen=True)
class Pool:
    """A named set of domains (any level) whose GPUs only the pool's jobs use.

    ``lend_to`` names the pools whose *preemptible* jobs may borrow this pool's free GPUs
    (``*``: every pool)."""

    name: str
    domains: tuple[str, ...]
    lend_to: tuple[str, ...] = ()

    def lends_to(self, pool: str | None) -> bool:
        return "*" in self.lend_to or (pool is not None and pool in self.lend_to)

    def to_dict(self) -> Any:
        doc: dict[str, Any] = {"domains": list(self.domains)}
        if self.lend_to:
            doc["lend_to"] = list(self.lend_to)
        return doc


@dataclass(frozen=True)
class PriorityClass:
    """A priority (higher wins) and whether jobs of the class may be preempted."""

    name: str
    priority: int
    preemptible: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"priority": self.priority, "preemptible": self.preemptible}


#: The class of a job that names none: never preempted, lowest priority.
DEFAULT_CLASS = PriorityClass("default", 0, False)


@dataclass(frozen=True)
class AttributeRule:
    """One ``attributes`` entry: which hardware (all by default) gets which values."""

    hosts: str | None = None
    node_type: str | None = None
    domain: str | None = None
    gpus: tuple[int, ...] | None = None
    values: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.hosts is not None:
            out["hosts"] = self.hosts
        if self.node_type is not None:
            out["type"] = self.node_type
        if self.domain is not None:
            out["domain"] = self.domain
        if self.gpus is not None:
            out["gpus"] = list(self.gpus)
        labels = {k[len("labels.") :]: v for k, v in self.values.items() if k.startswith("labels.")}
        out.update({k: v for k, v in self.values.items() if not k.startswith("labels.")})
        if labels:
            out["labels"] = labels
        return out


@dataclass(frozen=True)
class ClusterPolicy:
    """Pools, priority classes and hardware attributes of a cluster."""

    pools: Mapping[str, Pool] = field(default_factory=dict)
    classes: Mapping[str, PriorityClass] = field(default_factory=dict)
    attributes: tuple[AttributeRule, ...] = ()

    SECTIONS = ("attributes", "pools", "priority_classes")

    def __bool__(self) -> bool:
        return bool(self.pools or self.classes or self.attributes)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], c: Checker, prefix: str = "") -> ClusterPolicy:
        """Parse the policy sections found in ``doc`` (a topology or state document, or the
        ``policy`` section of a state file); other keys are ignored."""
        pools: dict[str, Pool] = {}
        if "pools" in doc:
            p = f"{prefix}pools"
            for name, raw in c.mapping(doc["pools"], p).items():
                q = f"{p}.{name}"
                if isinstance(raw, str | list | tuple):
                    raw = {"domains": raw}
                entry = c.mapping(raw, q)
                c.keys(entry, q, {"domains", "lend_to"})
                domains = _names(c, entry.get("domains"), f"{q}.domains")
                lend = _names(c, entry.get("lend_to", []), f"{q}.lend_to", allow_empty=True)
                pools[name] = Pool(name, domains, lend)
            for pool in pools.values():
                for other in pool.lend_to:
                    if other != "*" and other not in pools:
                        raise c.fail(
                            f"{p}.{pool.name}.lend_to",
                            f"unknown pool {other!r} (pools: {', '.join(pools)})",
                        )
        classes: dict[str, PriorityClass] = {}
        if "priority_classes" in doc:
            p = f"{prefix}priority_classes"
            for name, raw in c.mapping(doc["priority_classes"], p).items():
                q = f"{p}.{name}"
                entry = c.mapping(raw, q)
                c.keys(entry, q, {"priority", "preemptible"})
                preemptible = entry.get("preemptible", False)
                if not isinstance(preemptible, bool):
                    raise c.fail(f"{q}.preemptible", "expected true or false")
                classes[name] = PriorityClass(
                    name, c.integer(entry.get("priority"), f"{q}.priority"), preemptible
                )
        rules: list[AttributeRule] = []
        if "attributes" in doc:
            p = f"{prefix}attributes"
            for i, raw in enumerate(c.sequence(doc["attributes"], p)):
                q = f"{p}[{i}]"
                entry = c.mapping(raw, q)
                c.keys(entry, q, {"hosts", "type", "domain", "gpus", "labels", *ATTRIBUTES})
                values = {a: _scalar(c, entry[a], f"{q}.{a}") for a in ATTRIBUTES if a in entry}
                for key, value in c.mapping(entry.get("labels", {}), f"{q}.labels").items():
                    values[f"labels.{key}"] = _scalar(c, value, f"{q}.labels.{key}")
                if not values:
                    raise c.fail(q, "expected at least one attribute or label")
                gpus = None
                if "gpus" in entry:
                    gpus = tuple(
                        c.integer(g, f"{q}.gpus[{k}]", minimum=0)
                        for k, g in enumerate(c.sequence(entry["gpus"], f"{q}.gpus"))
                    )
                rules.append(
                    AttributeRule(
                        hosts=c.string(entry["hosts"], f"{q}.hosts") if "hosts" in entry else None,
                        node_type=c.string(entry["type"], f"{q}.type") if "type" in entry else None,
                        domain=c.string(entry["domain"], f"{q}.domain")
                        if "domain" in entry
                        else None,
                        gpus=gpus,
                        values=values,
                    )
                )
        return cls(pools, classes, tuple(rules))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.attributes:
            out["attributes"] = [r.to_dict() for r in self.attributes]
        if self.pools:
            out["pools"] = {n: p.to_dict() for n, p in self.pools.items()}
        if self.classes:
            out["priority_classes"] = {n: k.to_dict() for n, k in self.classes.items()}
        return out

    def merged(self, other: ClusterPolicy) -> ClusterPolicy:
        """This policy with ``other``'s pools and classes added (``other`` wins by name) and
        its attribute entries applied after this one's."""
        if not other:
            return self
        if not self:
            return other
        return ClusterPolicy(
            {**self.pools, **other.pools},
            {**self.classes, **other.classes},
            self.attributes + other.attributes,
        )

    def check(self, topology: Topology, c: Checker, prefix: str = "") -> None:
        """Resolve every name against the topology (raising through ``c``): pools must name
        existing domains and be disjoint; attribute selectors must match hardware."""
        owner: dict[tuple[int, int], str] = {}
        masks = {}
        for name, pool in self.pools.items():
            masks[name] = pool_mask(topology, pool, c, f"{prefix}pools.{name}.domains")
            for lvl, dom in _pool_domains(topology, pool, c, f"{prefix}pools.{name}.domains"):
                owner.setdefault((lvl, dom), name)
        names = list(masks)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                both = masks[a] & masks[b]
                if both.any():
                    gpu = int(np.flatnonzero(both)[0])
                    raise c.fail(
                        f"{prefix}pools.{b}",
                        f"overlaps pool {a!r} (both hold {topology.host_of(gpu)}); pools must be "
                        "disjoint",
                    )
        for i, rule in enumerate(self.attributes):
            _selection(topology, rule, c, f"{prefix}attributes[{i}]")


def _names(c: Checker, raw: Any, path: str, *, allow_empty: bool = False) -> tuple[str, ...]:
    """A hostlist-style expression (``su[01-12]``), or a list of them, expanded."""
    items = raw if isinstance(raw, list | tuple) else [raw]
    out: list[str] = []
    for i, item in enumerate(items):
        text = c.string(item, f"{path}[{i}]" if isinstance(raw, list | tuple) else path)
        if text == "*":
            out.append(text)
            continue
        try:
            out.extend(expand(text))
        except HostlistError as exc:
            raise c.fail(path, str(exc)) from None
    if not out and not allow_empty:
        raise c.fail(path, "expected at least one name")
    return tuple(out)


def _find_domain(topology: Topology, name: str) -> list[tuple[int, int]]:
    """(level, domain) of a domain named ``name`` or ``level:name`` at the host level or
    above."""
    wanted, _, short = name.rpartition(":") if ":" in name else ("", "", name)
    hits = []
    for lvl in range(topology.node_level, len(topology.levels)):
        if wanted and topology.levels[lvl].name != wanted:
            continue
        index = _domain_index(topology, lvl).get(short)
        if index is not None:
            hits.append((lvl, index))
    return hits


_DOMAIN_INDEX: weakref.WeakKeyDictionary[Topology, dict[int, dict[str, int]]] = (
    weakref.WeakKeyDictionary()
)


def _domain_index(topology: Topology, level: int) -> dict[str, int]:
    per = _DOMAIN_INDEX.setdefault(topology, {})
    if level not in per:
        per[level] = {n: i for i, n in enumerate(topology.domain_names[level])}
    return per[level]


def _pool_domains(topology: Topology, pool: Pool, c: Checker, path: str) -> list[tuple[int, int]]:
    out = []
    for name in pool.domains:
        hits = _find_domain(topology, name)
        if not hits:
            levels = ", ".join(lv.name for lv in topology.levels[topology.node_level :])
            raise c.fail(path, f"unknown domain {name!r} (domains of the levels {levels})")
        if len(hits) > 1:
            raise c.fail(path, f"{name!r} names domains at several levels; write level:name")
        out.append(hits[0])
    return out


def pool_mask(topology: Topology, pool: Pool, c: Checker, path: str) -> np.ndarray:
    mask = np.zeros(topology.num_gpus, dtype=bool)
    domain_path = topology.path
    for lvl, dom in _pool_domains(topology, pool, c, path):
        mask |= domain_path[:, lvl] == dom
    return mask


def _selection(topology: Topology, rule: AttributeRule, c: Checker, path: str) -> np.ndarray:
    """The GPUs one ``attributes`` entry applies to."""
    mask = np.ones(topology.num_gpus, dtype=bool)
    host_of_gpu = topology.host_of_gpu
    if rule.hosts is not None:
        try:
            names = expand(rule.hosts)
        except HostlistError as exc:
            raise c.fail(f"{path}.hosts", str(exc)) from None
        index = topology._host_index
        missing = [h for h in names if h not in index]
        if missing:
            raise c.fail(f"{path}.hosts", f"unknown host {missing[0]!r}")
        hosts = np.zeros(len(topology.hosts), dtype=bool)
        hosts[[index[h] for h in names]] = True
        mask &= hosts[host_of_gpu]
    if rule.node_type is not None:
        if rule.node_type not in topology.node_types:
            raise c.fail(
                f"{path}.type",
                f"unknown node type {rule.node_type!r} ({', '.join(topology.node_types)})",
            )
        types = np.array([t == rule.node_type for t in topology.host_types], dtype=bool)
        mask &= types[host_of_gpu]
    if rule.domain is not None:
        mask &= pool_mask(topology, Pool("", (rule.domain,)), c, f"{path}.domain")
    if rule.gpus is not None:
        mask &= np.isin(topology._gpu_local, rule.gpus)
    return mask


# --------------------------------------------------------------------- attributes per GPU
class AttributeTable:
    """Per GPU, the code of its value of every attribute (-1: none), and the values."""

    def __init__(self, topology: Topology, policy: ClusterPolicy):
        n = self.num_gpus = topology.num_gpus
        self.values: dict[str, list[str]] = {}
        self.codes: dict[str, np.ndarray] = {}
        models = [topology.node_types[t].gpu_model for t in topology.host_types]
        if any(models):
            per_host = np.array([self._code("model", m) if m else -1 for m in models])
            self.codes["model"] = per_host[topology.host_of_gpu]
        c = Checker(InvalidJob, None)
        for i, rule in enumerate(policy.attributes):
            where = _selection(topology, rule, c, f"attributes[{i}]")
            for key, value in rule.values.items():
                column = self.codes.setdefault(key, np.full(n, -1, dtype=np.int64))
                column[where] = self._code(key, value)

    def _code(self, key: str, value: str) -> int:
        values = self.values.setdefault(key, [])
        if value not in values:
            values.append(value)
        return values.index(value)

    def column(self, key: str) -> list[str | None]:
        """The value of ``key`` per GPU (None where unset)."""
        codes = self.codes.get(key)
        if codes is None:
            return []
        return [None if k < 0 else self.values[key][k] for k in codes]

    def matches(self, attr: str, conditions: tuple[Comparison, ...]) -> np.ndarray:
        """GPUs whose ``attr`` satisfies every condition (GPUs without it do not)."""
        codes = self.codes.get(attr)
        if codes is None:
            return np.zeros(self.num_gpus, dtype=bool)
        ok = np.array(
            [all(cond.holds(v) for cond in conditions) for v in self.values[attr]] + [False]
        )
        return ok[codes]  # code -1 picks the trailing False

    def rule_mask(self, rule: Rule) -> np.ndarray:
        """GPUs a rule excludes: those failing a ``require``, those matching an ``avoid``."""
        if rule.kind == "require":
            out = np.zeros(self.num_gpus, dtype=bool)
            for attr, conds in rule.conditions:
                out |= ~self.matches(attr, conds)
            return out
        out = np.ones(self.num_gpus, dtype=bool)
        for attr, conds in rule.conditions:
            out &= self.matches(attr, conds)
        return out


_TABLES: weakref.WeakKeyDictionary[Topology, tuple[ClusterPolicy, AttributeTable]] = (
    weakref.WeakKeyDictionary()
)


def attribute_table(topology: Topology, policy: ClusterPolicy) -> AttributeTable:
    """The attribute table of a topology under a policy (cached while the policy is the same)."""
    cached = _TABLES.get(topology)
    if cached is None or cached[0] != policy:
        cached = (policy, AttributeTable(topology, policy))
        _TABLES[topology] = cached
    return cached[1]
