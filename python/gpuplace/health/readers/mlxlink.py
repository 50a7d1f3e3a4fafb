"""Reader of NVIDIA/Mellanox ``mlxlink`` output (MFT): ``-m`` (Module Info: temperature with
its warning range, voltage, optical powers) and ``-c`` (Physical Counters and BER Info:
effective and raw BER, effective errors, time since the counters were cleared), as text or as
``--json``. mlxlink names no device in its output (it is run as ``mlxlink -d mlx5_0``), so the
caller names it: ``HOST:mlx5_0=FILE``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gpuplace._util.documents import loads_json
from gpuplace.health.readers._base import (
    Evidence,
    ReadResult,
    count_lines,
    guarded,
    number,
    read_text,
    split_key_value,
)

__all__ = ["read_mlxlink"]

_RANGE = re.compile(
    r"^\s*(-?\d{1,9}(?:\.\d{1,9})?)\s*\[\s*(-?\d{1,9}(?:\.\d{1,9})?)\s*\.\.\s*(-?\d{1,9}(?:\.\d{1,9})?)\s*\]"
)


@guarded
def read_mlxlink(source: Any, *, strict: bool = False) -> ReadResult:
    """Read ``mlxlink -m`` and/or ``-c`` output (text or ``--json``)."""
    name, text = read_text(source)
    result = ReadResult(source=name, format="mlxlink", lines=count_lines(text))
    fields: dict[str, tuple[str, int | None]] = {}
    known = 0
    if text.lstrip().startswith("{"):
        try:
            doc = loads_json(text)
        except json.JSONDecodeError as exc:  # a JsonLimitError too
            result.bad_line(exc.lineno, f"not valid JSON ({exc.msg})", strict=True)
            return result
        _flatten(doc, fields)
        known = result.lines
    else:
        for no, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if not stripped or set(stripped) <= {"-"}:
                known += 1
                continue
            pair = split_key_value(stripped)
            if pair and pair[0][:1].isascii() and pair[0][:1].isalpha():
                fields[pair[0]] = (pair[1], no)
                known += 1
            elif stripped in (
                "Operational Info",
                "Supported Info",
                "Troubleshooting Info",
                "Module Info",
                "Physical Counters and BER Info",
                "EYE Opening Info",
                "Test Mode Info",
            ):
                known += 1
    temp = fields.get("Temperature [C]")
    if temp is not None:
        m = _RANGE.match(temp[0])
        value = number(temp[0])
        if value is None:
            result.bad_line(
                temp[1] or 1, f"Temperature [C]: expected a number, got {temp[0]!r}", strict=strict
            )
        else:
            low, high = (float(m.group(2)), float(m.group(3))) if m else (None, None)
            result.evidence.append(
                Evidence(
                    kind="module_temperature",
                    source=name,
                    line=temp[1],
                    text=f"module temperature {temp[0]} C",
                    values={"temperature_c": value, "warning_low_c": low, "warning_high_c": high},
                )
            )
    ber_keys = {
        "effective_ber": "Effective Physical BER",
        "raw_ber": "Raw Physical BER",
        "symbol_ber": "Symbol BER",
        "effective_errors": "Effective Physical Errors",
        "minutes_since_clear": "Time Since Last Clear [Min]",
    }
    values: dict[str, float] = {}
    first: int | None = None
    for key, label in ber_keys.items():
        entry = fields.get(label)
        if entry is None:
            continue
        value = number(entry[0])
        if value is None:
            if entry[0] not in ("N/A", "NA"):
                result.bad_line(
                    entry[1] or 1, f"{label}: expected a number, got {entry[0]!r}", strict=strict
                )
            continue
        values[key] = value
        first = entry[1] if first is None else first
    if "effective_ber" in values or "symbol_ber" in values or "raw_ber" in values:
        shown = ", ".join(f"{ber_keys[k]} {fields[ber_keys[k]][0]}" for k in values)
        result.evidence.append(
            Evidence(kind="ber", source=name, line=first, text=shown, values=values)
        )
    speed = fields.get("Speed")
    state = fields.get("State")
    if speed is not None or state is not None:
        result.evidence.append(
            Evidence(
                kind="link_operational",
                source=name,
                line=(state or speed or ("", None))[1],
                text=f"mlxlink state {(state or ('?',))[0]}, speed {(speed or ('?',))[0]}, width {fields.get('Width', ('?',))[0]}",
                values={
                    "state": (state or ("",))[0],
                    "speed": (speed or ("",))[0],
                    "width": fields.get("Width", ("",))[0],
                },
            )
        )
    result.unknown = result.lines - known
    return result


def _flatten(doc: Any, out: dict[str, tuple[str, int | None]]) -> None:
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            for key, value in node.items():
                if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                    out.setdefault(str(key).strip(), (str(value), None))
                else:
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
