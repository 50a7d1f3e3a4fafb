"""What every health-evidence reader returns, and the plumbing they share.

A reader turns one tool's output (a kernel log, ``dcgmi``, ``nvidia-smi``, ``ibstat``, ...)
into :class:`Evidence` records: one observation about one device, with the file and line it
came from. Readers do not judge: the rules in :mod:`gpuplace.health` decide what evidence
means for the state. A line a reader does not recognise is counted, never an error; a line
that claims to be evidence but cannot be read is an error naming the file and line in strict
mode, and is counted as malformed otherwise. Readers raise only
:class:`gpuplace.errors.InvalidState`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplace.errors import InvalidState, InvalidTopology
from gpuplace.io._common import Source, guard, read_source

__all__ = ["Evidence", "ReadResult", "normalize_pci"]

#: Malformed lines remembered per source (all are counted): a corrupted multi-GB log must not
#: fill memory with complaints.
MAX_MALFORMED_KEPT = 100


@dataclass(frozen=True)
class Evidence:
    """One observation about one device.

    ``kind`` says what was observed (``xid``, ``dcgm_health``, ``dcgm_diag``, ``ecc``,
    ``row_remap``, ``retired_pages``, ``reset_required``, ``throttle``, ``nvlink_speed``,
    ``nvlink_errors``, ``port_state``, ``port_counters``, ``module_temperature``, ``ber``);
    ``values`` holds the figures (units in the key names: ``rate_gbps``, ``temperature_c``).
    The device is named by whatever the tool printed: a GPU's PCI address (normalised to
    ``dddd:bb:dd``) or nvidia-smi index, a NIC (``mlx5_3``) and port; ``host`` is set when the
    line itself names it (syslog and journal lines do)."""

    kind: str
    source: str
    line: int | None
    text: str
    host: str | None = None
    gpu_pci: str | None = None
    gpu_index: int | None = None
    nic: str | None = None
    port: int | None = None
    values: Mapping[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.line is not None else self.source


@dataclass
class ReadResult:
    """Everything one reader got out of one source."""

    source: str
    format: str
    evidence: list[Evidence] = field(default_factory=list)
    #: Lines read, lines that were not evidence (or part of it), lines that looked like
    #: evidence but could not be read (line number, why; the first MAX_MALFORMED_KEPT of
    #: ``malformed_total``).
    lines: int = 0
    unknown: int = 0
    malformed: list[tuple[int, str]] = field(default_factory=list)
    malformed_total: int = 0
    #: PCI addresses of the GPUs in nvidia-smi index order, per host ("" when the source does
    #: not name its host), when the source lists them (``nvidia-smi -q``, a bus-id CSV).
    bus_ids: dict[str, list[str]] = field(default_factory=dict)
    #: The host the source is about when the caller said so (``HOST=FILE``), else None.
    host: str | None = None
    #: The device the whole source is about (``mlxlink -d mlx5_0``, ``perfquery -C mlx5_0``).
    device: str | None = None

    def bad_line(self, line: int, why: str, *, strict: bool) -> None:
        """A line that claims to be evidence but is not readable: an error in strict mode."""
        if strict:
            raise InvalidState(f"{self.source}:{line}: {why}")
        self.malformed_total += 1
        if len(self.malformed) < MAX_MALFORMED_KEPT:
            self.malformed.append((line, why))


_PCI = re.compile(
    r"^(?:PCI:)?(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.[0-7])?$"
)


def normalize_pci(text: str) -> str | None:
    """``0000:1b:00`` from ``PCI:0000:1B:00``, ``00000000:1B:00.0`` or ``1b:00.0``; None when
    the text is not a PCI address."""
    m = _PCI.match(text.strip())
    if not m:
        return None
    domain, bus, device = m.group(1) or "0", m.group(2), m.group(3)
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"


def read_text(source: Source) -> tuple[str, str]:
    """``(display name, text)`` of a small source (every format but the kernel log, which is
    streamed), with the readers' size limit; errors as InvalidState."""
    try:
        return read_source(source)
    except InvalidTopology as exc:
        raise InvalidState(str(exc)) from None


#: The evidence readers' guard (:func:`gpuplace.io._common.guard`): nothing but InvalidState
#: leaves them.
guarded = guard(InvalidState)


def split_key_value(line: str) -> tuple[str, str] | None:
    """``(key, value)`` of a ``key : value`` line, split at the first colon and stripped;
    None when there is no colon or nothing before it. (A string split, not a regular
    expression: a lazy key followed by ``\\s*:`` backtracks quadratically on a long line of
    spaces without a colon.)"""
    head, colon, tail = line.partition(":")
    if not colon or not head:
        return None
    return head.strip(), tail.strip()


def is_table_border(line: str) -> bool:
    """Whether ``line`` is a table border such as ``+----+=====+`` or ``|  |`` (what
    ``^\\s*[+|][-=+| ]*[+|]?\\s*$`` matches, in one linear pass)."""
    stripped = line.strip()
    return bool(stripped) and stripped[0] in "+|" and not stripped.strip("-=+| ")


def count_lines(text: str) -> int:
    return text.count("\n") + (0 if not text or text.endswith("\n") else 1)


def number(text: str) -> float | None:
    """A finite float from ``400``, ``25 GB/s``, ``3E-12``, ``0x00ff``; None when there is
    none (``1e999`` is none: counters and rates are finite)."""
    text = text.strip()
    if text.lower().startswith("0x"):
        try:
            return float(int(text[:66], 16))
        except (ValueError, OverflowError):
            return None
    m = re.match(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?", text)
    if not m:
        return None
    try:
        value = float(m.group(0))
    except ValueError:  # pragma: no cover - the pattern admits only floats
        return None
    return value if math.isfinite(value) else None
