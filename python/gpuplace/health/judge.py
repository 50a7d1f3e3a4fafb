"""Health from the evidence operators already have: kernel-log XIDs, DCGM, nvidia-smi, NVLink
and InfiniBand port state and counters, optics.

:func:`ingest` reads the sources (:mod:`gpuplace.health.readers`), maps every observation to a
component of the state (a GPU ``host:index``, a NIC ``host:mlx5_3``), judges it with the rules
(``health_rules.yaml``, documented in ``docs/health-rules.md``, overridable per site) and
applies all the resulting changes at once or none: a component gets the worst condition its
evidence calls for, a component already worse is left as it is, and every reason the state
keeps names the rule and the evidence (file, line, text)::

    report = gpuplace.health.ingest(state, ["kern.log", "dgx017=ibstatus.txt"])
    report.affected          # jobs hit -> their ranks on the changed hardware
    report.changes           # what changed, with reasons

Sources are paths (or open files) or ``"HOST=PATH"`` / ``"HOST:DEVICE=PATH"`` strings naming
what a source is about when its lines do not (dmesg of one host, ``mlxlink -d mlx5_0``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from gpuplace._util.documents import describe, read_yaml
from gpuplace.cluster.state import loss_factor, nics_of
from gpuplace.enums import ComponentKind, Condition, SparePolicy
from gpuplace.errors import InvalidState
from gpuplace.health.readers import Evidence, ReadResult, normalize_pci, read_evidence
from gpuplace.placement.repair import repair as repair_job

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.topology import Topology
    from gpuplace.placement.repair import Repair

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

#: The words the rules and findings use for conditions and hardware: the labels of the core's
#: Condition and ComponentKind, and "ignore" (evidence that changes nothing).
_OK, _DEGRADED, _FAILED, _DRAINED = (
    c.label for c in (Condition.Ok, Condition.Degraded, Condition.Failed, Condition.Drained)
)
_GPU, _NIC = ComponentKind.Gpu.label, ComponentKind.Nic.label
_CONDITIONS = (_FAILED, _DRAINED, _DEGRADED, "ignore")


# --------------------------------------------------------------------------------- rules
def _default_rules() -> dict[str, Any]:
    text = resources.files("gpuplace.health").joinpath("rules.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def load_rules(site: str | os.PathLike[str] | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The default rules, with a site's overrides (a YAML file or a mapping) merged in: a
    key the site names replaces the default, lists included; a key the defaults do not have
    is an error naming it, so a typo is not silently ignored."""
    rules = _default_rules()
    if site is None:
        return rules
    if isinstance(site, Mapping):
        overrides, where = dict(site), "rules"
    else:
        where = str(site)
        overrides = read_yaml(site, InvalidState)
        if overrides is None:
            return rules
    if not isinstance(overrides, Mapping):
        raise InvalidState(f"{where}: expected a mapping of rule settings")
    _merge(rules, overrides, where, "")
    _check_rules(rules, where)
    return rules


def _merge(base: dict[str, Any], over: Mapping[str, Any], where: str, path: str) -> None:
    for key, value in over.items():
        here = f"{path}.{key}" if path else str(key)
        if key not in base and path not in ("pci_bus_ids", "xid.degraded"):
            known = ", ".join(str(k) for k in base)
            raise InvalidState(f"{where}: {here}: unknown rule setting (known here: {known})")
        if isinstance(base.get(key), dict):
            if not isinstance(value, Mapping):
                raise InvalidState(
                    f"{where}: {here}: expected a mapping of settings, got {describe(value)}"
                )
            _merge(base[key], value, where, here)
        else:
            base[key] = value


def _check_rules(rules: dict[str, Any], where: str) -> None:
    def condition(path: str, value: Any) -> None:
        if value not in _CONDITIONS:
            raise InvalidState(
                f"{where}: {path}: expected one of {', '.join(_CONDITIONS)}, got {describe(value)}"
            )

    def factor(path: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            raise InvalidState(
                f"{where}: {path}: expected a factor in (0, 1], got {describe(value)}"
            )

    factor("soft_factor", rules["soft_factor"])
    for key in (_FAILED, _DRAINED):
        codes = rules["xid"][key]
        if not isinstance(codes, list) or not all(isinstance(c, int) for c in codes):
            raise InvalidState(f"{where}: xid.{key}: expected a list of XID numbers")
    for code, f in rules["xid"]["degraded"].items():
        factor(f"xid.degraded.{code}", f)
    smi = rules["nvidia_smi"]
    for key in (
        "row_remap_pending",
        "row_remap_failure",
        "retired_pages_pending",
        "reset_required",
        "ecc_uncorrectable",
    ):
        condition(f"nvidia_smi.{key}", smi[key])
    condition("nvlink.all_links_down", rules["nvlink"]["all_links_down"])
    condition("infiniband.port_down", rules["infiniband"]["port_down"])
    condition("infiniband.link_downed", rules["infiniband"]["link_downed"])
    for key in ("Failure", "Warning"):
        condition(f"dcgm_health.{key}", rules["dcgm_health"][key])
    for key in ("Fail", "Warn"):
        condition(f"dcgm_diag.{key}", rules["dcgm_diag"][key])
    for path, value in (
        ("nvlink.nominal_gbps_per_link", rules["nvlink"]["nominal_gbps_per_link"]),
        ("infiniband.nominal_gbps", rules["infiniband"]["nominal_gbps"]),
    ):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
        ):
            raise InvalidState(
                f"{where}: {path}: expected a positive number or null, got {describe(value)}"
            )
    for path, value in (
        ("ber.effective_ber_max", rules["ber"]["effective_ber_max"]),
        ("ber.packet_bits", rules["ber"]["packet_bits"]),
        ("module.warning_c", rules["module"]["warning_c"]),
    ):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidState(f"{where}: {path}: expected a number, got {describe(value)}")


# ------------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class Source:
    """A source to ingest: a path (or open file), and what it is about when its lines do not
    say (``host``, ``device``)."""

    path: Any
    host: str | None = None
    device: str | None = None
    format: str | None = None


def parse_source(spec: Any, *, host: str | None = None, format: str | None = None) -> Source:
    """``PATH``, ``HOST=PATH`` or ``HOST:DEVICE=PATH`` (a path that exists as written wins)."""
    if isinstance(spec, Source):
        return spec
    if not isinstance(spec, str) or os.path.exists(spec) or "=" not in spec:
        return Source(spec, host=host, format=format)
    target, _, path = spec.partition("=")
    name, _, device = target.partition(":")
    if not name or not path:
        raise InvalidState(f"{spec!r}: expected PATH, HOST=PATH or HOST:DEVICE=PATH")
    return Source(path, host=name, device=device or None, format=format)


def read_sources(
    sources: Iterable[Any],
    *,
    host: str | None = None,
    format: str | None = None,
    strict: bool = False,
) -> list[ReadResult]:
    """Read every source (paths, ``HOST=PATH`` strings, :class:`Source` or already read
    :class:`ReadResult`)."""
    results = []
    for spec in sources:
        if isinstance(spec, ReadResult):
            results.append(spec)
            continue
        src = parse_source(spec, host=host, format=format)
        results.append(
            read_evidence(
                src.path, format=src.format, host=src.host, device=src.device, strict=strict
            )
        )
    return results


# ------------------------------------------------------------------------------ findings
@dataclass(frozen=True)
class Finding:
    """What one piece of evidence means for one component."""

    kind: str  # gpu | nic
    name: str  # host:index | host:mlx5_3
    condition: str  # failed | drained | degraded
    factor: float
    rule: str
    evidence: Evidence

    @property
    def reason(self) -> str:
        return f"{self.rule}: {self.evidence.where}: {self.evidence.text}"


@dataclass(frozen=True)
class Change:
    kind: str
    name: str
    before: str
    after: str
    factor: float
    reason: str


@dataclass
class IngestReport:
    """The outcome of :func:`ingest`."""

    sources: list[ReadResult]
    findings: list[Finding]
    changes: list[Change]
    #: Evidence that called for a change on hardware the cluster does not have (another
    #: cluster's host, a storage NIC), as messages.
    unmapped: list[str]
    #: Components left as they were because they already were at least as unhealthy.
    unchanged: list[str]
    #: Jobs on the GPUs whose health changed -> their ranks there.
    affected: dict[str, np.ndarray]
    applied: bool
    repairs: list[Repair] = field(default_factory=list)

    @property
    def events(self) -> int:
        return sum(len(r.evidence) for r in self.sources)

    def to_dict(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "sources": [
                {
                    "source": r.source,
                    "format": r.format,
                    "host": r.host,
                    "lines": r.lines,
                    "evidence": len(r.evidence),
                    "unknown_lines": r.unknown,
                    "malformed_lines": r.malformed_total,
                    "malformed": [{"line": n, "why": why} for n, why in r.malformed],
                }
                for r in self.sources
            ],
            "findings": [
                {
                    "kind": f.kind,
                    "name": f.name,
                    "condition": f.condition,
                    "factor": f.factor,
                    "reason": f.reason,
                }
                for f in self.findings
            ],
            "changes": [c.__dict__ for c in self.changes],
            "unmapped": self.unmapped,
            "unchanged": self.unchanged,
            "affected": {k: [int(r) for r in v] for k, v in self.affected.items()},
            "repairs": [r.to_dict() for r in self.repairs],
        }


class _Mapper:
    """Evidence -> component names of one topology."""

    def __init__(
        self, topology: Topology, results: list[ReadResult], rules: dict[str, Any], host: str | None
    ):

        self.topology = topology
        self.nics = nics_of(topology)
        self.default_host = host
        self.bus: dict[str, list[str]] = {}
        for name, ids in (rules.get("pci_bus_ids") or {}).items():
            normal = [normalize_pci(str(b)) for b in ids]
            known = [b for b in normal if b is not None]
            if len(known) != len(normal):
                raise InvalidState(
                    f"rules: pci_bus_ids.{name}: expected PCI addresses like 0000:1b:00"
                )
            self.bus[str(name)] = known
        for r in results:
            for key, ids in r.bus_ids.items():
                owner = key or r.host or self._only_host()
                if owner is not None and ids:
                    self.bus[owner] = ids

    def _only_host(self) -> str | None:
        return self.topology.hosts[0] if len(self.topology.hosts) == 1 else None

    def host(self, ev: Evidence, result: ReadResult) -> str:
        host = ev.host or result.host or self.default_host or self._only_host()
        if host is None:
            raise InvalidState(
                f"{ev.where}: the evidence does not name its host; give HOST={result.source} "
                f"(or --host) for a source about one host"
            )
        return host

    def gpu(self, ev: Evidence, host: str) -> str:
        gpus = self.topology.host_gpus(host)
        if ev.gpu_index is not None:
            index = ev.gpu_index
        else:
            table = self.bus.get(host)
            if table is None:
                htype = self.topology.host_types[self.topology._host_index[host]]
                table = self.bus.get(htype)
            if table is None:
                if len(gpus) == 1:
                    return f"{host}:0"
                raise InvalidState(
                    f"{ev.where}: GPU at PCI {ev.gpu_pci} of {host}: no bus-id table for {host}; "
                    f"ingest its 'nvidia-smi -q' or 'nvidia-smi --query-gpu=index,pci.bus_id "
                    f"--format=csv' output with it ({host}=FILE), or set pci_bus_ids in the rules"
                )
            if ev.gpu_pci not in table:
                raise InvalidState(
                    f"{ev.where}: no GPU of {host} is at PCI {ev.gpu_pci} (its bus ids: "
                    f"{', '.join(table)})"
                )
            index = table.index(ev.gpu_pci)
        if not 0 <= index < len(gpus):
            raise InvalidState(
                f"{ev.where}: GPU {index} of {host} does not exist ({host} has {len(gpus)} GPUs)"
            )
        return f"{host}:{index}"

    def nic(self, ev: Evidence, result: ReadResult, host: str) -> str | None:
        device = ev.nic or result.device
        if device is None:
            raise InvalidState(
                f"{ev.where}: the output does not name its HCA; give HOST:mlx5_N={result.source}"
            )
        name = f"{host}:{device}"
        return name if name in self.nics.index else None


def evaluate(
    topology: Topology,
    results: list[ReadResult],
    rules: dict[str, Any] | None = None,
    *,
    host: str | None = None,
    strict: bool = False,
) -> tuple[list[Finding], list[str]]:
    """Judge the evidence: the findings (component, condition, factor, rule, evidence) and the
    messages about evidence on hardware this topology does not have."""
    rules = rules if rules is not None else load_rules()
    mapper = _Mapper(topology, results, rules, host)
    findings: list[Finding] = []
    unmapped: list[str] = []
    for result in results:
        for ev, kind_of, verdict in _judge(result, rules, topology.nic_transport):
            if verdict is None:
                continue
            condition, factor, rule = verdict
            if kind_of == _NIC and ev.nic is None and result.device is None and "guid" in ev.values:
                # ibdiagnet reports switch ports too; only a host's HCA is in the state.
                unmapped.append(
                    f"{ev.where}: port {ev.port} of GUID {ev.values['guid']} is not a host's "
                    f"HCA ({rule}: {condition})"
                )
                continue
            hostname = mapper.host(ev, result)
            if hostname not in topology._host_index:
                message = (
                    f"{ev.where}: host {hostname!r} is not in cluster {topology.name!r} ({rule})"
                )
                if strict:
                    raise InvalidState(message)
                unmapped.append(message)
                continue
            if kind_of == _GPU:
                name: str | None = mapper.gpu(ev, hostname)
            else:
                name = mapper.nic(ev, result, hostname)
                if name is None:
                    unmapped.append(
                        f"{ev.where}: {hostname}:{ev.nic or result.device} is not a NIC of the "
                        f"topology ({rule}: {condition})"
                    )
                    continue
            assert name is not None
            findings.append(Finding(kind_of, name, condition, factor, rule, ev))
    return findings, unmapped


def _judge(
    result: ReadResult, rules: dict[str, Any], transport: str = "roce"
) -> Iterator[tuple[Evidence, str, tuple[str, float, str] | None]]:
    """(evidence, component kind, (condition, factor, rule) or None) for every evidence; packet
    loss is priced for the NICs' link ``transport`` (``Topology.nic_transport``)."""
    soft = float(rules["soft_factor"])
    # Per-source context the rules compare against (fastest link, fastest port).
    nvlink_nominal = rules["nvlink"]["nominal_gbps_per_link"]
    if nvlink_nominal is None:
        speeds = [
            s
            for e in result.evidence
            if e.kind == "nvlink_speed"
            for s in e.values["links_gbps"].values()
        ]
        nvlink_nominal = max(speeds) if speeds else None
    # Ports compare with their peers: same host, link layer and (when ibstat says) HCA model,
    # so a 100 Gb/s storage NIC next to 400 Gb/s compute rails is not "at a quarter rate".
    port_nominal: dict[tuple[Any, ...], float] = {}
    for e in result.evidence:
        if e.kind == "port_state" and e.values.get("rate_gbps") and _is_up(e):
            key = _peer_key(e)
            port_nominal[key] = max(port_nominal.get(key, 0.0), float(e.values["rate_gbps"]))

    for ev in result.evidence:
        v = ev.values
        k = ev.kind
        if k == "xid":
            code = int(v["xid"])
            xr = rules["xid"]
            if code in xr["failed"]:
                yield ev, _GPU, (_FAILED, 1.0, f"XID {code}")
            elif code in xr["drained"]:
                yield ev, _GPU, (_DRAINED, 1.0, f"XID {code}")
            elif code in xr["degraded"] or str(code) in xr["degraded"]:
                f = float(xr["degraded"].get(code, xr["degraded"].get(str(code))))
                if "nonfatal" in str(v.get("detail", "")).lower():
                    f = max(f, soft)
                yield ev, _GPU, (_DEGRADED, f, f"XID {code}")
            else:
                yield ev, _GPU, None
        elif k == "row_remap":
            smi = rules["nvidia_smi"]
            if v["failure"]:
                yield ev, _GPU, _verdict(smi["row_remap_failure"], soft, "row remapping failure")
            elif v["pending"]:
                yield ev, _GPU, _verdict(smi["row_remap_pending"], soft, "pending row remap")
            else:
                yield ev, _GPU, None
        elif k == "retired_pages":
            yield (
                ev,
                _GPU,
                _verdict(
                    rules["nvidia_smi"]["retired_pages_pending"], soft, "pending page retirement"
                )
                if v["pending"]
                else None,
            )
        elif k == "reset_required":
            yield (
                ev,
                _GPU,
                _verdict(rules["nvidia_smi"]["reset_required"], soft, "GPU reset required")
                if v["reset"] or v["drain_and_reset"]
                else None,
            )
        elif k == "ecc":
            counts = v["counts"]
            uncorrectable = sum(
                n
                for key, n in counts.items()
                if key.startswith("Volatile/") and "Uncorrectable" in key
            )
            correctable = sum(
                n
                for key, n in counts.items()
                if key.startswith("Volatile/")
                and "Correctable" in key
                and "Uncorrectable" not in key
            )
            if uncorrectable > 0:
                yield (
                    ev,
                    _GPU,
                    _verdict(
                        rules["nvidia_smi"]["ecc_uncorrectable"], soft, "uncorrectable ECC errors"
                    ),
                )
            elif correctable > rules["nvidia_smi"]["ecc_correctable_max"]:
                yield ev, _GPU, (_DEGRADED, soft, "corrected ECC errors above the limit")
            else:
                yield ev, _GPU, None
        elif k == "throttle":
            slow = [r for r in v["active"] if r in rules["nvidia_smi"]["throttle_reasons"]]
            yield (
                ev,
                _GPU,
                (_DEGRADED, soft, "clock throttling (" + ", ".join(slow) + ")") if slow else None,
            )
        elif k == "nvlink_speed":
            links = v["links_gbps"]
            nominal = nvlink_nominal or 0.0
            total = sum(links.values())
            if nominal <= 0 or not links:
                yield ev, _GPU, None
            elif total == 0:
                yield (
                    ev,
                    _GPU,
                    _verdict(rules["nvlink"]["all_links_down"], soft, "all NVLinks down"),
                )
            elif total < nominal * len(links) - 1e-9:
                ratio = total / (nominal * len(links))
                yield (
                    ev,
                    _GPU,
                    (
                        _DEGRADED,
                        ratio,
                        f"NVLink bandwidth {total:g} of {nominal * len(links):g} GB/s",
                    ),
                )
            else:
                yield ev, _GPU, None
        elif k == "nvlink_errors":
            t = v["totals"]
            nl = rules["nvlink"]
            over = [
                f"{name} errors {t.get(name, 0)} > {nl[key]}"
                for name, key in (
                    ("replay", "replay_errors_max"),
                    ("recovery", "recovery_errors_max"),
                    ("crc", "crc_errors_max"),
                )
                if t.get(name, 0) > nl[key]
            ]
            yield ev, _GPU, (_DEGRADED, soft, "NVLink " + "; ".join(over)) if over else None
        elif k == "port_state":
            if not _is_up(ev):
                yield ev, _NIC, _verdict(rules["infiniband"]["port_down"], soft, "port down")
                continue
            rate = v.get("rate_gbps")
            nominal = rules["infiniband"]["nominal_gbps"] or port_nominal.get(_peer_key(ev))
            if rate and nominal and rate < nominal:
                yield (
                    ev,
                    _NIC,
                    (_DEGRADED, rate / nominal, f"link trained at {rate:g} of {nominal:g} Gb/s"),
                )
            else:
                yield ev, _NIC, None
        elif k == "port_counters":
            yield ev, _NIC, _counters_verdict(v["counters"], rules, soft, transport)
        elif k == "ber":
            ber = max(v.get("effective_ber", 0.0), v.get("symbol_ber", 0.0))
            limit = float(rules["ber"]["effective_ber_max"])
            if ber > limit:
                loss = min(0.99, ber * float(rules["ber"]["packet_bits"]))
                f = max(loss_factor(loss, transport), 1e-3)
                yield (
                    ev,
                    _NIC,
                    (
                        _DEGRADED,
                        f,
                        f"effective BER {ber:.3g} > {limit:.3g} (packet loss ~{loss:.3g})",
                    ),
                )
            else:
                yield ev, _NIC, None
        elif k == "module_temperature":
            high = v.get("warning_high_c")
            limit = float(high if high is not None else rules["module"]["warning_c"])
            t = float(v["temperature_c"])
            yield (
                ev,
                _NIC,
                (_DEGRADED, soft, f"module temperature {t:g} C >= warning {limit:g} C")
                if t >= limit
                else None,
            )
        elif k == "dcgm_health":
            condition = rules["dcgm_health"].get(v["status"], "ignore")
            yield ev, _GPU, _verdict(condition, soft, f"DCGM health {v['system']} {v['status']}")
        elif k == "dcgm_diag":
            dr = rules["dcgm_diag"]
            if v["test"] in dr["failed_tests"] and v["status"] == "Fail":
                yield ev, _GPU, (_FAILED, 1.0, f"DCGM diag {v['test']} Fail")
            elif v.get("category") in dr["ignore_categories"]:
                yield ev, _GPU, None
            else:
                yield (
                    ev,
                    _GPU,
                    _verdict(
                        dr.get(v["status"], "ignore"), soft, f"DCGM diag {v['test']} {v['status']}"
                    ),
                )
        else:
            yield ev, _GPU, None


def _peer_key(ev: Evidence) -> tuple[Any, ...]:
    v = ev.values
    return (ev.host, str(v.get("link_layer", "")).lower(), str(v.get("ca_type", "")))


def _is_up(ev: Evidence) -> bool:
    return (
        str(ev.values.get("state", "")).lower() == "active"
        and str(ev.values.get("physical_state", "")).lower() == "linkup"
    )


def _verdict(condition: str, soft: float, rule: str) -> tuple[str, float, str] | None:
    if condition == "ignore":
        return None
    return condition, (soft if condition == _DEGRADED else 1.0), rule


def _counters_verdict(
    counters: Mapping[str, int], rules: dict[str, Any], soft: float, transport: str = "roce"
) -> tuple[str, float, str] | None:
    ib = rules["infiniband"]
    downed = counters.get("LinkDownedCounter", 0)
    if downed > ib["link_downed_max"]:
        return _verdict(
            ib["link_downed"], soft, f"link downed {downed} times (> {ib['link_downed_max']})"
        )
    symbol = counters.get("SymbolErrorCounter", 0)
    rcv_errors = counters.get("PortRcvErrors", 0)
    recoveries = counters.get("LinkErrorRecoveryCounter", 0)
    words = []
    factor = 1.0
    if symbol > ib["symbol_error_max"]:
        packets = counters.get("PortRcvPkts", 0)
        if packets > 0:
            loss = min(0.99, (symbol + rcv_errors) / packets)
            factor = min(factor, loss_factor(loss, transport))
            words.append(
                f"{symbol} symbol errors (> {ib['symbol_error_max']}) in {packets} packets: packet loss ~{loss:.3g}"
            )
        else:
            factor = min(factor, soft)
            words.append(f"{symbol} symbol errors (> {ib['symbol_error_max']})")
    if recoveries > ib["link_error_recovery_max"]:
        factor = min(factor, soft)
        words.append(f"{recoveries} link error recoveries (> {ib['link_error_recovery_max']})")
    if not words:
        return None
    return _DEGRADED, max(factor, 1e-3), "; ".join(words)


# ------------------------------------------------------------------------------ applying
def _severity(condition: str) -> int:
    """How far a condition takes hardware out of service, in the core's order."""
    return Condition.from_label(condition).severity


def merge_findings(findings: list[Finding]) -> dict[tuple[str, str], tuple[str, float, str]]:
    """Per component the worst condition its evidence calls for (the lowest factor among
    degradations) and the reasons, evidence first-come."""
    merged: dict[tuple[str, str], tuple[str, float, list[str]]] = {}
    for f in findings:
        key = (f.kind, f.name)
        cond, factor, reasons = merged.get(key, (_OK, 1.0, []))
        if _severity(f.condition) > _severity(cond):
            cond, factor = f.condition, f.factor
        elif f.condition == cond == _DEGRADED:
            factor = min(factor, f.factor)
        if f.reason not in reasons:
            reasons.append(f.reason)
        merged[key] = (cond, factor, reasons)
    out = {}
    for key, (cond, factor, reasons) in merged.items():
        shown = reasons[:3] + ([f"and {len(reasons) - 3} more"] if len(reasons) > 3 else [])
        out[key] = (cond, factor, "; ".join(shown))
    return out


def _worse(after: tuple[str, float], before: tuple[str, float]) -> bool:
    if _severity(after[0]) != _severity(before[0]):
        return _severity(after[0]) > _severity(before[0])
    return after[0] == _DEGRADED and after[1] < before[1] - 1e-12


def apply_findings(
    state: ClusterState, findings: list[Finding]
) -> tuple[list[Change], list[str], dict[str, np.ndarray]]:
    """Apply merged findings to ``state`` (the caller works on a copy for all-or-nothing)."""
    current = {
        (h["kind"], h["name"]): (h["condition"], float(h["factor"])) for h in state.unhealthy()
    }
    changes: list[Change] = []
    unchanged: list[str] = []
    affected: dict[str, set[int]] = {}
    for (kind, name), (cond, factor, reason) in merge_findings(findings).items():
        key = (kind, _canonical(state, kind, name))
        before = current.get(key, (_OK, 1.0))
        if not _worse((cond, factor), before):
            unchanged.append(
                f"{kind} {key[1]} is already {before[0]}"
                + (f" ({before[1]:.3g})" if before[0] == _DEGRADED else "")
            )
            continue
        target: dict[str, Any] = {kind: key[1]}
        if cond == _FAILED:
            hit = state.fail(**target, reason=reason)
        elif cond == _DRAINED:
            hit = state.drain(**target, reason=reason)
        else:
            hit = state.degrade(factor=factor, reason=reason, **target)
        for job, ranks in hit.items():
            affected.setdefault(job, set()).update(int(r) for r in ranks)
        changes.append(
            Change(kind, key[1], before[0], cond, factor if cond == _DEGRADED else 1.0, reason)
        )
    return (
        changes,
        unchanged,
        {k: np.asarray(sorted(v), dtype=np.int64) for k, v in affected.items()},
    )


def _canonical(state: ClusterState, kind: str, name: str) -> str:
    if kind == _GPU:
        gpu = state.resolve_gpu(name)
        return state.component_name(ComponentKind.Gpu, gpu, 0)
    return name


def ingest(
    state: ClusterState,
    sources: Iterable[Any],
    *,
    rules: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    host: str | None = None,
    format: str | None = None,
    strict: bool = False,
    dry_run: bool = False,
    repair: bool = False,
    max_moves: int = 0,
    spares: bool | str | SparePolicy | None = None,
) -> IngestReport:
    """Read the sources, judge the evidence and apply every change at once, or none.

    ``host`` names the host of sources whose lines do not (``HOST=PATH`` per source does the
    same); ``format`` forces one reader for every source. ``strict`` makes an unreadable
    evidence line or evidence about a host outside the cluster an error. ``dry_run`` computes
    the report and leaves ``state`` unchanged. ``repair`` then repairs every job hit
    (:func:`gpuplace.repair`, with ``max_moves`` and ``spares``) in the same transaction: a
    job that cannot be repaired raises and nothing changes."""
    # A complete rule set (from load_rules) is used as it is; anything else is site overrides.
    rule_set: dict[str, Any]
    if isinstance(rules, dict) and "version" in rules and "xid" in rules:
        rule_set = rules
    else:
        rule_set = load_rules(rules)
    results = read_sources(sources, host=host, format=format, strict=strict)
    findings, unmapped = evaluate(state.topology, results, rule_set, host=host, strict=strict)
    trial = state.copy()
    changes, unchanged, affected = apply_findings(trial, findings)
    repairs: list[Repair] = []
    if repair:
        for job in sorted(affected):
            repairs.append(repair_job(trial, job, max_moves=max_moves, spares=spares))
    if not dry_run:
        # Everything ClusterState.copy() copies (the core state, the job specs, whatever a
        # later version adds) comes back from the trial at once.
        vars(state).update(vars(trial))
    return IngestReport(
        sources=results,
        findings=findings,
        changes=changes,
        unmapped=unmapped,
        unchanged=unchanged,
        affected=affected,
        applied=not dry_run,
        repairs=repairs,
    )


def revert(state: ClusterState, report: IngestReport) -> None:
    """Return the components an ingest changed to ok (``state.recover`` on each)."""
    targets: dict[str, list[str]] = {}
    for c in report.changes:
        targets.setdefault(c.kind, []).append(c.name)
    if targets:
        state.recover(**targets)
