"""Bad input never escapes, never hangs, never balloons (issue 25): the reproducers found by
fuzzing the readers, each a gpuplace error naming the file and the line or field.

The hang and blow-up cases run in a child process with a time limit and an address-space
limit (RLIMIT_AS), so that a regression fails the test instead of stalling the suite."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import resource
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import gpuplace
import pytest
import yaml
from gpuplace import Communication
from gpuplace.cli import main
from gpuplace.cli.mig import read_requests
from gpuplace.errors import GpuplaceError, InvalidJob, InvalidState, InvalidTopology
from gpuplace.health.judge import load_rules
from gpuplace.health.readers import read_evidence
from gpuplace.integrations import slurm
from gpuplace.integrations.extender import JOB_ANNOTATION, BadRequest, Extender
from gpuplace.io import read_nvidia_smi_mig, read_nvidia_smi_mig_instances, read_placement_table
from gpuplace.sim.failures import load_failures
from gpuplace.sim.traces import load_workload

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
BIG = "1" * 5000


def cluster_dict() -> dict:
    return {
        "format": "gpuplace.topology/1",
        "name": "small",
        "levels": [
            {"name": "node", "bandwidth_gbps": 450, "latency_us": 1},
            {"name": "leaf", "bandwidth_gbps": 50, "latency_us": 3},
        ],
        "node_types": {
            "hgx": {
                "gpus": 4,
                "gpu_model": "H100-SXM5-80GB",
                "nics": ["mlx5_0", "mlx5_1"],
                "gpu_nic": [0, 0, 1, 1],
            }
        },
        "nodes": [{"name": "h[01-04]", "type": "hgx", "domains": {"leaf": "la"}}],
    }


def sinfo_doc(**node: object) -> dict:
    entry = {"name": "n1", "state": "idle", "gres": "gpu:8", "gres_used": "gpu:0(IDX:N/A)"}
    entry.update(node)
    return {"nodes": [entry]}


def squeue_doc(**job: object) -> dict:
    entry = {"job_id": 1, "name": "j", "job_state": "RUNNING", "nodes": "n1"}
    entry.update(job)
    return {"jobs": [entry]}


def cli_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run the CLI in-process; it must exit 2 with one line on stderr."""
    code = main(list(args))
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuplace: error: "), err
    return lines[0]


# ------------------------------------------------------------------- 1. huge integers
def test_a_5000_digit_integer_in_a_job_file_is_one_line_at_the_cli(tmp_path, capsys):
    job = tmp_path / "j.yaml"
    job.write_text(f"name: a\nparallelism: {{tp: {BIG}}}\n")
    line = cli_error(capsys, "place", "-c", "h100-superpod", "-j", str(job))
    assert "j.yaml" in line and "line 2" in line and "digits" in line


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_5000_digit_integer_in_a_topology_file(tmp_path, suffix):
    doc = cluster_dict()
    path = tmp_path / f"t{suffix}"
    text = json.dumps(doc).replace('"gpus": 4', f'"gpus": {BIG}')
    path.write_text(text)
    with pytest.raises(InvalidTopology, match=r"t\.(yaml|json).*(line 1|digits)"):
        gpuplace.Topology.load(path)


@pytest.mark.parametrize("where", ["nodes", "hosts"])
def test_a_5000_digit_hostlist_in_a_topology_file(tmp_path, where):
    doc = cluster_dict()
    if where == "nodes":
        doc["nodes"][0]["name"] = f"dgx[{BIG}]"
    else:
        doc["attributes"] = [{"hosts": f"h[{BIG}]", "driver": "1"}]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InvalidTopology, match=r"t\.yaml.*digits"):
        gpuplace.Topology.load(path)


def test_a_5000_digit_hostlist_in_squeue():
    with pytest.raises(InvalidState, match=r"jobs\[0\].*nodes.*digits"):
        slurm.read_squeue(io.StringIO(json.dumps(squeue_doc(nodes=f"dgx[{BIG}]"))))


def test_a_5000_digit_integer_in_sinfo_and_squeue():
    text = json.dumps(sinfo_doc()).replace('"idle"', f"{BIG}")
    with pytest.raises(InvalidState, match=r"line 1.*digits"):
        slurm.read_sinfo(io.StringIO(text))
    text = json.dumps(squeue_doc()).replace('"job_id": 1', f'"job_id": {BIG}')
    with pytest.raises(InvalidState, match="digits"):
        slurm.read_squeue(io.StringIO(text))


def test_a_5000_digit_integer_in_a_state_file(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"checksum": "sha256:00", "state": {"jobs": [' + BIG + "]}}")
    with pytest.raises(InvalidState, match=r"s\.json.*line 1.*digits"):
        gpuplace.ClusterState.load(gpuplace.Topology.from_spec("h100-superpod"), path)


def test_a_5000_digit_integer_in_mig_requests_and_workloads(tmp_path):
    requests = tmp_path / "r.yaml"
    requests.write_text(f"requests:\n  - {{name: a, profile: 1g.10gb, count: {BIG}}}\n")
    with pytest.raises(InvalidJob, match=r"r\.yaml: line 2.*digits"):
        read_requests(str(requests))
    workload = tmp_path / "w.yaml"
    workload.write_text(f"jobs:\n  - {{name: a, submit_s: 0, gpus: {BIG}, duration_s: 1}}\n")
    with pytest.raises(InvalidJob, match=r"w\.yaml.*line 2.*digits"):
        load_workload(workload)


# ------------------------------------------------------------------- 2. undecodable bytes
@pytest.mark.parametrize("reader", ["sinfo", "squeue", "topology", "workload", "rules"])
def test_an_undecodable_byte_is_named_with_its_line(tmp_path, reader):
    path = tmp_path / {"workload": "w.csv", "rules": "r.yaml"}.get(reader, f"{reader}.json")
    path.write_bytes(b"{\n\n\xff\n}")
    call = {
        "sinfo": slurm.read_sinfo,
        "squeue": slurm.read_squeue,
        "topology": slurm.read_topology,
        "workload": load_workload,
        "rules": load_rules,
    }[reader]
    with pytest.raises(GpuplaceError, match=rf"{path.name}.*line 3.*UTF-8"):
        call(path)


# ------------------------------------------------------------------- 3. deep nesting
def test_deep_nesting_is_refused_without_recursion_error(tmp_path):
    with pytest.raises(InvalidState, match="nested"):
        slurm.read_squeue(io.StringIO("[" * 100_000))
    path = tmp_path / "w.yaml"
    path.write_text("jobs: " + "[" * 2000)
    with pytest.raises(InvalidJob, match=r"w\.yaml.*nested"):
        load_workload(path)
    path = tmp_path / "t.yaml"
    path.write_text("name: " + "{a: " * 5000)
    with pytest.raises(InvalidTopology, match=r"t\.yaml.*nested"):
        gpuplace.Topology.load(path)


# ------------------------------------------------------------------- 4. sinfo / squeue types
@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (sinfo_doc(gres_used="gpu:8(IDX:²)"), "gres_used"),
        (sinfo_doc(state_flags=1), "state_flags"),
        (sinfo_doc(gres=7), "gres"),
        (sinfo_doc(partitions="p"), "partitions"),
    ],
)
def test_sinfo_type_errors_name_the_field(doc, needle):
    with pytest.raises(InvalidState, match=rf"nodes\[0\].*{needle}"):
        slurm.read_sinfo(io.StringIO(json.dumps(doc)))


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (squeue_doc(gres_detail=5), "gres_detail"),
        (squeue_doc(nodes=5), "nodes"),
        (squeue_doc(gres_detail=["gpu:1(IDX:x)"]), "gres_detail"),
    ],
)
def test_squeue_type_errors_name_the_field(doc, needle):
    with pytest.raises(InvalidState, match=rf"jobs\[0\].*{needle}"):
        slurm.read_squeue(io.StringIO(json.dumps(doc)))


# ------------------------------------------------------------------- 5. Pollux tables
POLLUX_HEAD = "placement,local_bsz,step_time,sync_time\n"


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("1²,32,0.1,0.05", "placement"),
        ("2,32,0.1," + "x" * 140_000, "field larger"),
        ("2,32,0.1," + "1" * 140_000, "more than 1000 digits"),
        ("2,32,0.1,0.05\r3,32,0.1,0.05", "new-line"),
    ],
)
def test_pollux_rows_name_the_line(row, needle):
    job = gpuplace.Job(name="j", communication={"dp": Communication("all-reduce", 4.4e8)})
    with pytest.raises(InvalidJob, match=rf"p\.csv:2: .*{needle}"):
        read_placement_table(_named(POLLUX_HEAD + row + "\n", "p.csv"), job)


def _named(text: str, name: str) -> io.StringIO:
    stream = io.StringIO(text)
    stream.name = name
    return stream


# ------------------------------------------------------------------- 6. workloads
def test_workload_with_mixed_key_types_names_the_job(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("jobs:\n  - {name: a, submit_s: 0, gpus: 8, duration_s: 1, 1: x, zz: y}\n")
    with pytest.raises(InvalidJob, match=r"w\.yaml.*jobs\[0\]"):
        load_workload(path)


def test_workload_csv_field_too_long_names_the_line(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("name,submit_s,gpus,duration_s\na,0,8,1\n" + "b" * 140_000 + ",0,8,1\n")
    with pytest.raises(InvalidJob, match=r"w\.csv.*line 3"):
        load_workload(path)


# ------------------------------------------------------------------- 7. state overflow
def test_a_state_with_an_integer_beyond_64_bits_is_refused(tmp_path):
    topology = gpuplace.Topology.from_spec("h100-superpod")
    state = gpuplace.ClusterState(topology)
    path = tmp_path / "s.json"
    state.save(path)
    document = json.loads(path.read_text())
    document["state"]["jobs"] = [{"name": "j", "gpus": [18446744073709551616]}]
    canonical = json.dumps(document["state"], sort_keys=True, separators=(",", ":"))
    document["checksum"] = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    path.write_text(json.dumps(document))
    with pytest.raises(InvalidState, match=r"s\.json.*jobs\[0\]\.gpus"):
        gpuplace.ClusterState.load(topology, path)


# ------------------------------------------------------------------- 8. health rules
@pytest.mark.parametrize("text", ["ber: null\n", "ber: {packet_bits: x}\n", "ib: 3\n"])
def test_health_rules_of_the_wrong_type_name_the_field(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(InvalidState, match=r"r\.yaml: (ber|ib)"):
        load_rules(path)


# ------------------------------------------------------------------- 9. topology sections
def test_a_duplicate_nic_is_refused_at_load(tmp_path):
    doc = cluster_dict()
    doc["node_types"]["hgx"]["nics"] = ["mlx5_0", "mlx5_0"]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InvalidTopology, match=r"t\.yaml: node_types\.hgx\.nics\[1\]: .*twice"):
        gpuplace.Topology.load(path)


def _with_sections(**sections: Any) -> dict:
    doc = cluster_dict()
    doc["levels"].append({"name": "spine", "bandwidth_gbps": 25, "latency_us": 5})
    doc["nodes"] = [
        {"name": "h[01-04]", "type": "hgx", "domains": {"leaf": "la", "spine": "s"}},
        {"name": "h[05-08]", "type": "hgx", "domains": {"leaf": "lb", "spine": "s"}},
    ]
    doc.update(sections)
    return doc


def _load_error(tmp_path: Path, doc: dict) -> str:
    """The message of loading ``doc``; it must fail at load, not at the first job."""
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InvalidTopology) as info:
        gpuplace.Topology.load(path)
    return str(info.value)


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        # a store attached to a domain that does not exist: refused by the first job that
        # read from it, as "store 'lustre': attach ... is not ... a domain of small"
        (
            {"stores": {"lustre": {"attach": "leaf:lz", "read_gbps": 100, "write_gbps": 50}}},
            "stores.lustre.attach: expected local, remote or a domain ([level:]name; levels "
            "node, leaf, spine), got str 'leaf:lz'",
        ),
        (
            {"stores": {"lustre": {"attach": "spine:la", "read_gbps": 100, "write_gbps": 50}}},
            "stores.lustre.attach: expected local, remote or a domain",
        ),
        # power domains over GPUs without a board power: refused by the first placement as
        # "power domains need every GPU's board power" without file or field
        (
            {
                "node_types": {"hgx": {"gpus": 4, "gpu_model": "ZZ-999"}},
                "power_domains": [{"name": "r1", "hosts": "h[01-04]", "budget_w": 9000}],
            },
            "node_types.hgx.power_w: power_domains need every GPU's board power",
        ),
    ],
)
def test_dangling_references_of_the_newer_sections_are_refused_at_load(
    tmp_path, sections, expected
):
    message = _load_error(tmp_path, _with_sections(**sections))
    assert message.startswith(f"{tmp_path / 't.yaml'}: {expected}")


@pytest.mark.parametrize("section", ["stores", "node_types", "pools", "priority_classes"])
def test_a_key_given_twice_in_a_topology_section_is_refused_with_its_line(tmp_path, section):
    # PyYAML keeps the last of two equal keys: a second entry replaced the first silently.
    entry = {
        "stores": "  lustre: {attach: local, read_gbps: 1, write_gbps: 1}",
        "node_types": "  hgx: {gpus: 4, gpu_model: H100-SXM5-80GB}",
        "pools": "  training: la",
        "priority_classes": "  prod: {priority: 1}",
    }[section]
    doc = _with_sections()
    doc.pop(section, None)
    text = yaml.safe_dump(doc) + f"{section}:\n{entry}\n{entry}\n"
    path = tmp_path / "t.yaml"
    path.write_text(text)
    line = len(text.splitlines())
    with pytest.raises(InvalidTopology) as info:
        gpuplace.Topology.load(path)
    key = entry.split(":")[0].strip()
    assert str(info.value).startswith(
        f"{path}: line {line}, column 3: invalid YAML: the key str '{key}' is given twice"
    )


def test_merge_keys_may_still_override():
    from gpuplace._util.documents import parse_yaml

    doc = parse_yaml("a: &x {p: 1, q: 2}\nb:\n  <<: *x\n  p: 3\n", "m.yaml", InvalidJob)
    assert doc["b"] == {"p": 3, "q": 2}


# ------------------------------------------------------------------- 10. guarded fallback
@pytest.mark.parametrize(
    ("sample", "read"),
    [
        ("mig/h100-80gb-hbm3.txt", read_nvidia_smi_mig),
        ("mig/h100-80gb-lgi.txt", read_nvidia_smi_mig_instances),
        (
            "health/nvidia-smi-nvlink-s-a100-gpud.txt",
            lambda s: read_evidence(s, format="nvidia-smi-nvlink"),
        ),
    ],
)
def test_tool_output_with_a_huge_number_names_the_line(sample, read):
    """These escaped as 'unexpected parse failure' without a line (the int() limit)."""
    lines = (DATA / sample).read_text().splitlines()
    row = next(i for i, line in enumerate(lines) if re.search(r"\d", line) and i > 2)
    lines[row] = re.sub(r"\d+", BIG, lines[row], count=1)
    with pytest.raises(GpuplaceError) as info:
        read(_named("\n".join(lines) + "\n", "m.txt"))
    assert str(info.value).startswith(f"m.txt:{row + 1}: a number of more than 1000 digits")


# ------------------------------------------------------------------- the CLI's error path
def test_an_unexpected_bug_exits_1_with_one_line(monkeypatch, capsys):
    import gpuplace.cli.catalog as catalog

    def broken(*_: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(catalog, "PRESETS", _Exploding(broken))
    code = main(["presets"])
    err = capsys.readouterr().err
    assert code == 1, err
    lines = err.splitlines()
    assert len(lines) == 1 and "bug" in lines[0] and "--debug" in lines[0], err


class _Exploding:
    def __init__(self, action):
        self.action = action

    def __iter__(self):
        self.action()
        return iter(())

    def __getattr__(self, name):
        self.action()


def test_debug_shows_the_traceback(tmp_path, capsys):
    job = tmp_path / "j.yaml"
    job.write_text("name: a\nparallelism: {tp: x}\n")
    code = main(["--debug", "place", "-c", "h100-superpod", "-j", str(job)])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" in err and "InvalidJob" in err


# ------------------------------------------------------------------- hangs and blow-ups
def bounded(code: str, *, seconds: float = 20, memory_mb: int = 512) -> str:
    """Run ``code`` in a child with a wall-clock and address-space limit; return its stdout
    (the child prints what it caught)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=seconds,
        preexec_fn=limit,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def refused(setup: str, call: str, error: str, **limits: Any) -> str:
    """Run ``call`` (after the ``setup`` imports) in a :func:`bounded` child; the message of
    the gpuplace ``error`` it raises, printed there (empty if it raised none)."""
    code = f"{setup}\nfrom gpuplace.errors import {error}\ntry:\n    {call}\nexcept {error} as exc:\n    print(exc)\n"
    return bounded(code, **limits)


def test_nvidia_smi_q_long_whitespace_is_linear():
    out = bounded(
        """
        import io
        from gpuplace.health.readers.nvidia_smi import read_nvidia_smi_q
        text = "GPU 00000000:1B:00.0\\n" + " " * 2_000_000 + "x\\n"
        try:
            read_nvidia_smi_q(io.StringIO(text))
        except Exception as exc:
            print(type(exc).__name__)
        print("done")
        """,
        seconds=20,
    )
    assert out.strip().endswith("done")


def test_format_detection_is_linear_on_a_long_run_of_equals_signs():
    # "=+NVSMI LOG=+" rescanned a run of "=" from every position: 64 kB (the head that
    # read_evidence searches) took 3 s, this 1 MB would take minutes.
    out = bounded(
        """
        from gpuplace.health.readers import detect_format
        print(detect_format("=" * 1_000_000 + "x"), detect_format("==NVSMI LOG==\\n"))
        """,
        seconds=20,
    )
    assert out.split() == ["kernel-log", "nvidia-smi-q"]


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path):
    levels = ["&a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        levels.append(f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    lines = [f"name: [{', '.join(levels)}]"]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert len(path.read_bytes()) < 800
    out = refused(
        "from gpuplace import Job",
        f"Job.load({str(path)!r})",
        "InvalidJob",
        seconds=20,
        memory_mb=400,
    )
    assert "bomb.yaml" in out and "aliases" in out


def test_a_hostlist_of_many_large_ranges_is_counted_before_expanding():
    out = bounded(
        """
        from gpuplace._util.hostlist import HostlistError, expand
        try:
            expand("dgx[" + ",".join(["1-999999"] * 30) + "]")
        except HostlistError as exc:
            print(exc)
        """,
        seconds=10,
        memory_mb=300,
    )
    assert "at most" in out


def test_sinfo_gpu_index_ranges_are_bounded():
    doc = sinfo_doc(gres_used="gpu:8(IDX:0-1000000000)")
    out = refused(
        "import io ; from gpuplace.integrations import slurm",
        f"slurm.read_sinfo(io.StringIO({json.dumps(doc)!r}))",
        "InvalidState",
        seconds=10,
        memory_mb=300,
    )
    assert "gres_used" in out


def test_slurm_read_topology_has_the_size_cap(tmp_path):
    path = tmp_path / "topology.conf"
    with open(path, "wb") as handle:
        handle.write(b"SwitchName=s1 Nodes=n1\n")
        handle.write(b"#" * (130 << 20))
    out = refused(
        "from gpuplace.integrations import slurm",
        f"slurm.read_topology({str(path)!r})",
        "InvalidTopology",
        seconds=20,
        memory_mb=350,
    )
    assert "topology.conf" in out and "larger than" in out


def test_a_gres_of_many_commas_is_split_in_linear_time(tmp_path):
    # Found by the fuzzer: a lookahead after each comma made 300,000 commas take minutes.
    path = tmp_path / "sinfo.json"
    path.write_text(
        json.dumps(sinfo_doc(gres_used="gpu:h100:2(IDX:0-1)" + "," * 300_000 + "gpu:h101-9"))
    )
    out = refused(
        "from gpuplace.integrations import slurm",
        f"slurm.read_sinfo({str(path)!r})",
        "InvalidState",
        seconds=20,
    )
    assert "gres_used" in out and "cannot read GRES" in out


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("causes:\n  - {component: [gpu], per_component_per_day: 1}\n", "component"),
        (f"causes:\n  - {{component: gpu, per_component_per_day: {'9' * 400}}}\n", "per_comp"),
        ("causes:\n  - {component: gpu, per_component_per_day: 1, name: [a]}\n", "name"),
        ("causes: [\xff]\n", "line 1: expected UTF-8"),
    ],
)
def test_failures_files_name_the_field(tmp_path, text, needle):
    path = tmp_path / "f.yaml"
    path.write_bytes(text.encode("utf-8", errors="surrogateescape").replace(b"\xc3\xbf", b"\xff"))
    with pytest.raises(InvalidJob, match=rf"f\.yaml.*{needle}"):
        load_failures(str(path))


def test_open_brackets_past_the_depth_limit_are_refused_before_yaml_scans_them(tmp_path):
    # Found by the fuzzer: PyYAML's scanner reads ahead over open brackets with work
    # proportional to those still open (a 3 kB file took 1.8 s), before the composer's depth
    # limit is reached; the brackets are now counted first, in one pass.
    path = tmp_path / "t.yaml"
    path.write_text("name: a\nnodes: " + "[" * 100_000 + "\n")
    with pytest.raises(InvalidTopology) as info:
        gpuplace.Topology.load(path)
    assert str(info.value) == (
        f"{path}: line 2: invalid YAML: nested too deeply (more than 100 levels of [ and {{)"
    )


def test_a_mig_instance_row_with_a_long_run_of_blanks_is_linear(tmp_path):
    # Found by the fuzzer: two blank-matching runs around an optional '|' at the end of the
    # -lgi row pattern backtracked quadratically (100,000 tabs: 39 s).
    path = tmp_path / "lgi.txt"
    rows = (DATA / "mig" / "h100-80gb-lgi.txt").read_text().splitlines()
    row = next(i for i, line in enumerate(rows) if "MIG 1g" in line)
    rows[row] = rows[row].rstrip(" |") + "\t" * 100_000 + "x"
    path.write_text("\n".join(rows) + "\n")
    out = bounded(
        f"""
        from gpuplace.io import read_nvidia_smi_mig_instances
        print(sorted(read_nvidia_smi_mig_instances({str(path)!r})))
        """,
        seconds=10,
    )
    assert out.startswith("[0")


def test_qaplib_files_are_read_within_bounds(tmp_path):
    """A QAPLIB file with millions of tokens is refused at the first one too many without
    holding them all (it took gigabytes), a size beyond the bound at once, a huge entry by its
    line."""
    many = tmp_path / "many.dat"
    many.write_text("2\n" + "1 " * 12_000_000 + "\n")
    out = refused(
        "from gpuplace.io import read_qaplib",
        f"read_qaplib({str(many)!r})",
        "InvalidJob",
        memory_mb=768,
    )
    assert "line 2: unexpected extra token '1'" in out
    huge = tmp_path / "huge.dat"
    huge.write_text("99999\n1 2 3\n")
    with pytest.raises(InvalidJob, match=r"huge.dat: line 1: the size n = 99999 is beyond 2048"):
        gpuplace.io.read_qaplib(huge)
    digits = tmp_path / "digits.dat"
    digits.write_text(f"1\n{BIG} 1\n")
    with pytest.raises(InvalidJob, match=r"digits.dat: line 2: a matrix entry has 5000 char"):
        gpuplace.io.read_qaplib(digits)


def test_a_huge_number_in_a_pods_job_annotation_is_a_bad_request():
    """The job annotation is JSON inside the extender's JSON body: parsed with the same bounds
    (a 5,000-digit integer escaped as Python's ValueError)."""
    annotation = '{"parallelism": {"tp": ' + BIG + "}}"
    with pytest.raises(BadRequest, match=r"annotation gpuplace/job: line 1: .*1000 digits"):
        Extender._job({JOB_ANNOTATION: annotation}, "ns/gang")


def test_a_yaml_document_past_the_yaml_size_limit_is_refused_before_parsing(tmp_path):
    """PyYAML's pure-Python composer holds several times the text: a 54 MB job file ran out of
    the fuzzer's memory budget. YAML past 16 MiB is refused unparsed (JSON takes more)."""
    path = tmp_path / "big.yaml"
    path.write_text("name: a\nparallelism: {tp: 8}\n" + "# padding\n" * 1_800_000)
    out = refused("from gpuplace import Job", f"Job.load({str(path)!r})", "InvalidJob", seconds=20)
    assert "big.yaml: larger than 16777216 bytes; refusing it as YAML" in out


@pytest.mark.parametrize(
    ("reader", "call", "error"),
    [
        ("failures", "load_failures(PATH)", "InvalidJob"),
        ("rules", "load_rules(PATH)", "InvalidState"),
        ("job", "Job.load(PATH)", "InvalidJob"),
        ("workload", "load_workload(PATH)", "InvalidJob"),
    ],
)
def test_a_large_yaml_file_is_refused_before_it_is_read_whole(tmp_path, reader, call, error):
    """Found by the fuzzer: a 60 MB failures file raised MemoryError under the 256 MB budget
    (read whole, up to 64 MiB, and decoded at four bytes a character before the YAML size
    check). A YAML file is now read up to its own limit, 16 MiB, and no further."""
    path = tmp_path / f"{reader}.yaml"
    line = "causes: # " + "\U0001f600" * 1000 + "\n"
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(15_000):  # 60 MB, 15 M characters of four bytes each in a str
            handle.write(line)
    setup = (
        "from gpuplace import Job\nfrom gpuplace.health.judge import load_rules\n"
        "from gpuplace.sim.failures import load_failures\n"
        f"from gpuplace.sim.traces import load_workload\nPATH = {str(path)!r}"
    )
    # Room for the imports (about 160 MB) and the 16 MiB read, not for the whole file decoded.
    out = refused(setup, call, error, seconds=60, memory_mb=448)
    assert f"{reader}.yaml: larger than 16777216 bytes; refusing it as YAML" in out


# Keys given twice: PyYAML's were refused already; json kept the last one silently.
@pytest.mark.parametrize(
    ("name", "read", "error"),
    [
        ("job.json", gpuplace.Job.load, InvalidJob),
        ("topology.json", gpuplace.Topology.load, InvalidTopology),
        ("workload.json", load_workload, InvalidJob),
        ("sinfo.json", slurm.read_sinfo, InvalidState),
        ("squeue.json", slurm.read_squeue, InvalidState),
        ("requests.json", lambda path: read_requests(str(path)), InvalidJob),
    ],
)
def test_a_key_given_twice_in_a_json_document_is_refused_with_its_line(tmp_path, name, read, error):
    path = tmp_path / name
    path.write_text('{\n "a": {"x": 1, "y": [{"x": 2}]},\n "name": "one",\n "name": "two"\n}\n')
    with pytest.raises(
        error, match=rf"{name}: line 4: invalid JSON: the key str 'name' is given twice"
    ):
        read(path)


def test_a_key_given_twice_in_a_state_file_is_refused(tmp_path):
    topology = gpuplace.Topology.preset("h100-superpod", nodes=1)
    path = tmp_path / "s.json"
    gpuplace.ClusterState(topology).save(path)
    text = path.read_text()
    assert gpuplace.ClusterState.load(topology, path) is not None  # the writer's own: no duplicate
    path.write_text(text.replace('{"checksum"', '{"checksum": "x", "checksum"', 1))
    with pytest.raises(InvalidState, match=r"s\.json: line 1: .*'checksum' is given twice"):
        gpuplace.ClusterState.load(topology, path)


def test_a_key_given_twice_in_an_extender_body_is_a_bad_request():
    from gpuplace.integrations.extender import parse_body

    with pytest.raises(BadRequest, match=r"body: line 2: invalid JSON: the key str 'Pod' is given"):
        parse_body(b'{"Pod": {},\n "Pod": {}, "NodeNames": []}')
    with pytest.raises(BadRequest, match=r"body: not UTF-8"):
        parse_body(b'{"Pod": "\xff"}')
    assert parse_body(b'{"Pod": {"a": 1}, "NodeNames": ["n"]}')["NodeNames"] == ["n"]


def test_yaml_is_read_by_libyaml_within_the_same_budgets():
    """libyaml scans and parses (four times the pure reader's bytes/s, benches/README.md); the
    budgets, duplicate keys and line numbers are those of the pure loader, on which the same
    documents give the same values."""
    from gpuplace._util import documents

    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml: the pure loader is the only one")
    assert documents._LOADERS[0].__name__ == "_FastBoundedLoader"
    texts = [
        p.read_text() for p in sorted([*DATA.rglob("*.yaml"), *(ROOT / "examples").rglob("*.yaml")])
    ]
    assert len(texts) >= 5
    for text in texts:
        fast, pure = documents._LOADERS[0](text), documents._BoundedLoader(text)
        assert fast.get_single_data() == pure.get_single_data()
    with pytest.raises(InvalidJob, match=r"j\.yaml: line 3, column 1: .*'name' is given twice"):
        documents.parse_yaml("name: a\nx: 1\nname: b\n", "j.yaml", InvalidJob)
    # libyaml counts bytes where the pure reader counted characters: the line stays right
    with pytest.raises(InvalidJob, match=r"j\.yaml: line 3: invalid YAML: character #x0001"):
        documents.parse_yaml("a: \u00e9\u00e9\u00e9\nb: \u00e9\nc: \x01\n", "j.yaml", InvalidJob)
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(7)
    )
    with pytest.raises(InvalidJob, match=r"line \d+, column \d+: invalid YAML: aliases repeat"):
        documents.parse_yaml(bomb, "j.yaml", InvalidJob)


# Found by the fuzzer (tests/fuzz/engine.py): three health readers were superlinear in the
# length of a line or in the number of message lines. Each input is generated, ~20-100 kB;
# the bounded child fails the test by its time limit if the reader is superlinear again.
def test_dcgmi_health_system_rows_with_long_blanks_are_linear():
    # "-> <name> system" went through ^->\s*(.+?)\s+system$: 1,000 spaces took 34 s.
    out = bounded(
        """
        import io
        from gpuplace.health.readers import read_dcgmi_health
        rows = ["| GPU | |", "| -> 0 | Warning |"]
        rows += ["| -> " + " " * 20_000 + "x |  |", "| -> Power" + " " * 20_000 + "system | Warning |"]
        text = "\\n".join(rows) + "\\n"
        for ev in read_dcgmi_health(io.StringIO(text)).evidence:
            print(ev.gpu_index, ev.values["system"], ev.values["status"])
        """,
        seconds=20,
    )
    assert out.split("\n")[0] == "0 Power Warning"


def test_dcgmi_diag_category_rules_and_gpu_lists_with_long_blanks_are_linear():
    # "+--- <name> ---+" went through a lazy name before \s+ (quadratic) and "Fail - GPU: 0"
    # through ^GPU[s]?\s*:?\s*([\d,\s]+)$ (three adjacent blank runs: cubic).
    out = bounded(
        """
        import io
        from gpuplace.health.readers import read_dcgmi_diag
        text = (
            "+---- Integration" + " " * 20_000 + "x ----+\\n"
            "| PCIe | Fail - GPU" + " " * 20_000 + "x |\\n"
            "| Memory | Fail - GPU:" + " " * 20_000 + "2, 3 |\\n"
        )
        for ev in read_dcgmi_diag(io.StringIO(text)).evidence:
            print(ev.values["test"], ev.gpu_index)
        """,
        seconds=20,
    )
    assert out.split() == ["PCIe", "None", "Memory", "2", "Memory", "3"]


def test_dcgmi_diag_thousands_of_warning_lines_are_linear():
    # Each "| Warning: GPU2 | <message> |" line rebuilt the evidence with its whole message so
    # far appended to its text: 3,000 such lines (a 239 kB input) took 277 s.
    out = bounded(
        """
        import io
        from gpuplace.health.readers import read_dcgmi_diag
        text = "| Memory | Fail |\\n|  | GPU2: Fail |\\n"
        text += "| Warning: GPU2 | Error using CUDA API cudaMalloc |\\n" * 20_000
        (ev,) = read_dcgmi_diag(io.StringIO(text)).evidence
        print(ev.gpu_index, len(ev.text), ev.values["message"].count("cudaMalloc"))
        """,
        seconds=20,
    )
    gpu, length, count = out.split()
    assert (gpu, count) == ("2", "20000")
    assert int(length) < 40 * 20_000  # the message once, not once per line


def test_dcgmi_health_stream_fed_in_small_pieces_is_linear():
    # DcgmiHealthStream.feed searched all the lines it held for the table's head, rule and
    # closing border on every call: a table of 40,000 rows fed 32 bytes at a time scanned
    # about 7e8 lines. Each line is now examined once; 1,000,000 one-byte feeds follow.
    out = bounded(
        """
        from gpuplace.health.readers import DcgmiHealthStream
        head = b"+---+\\n| Health Monitor Report |\\n+===+\\n| GPU | |\\n| -> 0 | Warning |\\n"
        rows = b"|    -> Power system | Warning |\\n" * 40_000
        table = head + rows + b"+---+\\n"
        stream = DcgmiHealthStream("dcgm.log")
        found = [ev for i in range(0, len(table), 32) for ev in stream.feed(table[i : i + 32])]
        print(len(found), found[-1].line)
        blanks = b"+" + b" " * 1_000_000 + b"\\n"  # one long line, one byte at a time
        for i in range(len(blanks)):
            stream.feed(blanks[i : i + 1])
        print(stream.result.lines)
        """,
        seconds=60,
    )
    assert out.split() == ["40000", str(5 + 40_000), str(5 + 40_000 + 1 + 1)]


def test_nvidia_smi_nvlink_gpu_line_with_long_blanks_is_linear():
    # "GPU 0: <name> (UUID: ...)" went through a lazy name, an optional group and \s*$:
    # quadratic (20 kB of spaces took about 40 s).
    out = bounded(
        """
        import io
        from gpuplace.health.readers import read_evidence
        text = "GPU 0: NVIDIA" + " " * 50_000 + "H100\\n\\t Link 0: 26.562 GB/s\\n"
        (ev,) = read_evidence(io.StringIO(text), format="nvidia-smi-nvlink").evidence
        print(ev.gpu_index, ev.values["links_gbps"])
        """,
        seconds=20,
    )
    assert out.strip() == "0 {0: 26.562}"


# ------------------------------------------------------------------- trace readers
PHILLY_HEAD = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,c1\n"


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (
            "today,66.0,1,66.0,c1",
            "timestamp: expected a time as YYYY-MM-DD HH:MM:SS, got str 'today'",
        ),
        # numpy's parser read a 30-digit number as a time in the year -260,580,049,991
        ("1" * 30 + ",66.0,1,66.0,c1", "timestamp: expected a time as YYYY-MM-DD HH:MM:SS"),
        ("2017-13-09 07:01:55,66.0,1,66.0,c1", "timestamp: expected a time"),
        ("2017-10-09 07:01:55,nan,1,66.0,c1", "duration: expected seconds >= 0, got str 'nan'"),
        ("2017-10-09 07:01:55,-1,1,66.0,c1", "duration: expected seconds >= 0, got str '-1'"),
        ("2017-10-09 07:01:55,66.0,0,66.0,c1", "num_gpus: expected an integer from 1 to"),
        ("2017-10-09 07:01:55,66.0,1²,66.0,c1", "num_gpus: expected an integer from 1 to"),
        ("2017-10-09 07:01:55,66.0," + "9" * 30 + ",66.0,c1", "num_gpus: expected an integer"),
        ("2017-10-09 07:01:55,66.0", "expected the fields timestamp,duration,num_gpus; got 2"),
        ("2017-10-09 07:01:55,66.0,1,66.0,c\r1", "not valid CSV: new-line character"),
        ("2017-10-09 07:01:55,66.0,1,66.0," + "c" * 200_000, "not valid CSV: field larger"),
    ],
)
def test_philly_trace_rows_name_the_file_line_and_field(tmp_path, row, expected):
    from gpuplace.sim.traces import philly

    path = tmp_path / "p.csv"
    path.write_text(PHILLY_HEAD + row + "\n", newline="")
    with pytest.raises(InvalidJob) as info:
        philly(path)
    assert str(info.value).startswith(f"{path} line 3: {expected}")


def test_philly_trace_encoding_size_and_gzip_bomb(tmp_path):
    from gpuplace._util.documents import MAX_DOCUMENT_BYTES
    from gpuplace.sim.traces import philly

    path = tmp_path / "p.csv"
    path.write_bytes(PHILLY_HEAD.encode() + b"2017-10-09 07:01:55,6\xff6,1,1,c\n")
    with pytest.raises(InvalidJob, match=r"p\.csv: line 3: expected UTF-8 text"):
        philly(path)
    # 64 MiB of zeros compress to 64 kB: refused after the limit, not inflated whole
    bomb = tmp_path / "p.csv.gz"
    import gzip

    bomb.write_bytes(gzip.compress(PHILLY_HEAD.encode() + b"0" * (MAX_DOCUMENT_BYTES + 1)))
    out = refused(
        "from gpuplace.sim.traces import philly",
        f"philly({str(bomb)!r})",
        "InvalidJob",
        seconds=30,
        memory_mb=900,
    )
    assert "p.csv.gz: larger than 67108864 bytes uncompressed" in out
    bomb.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(InvalidJob, match=r"p\.csv\.gz: cannot read gzip file"):
        philly(bomb)


OPENB_HEAD = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
    "openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0\n"
)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("p1,1,1,-1,1000,,LS,Running,0,5,0", "num_gpu: expected an integer from 0 to"),
        ("p1,1,1,1²,1000,,LS,Running,0,5,0", "num_gpu: expected an integer from 0 to"),
        (
            "p1,1,1,1,1000,,LS,Running,inf,5,0",
            "creation_time: expected seconds >= 0, got str 'inf'",
        ),
        ("p1,1,1,1,1000,,LS,Running,0,x,0", "deletion_time: expected seconds >= 0, got str 'x'"),
        ("p1,1,1,1,1000,,LS,Running,0,5,0,extra", "more fields than the header's 11"),
        ("p1,1,1,1,1000,,LS,Running,0", "deletion_time: missing (fewer fields than the header)"),
        (
            "openb-pod-0000,1,1,1,1000,,LS,Running,0,5,0",
            "name: pod 'openb-pod-0000' is listed twice",
        ),
        ("p1,1,1,1,1000,,L\rS,Running,0,5,0", "not valid CSV: new-line character"),
        ("p1,1,1,1,1000,," + "L" * 200_000 + ",Running,0,5,0", "not valid CSV: field larger"),
    ],
)
def test_openb_trace_rows_name_the_file_line_and_field(tmp_path, row, expected):
    from gpuplace.sim.traces import openb

    path = tmp_path / "o.csv"
    path.write_text(OPENB_HEAD + row + "\n", newline="")
    with pytest.raises(InvalidJob) as info:
        openb(path)
    assert str(info.value).startswith(f"{path} line 3: {expected}")


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("n1,5,1,2,T\r4", "n.csv:3: not valid CSV: new-line character"),
        ("n1,5,1,2," + "T" * 200_000, "n.csv:3: not valid CSV: field larger"),
        ("n1,5,1", "n.csv:3: gpu: missing (fewer fields than the header)"),
        ("n1,5,1,2,T4,x", "n.csv:3: more fields than the header's 5"),
        # the message was "n.csv:3: n.csv:3: cpu_milli: ..." (the line named twice)
        ("n1,x,1,2,T4", "n.csv:3: cpu_milli: expected an integer, got 'x'"),
        ("n1,99999999999999999,1,2,T4", "n.csv:3: cpu_milli: expected at most"),
    ],
)
def test_openb_node_list_rows_name_the_line_and_field(row, expected):
    from gpuplace.io.openb import read_openb_nodes

    text = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,8,G2\n" + row + "\n"
    with pytest.raises(InvalidTopology) as info:
        read_openb_nodes(_named(text, "n.csv"))
    assert str(info.value).startswith(expected)


def test_gpu_query_long_field_names_the_line():
    from gpuplace.io.gpu_query import read_nvidia_smi_query

    text = "index, name, driver_version\n0, H100, 550.54\n1, " + "H" * 200_000 + ", 550.54\n"
    with pytest.raises(InvalidTopology) as info:
        read_nvidia_smi_query(_named(text, "q.csv"), host="h1")
    assert str(info.value).startswith("q.csv:3: not valid CSV: field larger than field limit")


def test_scontrol_records_with_long_blanks_are_linear():
    # (\w+)=(.*?)(?=\s+\w+=|$): a lazy value with a look-ahead of blanks, quadratic on a long
    # run of them (20 kB took about 16 s); the records read are the same.
    out = bounded(
        """
        from gpuplace.integrations.slurmctld import read_records
        line = "PartitionName=gpu Comment=a" + " " * 200_000 + "b Nodes=n[1-2] TRES=cpu=8,mem=1G"
        (record,) = read_records(line + "\\n")
        print(record["PartitionName"], len(record["Comment"]), record["Nodes"], record["TRES"])
        """,
        seconds=20,
    )
    assert out.split() == ["gpu", "200002", "n[1-2]", "cpu=8,mem=1G"]


def test_scontrol_records_of_a_large_output_take_little_more_than_the_text():
    # Found by a 10-minute fuzz run: 60 MB of output (300 lines of 200 kB) ran out of the 256 MB
    # budget, copied once as lines and once more as stripped lines. Lines are now searched in
    # place, and output over MAX_SCONTROL_BYTES (32 MiB) is refused; here 30 MB of text (60 MB
    # as a str of two-byte characters) in 448 MB of address space in all.
    out = bounded(
        """
        from gpuplace.integrations.slurmctld import read_records
        line = "PartitionName=\u20ac " + "- " * 100_000 + "Nodes=n[1-2]\\n"
        text = line * 150
        records = read_records(text)
        value = records[0]["PartitionName"]
        print(len(records), value[0], len(value), records[-1]["Nodes"])
        """,
        seconds=60,
        memory_mb=448,
    )
    assert out.split() == ["150", "\u20ac", "200001", "n[1-2]"]


def test_cluster_files_name_the_line(tmp_path):
    from gpuplace.sim.clusters import lingjun, pai

    path = tmp_path / "pai.csv"
    path.write_text("m1,V100,96,512,8\nm2,T4,64,256,inf\n")  # was a raw OverflowError
    with pytest.raises(InvalidTopology) as info:
        pai(path)
    assert str(info.value) == f"{path} line 2: cap_gpu: expected a number, got 'inf'"
    path = tmp_path / "topo.csv"
    path.write_text("ip,DSW,PSW,ASW\n10.0.0.1,d1,p\r1,a1\n", newline="")  # was a raw csv.Error
    with pytest.raises(InvalidTopology) as info:
        lingjun(path)
    assert str(info.value).startswith(f"{path} line 2: not valid CSV: new-line character")
    path.write_bytes(b"ip,DSW,PSW,ASW\n10.0.0.1,d\xff1,p1,a1\n")  # was a raw UnicodeDecodeError
    with pytest.raises(InvalidTopology, match=r"topo\.csv: line 2: expected UTF-8 text"):
        lingjun(path)


# The JSON of tools (kubectl, aws, mlxlink --json, dcgmi -j) and of the service's bodies: the
# same limits as every document (a key given twice was kept silently, the last one winning).
def test_a_key_given_twice_in_tool_json_is_refused_with_its_line():
    from gpuplace.io import read_ec2_topology, read_k8s_nodes

    nodes = '{"kind": "List",\n "items": [],\n "items": []}\n'
    with pytest.raises(InvalidTopology, match=r"nodes\.json:3: invalid JSON: the key str 'items'"):
        read_k8s_nodes(_named(nodes, "nodes.json"))
    ec2 = '{"Instances": [],\n "Instances": []}\n'
    with pytest.raises(
        InvalidTopology, match=r"ec2\.json:2: invalid JSON: the key str 'Instances'"
    ):
        read_ec2_topology(_named(ec2, "ec2.json"))
    mlx = '{"result": {"output": {"a": 1,\n "a": 2}}}\n'
    with pytest.raises(InvalidState, match=r"mlx\.json:2: not valid JSON \(the key str 'a'"):
        read_evidence(_named(mlx, "mlx.json"), format="mlxlink", host="h1", strict=True)
    health = '{"body": {},\n\n "body": {}}\n'
    with pytest.raises(InvalidState, match=r"h\.json:3: not valid JSON \(the key str 'body'"):
        read_evidence(_named(health, "h.json"), format="dcgmi-health", strict=True)


def test_a_key_given_twice_in_a_service_body_is_refused(tmp_path):
    from service_harness import running_service

    with running_service(tmp_path) as svc:
        # /v1/place is answered off FastAPI's routing when its body parses: a key twice does
        # not, and FastAPI's answer names it too
        got, answer = svc.post(
            "/v1/place", b'{"job": {"name": "a", "parallelism": {"tp": 8}},\n "job": {"name": "b"}}'
        )
        assert got == 400
        assert answer["error"] == (
            "body: line 2: invalid JSON: the key str 'job' is given twice in one object"
        )
        got, answer = svc.post("/v1/explain", b'{"job": {"name": "a", "name": "b"}}')
        assert (got, answer["kind"]) == (400, "InvalidRequest")
        assert "the key str 'name' is given twice" in answer["error"]
        got, answer = svc.post(
            "/v1/place", b'{"job": {"name": "a", "parallelism": {"tp": 1' + b"1" * 1200 + b"}}}"
        )
        assert got == 400 and "more than 1000 digits" in answer["error"]
        assert svc.client.status()["clusters"][0]["jobs"] == {}  # nothing placed
        placed = svc.client.place({"name": "a", "parallelism": {"tp": 8}})
        assert len(placed["gpus"]) == 8


def test_a_slurm_view_file_is_read_within_the_limits(tmp_path, capsys):
    from gpuplace.cli.slurm import _load_view

    view = tmp_path / "s.slurm.json"
    view.write_text('{"nodes": {},\n "nodes": {}}\n')
    with pytest.raises(InvalidState, match=r"s\.slurm\.json: line 2: invalid JSON: the key"):
        _load_view(str(tmp_path / "s.json"))
    with open(view, "wb") as handle:
        handle.truncate(64 * 1024 * 1024 + 1)
    with pytest.raises(InvalidState, match=r"s\.slurm\.json: larger than 67108864 bytes"):
        _load_view(str(tmp_path / "s.json"))


def test_health_streams_hold_bounded_memory_whatever_they_are_fed():
    # A dcgmi table that never closes, and a line that never ends, were held whole; the
    # streams now drop them (reported as malformed lines) and read on.
    from gpuplace.health.readers import DcgmiHealthStream, KernelLogScanner
    from gpuplace.health.readers.dcgm import MAX_LINE_CHARS, MAX_TABLE_LINES
    from gpuplace.health.readers.kernel_log import MAX_LINE_BYTES

    head = b"+---+\n| Health Monitor Report |\n+===+\n| GPU | |\n| -> 0 | Warning |\n"
    row = b"|    -> Power system | Warning |\n"
    stream = DcgmiHealthStream("dcgm.log")
    stream.feed(head)
    for _ in range(3 * MAX_TABLE_LINES // 1000):
        stream.feed(row * 1000)
        assert len(stream._lines) <= MAX_TABLE_LINES + 1000
    (line, why), *_ = stream.result.malformed
    assert line == 2 and f"still open after {MAX_TABLE_LINES} lines" in why
    chunk = b"x" * 65536
    for _ in range(2 * MAX_LINE_CHARS // len(chunk)):
        stream.feed(chunk)
        assert stream._partial.tell() <= MAX_LINE_CHARS
    lines_before = stream.result.lines
    found = stream.feed(b"\n" + head + row + b"+---+\n")
    # the dropped line is one line; the row is the sixth of the table after it
    assert [ev.line for ev in found] == [lines_before + 1 + 6]
    assert "more than 1048576 characters" in stream.result.malformed[-1][1]

    xid = b"NVRM: Xid (PCI:0000:1b:00): 79, pid=1, GPU has fallen off the bus.\n"
    scan = KernelLogScanner("kern.log", host="h1")
    scan.feed(b"boot\n")
    for _ in range(2 * MAX_LINE_BYTES // len(chunk)):
        scan.feed(chunk)
        assert scan._held <= MAX_LINE_BYTES
    scan.feed(b"tail of the long line\n" + xid)
    result = scan.finish()
    assert result.malformed == [(2, f"a line of more than {MAX_LINE_BYTES} bytes; dropped")]
    assert [(ev.line, ev.gpu_pci) for ev in result.evidence] == [(3, "0000:1b:00")]
    assert result.lines == 3
