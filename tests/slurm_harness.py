"""A throw-away Slurm cluster on loopback, for checking the slurm-tree baseline against Slurm.

One munged, one slurmctld and one ``slurmd -N NAME`` per configured node, all in a private
directory with its own slurm.conf, topology.conf and munge key; slurmctld and the nodes listen
on 127.0.0.1 only (``CommunicationParameters=NoInAddrAny,NoCtldInAddrAny``), each node on a
port of its own, and the nodes report the configured hardware
(``SlurmdParameters=config_overrides``). Every daemon is started by :class:`LoopbackSlurm`
and stopped by it, also when a test fails.

:class:`LoopbackAccounting` adds Slurm accounting (QOS, associations, ``-M`` between clusters):
a MariaDB server in its own data directory on a Unix socket only (``--skip-networking``) and a
slurmdbd on 127.0.0.1, each started and stopped by it. Clusters given ``accounting=`` register
with it and take its munge key, so several clusters on this host reach each other through it.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TypeVar

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "scontrol")

_TEST_ONLY = re.compile(r"to start at \S+ using (\d+) processors on nodes (\S+) in partition (\S+)")


#: What :class:`LoopbackAccounting` runs.
ACCOUNTING = ("slurmdbd", "mariadbd", "mariadb-install-db", "sacctmgr", "munged")


def missing_accounting() -> list[str]:
    """Accounting programs (slurmdbd, MariaDB, sacctmgr) that are not on PATH or in /usr/sbin."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    found = [name for name in ACCOUNTING if shutil.which(name, path=path) is None]
    plugin = "accounting_storage_mysql.so"
    dirs = ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/slurm", "/usr/lib64/slurm")
    if not any((Path(d) / plugin).exists() for d in dirs):
        found.append(plugin)
    return found


def missing_daemons() -> list[str]:
    """Slurm and munge programs that are not on PATH (or in /usr/sbin)."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    return [name for name in DAEMONS if shutil.which(name, path=path) is None]


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class SlurmError(RuntimeError):
    """A Slurm command failed or the cluster did not reach the expected state in time."""


def _stop_procs(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process group (last started first), SIGKILL what is left after 10 s."""
    for proc in reversed(procs):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 10
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)
    procs.clear()


_S = TypeVar("_S", bound="_Started")


class _Started:
    """A context manager over ``start()`` and ``stop()``: what ``start`` brought up before it
    failed is stopped too."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _S) -> _S:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Daemons(_Started):
    """Daemons started by a harness: each in its own session, its output in
    ``dir/log/NAME-K.out``; ``_wait`` fails at once when one of them exits."""

    dir: Path
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]]

    def _spawn(self, *argv: str) -> subprocess.Popen[bytes]:
        log = open(self.dir / "log" / f"{Path(argv[0]).name}-{len(self.procs)}.out", "wb")
        proc = subprocess.Popen(
            argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.procs.append(proc)
        return proc

    def _wait(self, done, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise SlurmError(
                        f"{what}: {proc.args[0]} exited with {proc.returncode} "
                        f"(logs in {self.dir / 'log'})"
                    )
            if done():
                return
            time.sleep(0.1)
        raise SlurmError(f"{what} within {timeout:.0f} s (logs in {self.dir / 'log'})")


class LoopbackAccounting(_Daemons):
    """Slurm accounting on loopback: munged, a MariaDB server (its own data directory made by
    ``mariadb-install-db``, a Unix socket only, run as root) and slurmdbd on a free port of
    127.0.0.1, all in ``workdir``. Give it to :class:`LoopbackSlurm` as ``accounting=``. Use as
    a context manager; everything is stopped on exit, also when start-up fails."""

    def __init__(self, workdir: Path):
        self.dir = workdir
        self.port = 0
        self.key = workdir / "munge.key"
        self.munge_socket = workdir / "munge.sock"
        self.db_socket = workdir / "mysql.sock"
        self.procs: list[subprocess.Popen[bytes]] = []
        path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
        # slurmdbd reads slurmdbd.conf beside SLURM_CONF (it has no -f); the MariaDB client
        # library takes its socket from MYSQL_UNIX_PORT.
        self.env = {
            **os.environ,
            "PATH": path,
            "SLURM_CONF": str(workdir / "slurm.conf"),
            "MYSQL_UNIX_PORT": str(self.db_socket),
        }

    def conf_lines(self) -> list[str]:
        """slurm.conf lines of a cluster that keeps its accounting here."""
        return [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={self.port}",
            "AccountingStorageEnforce=associations,limits,qos",
        ]

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def start(self, timeout: float = 60.0) -> None:
        d = self.dir
        (d / "log").mkdir(parents=True, exist_ok=True)
        self.key.write_bytes(secrets.token_bytes(1024))
        self.key.chmod(0o400)
        self._spawn(
            "munged",
            "-F",
            "--force",
            f"--key-file={self.key}",
            f"--socket={self.munge_socket}",
            f"--pid-file={d / 'munged.pid'}",
            f"--log-file={d / 'log' / 'munged.log'}",
            f"--seed-file={d / 'munge.seed'}",
        )
        install = subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                "--user=root",
                f"--datadir={d / 'db'}",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
                "--skip-name-resolve",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if install.returncode != 0:
            raise SlurmError(f"mariadb-install-db failed: {install.stderr.strip()[-2000:]}")
        self._spawn(
            "mariadbd",
            "--no-defaults",
            "--user=root",
            f"--datadir={d / 'db'}",
            f"--socket={self.db_socket}",
            "--skip-networking",
            f"--pid-file={d / 'mariadb.pid'}",
            f"--log-error={d / 'log' / 'mariadb.log'}",
            "--innodb-buffer-pool-size=32M",
        )
        self._wait(
            lambda: self.db_socket.exists() and self.munge_socket.exists(),
            timeout,
            "MariaDB or munged did not create its socket",
        )
        (self.port,) = _free_ports(1)
        conf = d / "slurmdbd.conf"
        conf.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "DbdHost=localhost",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={self.port}",
                    # Bind DbdAddr only, not every address.
                    "CommunicationParameters=NoInAddrAny",
                    "SlurmUser=root",
                    f"LogFile={d / 'log' / 'slurmdbd.log'}",
                    f"PidFile={d / 'slurmdbd.pid'}",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=localhost",
                    "StorageUser=root",
                    "StorageLoc=slurm_acct_db",
                    "DebugLevel=info",
                ]
            )
            + "\n"
        )
        conf.chmod(0o600)  # slurmdbd refuses a slurmdbd.conf others can read
        self._spawn("slurmdbd", "-D")
        self._wait(self._listening, timeout, "slurmdbd did not listen")

    def stop(self) -> None:
        _stop_procs(self.procs)


class LoopbackSlurm(_Daemons):
    """A Slurm cluster of ``leaves`` leaf switches of ``per_leaf`` nodes each (named ``n01``..
    in leaf order), under ``spines`` spine switches (consecutive leaves share one) and, with
    more than one spine, a core switch. Use as a context manager."""

    def __init__(
        self,
        workdir: Path,
        leaves: int,
        per_leaf: int,
        spines: int = 1,
        cpus: int = 8,
        *,
        gpus: int = 0,
        gpu_type: str | None = None,
        node_order: list[str] | None = None,
        extra_conf: tuple[str, ...] = (),
        features: dict[str, str] | None = None,
        accounting: LoopbackAccounting | None = None,
        cluster: str = "gpuplace",
        prefix: str = "n",
        qos: dict[str, str] | None = None,
    ):
        """``gpus`` > 0 gives each node ``Gres=gpu[:gpu_type]:gpus`` backed by empty files;
        ``node_order`` lists the nodes in slurm.conf in another order than the leaves';
        ``extra_conf`` lines are appended to slurm.conf, except that a ``Key=value`` line whose
        key is one of the defaults below replaces that default (``SchedulerType=sched/backfill``);
        ``features`` gives nodes ``Features=`` (node -> comma list). ``accounting``: keep
        accounting in that slurmdbd (``AccountingStorageEnforce=associations,limits,qos``), as
        cluster ``cluster`` with account ``gpuplace`` for root; nodes are named ``prefix``01..
        (distinct prefixes for clusters that share a slurmdbd). ``qos``: QOS to create first
        (name -> ``sacctmgr add qos`` settings such as ``MaxWall=00:10:00``), which root's
        association may use besides ``normal``."""
        self.features = dict(features or {})
        self.dir = workdir
        self.accounting = accounting
        self.cluster = cluster
        self.qos = dict(qos or {})
        self.nodes = [f"{prefix}{i + 1:02d}" for i in range(leaves * per_leaf)]
        self.gpus = gpus
        self.gpu_type = gpu_type
        self.node_order = list(node_order) if node_order is not None else list(self.nodes)
        if sorted(self.node_order) != sorted(self.nodes):
            raise ValueError("node_order must list every node once")
        self.extra_conf = tuple(extra_conf)
        self.leaves = leaves
        self.per_leaf = per_leaf
        self.spines = spines
        self.cpus = cpus
        self.procs: list[subprocess.Popen[bytes]] = []
        path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
        self.env = {**os.environ, "PATH": path, "SLURM_CONF": str(workdir / "slurm.conf")}
        for key in list(self.env):
            # An outer allocation's variables would change what sbatch asks for.
            if key.startswith(("SLURM_", "SBATCH_")) and key != "SLURM_CONF":
                del self.env[key]

    # ----------------------------------------------------------------- set-up
    def _write_config(self) -> None:
        d = self.dir
        for sub in ("state", "spool", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        key = d / "munge.key"
        # Clusters that share a slurmdbd share its munge key (each runs its own munged).
        acct = self.accounting
        key.write_bytes(acct.key.read_bytes() if acct else secrets.token_bytes(1024))
        key.chmod(0o400)
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        host = socket.gethostname().split(".")[0]
        lines = [
            f"ClusterName={self.cluster}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={d / 'munge.sock'}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'spool'}/slurmd-%n.pid",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobContainerType=job_container/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "TopologyPlugin=topology/tree",
            "SchedulerType=sched/builtin",
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            *(
                [
                    *acct.conf_lines(),
                    # The munge socket for slurmdbd connections (else munge's default one).
                    f"AccountingStoragePass={d / 'munge.sock'}",
                ]
                if acct
                else ["AccountingStorageType=accounting_storage/none"]
            ),
            # slurmctld, slurmd and srun bind their addresses (127.0.0.1), not every address.
            "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
            "PropagateResourceLimits=NONE",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "KillWait=1",
            "MinJobAge=2",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        gres = ""
        if self.gpus:
            lines.append("GresTypes=gpu")
            kind = f"gpu:{self.gpu_type}" if self.gpu_type else "gpu"
            gres = f" Gres={kind}:{self.gpus}"
            gres_conf = []
            for name in self.nodes:
                # Empty files stand in for /dev/nvidiaN: slurmd only needs them to exist.
                dev = d / "dev" / name
                dev.mkdir(parents=True, exist_ok=True)
                for i in range(self.gpus):
                    (dev / f"nvidia{i}").touch()
                type_field = f" Type={self.gpu_type}" if self.gpu_type else ""
                gres_conf.append(
                    f"NodeName={name} Name=gpu{type_field} File={dev}/nvidia[0-{self.gpus - 1}]"
                )
            (d / "gres.conf").write_text("\n".join(gres_conf) + "\n")
        for name, port in zip(self.node_order, node_ports, strict=True):
            feature = f" Features={self.features[name]}" if name in self.features else ""
            lines.append(
                f"NodeName={name} NodeAddr=127.0.0.1 Port={port} CPUs={self.cpus} "
                f"RealMemory=1000{gres}{feature} State=UNKNOWN"
            )
        defaults = {line.split("=", 1)[0].lower(): i for i, line in enumerate(lines)}
        for line in self.extra_conf:
            key = line.split("=", 1)[0].lower()
            if key in defaults and key not in ("nodename", "partitionname"):
                lines[defaults[key]] = line
            else:
                lines.append(line)
        lines.append("PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        (d / "slurm.conf").write_text("\n".join(lines) + "\n")
        topo = []
        for leaf in range(self.leaves):
            members = self.nodes[leaf * self.per_leaf : (leaf + 1) * self.per_leaf]
            topo.append(f"SwitchName=leaf{leaf + 1} Nodes={','.join(members)}")
        per_spine = -(-self.leaves // self.spines)
        for spine in range(self.spines):
            first, last = spine * per_spine, min(self.leaves, (spine + 1) * per_spine)
            leaves = ",".join(f"leaf{i + 1}" for i in range(first, last))
            topo.append(f"SwitchName=spine{spine + 1} Switches={leaves}")
        if self.spines > 1:
            spines = ",".join(f"spine{i + 1}" for i in range(self.spines))
            topo.append(f"SwitchName=core Switches={spines}")
        (d / "topology.conf").write_text("\n".join(topo) + "\n")

    def start(self, timeout: float = 30.0) -> None:
        self._write_config()
        d = self.dir
        self._spawn(
            "munged",
            "-F",
            "--force",
            f"--key-file={d / 'munge.key'}",
            f"--socket={d / 'munge.sock'}",
            f"--pid-file={d / 'munged.pid'}",
            f"--log-file={d / 'log' / 'munged.log'}",
            f"--seed-file={d / 'munge.seed'}",
        )
        self._wait(lambda: (d / "munge.sock").exists(), timeout, "munged did not create its socket")
        if self.accounting is not None:
            # The cluster, an account and root's association exist before slurmctld registers.
            # QOS are slurmdbd's (every cluster's); a partition's AllowQos must name one
            # that exists when slurmctld starts.
            for name, settings in self.qos.items():
                self.sacctmgr("add", "qos", name, *settings.split())
            self.sacctmgr("add", "cluster", self.cluster)
            self.sacctmgr("add", "account", "gpuplace", f"Cluster={self.cluster}")
            self.sacctmgr(
                "add",
                "user",
                "root",
                "Account=gpuplace",
                "DefaultAccount=gpuplace",
                f"Cluster={self.cluster}",
                f"QOS={','.join(['normal', *self.qos])}",
                "DefaultQOS=normal",
            )
        self._spawn("slurmctld", "-D", "-i", "-f", str(d / "slurm.conf"))
        self._wait(lambda: self._ok("sinfo", "-h"), timeout, "slurmctld did not answer")
        if self.accounting is not None:
            # -M finds a cluster's slurmctld through the address it registered in slurmdbd.
            self._wait(self._registered, timeout, "slurmctld did not register with slurmdbd")
        for name in self.nodes:
            self._spawn("slurmd", "-D", "-N", name, "-f", str(d / "slurm.conf"))
        self.wait_idle(timeout)

    # ----------------------------------------------------------------- commands
    def sacctmgr(self, *args: str) -> str:
        """``sacctmgr -i`` (no prompt) against the accounting; fails when it fails."""
        out = self.run("sacctmgr", "-i", *args, check=False)
        text = (out.stdout + out.stderr).strip()
        if out.returncode != 0 and "Nothing new added" not in text:
            raise SlurmError(f"sacctmgr {' '.join(args)} failed ({out.returncode}): {text}")
        return out.stdout

    def _registered(self) -> bool:
        out = self.run(
            "sacctmgr",
            "-n",
            "-P",
            "show",
            "cluster",
            self.cluster,
            "format=ControlPort",
            check=False,
        )
        return out.returncode == 0 and out.stdout.strip() not in ("", "0")

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if check and out.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
        return out

    def _ok(self, *argv: str) -> bool:
        try:
            return self.run(*argv, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait_idle(self, timeout: float = 30.0) -> None:
        self._wait(
            lambda: (
                set(self.node_states().values()) == {"idle"}
                and len(self.node_states()) == len(self.nodes)
            ),
            timeout,
            "nodes did not all become idle",
        )

    def occupy(self, nodes: list[str], timeout: float = 20.0) -> str | None:
        """Run one exclusive job holding exactly ``nodes``; returns its id once it runs."""
        if not nodes:
            return None
        out = self.run(
            "sbatch",
            "--parsable",
            "--exclusive",
            "-N",
            str(len(nodes)),
            "-w",
            ",".join(nodes),
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 1000",
        ).stdout
        job = out.strip().split(";")[0]
        self._wait(
            lambda: self.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING",
            timeout,
            f"job {job} did not start",
        )
        return job

    def release(self, job: str | None) -> None:
        if job is not None:
            self.run("scancel", job)
        self.wait_idle()

    def choose(self, count: int) -> tuple[list[str], str]:
        """Slurm's choice for an exclusive job of ``count`` nodes (``sbatch --test-only``):
        the node names, and the raw answer."""
        out = self.run(
            "sbatch", "--test-only", "--exclusive", "-N", str(count), "--wrap", "true", check=False
        )
        text = out.stderr + out.stdout
        match = _TEST_ONLY.search(text)
        if match is None:
            raise SlurmError(f"unexpected sbatch --test-only answer: {text.strip()}")
        names = self.run("scontrol", "show", "hostnames", match.group(2)).stdout.split()
        return names, text.strip()

    def stop_controller(self) -> None:
        """Stop slurmctld only (as when it is down): clients then cannot reach it."""
        ctld = self.procs[1]
        if ctld.poll() is None:
            os.killpg(ctld.pid, signal.SIGKILL)
            ctld.wait(timeout=10)

    # ----------------------------------------------------------------- tear-down
    def stop(self) -> None:
        # Jobs first, so no slurmstepd or sleep outlives the daemons; then slurmds, the
        # controller and munge, each by its own process group.
        if self.procs and all(proc.poll() is None for proc in self.procs[:2]):
            try:
                self.run("scancel", "--partition=gpu", check=False)
                self._wait(lambda: not self.run("squeue", "-h").stdout.strip(), 15, "jobs ended")
            except (SlurmError, subprocess.TimeoutExpired):
                pass
        _stop_procs(self.procs)


class GpuplaceService(_Started):
    """`gpuplace serve --slurm` following a :class:`LoopbackSlurm`, on a Unix socket in the
    cluster's directory (the job_submit/lua plugin finds it through GPUPLACE_SOCKET). Started
    and stopped by its owner; ``restart`` keeps the journal."""

    def __init__(self, slurm: LoopbackSlurm, *args: str):
        self.slurm = slurm
        self.socket = slurm.dir / "gpuplace.sock"
        self.journal = slurm.dir / "gpuplace-journal.db"
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None
        slurm.env["GPUPLACE_SOCKET"] = str(self.socket)

    def start(self, timeout: float = 60.0) -> None:
        import sys

        cmd = [
            sys.executable,
            "-m",
            "gpuplace.cli",
            "serve",
            "--slurm",
            "--journal",
            str(self.journal),
            "--socket",
            str(self.socket),
            "--poll",
            "0.5",
            *self.args,
        ]
        with open(self.slurm.dir / "log" / "gpuplace-serve.log", "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                env=self.slurm.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log_text = (self.slurm.dir / "log" / "gpuplace-serve.log").read_text()
                raise SlurmError(
                    f"gpuplace serve exited with {self.proc.returncode}: {log_text[-2000:]}"
                )
            if self.socket.exists() and self.status().get("clusters"):
                if self.status()["clusters"][0]["slurm"]["last_ok"]:
                    return
            time.sleep(0.2)
        raise SlurmError("gpuplace serve did not start")

    def request(self, method: str, path: str, body: object = None) -> object:
        import json

        conn = _UnixHTTP(str(self.socket))
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            answer = json.loads(response.read() or b"null")
        finally:
            conn.close()
        if response.status >= 400:
            raise SlurmError(f"gpuplace serve answered {response.status}: {answer}")
        return answer

    def status(self) -> dict:
        try:
            return self.request("GET", "/v1/status")  # type: ignore[return-value]
        except (OSError, SlurmError):
            return {}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None


class _UnixHTTP:
    def __new__(cls, path: str):  # an http.client connection over a Unix socket
        import http.client

        class Conn(http.client.HTTPConnection):
            def connect(self) -> None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(30)
                sock.connect(path)
                self.sock = sock

        return Conn("localhost", timeout=30)


#: The gpuplace CLI as the tests run it (the interpreter running the tests, this checkout's
#: package).
CLI = [sys.executable, "-m", "gpuplace.cli"]


def cli(slurm: LoopbackSlurm, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``gpuplace ARGS`` in ``cwd`` with a loopback Slurm's environment (its commands first on
    PATH, its slurm.conf), output captured."""
    return subprocess.run(
        [*CLI, *args], env=slurm.env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def rank_lines(path: Path, count: int, timeout: float = 30) -> list[list[str]]:
    """The ``rank R HOST ...`` lines a job's ranks print into ``path``, split into fields,
    once ``count`` of them are there (AssertionError with the output after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            got = [ln.split() for ln in path.read_text().splitlines() if ln.startswith("rank ")]
            if len(got) >= count:
                return got
        time.sleep(0.2)
    raise AssertionError(
        f"{path}: job output incomplete: {path.read_text() if path.exists() else ''}"
    )


def wait_ranks(path: Path, count: int, timeout: float = 30) -> dict[int, str]:
    """Each rank's host, from :func:`rank_lines`."""
    return {int(r[1]): r[2] for r in rank_lines(path, count, timeout)}
