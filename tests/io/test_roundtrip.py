"""Writers: Slurm conf -> dict -> conf keeps the tree; ibnetdiscover and the conf written from
it group the hosts the same way."""

from __future__ import annotations

import io
from pathlib import Path

from gpuplace.io import (
    read_ibnetdiscover,
    read_slurm_topology,
    to_topology_dict,
    write_slurm_topology,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "topologies"


def _tree(fabric):
    return {
        name: (sw.level, frozenset(sw.children), frozenset(sw.hosts))
        for name, sw in fabric.switches.items()
    }


def _partition(fabric, level):
    groups = {}
    for host in fabric.hosts.values():
        groups.setdefault(host.domains[level], set()).add(host.name)
    return sorted(sorted(g) for g in groups.values())


def test_tree_conf_round_trip():
    for sample in (
        "topograph-generated-topology-tree-oci-sim.conf",
        "slurm-topology-conf-tree-manpage-example.conf",
    ):
        fabric = read_slurm_topology(DATA / sample)
        text = write_slurm_topology(to_topology_dict(None, fabric, name="rt"), mode="tree")
        again = read_slurm_topology(io.StringIO(text))
        assert _tree(again) == _tree(fabric), sample


def test_block_conf_round_trip():
    fabric = read_slurm_topology(DATA / "topograph-generated-topology-block-dra-sim.conf")
    text = write_slurm_topology(to_topology_dict(None, fabric, name="rt"), mode="block")
    assert "BlockSizes=8,16,32" in text
    again = read_slurm_topology(io.StringIO(text))
    for level in fabric.levels:
        assert _partition(again, level) == _partition(fabric, level)


def test_ibnetdiscover_and_its_conf_group_hosts_alike():
    fabric = read_ibnetdiscover(DATA / "ibnetdiscover-topograph-dgx-superpod-ndr-40sw.txt")
    text = write_slurm_topology(to_topology_dict(None, fabric, name="pod"), mode="tree")
    conf = read_slurm_topology(io.StringIO(text))
    assert conf.levels == fabric.levels == ["leaf", "spine"]
    assert _partition(conf, "leaf") == _partition(fabric, "leaf")
    assert _partition(conf, "spine") == _partition(fabric, "spine")
