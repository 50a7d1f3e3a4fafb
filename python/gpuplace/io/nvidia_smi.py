"""Reader of ``nvidia-smi topo -m`` (the GPUDirect topology matrix)."""

from __future__ import annotations

import re

from gpuplace.io._common import (
    MAX_DEVICES_PER_HOST,
    Source,
    fail,
    guarded,
    parse_id_list,
    read_source,
)
from gpuplace.model.inventory import NVLINK_GBPS_PER_LINK, PCIE_GBPS, NodeType

__all__ = ["gpu_generation_of", "read_nvidia_smi_topo"]

# Header tokens. The alternatives come first so that glued headers such as ``NIC8NIC9`` (seen
# in a real tab-separated output whose tabs were lost) still split into two columns.
_HEADER_TOKEN = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID|GPU\d+|NIC\d+|mlx\d+_\d+|\S+")
_TRAILING = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
# Cell classes; ``SOC`` is what drivers before 2017 printed for SYS.
_CELL = re.compile(r"X|NV\d{1,2}|PIX|PXB|PHB|NODE|SYS|SOC")
_GPU = re.compile(r"^GPU(\d+)$")
#: Closeness order used to pick a GPU's NIC (its rail).
_NIC_RANK = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4}
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
# ``nvidia-smi -L`` ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: ...)") and sglang/vLLM env dumps
# ("GPU 0,1,2,3: NVIDIA GB200") printed around the matrix name the GPUs.
_GPU_NAME = re.compile(r"^\s*GPU\s+([\d,\s-]+):\s*(.+?)\s*(?:\(UUID:.*)?$")


def gpu_generation_of(model: str) -> str | None:
    """GPU generation (a key of NVLINK_GBPS_PER_LINK, or ``ada``) from a product name."""
    m = model.upper()
    if re.search(r"\bG?B[123]00\b|\bRTX (PRO )?[56]\d{3}|\bRTX 50\d0\b|BLACKWELL", m):
        return "blackwell"
    if re.search(r"\bG?H[12]00\b|\bH[28]00\b|\bH20\b|HOPPER", m):
        return "hopper"
    if re.search(r"\bA[18]00\b", m):
        return "ampere"
    if re.search(r"\bA(10|16|30|40|6000|5000)\b|\bRTX 30\d0\b", m):
        return "ampere-sm86"
    if re.search(r"\bL4\b|\bL40S?\b|\bRTX 40\d0\b|\bRTX \d000 ADA\b", m):
        return "ada"
    if re.search(r"\bV100\b", m):
        return "volta"
    if re.search(r"\bP100\b", m):
        return "pascal"
    return None


@guarded
def read_nvidia_smi_topo(
    source: Source,
    *,
    name: str | None = None,
    gpu_model: str | None = None,
    gpu_generation: str | None = None,
    nvlink_domain_gpus: int | None = None,
) -> NodeType:
    """Read ``nvidia-smi topo -m`` output into a :class:`NodeType`.

    ``gpu_model`` or ``gpu_generation`` (pascal, volta, ampere, ampere-sm86, hopper,
    blackwell) fix the NVLink per-link rate; otherwise it comes from GPU names printed around
    the matrix, else it is guessed from the NV# counts (with a warning). ``nvlink_domain_gpus``
    says how many GPUs share one NVLink domain when that is more than the host (72 for a GB200
    NVL72 tray), since the matrix of one tray cannot show it.
    """
    fname, text = read_source(source)
    lines = text.splitlines()

    header_at = None
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("GPU0") and not _looks_like_row(stripped):
            header_at = i
            break
    if header_at is None:
        raise fail(
            fname,
            None,
            "expected a header line starting with GPU0 (nvidia-smi topo -m)",
        )
    header = _HEADER_TOKEN.findall(lines[header_at])
    trailing = [t for t in header if t in _TRAILING]
    devices = [t for t in header if t not in _TRAILING]
    if header[: len(devices)] != devices:
        raise fail(
            fname,
            header_at + 1,
            "expected device columns before CPU/NUMA affinity columns",
        )
    if len(set(devices)) != len(devices):
        raise fail(
            fname,
            header_at + 1,
            "expected distinct device columns; found a repeated name",
        )
    if len(devices) > 2 * MAX_DEVICES_PER_HOST:
        raise fail(
            fname,
            header_at + 1,
            f"{len(devices)} device columns; too many for one host",
        )
    gpu_cols = [d for d in devices if _GPU.match(d)]
    if not gpu_cols:
        raise fail(fname, header_at + 1, "expected at least one GPU column")
    for k, d in enumerate(devices[: len(gpu_cols)]):
        if d != f"GPU{k}":
            raise fail(
                fname,
                header_at + 1,
                f"expected GPU columns GPU0..GPU{len(gpu_cols) - 1} first, got {d}",
            )

    rows: dict[str, tuple[int, list[str], list[str]]] = {}
    ndev = len(devices)
    for i in range(header_at + 1, len(lines)):
        stripped = lines[i].strip()
        if not stripped:
            if rows:
                break
            continue
        if stripped.startswith("Legend"):
            break
        tokens = stripped.split()
        dev = tokens[0]
        if dev not in devices:
            raise fail(
                fname,
                i + 1,
                f"expected a row of one of the header devices, got {dev!r}",
            )
        if dev in rows:
            raise fail(fname, i + 1, f"row {dev} appears twice")
        cells: list[str] = []
        rest = tokens[1:]
        used = 0
        while len(cells) < ndev and used < len(rest):
            token = rest[used]
            pieces = _CELL.findall(token)
            if not pieces or "".join(pieces) != token:
                raise fail(
                    fname,
                    i + 1,
                    f"row {dev}: expected a link class (X, NV#, PIX, PXB, PHB, NODE, SYS), "
                    f"got {token!r}",
                )
            cells.extend(pieces)
            used += 1
        if len(cells) != ndev:
            raise fail(
                fname,
                i + 1,
                f"row {dev}: expected {ndev} link classes, got {len(cells)}",
            )
        rows[dev] = (i + 1, ["SYS" if c == "SOC" else c for c in cells], rest[used:])

    missing = [d for d in devices if d not in rows]
    if missing:
        raise fail(
            fname,
            None,
            f"expected a row for every device; missing {', '.join(missing)}",
        )
    for d in devices:
        line_no, cells, _ = rows[d]
        if cells[devices.index(d)] != "X":
            raise fail(fname, line_no, f"row {d}: expected X on the diagonal")
        for j, other in enumerate(devices):
            back = rows[other][1][devices.index(d)]
            if cells[j] != back:
                raise fail(
                    fname,
                    line_no,
                    f"matrix is not symmetric: {d}->{other} is {cells[j]} but "
                    f"{other}->{d} is {back}",
                )

    nic_names = _nic_legend(lines)
    nic_cols = devices[len(gpu_cols) :]
    nics = [nic_names.get(n, n) for n in nic_cols]

    ngpu = len(gpu_cols)
    node = NodeType(name=name or "node", gpus=ngpu)
    node.gpu_names = _gpu_names(lines, ngpu)
    node.gpu_model = gpu_model or (node.gpu_names[0] if node.gpu_names else None)
    generation = gpu_generation
    if generation is None and node.gpu_model:
        generation = gpu_generation_of(node.gpu_model)
    classes = [[rows[g][1][j] for j in range(ngpu)] for g in gpu_cols]
    nv_max = max((int(c[2:]) for row in classes for c in row if c.startswith("NV")), default=0)
    if generation is None:
        if nv_max >= 18:
            generation = "hopper"
        elif nv_max >= 12:
            generation = "ampere"
        elif nv_max > 0:
            generation = "volta"
        node.warnings.append(
            "GPU generation unknown; assumed "
            f"{generation or 'a PCIe Gen4 GPU'} from the NV# counts "
            "(pass gpu_model or gpu_generation to be exact)"
        )
    if generation is not None and generation not in NVLINK_GBPS_PER_LINK and generation != "ada":
        raise fail(fname, None, f"unknown GPU generation {generation!r}")
    node.gpu_generation = generation
    per_link = NVLINK_GBPS_PER_LINK.get(generation or "", 0.0)
    pcie = PCIE_GBPS.get(generation or "", 32.0)
    if nv_max and not per_link:
        raise fail(
            fname,
            None,
            f"GPU generation {generation!r} has no NVLink but the matrix shows NV#",
        )
    node.link_classes = classes
    node.bandwidth_gbps = [[_class_bandwidth(c, per_link, pcie) for c in row] for row in classes]

    # Trailing columns, in header order; a GPU row may carry fewer (N/A folded away by tabs).
    for g in gpu_cols:
        line_no, _, extra = rows[g]
        values = dict(zip(trailing, extra, strict=False))
        if len(extra) > len(trailing):
            raise fail(
                fname,
                line_no,
                f"row {g}: unexpected extra fields {extra[len(trailing) :]}",
            )
        cpu = values.get("CPU Affinity", "")
        if cpu:
            parse_id_list(cpu, fname, line_no, "CPU Affinity")
        node.cpu_affinity.append(cpu)
        numa_ids = parse_id_list(values.get("NUMA Affinity", ""), fname, line_no, "NUMA Affinity")
        node.numa.append(numa_ids[0] if numa_ids else None)

    node.nics = nics
    load = [0] * len(nics)
    for g in gpu_cols:
        cells = rows[g][1]
        best = None
        for n, col in enumerate(nic_cols):
            rank = _NIC_RANK[cells[devices.index(col)]]
            key = (rank, load[n], n)
            if rank < _NIC_RANK["SYS"] and (best is None or key < best[0]):
                best = (key, n)
        node.gpu_nic.append(best[1] if best else None)
        if best:
            load[best[1]] += 1

    if nvlink_domain_gpus is not None:
        if nvlink_domain_gpus < ngpu or nvlink_domain_gpus % ngpu:
            raise fail(
                fname,
                None,
                f"nvlink_domain_gpus={nvlink_domain_gpus} must be a multiple of the "
                f"{ngpu} GPUs of one host",
            )
        node.nvlink_domain_gpus = nvlink_domain_gpus
    elif node.gpu_model and re.search(r"GB[23]00", node.gpu_model.upper()):
        node.warnings.append(
            f"{node.gpu_model}: the NVLink domain usually spans the rack (NVL72); "
            "pass nvlink_domain_gpus to say so"
        )
    if name is None and node.gpu_model:
        node.name = re.sub(r"[^a-z0-9]+", "-", node.gpu_model.lower()).strip("-") + f"-x{ngpu}"
    return node


def _looks_like_row(stripped: str) -> bool:
    tokens = stripped.split()
    return len(tokens) > 1 and bool(_CELL.fullmatch(tokens[1]))


def _class_bandwidth(cls: str, per_link: float, pcie: float) -> float:
    if cls == "X":
        return 0.0
    if cls.startswith("NV"):
        return round(int(cls[2:]) * per_link, 3)
    if cls == "SYS":
        # Crossing the inter-socket link: NCCL models it well below PCIe (QPI/UPI 6-40 GB/s);
        # half the PCIe rate is our documented heuristic.
        return pcie / 2
    return pcie


def _nic_legend(lines: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    in_legend = False
    for line in lines:
        if line.strip().startswith("NIC Legend"):
            in_legend = True
            continue
        if in_legend:
            m = _NIC_LEGEND.match(line)
            if m:
                out[m.group(1)] = m.group(2)
            elif line.strip():
                break
    return out


def _gpu_names(lines: list[str], ngpu: int) -> list[str]:
    names: dict[int, str] = {}
    for line in lines:
        m = _GPU_NAME.match(line)
        if not m:
            continue
        model = m.group(2)
        if "Compute Capability" in line or not re.search(r"[A-Za-z]", model):
            continue
        for part in m.group(1).split(","):
            part = part.strip()
            if part.isdigit() and int(part) < ngpu:
                names[int(part)] = model
    return [names[i] for i in range(ngpu)] if len(names) == ngpu else []
