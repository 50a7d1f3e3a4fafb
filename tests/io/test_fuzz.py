"""Readers raise nothing but InvalidTopology, whatever the input: generated text and real
samples cut short, with bytes flipped or lines dropped."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest
from fuzz import engine
from gpuplace import Topology
from gpuplace.errors import InvalidTopology
from gpuplace.io import (
    Fabric,
    read_ec2_topology,
    read_ibnetdiscover,
    read_k8s_nodes,
    read_nvidia_smi_topo,
    read_rocm_smi_topo,
    read_slurm_topology,
    write_slurm_topology,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DATA = Path(__file__).resolve().parents[1] / "data" / "topologies"


READERS = [
    read_nvidia_smi_topo,
    read_rocm_smi_topo,
    read_ibnetdiscover,
    read_slurm_topology,
    read_k8s_nodes,
    read_ec2_topology,
]

SAMPLES = {
    "nvidia-smi-topo-hgx-h100-8gpu-8nic-rail.txt": read_nvidia_smi_topo,
    "nvidia-smi-topo-dgx1-v100-4nic-pytorch-ddp-readme.txt": read_nvidia_smi_topo,
    "nvidia-smi-topo-gb200-4gpu-8nic.txt": read_nvidia_smi_topo,
    "nvidia-smi-topo-rtx4090-8gpu-2nic-tabs.txt": read_nvidia_smi_topo,
    "rocm-smi-showtopo-4gpu-pcie-rocm-smi-lib-issue108.txt": read_rocm_smi_topo,
    "rocm-smi-showtopo-8gpu-2xgmi-hives.txt": read_rocm_smi_topo,
    "ibnetdiscover-rdma-core-manpage-example-sdr.txt": read_ibnetdiscover,
    "ibnetdiscover-topograph-dgx-superpod-ndr-40sw.txt": read_ibnetdiscover,
    "slurm-topology-conf-tree-manpage-example.conf": read_slurm_topology,
    "topograph-generated-topology-tree-oci-sim.conf": read_slurm_topology,
    "topograph-generated-topology-block-dra-sim.conf": read_slurm_topology,
    "ec2-describe-instance-topology-awscli-example.json": read_ec2_topology,
    "ec2-describe-instance-topology-p4de-awesome-networking.json": read_ec2_topology,
    "rocm-smi-showtopo-mi250x-8gcd-weight-only-vllm-issue16840.txt": read_rocm_smi_topo,
    "slurm-topology-yaml-manpage-example.yaml": read_slurm_topology,
}
SAMPLE_BYTES = {name: (DATA / name).read_bytes() for name in SAMPLES}

# Tokens that steer generated text toward the parsers' grammar.
TOKENS = st.sampled_from(
    [
        "GPU0",
        "GPU1",
        "GPU2",
        " X ",
        "NV18",
        "NV1",
        "PIX",
        "SYS",
        "NODE",
        "mlx5_0",
        "NIC0",
        "CPU Affinity",
        "NUMA Affinity",
        "0-47,96",
        "N/A",
        "\t",
        " ",
        "\n",
        "Switch",
        "Ca",
        '"S-1"',
        '"H-2"',
        "[1]",
        "[2]",
        "(abc)",
        "# ",
        '"host mlx5_0"',
        "lid 3",
        "4xNDR",
        "1xSDR",
        "SwitchName=",
        "Nodes=",
        "Switches=",
        "n[1-3]",
        "BlockName=",
        "BlockSizes=",
        "- topology: t",
        "  tree:",
        "    switches:",
        "{",
        "}",
        "[",
        "]",
        '"items"',
        ":",
        "Weight between two GPUs",
        "=====",
        "XGMI",
        "PCIE",
        "15",
        "Numa Node: 0",
    ]
)
TEXT = st.one_of(st.text(max_size=400), st.lists(TOKENS, max_size=80).map("".join))

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _only_invalid_topology(reader, data):
    """The reader, then building a Topology from what it returned, raise only
    InvalidTopology; topology.conf written from that Topology reads back."""
    stream = io.BytesIO(data) if isinstance(data, bytes) else io.StringIO(data)
    try:
        parsed = reader(stream)
        if isinstance(parsed, Fabric):
            topo = Topology.from_parts(None, parsed, name="fuzz")
        else:
            topo = Topology.from_parts(parsed, None, name="fuzz")
    except InvalidTopology:
        return
    if topo.node_level < len(topo.levels) - 1:
        for mode in ("tree", "block"):
            read_slurm_topology(io.StringIO(write_slurm_topology(topo, mode)))


@FUZZ
@given(text=TEXT, which=st.sampled_from(READERS))
def test_generated_text(text, which):
    _only_invalid_topology(which, text)


@FUZZ
@given(
    name=st.sampled_from(sorted(SAMPLES)),
    cut=st.floats(0, 1),
    flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=6),
    drops=st.lists(st.floats(0, 1), max_size=4),
)
def test_mutated_samples(name, cut, flips, drops):
    data = bytearray(SAMPLE_BYTES[name])
    for where, value in flips:
        if data:
            data[int(where * (len(data) - 1))] = value
    lines = bytes(data).split(b"\n")
    for where in drops:
        if lines:
            del lines[int(where * (len(lines) - 1))]
    data = b"\n".join(lines)
    data = data[: int(cut * len(data)) + 1] if cut < 0.95 else data
    _only_invalid_topology(SAMPLES[name], bytes(data))


def test_samples_parse_clean():
    for name, reader in SAMPLES.items():
        reader(DATA / name)


# ---------------------------------------------------------------------------------------------
# Every reader under the mutation fuzzer (tests/fuzz/engine.py), each input in a worker process
# with a time budget (1 s plus 30 µs per byte) and a memory budget (256 MB above the imports):
# an exception that is not a gpuplace error, an error only the readers' safety net caught, a
# hang or a blow-up fails the test. A few seconds per target keep all of them about 2 minutes
# in CI (41 targets at 2.5 s); GPUPLACE_FUZZ_SECONDS deepens the run (`python
# tests/fuzz/engine.py` for long runs).
FUZZ_SECONDS = float(os.environ.get("GPUPLACE_FUZZ_SECONDS", "2.5"))


#: Targets with an open finding, left out of CI until it is fixed (named here, with the finding,
#: so that it is not forgotten). None at present.
KNOWN_OPEN: dict[str, str] = {}


@pytest.mark.parametrize(
    "target",
    [
        pytest.param(name, marks=pytest.mark.skip(reason=KNOWN_OPEN[name]))
        if name in KNOWN_OPEN
        else name
        for name in sorted(engine.TARGETS)
    ],
)
def test_reader_under_the_fuzzer(target):
    report = engine.fuzz(engine.TARGETS[target], seconds=FUZZ_SECONDS, seed=25)
    assert report.inputs >= len(engine.seeds_of(engine.TARGETS[target]))
    findings = "\n".join(
        f"{outcome}: {detail.strip()[-600:]}" for outcome, detail, _ in report.findings[:3]
    )
    assert report.clean, f"{report.line()}\n{findings}"


def test_the_fuzzer_judges_hangs_on_cpu_time():
    """A reader that spins is a hang; one that waits (a worker scheduled late on a loaded
    machine looks the same from outside) is not, until ten times the budget in wall time."""
    worker = engine.Worker(engine.MEMORY_MB)
    try:
        spin = engine.Target("spin", ".txt", (), "exec('while True: pass')")
        outcome, detail = worker.run(spin, b"x", timeout=0.3)
        assert outcome == "hang" and "of CPU" in detail
        wait = engine.Target("wait", ".txt", (), "__import__('time').sleep(1.0)")
        assert worker.run(wait, b"x", timeout=0.3)[0] == "ok"
        stuck = engine.Target("stuck", ".txt", (), "__import__('time').sleep(30)")
        start = time.monotonic()
        assert worker.run(stuck, b"x", timeout=0.3)[0] == "hang"
        assert time.monotonic() - start < 10  # stopped at ten times the budget, not 30 s
    finally:
        worker.stop()


def test_an_extender_body_over_the_services_limit_is_refused_unread():
    """The extender targets read the whole body before parsing it, which the service does not:
    a 73 MB body blew the fuzzer's memory budget. The service answers a body over its limit
    413 before reading further; the targets now take a body as it does (parse_body)."""
    from gpuplace.integrations.extender import MAX_BODY
    from gpuplace.service.app import Limits

    assert Limits().max_body == MAX_BODY
    worker = engine.Worker(engine.MEMORY_MB)
    try:
        body = b"\xff" * 80_000_000  # decoded with replacement: 160 MB in a str
        for target in ("extender-filter", "extender-prioritize"):
            outcome, detail = worker.run(engine.TARGETS[target], body, timeout=engine.TIMEOUT_S)
            assert (outcome, detail) == ("error", f"request body over {MAX_BODY} bytes")
        outcome, detail = worker.run(engine.TARGETS["extender-filter"], b"\xff", timeout=5.0)
        assert (outcome, detail) == ("error", "body: not UTF-8 (byte 0)")
    finally:
        worker.stop()
