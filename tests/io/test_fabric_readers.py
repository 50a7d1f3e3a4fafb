"""ibnetdiscover, Slurm, Kubernetes and EC2 samples; expected values read off the samples."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import pytest
from gpuplace.errors import InvalidTopology
from gpuplace.io import (
    read_ec2_topology,
    read_ibnetdiscover,
    read_k8s_nodes,
    read_nvidia_smi_topo,
    read_slurm_topology,
    to_topology_dict,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "topologies"

SUPERPOD = DATA / "ibnetdiscover-topograph-dgx-superpod-ndr-40sw.txt"


def test_sdr_manpage_sample():
    fabric = read_ibnetdiscover(DATA / "ibnetdiscover-rdma-core-manpage-example-sdr.txt")
    assert fabric.levels == ["leaf"]  # both switches carry hosts and are cabled together
    assert sorted(fabric.hosts) == [
        "H-0008f10403960558",
        "H-0008f10403960984",
        "H-0008f10403961354",
        "H-005442b100004900",
    ]
    assert fabric.host_link_gbit == 8.0  # 4xSDR
    # The ends disagree (4xSDR vs 1xSDR); the slower end wins.
    assert sorted(lk.rate for lk in fabric.degraded_links) == ["1xSDR", "1xSDR"]
    assert sorted(n for _, _, n in fabric.parallel_links) == [2, 2]
    d = to_topology_dict(None, fabric, name="sdr")
    assert [lv["name"] for lv in d["levels"]] == ["node", "leaf", "root"]


def test_superpod_sample():
    fabric = read_ibnetdiscover(SUPERPOD)
    assert fabric.levels == ["leaf", "spine"]
    levels = Counter(sw.level for sw in fabric.switches.values())
    assert levels == {"leaf": 31, "spine": 9}
    # 582 CAs = 40 SHARP + 69 "MT4129 ConnectX7" + 3 "localhost HCA-N" + 470 named HCAs
    assert len(fabric.hosts) == 121
    assert Counter(len(h.rails) for h in fabric.hosts.values()) == {4: 109, 3: 10, 2: 2}
    assert any("40 SHARP" in w for w in fabric.warnings)
    assert any("72 CAs carry no host name" in w for w in fabric.warnings)
    assert fabric.host_link_gbit == 400.0 and not fabric.degraded_links
    assert all(n == 2 for _, _, n in fabric.parallel_links)  # two cables per leaf-spine pair
    host = fabric.hosts["a08-p1-dgx-04-c01"]
    assert sorted(nic for nic, _ in host.rails) == [
        "mlx5_0",
        "mlx5_1",
        "mlx5_4",
        "mlx5_5",
    ]
    assert len({leaf for _, leaf in host.rails}) == 4  # one leaf per rail
    units = Counter(h.domains["leaf"] for h in fabric.hosts.values())
    assert len(units) == 8  # eight scalable units (IBLEAF-r-SU), 4 leaves each but one
    assert len({h.domains["spine"] for h in fabric.hosts.values()}) == 1
    assert host.domains["leaf"] == "A09-P1-IBLEAF-01-04+3"


def test_superpod_combined_with_host_sample():
    node = read_nvidia_smi_topo(
        DATA / "nvidia-smi-topo-hgx-h100-8gpu-8nic-rail.txt", gpu_model="H100"
    )
    d = to_topology_dict(node, read_ibnetdiscover(SUPERPOD), name="superpod")
    names = [lv["name"] for lv in d["levels"]]
    assert names == ["numa", "node", "leaf", "spine"]
    leaf = d["levels"][2]["bandwidth_gbps"]
    assert leaf == pytest.approx(400 / 8 * 4 / 8)  # 4 of 8 rails on this fabric
    assert len(d["nodes"]) == 121


def test_slurm_tree_manpage():
    fabric = read_slurm_topology(DATA / "slurm-topology-conf-tree-manpage-example.conf")
    assert fabric.levels == ["leaf", "spine"]
    assert len(fabric.hosts) == 18
    assert fabric.hosts["dev7"].domains == {"leaf": "s1", "spine": "s3"}


def test_slurm_tree_topograph_oci():
    fabric = read_slurm_topology(DATA / "topograph-generated-topology-tree-oci-sim.conf")
    assert fabric.levels == ["leaf", "spine", "core"]
    assert len(fabric.hosts) == 96
    assert Counter(s.level for s in fabric.switches.values()) == {
        "leaf": 12,
        "spine": 6,
        "core": 1,
    }
    assert fabric.hosts["srv6208"].domains == {
        "leaf": "switch.1.12",
        "spine": "switch.2.6",
        "core": "switch.3.1",
    }


def test_slurm_block_topograph_dra():
    fabric = read_slurm_topology(DATA / "topograph-generated-topology-block-dra-sim.conf")
    assert fabric.levels == ["block", "block16", "block32"]
    assert fabric.block_sizes == [8, 16, 32]
    assert len({h.domains["block"] for h in fabric.hosts.values()}) == 12
    assert len({h.domains["block16"] for h in fabric.hosts.values()}) == 6
    assert len({h.domains["block32"] for h in fabric.hosts.values()}) == 3
    d = to_topology_dict(None, fabric, name="dra")
    assert [lv["name"] for lv in d["levels"]][-1] == "root"


def test_slurm_yaml_manpage():
    path = DATA / "slurm-topology-yaml-manpage-example.yaml"
    tree = read_slurm_topology(path)  # topo1 is the cluster default
    assert tree.levels == ["leaf"] and sorted(tree.hosts) == [
        "node01",
        "node02",
        "node03",
        "node04",
    ]
    block = read_slurm_topology(path, topology="topo2")
    assert block.levels == ["block", "block16"] and len(block.hosts) == 16
    with pytest.raises(InvalidTopology, match="flat"):
        read_slurm_topology(path, topology="topo3")


def test_slurm_unbalanced_tree_fills_skipped_levels():
    conf = "SwitchName=l1 Nodes=a[1-2]\nSwitchName=l2 Nodes=b[1-2]\nSwitchName=s1 Switches=l1\n"
    conf += "SwitchName=c Switches=s1,l2  # l2 hangs directly under the core\n"
    fabric = read_slurm_topology(io.StringIO(conf))
    assert fabric.levels == ["leaf", "spine", "core"]
    assert fabric.hosts["b1"].domains == {"leaf": "l2", "spine": "c", "core": "c"}
    to_topology_dict(None, fabric, name="x")  # nests


@pytest.mark.parametrize(
    "conf, expected",
    [
        ("SwitchName=s0 Nodes=n[1-1000000000]\n", "at most|more than"),
        (
            "SwitchName=s0 Switches=s1\nSwitchName=s1 Switches=s0 Nodes=a\n",
            "ancestor|two parents",
        ),
        ("SwitchName=s0 Nodes=n1 Bogus\n", "Key=Value"),
        ("BlockName=b1 Nodes=a1\nSwitchName=s Nodes=a2\n", "mixes"),
    ],
)
def test_slurm_errors_name_the_line(conf, expected):
    with pytest.raises(InvalidTopology, match=expected):
        read_slurm_topology(io.StringIO(conf))


def _node(name, gpus, **labels):
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)} if gpus else {}},
    }


def test_k8s_topograph_tiers_and_clique():
    # Constructed from the documented Topograph/GFD label keys (no public kubectl dump with
    # these labels was found); see tests/data/topologies/README.md.
    items = [
        _node(
            f"gb-{i}",
            4,
            **{
                "fabric.topograph.run/tier-1": f"leaf{i // 4}",
                "fabric.topograph.run/tier-2": "spine0",
                "nvidia.com/gpu.clique": f"uuid.{i // 2}",
            },
        )
        for i in range(8)
    ] + [_node("cpu-0", 0)]
    fabric = read_k8s_nodes(io.StringIO(json.dumps({"kind": "List", "items": items})))
    assert fabric.levels == ["nvl", "leaf", "spine"] and fabric.nvlink_level == "nvl"
    assert len(fabric.hosts) == 8 and fabric.hosts["gb-5"].gpus == 4
    d = to_topology_dict(None, fabric, name="k8s")
    assert d["nvlink_domain"] == "nvl"


def test_k8s_older_nvidia_keys_eks_and_gke():
    old = [
        _node(
            "n1",
            8,
            **{
                "network.topology.nvidia.com/leaf": "l1",
                "network.topology.nvidia.com/spine": "s1",
            },
        )
    ]
    assert read_k8s_nodes(io.StringIO(json.dumps({"items": old}))).levels == [
        "leaf",
        "spine",
    ]
    eks = [
        _node(
            "n1",
            8,
            **{f"topology.k8s.aws/network-node-layer-{k}": f"nn-{k}" for k in (1, 2, 3)},
        )
    ]
    fab = read_k8s_nodes(io.StringIO(json.dumps({"items": eks})))
    assert fab.hosts["n1"].domains == {"leaf": "nn-3", "spine": "nn-2", "core": "nn-1"}
    gke = [
        _node(
            "n1",
            8,
            **{
                "cloud.google.com/gce-topology-block": "b",
                "cloud.google.com/gce-topology-subblock": "sb",
            },
        )
    ]
    assert read_k8s_nodes(io.StringIO(json.dumps({"items": gke}))).levels == [
        "subblock",
        "block",
    ]


def test_ec2_awscli_example():
    fabric = read_ec2_topology(DATA / "ec2-describe-instance-topology-awscli-example.json")
    assert fabric.levels == ["leaf", "spine", "core"]
    i1 = fabric.hosts["i-1111111111example"]
    assert i1.gpus == 8 and i1.domains["leaf"] == "nn-3333333333example"  # last = bottom
    assert i1.domains["core"] == "nn-1111111111example"
    assert fabric.hosts["i-2222222222example"].domains == i1.domains
    d = to_topology_dict(None, fabric, name="ec2")
    assert [lv["name"] for lv in d["levels"]] == [
        "node",
        "leaf",
        "spine",
        "core",
        "root",
    ]


def test_ec2_p4de_pair_share_all_layers():
    fabric = read_ec2_topology(DATA / "ec2-describe-instance-topology-p4de-awesome-networking.json")
    a, b = fabric.hosts.values()
    assert a.domains == b.domains and a.gpu_model == "A100-SXM4-80GB"
