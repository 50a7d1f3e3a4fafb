"""Every real sample loads into a real ``gpuplace.Topology``; the writers' output goes back
through the matching readers. Counts were read off the samples (tests/data/topologies)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import gpuplace
import numpy as np
import pytest
from gpuplace import Topology
from gpuplace._util.hostlist import expand
from gpuplace.errors import InvalidJob, InvalidTopology
from gpuplace.io import (
    Fabric,
    Host,
    k8s_node_affinity,
    rank_table,
    read_ec2_topology,
    read_ibnetdiscover,
    read_k8s_nodes,
    read_nvidia_smi_topo,
    read_rocm_smi_topo,
    read_slurm_topology,
    slurm_hostlist,
    write_cuda_visible_devices,
    write_openmpi_hostfile,
    write_openmpi_rankfile,
    write_rank_table,
    write_slurm_topology,
    write_torchrun_commands,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "topologies"
H100 = DATA / "nvidia-smi-topo-hgx-h100-8gpu-8nic-rail.txt"
GB200 = DATA / "nvidia-smi-topo-gb200-4gpu-8nic.txt"
TREE = DATA / "slurm-topology-conf-tree-manpage-example.conf"
OCI = DATA / "topograph-generated-topology-tree-oci-sim.conf"
DRA = DATA / "topograph-generated-topology-block-dra-sim.conf"
SUPERPOD = DATA / "ibnetdiscover-topograph-dgx-superpod-ndr-40sw.txt"


def _shape(topo: Topology) -> dict[str, int]:
    return {lv.name: topo.domain_count(i) for i, lv in enumerate(topo.levels)}


def _h100():
    return read_nvidia_smi_topo(H100, gpu_model="H100 80GB HBM3")


# -- host samples alone: one host ---------------------------------------------------------------


@pytest.mark.parametrize(
    "sample, reader, kwargs, gpus, shape",
    [
        ("nvidia-smi-topo-hgx-h100-8gpu-8nic-rail.txt", read_nvidia_smi_topo, {}, 8,
         {"numa": 2, "node": 1}),
        ("nvidia-smi-topo-dgx1-v100-4nic-pytorch-ddp-readme.txt", read_nvidia_smi_topo,
         {"gpu_model": "Tesla V100-SXM2-16GB"}, 8, {"node": 1}),
        ("nvidia-smi-topo-gb200-4gpu-8nic.txt", read_nvidia_smi_topo,
         {"gpu_model": "NVIDIA GB200", "nvlink_domain_gpus": 72}, 4, {"numa": 2, "node": 1}),
        ("nvidia-smi-topo-rtx4090-8gpu-2nic-tabs.txt", read_nvidia_smi_topo, {}, 8,
         {"numa": 2, "node": 1}),
        ("rocm-smi-showtopo-4gpu-pcie-rocm-smi-lib-issue108.txt", read_rocm_smi_topo, {}, 4,
         {"numa": 4, "node": 1}),
        ("rocm-smi-showtopo-8gpu-2xgmi-hives.txt", read_rocm_smi_topo, {}, 8,
         {"numa": 2, "node": 1}),
        ("rocm-smi-showtopo-mi250x-8gcd-weight-only-vllm-issue16840.txt", read_rocm_smi_topo,
         {}, 8, {"node": 1}),
    ],
)  # fmt: skip
def test_host_sample_is_a_one_host_topology(sample, reader, kwargs, gpus, shape):
    node = reader(DATA / sample, **kwargs)
    topo = Topology.from_parts(node, name="one")
    assert topo.num_gpus == gpus and _shape(topo) == shape
    assert topo.nvlink_level == topo.node_level
    # The host matrix survives the native form.
    assert Topology.from_dict(topo.to_dict()).node_types[node.name].bandwidth_gbps is not None


def test_dgx1_partial_mesh_prices_pairs_from_the_matrix():
    node = read_nvidia_smi_topo(
        DATA / "nvidia-smi-topo-dgx1-v100-4nic-pytorch-ddp-readme.txt", gpu_model="V100"
    )
    topo = Topology.from_parts(node, name="dgx1")
    matrix = topo.node_types[node.name].bandwidth_gbps
    assert matrix[0][3] == pytest.approx(40.0) and matrix[0][5] == pytest.approx(8.0)
    assert topo.levels[0].bandwidth_gbps == pytest.approx(8.0)  # slowest pair: SYS


# -- fabric samples with the default or a given node type ---------------------------------------


@pytest.mark.parametrize(
    "sample, reader, kwargs, hosts, shape",
    [
        ("slurm-topology-conf-tree-manpage-example.conf", read_slurm_topology, {}, 18,
         {"node": 18, "leaf": 3, "spine": 1}),
        ("topograph-generated-topology-tree-oci-sim.conf", read_slurm_topology, {}, 96,
         {"node": 96, "leaf": 12, "spine": 6, "core": 1}),
        ("topograph-generated-topology-block-dra-sim.conf", read_slurm_topology, {}, 96,
         {"node": 96, "block": 12, "block16": 6, "block32": 3, "root": 1}),
        ("slurm-topology-yaml-manpage-example.yaml", read_slurm_topology, {}, 4,
         {"node": 4, "leaf": 1}),
        ("slurm-topology-yaml-manpage-example.yaml", read_slurm_topology,
         {"topology": "topo2"}, 16, {"node": 16, "block": 4, "block16": 1}),
        ("ibnetdiscover-rdma-core-manpage-example-sdr.txt", read_ibnetdiscover, {}, 4,
         {"node": 4, "leaf": 2, "root": 1}),
        ("ibnetdiscover-topograph-dgx-superpod-ndr-40sw.txt", read_ibnetdiscover, {}, 121,
         {"node": 121, "leaf": 8, "spine": 1}),
    ],
)  # fmt: skip
def test_fabric_sample_with_default_node_type(sample, reader, kwargs, hosts, shape):
    topo = Topology.from_parts(None, reader(DATA / sample, **kwargs), name="fabric")
    assert len(topo.hosts) == hosts and topo.num_gpus == 8 * hosts
    assert _shape(topo) == shape
    assert any("assumed 8 per host" in w for w in topo.warnings)
    # The node level never caps the network below it.
    assert topo.levels[topo.node_level].bandwidth_gbps >= max(
        lv.bandwidth_gbps for lv in topo.levels[topo.node_level + 1 :]
    )
    with_four = Topology.from_parts(
        None, reader(DATA / sample, **kwargs), name="f", gpus_per_node=4
    )
    assert with_four.num_gpus == 4 * hosts


def test_ec2_samples_count_gpus_by_instance_type():
    topo = Topology.from_parts(
        None,
        read_ec2_topology(DATA / "ec2-describe-instance-topology-awscli-example.json"),
        name="ec2",
    )
    assert topo.num_gpus == 8 + 8 + 16 + 1  # 2 x p4d, trn1.32xlarge, trn1.2xlarge
    assert _shape(topo) == {"node": 4, "leaf": 3, "spine": 3, "core": 2, "root": 1}
    pair = Topology.from_parts(
        None,
        read_ec2_topology(DATA / "ec2-describe-instance-topology-p4de-awesome-networking.json"),
        name="p4de",
    )
    assert pair.num_gpus == 16 and _shape(pair) == {"node": 2, "leaf": 1, "spine": 1, "core": 1}
    assert {nt.gpu_model for nt in pair.node_types.values()} == {"A100-SXM4-80GB"}


def test_h100_host_on_the_manpage_tree_places_a_tp8_job():
    topo = Topology.from_parts(_h100(), read_slurm_topology(TREE), name="dev")
    assert topo.num_gpus == 144
    assert _shape(topo) == {"numa": 36, "node": 18, "leaf": 3, "spine": 1}
    bw = {lv.name: lv.bandwidth_gbps for lv in topo.levels}
    assert bw["node"] == pytest.approx(18 * 20.6)  # NV18, Hopper
    assert bw["leaf"] == pytest.approx(400 / 8 * 8 / 8)  # 8 NDR rails for 8 GPUs
    state = gpuplace.ClusterState(topo)
    job = gpuplace.Job(name="tp8", tp=8, dp=4)
    placement = gpuplace.place(state, job)
    assert placement.cost.confinement_ok
    for g in range(0, 32, 8):  # every tp group on one host
        assert len({topo.host_of(int(x)) for x in placement.gpus[g : g + 8]}) == 1
    assert placement.cost.span_level == "leaf"  # 4 hosts fit under one leaf of 6


def test_h100_host_on_the_superpod_fabric():
    topo = Topology.from_parts(_h100(), read_ibnetdiscover(SUPERPOD), name="pod")
    assert topo.num_gpus == 121 * 8
    assert _shape(topo) == {"numa": 242, "node": 121, "leaf": 8, "spine": 1}
    assert topo.level_names[topo.nvlink_level] == "node"


def test_gb200_rack_on_the_block_conf_makes_the_block_the_nvlink_domain():
    node = read_nvidia_smi_topo(GB200, gpu_model="NVIDIA GB200", nvlink_domain_gpus=72)
    topo = Topology.from_parts(node, read_slurm_topology(DRA), name="nvl")
    assert topo.level_names[topo.nvlink_level] == "block"  # not block16 (two racks)
    bw = {lv.name: lv.bandwidth_gbps for lv in topo.levels}
    assert bw["block"] == pytest.approx(18 * 40.1)  # NVLink inside the rack
    assert bw["block16"] < bw["block"]
    placement = gpuplace.place(gpuplace.ClusterState(topo), gpuplace.Job(name="tp16", tp=16))
    assert len({topo.domain_of(int(g), "block") for g in placement.gpus}) == 1


def test_k8s_clique_level_gets_nvlink_bandwidth():
    items = [
        {
            "metadata": {
                "name": f"gb-{i}",
                "labels": {
                    "fabric.topograph.run/tier-1": f"leaf{i // 4}",
                    "nvidia.com/gpu.clique": f"uuid.{i // 2}",
                },
            },
            "status": {"allocatable": {"nvidia.com/gpu": "4"}},
        }
        for i in range(8)
    ]
    fabric = read_k8s_nodes(io.StringIO(json.dumps({"kind": "List", "items": items})))
    node = read_nvidia_smi_topo(GB200, gpu_model="NVIDIA GB200", nvlink_domain_gpus=72)
    topo = Topology.from_parts(node, fabric, name="k8s")
    assert _shape(topo) == {"numa": 16, "node": 8, "nvl": 4, "leaf": 2, "root": 1}
    assert topo.level_names[topo.nvlink_level] == "nvl"
    assert topo.levels[topo.level_index("nvl")].bandwidth_gbps == pytest.approx(18 * 40.1)


def test_degraded_links_and_warnings_survive_the_file(tmp_path):
    fabric = read_ibnetdiscover(DATA / "ibnetdiscover-rdma-core-manpage-example-sdr.txt")
    topo = Topology.from_parts(None, fabric, name="sdr", sources=["sdr.txt"])
    topo.save(tmp_path / "sdr.yaml")
    again = Topology.load(tmp_path / "sdr.yaml")
    assert again.provenance == topo.provenance
    assert again.provenance["sources"] == ["sdr.txt"]
    assert [d["rate"] for d in again.provenance["degraded_links"]] == ["1xSDR", "1xSDR"]
    assert (
        again.fingerprint
        == Topology.from_dict(
            {k: v for k, v in topo.to_dict().items() if k != "provenance"}
        ).fingerprint
    )


def test_host_names_in_hostlist_syntax_are_refused():
    fabric = Fabric(levels=["leaf"], hosts={"a,b": Host("a,b", domains={"leaf": "l1"})})
    with pytest.raises(InvalidTopology, match="not a plain host name"):
        Topology.from_parts(None, fabric, name="x")


def test_mismatched_parts_raise_invalid_topology():
    ec2 = read_ec2_topology(DATA / "ec2-describe-instance-topology-awscli-example.json")
    with pytest.raises(InvalidTopology, match="has 16 GPUs"):
        Topology.from_parts(_h100(), ec2, name="x")
    with pytest.raises(InvalidTopology, match="unknown level"):
        Topology.from_parts(_h100(), None, name="x", bandwidths={"spine": 1.0})


# -- writers ------------------------------------------------------------------------------------


def _tree(fabric):
    return {
        n: (s.level, frozenset(s.children), frozenset(s.hosts)) for n, s in fabric.switches.items()
    }


@pytest.mark.parametrize("sample", [TREE, OCI])
def test_conf_topology_conf_round_trip(sample):
    fabric = read_slurm_topology(sample)
    topo = Topology.from_parts(_h100(), fabric, name="rt")
    again = read_slurm_topology(io.StringIO(write_slurm_topology(topo, "tree")))
    assert _tree(again) == _tree(fabric)


def test_round_trip_of_an_unbalanced_tree_and_several_top_switches():
    conf = (
        "SwitchName=l1 Nodes=a[1-2]\nSwitchName=l2 Nodes=b[1-2]\nSwitchName=s1 Switches=l1\n"
        "SwitchName=c Switches=s1,l2\nSwitchName=l3 Nodes=z[1-2]\n"
    )
    fabric = read_slurm_topology(io.StringIO(conf))
    topo = Topology.from_parts(None, fabric, name="rt")
    assert topo.level_names[-1] == "root"
    text = write_slurm_topology(topo, "tree")
    assert "root" not in text and "c-" not in text
    assert _tree(read_slurm_topology(io.StringIO(text))) == _tree(fabric)


def test_block_round_trip_from_a_topology():
    fabric = read_slurm_topology(DRA)
    topo = Topology.from_parts(None, fabric, name="rt")
    text = write_slurm_topology(topo, "block")
    assert text.endswith("BlockSizes=8,16,32\n")
    again = read_slurm_topology(io.StringIO(text))
    for level in fabric.levels:
        part = {h.name: h.domains[level] for h in fabric.hosts.values()}
        back = {h.name: h.domains[level] for h in again.hosts.values()}
        assert _groups(part) == _groups(back)


def _groups(mapping):
    out = {}
    for host, dom in mapping.items():
        out.setdefault(dom, set()).add(host)
    return sorted(sorted(g) for g in out.values())


def test_preset_writes_a_conf_slurm_reads():
    topo = Topology.preset("h100-superpod", nodes=64)
    fabric = read_slurm_topology(io.StringIO(write_slurm_topology(topo)))
    assert len(fabric.hosts) == 64 and fabric.levels == topo.level_names[1:]


@pytest.fixture(scope="module")
def placement():
    topo = Topology.from_parts(_h100(), read_slurm_topology(TREE), name="dev")
    state = gpuplace.ClusterState(topo)
    state.allocate(name="bg", gpus=[0, 1, 2])  # dev0 partly busy
    return gpuplace.place(state, gpuplace.Job(name="tp8", tp=8, dp=2))


def test_placement_writers_agree_with_each_other(placement):
    hosts = expand(slurm_hostlist(placement))
    assert sorted(hosts) == sorted(placement.nodes) and len(hosts) == 2
    rows = rank_table(placement)
    assert [r["rank"] for r in rows] == list(range(16))
    cvd = dict(
        line.replace(" CUDA_VISIBLE_DEVICES=", "=").split("=")
        for line in write_cuda_visible_devices(placement).splitlines()
    )
    for r in rows:  # local rank k uses the k-th visible device: the GPU the solver chose
        assert int(cvd[r["host"]].split(",")[r["local_rank"]]) == r["device"]
        gpu = int(placement.gpus[r["rank"]])
        assert placement.topology.local_index(gpu) == r["device"]
    csv = write_rank_table(placement).splitlines()
    assert csv[0] == "rank,host,node_rank,local_rank,device" and len(csv) == 17
    rankfile = write_openmpi_rankfile(placement).splitlines()
    assert rankfile[0].startswith("rank 0=") and rankfile[0].endswith(" slot=0")
    assert write_openmpi_hostfile(placement).count("slots=8") == 2
    lines = write_torchrun_commands(placement).splitlines()
    assert len(lines) == 2 and "--nproc-per-node=8 --node-rank=1" in lines[1]


def test_torchrun_refuses_uneven_or_interleaved_ranks():
    topo = Topology.from_parts(_h100(), read_slurm_topology(TREE), name="dev")
    p = gpuplace.place(gpuplace.ClusterState(topo), gpuplace.Job(name="j", tp=2))

    def with_gpus(gpus):
        return dataclasses.replace(p, gpus=np.array(gpus, dtype=np.int64))

    assert write_torchrun_commands(with_gpus([0, 8])).count("--nproc-per-node=1") == 2
    with pytest.raises(InvalidJob, match="same number of ranks"):
        write_torchrun_commands(with_gpus([0, 8, 1]))
    with pytest.raises(InvalidJob, match="node by node"):
        write_torchrun_commands(with_gpus([0, 8, 1, 9]))
    assert write_openmpi_rankfile(with_gpus([0, 8, 1, 9])).splitlines()[2] == "rank 2=dev0 slot=1"


def test_k8s_node_affinity(placement):
    aff = k8s_node_affinity(placement)
    terms = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (expr,) = terms["nodeSelectorTerms"][0]["matchExpressions"]
    assert expr == {
        "key": "kubernetes.io/hostname",
        "operator": "In",
        "values": sorted(placement.nodes),
    }
