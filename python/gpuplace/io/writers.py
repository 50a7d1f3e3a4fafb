"""Writers from gpuplace objects to other tools' formats.

From a topology (a :class:`gpuplace.Topology` or its native dictionary): Slurm topology.conf,
tree or block. From a :class:`gpuplace.Placement`: the Slurm hostlist, per-host
``CUDA_VISIBLE_DEVICES`` in rank order, a rank table (CSV, Open MPI rankfile and hostfile,
torchrun command lines) and Kubernetes node affinity.

Rank conventions shared by every placement writer: ranks on one host, in increasing global
rank, get local ranks 0, 1, ...; local rank ``k`` uses the ``k``-th entry of that host's
``CUDA_VISIBLE_DEVICES``, so ``cuda:k`` inside the process is the GPU the solver chose.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import TYPE_CHECKING, Any

from gpuplace._util.hostlist import compress, expand
from gpuplace.errors import InvalidJob, InvalidTopology

if TYPE_CHECKING:
    from gpuplace.model.topology import Topology
    from gpuplace.placement.result import Placement

__all__ = [
    "k8s_node_affinity",
    "rank_table",
    "slurm_hostlist",
    "write_cuda_visible_devices",
    "write_k8s_node_affinity",
    "write_openmpi_hostfile",
    "write_openmpi_rankfile",
    "write_rank_table",
    "write_slurm_topology",
    "write_torchrun_commands",
]

# Characters topology.conf cannot carry in a switch/block name (they split fields, start
# comments, or are hostlist syntax).
_UNSAFE = re.compile(r"[\s=#,\[\]]")

#: The level ``to_topology_dict`` adds when a fabric has several top switches (the native
#: format needs a single top domain). It is not a switch and is not written back.
ROOT = "root"


def _slurm_name(name: str) -> str:
    return _UNSAFE.sub("_", name) or "_"


class _Names:
    """Slurm-safe, unique names: a key whose cleaned name is taken by another key (``a b``
    and ``a_b``) gets ``-2``, ``-3``, ..."""

    def __init__(self) -> None:
        self.of: dict[object, str] = {}
        self.used: set[str] = set()

    def __call__(self, key: object, name: str) -> str:
        if key not in self.of:
            base = _slurm_name(name)
            unique, n = base, 1
            while unique in self.used:
                n += 1
                unique = f"{base}-{n}"
            self.used.add(unique)
            self.of[key] = unique
        return self.of[key]


def _view(topology: Topology | dict) -> tuple[list[str], str | None, list[tuple[str, dict]]]:
    """(levels above the node, NVLink-domain level name, [(host, {level: domain})])."""
    if not isinstance(topology, dict):
        names = topology.level_names
        above = names[topology.node_level + 1 :]
        hosts = [
            (h, dict(zip(above, doms, strict=True)))
            for h, doms in zip(topology.hosts, topology.host_domains, strict=True)
        ]
        return above, names[topology.nvlink_level], hosts
    declared = [lv.get("name") for lv in topology.get("levels") or [] if isinstance(lv, dict)]
    node_level = topology.get("node_level", declared[0] if declared else "node")
    if node_level not in declared:
        raise InvalidTopology(f"node_level {node_level!r} is not a level")
    above = [str(name) for name in declared[declared.index(node_level) + 1 :]]
    hosts = []
    for i, node in enumerate(topology.get("nodes") or []):
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            raise InvalidTopology(f"nodes[{i}]: expected a name")
        domains = node.get("domains") or {}
        for lv in above:
            if lv not in domains:
                raise InvalidTopology(f"nodes[{i}] ({node['name']}): no {lv!r} domain")
        for host in expand(node["name"]):
            hosts.append((host, domains))
    nv = topology.get("nvlink_domain")
    return above, nv if isinstance(nv, str) else None, hosts


def write_slurm_topology(
    topology: Topology | dict, mode: str = "tree", *, level: str | None = None
) -> str:
    """Render a topology (a :class:`gpuplace.Topology` or its native dictionary) as Slurm
    topology.conf text.

    ``mode="tree"``: one ``SwitchName`` per switch, leaves (with ``Nodes=``) first, parents
    (with ``Switches=``) after. A domain of one level that has the same name as its parent is
    one switch (the readers fill a level an unbalanced tree skips with the switch above), and
    the single ``root`` domain that ``to_topology_dict`` adds above several top switches is
    not written, so topology.conf -> Topology -> topology.conf gives back the same switches.
    A name still used at two levels is suffixed ``-LEVEL``.

    ``mode="block"``: one ``BlockName`` per domain of ``level`` (default: ``block`` if
    present, else the NVLink-domain level if above the node, else the lowest level above the
    node); levels named ``blockN`` become ``BlockSizes=BASE,N,...`` with BASE the smallest
    block's node count."""
    above, nvlink, hosts = _view(topology)
    if not above:
        raise InvalidTopology("the topology has no level above the node; nothing to write")
    if mode == "tree":
        return _tree(above, hosts)
    if mode == "block":
        return _block(above, nvlink, hosts, level)
    raise InvalidTopology(f'mode must be "tree" or "block", got {mode!r}')


def _tree(above: list[str], hosts: list[tuple[str, dict]]) -> str:
    levels = list(above)
    if len(levels) > 1 and levels[-1] == ROOT and {str(d[ROOT]) for _, d in hosts} == {ROOT}:
        levels.pop()
    # A switch is a domain, and a domain that repeats its name one level up (the readers fill
    # a level an unbalanced tree skips with the switch above) is the same switch: union them.
    comp: dict[tuple[str, str], tuple[str, str]] = {}

    def find(x: tuple[str, str]) -> tuple[str, str]:
        while comp.setdefault(x, x) != x:
            x = comp[x]
        return x

    for _, d in hosts:
        for lo, hi in itertools.pairwise(levels):
            if str(d[lo]) == str(d[hi]):
                a, b = find((lo, str(d[lo]))), find((hi, str(d[hi])))
                if a != b:  # keep the lower level as the representative
                    low, high = sorted((a, b), key=lambda x: levels.index(x[0]))
                    comp[high] = low
    chains: list[tuple[str, list[tuple[str, str]]]] = []
    for host, d in hosts:
        chain: list[tuple[str, str]] = []
        for lv in levels:
            switch_of_level = find((lv, str(d[lv])))
            if not chain or chain[-1] != switch_of_level:
                chain.append(switch_of_level)
        chains.append((host, chain))
    at_levels: dict[str, set[str]] = {}
    for _, chain in chains:
        for lv, dom in chain:
            at_levels.setdefault(dom, set()).add(lv)

    unique = _Names()

    def switch(lv: str, dom: str) -> str:
        return unique((lv, dom), dom if len(at_levels[dom]) == 1 else f"{dom}-{lv}")

    order: dict[str, tuple[int, int]] = {}  # switch -> (level rank, first appearance)
    nodes: dict[str, list[str]] = {}
    children: dict[str, list[str]] = {}
    parent: dict[str, str] = {}
    for host, chain in chains:
        names = [switch(lv, dom) for lv, dom in chain]
        for (lv, _), sw in zip(chain, names, strict=True):
            order.setdefault(sw, (levels.index(lv), len(order)))
        nodes.setdefault(names[0], []).append(host)
        for child, up in itertools.pairwise(names):
            if parent.setdefault(child, up) != up:
                raise InvalidTopology(
                    f"switch {child!r} would have two parents ({parent[child]!r} and {up!r})"
                )
            kids = children.setdefault(up, [])
            if child not in kids:
                kids.append(child)
    lines = []
    for sw in sorted(order, key=order.__getitem__):
        fields = [f"SwitchName={sw}"]
        if sw in children:
            fields.append(f"Switches={compress(children[sw])}")
        if sw in nodes:
            fields.append(f"Nodes={compress(nodes[sw])}")
        lines.append(" ".join(fields))
    return "\n".join(lines) + "\n"


def _block(
    above: list[str], nvlink: str | None, hosts: list[tuple[str, dict]], level: str | None
) -> str:
    if level is None:
        level = "block" if "block" in above else (nvlink if nvlink in above else above[0])
    if level not in above:
        raise InvalidTopology(f"level {level!r} is not above the node level")
    blocks: dict[str, list[str]] = {}
    unique = _Names()
    for host, d in hosts:
        blocks.setdefault(unique(str(d[level]), str(d[level])), []).append(host)
    lines = [f"BlockName={name} Nodes={compress(members)}" for name, members in blocks.items()]
    sizes = sorted(int(lv[5:]) for lv in above if re.fullmatch(r"block\d+", lv))
    if sizes:
        base = min(len(m) for m in blocks.values())
        lines.append("BlockSizes=" + ",".join(str(s) for s in [base, *sizes] if s >= base))
    return "\n".join(lines) + "\n"


# -- placements --------------------------------------------------------------------------------


def slurm_hostlist(placement: Placement) -> str:
    """The placement's hosts as one compressed Slurm hostlist (``dgx[001-004,010]``), for
    ``sbatch --nodelist``; :func:`gpuplace._util.hostlist.expand` reads it back."""
    return placement.hostlist()


def rank_table(placement: Placement) -> list[dict[str, Any]]:
    """One row per global rank: ``rank``, ``host``, ``local_rank`` (order among the ranks of
    its host), ``device`` (the GPU's CUDA ordinal on the host, before any
    ``CUDA_VISIBLE_DEVICES``) and ``node_rank`` (the host's position in order of first
    rank)."""
    node_rank: dict[str, int] = {}
    rows = []
    for row in placement.rank_table():
        node_rank.setdefault(row["host"], len(node_rank))
        rows.append({**row, "node_rank": node_rank[row["host"]]})
    return rows


def write_cuda_visible_devices(placement: Placement) -> str:
    """``HOST CUDA_VISIBLE_DEVICES=3,1,...`` per host, devices in rank order."""
    return "".join(
        f"{host} CUDA_VISIBLE_DEVICES={devices}\n"
        for host, devices in placement.cuda_visible_devices().items()
    )


def write_rank_table(placement: Placement) -> str:
    """The rank table as CSV: ``rank,host,node_rank,local_rank,device``."""
    lines = ["rank,host,node_rank,local_rank,device"]
    for r in rank_table(placement):
        lines.append(f"{r['rank']},{r['host']},{r['node_rank']},{r['local_rank']},{r['device']}")
    return "\n".join(lines) + "\n"


def write_openmpi_rankfile(placement: Placement) -> str:
    """An Open MPI rankfile (``mpirun --rankfile FILE``): ``rank R=HOST slot=L`` with L the
    local rank, i.e. one logical core per rank; rewrite ``slot=`` for a CPU binding that
    follows the GPUs' NUMA affinity. Run each rank with the host's ``CUDA_VISIBLE_DEVICES``
    and ``cuda:$OMPI_COMM_WORLD_LOCAL_RANK``."""
    return "".join(
        f"rank {r['rank']}={r['host']} slot={r['local_rank']}\n" for r in rank_table(placement)
    )


def write_openmpi_hostfile(placement: Placement) -> str:
    """An Open MPI hostfile: ``HOST slots=N`` per host in order of first rank (``mpirun
    --hostfile FILE --map-by slot`` fills them in this order, which matches the rank table
    only when each host's ranks are consecutive; use the rankfile otherwise)."""
    counts: dict[str, int] = {}
    for r in rank_table(placement):
        counts[r["host"]] = counts.get(r["host"], 0) + 1
    return "".join(f"{host} slots={n}\n" for host, n in counts.items())


def write_torchrun_commands(
    placement: Placement, *, master_port: int = 29500, script: str = "train.py"
) -> str:
    """One line per host: ``HOST: CUDA_VISIBLE_DEVICES=... torchrun --nnodes=N
    --nproc-per-node=P --node-rank=K --master-addr=FIRST --master-port=PORT SCRIPT``.

    torchrun numbers ranks node by node (rank = node_rank x P + local_rank), so every host
    must hold the same number of ranks and each host's ranks must be consecutive; raises
    :class:`gpuplace.InvalidJob` otherwise (use the Open MPI rankfile then)."""
    rows = rank_table(placement)
    per_host: dict[str, list[int]] = {}
    for r in rows:
        per_host.setdefault(r["host"], []).append(r["rank"])
    sizes = {len(v) for v in per_host.values()}
    if len(sizes) != 1:
        raise InvalidJob(
            f"torchrun needs the same number of ranks on every host; this placement has "
            f"{', '.join(f'{h}: {len(v)}' for h, v in list(per_host.items())[:4])}"
        )
    nproc = sizes.pop()
    for k, (host, ranks) in enumerate(per_host.items()):
        if ranks != list(range(k * nproc, (k + 1) * nproc)):
            raise InvalidJob(
                f"torchrun numbers ranks node by node; host {host} holds ranks "
                f"{ranks[:4]}{' ...' if len(ranks) > 4 else ''}, not "
                f"{k * nproc}..{(k + 1) * nproc - 1}; use the Open MPI rankfile"
            )
    devices = placement.cuda_visible_devices()
    first = next(iter(per_host))
    return "".join(
        f"{host}: CUDA_VISIBLE_DEVICES={devices[host]} torchrun --nnodes={len(per_host)} "
        f"--nproc-per-node={nproc} --node-rank={k} --master-addr={first} "
        f"--master-port={master_port} {script}\n"
        for k, host in enumerate(per_host)
    )


def k8s_node_affinity(placement: Placement) -> dict[str, Any]:
    """A Kubernetes ``affinity`` object that restricts pods to the placement's hosts:
    ``nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`` with
    ``kubernetes.io/hostname In [hosts]`` (hosts sorted). Put it in the pod template's
    ``spec.affinity``; the label's value is the node name on a standard cluster."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/hostname",
                                "operator": "In",
                                "values": sorted(placement.nodes),
                            }
                        ]
                    }
                ]
            }
        }
    }


def write_k8s_node_affinity(placement: Placement) -> str:
    """:func:`k8s_node_affinity` as indented JSON (``kubectl`` reads JSON as YAML)."""
    return json.dumps(k8s_node_affinity(placement), indent=2) + "\n"
