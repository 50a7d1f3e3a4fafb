"""Writers from the native topology dictionary to other tools' formats."""

from __future__ import annotations

import re

from gpuplace.errors import InvalidTopology
from gpuplace.hostlist import compress, expand

__all__ = ["write_slurm_topology"]

# Characters topology.conf cannot carry in a switch/block name (they split fields, start
# comments, or are hostlist syntax).
_UNSAFE = re.compile(r"[\s=#,\[\]]")


def _slurm_name(name: str) -> str:
    return _UNSAFE.sub("_", name) or "_"


def _hosts(topo: dict) -> list[tuple[str, dict]]:
    out = []
    for i, node in enumerate(topo.get("nodes") or []):
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            raise InvalidTopology(f"nodes[{i}]: expected a name")
        domains = node.get("domains") or {}
        for host in expand(node["name"]):
            out.append((host, domains))
    return out


def _levels_above_node(topo: dict) -> list[str]:
    names = [lv["name"] for lv in topo.get("levels") or []]
    node_level = topo.get("node_level", names[0] if names else "node")
    if node_level not in names:
        raise InvalidTopology(f"node_level {node_level!r} is not a level")
    return names[names.index(node_level) + 1 :]


def write_slurm_topology(topo_dict: dict, mode: str = "tree", *, level: str | None = None) -> str:
    """Render a native topology dictionary as Slurm topology.conf text.

    ``mode="tree"``: one ``SwitchName`` line per domain of every level above the node,
    leaves (with ``Nodes=``) first, parents (with ``Switches=``) after. A domain name used at
    two levels is suffixed with ``-LEVEL`` to keep switch names unique.

    ``mode="block"``: one ``BlockName`` line per domain of ``level`` (default: ``block`` if
    present, else the NVLink-domain level if above the node, else the lowest level above the
    node); levels named ``blockN`` become ``BlockSizes=base,N,...``."""
    above = _levels_above_node(topo_dict)
    hosts = _hosts(topo_dict)
    if not above:
        raise InvalidTopology("the topology has no level above the node; nothing to write")
    lines: list[str] = []
    if mode == "tree":
        seen: dict[str, set[str]] = {}
        for lv in above:
            for _, d in hosts:
                if lv not in d:
                    raise InvalidTopology(f"a host has no {lv!r} domain")
                seen.setdefault(str(d[lv]), set()).add(lv)

        def sw(lv: str, dom: str) -> str:
            base = _slurm_name(str(dom))
            return base if len(seen[str(dom)]) == 1 else f"{base}-{lv}"

        for k, lv in enumerate(above):
            children: dict[str, list[str]] = {}
            for host, d in hosts:
                key = sw(lv, d[lv])
                child = host if k == 0 else sw(above[k - 1], d[above[k - 1]])
                lst = children.setdefault(key, [])
                if child not in lst:
                    lst.append(child)
            field = "Nodes" if k == 0 else "Switches"
            for key, kids in children.items():
                lines.append(f"SwitchName={key} {field}={compress(kids)}")
        return "\n".join(lines) + "\n"
    if mode == "block":
        if level is None:
            nv = topo_dict.get("nvlink_domain")
            level = "block" if "block" in above else (nv if nv in above else above[0])
        if level not in above:
            raise InvalidTopology(f"level {level!r} is not above the node level")
        blocks: dict[str, list[str]] = {}
        for host, d in hosts:
            blocks.setdefault(_slurm_name(str(d[level])), []).append(host)
        for name, members in blocks.items():
            lines.append(f"BlockName={name} Nodes={compress(members)}")
        sizes = sorted(int(lv[5:]) for lv in above if re.fullmatch(r"block\d+", lv))
        if sizes:
            base = min(len(m) for m in blocks.values())
            lines.append("BlockSizes=" + ",".join(str(s) for s in [base, *sizes]))
        return "\n".join(lines) + "\n"
    raise InvalidTopology(f'mode must be "tree" or "block", got {mode!r}')
