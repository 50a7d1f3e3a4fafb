"""Reader of ``ibnetdiscover`` (InfiniBand fabric dump: Switch and Ca blocks with port lines).

Levels are inferred from the switch graph: a switch with a host CA on a port is a leaf; the
others get their level from their distance to the nearest leaf (1 spine, 2 core, then tierN).
Multi-rail hosts (one HCA per rail, each on a different leaf) are grouped by host name, the
first word of the CA's node description. In a rail-optimized fabric a host touches several
leaves, so the host's ``leaf`` domain is the *scalable unit*: the set of leaves joined by
serving the same hosts (union of the leaves each host's rails reach). Higher domains are the
unions of lower domains that share a switch of that level, so domains always nest.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter

from gpuplace.io._common import MAX_NAMES, Source, fail, guarded, read_source
from gpuplace.model.inventory import Fabric, Host, Link, Switch, ib_rate_gbit

__all__ = ["read_ibnetdiscover"]

_NODE = re.compile(r'^(Switch|Ca|Rt)\s+(\d+)\s+"([^"]+)"\s*(?:#\s*"(.*?)"(?=\s|$)(.*))?$')
# [port](ext)? "peer"[peerport](ext)?(peer port guid)?  # "peer description" lid N 4xNDR
_SWITCH_PORT = re.compile(
    r'^\[(\d+)\](?:\[ext \d+\])?\s*"([^"]+)"\[(\d+)\](?:\[ext \d+\])?'
    r'(?:\(([0-9a-fA-FxX.]+)\))?\s*(?:#\s*"(.*)"(.*))?$'
)
# [port](own port guid)  "peer"[peerport]  # lid N lmc M "peer description" lid N 4xNDR
_CA_PORT = re.compile(
    r'^\[(\d+)\](?:\(([0-9a-fA-FxX.]+)\))?\s*"([^"]+)"\[(\d+)\](?:\[ext \d+\])?\s*(?:#(.*))?$'
)
_RATE = re.compile(r"(\d{1,2}x[A-Z0-9]+)\s*$")
_HEADER_KV = re.compile(r"^(vendid|devid|sysimgguid|switchguid|caguid|routerguid)=\S*$")
#: CA descriptions that are not hosts: SHARP aggregation nodes live inside switches.
_NOT_A_HOST = re.compile(r"Aggregation Node", re.IGNORECASE)
#: Descriptions the driver sets when no host name was configured (e.g. "MT4129 ConnectX7
#: Mellanox Technologies", "MT23108 InfiniHost Mellanox Technologies").
_DEFAULT_DESC = re.compile(r"^(MT\d+\b|Mellanox Technologies\b)|^\s*$", re.IGNORECASE)
_ANONYMOUS_HOSTS = {"localhost", "localhost.localdomain", "(none)"}
_LEVEL_NAMES = ["leaf", "spine", "core"]
_MAX_PORTS = 4096


class _Node:
    __slots__ = ("desc", "key", "kind", "line", "ports")

    def __init__(self, kind: str, key: str, desc: str, line: int):
        self.kind, self.key, self.desc, self.line = kind, key, desc, line
        # port -> (peer key, peer port, rate, peer description)
        self.ports: dict[int, tuple[str, int, str | None, str | None]] = {}


@guarded
def read_ibnetdiscover(source: Source) -> Fabric:
    """Read ``ibnetdiscover`` output into a :class:`Fabric` (see the module docstring)."""
    fname, text = read_source(source)
    nodes: dict[str, _Node] = {}
    warnings: list[str] = []
    current: _Node | None = None
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            current = None
            continue
        if line.startswith("#") or _HEADER_KV.match(line):
            continue
        if line in ("Non-Chassis Nodes",) or line.startswith(("Chassis ", "Non-Chassis")):
            continue
        m = _NODE.match(line)
        if m:
            kind, nports, key, desc = (
                m.group(1),
                int(m.group(2)),
                m.group(3),
                m.group(4),
            )
            if nports > _MAX_PORTS:
                raise fail(
                    fname,
                    no,
                    f"{kind} {key} claims {nports} ports; at most {_MAX_PORTS}",
                )
            if key in nodes:
                n = 2
                while f"{key}#{n}" in nodes:
                    n += 1
                warnings.append(
                    f"line {no}: node {key} declared twice (redacted or truncated GUIDs?); "
                    f"the second is kept as {key}#{n} and links naming {key} go to the first"
                )
                key = f"{key}#{n}"
            if len(nodes) >= MAX_NAMES:
                raise fail(fname, no, f"more than {MAX_NAMES} fabric nodes")
            current = _Node(kind, key, (desc or "").strip(), no)
            nodes[key] = current
            continue
        if line.startswith("["):
            if current is None:
                raise fail(fname, no, "port line outside a Switch or Ca block")
            if current.kind == "Switch":
                pm = _SWITCH_PORT.match(line)
                if not pm:
                    raise fail(
                        fname,
                        no,
                        'expected [port] "peer"[port] # "description" ... rate',
                    )
                port, peer, peer_port = int(pm.group(1)), pm.group(2), int(pm.group(3))
                peer_desc = pm.group(5)
                rate_m = _RATE.search(pm.group(6) or "")
            else:
                pm = _CA_PORT.match(line)
                if not pm:
                    raise fail(fname, no, 'expected [port](guid) "peer"[port] # ... rate')
                port, peer, peer_port = int(pm.group(1)), pm.group(3), int(pm.group(4))
                comment = pm.group(5) or ""
                dm = re.search(r'"(.*)"', comment)
                peer_desc = dm.group(1) if dm else None
                rate_m = _RATE.search(comment)
            if port > _MAX_PORTS or peer_port > _MAX_PORTS:
                raise fail(fname, no, f"port number above {_MAX_PORTS}")
            if port in current.ports:
                raise fail(fname, no, f"port {port} of {current.key} listed twice")
            current.ports[port] = (
                peer,
                peer_port,
                rate_m.group(1) if rate_m else None,
                peer_desc,
            )
            continue
        raise fail(fname, no, f"expected a Switch/Ca block or a port line, got {line[:60]!r}")

    if not nodes:
        raise fail(
            fname,
            None,
            "expected at least one Switch or Ca block (ibnetdiscover output)",
        )
    return _build_fabric(fname, nodes, warnings)


def _clean_switch_name(desc: str) -> str:
    # "MF0;A09-P1-IBLEAF-04-04:MQM9701/U1" -> "A09-P1-IBLEAF-04-04"
    name = re.sub(r"^MF0;", "", desc.strip())
    if ":" in name:
        name = name.split(":", 1)[0]
    return re.sub(r"\s+", "_", name)


def _build_fabric(fname: str, nodes: dict[str, _Node], warnings: list[str]) -> Fabric:
    fabric = Fabric(warnings=warnings)
    # Peers only seen from the other end (truncated dump) still count, with the description
    # the other end printed.
    seen_desc: dict[str, str] = {}
    for node in nodes.values():
        for peer, _pp, _rate, pdesc in node.ports.values():
            if peer not in nodes and pdesc:
                seen_desc.setdefault(peer, pdesc)
    undeclared = set()
    for node in nodes.values():
        for peer, *_ in node.ports.values():
            if peer not in nodes:
                undeclared.add(peer)
    for peer in sorted(undeclared):
        kind = "Switch" if peer.startswith("S-") else "Ca"
        nodes[peer] = _Node(kind, peer, seen_desc.get(peer, ""), 0)
    if undeclared:
        warnings.append(
            f"{len(undeclared)} fabric nodes are named by a port line but have no block of "
            f"their own (truncated dump?): {', '.join(sorted(undeclared)[:5])}"
            + (" ..." if len(undeclared) > 5 else "")
        )

    # Cables, each once (both ends print it).
    cables: dict[frozenset, Link] = {}
    for node in nodes.values():
        for port, (peer, peer_port, rate, _d) in node.ports.items():
            key = frozenset([(node.key, port), (peer, peer_port)])
            if key in cables:
                # Both ends print the cable; they can disagree (the SDR man-page sample shows
                # 4xSDR on one end, 1xSDR on the other). The slower end is what the link runs at.
                known = cables[key]
                gbit = ib_rate_gbit(rate) if rate else None
                if rate and (known.rate is None or (gbit or 0.0) < (known.gbit or 0.0)):
                    known.rate, known.gbit = rate, gbit
                continue
            cables[key] = Link(
                node.key,
                port,
                peer,
                peer_port,
                rate,
                ib_rate_gbit(rate) if rate else None,
            )
    links = list(cables.values())
    fabric.links = links

    widths = Counter(lk.rate for lk in links if lk.rate)
    if widths:
        usual_rate = widths.most_common(1)[0][0]
        usual_gbit = ib_rate_gbit(usual_rate) or 0.0
        for lk in links:
            if lk.rate and lk.rate != usual_rate and (lk.gbit or 0.0) < usual_gbit:
                lk.degraded = True
                fabric.degraded_links.append(lk)
        if fabric.degraded_links:
            warnings.append(
                f"{len(fabric.degraded_links)} links run below the fabric's usual {usual_rate}: "
                + ", ".join(
                    f"{lk.a}[{lk.a_port}]-{lk.b}[{lk.b_port}] {lk.rate}"
                    for lk in fabric.degraded_links[:5]
                )
            )
    pairs = Counter(frozenset((lk.a, lk.b)) for lk in links if lk.a != lk.b)
    for pair, count in pairs.items():
        if count > 1:
            a, b = sorted(pair)
            fabric.parallel_links.append((a, b, count))
    fabric.parallel_links.sort()

    switches = {k for k, n in nodes.items() if n.kind == "Switch"}
    cas = {k for k, n in nodes.items() if n.kind in ("Ca", "Rt")}
    adjacency: dict[str, set[str]] = {k: set() for k in nodes}
    for lk in links:
        if lk.a in adjacency and lk.b in adjacency and lk.a != lk.b:
            adjacency[lk.a].add(lk.b)
            adjacency[lk.b].add(lk.a)

    # -- which CAs are hosts ------------------------------------------------------------------
    sharp = [k for k in cas if _NOT_A_HOST.search(nodes[k].desc)]
    if sharp:
        warnings.append(f"{len(sharp)} SHARP aggregation nodes are not hosts; ignored")
    host_of: dict[str, tuple[str, str]] = {}  # CA -> (host name, NIC label)
    unnamed: list[str] = []
    for ca in sorted(cas):
        desc = nodes[ca].desc
        if ca in sharp:
            continue
        words = desc.split()
        if not words or _DEFAULT_DESC.match(desc) or words[0].lower() in _ANONYMOUS_HOSTS:
            unnamed.append(ca)
            continue
        host_of[ca] = (words[0], " ".join(words[1:]) or ca)
    if unnamed:
        if host_of:
            warnings.append(
                f"{len(unnamed)} CAs carry no host name (default description such as "
                f"{nodes[unnamed[0]].desc!r}); they cannot be grouped into hosts and are left "
                f"out: {', '.join(unnamed[:5])}" + (" ..." if len(unnamed) > 5 else "")
            )
        else:
            warnings.append(
                f"no CA carries a host name; each of the {len(unnamed)} CAs becomes a host "
                "named by its GUID"
            )
            for ca in unnamed:
                host_of[ca] = (ca, ca)

    # -- switch levels ------------------------------------------------------------------------
    leaves = {s for s in switches if any(p in host_of for p in adjacency[s])}
    if not leaves:
        raise fail(fname, None, "no switch has a host attached; cannot infer leaves")
    distance = {s: 0 for s in leaves}
    frontier = sorted(leaves)
    while frontier:
        nxt = []
        for s in frontier:
            for p in sorted(adjacency[s]):
                if p in switches and p not in distance:
                    distance[p] = distance[s] + 1
                    nxt.append(p)
        frontier = nxt
    stray = switches - set(distance)
    if stray:
        warnings.append(
            f"{len(stray)} switches are not connected to any leaf; ignored: "
            + ", ".join(sorted(stray)[:5])
        )
    depth = max(distance.values())
    level_names = [
        _LEVEL_NAMES[d] if d < len(_LEVEL_NAMES) else f"tier{d}" for d in range(depth + 1)
    ]
    fabric.levels = level_names

    names = {s: _clean_switch_name(nodes[s].desc) or s for s in distance}
    dup = Counter(names.values())
    names = {s: (s if dup[n] > 1 or not n else n) for s, n in names.items()}
    for s, d in distance.items():
        sw = Switch(key=s, name=names[s], level=level_names[d])
        for p in adjacency[s]:
            if p in distance:
                if distance[p] > d:
                    sw.parents.add(p)
                elif distance[p] < d:
                    sw.children.add(p)
            elif p in host_of:
                sw.hosts.add(host_of[p][0])
        fabric.switches[s] = sw

    # -- hosts and their rails ----------------------------------------------------------------
    host_leaves: dict[str, set[str]] = {}
    for ca, (host, nic) in sorted(host_of.items(), key=lambda kv: (kv[1][0], kv[1][1])):
        h = fabric.hosts.setdefault(host, Host(host))
        attached = sorted(p for p in adjacency[ca] if p in leaves)
        if not attached:
            warnings.append(f"CA {ca} ({nodes[ca].desc}) is not cabled to a leaf; ignored")
            continue
        for leaf in attached:
            h.rails.append((nic, leaf))
            host_leaves.setdefault(host, set()).add(leaf)
    for host in [h for h, v in fabric.hosts.items() if not v.rails]:
        del fabric.hosts[host]
    if not fabric.hosts:
        raise fail(fname, None, "no host is cabled to a leaf switch")
    fabric.hosts = dict(sorted(fabric.hosts.items()))
    usual_rails = Counter(len(h.rails) for h in fabric.hosts.values()).most_common(1)[0][0]
    odd = [h for h, v in fabric.hosts.items() if len(v.rails) != usual_rails]
    if odd:
        warnings.append(
            f"{len(odd)} hosts have a rail count other than the usual {usual_rails} (missing "
            f"cables, unnamed HCAs, or not GPU hosts such as UFM/storage servers): "
            + ", ".join(odd[:8])
            + (" ..." if len(odd) > 8 else "")
        )

    # Host port rate: the most common rate on host cables.
    host_rates = Counter(
        lk.gbit for lk in links if lk.gbit and ((lk.a in host_of) != (lk.b in host_of))
    )
    if host_rates:
        fabric.host_link_gbit = host_rates.most_common(1)[0][0]

    # -- domains: leaf = scalable unit, higher = unions sharing a switch of that level --------
    parent = {s: s for s in distance}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for ls in host_leaves.values():
        first = min(ls)
        for other in ls:
            union(first, other)
    unit_of_leaf = {leaf: find(leaf) for leaf in leaves}
    groups_at: list[dict[str, str]] = [unit_of_leaf]  # per level: leaf -> group representative
    for d in range(1, depth + 1):
        prev = groups_at[-1]
        rep = {leaf: prev[leaf] for leaf in leaves}
        parent_d = {g: g for g in set(rep.values())}

        def find_d(x: str, parent_d: dict[str, str] = parent_d) -> str:
            while parent_d[x] != x:
                parent_d[x] = parent_d[parent_d[x]]
                x = parent_d[x]
            return x

        # A switch at level d joins every lower group that reaches it.
        reach: dict[str, set[str]] = {}
        for leaf in leaves:
            for top in _ancestors_at(leaf, d, distance, adjacency):
                reach.setdefault(top, set()).add(rep[leaf])
        for joined in reach.values():
            ms = sorted(joined)
            for other in ms[1:]:
                ra, rb = find_d(ms[0]), find_d(other)
                if ra != rb:
                    parent_d[max(ra, rb)] = min(ra, rb)
        groups_at.append({leaf: find_d(rep[leaf]) for leaf in leaves})

    leaf_domain: dict[str, str] = {}
    for level_idx, mapping in enumerate(groups_at):
        members: dict[str, list[str]] = {}
        for leaf, g in mapping.items():
            members.setdefault(g, []).append(leaf)
        label: dict[str, str] = {}
        for g, group_leaves in members.items():
            if level_idx == 0:
                ordered = sorted(names[x] for x in group_leaves)
            else:
                tops = sorted(
                    {
                        names[s]
                        for x in group_leaves
                        for s in _ancestors_at(x, level_idx, distance, adjacency)
                    }
                ) or sorted(names[x] for x in group_leaves)
                ordered = tops
            label[g] = ordered[0] + (f"+{len(ordered) - 1}" if len(ordered) > 1 else "")
        lv = level_names[level_idx]
        if level_idx == 0:
            leaf_domain = {leaf: label[g] for leaf, g in mapping.items()}
        for host, ls in host_leaves.items():
            if host in fabric.hosts:
                fabric.hosts[host].domains[lv] = label[mapping[min(ls)]]

    # -- uplink/downlink ratio into each level above the leaves -------------------------------
    # The level's ratio is the usual one (the median over its switches); a leaf domain whose
    # switches have less (a slow or missing cable) gets its own uplink capacity, so one bad
    # cable lowers that switch's uplink, not every GPU's bandwidth at the level.
    leaf_up: dict[str, float] = {}
    leaf_down: dict[str, float] = {}
    for d in range(1, depth + 1):
        ratios = []
        for s, ds in distance.items():
            if ds != d - 1:
                continue
            up_gbit = down_gbit = 0.0
            for lk in links:
                if s not in (lk.a, lk.b) or lk.a == lk.b:
                    continue
                other = lk.b if lk.a == s else lk.a
                gbit = lk.gbit or 0.0
                if other in distance and distance[other] > ds:
                    up_gbit += gbit
                elif (other in distance and distance[other] < ds) or (
                    d == 1 and other in cas and other not in sharp
                ):
                    down_gbit += gbit
            if down_gbit > 0:
                ratios.append(up_gbit / down_gbit)
            if d == 1 and s in leaf_domain:
                dom = leaf_domain[s]
                leaf_up[dom] = leaf_up.get(dom, 0.0) + up_gbit
                leaf_down[dom] = leaf_down.get(dom, 0.0) + down_gbit
        if ratios:
            usual = min(1.0, statistics.median(ratios))
            fabric.oversubscription[level_names[d]] = usual
            if d == 1:
                for dom, dom_up in sorted(leaf_up.items()):
                    dom_down = leaf_down.get(dom, 0.0)
                    if dom_down > 0 and dom_up / dom_down < usual * (1 - 1e-9):
                        # Gbit/s of cables -> GB/s, each direction.
                        fabric.uplink_gbps[f"{level_names[0]}:{dom}"] = round(dom_up / 8, 3)
                if fabric.uplink_gbps:
                    warnings.append(
                        f"{len(fabric.uplink_gbps)} {level_names[0]} domain(s) have less "
                        f"uplink than the usual ratio {usual:.3g}: "
                        + ", ".join(f"{k} {v:g} GB/s" for k, v in fabric.uplink_gbps.items())
                    )
    return fabric


def _ancestors_at(
    leaf: str, d: int, distance: dict[str, int], adjacency: dict[str, set[str]]
) -> set[str]:
    """Switches at distance ``d`` reachable from ``leaf`` going strictly upward."""
    current = {leaf}
    for step in range(1, d + 1):
        current = {p for s in current for p in adjacency[s] if distance.get(p) == step}
    return current
