"""Readers of ``nvidia-smi -q`` (ECC errors, retired pages, the row remapper, clock event /
throttle reasons, reset status), ``nvidia-smi nvlink -s`` / ``-e`` (link speeds and error
counters) and ``nvidia-smi --query-gpu=index,pci.bus_id --format=csv`` (the bus-id table that
maps a kernel log's PCI addresses to GPU indices).

``nvidia-smi -q`` prints one indented block per GPU (``GPU 00000000:1B:00.0``) in index order;
the reader keeps each block's ``section/sub/key : value`` pairs and emits evidence for the
sections the rules use. Older drivers call the clock section ``Clocks Throttle Reasons`` and
the retired-page flag ``Pending Page Retirement``; both are read.
"""

from __future__ import annotations

import re
from typing import Any

from gpuplace.health.readers._base import (
    Evidence,
    ReadResult,
    count_lines,
    guarded,
    normalize_pci,
    number,
    read_text,
    split_key_value,
)

__all__ = ["read_bus_ids", "read_nvidia_smi_nvlink", "read_nvidia_smi_q"]

_GPU_BLOCK = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_THROTTLE_SECTIONS = ("Clocks Event Reasons", "Clocks Throttle Reasons")


@guarded
def read_nvidia_smi_q(source: Any, *, strict: bool = False) -> ReadResult:
    """Read ``nvidia-smi -q`` output: evidence per GPU (by nvidia-smi index, in block order)
    and the host's bus-id table."""
    name, text = read_text(source)
    result = ReadResult(source=name, format="nvidia-smi-q", lines=count_lines(text))
    known = 0
    gpus: list[dict[str, Any]] = []
    stack: list[tuple[int, str]] = []  # (indent, section name) of the open sections
    current: dict[str, Any] | None = None
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.strip().startswith("====="):
            known += 1
            continue
        if line.startswith("GPU "):
            m = _GPU_BLOCK.match(line.strip())
            if m is None:
                result.bad_line(
                    no, f"expected 'GPU dddddddd:bb:dd.f', got {line.strip()!r}", strict=strict
                )
                current = None
                continue
            current = {"pci": normalize_pci(m.group(1)), "line": no, "fields": {}, "lines": {}}
            gpus.append(current)
            stack = []
            known += 1
            continue
        pair = split_key_value(line)
        indent = len(line) - len(line.lstrip(" "))
        key = pair[0] if pair else line.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if current is None:
            if pair:  # header lines: Timestamp, Driver Version, Attached GPUs
                known += 1
            continue
        known += 1
        if pair is None or not pair[1]:
            stack.append((indent, key))
            continue
        path = "/".join([s for _, s in stack] + [key])
        current["fields"][path] = pair[1]
        current["lines"][path] = no
    for index, gpu in enumerate(gpus):
        _gpu_evidence(result, name, index, gpu)
    result.bus_ids[""] = [g["pci"] for g in gpus]
    result.unknown = result.lines - known
    return result


def _gpu_evidence(result: ReadResult, name: str, index: int, gpu: dict[str, Any]) -> None:
    fields: dict[str, str] = gpu["fields"]
    lines: dict[str, int] = gpu["lines"]

    def emit(kind: str, path: str, text: str, values: dict[str, Any]) -> None:
        result.evidence.append(
            Evidence(
                kind=kind,
                source=name,
                line=lines.get(path, gpu["line"]),
                text=text,
                gpu_index=index,
                gpu_pci=gpu["pci"],
                values=values,
            )
        )

    ecc = {
        path.split("/", 1)[1]: int(v)
        for path, v in fields.items()
        if path.startswith("ECC Errors/") and v.strip().isdigit()
    }
    if ecc:
        first = next(p for p in fields if p.startswith("ECC Errors/"))
        emit(
            "ecc",
            first,
            "ECC errors " + ", ".join(f"{k}={v}" for k, v in ecc.items() if v),
            {"counts": ecc},
        )
    for path in ("Retired Pages/Pending Page Blacklist", "Retired Pages/Pending Page Retirement"):
        value = fields.get(path)
        if value is not None and value.lower() in ("yes", "no"):
            emit(
                "retired_pages",
                path,
                f"{path}: {value}",
                {"pending": value.lower() == "yes"},
            )
    remap = {k.split("/", 1)[1]: v for k, v in fields.items() if k.startswith("Remapped Rows/")}
    if remap and "Pending" in remap:
        pending = remap.get("Pending", "No").lower() == "yes"
        failure = remap.get("Remapping Failure Occurred", "No").lower() == "yes"
        uncorrectable = number(remap.get("Uncorrectable Error", "0") or "0") or 0.0
        path = (
            "Remapped Rows/Pending" if not failure else "Remapped Rows/Remapping Failure Occurred"
        )
        emit(
            "row_remap",
            path,
            f"Remapped Rows: Uncorrectable Error {int(uncorrectable)}, Pending {remap.get('Pending')}, "
            f"Remapping Failure Occurred {remap.get('Remapping Failure Occurred', 'No')}",
            {"pending": pending, "failure": failure, "uncorrectable": int(uncorrectable)},
        )
    for section in _THROTTLE_SECTIONS:
        active = [
            path.split("/")[-1]
            for path, v in fields.items()
            if path.startswith(section + "/") and v.lower() == "active"
        ]
        present = any(p.startswith(section + "/") for p in fields)
        if present:
            first = next(p for p in fields if p.startswith(section + "/"))
            emit(
                "throttle",
                first,
                f"{section}: " + (", ".join(active) + " active" if active else "none active"),
                {"active": active},
            )
    reset = fields.get("GPU Reset Status/Reset Required")
    drain = fields.get("GPU Reset Status/Drain and Reset Recommended")
    if reset is not None:
        emit(
            "reset_required",
            "GPU Reset Status/Reset Required",
            f"GPU Reset Status: Reset Required {reset}, Drain and Reset Recommended {drain or 'N/A'}",
            {"reset": reset.lower() == "yes", "drain_and_reset": (drain or "").lower() == "yes"},
        )


# The GPU line ``GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)``: only its index is used, so only
# ``GPU <index>:`` is matched (the whole line went through a lazy name, an optional UUID group
# and ``\s*$``, which backtracked quadratically on a long run of spaces: 20 kB took minutes).
_NVLINK_GPU = re.compile(r"GPU\s+(\d{1,9}):")
_NVLINK_SPEED = re.compile(
    r"^Link\s+(\d+):\s*(?:(<inactive>|inactive)|(\d{1,9}(?:\.\d{1,9})?)\s*GB/s)\s*$", re.IGNORECASE
)
_NVLINK_ERR = re.compile(
    r"^Link\s+(\d+):\s*(Replay|Recovery|CRC)\s+Errors:\s*(\d+)\s*$", re.IGNORECASE
)


@guarded
def read_nvidia_smi_nvlink(source: Any, *, strict: bool = False) -> ReadResult:
    """Read ``nvidia-smi nvlink -s`` (per-link speed, ``<inactive>`` for a link that is down)
    or ``nvidia-smi nvlink -e`` (replay, recovery and CRC error counters per link)."""
    name, text = read_text(source)
    result = ReadResult(source=name, format="nvidia-smi-nvlink", lines=count_lines(text))
    known = 0
    gpus: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            known += 1
            continue
        m = _NVLINK_GPU.match(stripped)
        if m:
            current = {
                "index": int(m.group(1)),
                "line": no,
                "text": stripped,
                "speeds": {},
                "errors": {},
            }
            gpus.append(current)
            known += 1
            continue
        if not stripped.startswith("Link ") or current is None:
            continue
        m_speed = _NVLINK_SPEED.match(stripped)
        m_err = _NVLINK_ERR.match(stripped)
        if m_speed:
            current["speeds"][int(m_speed.group(1))] = (
                0.0 if m_speed.group(2) else float(m_speed.group(3))
            )
            known += 1
        elif m_err:
            per = current["errors"].setdefault(m_err.group(2).lower(), {})
            per[int(m_err.group(1))] = int(m_err.group(3))
            known += 1
        else:
            result.bad_line(
                no,
                f"expected 'Link N: <speed> GB/s' or 'Link N: <kind> Errors: <count>', got {stripped!r}",
                strict=strict,
            )
    for gpu in gpus:
        if gpu["speeds"]:
            speeds = gpu["speeds"]
            down = sorted(k for k, v in speeds.items() if v == 0)
            result.evidence.append(
                Evidence(
                    kind="nvlink_speed",
                    source=name,
                    line=gpu["line"],
                    text=f"{gpu['text']}: {len(speeds) - len(down)} of {len(speeds)} NVLinks active"
                    + (f", links {down} inactive" if down else "")
                    + f", {sum(speeds.values()):g} GB/s in total",
                    gpu_index=gpu["index"],
                    values={"links_gbps": dict(speeds), "inactive": down},
                )
            )
        if gpu["errors"]:
            totals = {kind: sum(per.values()) for kind, per in gpu["errors"].items()}
            result.evidence.append(
                Evidence(
                    kind="nvlink_errors",
                    source=name,
                    line=gpu["line"],
                    text=f"{gpu['text']}: NVLink errors "
                    + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())),
                    gpu_index=gpu["index"],
                    values={"totals": totals, "per_link": gpu["errors"]},
                )
            )
    result.unknown = result.lines - known
    return result


@guarded
def read_bus_ids(source: Any, *, strict: bool = False) -> ReadResult:
    """Read ``nvidia-smi --query-gpu=index,pci.bus_id --format=csv[,noheader]``: the host's
    GPUs' PCI addresses by index."""
    name, text = read_text(source)
    result = ReadResult(source=name, format="bus-ids", lines=count_lines(text))
    table: dict[int, str] = {}
    known = 0
    for no, line in enumerate(text.splitlines(), 1):
        cells = [c.strip() for c in line.split(",")]
        if not line.strip() or cells[0].lower() == "index":
            known += 1
            continue
        pci = normalize_pci(cells[1]) if len(cells) >= 2 else None
        if len(cells) < 2 or not cells[0].isdigit() or pci is None:
            result.bad_line(
                no, f"expected '<index>, <pci.bus_id>', got {line.strip()!r}", strict=True
            )
            continue
        index = int(cells[0])
        if index in table:
            result.bad_line(no, f"GPU index {index} listed twice", strict=True)
        table[index] = pci
        known += 1
    if sorted(table) != list(range(len(table))):
        result.bad_line(
            1, f"expected GPU indices 0..{len(table) - 1}, got {sorted(table)}", strict=True
        )
    result.bus_ids[""] = [table[i] for i in range(len(table))]
    result.unknown = result.lines - known
    return result
