"""Readers of InfiniBand port state and counters (linux-rdma/infiniband-diags and ibutils2):

- ``ibstat``: ``CA 'mlx5_0'`` blocks with ``Port 1:`` state, physical state, rate (Gb/s) and
  link layer;
- ``ibstatus``: ``Infiniband device 'mlx5_0' port 1 status:`` blocks (``rate: 200 Gb/sec (4X
  HDR)``);
- ``perfquery`` / ``perfquery -x``: ``Counter:.....value`` lines of one port (the HCA is named
  by the caller, ``HOST:mlx5_0=FILE``, since perfquery prints only the LID);
- ibdiagnet's port-counter report (``ibdiagnet2.pm``): ``Port=N Lid=... GUID=... Port Name=...``
  blocks of ``counter=0xhex`` lines; ``_extended`` names are folded onto the plain ones.

Port states give ``port_state`` evidence, counters ``port_counters`` evidence with the
counters under their PortCounters names (``SymbolErrorCounter``, ``LinkErrorRecoveryCounter``,
``LinkDownedCounter``, ``PortRcvErrors``, ``PortRcvPkts``, ...).
"""

from __future__ import annotations

import re
from typing import Any

from gpuplace.health.readers._base import (
    Evidence,
    ReadResult,
    count_lines,
    guarded,
    number,
    read_text,
    split_key_value,
)

__all__ = ["read_ibdiagnet_pm", "read_ibstat", "read_ibstatus", "read_perfquery"]

_CA = re.compile(r"^CA\s+'([^']+)'\s*$")
_PORT = re.compile(r"^Port\s+(\d+):\s*$")
_FIELD_KEY = re.compile(r"[A-Za-z][A-Za-z _]*")


def _field(line: str) -> tuple[str, str] | None:
    """``(key, value)`` of a ``Key name: value`` line (split at the colon, then the key
    checked: linear, where one regular expression with a lazy key backtracks)."""
    pair = split_key_value(line)
    if pair is None or not _FIELD_KEY.fullmatch(pair[0]):
        return None
    return pair


def _port_evidence(
    result: ReadResult,
    name: str,
    nic: str,
    port: int,
    line: int,
    fields: dict[str, str],
    strict: bool,
) -> None:
    state = fields.get("state", "")
    phys = fields.get("physical state", fields.get("phys state", ""))
    rate_text = fields.get("rate", "")
    rate = number(rate_text)
    if rate is None and rate_text:
        result.bad_line(
            line, f"{nic} port {port}: expected a rate in Gb/s, got {rate_text!r}", strict=strict
        )
        return
    # "4: ACTIVE" / "5: LinkUp" in ibstatus; "Active" / "LinkUp" in ibstat.
    state = state.split(":")[-1].strip()
    phys = phys.split(":")[-1].strip()
    result.evidence.append(
        Evidence(
            kind="port_state",
            source=name,
            line=line,
            text=f"{nic} port {port}: state {state}, physical state {phys}, rate {rate_text or '?'}",
            nic=nic,
            port=port,
            values={
                "state": state,
                "physical_state": phys,
                "rate_gbps": rate,
                "link_layer": fields.get("link layer", fields.get("link_layer", "")),
                "ca_type": fields.get("ca type", ""),
            },
        )
    )


@guarded
def read_ibstat(source: Any, *, strict: bool = False) -> ReadResult:
    """Read ``ibstat`` output (every CA and port)."""
    name, text = read_text(source)
    result = ReadResult(source=name, format="ibstat", lines=count_lines(text))
    known = 0
    ca: str | None = None
    port: tuple[int, int] | None = None
    fields: dict[str, str] = {}

    ca_fields: dict[str, str] = {}

    def flush() -> None:
        if ca is not None and port is not None:
            _port_evidence(result, name, ca, port[0], port[1], {**ca_fields, **fields}, strict)

    for no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        m_ca = _CA.match(stripped)
        if m_ca:
            flush()
            ca, port, fields, ca_fields = m_ca.group(1), None, {}, {}
            known += 1
            continue
        m_port = _PORT.match(stripped)
        if m_port and ca is not None:
            flush()
            port, fields = (int(m_port.group(1)), no), {}
            known += 1
            continue
        m = _field(stripped)
        if m and ca is not None:
            target = fields if port is not None else ca_fields
            target[m[0].lower()] = m[1]
            known += 1
    flush()
    result.unknown = result.lines - known
    return result


_IBSTATUS_DEV = re.compile(r"^Infiniband device '([^']+)' port (\d+) status:\s*$")


@guarded
def read_ibstatus(source: Any, *, strict: bool = False) -> ReadResult:
    """Read ``ibstatus`` output (every device and port)."""
    name, text = read_text(source)
    result = ReadResult(source=name, format="ibstatus", lines=count_lines(text))
    known = 0
    current: tuple[str, int, int] | None = None
    fields: dict[str, str] = {}
    for no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            known += 1
            continue
        m_dev = _IBSTATUS_DEV.match(stripped)
        if m_dev:
            if current is not None:
                _port_evidence(result, name, current[0], current[1], current[2], fields, strict)
            current, fields = (m_dev.group(1), int(m_dev.group(2)), no), {}
            known += 1
            continue
        m = _field(stripped)
        if m and current is not None:
            fields[m[0].lower()] = m[1]
            known += 1
    if current is not None:
        _port_evidence(result, name, current[0], current[1], current[2], fields, strict)
    result.unknown = result.lines - known
    return result


_PERF_HEADER = re.compile(
    r"^#\s*Port (?:extended )?counters:\s*Lid\s+(\d+)\s+port\s+(\d+)", re.IGNORECASE
)
_PERF_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9]*):\.*\s*(\S+)\s*$")


@guarded
def read_perfquery(source: Any, *, strict: bool = False) -> ReadResult:
    """Read ``perfquery`` or ``perfquery -x`` output (one port's counters)."""
    name, text = read_text(source)
    result = ReadResult(source=name, format="perfquery", lines=count_lines(text))
    known = 0
    counters: dict[str, int] = {}
    port: int | None = None
    lid: int | None = None
    first_line: int | None = None
    for no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            known += 1
            continue
        m_head = _PERF_HEADER.match(stripped)
        if m_head:
            lid, port = int(m_head.group(1)), int(m_head.group(2))
            first_line = first_line or no
            known += 1
            continue
        m = _PERF_LINE.match(stripped)
        if m is None:
            continue
        value = number(m.group(2))
        if value is None:
            result.bad_line(
                no, f"{m.group(1)}: expected a counter value, got {m.group(2)!r}", strict=strict
            )
            continue
        if m.group(1) == "PortSelect" and port is None:
            port = int(value)
        counters[m.group(1)] = int(value)
        first_line = first_line or no
        known += 1
    if counters:
        result.evidence.append(
            Evidence(
                kind="port_counters",
                source=name,
                line=first_line,
                text=f"perfquery lid {lid if lid is not None else '?'} port {port or '?'}: "
                + ", ".join(
                    f"{k}={v}"
                    for k, v in counters.items()
                    if v and "Data" not in k and "Pkts" not in k
                ),
                port=port,
                values={"counters": counters, "lid": lid},
            )
        )
    result.unknown = result.lines - known
    return result


_PM_PORT = re.compile(
    r"^Port=(\d+)\s+Lid=(\S+)\s+GUID=(\S+)(?:\s+Device=(\S+))?(?:\s+Port Name=(.*))?$"
)
_PM_COUNTER = re.compile(r"^([a-z_0-9]+)=(\S+)$")
#: ibdiagnet counter names -> PortCounters names used by the rules.
_PM_NAMES = {
    "symbol_error_counter": "SymbolErrorCounter",
    "link_error_recovery_counter": "LinkErrorRecoveryCounter",
    "link_downed_counter": "LinkDownedCounter",
    "port_rcv_errors": "PortRcvErrors",
    "port_rcv_remote_physical_errors": "PortRcvRemotePhysicalErrors",
    "port_rcv_switch_relay_errors": "PortRcvSwitchRelayErrors",
    "port_xmit_discard": "PortXmitDiscards",
    "local_link_integrity_errors": "LocalLinkIntegrityErrors",
    "excessive_buffer_overrun_errors": "ExcessiveBufferOverrunErrors",
    "port_rcv_packets": "PortRcvPkts",
    "port_rcv_pkts": "PortRcvPkts",
    "port_xmit_packets": "PortXmitPkts",
    "port_xmit_pkts": "PortXmitPkts",
    "port_rcv_data": "PortRcvData",
    "port_xmit_data": "PortXmitData",
}
#: ``hostname mlx5_0`` or ``hostname/mlx5_0``: the node description of a host's HCA.
_CA_DESCRIPTION = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)[ /](mlx\d+_\d+)\b")


@guarded
def read_ibdiagnet_pm(source: Any, *, strict: bool = False) -> ReadResult:
    """Read ibdiagnet's port-counter report (``ibdiagnet2.pm``): one ``port_counters``
    evidence per port; a port whose name is a host's HCA description (``dgx017 mlx5_3``) is
    mapped to that NIC, other ports (switch ports) stay unmapped."""
    name, text = read_text(source)
    result = ReadResult(source=name, format="ibdiagnet-pm", lines=count_lines(text))
    known = 0
    blocks: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or set(stripped) <= {"-"}:
            known += 1
            continue
        m_port = _PM_PORT.match(stripped)
        if m_port:
            current = {
                "port": int(m_port.group(1)),
                "lid": m_port.group(2),
                "guid": m_port.group(3),
                "port_name": (m_port.group(5) or "").strip(),
                "line": no,
                "counters": {},
            }
            blocks.append(current)
            known += 1
            continue
        m = _PM_COUNTER.match(stripped)
        if m and current is not None:
            value = number(m.group(2)) if m.group(2) not in ("NA", "N/A") else None
            if value is None and m.group(2) not in ("NA", "N/A"):
                result.bad_line(
                    no, f"{m.group(1)}: expected a hex counter, got {m.group(2)!r}", strict=strict
                )
                continue
            key = m.group(1).removesuffix("_extended")
            if value is not None:
                current["counters"][_PM_NAMES.get(key, key)] = int(value)
            known += 1
        elif stripped.startswith("Port=") and current is None:
            result.bad_line(
                no, f"expected 'Port=N Lid=... GUID=...', got {stripped!r}", strict=strict
            )
    for b in blocks:
        host_nic = _CA_DESCRIPTION.match(b["port_name"])
        result.evidence.append(
            Evidence(
                kind="port_counters",
                source=name,
                line=b["line"],
                text=f"port {b['port']} of GUID {b['guid']} ({b['port_name'] or 'no name'}): "
                + ", ".join(f"{k}={v}" for k, v in b["counters"].items() if v),
                host=host_nic.group(1) if host_nic else None,
                nic=host_nic.group(2) if host_nic else None,
                port=b["port"],
                values={"counters": b["counters"], "guid": b["guid"], "port_name": b["port_name"]},
            )
        )
    result.unknown = result.lines - known
    return result
