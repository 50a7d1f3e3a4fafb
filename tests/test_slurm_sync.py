"""`gpuplace slurm` without a Slurm cluster: reading sinfo/squeue JSON in the forms Slurm 22.05
prints (typed and untyped GRES, IDX lists, drained and down nodes), refusing malformed answers
with a clear error, and `submit --dry-run` printing the exact command and files. The same paths
against real Slurm are in test_slurm_submit.py."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gpuplace
import pytest
from gpuplace._util.documents import MAX_DOCUMENT_BYTES
from gpuplace.errors import InvalidJob, InvalidState, InvalidTopology
from gpuplace.integrations import slurm as sl
from gpuplace.integrations.slurmctld import Slurmctld, SlurmUnavailable

TOPOLOGY = (
    Path(__file__).parent / "data" / "topologies" / "slurm-topology-conf-tree-manpage-example.conf"
)
CLI = [sys.executable, "-m", "gpuplace.cli"]
#: scontrol show topology as Slurm 22.05 prints it for a two-leaf tree.
SCONTROL = """SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=dev[0-5]
SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=dev[6-11]
SwitchName=leaf3 Level=0 LinkSpeed=1 Nodes=dev[12-17]
SwitchName=top Level=1 LinkSpeed=1 Nodes=dev[0-17] Switches=leaf[1-3]
"""


def node(name: str, state: str = "idle", flags=(), gres="gpu:h100:8(S:0-1)", used=None) -> dict:
    return {
        "name": name,
        "state": state,
        "state_flags": list(flags),
        "gres": gres,
        "gres_used": used or "gpu:h100:0(IDX:N/A)",
        "partitions": ["gpu"],
    }


def sinfo(**overrides: dict) -> dict:
    nodes = [overrides.get(f"dev{i}", node(f"dev{i}")) for i in range(18)]
    return {"meta": {}, "errors": [], "nodes": nodes}


def test_gres_strings_as_slurm_prints_them() -> None:
    assert sl._gres_gpus("gpu:h100:8(S:0-1)", "x") == (8, "h100", [])
    assert sl._gres_gpus("gpu:8", "x") == (8, None, [])
    assert sl._gres_gpus("gpu:h100:3(IDX:0-2)", "x") == (3, "h100", [0, 1, 2])
    assert sl._gres_gpus("gpu:a:1(IDX:0),gpu:b:2(IDX:4-5),nic:2", "x") == (3, "a", [0, 4, 5])
    assert sl._gres_gpus("(null)", "x") == (0, None, [])
    with pytest.raises(InvalidState, match="cannot read GRES"):
        sl._gres_gpus("gpu:h100:x", "sinfo.json")


def test_sync_reads_jobs_busy_drained_and_down_nodes() -> None:
    info = sinfo(
        dev1=node("dev1", "mixed", used="gpu:h100:3(IDX:0-2)"),
        dev2=node("dev2", "allocated", used="gpu:h100:0(IDX:N/A)"),
        dev3=node("dev3", "idle", flags=["DRAIN"]),
        dev4=node("dev4", "down"),
        dev5=node("dev5", "mixed", used="gpu:h100:2(IDX:6-7)"),
    )
    queue = {
        "jobs": [
            {
                "job_id": 7,
                "name": "a",
                "job_state": "RUNNING",
                "nodes": "dev[1-2]",
                "gres_detail": ["gpu:h100:3(IDX:0-2)", "gpu:h100:0(IDX:N/A)"],
            },
            {"job_id": 8, "name": "b", "job_state": "PENDING", "nodes": ""},
            {"job_id": 9, "name": "c", "job_state": "RUNNING", "nodes": "dev2"},
        ]
    }
    state = sl.sync(info, queue, io.StringIO(SCONTROL))
    topo = state.topology
    assert list(topo.hosts) == [f"dev{i}" for i in range(18)]
    assert sorted(state.jobs["slurm-7"].tolist()) == topo.host_gpus("dev1")[:3].tolist()
    # Job 9 holds dev2 whole: no GRES detail and the node is allocated.
    assert sorted(state.jobs["slurm-9"].tolist()) == topo.host_gpus("dev2").tolist()
    # dev5's GPUs 6-7 are used by no job squeue listed.
    assert sorted(state.jobs["slurm-busy-dev5"].tolist()) == topo.host_gpus("dev5")[6:].tolist()
    assert "slurm-8" not in state.jobs
    conditions = {u["name"]: u["condition"] for u in state.unhealthy()}
    assert conditions == {"dev3": "drained", "dev4": "failed"}
    assert state.free_gpus == 18 * 8 - 3 - 8 - 2 - 8 - 8
    assert topo.domain_of(int(topo.host_gpus("dev7")[0]), "leaf") == "leaf2"


def test_sync_with_a_topology_conf_and_a_host_type() -> None:
    state = sl.sync(sinfo(), None, str(TOPOLOGY), host_type="dgx-h100")
    assert set(state.topology.host_types) == {"dgx-h100"}
    assert state.free_gpus == 18 * 8
    with pytest.raises(InvalidTopology, match="unknown host type 'dgx-z'"):
        sl.sync(sinfo(), None, str(TOPOLOGY), host_type="dgx-z")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"nodes": "x"}, 'expected an object with "nodes"'),
        ({"nodes": [{"state": "idle"}]}, "nodes\\[0\\]: expected a node with a name"),
        ({"nodes": [node("dev0", used="gpu:h100:1(IDX:9)")]}, "gres_used names GPUs beyond 8"),
        ({"nodes": [node("dev0", used="gpu:h100:1(IDX:a-b)")]}, "expected GPU indices"),
    ],
)
def test_malformed_sinfo_is_refused_naming_the_field(document: dict, message: str) -> None:
    with pytest.raises(InvalidState, match=message):
        sl.read_sinfo(document)


def test_nodes_missing_from_the_topology_are_named() -> None:
    info = sinfo()
    info["nodes"].append(node("gpu99"))
    with pytest.raises(InvalidTopology, match="not in the topology: gpu99"):
        sl.sync(info, None, str(TOPOLOGY))


def test_dry_run_prints_the_command_and_files_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "sinfo.json").write_text(json.dumps(sinfo(dev0=node("dev0", "allocated"))))
    (tmp_path / "squeue.json").write_text(json.dumps({"jobs": []}))
    (tmp_path / "topology.conf").write_text(SCONTROL)
    (tmp_path / "job.yaml").write_text("name: train\nparallelism: {tp: 4, dp: 3}\n")
    result = subprocess.run(
        [
            *CLI,
            "slurm",
            "submit",
            "--job",
            "job.yaml",
            "--sinfo",
            "sinfo.json",
            "--squeue",
            "squeue.json",
            "--topology",
            "topology.conf",
            "--dry-run",
            "--partition",
            "gpu",
            "--",
            "-t",
            "10",
            "train.sh",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # Every submission gets its own files inside --dir: <job>.<time>-<random>.hostfile/.ranks.
    match = re.match(r"SLURM_HOSTFILE=(\S+)\.hostfile GPUPLACE_RANKS=(\S+)\.ranks", lines[0])
    assert match is not None and match.group(1) == match.group(2), lines[0]
    stem = Path(match.group(1))
    assert stem.parent == tmp_path and re.fullmatch(r"train\.\d{8}T\d{6}-[0-9a-f]{6}", stem.name)
    hostfile = Path(f"{stem}.hostfile")
    assert "GPUPLACE_PER_RANK_CUDA=1" in lines[0]  # 12 ranks do not fill two 8-GPU nodes
    assert lines[0].endswith(
        "sbatch --parsable --exclusive '--nodelist=dev[1-2]' --nodes=2 --ntasks=12 "
        "--distribution=arbitrary --gres=gpu:8 --job-name=train --partition=gpu -t 10 train.sh"
    )
    at = lines.index(f"--- {hostfile}")
    assert lines[at + 1 : at + 13] == ["dev1"] * 8 + ["dev2"] * 4
    assert f"--- {stem}.ranks" in lines
    assert "0 dev1 0" in lines and "11 dev2 3" in lines
    assert not hostfile.exists()

    refused = subprocess.run(
        [
            *CLI,
            "slurm",
            "submit",
            "--job",
            "job.yaml",
            "--sinfo",
            "sinfo.json",
            "--squeue",
            "squeue.json",
            "--topology",
            "topology.conf",
            "--dry-run",
            "--",
            "-w",
            "dev9",
            "x.sh",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "gpuplace: error: -w is set by gpuplace from the placement; leave it out"
    )


def test_sync_without_gres_takes_the_gpus_per_node_and_whole_nodes() -> None:
    """A whole-node cluster: no gpu GRES; the GPUs per node come from --gpus-per-node or the
    host type, and any job on a node holds it whole."""
    bare = {f"dev{i}": node(f"dev{i}", gres="", used="") for i in range(18)}
    bare["dev1"] = node("dev1", "mixed", gres="", used="")
    info = sinfo(**bare)
    queue = {"jobs": [{"job_id": 5, "name": "a", "job_state": "RUNNING", "nodes": "dev1"}]}
    with pytest.raises(
        InvalidTopology, match=r"nodes without gpu GRES: dev\[0-17\].*--gpus-per-node"
    ):
        sl.sync(info, queue, io.StringIO(SCONTROL))
    state = sl.sync(info, queue, io.StringIO(SCONTROL), gpus_per_node=4)
    assert state.topology.num_gpus == 18 * 4
    assert sorted(state.jobs["slurm-5"].tolist()) == state.topology.host_gpus("dev1").tolist()
    typed = sl.sync(info, queue, io.StringIO(SCONTROL), host_type="dgx-h100")
    assert typed.topology.num_gpus == 18 * 8 and set(typed.topology.host_types) == {"dgx-h100"}
    # A submission on such a cluster asks for whole nodes, no GRES.
    job = gpuplace.Job(name="whole", tp=4, dp=2)
    sub = sl.submission(gpuplace.place(state, job), ["x.sh"], directory=".", gres=False)
    assert not any(a.startswith("--gres") for a in sub.argv) and "--exclusive" in sub.argv


@pytest.mark.parametrize("name", ["../../elsewhere/evil", "/etc/evil", "..", "a/b\\c"])
def test_job_names_cannot_leave_the_directory(tmp_path: Path, name: str) -> None:
    state = sl.sync(sinfo(), None, io.StringIO(SCONTROL))
    placement = gpuplace.place(state, gpuplace.Job(name=name, tp=8, dp=1))
    first = sl.submission(placement, ["x.sh"], directory=tmp_path)
    second = sl.submission(placement, ["x.sh"], directory=tmp_path)
    for sub in (first, second):
        for path in sub.files:
            assert Path(path).parent == tmp_path, path
    assert set(first.files).isdisjoint(second.files)  # never the same files twice
    assert f"--job-name={name}" in first.argv
    with pytest.raises(InvalidJob, match="control characters"):
        bad = gpuplace.place(state, gpuplace.Job(name="a\nb", tp=8, dp=1))
        sl.submission(bad, ["x.sh"], directory=tmp_path)


def test_sinfo_errors_array_is_surfaced() -> None:
    info = sinfo()
    info["errors"] = [{"error_number": 1007, "description": "Protocol authentication error"}]
    with pytest.raises(sl.SlurmError, match="Protocol authentication error"):
        sl.read_sinfo(info)


def test_a_slurm_clients_output_is_read_within_its_bound_and_decoded_leniently() -> None:
    """A client that writes more than the document bound is killed and refused by name (its
    output was held whole in memory: 73 MB of `scontrol show` took the fuzzer's worker past
    its memory budget); bytes that are not UTF-8 come through as U+FFFD for the readers to
    name, not as a raw UnicodeDecodeError; a client that does not answer is slurmctld down."""
    ctld = Slurmctld(timeout=30)
    big = f"import sys; sys.stdout.buffer.write(b'x' * {MAX_DOCUMENT_BYTES + 1})"
    with pytest.raises(sl.SlurmError, match=f"wrote more than {MAX_DOCUMENT_BYTES} bytes"):
        ctld.run(sys.executable, "-c", big)
    fits = f"import sys; sys.stdout.buffer.write(b'y' * {MAX_DOCUMENT_BYTES})"
    assert len(ctld.run(sys.executable, "-c", fits).stdout) == MAX_DOCUMENT_BYTES
    bad = "import sys; sys.stdout.buffer.write(b'NodeName=n\\xff1 State=IDLE')"
    assert ctld.run(sys.executable, "-c", bad).stdout == "NodeName=n\ufffd1 State=IDLE"
    with pytest.raises(SlurmUnavailable, match="did not answer"):
        Slurmctld(timeout=0.5).run(sys.executable, "-c", "import time; time.sleep(30)")


#: `scontrol show assoc_mgr flags=qos` as Slurm 22.05.8 printed it for QOS normal and short
#: (MaxWall=00:10:00 MaxTRESPerJob=node=2,gres/gpu=8 MaxTRESPerNode=gres/gpu=4), shortened.
ASSOC_MGR_QOS = """Current Association Manager state

QOS Records

QOS=normal(1)
    UsageRaw=0.000000
    GrpJobs=N(0) GrpJobsAccrue=N(0) GrpSubmitJobs=N(0) GrpWall=N(0.00)
    GrpTRES=cpu=N(0),mem=N(0),energy=N(0),node=N(0),billing=N(0),fs/disk=N(0),vmem=N(0),pages=N(0)
    MaxWallPJ=
    MaxTRESPJ=
    MaxTRESPN=
    MaxTRESMinsPJ=
    MinPrioThresh=
    PreemptMode=OFF
    Account Limits
        No Accounts
QOS=short(2)
    UsageRaw=0.000000
    MaxWallPJ=10
    MaxTRESPJ=node=2,gres/gpu=8
    MaxTRESPN=gres/gpu=4
    MaxTRESMinsPJ=
    PreemptMode=OFF
"""


def test_qos_limits_read_from_assoc_mgr_and_honoured() -> None:
    from datetime import datetime

    from gpuplace.integrations import slurmctld as ctld

    normal, short = ctld.read_qos(ASSOC_MGR_QOS)
    assert normal == ctld.Qos("normal")
    assert short == ctld.Qos("short", max_wall=10, max_nodes=2, max_gpus=8, max_gpus_per_node=4)
    # A cluster without accounting caches none.
    assert (
        ctld.read_qos("Current Association Manager state\n\nNo QOS currently cached in Slurm.\n")
        == []
    )
    with pytest.raises(sl.SlurmError, match="cannot read TRES limit 'node=x'"):
        ctld.read_qos("QOS=bad(3)\n    MaxTRESPJ=node=x\n")

    nodes = sl.read_sinfo(sinfo())
    part = [ctld.Partition("gpu", default=True)]
    qos = [normal, short]
    now = datetime(2026, 12, 1, 12, 0)
    ok = ctld.eligible(
        nodes, part, [], ctld.SlurmRequest(qos="short", time_limit=5), qos=qos, now=now
    )
    assert ok.time_limit == 5 and len(ok.hosts) == 18
    # No -t: the QOS's MaxWall is the job's limit, as Slurm sets it.
    assert (
        ctld.eligible(nodes, part, [], ctld.SlurmRequest(qos="short"), qos=qos, now=now).time_limit
        == 10
    )
    with pytest.raises(sl.SlurmError, match="time limit 11 min is over QOS short's MaxWall 10 min"):
        ctld.eligible(
            nodes, part, [], ctld.SlurmRequest(qos="short", time_limit=11), qos=qos, now=now
        )
    with pytest.raises(
        sl.SlurmError, match=r"QOS gold does not exist in slurmdbd \(QOS: normal, short\)"
    ):
        ctld.eligible(nodes, part, [], ctld.SlurmRequest(qos="gold"), qos=qos, now=now)
    # Without accounting (no QOS known) the name is Slurm's to check.
    assert ctld.eligible(nodes, part, [], ctld.SlurmRequest(qos="gold"), now=now).hosts

    # Sizes: 12 GPUs, 4 a node, are over both MaxTRESPerJob limits; 8 GPUs fit on one node, but
    # MaxTRESPerNode gres/gpu=4 spreads them over two nodes, 4 each.
    state = sl.sync(sinfo(), None, io.StringIO(SCONTROL))
    view = ctld.SlurmView(nodes, part, [], qos=qos)
    with pytest.raises(
        sl.SlurmError,
        match="needs 3 nodes, over QOS short's MaxTRESPerJob node=2; and 12 GPUs, over QOS "
        "short's MaxTRESPerJob gres/gpu=8 ",
    ):
        ctld.place_slurm_job(
            state, gpuplace.Job(name="j", tp=4, dp=3), ctld.SlurmRequest(qos="short"), view
        )
    job = gpuplace.Job(name="j", tp=4, dp=2)
    alone = ctld.place_slurm_job(state, job, ctld.SlurmRequest(), view)
    assert sorted(ctld.placement_counts(alone.placement).values()) == [8]
    capped = ctld.place_slurm_job(state, job, ctld.SlurmRequest(qos="short"), view)
    assert sorted(ctld.placement_counts(capped.placement).values()) == [4, 4]
    # Three nodes are over MaxTRESPerJob node=2.
    three = ctld.SlurmView(
        nodes, part, [], qos=[ctld.Qos("short", max_nodes=2, max_gpus_per_node=2)]
    )
    with pytest.raises(sl.SlurmError, match="needs 3 nodes, over QOS short's MaxTRESPerJob node=2"):
        ctld.place_slurm_job(
            state, gpuplace.Job(name="j", tp=2, dp=3), ctld.SlurmRequest(qos="short"), three
        )
    # The QOS survive the view file that `slurm sync` writes.
    again = ctld.SlurmView.from_dict(json.loads(json.dumps(view.to_dict())))
    assert again.qos == qos
    # A view file whose QOS limits are not whole numbers is refused, naming the field.
    for bad in (True, 2.5, "10", -1):
        doc = view.to_dict()
        doc["qos"][0]["max_wall"] = bad
        with pytest.raises(sl.SlurmError, match=r"view.json: not a slurm view .*qos max_wall"):
            ctld.SlurmView.from_dict(doc, "view.json")


def test_qos_read_through_scontrol(tmp_path: Path) -> None:
    """Slurmctld.qos runs `scontrol show assoc_mgr flags=qos`: its QOS; none where slurmctld
    denies them to the user (Slurm alone checks the QOS then); any other failure is an error."""
    scontrol = tmp_path / "scontrol"
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"}
    (tmp_path / "answer.txt").write_text(ASSOC_MGR_QOS)
    for body, expected in (
        (f"cat {tmp_path / 'answer.txt'}", ["normal", "short"]),
        ("echo 'slurm_load_assoc_mgr_info error: Access/permission denied' >&2; exit 1", []),
    ):
        scontrol.write_text(f"#!/bin/sh\n{body}\n")
        scontrol.chmod(0o755)
        assert [q.name for q in Slurmctld(env=env).qos()] == expected
    scontrol.write_text("#!/bin/sh\necho 'Invalid Protocol Version' >&2\nexit 1\n")
    with pytest.raises(sl.SlurmError, match="assoc_mgr flags=qos failed: Invalid Protocol"):
        Slurmctld(env=env).qos()
