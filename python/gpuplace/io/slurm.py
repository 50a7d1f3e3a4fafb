"""Reader of Slurm topology files: topology.conf (topology/tree and topology/block) and
topology.yaml (Slurm 25.05+, several named topologies in one YAML list).

Tree: a switch with ``Nodes=`` is a leaf; every other switch sits one level above its highest
child. Levels are named leaf, spine, core, then tierN. A host whose path up skips a level (an
unbalanced tree) takes the next switch up as its domain at the skipped level, so domains nest.
Block: each ``BlockName`` is a ``block`` domain; ``BlockSizes=8,16,32`` adds levels
``block16`` and ``block32`` that group consecutive blocks (in file order) as Slurm does.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from gpuplace._util.documents import parse_yaml
from gpuplace.errors import InvalidTopology
from gpuplace.io._common import MAX_NAMES, Source, expand_hostlist, fail, guarded, read_source
from gpuplace.model.inventory import Fabric, Host, Switch

__all__ = ["read_slurm_topology"]

_LEVEL_NAMES = ["leaf", "spine", "core"]
_KEY = re.compile(r"^([A-Za-z]+)=(.*)$")


@guarded
def read_slurm_topology(source: Source, *, topology: str | None = None) -> Fabric:
    """Read topology.conf or topology.yaml into a :class:`Fabric`.

    For topology.yaml, ``topology`` names the entry to read; by default the one with
    ``cluster_default: true``, else the first that is not flat."""
    fname, text = read_source(source)
    if _is_yaml(fname, text):
        return _read_yaml(fname, text, topology)
    switches: dict[str, dict] = {}
    blocks: list[tuple[str, list[str], int]] = []
    block_sizes: list[int] = []
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for token in line.split():
            m = _KEY.match(token)
            if not m:
                raise fail(fname, no, f"expected Key=Value, got {token!r}")
            key = m.group(1).lower()
            if key in fields:
                raise fail(fname, no, f"{m.group(1)} given twice on one line")
            fields[key] = m.group(2)
        if "switchname" in fields:
            unknown = set(fields) - {"switchname", "switches", "nodes", "linkspeed"}
            if unknown:
                raise fail(
                    fname,
                    no,
                    f"unexpected field(s) {sorted(unknown)} on a SwitchName line",
                )
            _add_switch(
                switches,
                fname,
                no,
                fields["switchname"],
                fields.get("nodes"),
                fields.get("switches"),
                fields.get("linkspeed"),
            )
        elif "blockname" in fields:
            unknown = set(fields) - {"blockname", "nodes"}
            if unknown:
                raise fail(
                    fname,
                    no,
                    f"unexpected field(s) {sorted(unknown)} on a BlockName line",
                )
            nodes = expand_hostlist(fields.get("nodes", ""), fname, no, "Nodes")
            if not nodes:
                raise fail(fname, no, f"block {fields['blockname']!r} has no Nodes=")
            blocks.append((fields["blockname"], nodes, no))
        elif "blocksizes" in fields:
            if len(fields) != 1:
                raise fail(fname, no, "BlockSizes= must stand alone on its line")
            block_sizes = _sizes(fields["blocksizes"].split(","), fname, no)
        else:
            raise fail(fname, no, "expected SwitchName=, BlockName= or BlockSizes=")
    if switches and blocks:
        raise fail(fname, None, "file mixes SwitchName (tree) and BlockName (block) lines")
    if switches:
        return _tree_fabric(fname, switches)
    if blocks:
        return _block_fabric(fname, blocks, block_sizes)
    raise fail(fname, None, "expected SwitchName= or BlockName= lines (Slurm topology.conf)")


def _is_yaml(fname: str, text: str) -> bool:
    if fname.endswith((".yaml", ".yml")):
        return True
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            return line.startswith(("-", "topology:"))
    return False


def _sizes(items: list, fname: str, no: int | None) -> list[int]:
    out = []
    for item in items:
        s = str(item).strip()
        if not s.isdigit() or not 0 < int(s) <= MAX_NAMES:
            raise fail(fname, no, f"BlockSizes: expected positive integers, got {s!r}")
        out.append(int(s))
    if out != sorted(set(out)):
        raise fail(fname, no, "BlockSizes: expected increasing sizes")
    return out


def _add_switch(
    switches: dict[str, dict[str, Any]],
    fname: str,
    no: int | None,
    name: str,
    nodes: str | None,
    children: str | None,
    speed: str | None,
) -> None:
    if not name or any(c in name for c in "[],"):
        raise fail(fname, no, f"SwitchName: expected one switch name, got {name!r}")
    if name in switches:
        raise fail(fname, no, f"switch {name!r} defined twice")
    if len(switches) >= MAX_NAMES:
        raise fail(fname, no, f"more than {MAX_NAMES} switches")
    switches[name] = {
        "nodes": expand_hostlist(nodes, fname, no, "Nodes") if nodes else [],
        "children": expand_hostlist(children, fname, no, "Switches") if children else [],
        "speed": speed,
        "line": no,
    }


def _tree_fabric(fname: str, switches: dict[str, dict]) -> Fabric:
    fabric = Fabric()
    parent: dict[str, str] = {}
    host_leaf: dict[str, str] = {}
    for name, sw in switches.items():
        for child in sw["children"]:
            if child not in switches:
                raise fail(fname, sw["line"], f"switch {name!r} lists unknown switch {child!r}")
            if child in parent:
                raise fail(
                    fname,
                    sw["line"],
                    f"switch {child!r} has two parents ({parent[child]!r} and {name!r}); "
                    "topology/tree needs a tree",
                )
            parent[child] = name
        for host in sw["nodes"]:
            if host in host_leaf:
                if host_leaf[host] != name:
                    fabric.warnings.append(
                        f"node {host} is under switches {host_leaf[host]} and {name}; "
                        f"the first is kept"
                    )
                continue
            host_leaf[host] = name
    if not host_leaf:
        raise fail(fname, None, "no switch lists Nodes=; no hosts")
    # Height: leaves 0, a switch one above its highest child. Iterative, cycle-safe.
    height: dict[str, int] = {}
    for start in switches:
        stack = [(start, False)]
        on_path: set[str] = set()
        while stack:
            node, done = stack.pop()
            if done:
                on_path.discard(node)
                kids = switches[node]["children"]
                height[node] = 1 + max(height[k] for k in kids) if kids else 0
                continue
            if node in height:
                continue
            if node in on_path:
                raise fail(
                    fname,
                    switches[node]["line"],
                    f"switch {node!r} is its own ancestor",
                )
            on_path.add(node)
            stack.append((node, True))
            stack.extend((k, False) for k in switches[node]["children"] if k not in height)
    depth = max(height.values())
    levels = [_LEVEL_NAMES[d] if d < len(_LEVEL_NAMES) else f"tier{d}" for d in range(depth + 1)]
    fabric.levels = levels
    for name, sw in switches.items():
        s = Switch(key=name, name=name, level=levels[height[name]], link_speed=sw["speed"])
        s.children = set(sw["children"])
        s.hosts = {h for h in sw["nodes"] if host_leaf.get(h) == name}
        if name in parent:
            s.parents = {parent[name]}
        fabric.switches[name] = s
    _link_speeds(fabric, switches, height, levels)
    for host, leaf in host_leaf.items():
        chain = [leaf]
        while chain[-1] in parent:
            chain.append(parent[chain[-1]])
        domains = {}
        k = 0
        for d, lv in enumerate(levels):
            while k + 1 < len(chain) and height[chain[k]] < d:
                k += 1
            domains[lv] = chain[k]
        fabric.hosts[host] = Host(host, domains=domains)
    return fabric


def _link_speeds(
    fabric: Fabric, switches: dict[str, dict], height: dict[str, int], levels: list[str]
) -> None:
    """A switch whose LinkSpeed is below the usual one of its level gets that fraction of its
    uplink capacity (Slurm's units are arbitrary: only ratios within a level mean anything)."""
    for d, level in enumerate(levels[:-1]):
        speeds: dict[str, float] = {}
        for name, sw in switches.items():
            if height[name] != d or sw["speed"] is None:
                continue
            try:
                speeds[name] = float(sw["speed"])
            except ValueError:
                fabric.warnings.append(f"switch {name}: LinkSpeed {sw['speed']!r} is not a number")
        if not speeds:
            continue
        usual = Counter(speeds.values()).most_common(1)[0][0]
        for name, speed in sorted(speeds.items()):
            if 0 < speed < usual:
                fabric.uplink_scale[f"{level}:{name}"] = speed / usual
        if fabric.uplink_scale:
            fabric.warnings.append(
                f"{level} switches with a LinkSpeed below the usual {usual:g}: "
                + ", ".join(k.partition(":")[2] for k in fabric.uplink_scale)
                + " (their uplink capacity is scaled down)"
            )


def _block_fabric(fname: str, blocks: list[tuple[str, list[str], int]], sizes: list[int]) -> Fabric:
    fabric = Fabric(levels=["block"], block_sizes=list(sizes))
    names = [b[0] for b in blocks]
    if len(set(names)) != len(names):
        raise fail(fname, None, "a BlockName appears twice")
    for bname, nodes, no in blocks:
        fabric.switches[bname] = Switch(key=bname, name=bname, level="block", hosts=set(nodes))
        for host in nodes:
            if host in fabric.hosts:
                raise fail(fname, no, f"node {host} is in two blocks")
            fabric.hosts[host] = Host(host, domains={"block": bname})
    if sizes:
        base = sizes[0]
        small = [b for b, nodes, _ in blocks if len(nodes) < base]
        if small:
            fabric.warnings.append(
                f"blocks smaller than the base block size {base}: {', '.join(small[:5])}"
            )
        for size in sizes[1:]:
            per = max(1, -(-size // base))
            level = f"block{size}"
            fabric.levels.append(level)
            for i in range(0, len(blocks), per):
                group = blocks[i : i + per]
                label = group[0][0] + (f"+{len(group) - 1}" if len(group) > 1 else "")
                for _b, nodes, _no in group:
                    for host in nodes:
                        fabric.hosts[host].domains[level] = label
    return fabric


def _read_yaml(fname: str, text: str, wanted: str | None) -> Fabric:
    doc = parse_yaml(text, fname, InvalidTopology)
    if isinstance(doc, dict):
        doc = [doc]
    if not isinstance(doc, list) or not doc or not all(isinstance(t, dict) for t in doc):
        raise fail(fname, None, "expected a YAML list of topologies (- topology: NAME ...)")
    chosen = None
    for entry in doc:
        if wanted is not None:
            if str(entry.get("topology")) == wanted:
                chosen = entry
                break
        elif entry.get("cluster_default") is True and not entry.get("flat"):
            chosen = entry
            break
    if chosen is None and wanted is None:
        chosen = next((e for e in doc if not e.get("flat")), None)
    if chosen is None:
        raise fail(
            fname,
            None,
            f"no topology {wanted!r} (or no tree/block topology) in the file",
        )
    tname = chosen.get("topology")
    kinds = [k for k in ("tree", "block", "flat") if k in chosen]
    if len(kinds) != 1:
        raise fail(
            fname,
            None,
            f"topology {tname!r}: expected exactly one of tree, block, flat",
        )
    if kinds[0] == "flat":
        raise fail(fname, None, f"topology {tname!r} is flat; it has no structure to read")
    body = chosen[kinds[0]]
    if not isinstance(body, dict):
        raise fail(fname, None, f"topology {tname!r}: {kinds[0]} must be a mapping")
    if kinds[0] == "tree":
        items = body.get("switches")
        if not isinstance(items, list) or not items:
            raise fail(fname, None, f"topology {tname!r}: tree needs a list of switches")
        switches: dict[str, dict] = {}
        for i, sw in enumerate(items):
            if not isinstance(sw, dict) or not isinstance(sw.get("switch"), (str, int)):
                raise fail(fname, None, f"topology {tname!r}: switches[{i}] needs switch: NAME")
            nodes, children = sw.get("nodes"), sw.get("children")
            for what, value in (("nodes", nodes), ("children", children)):
                if value is not None and not isinstance(value, str):
                    raise fail(fname, None, f"switches[{i}].{what}: expected a hostlist string")
            _add_switch(switches, fname, None, str(sw["switch"]), nodes, children, None)
        return _tree_fabric(fname, switches)
    items = body.get("blocks")
    if not isinstance(items, list) or not items:
        raise fail(fname, None, f"topology {tname!r}: block needs a list of blocks")
    blocks = []
    for i, b in enumerate(items):
        if not isinstance(b, dict) or not isinstance(b.get("block"), (str, int)):
            raise fail(fname, None, f"blocks[{i}]: expected block: NAME")
        if not isinstance(b.get("nodes"), str):
            raise fail(fname, None, f"blocks[{i}].nodes: expected a hostlist string")
        blocks.append((str(b["block"]), expand_hostlist(b["nodes"], fname, None, "nodes"), 0))
    sizes_raw = body.get("block_sizes") or []
    if not isinstance(sizes_raw, list):
        sizes_raw = [sizes_raw]
    return _block_fabric(fname, blocks, _sizes(sizes_raw, fname, None))
