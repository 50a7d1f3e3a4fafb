"""Reader of ``nvidia-smi --query-gpu=index,name,driver_version,vbios_version --format=csv``
into hardware attributes (``docs/policy.md``): per GPU its ``model`` (the product name),
``driver`` and ``firmware`` (the VBIOS version, e.g. ``96.00.74.00.01``).

The header names the columns (in any order, with units such as ``memory.total [MiB]``;
``noheader`` output is refused since the columns cannot be known); ``index`` is required,
``name``, ``driver_version`` and ``vbios_version`` are read when present, other columns are
ignored; ``[N/A]`` and ``[Not Supported]`` leave the attribute unset.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from gpuplace.io._common import Source, fail, guarded, read_source

__all__ = ["read_nvidia_smi_query"]

_COLUMNS = {"name": "model", "driver_version": "driver", "vbios_version": "firmware"}
_MISSING = {"", "[n/a]", "n/a", "[not supported]", "[unknown error]"}


@guarded
def read_nvidia_smi_query(source: Source, *, host: str) -> list[dict[str, Any]]:
    """``attributes`` entries (one per distinct set of values, with the local GPU indices)
    for the GPUs of ``host``. Raises InvalidTopology naming the file and line."""
    name, text = read_source(source)
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    start = next((i for i, (_, line) in enumerate(lines) if "index" in line.split(",")[0]), None)
    if start is None:
        raise fail(
            name, None, "no CSV header with an `index` column (use --format=csv, not noheader)"
        )
    header_line, header = lines[start]
    columns = [c.strip().split(" [")[0] for c in _fields(header, name, header_line)]
    if columns[0] != "index":
        raise fail(name, header_line, "expected the first column to be `index`")
    groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
    seen: set[int] = set()
    for lineno, line in lines[start + 1 :]:
        if line.lstrip().startswith("$"):
            break
        cells = [c.strip() for c in _fields(line, name, lineno)]
        if len(cells) != len(columns):
            raise fail(name, lineno, f"expected {len(columns)} fields, got {len(cells)}")
        if not (cells[0].isascii() and cells[0].isdigit() and len(cells[0]) <= 9):
            raise fail(name, lineno, f"index: expected a GPU index, got {cells[0]!r}")
        index = int(cells[0])
        if index in seen:
            raise fail(name, lineno, f"GPU index {index} is listed twice")
        seen.add(index)
        values = tuple(
            (_COLUMNS[col], cell)
            for col, cell in zip(columns, cells, strict=True)
            if col in _COLUMNS and cell.lower() not in _MISSING
        )
        groups.setdefault(values, []).append(index)
    if not seen:
        raise fail(name, header_line, "no GPU rows after the header")
    return [
        {"hosts": host, "gpus": sorted(indices), **dict(values)}
        for values, indices in groups.items()
        if values
    ]


def _fields(line: str, name: str, lineno: int) -> list[str]:
    """The fields of one CSV line; the csv module's own errors (a field over its size limit)
    as InvalidTopology naming the line."""
    try:
        return next(csv.reader(io.StringIO(line)), [])
    except csv.Error as exc:
        raise fail(name, lineno, f"not valid CSV: {exc}") from None
