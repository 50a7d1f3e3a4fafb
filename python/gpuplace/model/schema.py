"""Validation of the native topology form (``docs/topology-format.md``): every field is
checked and a bad one raises :class:`gpuplace.InvalidTopology` naming the file and field."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuplace._util.documents import Checker, describe
from gpuplace._util.hostlist import HostlistError, expand
from gpuplace.errors import InvalidJob, InvalidTopology
from gpuplace.model.parts import ALGORITHMS, FORMAT, ROUTINGS, TRANSPORTS, Level, NodeType
from gpuplace.model.policy import ClusterPolicy
from gpuplace.model.power import BOARD_POWER_W, gpu_power_w, parse_power_domains
from gpuplace.model.storage import parse_stores, store_attachment

if TYPE_CHECKING:
    from gpuplace.model.topology import Topology

__all__ = ["parse"]

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def parse(cls: type[Topology], document: Any, source: str | None = None) -> Topology:
    """Build a topology of class ``cls`` from the native dictionary form, validating every
    field."""
    c = Checker(InvalidTopology, source)
    doc = c.mapping(document, "")
    c.keys(
        doc,
        "",
        {
            "format",
            "name",
            "levels",
            "node_level",
            "nvlink_domain",
            "node_types",
            "nodes",
            "provenance",
            "uplink_gbps",
            "power_domains",
            "power_phases",
            "stores",
            *ClusterPolicy.SECTIONS,
            "host_count_factors",
            "algorithm_efficiency",
        },
    )
    if doc.get("format") != FORMAT:
        raise c.fail("format", f"expected {FORMAT!r}, got {doc.get('format')!r}")
    name = c.string(doc.get("name", source or "topology"), "name")

    levels: list[Level] = []
    raw_levels = c.sequence(doc.get("levels"), "levels")
    if not raw_levels:
        raise c.fail("levels", "at least one level is required")
    for i, raw in enumerate(raw_levels):
        p = f"levels[{i}]"
        lv = c.mapping(raw, p)
        c.keys(
            lv,
            p,
            {
                "name",
                "bandwidth_gbps",
                "latency_us",
                "oversubscription",
                "sharp",
                "routing",
                "qps_per_connection",
                "transport",
                "rail_aligned",
            },
        )
        lname = c.string(lv.get("name"), f"{p}.name")
        if not _NAME.match(lname):
            raise c.fail(f"{p}.name", f"use lowercase letters, digits, '-', '_'; got {lname!r}")
        if any(existing.name == lname for existing in levels):
            raise c.fail(f"{p}.name", f"duplicate level name {lname!r}")
        routing = lv.get("routing", ROUTINGS[0])
        if routing not in ROUTINGS:
            raise c.fail(f"{p}.routing", f"expected one of {', '.join(ROUTINGS)}, got {routing!r}")
        qps = lv.get("qps_per_connection", 1)
        if isinstance(qps, bool) or not isinstance(qps, int) or not 1 <= qps <= 1024:
            raise c.fail(f"{p}.qps_per_connection", f"expected an integer 1..1024, got {qps!r}")
        transport = lv.get("transport", TRANSPORTS[0])
        if transport not in TRANSPORTS:
            raise c.fail(
                f"{p}.transport", f"expected one of {', '.join(TRANSPORTS)}, got {transport!r}"
            )
        sharp = _flag(c, lv.get("sharp", False), f"{p}.sharp")
        if routing == "sharp" and lv.get("sharp", True) is False:
            raise c.fail(
                f"{p}.sharp", "routing: sharp reduces in the network; sharp: false says not"
            )
        levels.append(
            Level(
                lname,
                c.number(lv.get("bandwidth_gbps"), f"{p}.bandwidth_gbps", positive=True),
                c.number(lv.get("latency_us", 0.0), f"{p}.latency_us", minimum=0.0),
                sharp=sharp or routing == "sharp",
                routing=routing,
                qps_per_connection=qps,
                transport=transport,
                rail_aligned=_flag(c, lv.get("rail_aligned", True), f"{p}.rail_aligned"),
                oversubscription=c.number(
                    lv.get("oversubscription", 1.0), f"{p}.oversubscription", minimum=1.0
                ),
            )
        )
    names = [lv.name for lv in levels]

    def level_ref(key: str, default: int) -> int:
        if key not in doc:
            return default
        value = c.string(doc[key], key)
        if value not in names:
            raise c.fail(key, f"expected one of the levels ({', '.join(names)}), got {value!r}")
        return names.index(value)

    node_level = level_ref("node_level", 0)
    nvlink_level = level_ref("nvlink_domain", node_level)
    if nvlink_level < node_level:
        raise c.fail("nvlink_domain", "must be the node level or a level above it")
    for i, level in enumerate(levels):
        if level.routing in ("ecmp", "static") and not nvlink_level <= i < len(levels) - 1:
            where = "the top level" if i == len(levels) - 1 else "inside the NVLink domain"
            raise c.fail(
                f"levels[{i}].routing",
                f"{level.name!r} is {where}: it has no uplinks to route over; set routing on the "
                "levels from the NVLink domain up to below the top (their switches send up)",
            )
    below = names[:node_level]
    above = names[node_level + 1 :]

    node_types: dict[str, NodeType] = {}
    raw_types = c.mapping(doc.get("node_types"), "node_types")
    if not raw_types:
        raise c.fail("node_types", "at least one node type is required")
    for tname, raw in raw_types.items():
        node_types[tname] = _node_type(c, f"node_types.{tname}", tname, raw, below)

    hosts: list[str] = []
    host_types: list[str] = []
    host_domains: list[tuple[str, ...]] = []
    seen: dict[str, str] = {}
    raw_nodes = c.sequence(doc.get("nodes"), "nodes")
    if not raw_nodes:
        raise c.fail("nodes", "at least one node is required")
    for i, raw in enumerate(raw_nodes):
        p = f"nodes[{i}]"
        entry = c.mapping(raw, p)
        c.keys(entry, p, {"name", "type", "domains"})
        expr = c.string(entry.get("name"), f"{p}.name")
        try:
            names_here = expand(expr)
        except HostlistError as exc:
            raise c.fail(f"{p}.name", str(exc)) from None
        if not names_here:
            raise c.fail(f"{p}.name", f"hostlist {expr!r} names no host")
        tname = c.string(entry.get("type"), f"{p}.type")
        if tname not in node_types:
            raise c.fail(
                f"{p}.type",
                f"expected one of the node_types ({', '.join(node_types)}), got {tname!r}",
            )
        domains = c.mapping(entry.get("domains", {}), f"{p}.domains")
        missing = [lv for lv in above if lv not in domains]
        if missing:
            raise c.fail(f"{p}.domains", f"missing a domain for level {missing[0]!r}")
        extra = [k for k in domains if k not in above]
        if extra:
            raise c.fail(
                f"{p}.domains.{extra[0]}",
                f"not a level above the node level (expected {', '.join(above) or 'none'})",
            )
        path = tuple(_domain_name(c, domains[lv], f"{p}.domains.{lv}") for lv in above)
        for host in names_here:
            if host in seen:
                raise c.fail(f"{p}.name", f"host {host!r} is already defined in {seen[host]}")
            seen[host] = p
            hosts.append(host)
            host_types.append(tname)
            host_domains.append(path)
        if len(hosts) > 2_000_000:
            raise c.fail("nodes", "more than 2,000,000 hosts")
    notes = _provenance(c, doc.get("provenance", {}))

    stores = parse_stores(c, doc.get("stores", {}))
    power_domains = parse_power_domains(c, doc.get("power_domains", []), hosts)
    power_phases = c.integer(doc.get("power_phases", 1), "power_phases", minimum=1, maximum=64)
    uplinks = {
        str(k): c.number(v, f"uplink_gbps.{k}", positive=True)
        for k, v in c.mapping(doc.get("uplink_gbps", {}), "uplink_gbps").items()
    }
    factors = [
        c.number(v, f"host_count_factors[{i}]", positive=True)
        for i, v in enumerate(c.sequence(doc.get("host_count_factors", []), "host_count_factors"))
    ]
    eff_doc = c.mapping(doc.get("algorithm_efficiency", {}), "algorithm_efficiency")
    efficiency = {}
    for a, v in eff_doc.items():
        if a not in ALGORITHMS:
            raise c.fail(f"algorithm_efficiency.{a}", f"expected one of {', '.join(ALGORITHMS)}")
        efficiency[a] = c.number(v, f"algorithm_efficiency.{a}", positive=True)
    try:
        topology = cls(
            name=name,
            levels=levels,
            node_level=node_level,
            nvlink_level=nvlink_level,
            node_types=node_types,
            hosts=hosts,
            host_types=host_types,
            host_domains=host_domains,
            provenance=notes,
            uplink_gbps=uplinks,
            power_domains=power_domains,
            power_phases=power_phases,
            stores=stores,
            host_count_factors=factors,
            algorithm_efficiency=efficiency,
        )
    except InvalidTopology as exc:
        raise c.fail("", _domain_message(str(exc), levels, host_domains, hosts)) from None
    _check_references(c, topology)
    # Hardware attributes, pools and priority classes (gpuplace.policy), checked against the
    # hosts and GPUs just built.
    topology.policy = ClusterPolicy.from_dict(doc, c)
    topology.policy.check(topology, c)
    return topology


def _check_references(c: Checker, topology: Topology) -> None:
    """What the newer sections name must exist, checked at load (else the first job to use it
    failed without naming the file or field): each store's ``attach`` domain, and a board
    power for every GPU when there are power domains."""
    for name, store in topology.stores.items():
        try:
            store_attachment(topology, store)
        except InvalidJob:
            levels = ", ".join(level.name for level in topology.levels[topology.node_level :])
            raise c.fail(
                f"stores.{name}.attach",
                f"expected local, remote or a domain ([level:]name; levels {levels}), "
                f"got {describe(store.attach)}",
            ) from None
    if topology.power_domains:
        board = gpu_power_w(topology)
        gpu = 0
        for host_type in topology.host_types:
            gpus = topology.node_types[host_type].gpus
            if gpus and math.isnan(board[gpu]):
                raise c.fail(
                    f"node_types.{host_type}.power_w",
                    "power_domains need every GPU's board power: give power_w or a known "
                    f"gpu_model ({', '.join(BOARD_POWER_W)})",
                )
            gpu += gpus


def _domain_name(c: Checker, value: Any, path: str) -> str:
    """A domain name: a string, or an integer (YAML reads `leaf: 3` as one)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return c.string(value, path)


def _flag(c: Checker, value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise c.fail(path, f"expected true or false, got {value!r}")
    return value


def _node_type(c: Checker, p: str, tname: str, raw: Any, below: list[str]) -> NodeType:
    nt = c.mapping(raw, p)
    c.keys(
        nt,
        p,
        {
            "gpus",
            "gpu_model",
            "power_w",
            "sublevels",
            "bandwidth_gbps",
            "link_classes",
            "nics",
            "gpu_nic",
            "peak_tflops",
            "nvls_gbps",
            "p2p",
            "gpudirect_rdma",
        },
    )
    gpus = c.integer(nt.get("gpus"), f"{p}.gpus", minimum=1)
    if gpus > 64:
        raise c.fail(f"{p}.gpus", f"at most 64 GPUs per host are supported, got {gpus}")
    sub_raw = c.mapping(nt.get("sublevels", {}), f"{p}.sublevels")
    sublevels: dict[str, tuple[int, ...]] = {}
    for lname in below:
        if lname not in sub_raw:
            raise c.fail(f"{p}.sublevels", f"missing the level {lname!r} below the node level")
    for lname, values in sub_raw.items():
        if lname not in below:
            raise c.fail(
                f"{p}.sublevels.{lname}",
                f"not a level below the node level (expected {', '.join(below) or 'none'})",
            )
        seq = c.sequence(values, f"{p}.sublevels.{lname}")
        if len(seq) != gpus:
            raise c.fail(f"{p}.sublevels.{lname}", f"expected {gpus} entries, got {len(seq)}")
        sublevels[lname] = tuple(
            c.integer(v, f"{p}.sublevels.{lname}[{i}]", minimum=0) for i, v in enumerate(seq)
        )
    # A GPU's lower-level domains must nest in its higher ones inside the host.
    for lo, hi in itertools.pairwise(below):
        parent: dict[int, int] = {}
        for a, b in zip(sublevels[lo], sublevels[hi], strict=True):
            if parent.setdefault(a, b) != b:
                raise c.fail(
                    f"{p}.sublevels.{lo}",
                    f"domain {a} lies in two {hi} domains; sublevels must nest",
                )
    matrix = None
    if "bandwidth_gbps" in nt:
        rows = c.sequence(nt["bandwidth_gbps"], f"{p}.bandwidth_gbps")
        if len(rows) != gpus:
            raise c.fail(f"{p}.bandwidth_gbps", f"expected {gpus} rows, got {len(rows)}")
        parsed = []
        for i, row in enumerate(rows):
            cells = c.sequence(row, f"{p}.bandwidth_gbps[{i}]")
            if len(cells) != gpus:
                raise c.fail(
                    f"{p}.bandwidth_gbps[{i}]", f"expected {gpus} entries, got {len(cells)}"
                )
            parsed.append(
                tuple(
                    c.number(v, f"{p}.bandwidth_gbps[{i}][{j}]", minimum=0.0)
                    for j, v in enumerate(cells)
                )
            )
        for i in range(gpus):
            for j in range(gpus):
                if i != j and parsed[i][j] <= 0:
                    raise c.fail(
                        f"{p}.bandwidth_gbps[{i}][{j}]", "off-diagonal entries must be > 0"
                    )
                if abs(parsed[i][j] - parsed[j][i]) > 1e-9 * max(1.0, abs(parsed[i][j])):
                    raise c.fail(f"{p}.bandwidth_gbps[{i}][{j}]", "the matrix must be symmetric")
        matrix = tuple(parsed)
    classes = None
    if "link_classes" in nt:
        rows = c.sequence(nt["link_classes"], f"{p}.link_classes")
        if len(rows) != gpus or any(
            len(c.sequence(r, f"{p}.link_classes[{i}]")) != gpus for i, r in enumerate(rows)
        ):
            raise c.fail(f"{p}.link_classes", f"expected a {gpus}x{gpus} matrix")
        classes = tuple(tuple(str(x) for x in r) for r in rows)
    nics = tuple(
        c.string(v, f"{p}.nics[{i}]")
        for i, v in enumerate(c.sequence(nt.get("nics", []), f"{p}.nics"))
    )
    if len(set(nics)) != len(nics):
        first = next(i for i, v in enumerate(nics) if nics.index(v) != i)
        raise c.fail(f"{p}.nics[{first}]", f"NIC {describe(nics[first])} is listed twice")
    gpu_nic = None
    if "gpu_nic" in nt:
        seq = c.sequence(nt["gpu_nic"], f"{p}.gpu_nic")
        if len(seq) != gpus:
            raise c.fail(f"{p}.gpu_nic", f"expected {gpus} entries, got {len(seq)}")
        gpu_nic = tuple(c.integer(v, f"{p}.gpu_nic[{i}]", minimum=0) for i, v in enumerate(seq))
        if nics and max(gpu_nic) >= len(nics):
            raise c.fail(f"{p}.gpu_nic", f"entries must index nics (0..{len(nics) - 1})")
    power = None
    if nt.get("power_w") is not None:
        power = c.number(nt["power_w"], f"{p}.power_w", positive=True)
    model = nt.get("gpu_model")
    if model is not None:
        model = c.string(model, f"{p}.gpu_model")
    peak = None
    if nt.get("peak_tflops") is not None:
        peak = c.number(nt["peak_tflops"], f"{p}.peak_tflops", positive=True)
    nvls = None
    if nt.get("nvls_gbps") is not None:
        nvls = c.number(nt["nvls_gbps"], f"{p}.nvls_gbps", positive=True)
    return NodeType(
        name=tname,
        gpus=gpus,
        gpu_model=model,
        power_w=power,
        sublevels=sublevels,
        bandwidth_gbps=matrix,
        link_classes=classes,
        nics=nics,
        gpu_nic=gpu_nic,
        peak_tflops=peak,
        nvls_gbps=nvls,
        p2p=_flag(c, nt.get("p2p", True), f"{p}.p2p"),
        gpudirect_rdma=_flag(c, nt.get("gpudirect_rdma", True), f"{p}.gpudirect_rdma"),
    )


def _provenance(c: Checker, raw: Any) -> dict[str, Any]:
    """Validate the informational ``provenance`` entry (kept, never interpreted)."""
    doc = c.mapping(raw, "provenance")
    c.keys(doc, "provenance", {"sources", "warnings", "degraded_links", "parallel_links"})
    out: dict[str, Any] = {}
    for key in ("sources", "warnings"):
        if key in doc:
            seq = c.sequence(doc[key], f"provenance.{key}")
            out[key] = [c.string(v, f"provenance.{key}[{i}]") for i, v in enumerate(seq)]
    if "degraded_links" in doc:
        links = []
        raw_links = c.sequence(doc["degraded_links"], "provenance.degraded_links")
        for i, raw_link in enumerate(raw_links):
            p = f"provenance.degraded_links[{i}]"
            link = c.mapping(raw_link, p)
            c.keys(link, p, {"a", "b", "rate"})
            links.append({k: c.string(link.get(k), f"{p}.{k}") for k in ("a", "b", "rate")})
        out["degraded_links"] = links
    if "parallel_links" in doc:
        out["parallel_links"] = c.integer(
            doc["parallel_links"], "provenance.parallel_links", minimum=0
        )
    return out


def _domain_message(
    message: str,
    levels: Sequence[Level],
    host_domains: Sequence[tuple[str, ...]],
    hosts: Sequence[str],
) -> str:
    """Re-word a core nesting error with domain names instead of ids."""
    if "do not nest" not in message and "exactly one" not in message:
        return message
    nodes_above = [lv.name for lv in levels]
    # Find the first domain with two parents, by name.
    for offset in range(len(host_domains[0]) - 1 if host_domains else 0):
        parent: dict[str, tuple[str, str]] = {}
        for h, doms in enumerate(host_domains):
            child, up = doms[offset], doms[offset + 1]
            if child in parent and parent[child][0] != up:
                return (
                    f"domains do not nest: {nodes_above[-len(doms) + offset]} {child!r} lies in "
                    f"{parent[child][0]!r} (host {parent[child][1]}) and in {up!r} (host {hosts[h]})"
                )
            parent.setdefault(child, (up, hosts[h]))
    return message
