"""Cluster options as ``KEY=VALUE`` pairs: what the command line's ``-p`` sets on a preset or a
topology file without writing a file.

A key is either a preset's parameter (``nodes``, ``racks``, ``oversubscription``: see
``gpuplace presets``) or a dotted path into the topology format (``docs/topology-format.md``):

==================================  =========================================================
``name``, ``power_phases``           the top-level fields
``levels.LEVEL.FIELD``               ``bandwidth_gbps``, ``latency_us``, ``oversubscription``,
                                     ``sharp``, ``routing``, ``qps_per_connection``,
                                     ``transport`` or ``rail_aligned`` of the level named LEVEL
``node_types.TYPE.FIELD``            ``gpu_model``, ``peak_tflops``, ``nvls_gbps``, ``power_w``,
                                     ``p2p`` or ``gpudirect_rdma``
``uplink_gbps.DOMAIN``               one switch's uplink capacity (GB/s), ``su003`` or
                                     ``leaf:su003``
``algorithm_efficiency.ALGORITHM``   ``ring``, ``tree``, ``nvls`` or ``collnet``
``stores.STORE.FIELD``               ``attach``, ``read_gbps``, ``write_gbps`` (a new store
                                     needs all three)
``power_domains.NAME.FIELD``         ``budget_w``, ``max_synchronized`` or ``kind`` of an
                                     existing power domain
``power.LEVEL.FIELD``                one power domain per domain of LEVEL (a host level or
                                     above): ``budget_w`` (required), ``max_synchronized``,
                                     ``kind`` (rack, pdu or row; default rack)
==================================  =========================================================

Values are read as an integer, a number, ``true``/``false`` or else a string. The result is
checked like any topology file, so a bad value is an :class:`~gpuplace.InvalidTopology`
naming the field.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from gpuplace._util.hostlist import HostlistError, compress, expand
from gpuplace.errors import InvalidTopology

__all__ = ["OPTION_KEYS", "apply_options", "is_option", "parse_assignments", "parse_value"]

_LEVEL_FIELDS = (
    "bandwidth_gbps",
    "latency_us",
    "oversubscription",
    "sharp",
    "routing",
    "qps_per_connection",
    "transport",
    "rail_aligned",
)
_TYPE_FIELDS = ("gpu_model", "peak_tflops", "nvls_gbps", "power_w", "p2p", "gpudirect_rdma")
_STORE_FIELDS = ("attach", "read_gbps", "write_gbps")
_POWER_FIELDS = ("budget_w", "max_synchronized", "kind")

#: The key forms, for messages and ``gpuplace presets``.
OPTION_KEYS = (
    "name",
    "power_phases",
    f"levels.LEVEL.{{{','.join(_LEVEL_FIELDS)}}}",
    f"node_types.TYPE.{{{','.join(_TYPE_FIELDS)}}}",
    "uplink_gbps.DOMAIN",
    "algorithm_efficiency.ALGORITHM",
    f"stores.STORE.{{{','.join(_STORE_FIELDS)}}}",
    f"power_domains.NAME.{{{','.join(_POWER_FIELDS)}}}",
    f"power.LEVEL.{{{','.join(_POWER_FIELDS)}}}",
)
_TOP = {"name", "power_phases"}
_ROOTS = {
    "levels",
    "node_types",
    "uplink_gbps",
    "algorithm_efficiency",
    "stores",
    "power_domains",
    "power",
}


def parse_value(text: str) -> Any:
    """``2`` -> 2, ``0.5`` / ``1e3`` -> float, ``true`` / ``false`` -> bool, else the text."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def parse_assignments(items: Iterable[str]) -> dict[str, Any]:
    """``["nodes=8", "power.leaf.budget_w=2e5"]`` -> ``{"nodes": 8, ...}``; a malformed item
    or a key given twice raises InvalidTopology."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise InvalidTopology(f"cluster option {item!r}: expected KEY=VALUE, e.g. nodes=8")
        if key in out:
            raise InvalidTopology(f"cluster option {key!r} is given twice")
        out[key] = parse_value(value.strip())
    return out


def is_option(key: str) -> bool:
    """Whether ``key`` is a topology option (else it may be a preset's parameter)."""
    return key in _TOP or key.split(".", 1)[0] in _ROOTS


def apply_options(document: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a topology document with the options set (see the module docs). Raises
    InvalidTopology naming the option when a key is unknown or names nothing in the
    document."""
    doc = copy.deepcopy(dict(document))
    generated: dict[str, dict[str, Any]] = {}
    for key, value in options.items():
        parts = key.split(".")
        root = parts[0]
        if key in _TOP:
            doc[key] = value
        elif root == "levels" and len(parts) == 3:
            entry = _named(doc.get("levels", []), parts[1], key, "level")
            _field(parts[2], _LEVEL_FIELDS, key)
            entry[parts[2]] = value
        elif root == "node_types" and len(parts) == 3:
            types = doc.get("node_types", {})
            if parts[1] not in types:
                raise _unknown(key, "node type", parts[1], types)
            _field(parts[2], _TYPE_FIELDS, key)
            types[parts[1]][parts[2]] = value
        elif root in ("uplink_gbps", "algorithm_efficiency") and len(parts) >= 2:
            # A domain may be written level:name; the name itself has no dots.
            doc.setdefault(root, {})[".".join(parts[1:])] = value
        elif root == "stores" and len(parts) == 3:
            _field(parts[2], _STORE_FIELDS, key)
            doc.setdefault("stores", {}).setdefault(parts[1], {})[parts[2]] = value
        elif root == "power_domains" and len(parts) == 3:
            domain = _named(doc.get("power_domains", []), parts[1], key, "power domain")
            _field(parts[2], _POWER_FIELDS, key)
            domain[parts[2]] = value
        elif root == "power" and len(parts) == 3:
            _field(parts[2], _POWER_FIELDS, key)
            generated.setdefault(parts[1], {})[parts[2]] = value
        else:
            raise InvalidTopology(
                f"unknown cluster option {key!r}; the options are {', '.join(OPTION_KEYS)} "
                "(and a preset's parameters: see `gpuplace presets`)"
            )
    for level, fields in generated.items():
        if "budget_w" not in fields:
            raise InvalidTopology(
                f"cluster option power.{level}: give power.{level}.budget_w (W per domain)"
            )
        doc["power_domains"] = [*doc.get("power_domains", []), *_per_domain(doc, level, fields)]
    return doc


def _field(name: str, allowed: tuple[str, ...], key: str) -> None:
    if name not in allowed:
        raise InvalidTopology(
            f"cluster option {key!r}: unknown field {name!r}; expected one of {', '.join(allowed)}"
        )


def _unknown(key: str, what: str, name: str, known: Iterable[Any]) -> InvalidTopology:
    names = ", ".join(str(k) for k in known) or "none"
    return InvalidTopology(f"cluster option {key!r}: no {what} {name!r} (there are: {names})")


def _named(entries: Any, name: str, key: str, what: str) -> dict[str, Any]:
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    known = (
        [e.get("name") for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    )
    raise _unknown(key, what, name, known)


def _per_domain(doc: dict[str, Any], level: str, fields: dict[str, Any]) -> list[dict[str, Any]]:
    """One power domain per domain of ``level`` (its hosts, the given budget and limits)."""
    names = [lv.get("name") for lv in doc.get("levels", []) if isinstance(lv, dict)]
    node_level = doc.get("node_level", names[0] if names else None)
    if level not in names:
        raise _unknown(f"power.{level}", "level", level, names)
    if node_level in names and names.index(level) < names.index(node_level):
        raise InvalidTopology(
            f"cluster option power.{level}: power domains hold whole hosts; name the host "
            f"level ({node_level}) or one above it"
        )
    members: dict[str, list[str]] = {}
    for i, entry in enumerate(doc.get("nodes", [])):
        try:
            hosts = expand(str(entry["name"]))
        except (HostlistError, KeyError, TypeError) as exc:
            raise InvalidTopology(f"nodes[{i}].name: {exc}") from None
        for host in hosts:
            domain = host if level == node_level else (entry.get("domains") or {}).get(level)
            if domain is None:
                raise InvalidTopology(f"nodes[{i}].domains: no {level} domain for {host}")
            members.setdefault(str(domain), []).append(host)
    return [
        {
            "name": domain,
            "kind": fields.get("kind", "rack"),
            "hosts": compress(hosts),
            "budget_w": fields["budget_w"],
            **(
                {"max_synchronized": fields["max_synchronized"]}
                if "max_synchronized" in fields
                else {}
            ),
        }
        for domain, hosts in members.items()
    ]
