"""Reader of ``rocm-smi --showtopo`` (weight, hops and link-type matrices, NUMA nodes)."""

from __future__ import annotations

import re

from gpuplace.io._common import MAX_DEVICES_PER_HOST, Source, fail, guarded, read_source
from gpuplace.model.inventory import NodeType

__all__ = ["read_rocm_smi_topo"]


def _section(line: str) -> str | None:
    """The title of a ``==== Weight between two GPUs ====`` line (stripped), or None: what
    ``^=+\\s*(.*?)\\s*=+\\s*$`` matches, without its cubic backtracking on a long line of
    spaces."""
    if len(line) < 2 or line[0] != "=" or line[-1] != "=":
        return None
    return line.strip("=").strip()


_KINDS = {
    "weight between two gpus": "weight",
    "hops between two gpus": "hops",
    "link type between two gpus": "type",
    "numa nodes": "numa",
}
_NUMA_LINE = re.compile(
    r"^GPU\s*\[?\s*(\d+)\s*\]?\s*:\s*\(Topology\)\s*Numa (Node|Affinity)\s*:\s*(-?\d+|N/A)\s*$"
)
#: The KFD io_link weight of one xGMI hop (amdsmi docs: "each physical xGMI hop contributes
#: 15"); PCIe segments add 20 each, so weight-only outputs are classified by divisibility.
_XGMI_HOP_WEIGHT = 15


@guarded
def read_rocm_smi_topo(
    source: Source,
    *,
    name: str | None = None,
    gpu_model: str | None = None,
    xgmi_gbps: float = 64.0,
    pcie_gbps: float = 32.0,
) -> NodeType:
    """Read ``rocm-smi --showtopo`` (or any of --showtopoweight/-hops/-type/-numa) output.

    Bandwidth per GPU pair and direction: a direct xGMI link (weight 15, hops 1) gets
    ``xgmi_gbps`` (64 GB/s per link and direction on MI300X); an xGMI path of k hops (weight
    15k, as on MI250X) gets ``xgmi_gbps / k``; PCIe gets ``pcie_gbps``, halved when hops say
    the path crosses CPU sockets (3). When only the weight matrix is present the link type is
    inferred from the weight (a multiple of 15 is xGMI), with a warning."""
    fname, text = read_source(source)
    lines = text.splitlines()
    matrices: dict[str, tuple[int, list[list[str]]]] = {}
    numa: dict[int, int | None] = {}
    kind = None
    i = 0
    while i < len(lines):
        line = lines[i]
        title = _section(line.strip())
        if title is not None:
            kind = _KINDS.get(title.lower())
            i += 1
            if kind in ("weight", "hops", "type"):
                start = i
                rows, i = _matrix(lines, i, fname)
                if kind in matrices:
                    raise fail(fname, start + 1, f"second {title!r} matrix")
                matrices[kind] = (start + 1, rows)
            continue
        if kind == "numa" and line.strip():
            nm = _NUMA_LINE.match(line.strip())
            if not nm:
                raise fail(fname, i + 1, "expected 'GPU[n] : (Topology) Numa Node: k'")
            gpu = int(nm.group(1))
            if gpu >= MAX_DEVICES_PER_HOST:
                raise fail(fname, i + 1, f"GPU index {gpu} is implausibly large")
            if nm.group(2) == "Node":
                numa[gpu] = None if nm.group(3) in ("N/A", "-1") else int(nm.group(3))
        i += 1

    if not matrices:
        raise fail(fname, None, "expected a 'Weight/Hops/Link Type between two GPUs' matrix")
    sizes = {k: len(rows) for k, (_, rows) in matrices.items()}
    if len(set(sizes.values())) != 1:
        raise fail(fname, None, f"matrices disagree on the GPU count: {sizes}")
    ngpu = next(iter(sizes.values()))
    if ngpu == 0:
        raise fail(fname, None, "expected at least one GPU row")

    node = NodeType(name=name or f"amd-x{ngpu}", gpus=ngpu, gpu_model=gpu_model)
    weight = _ints(matrices.get("weight"), fname)
    hops = _ints(matrices.get("hops"), fname)
    types = matrices.get("type")
    if types is not None:
        line0, rows = types
        for r, cells in enumerate(rows):
            for c, cell in enumerate(cells):
                expect_diag = r == c
                if expect_diag and cell not in ("0", "X"):
                    raise fail(fname, line0 + 1 + r, "expected 0 on the link-type diagonal")
                if not expect_diag and cell not in ("XGMI", "PCIE"):
                    raise fail(fname, line0 + 1 + r, f"expected XGMI or PCIE, got {cell!r}")
        classes = [["X" if r == c else rows[r][c] for c in range(ngpu)] for r in range(ngpu)]
    else:
        if weight is None:
            raise fail(fname, None, "expected a link-type or a weight matrix")
        classes = [
            [
                "X" if r == c else ("XGMI" if weight[r][c] % _XGMI_HOP_WEIGHT == 0 else "PCIE")
                for c in range(ngpu)
            ]
            for r in range(ngpu)
        ]
        node.warnings.append("no link-type matrix; XGMI/PCIE inferred from the weights")
    for r in range(ngpu):
        for c in range(ngpu):
            if classes[r][c] != classes[c][r]:
                raise fail(fname, None, f"link types not symmetric between GPU{r} and GPU{c}")
    node.link_classes = classes

    bw: list[list[float]] = []
    for r in range(ngpu):
        row: list[float] = []
        for c in range(ngpu):
            if r == c:
                row.append(0.0)
            elif classes[r][c] == "XGMI":
                k = weight[r][c] // _XGMI_HOP_WEIGHT if weight and weight[r][c] > 0 else 1
                row.append(round(xgmi_gbps / max(k, 1), 3))
            else:
                crosses = hops is not None and hops[r][c] >= 3
                row.append(pcie_gbps / 2 if crosses else pcie_gbps)
        bw.append(row)
    node.bandwidth_gbps = bw
    node.numa = [numa.get(g) for g in range(ngpu)]
    return node


def _matrix(lines: list[str], i: int, fname: str) -> tuple[list[list[str]], int]:
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines):
        raise fail(fname, i, "expected a GPU header line after the section title")
    header = lines[i].split()
    if not header or any(h != f"GPU{k}" for k, h in enumerate(header)):
        raise fail(fname, i + 1, "expected a header GPU0 GPU1 ... in order")
    if len(header) > MAX_DEVICES_PER_HOST:
        raise fail(fname, i + 1, "too many GPU columns")
    rows: list[list[str]] = []
    i += 1
    while i < len(lines) and lines[i].strip() and not lines[i].strip().startswith("="):
        tokens = lines[i].split()
        if tokens[0] != f"GPU{len(rows)}":
            raise fail(fname, i + 1, f"expected row GPU{len(rows)}, got {tokens[0]!r}")
        if len(tokens) - 1 != len(header):
            raise fail(fname, i + 1, f"expected {len(header)} values, got {len(tokens) - 1}")
        rows.append(tokens[1:])
        i += 1
    if len(rows) != len(header):
        raise fail(fname, i + 1, f"expected {len(header)} rows, got {len(rows)}")
    return rows, i


def _ints(entry: tuple[int, list[list[str]]] | None, fname: str) -> list[list[int]] | None:
    if entry is None:
        return None
    line0, rows = entry
    out = []
    for r, row in enumerate(rows):
        vals = []
        for cell in row:
            if not cell.isdigit() or len(cell) > 9:
                raise fail(
                    fname,
                    line0 + 1 + r,
                    f"expected a non-negative integer, got {cell!r}",
                )
            vals.append(int(cell))
        out.append(vals)
    for r in range(len(out)):
        for c in range(len(out)):
            if out[r][c] != out[c][r]:
                raise fail(fname, line0 + 1 + r, f"matrix not symmetric at GPU{r}/GPU{c}")
    return out
