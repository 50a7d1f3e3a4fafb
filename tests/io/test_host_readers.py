"""nvidia-smi and rocm-smi samples parse to the values read off each sample by hand."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from gpuplace.errors import InvalidTopology
from gpuplace.io import read_nvidia_smi_topo, read_rocm_smi_topo, to_topology_dict

DATA = Path(__file__).resolve().parents[1] / "data" / "topologies"


def test_hgx_h100_rail_sample():
    node = read_nvidia_smi_topo(
        DATA / "nvidia-smi-topo-hgx-h100-8gpu-8nic-rail.txt", gpu_model="H100 80GB HBM3"
    )
    assert node.gpus == 8
    assert {c for r, row in enumerate(node.link_classes) for c in row if c != "X"} == {"NV18"}
    assert node.nics == [f"mlx5_{i}" for i in range(8)]  # from the NIC Legend
    assert node.gpu_nic == list(range(8))  # one PIX NIC per GPU: a rail layout
    assert node.numa == [0, 0, 0, 0, 1, 1, 1, 1]
    assert node.cpu_affinity[4] == "48-95,144-191"
    assert node.bandwidth_gbps[0][7] == pytest.approx(18 * 20.6)  # Hopper NVLink, NCCL topo.h
    d = to_topology_dict(node, None, name="hgx")
    assert [lv["name"] for lv in d["levels"]] == ["numa", "node"]
    assert d["node_types"][node.name]["sublevels"] == {"numa": [0, 0, 0, 0, 1, 1, 1, 1]}


def test_hopper_guess_is_a_warning_not_silent():
    node = read_nvidia_smi_topo(DATA / "nvidia-smi-topo-hgx-h100-8gpu-8nic-rail.txt")
    assert node.gpu_generation == "hopper"
    assert any("generation unknown" in w for w in node.warnings)


def test_dgx1_partial_mesh_with_mlx5_columns():
    node = read_nvidia_smi_topo(
        DATA / "nvidia-smi-topo-dgx1-v100-4nic-pytorch-ddp-readme.txt",
        gpu_model="Tesla V100-SXM2-16GB",
    )
    assert node.gpus == 8
    assert node.link_classes[0] == [
        "X",
        "NV1",
        "NV1",
        "NV2",
        "NV2",
        "SYS",
        "SYS",
        "SYS",
    ]
    assert node.link_classes[4][0] == "NV2"
    assert node.nics == ["mlx5_2", "mlx5_0", "mlx5_3", "mlx5_1"]  # column order kept
    # GPU0/1 PIX mlx5_0, GPU2/3 PIX mlx5_1, GPU4/5 PIX mlx5_2, GPU6/7 PIX mlx5_3
    assert [node.nics[i] for i in node.gpu_nic] == [
        "mlx5_0",
        "mlx5_0",
        "mlx5_1",
        "mlx5_1",
        "mlx5_2",
        "mlx5_2",
        "mlx5_3",
        "mlx5_3",
    ]
    assert node.numa == [None] * 8  # this driver printed no NUMA Affinity column
    bw = node.bandwidth_gbps
    assert bw[0][1] == pytest.approx(20.0) and bw[0][3] == pytest.approx(40.0)  # Volta 20/link
    assert bw[0][5] == pytest.approx(8.0)  # SYS: half of PCIe Gen3's 16
    d = to_topology_dict(node, None, name="dgx1")
    assert [lv["name"] for lv in d["levels"]] == ["node"]
    assert d["node_types"][node.name]["bandwidth_gbps"][0][5] == pytest.approx(8.0)


def test_gb200_tray_with_rack_nvlink_domain():
    node = read_nvidia_smi_topo(
        DATA / "nvidia-smi-topo-gb200-4gpu-8nic.txt",
        gpu_model="NVIDIA GB200",
        nvlink_domain_gpus=72,
    )
    assert node.gpus == 4 and node.gpu_generation == "blackwell"
    assert node.bandwidth_gbps[0][1] == pytest.approx(18 * 40.1)
    assert node.numa == [0, 0, 1, 1]  # first id of "0,3-9,11-17"
    assert node.gpu_nic == [None] * 4  # every NIC is SYS from every GPU
    assert node.nvlink_domain_gpus == 72
    with pytest.raises(InvalidTopology, match="multiple"):
        read_nvidia_smi_topo(DATA / "nvidia-smi-topo-gb200-4gpu-8nic.txt", nvlink_domain_gpus=70)


def test_gb200_rack_domain_maps_to_a_block_level():
    from gpuplace.io import read_slurm_topology

    node = read_nvidia_smi_topo(
        DATA / "nvidia-smi-topo-gb200-4gpu-8nic.txt",
        gpu_model="NVIDIA GB200",
        nvlink_domain_gpus=72,
    )
    conf = "BlockName=rack1 Nodes=tray[01-18]\nBlockName=rack2 Nodes=tray[19-36]\nBlockSizes=18\n"
    fabric = read_slurm_topology(io.StringIO(conf))
    d = to_topology_dict(node, fabric, name="nvl72")
    assert d["nvlink_domain"] == "block"
    assert [lv["name"] for lv in d["levels"]] == ["numa", "node", "block", "root"]


def test_rtx4090_tab_layout_with_empty_fields_and_no_nic_legend():
    node = read_nvidia_smi_topo(
        DATA / "nvidia-smi-topo-rtx4090-8gpu-2nic-tabs.txt",
        gpu_model="NVIDIA GeForce RTX 4090",
    )
    assert node.gpus == 8 and node.gpu_generation == "ada"
    assert node.nics == ["NIC0", "NIC1"]
    assert node.gpu_nic == [None] * 6 + [0, None]  # only GPU6 is PHB to a NIC
    assert node.numa == [0, 0, 0, 0, 1, 1, 1, 1]
    assert node.bandwidth_gbps[0][1] == pytest.approx(16.0)  # SYS over PCIe Gen4


def test_glued_columns_and_banner():
    text = (
        "$ nvidia-smi topo -m\n"
        "\tGPU0\tGPU1\tNIC0NIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNV4\tPIX\tNODE\t0-3\t0\t\tN/A\n"
        "GPU1\tNV4\t X \tNODENODE\t0-3\t0\t\tN/A\n"
        "NIC0\tPIX\tNODE\t X \tPIX\n"
        "NIC1\tNODE\tNODE\tPIX\t X\n"
    )
    node = read_nvidia_smi_topo(io.StringIO(text), gpu_generation="ampere")
    assert node.gpus == 2 and node.nics == ["NIC0", "NIC1"]
    assert node.gpu_nic == [0, 1]  # GPU1's tie broken toward the unused NIC
    assert node.bandwidth_gbps[0][1] == pytest.approx(80.0)


def test_gpu_names_around_the_matrix_set_the_generation():
    text = (
        "GPU 0,1: NVIDIA A100-SXM4-80GB\n"
        "        GPU0    GPU1\nGPU0     X      NV12\nGPU1    NV12     X\n"
    )
    node = read_nvidia_smi_topo(io.StringIO(text))
    assert node.gpu_generation == "ampere" and not node.warnings
    assert node.bandwidth_gbps[0][1] == pytest.approx(240.0)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "header line"),
        ("        GPU0    GPU1\nGPU0     X      NV1\n", "missing GPU1"),
        (
            "        GPU0    GPU1\nGPU0     X      NV1\nGPU1    NV2     X\n",
            "not symmetric",
        ),
        ("        GPU0\nGPU0     Y\n", "link class"),
    ],
)
def test_bad_matrices_name_the_problem(text, expected):
    with pytest.raises(InvalidTopology, match=expected):
        read_nvidia_smi_topo(io.StringIO(text))


def test_rocm_pcie_only_sample():
    node = read_rocm_smi_topo(DATA / "rocm-smi-showtopo-4gpu-pcie-rocm-smi-lib-issue108.txt")
    assert node.gpus == 4
    assert node.link_classes[0] == ["X", "PCIE", "PCIE", "PCIE"]
    assert node.numa == [0, 1, 3, 2]
    assert node.bandwidth_gbps[0][1] == pytest.approx(16.0)  # hops 3: crosses sockets


def test_rocm_two_xgmi_hives():
    node = read_rocm_smi_topo(DATA / "rocm-smi-showtopo-8gpu-2xgmi-hives.txt")
    assert node.gpus == 8 and node.numa == [0, 0, 0, 0, 1, 1, 1, 1]
    assert node.bandwidth_gbps[0][3] == pytest.approx(64.0)
    assert node.bandwidth_gbps[0][4] == pytest.approx(16.0)
    d = to_topology_dict(node, None, name="hives")
    assert "link_classes" not in d["node_types"][node.name]  # XGMI is not an nvidia-smi class


def test_rocm_mi250x_weight_only_excerpt():
    node = read_rocm_smi_topo(
        DATA / "rocm-smi-showtopo-mi250x-8gcd-weight-only-vllm-issue16840.txt"
    )
    assert node.gpus == 8 and any("inferred" in w for w in node.warnings)
    assert node.bandwidth_gbps[0][1] == pytest.approx(64.0)  # weight 15: one hop
    assert node.bandwidth_gbps[0][3] == pytest.approx(32.0)  # weight 30: two hops
    assert node.bandwidth_gbps[1][7] == pytest.approx(64.0 / 3, abs=1e-3)  # weight 45
