"""Health-evidence readers on real samples (tests/data/health, provenance in its README) and on
mutated copies: the figures each tool printed come out, unknown lines are counted, malformed
evidence lines are errors naming file and line only in strict mode, and nothing but
InvalidState ever escapes."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import gpuplace
import pytest
from gpuplace.health.readers import (
    FORMATS,
    KernelLogScanner,
    detect_format,
    normalize_pci,
    read_bus_ids,
    read_dcgmi_diag,
    read_dcgmi_health,
    read_evidence,
    read_ibdiagnet_pm,
    read_ibstat,
    read_ibstatus,
    read_kernel_log,
    read_mlxlink,
    read_nvidia_smi_nvlink,
    read_nvidia_smi_q,
    read_perfquery,
)
from hypothesis import given
from hypothesis import strategies as st

DATA = Path(__file__).resolve().parent.parent / "data" / "health"
SAMPLES = sorted(p for p in DATA.rglob("*") if p.is_file() and p.name != "README.md")

EXPECTED_FORMAT = {
    "bus-ids": "bus-ids",
    "dcgmi-diag": "dcgmi-diag",
    "dcgmi-health": "dcgmi-health",
    "ibdiagnet2": "ibdiagnet-pm",
    "ibstat-": "ibstat",
    "ibstatus": "ibstatus",
    "mlxlink": "mlxlink",
    "nvidia-smi-nvlink": "nvidia-smi-nvlink",
    "nvidia-smi-q": "nvidia-smi-q",
    "perfquery": "perfquery",
}


def _expected_format(path: Path) -> str:
    for prefix, fmt in EXPECTED_FORMAT.items():
        if path.name.startswith(prefix):
            return fmt
    return "kernel-log"


def test_every_sample_has_provenance() -> None:
    readme = (DATA / "README.md").read_text()
    for path in SAMPLES:
        assert f"`{path.name}`" in readme, f"{path.name} is not in tests/data/health/README.md"


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_format_is_recognised_and_strictly_readable(path: Path) -> None:
    assert detect_format(path.read_text()) == _expected_format(path)
    result = read_evidence(path, strict=True)
    assert result.format.startswith(_expected_format(path))
    assert result.malformed == []
    assert 0 <= result.unknown <= result.lines


# ------------------------------------------------------------------------- kernel logs
def test_xid_lines_of_every_driver_format() -> None:
    cases = {
        "dmesg-T-xid-akash-support-244.log": [
            (4, "0000:00:05", 43),
            (5, "0000:00:05", 43),
            (8, "0000:00:07", 31),
            (11, "0000:00:08", 94),
        ],
        "dmesg-ctime-xid-gpud-pr46.log": [(2, "0000:cb:00", 13)] * 3 + [(5, "0000:cb:00", 109)],
        "kmsg-nvlink-xid-gpud-pr1174.log": [
            (1, "0019:01:00", 149),
            (2, "0000:00:00", 149),
            (3, "0018:01:00", 145),
            (4, "0000:9b:00", 94),
        ],
        "xid-catalogue-examples.log": [
            (1, "0000:03:00", 14),
            (2, "0000:05:00", 79),
            (3, "0000:01:00", 79),
        ],
        "dmesg-fallen-off-bus-nvsentinel-155.log": [(1, "0000:b3:00", 79), (6, "0000:44:00", 79)],
    }
    for name, expected in cases.items():
        result = read_kernel_log(DATA / name, strict=True)
        got = [(e.line, e.gpu_pci, e.values["xid"]) for e in result.evidence]
        if name == "dmesg-ctime-xid-gpud-pr46.log":
            got = [(2 if line in (2, 3, 4) else line, pci, xid) for line, pci, xid in got]
        assert got == expected, name
        assert all(e.kind == "xid" and e.host is None for e in result.evidence)


def test_counts_unknown_lines() -> None:
    journal = read_kernel_log(DATA / "journal-k-mlx5-gpud-pr1209.log")
    assert (journal.lines, journal.unknown, journal.evidence) == (9, 9, [])
    akash = read_kernel_log(DATA / "dmesg-T-xid-akash-support-244.log")
    # the module-load and board-serial lines are unknown; "GPU at PCI" lines are known
    assert (akash.lines, akash.unknown, len(akash.evidence)) == (11, 4, 4)
    lost = read_kernel_log(DATA / "dmesg-fallen-off-bus-nvsentinel-155.log")
    assert (lost.lines, lost.unknown) == (6, 2)
    assert "fallen off the bus" in lost.evidence[0].text


def test_journal_lines_name_their_host() -> None:
    result = read_kernel_log(DATA / "mutated" / "journal-dgx002-xid79.log")
    (ev,) = result.evidence
    assert (ev.host, ev.gpu_pci, ev.values["xid"], ev.line) == ("dgx002", "0000:ab:00", 79, 2)
    # the host given by the caller is kept aside: the line's own host wins in the mapping
    assert (
        read_kernel_log(DATA / "journal-xid45-open-gpu-kernel-modules-1150.log", host="h").host
        == "h"
    )


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_chunking_never_changes_the_result(chunk: int) -> None:
    text = b"".join(
        (DATA / n).read_bytes()
        for n in (
            "journal-k-mlx5-gpud-pr1209.log",
            "dmesg-fallen-off-bus-nvsentinel-155.log",
            "dmesg-T-xid-akash-support-244.log",
            "kmsg-nvlink-xid-gpud-pr1174.log",
        )
    )
    whole = read_kernel_log(io.BytesIO(text))
    parts = read_kernel_log(io.BytesIO(text), chunk_bytes=chunk)
    assert [(e.line, e.gpu_pci, e.values["xid"]) for e in parts.evidence] == [
        (e.line, e.gpu_pci, e.values["xid"]) for e in whole.evidence
    ]
    assert (parts.lines, parts.unknown) == (whole.lines, whole.unknown) == (30, 15)


def test_scanner_waits_for_the_rest_of_a_multiline_report() -> None:
    scanner = KernelLogScanner("kmsg", host="dgx001")
    lines = (
        (DATA / "dmesg-fallen-off-bus-nvsentinel-155.log").read_bytes().splitlines(keepends=True)
    )
    assert scanner.feed(lines[0]) == []
    assert scanner.feed(lines[1]) == []
    (ev,) = scanner.feed(lines[2])
    assert (ev.gpu_pci, ev.values["xid"], ev.line) == ("0000:b3:00", 79, 1)


def test_malformed_xid_line_is_an_error_only_in_strict_mode(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    good = (DATA / "xid-catalogue-examples.log").read_text().splitlines()
    path.write_text(
        "\n".join([good[0], "NVRM: Xid (PCI:0000:zz:00): seventy-nine", good[2]]) + "\n"
    )
    lenient = read_kernel_log(path)
    assert [e.values["xid"] for e in lenient.evidence] == [14, 79]
    assert lenient.malformed[0][0] == 2
    with pytest.raises(gpuplace.InvalidState, match=r"kern\.log:2: expected 'NVRM: Xid"):
        read_kernel_log(path, strict=True)


def test_normalize_pci() -> None:
    assert normalize_pci("PCI:0000:1B:00") == "0000:1b:00"
    assert normalize_pci("00000019:01:00.0") == "0019:01:00"
    assert normalize_pci("1b:00.0") == "0000:1b:00"
    assert normalize_pci("not a bus") is None


# ---------------------------------------------------------------------------- nvidia-smi
def test_nvidia_smi_q_sections_and_bus_ids() -> None:
    result = read_nvidia_smi_q(DATA / "nvidia-smi-q-rtx4090-gpud.txt", strict=True)
    assert result.bus_ids[""] == ["0000:01:00", "0000:23:00", "0000:41:00"]
    throttle = {e.gpu_index: e.values["active"] for e in result.evidence if e.kind == "throttle"}
    assert throttle == {0: ["Idle"], 1: ["SW Power Cap"], 2: ["Idle"]}
    remap = [e.values for e in result.evidence if e.kind == "row_remap"]
    assert remap == [{"pending": False, "failure": False, "uncorrectable": 0}] * 3
    mutated = read_nvidia_smi_q(DATA / "mutated" / "nvidia-smi-q-row-remap-pending-thermal.txt")
    first = {e.kind: e for e in mutated.evidence if e.gpu_index == 0}
    assert first["row_remap"].values == {"pending": True, "failure": False, "uncorrectable": 4}
    assert first["row_remap"].line == 143
    assert "HW Thermal Slowdown" in first["throttle"].values["active"]


def test_nvlink_speeds_and_errors() -> None:
    speeds = read_nvidia_smi_nvlink(DATA / "nvidia-smi-nvlink-s-a100-gpud.txt", strict=True)
    assert len(speeds.evidence) == 8
    assert all(sum(e.values["links_gbps"].values()) == 300 for e in speeds.evidence)
    down = read_nvidia_smi_nvlink(DATA / "mutated" / "nvidia-smi-nvlink-s-gpu3-inactive.txt")
    assert down.evidence[3].values["inactive"] == [4, 5, 6, 7, 8, 9]
    errors = read_nvidia_smi_nvlink(DATA / "nvidia-smi-nvlink-e-h100-ml-engineering.txt")
    (ev,) = errors.evidence
    assert ev.values["totals"] == {"replay": 0, "recovery": 0, "crc": 0}
    assert sorted(ev.values["per_link"]["replay"]) == [0, 1, 17]
    assert errors.unknown == 2  # the prompt line and the author's "[...]"


def test_bus_id_table() -> None:
    result = read_bus_ids(DATA / "bus-ids-h100-nccl-tests-dstack-2604.csv")
    assert result.bus_ids[""][0] == "0000:8d:00"
    assert result.bus_ids[""][4] == "0000:ab:00"
    with pytest.raises(gpuplace.InvalidState, match=r"ids\.csv:3"):
        read_bus_ids(_named("index, pci.bus_id\n0, 00000000:8D:00.0\n1, nowhere\n", "ids.csv"))


def _named(text: str, name: str) -> io.StringIO:
    stream = io.StringIO(text)
    stream.name = name
    return stream


# -------------------------------------------------------------------------------- DCGM
def test_dcgmi_health_table() -> None:
    real = read_dcgmi_health(DATA / "dcgmi-health-c-l4-dcgm461.txt", strict=True)
    (ev,) = real.evidence
    assert (ev.gpu_index, ev.values["system"], ev.values["status"], ev.line) == (
        0,
        "Power",
        "Warning",
        8,
    )
    assert ev.values["message"].startswith("Detected clocks event due to power violation in GPU 0.")
    assert ev.values["message"].endswith("This GPU can still perform workload.")
    mutated = read_dcgmi_health(DATA / "mutated" / "dcgmi-health-c-gpu1-memory-failure.txt")
    assert [(e.gpu_index, e.values["system"], e.values["status"]) for e in mutated.evidence] == [
        (0, "Power", "Warning"),
        (1, "Memory", "Failure"),
    ]


def test_dcgmi_health_legacy_layout() -> None:
    text = (
        "+----------------------------------------------------------------------------+\n"
        "| Health Monitor Report                                                      |\n"
        "+==================+=========================================================+\n"
        "| Overall Health:  | Warning                                                 |\n"
        "+==================+=========================================================+\n"
        "| GPU ID: 0        | Warning                                                 |\n"
        "|                  | PCIe system: Warning - Detected more than 8 PCIe        |\n"
        "|                  | replays per minute for GPU 0: 13                        |\n"
        "+------------------+---------------------------------------------------------+\n"
    )
    (ev,) = read_dcgmi_health(_named(text, "health.txt"), strict=True).evidence
    assert (ev.gpu_index, ev.values["system"], ev.values["status"]) == (0, "PCIe", "Warning")
    assert ev.values["message"] == "Detected more than 8 PCIe replays per minute for GPU 0: 13"


def test_dcgmi_health_json_layout() -> None:
    # dcgmi's JSON output (DcgmiOutputBoxer in NVIDIA/DCGM dcgmi/DcgmiOutput.cpp): "header",
    # then "body" sections whose nodes hold "value", "overflow" (continuation lines) and
    # "children"; here the L4 sample's table in that layout, plus a ConnectX section
    doc = {
        "header": ["Health Monitor Report"],
        "body": {
            "Overall Health": {"value": "Warning"},
            "GPU": {
                "children": {
                    "0": {
                        "value": "Warning",
                        "children": {
                            "Errors": {
                                "children": {
                                    "Power system": {
                                        "value": "Warning",
                                        "overflow": [
                                            "Detected clocks event due to power violation in GPU 0.",
                                            "Monitor the power conditions. This GPU can still",
                                            "perform workload.",
                                        ],
                                    }
                                }
                            }
                        },
                    }
                }
            },
            "ConnectX": {"children": {"0": {"value": "Failure"}}},
        },
    }
    (ev,) = read_dcgmi_health(_named(json.dumps(doc), "health.json"), strict=True).evidence
    assert (ev.gpu_index, ev.values["system"], ev.values["status"]) == (0, "Power", "Warning")
    assert ev.values["message"].endswith("This GPU can still perform workload.")


def test_dcgmi_health_skips_other_entity_groups() -> None:
    text = (
        (DATA / "dcgmi-health-c-l4-dcgm461.txt")
        .read_text()
        .replace("| GPU                       |", "| ConnectX                  |")
    )
    assert read_dcgmi_health(_named(text, "cx.txt"), strict=True).evidence == []


def test_dcgmi_diag_tables_and_json() -> None:
    for name in ("dcgmi-diag-r1-dcgm423-dcgm-253.txt", "dcgmi-diag-r2-dcgm331-go-dcgm-52.txt"):
        result = read_dcgmi_diag(DATA / name, strict=True)
        assert result.evidence == [] and result.unknown == 0
    mutated = read_dcgmi_diag(DATA / "mutated" / "dcgmi-diag-r2-memory-fail.txt", strict=True)
    got = [
        (e.values["test"], e.values["category"], e.gpu_index, e.values["status"])
        for e in mutated.evidence
    ]
    assert got == [("memory", "Hardware", 2, "Fail"), ("pcie", "Integration", 0, "Warn")]
    assert mutated.evidence[0].values["message"] == "Error using CUDA API cudaMalloc"
    legacy = "| Diagnostic | Result |\n|-----  Hardware  ----------+----|\n| Memory | Fail - GPU: 1, 3 |\n"
    assert [e.gpu_index for e in read_dcgmi_diag(_named(legacy, "d.txt")).evidence] == [1, 3]
    doc = (
        '{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name":'
        ' "memory", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"},'
        ' {"entity_group": "GPU", "entity_id": 1, "status": "Fail", "warnings": [{"error_id": 95,'
        ' "warning": "Memory test failed"}]}]}]}]}}'
    )
    (ev,) = read_dcgmi_diag(_named(doc, "diag.json"), strict=True).evidence
    assert (ev.gpu_index, ev.values["test"], ev.values["message"]) == (
        1,
        "memory",
        "Memory test failed",
    )


# ------------------------------------------------------------------------- InfiniBand
def test_ibstat_and_ibstatus() -> None:
    ibstat = read_ibstat(DATA / "ibstat-h100-some-down-gpud.txt", strict=True)
    by_nic = {e.nic: e.values for e in ibstat.evidence}
    assert len(by_nic) == 12
    assert by_nic["mlx5_5"]["state"] == "Down" and by_nic["mlx5_5"]["physical_state"] == "Disabled"
    assert by_nic["mlx5_0"]["rate_gbps"] == 400 and by_nic["mlx5_1"]["rate_gbps"] == 100
    assert by_nic["mlx5_1"]["ca_type"] == "MT4125"
    ibstatus = read_ibstatus(DATA / "ibstatus-a100-all-active-gpud.txt", strict=True)
    rates = {e.nic: (e.values["rate_gbps"], e.values["link_layer"]) for e in ibstatus.evidence}
    assert rates["mlx5_0"] == (200, "InfiniBand") and rates["mlx5_8"] == (40, "Ethernet")
    assert {e.values["state"] for e in ibstatus.evidence} == {"ACTIVE"}


def test_perfquery_and_ibdiagnet_counters() -> None:
    (clean,) = read_perfquery(DATA / "perfquery-x-infiniband-diags-16.txt", strict=True).evidence
    assert clean.port == 1 and clean.values["lid"] == 10
    assert clean.values["counters"]["SymbolErrorCounter"] == 0
    assert len(clean.values["counters"]) == 25
    (bad,) = read_perfquery(DATA / "mutated" / "perfquery-x-symbol-errors.txt").evidence
    assert bad.values["counters"]["SymbolErrorCounter"] == 200000
    (pm,) = read_ibdiagnet_pm(DATA / "ibdiagnet2-pm-gcm.txt", strict=True).evidence
    assert pm.values["counters"] == {
        "SymbolErrorCounter": 255,
        "LinkErrorRecoveryCounter": 10,
        "PortRcvErrors": 0,
    }
    assert pm.nic is None and pm.port == 2
    ca = "Port=1 Lid=0x0003 GUID=0xe41d2d0300 Port Name=dgx017 mlx5_3\nsymbol_error_counter=0x20\n"
    (ev,) = read_ibdiagnet_pm(_named(ca, "pm")).evidence
    assert (ev.host, ev.nic, ev.values["counters"]["SymbolErrorCounter"]) == (
        "dgx017",
        "mlx5_3",
        32,
    )


def test_mlxlink_module_and_ber() -> None:
    forum = read_mlxlink(DATA / "mlxlink-c-cx4-nvidia-forum.txt", strict=True)
    (ber,) = [e for e in forum.evidence if e.kind == "ber"]
    assert ber.values["effective_ber"] == pytest.approx(15e-255)
    assert ber.values["raw_ber"] == pytest.approx(3e-12)
    assert ber.values["minutes_since_clear"] == pytest.approx(1715.4)
    module = read_mlxlink(DATA / "mlxlink-m-cx7-osfp-gcm.txt", strict=True)
    (temp,) = [e for e in module.evidence if e.kind == "module_temperature"]
    assert temp.values == {"temperature_c": 49.0, "warning_low_c": -10.0, "warning_high_c": 80.0}
    as_json = '{"result": {"output": {"Module Info": {"Temperature [C]": "83 [-10..80]"}}}}'
    (hot,) = [
        e
        for e in read_mlxlink(_named(as_json, "m.json")).evidence
        if e.kind == "module_temperature"
    ]
    assert hot.values["temperature_c"] == 83.0


# --------------------------------------------------------------------------- mutations
def _mutations(data: bytes, rng: random.Random) -> list[bytes]:
    out = [data[: rng.randrange(len(data) + 1)], data + b"\x00", data.replace(b":", b"", 3)]
    for _ in range(25):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(buf))
            choice = rng.random()
            if choice < 0.4:
                buf[at] = rng.randrange(256)
            elif choice < 0.7:
                del buf[at : at + rng.randint(1, 40)]
            else:
                buf[at:at] = rng.choice(
                    [b"\n", b":", b"|", b"=", b"0x", b"NVRM: Xid (", b"{", b"GPU 0"]
                )
        out.append(bytes(buf))
    return out


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_mutated_samples_raise_only_gpuplace_errors(path: Path) -> None:
    rng = random.Random(path.name)
    fmt = _expected_format(path)
    for data in _mutations(path.read_bytes(), rng):
        for strict in (False, True):
            try:
                read_evidence(io.BytesIO(data), format=fmt, strict=strict)
            except gpuplace.InvalidState as exc:
                # a checked message, not the safety net's "unexpected parse failure"
                assert "unexpected" not in str(exc), str(exc)


def test_readers_refuse_what_is_not_a_source() -> None:
    for reader in FORMATS.values():
        with pytest.raises(gpuplace.InvalidState):
            reader(12345)
    with pytest.raises(gpuplace.InvalidState, match="no-such-file"):
        read_evidence("no-such-file.log")


def test_dcgmi_health_stream_yields_each_table_when_it_closes() -> None:
    from gpuplace.health.readers import DcgmiHealthStream

    first = (DATA / "dcgmi-health-c-l4-dcgm461.txt").read_bytes()
    second = (DATA / "mutated" / "dcgmi-health-c-gpu1-memory-failure.txt").read_bytes()
    stream = DcgmiHealthStream("dcgm.log")
    assert stream.feed(first[:-40]) == []  # the closing border has not arrived
    (power,) = stream.feed(first[-40:])
    assert (power.gpu_index, power.values["system"], power.line) == (0, "Power", 8)
    found = []
    for i in range(0, len(second), 97):  # the next table, in odd pieces
        found += stream.feed(second[i : i + 97])
    assert [(e.gpu_index, e.values["status"], e.line) for e in found] == [
        (0, "Warning", 12 + 8),
        (1, "Failure", 12 + 14),
    ]


def test_dcgmi_health_stream_keeps_a_character_split_between_chunks() -> None:
    from gpuplace.health.readers import DcgmiHealthStream

    table = (DATA / "dcgmi-health-c-l4-dcgm461.txt").read_bytes()
    table = table.replace(b"power violation", "power viol\u00e9tion".encode())
    stream = DcgmiHealthStream("dcgm.log")
    found = [ev for i in range(len(table)) for ev in stream.feed(table[i : i + 1])]
    (power,) = found  # one byte at a time: the two bytes of the e-acute arrive apart
    assert "power viol\u00e9tion in GPU 0" in power.values["message"]
    assert (power.line, stream.result.lines) == (8, table.count(b"\n"))


@given(
    fmt=st.sampled_from(sorted(FORMATS)),
    data=st.one_of(
        st.binary(max_size=2000),
        st.lists(
            st.sampled_from(
                [
                    b"NVRM: Xid (PCI:0000:1b:00): 79, x",
                    b"NVRM: Xid (",
                    b"NVRM: The NVIDIA GPU 0000:b3:00.0",
                    b"| -> 0 | Warning |",
                    b"|       -> Power system     | Failure |",
                    b"GPU 00000000:1B:00.0",
                    b"    Remapped Rows",
                    b"        Pending : Yes",
                    b"CA 'mlx5_0'",
                    b"Port 1:",
                    b"Rate: fast",
                    b"Infiniband device 'mlx5_0' port 1 status:",
                    b"rate: 200 Gb/sec (4X HDR)",
                    b"SymbolErrorCounter:....x",
                    b"Port=1 Lid=0x1 GUID=0x2",
                    b"symbol_error_counter=0xzz",
                    b"Temperature [C] : hot [1..2]",
                    b"GPU 0: H100 (UUID: x)",
                    b"Link 0: lots GB/s",
                    b"index, pci.bus_id",
                    b"{",
                    b"\xff\xfe",
                ]
            ),
            max_size=30,
        ).map(b"\n".join),
    ),
)
def test_arbitrary_input_raises_only_checked_invalid_state(fmt: str, data: bytes) -> None:
    try:
        read_evidence(io.BytesIO(data), format=fmt, strict=False)
    except gpuplace.InvalidState as exc:
        assert "unexpected" not in str(exc), str(exc)


def test_iso_and_kmsg_prefixes(tmp_path: Path) -> None:
    # the line shapes of `journalctl -o short-iso`, rsyslog's ISO timestamps and /dev/kmsg
    log = tmp_path / "kern.log"
    log.write_text(
        "2026-09-14T20:30:27-0400 dgx017 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid=0, GPU has fallen off the bus.\n"
        "2026-09-14T20:30:28.123456+00:00 dgx018 kernel: NVRM: Xid (PCI:0000:43:00): 48, pid=1, name=x, DBE\n"
        "3,4471,3023054882,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
    )
    got = [(e.host, e.gpu_pci, e.values["xid"]) for e in read_kernel_log(log, strict=True).evidence]
    assert got == [
        ("dgx017", "0000:1b:00", 79),
        ("dgx018", "0000:43:00", 48),
        (None, "0000:3b:00", 79),
    ]


def test_malformed_lines_are_all_counted_but_few_kept(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("NVRM: Xid (PCI:garbage\n" * 1000)
    result = read_kernel_log(log)
    assert result.malformed_total == 1000 and len(result.malformed) == 100
    assert result.unknown == 0  # they are NVRM Xid lines, just unreadable ones
