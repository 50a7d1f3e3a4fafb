"""Readers of hardware-health evidence: the text the tools every GPU cluster already runs print.

=====================  ========================================  ===========================
format                 tool                                      reader
=====================  ========================================  ===========================
``kernel-log``         dmesg, journalctl -k, syslog, /dev/kmsg   :func:`read_kernel_log`
``dcgmi-health``       ``dcgmi health -c [-j]``                  :func:`read_dcgmi_health`
``dcgmi-diag``         ``dcgmi diag -r N [-j]``                  :func:`read_dcgmi_diag`
``nvidia-smi-q``       ``nvidia-smi -q``                         :func:`read_nvidia_smi_q`
``nvidia-smi-nvlink``  ``nvidia-smi nvlink -s`` / ``-e``         :func:`read_nvidia_smi_nvlink`
``bus-ids``            ``nvidia-smi --query-gpu=index,pci.bus_id --format=csv``  :func:`read_bus_ids`
``ibstat``             ``ibstat``                                :func:`read_ibstat`
``ibstatus``           ``ibstatus``                              :func:`read_ibstatus`
``perfquery``          ``perfquery [-x]``                        :func:`read_perfquery`
``ibdiagnet-pm``       ibdiagnet's ``ibdiagnet2.pm``             :func:`read_ibdiagnet_pm`
``mlxlink``            ``mlxlink -m -c [--json]``                :func:`read_mlxlink`
=====================  ========================================  ===========================

:func:`read_evidence` recognises the format from the text (or takes ``format=``). Every
reader returns a :class:`ReadResult` and raises only :class:`gpuplace.errors.InvalidState`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from gpuplace.errors import InvalidState
from gpuplace.health.readers._base import Evidence, ReadResult, normalize_pci
from gpuplace.health.readers.dcgm import DcgmiHealthStream, read_dcgmi_diag, read_dcgmi_health
from gpuplace.health.readers.infiniband import (
    read_ibdiagnet_pm,
    read_ibstat,
    read_ibstatus,
    read_perfquery,
)
from gpuplace.health.readers.kernel_log import KernelLogScanner, read_kernel_log
from gpuplace.health.readers.mlxlink import read_mlxlink
from gpuplace.health.readers.nvidia_smi import (
    read_bus_ids,
    read_nvidia_smi_nvlink,
    read_nvidia_smi_q,
)
from gpuplace.io._common import display_name

__all__ = [
    "FORMATS",
    "DcgmiHealthStream",
    "Evidence",
    "KernelLogScanner",
    "ReadResult",
    "detect_format",
    "normalize_pci",
    "read_bus_ids",
    "read_dcgmi_diag",
    "read_dcgmi_health",
    "read_evidence",
    "read_head",
    "read_ibdiagnet_pm",
    "read_ibstat",
    "read_ibstatus",
    "read_kernel_log",
    "read_mlxlink",
    "read_nvidia_smi_nvlink",
    "read_nvidia_smi_q",
    "read_perfquery",
]

FORMATS: dict[str, Callable[..., ReadResult]] = {
    "kernel-log": read_kernel_log,
    "dcgmi-health": read_dcgmi_health,
    "dcgmi-diag": read_dcgmi_diag,
    "nvidia-smi-q": read_nvidia_smi_q,
    "nvidia-smi-nvlink": read_nvidia_smi_nvlink,
    "bus-ids": read_bus_ids,
    "ibstat": read_ibstat,
    "ibstatus": read_ibstatus,
    "perfquery": read_perfquery,
    "ibdiagnet-pm": read_ibdiagnet_pm,
    "mlxlink": read_mlxlink,
}

# Signatures searched in the first 64 kB, most specific first.
_SIGNATURES: list[tuple[str, re.Pattern[str]]] = [
    ("dcgmi-health", re.compile(r"Health Monitor Report|\"Overall Health\"")),
    ("dcgmi-diag", re.compile(r"\|\s*Diagnostic\s*\|\s*Result|\"DCGM (?:GPU )?Diagnostic\"")),
    # One "=" each side says as much as "=+" and does not rescan a long run of them from every
    # position (quadratic: 64 kB of "=" took 3 s).
    ("nvidia-smi-q", re.compile(r"=NVSMI LOG=")),
    ("bus-ids", re.compile(r"^\s*index\s*,\s*pci\.bus_id", re.MULTILINE)),
    ("nvidia-smi-nvlink", re.compile(r"^GPU \d+: .*\n\s+Link \d+: ", re.MULTILINE)),
    ("ibstatus", re.compile(r"^Infiniband device '[^']+' port \d+ status:", re.MULTILINE)),
    ("ibstat", re.compile(r"^CA '[^']+'\s*$", re.MULTILINE)),
    ("perfquery", re.compile(r"^# Port (?:extended )?counters:|^PortSelect:\.+", re.MULTILINE)),
    ("ibdiagnet-pm", re.compile(r"^Port=\d+ Lid=\S+ GUID=", re.MULTILINE)),
    (
        "mlxlink",
        re.compile(
            r"^(?:Operational Info|Module Info|Physical Counters and BER Info)\s*$", re.MULTILINE
        ),
    ),
]


def detect_format(head: str) -> str:
    """The format of a source from its first lines; ``kernel-log`` when nothing else fits (a
    log whose lines are all unknown then ingests nothing and says so)."""
    for fmt, pattern in _SIGNATURES:
        if pattern.search(head):
            return fmt
    return "kernel-log"


def read_evidence(
    source: Any,
    *,
    format: str | None = None,
    host: str | None = None,
    device: str | None = None,
    strict: bool = False,
) -> ReadResult:
    """Read one source (path or open file) in ``format`` (see :data:`FORMATS`; recognised
    from the text when None). ``host`` and ``device`` name what the source is about when its
    lines do not (``dmesg`` of one host, ``mlxlink -d mlx5_0``)."""
    if format is None:
        format = detect_format(read_head(source))
    reader = FORMATS.get(format)
    if reader is None:
        raise InvalidState(
            f"{display_name(source)}: unknown evidence format {format!r} "
            f"(known: {', '.join(FORMATS)})"
        )
    if format == "kernel-log":
        result = read_kernel_log(source, host=host, strict=strict)
    else:
        result = reader(source, strict=strict)
    result.host = host
    result.device = device
    return result


def read_head(source: Any, size: int = 65536) -> str:
    """The first ``size`` bytes of a source as text (the stream is left where it was)."""
    if isinstance(source, (str, os.PathLike)):
        try:
            with open(source, "rb") as handle:
                data = handle.read(size)
        except OSError as exc:
            raise InvalidState(
                f"{display_name(source)}: cannot read file: {exc.strerror or exc}"
            ) from None
    elif hasattr(source, "peek"):
        data = source.peek(size)[:size]
    elif hasattr(source, "seek") and hasattr(source, "read") and source.seekable():
        pos = source.tell()
        data = source.read(size)
        source.seek(pos)
    else:
        raise InvalidState(
            f"{display_name(source)}: give format= for a stream that cannot be re-read"
        )
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
