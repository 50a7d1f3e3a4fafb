"""A mutation fuzzer for every reader of gpuplace, with a time and a memory budget per input.

Each target is one reader (or one file the CLI or the service accepts), seeded from the real
samples in tests/data (and the examples); an input is a seed mutated by byte flips, splices of
two seeds, huge numbers, deep nesting, long runs of one character, invalid UTF-8, repeated
lines, widened ranges and truncation. Every input runs in a worker subprocess whose address
space is limited (RLIMIT_AS: what the imports use plus ``--memory-mb``, 256 MB by default) and
which must answer within ``--timeout`` seconds of CPU time (1 s, plus 30 µs per byte of input;
CPU time, so that a loaded machine scheduling the worker late does not count as a hang, with a
wall-clock stop at ten times the budget): a hang or a blow-up is caught and reported instead of
stalling or killing the caller. A finding is

* an escape: any exception that is not a gpuplace error (GpuplaceError), or a gpuplace error
  that only the readers' safety net produced ("unexpected parse failure");
* a hang: no answer within the CPU-time budget (the worker is killed and restarted);
* a blow-up: MemoryError under the memory budget, or the worker dying.

Long runs, from the repository root::

    python tests/fuzz/engine.py --list
    python tests/fuzz/engine.py sinfo --seconds 600
    python tests/fuzz/engine.py all --seconds 60

print per target the inputs tried, escapes, hangs, blow-ups and the worker's peak memory
(VmHWM, as ru_maxrss but its own), and the first findings with the input that caused them (saved under
``--save DIR`` when given). tests/io/test_fuzz.py runs every target for a few seconds in CI.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import resource
import select
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
EXAMPLES = ROOT / "examples"

#: A hang is judged on the worker's CPU time; its wall time may run to this many times the
#: budget before it is stopped all the same (a loaded machine schedules it late).
WALL_FACTOR = 10.0

#: Default budgets of one input: ``TIMEOUT_S`` plus ``SECONDS_PER_BYTE`` for each byte (the
#: pure-Python YAML parser reads about 130 kB/s, slower on a loaded machine; a superlinear
#: parse of a 100 kB input takes minutes, far past this), and ``MEMORY_MB`` above what the
#: worker's imports use.
TIMEOUT_S = 1.0
SECONDS_PER_BYTE = 30e-6
MEMORY_MB = 256


# ------------------------------------------------------------------------------ targets
@dataclass(frozen=True)
class Target:
    """One reader: the suffix its input file gets, its seeds (paths, or text made by
    ``make_seeds`` in the worker's absence), and the call (run in the worker)."""

    name: str
    suffix: str
    seeds: tuple[str, ...]
    call: str
    generated: tuple[str, ...] = field(default_factory=tuple)


def _glob(pattern: str) -> tuple[str, ...]:
    return tuple(sorted(str(p) for p in ROOT.glob(pattern)))


def _sinfo_seed() -> str:
    nodes = [
        {
            "name": f"dgx{i:02d}",
            "state": ["MIXED"] if i % 2 else "idle",
            "state_flags": [] if i % 3 else ["DRAIN"],
            "gres": "gpu:h100:8(S:0-1)",
            "gres_used": "gpu:h100:2(IDX:0-1)" if i % 2 else "gpu:h100:0(IDX:N/A)",
            "partitions": ["gpu", "all"],
            "active_features": "h100,ib",
        }
        for i in range(1, 5)
    ]
    return json.dumps({"nodes": nodes, "errors": []}, indent=2)


def _squeue_seed() -> str:
    jobs = [
        {
            "job_id": 101,
            "name": "train",
            "job_state": ["RUNNING"],
            "nodes": "dgx[01-02]",
            "gres_detail": ["gpu:h100:8(IDX:0-7)", "gpu:h100:4(IDX:0-3)"],
        },
        {"job_id": 102, "name": "wait", "job_state": "PENDING", "nodes": ""},
    ]
    return json.dumps({"jobs": jobs, "errors": []}, indent=2)


WORKLOAD_YAML = """jobs:
  - {name: a, submit_s: 0, gpus: 8, duration_s: 3600, tp: 8}
  - {name: b, submit_s: 30, gpus: 64, duration_s: 7200, tp: 8, pp: 2, model: llama2-13b}
  - {name: c, submit_s: 60.5, gpus: 16, duration_s: 10, estimate_s: 20, priority: 2}
"""
WORKLOAD_CSV = """name,submit_s,gpus,duration_s,estimate_s,priority,tp,pp,model
a,0,8,3600,,0,8,1,llama2-13b
b,30,64,7200,8000,1,8,2,
c,60.5,16,10,,,,,
"""
FAILURES = """causes:
  - {name: faulty GPU, component: gpu, per_component_per_day: 0.0002, repair_hours: 24}
  - {component: host, per_component_per_day: 0.00005, repair_hours: 8}
  - {component: nic, per_component_per_day: 0.0001, repair_hours: 2, loss: 0.01}
"""
RULES = """soft_factor: 0.8
xid:
  failed: [48, 79]
  degraded: {31: 0.9}
infiniband:
  nominal_gbps: 400
ber:
  effective_ber_max: 1.0e-10
"""
TOPOLOGY = """format: gpuplace.topology/1
name: small
levels:
  - {name: node, bandwidth_gbps: 450, latency_us: 1}
  - {name: leaf, bandwidth_gbps: 50, latency_us: 3}
  - {name: spine, bandwidth_gbps: 25, latency_us: 5}
node_types:
  hgx:
    gpus: 4
    gpu_model: H100-SXM5-80GB
    nics: [mlx5_0, mlx5_1]
    gpu_nic: [0, 0, 1, 1]
nodes:
  - {name: "h[01-04]", type: hgx, domains: {leaf: la, spine: s}}
  - {name: "h[05-08]", type: hgx, domains: {leaf: lb, spine: s}}
attributes:
  - {driver: 550.54.15}
  - {hosts: "h0[1-2]", firmware: 96.00.74.00.01}
pools:
  training: "h[01-06]"
  inference: {domains: [lb], lend_to: [training]}
priority_classes:
  prod: {priority: 10}
  scavenger: {priority: -5, preemptible: true}
stores:
  lustre: {attach: "spine:s", read_gbps: 100, write_gbps: 50}
  scratch: {attach: local, read_gbps: 10, write_gbps: 5}
power_domains:
  - {name: r1, kind: rack, hosts: "h[01-04]", budget_w: 40000, max_synchronized: 2}
power_phases: 3
uplink_gbps: {"leaf:la": 40}
host_count_factors: [1.0, 0.9]
algorithm_efficiency: {ring: 0.9}
"""


def _k8s_seed() -> str:
    """``kubectl get nodes -o json`` of four GPU nodes with Topograph tier and clique labels."""
    items = [
        {
            "kind": "Node",
            "metadata": {
                "name": f"gpu-{i}",
                "labels": {
                    "fabric.topograph.run/tier-1": f"leaf-{i // 2}",
                    "fabric.topograph.run/tier-2": "spine-0",
                    "nvidia.com/gpu.clique": f"clique-{i // 2}.1",
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                },
            },
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "224"}},
        }
        for i in range(4)
    ]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2)


SCONTROL_SHOW = """PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL Default=YES MaxTime=UNLIMITED Nodes=dgx[01-04] PriorityTier=1 State=UP TotalCPUs=448 TotalNodes=4 TRES=cpu=448,mem=8T,node=4,gres/gpu=32
PartitionName=debug AllowGroups=ALL Default=NO Nodes=dgx05 State=DRAIN Comment=for the on-call team
ReservationName=maint StartTime=2025-03-01T08:00:00 EndTime=2025-03-01T12:00:00 Duration=04:00:00 Nodes=dgx[01-02] NodeCnt=2 Flags=MAINT,SPEC_NODES Users=root State=INACTIVE
"""
GPU_QUERY = """index, name, driver_version, vbios_version, pci.bus_id
0, NVIDIA H100 80GB HBM3, 550.54.15, 96.00.74.00.01, 00000000:1B:00.0
1, NVIDIA H100 80GB HBM3, 550.54.15, 96.00.74.00.01, 00000000:43:00.0
2, NVIDIA H100 80GB HBM3, 550.54.15, 96.00.89.00.01, 00000000:52:00.0
3, NVIDIA H100 80GB HBM3, 550.54.15, [N/A], 00000000:61:00.0
"""


def _packaged_rows(name: str, rows: int) -> str:
    """The header and ``rows`` rows spread over a trace shipped in the package
    (gpuplace/sim/data, provenance in its README): real rows as seeds, without a copy of the
    data in tests/."""
    import gzip

    raw = (ROOT / "python" / "gpuplace" / "sim" / "data" / name).read_bytes()
    lines = gzip.decompress(raw).decode("utf-8").splitlines(keepends=True)
    step = max(1, (len(lines) - 1) // rows)
    return "".join([lines[0], *lines[1::step][:rows]])


TARGETS: dict[str, Target] = {
    t.name: t
    for t in [
        Target(
            "topology-file",
            ".yaml",
            (),
            "gpuplace.Topology.load(path)",
            generated=("TOPOLOGY",),
        ),
        Target(
            "job-file",
            ".yaml",
            _glob("examples/*.yaml") + _glob("examples/policy/*.yaml"),
            "gpuplace.Job.load(path)",
        ),
        Target(
            "state-file",
            ".json",
            (),
            "gpuplace.ClusterState.load(small_topology(), path)",
            generated=("STATE",),
        ),
        Target("workload-yaml", ".yaml", (), "load_workload(path)", ("WORKLOAD_YAML",)),
        Target("workload-csv", ".csv", (), "load_workload(path)", ("WORKLOAD_CSV",)),
        Target(
            "pollux-table",
            ".csv",
            _glob("tests/data/pollux/*.csv"),
            "read_placement_table(path, pollux_job())",
        ),
        Target(
            "nvidia-smi-topo",
            ".txt",
            _glob("tests/data/topologies/nvidia-smi-topo-*"),
            "io.read_nvidia_smi_topo(path)",
        ),
        Target(
            "rocm-smi",
            ".txt",
            _glob("tests/data/topologies/rocm-smi-*"),
            "io.read_rocm_smi_topo(path)",
        ),
        Target(
            "ibnetdiscover",
            ".txt",
            _glob("tests/data/topologies/ibnetdiscover-*"),
            "io.read_ibnetdiscover(path)",
        ),
        Target(
            "slurm-topology-conf",
            ".conf",
            _glob("tests/data/topologies/*.conf") + _glob("tests/data/topologies/slurm-*.yaml"),
            "io.read_slurm_topology(path)",
        ),
        Target(
            "scontrol-topology",
            ".conf",
            _glob("tests/data/topologies/*.conf"),
            "slurm.read_topology(path)",
        ),
        Target(
            "ec2-topology",
            ".json",
            _glob("tests/data/topologies/ec2-*.json"),
            "io.read_ec2_topology(path)",
        ),
        Target("sinfo", ".json", (), "slurm.read_sinfo(path)", ("SINFO",)),
        Target("squeue", ".json", (), "slurm.read_squeue(path)", ("SQUEUE",)),
        Target(
            "mig-lgip",
            ".txt",
            _glob("tests/data/mig/*lgip*.txt")
            + _glob("tests/data/mig/h100*.txt")
            + _glob("tests/data/mig/a30*.txt"),
            "io.read_nvidia_smi_mig(path)",
        ),
        Target(
            "mig-lgi",
            ".txt",
            _glob("tests/data/mig/*-lgi.txt"),
            "io.read_nvidia_smi_mig_instances(path)",
        ),
        Target("mig-requests", ".yaml", _glob("examples/mig/*.yaml"), "read_requests(str(path))"),
        Target(
            "share-requests",
            ".yaml",
            _glob("examples/share/*.yaml"),
            "read_shared_requests(str(path))",
        ),
        Target("health-rules", ".yaml", (), "load_rules(path)", ("RULES",)),
        Target("failures-file", ".yaml", (), "load_failures(str(path))", ("FAILURES",)),
        Target(
            "nvidia-smi-q",
            ".txt",
            _glob("tests/data/health/nvidia-smi-q*"),
            "health.read_evidence(path, format='nvidia-smi-q')",
        ),
        Target(
            "nvidia-smi-nvlink",
            ".txt",
            _glob("tests/data/health/nvidia-smi-nvlink*")
            + _glob("tests/data/health/mutated/nvidia-smi-nvlink*"),
            "health.read_evidence(path, format='nvidia-smi-nvlink')",
        ),
        Target(
            "bus-ids",
            ".csv",
            _glob("tests/data/health/bus-ids*"),
            "health.read_evidence(path, format='bus-ids')",
        ),
        Target(
            "kernel-log",
            ".log",
            _glob("tests/data/health/*.log") + _glob("tests/data/health/mutated/*.log"),
            "health.read_evidence(path, format='kernel-log', host='h1')",
        ),
        Target(
            "dcgmi-health",
            ".txt",
            _glob("tests/data/health/dcgmi-health*")
            + _glob("tests/data/health/mutated/dcgmi-health*"),
            "health.read_evidence(path, format='dcgmi-health')",
        ),
        Target(
            "dcgmi-diag",
            ".txt",
            _glob("tests/data/health/dcgmi-diag*") + _glob("tests/data/health/mutated/dcgmi-diag*"),
            "health.read_evidence(path, format='dcgmi-diag')",
        ),
        Target(
            "infiniband",
            ".txt",
            _glob("tests/data/health/ib*")
            + _glob("tests/data/health/perfquery*")
            + _glob("tests/data/health/mutated/ib*"),
            "health.read_evidence(path, host='h1')",
        ),
        Target(
            "mlxlink",
            ".txt",
            _glob("tests/data/health/mlxlink*") + _glob("tests/data/health/mutated/mlxlink*"),
            "health.read_evidence(path, format='mlxlink', host='h1', device='mlx5_0')",
        ),
        Target(
            "nccl-tests", ".txt", _glob("tests/data/nccl-tests/*.txt"), "io.read_nccl_tests(path)"
        ),
        Target("qaplib", ".dat", _glob("tests/data/qaplib/*.dat"), "io.read_qaplib(path)"),
        Target(
            "philly-trace",
            ".csv",
            (),
            "philly(path)",
            ("PHILLY",),
        ),
        Target("openb-trace", ".csv", (), "openb_trace(path)", ("OPENB_PODS",)),
        Target("openb-nodes", ".csv", (), "read_openb_nodes(path)", ("OPENB_NODES",)),
        Target("openb-pods", ".csv", (), "read_openb_pods(path)", ("OPENB_PODS",)),
        Target(
            "scontrol-show",
            ".txt",
            (),
            # As the service reads it: a client's output through Slurmctld.run (bounded).
            "ctld.read_records(ctld.Slurmctld().run('cat', str(path)).stdout)",
            ("SCONTROL_SHOW",),
        ),
        Target("lingjun-cluster", ".csv", (), "clusters.lingjun(path)", ("LINGJUN",)),
        Target("pai-cluster", ".csv", (), "clusters.pai(path)", ("PAI",)),
        Target("k8s-nodes", ".json", (), "io.read_k8s_nodes(path)", ("K8S_NODES",)),
        Target(
            "gpu-query",
            ".csv",
            (),
            "read_nvidia_smi_query(path, host='h1')",
            ("GPU_QUERY",),
        ),
        Target(
            "extender-filter",
            ".json",
            _glob("tests/data/extender/filter-request.json"),
            "extender_call('filter', path)",
        ),
        Target(
            "extender-prioritize",
            ".json",
            _glob("tests/data/extender/prioritize-request.json"),
            "extender_call('prioritize', path)",
        ),
    ]
}

GENERATED: dict[str, str | Callable[[], str]] = {
    "TOPOLOGY": TOPOLOGY,
    "WORKLOAD_YAML": WORKLOAD_YAML,
    "WORKLOAD_CSV": WORKLOAD_CSV,
    "FAILURES": FAILURES,
    "RULES": RULES,
    "SINFO": _sinfo_seed(),
    "SQUEUE": _squeue_seed(),
    "K8S_NODES": _k8s_seed(),
    "GPU_QUERY": GPU_QUERY,
    "SCONTROL_SHOW": SCONTROL_SHOW,
    # Real rows (mixed: short and long jobs, 1 to 8 GPUs; pods with and without GPUs, shared,
    # never scheduled), read when the target runs.
    "PHILLY": lambda: _packaged_rows("pollux_philly.csv.gz", 60),
    "OPENB_PODS": lambda: _packaged_rows("openb_pod_list_default.csv.gz", 60),
    "OPENB_NODES": lambda: _packaged_rows("openb_node_list_all_node.csv.gz", 40),
    "LINGJUN": lambda: _packaged_rows("lingjun_topo.csv.gz", 40),
    # pai_machine_spec.csv has no header: 41 machines (the first kept as the "header")
    "PAI": lambda: _packaged_rows("pai_machine_spec.csv.gz", 40),
}


# ------------------------------------------------------------------------------ the worker
WORKER_SETUP = """
import io as _io, json
import gpuplace
from gpuplace import io
from gpuplace.errors import GpuplaceError, InvalidJob
from gpuplace.integrations import slurm
from gpuplace.integrations import slurmctld as ctld
from gpuplace.integrations.extender import MAX_BODY, BadRequest, Extender, parse_body
from gpuplace.health import readers as health
from gpuplace.health.judge import load_rules
from gpuplace.sim.traces import load_workload, philly, openb as openb_trace
from gpuplace.io.openb import read_openb_nodes, read_openb_pods
from gpuplace.io.gpu_query import read_nvidia_smi_query
from gpuplace.sim.failures import load_failures
from gpuplace.sim import clusters
from gpuplace.io import read_placement_table
from gpuplace.cli.mig import read_requests
from gpuplace.cli.share import read_shared_requests

_TOPOLOGY = None
_EXTENDER = None

def small_topology():
    global _TOPOLOGY
    if _TOPOLOGY is None:
        _TOPOLOGY = gpuplace.Topology.preset("h100-superpod", nodes=4)
    return _TOPOLOGY

def extender():
    global _EXTENDER
    if _EXTENDER is None:
        _EXTENDER = Extender(gpuplace.ClusterState(small_topology()))
    return _EXTENDER

def json_body(path):
    # As the service takes a request body: refused past its size limit (HTTP 413) without
    # reading further, then parse_body (strict UTF-8, the bounded JSON parser). The whole file
    # read first (as here until a 73 MB body blew the memory budget) is not what it does.
    limit = MAX_BODY  # the service's default (Limits.max_body)
    with open(path, "rb") as handle:
        raw = handle.read(limit + 1)
    if len(raw) > limit:
        raise InvalidJob(f"request body over {limit} bytes")
    return parse_body(raw)

def extender_call(verb, path):
    # BadRequest is the extender's error for a bad body (HTTP 400), named field and all.
    try:
        return getattr(extender(), verb)(json_body(path))
    except BadRequest as exc:
        raise InvalidJob(str(exc)) from None

def pollux_job():
    return gpuplace.Job(name="bert", communication={"dp": gpuplace.Communication("all-reduce", 4.4e8)})
"""


def _state_seed() -> str:
    """A real state file (written by ClusterState.save) of the small preset the state target
    loads against, with a job placed and a GPU failed."""
    import gpuplace

    topology = gpuplace.Topology.preset("h100-superpod", nodes=4)
    state = gpuplace.ClusterState(topology)
    job = gpuplace.Job.from_dict({"name": "j", "parallelism": {"tp": 4, "dp": 2}})
    state.allocate(gpuplace.place(state, job))
    state.fail(gpu=15, reason="xid 79")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.json"
        state.save(path)
        return path.read_text()


def worker_main() -> None:  # pragma: no cover - runs in the child
    """Read ``(target call, suffix, input)`` frames on stdin; answer one JSON line each."""
    namespace: dict[str, Any] = {}
    exec(WORKER_SETUP, namespace)
    from gpuplace.errors import GpuplaceError

    stdin = sys.stdin.buffer
    stdout = sys.stdout
    tmp = Path(tempfile.mkdtemp(prefix="gpuplace-fuzz-"))
    compiled: dict[str, Any] = {}
    stdout.write(json.dumps({"ready": True, "vm_kb": _vm_kb()}) + "\n")
    stdout.flush()
    while True:
        head = stdin.read(4)
        if len(head) < 4:
            return
        (size,) = struct.unpack(">I", head)
        frame = json.loads(stdin.read(size))
        (size,) = struct.unpack(">I", stdin.read(4))
        data = stdin.read(size)
        path = tmp / f"input{frame['suffix']}"
        path.write_bytes(data)
        del data  # the reader's memory, not the frame's: a 60 MB input is read from the file
        code = compiled.setdefault(frame["call"], compile(frame["call"], "<target>", "eval"))
        namespace["path"] = path
        outcome, detail = "ok", ""
        try:
            eval(code, namespace)
        except GpuplaceError as exc:
            outcome = "fallback" if "unexpected parse failure" in str(exc) else "error"
            detail = str(exc)[:300]
        except MemoryError:
            outcome, detail = "blowup", "MemoryError"
        except BaseException as exc:
            outcome = "escape"
            detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-1500:]
        stdout.write(
            json.dumps({"outcome": outcome, "detail": detail, "rss_kb": _peak_kb()}) + "\n"
        )
        stdout.flush()


def _peak_kb() -> int:
    """The worker's peak resident memory (kB): ``VmHWM``, which is this process's own, where
    ``ru_maxrss`` may carry the figure of the process it was forked from."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _vm_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1])
    return 0


def _package_root() -> str:
    """Where the gpuplace this process would import lives (the installed package in CI, a
    checkout's python/ in development), so the worker fuzzes the same build; this tree's
    python/ only when none is importable. (The tree's python/ first would shadow an installed
    package with sources that lack the compiled extension.)"""
    spec = importlib.util.find_spec("gpuplace")
    if spec is not None and spec.origin:
        return str(Path(spec.origin).resolve().parents[1])
    return str(ROOT / "python")


class Worker:
    """A child process running :func:`worker_main` under the memory budget; restarted after a
    hang or a crash."""

    def __init__(self, memory_mb: int):
        self.memory_mb = memory_mb
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak_rss_kb = 0

    def start(self) -> None:
        env = dict(os.environ)
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONPATH"] = os.pathsep.join([_package_root(), *sys.path])
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        hello = self._answer(120.0)
        if hello is None or not hello.get("ready"):
            self.stop()  # its pipes closed, not left for the garbage collector
            raise RuntimeError("the fuzz worker did not start")
        # The budget is on top of what the imports use: the limit is set from outside
        # (prlimit) once the worker is ready, so that importing numpy is not counted.
        limit = (hello["vm_kb"] << 10) + (self.memory_mb << 20)
        resource.prlimit(self.proc.pid, resource.RLIMIT_AS, (limit, limit))

    def _cpu_s(self) -> float:
        """CPU seconds the worker has used (user + system, from /proc; 0 where unreadable)."""
        assert self.proc is not None
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _answer(self, timeout: float, *, cpu_budget: bool = False) -> dict[str, Any] | None:
        """The worker's next answer, or None after ``timeout`` seconds. With ``cpu_budget``, the
        budget is the worker's CPU time, so a shared, loaded machine does not turn a slow
        schedule into a hang; wall time then stops it at :data:`WALL_FACTOR` times the budget."""
        assert self.proc is not None and self.proc.stdout is not None
        start_cpu, deadline = (
            self._cpu_s(),
            time.monotonic() + timeout * (WALL_FACTOR if cpu_budget else 1),
        )
        wait = timeout
        while True:
            ready, _, _ = select.select([self.proc.stdout], [], [], wait)
            if ready:
                break
            left = deadline - time.monotonic()
            used = self._cpu_s() - start_cpu
            if left <= 0 or not cpu_budget or used >= timeout or self.proc.poll() is not None:
                return None
            wait = min(left, max(0.05, timeout - used))
        line = self.proc.stdout.readline()
        if not line:
            return None
        return json.loads(line)

    def run(self, target: Target, data: bytes, timeout: float) -> tuple[str, str]:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        frame = json.dumps({"call": target.call, "suffix": target.suffix}).encode()
        try:
            self.proc.stdin.write(struct.pack(">I", len(frame)) + frame)
            self.proc.stdin.write(struct.pack(">I", len(data)) + data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.stop()
            return "blowup", "the worker died"
        budget = timeout + SECONDS_PER_BYTE * len(data)
        answer = self._answer(budget, cpu_budget=True)
        if answer is None:
            died = self.proc.poll() is not None
            self.stop()
            return (
                ("blowup", "the worker died") if died else ("hang", f"over {budget:.1f} s of CPU")
            )
        self.peak_rss_kb = max(self.peak_rss_kb, int(answer["rss_kb"]))
        return answer["outcome"], answer["detail"]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    try:
                        pipe.close()
                    except BrokenPipeError:
                        pass
            self.proc = None


# ------------------------------------------------------------------------------ mutations
def seeds_of(target: Target) -> list[bytes]:
    out = [Path(p).read_bytes() for p in target.seeds]
    for name in target.generated:
        seed = _state_seed if name == "STATE" else GENERATED[name]
        out.append((seed() if callable(seed) else seed).encode())
    if not out:
        raise RuntimeError(f"target {target.name} has no seeds")
    return out


def _replace_digits(rng: random.Random, data: bytes, value: bytes) -> bytes:
    spots = [i for i in range(len(data)) if 48 <= data[i] <= 57]
    if not spots:
        return data + value
    i = rng.choice(spots)
    j = i
    while j < len(data) and 48 <= data[j] <= 57:
        j += 1
    return data[:i] + value + data[j:]


def mutate(rng: random.Random, seeds: list[bytes]) -> bytes:
    """One mutant: a seed with one to four mutations."""
    data = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(12)
        pos = rng.randint(0, len(data)) if data else 0
        if kind == 0 and data:  # byte flips
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 1:  # splice with another seed
            other = rng.choice(seeds)
            cut = rng.randint(0, len(other))
            data = data[:pos] + other[cut : cut + rng.randint(1, 4000)] + data[pos:]
        elif kind == 2:  # huge number
            digits = rng.choice([b"9" * 25, b"1" * 5000, b"18446744073709551616", b"-1", b"1e999"])
            data = bytearray(_replace_digits(rng, bytes(data), digits))
        elif kind == 3:  # deep nesting
            opener = rng.choice([b"[", b"{", b"{a: ", b'{"a": ', b"- ", b"("])
            data = data[:pos] + opener * rng.choice([50, 200, 2000, 100_000]) + data[pos:]
        elif kind == 4:  # a long run of one character
            char = rng.choice(
                [b" ", b"\t", b"=", b"|", b"-", b":", b"0", b"a", b"[", b",", b"+", b"."]
            )
            data = data[:pos] + char * rng.choice([1000, 20_000, 100_000]) + data[pos:]
        elif kind == 5:  # invalid UTF-8, NUL, bare CR
            junk = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\r", b"\xef\xbb\xbf"])
            data = data[:pos] + junk + data[pos:]
        elif kind == 6 and data:  # truncation
            data = data[: rng.randint(0, len(data))]
        elif kind == 7:  # a line repeated many times
            lines = bytes(data).split(b"\n")
            line = rng.choice(lines)
            i = rng.randrange(len(lines))
            lines[i:i] = [line] * rng.choice([10, 300, 3000])
            data = bytearray(b"\n".join(lines))
        elif kind == 8:  # a range widened
            data = bytearray(
                _replace_digits(rng, bytes(data), rng.choice([b"0-999999999", b"1-99999,1-99999"]))
            )
        elif kind == 9:  # a YAML alias bomb
            bomb = b"a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + b"".join(
                b"a%d: &a%d [%s]\n" % (i, i, b", ".join([b"*a%d" % (i - 1)] * 9))
                for i in range(1, 9)
            )
            data = bytearray(bomb) + data
        elif kind == 10 and data:  # delete a stretch
            end = min(len(data), pos + rng.randint(1, 200))
            del data[pos:end]
        else:  # insert a token of the formats
            token = rng.choice(
                [
                    b":",
                    b",",
                    b"]",
                    b"}",
                    b"null",
                    b"true",
                    b"~",
                    b"&x",
                    b"*x",
                    b"!!binary x",
                    b"- ",
                    b"\n",
                    b'"',
                    b"'",
                    b"#",
                    b"0x",
                    b"N/A",
                    b"nan",
                    b"inf",
                    b"2024-13-45",
                ]
            )
            data = data[:pos] + token + data[pos:]
    return bytes(data[: 70 << 20])


# ------------------------------------------------------------------------------ a session
@dataclass
class Report:
    target: str
    inputs: int = 0
    escapes: int = 0
    fallbacks: int = 0
    hangs: int = 0
    blowups: int = 0
    peak_rss_mb: float = 0.0
    findings: list[tuple[str, str, bytes]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.escapes or self.fallbacks or self.hangs or self.blowups)

    def line(self) -> str:
        return (
            f"{self.target:22s} inputs {self.inputs:7d}  escapes {self.escapes}  "
            f"fallbacks {self.fallbacks}  hangs {self.hangs}  blow-ups {self.blowups}  "
            f"peak {self.peak_rss_mb:.0f} MB"
        )


def fuzz(
    target: Target,
    *,
    seconds: float,
    seed: int = 0,
    timeout: float = TIMEOUT_S,
    memory_mb: int = MEMORY_MB,
    max_inputs: int | None = None,
    include_seeds: bool = True,
    on_finding: Callable[[str, str, bytes], None] | None = None,
) -> Report:
    """Run ``target`` on mutants for ``seconds`` (or ``max_inputs``); the seeds first."""
    rng = random.Random(f"{target.name}:{seed}")
    seeds = seeds_of(target)
    report = Report(target.name)
    worker = Worker(memory_mb)
    worker.start()
    deadline = time.monotonic() + seconds
    queue = list(seeds) if include_seeds else []
    try:
        while time.monotonic() < deadline and (max_inputs is None or report.inputs < max_inputs):
            data = queue.pop(0) if queue else mutate(rng, seeds)
            outcome, detail = worker.run(target, data, timeout)
            report.inputs += 1
            if outcome in ("ok", "error"):
                continue
            setattr(
                report,
                {
                    "escape": "escapes",
                    "fallback": "fallbacks",
                    "hang": "hangs",
                    "blowup": "blowups",
                }[outcome],
                getattr(
                    report,
                    {
                        "escape": "escapes",
                        "fallback": "fallbacks",
                        "hang": "hangs",
                        "blowup": "blowups",
                    }[outcome],
                )
                + 1,
            )
            if len(report.findings) < 20:
                report.findings.append((outcome, detail, data))
            if on_finding is not None:
                on_finding(outcome, detail, data)
    finally:
        report.peak_rss_mb = worker.peak_rss_kb / 1024
        worker.stop()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="target names, or 'all'")
    parser.add_argument("--list", action="store_true", help="list the targets")
    parser.add_argument("--seconds", type=float, default=60.0, help="per target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="per input (s)")
    parser.add_argument("--memory-mb", type=int, default=MEMORY_MB, help="per input, over imports")
    parser.add_argument("--save", type=Path, help="directory for the inputs of findings")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    if args.list or not args.targets:
        for t in TARGETS.values():
            print(f"{t.name:22s} {t.call}")
        return 0
    names = list(TARGETS) if args.targets == ["all"] else args.targets
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target {unknown[0]}; see --list")
    dirty = False
    for name in names:
        counter = [0]

        def save(
            outcome: str, detail: str, data: bytes, name: str = name, counter: list[int] = counter
        ) -> None:
            if args.save is None:
                return
            args.save.mkdir(parents=True, exist_ok=True)
            counter[0] += 1
            (args.save / f"{name}-{outcome}-{counter[0]}{TARGETS[name].suffix}").write_bytes(data)

        report = fuzz(
            TARGETS[name],
            seconds=args.seconds,
            seed=args.seed,
            timeout=args.timeout,
            memory_mb=args.memory_mb,
            on_finding=save,
        )
        print(report.line(), flush=True)
        for outcome, detail, data in report.findings[:3]:
            print(
                f"  {outcome}: {detail.strip().splitlines()[-1] if detail.strip() else ''}"
                f" (input of {len(data)} bytes)"
            )
        dirty = dirty or not report.clean
    return 1 if dirty else 0


if __name__ == "__main__":
    sys.exit(main())
