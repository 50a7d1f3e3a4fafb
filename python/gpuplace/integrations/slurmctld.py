"""A live slurmctld as an admin runs it: commands that answer in seconds, partitions,
reservations, features, QOS and time limits, and which nodes a job may use.

:class:`Slurmctld` runs Slurm's own clients (``sinfo``/``squeue --json``, ``scontrol show ...
-o``, ``scontrol update``) against one cluster (its ``slurm.conf`` or ``-M`` name) with a short
timeout, so a controller that is down is reported in seconds ("slurmctld did not answer
``sinfo`` within 5 s") instead of after Slurm's own retries, and the ``errors`` array of a
``--json`` answer is shown rather than ignored.

:func:`eligible` is what gpuplace honours when placing a Slurm job: the partition (its nodes,
state, ``MaxTime``, ``AllowQos``/``DenyQos``), ``-C`` feature constraints, reservations (a job
in a reservation gets its nodes only, whatever its time limit: Slurm ends it at the
reservation's end plus ``ResvOverRun``; any other job avoids the nodes of every reservation that
is active, or starts before the job's time limit would end) and the time limit itself
(``-t``, else the partition's ``DefaultTime``, else its ``MaxTime``). Every node left out
carries the reason, so an error can name the node and say why.

A QOS is checked against what slurmctld holds of slurmdbd's (``scontrol show assoc_mgr
flags=qos``): a QOS that does not exist, a time limit over its ``MaxWall`` (which is also the
time limit of a job that gives none), more nodes or GPUs than its ``MaxTRESPerJob``
(``node=``, ``gres/gpu=``) or more GPUs per node than its ``MaxTRESPerNode`` are refused
naming the QOS and the limit. ``sbatch --test-only`` does not check QOS limits (Slurm 22.05
answers "to start at <now>"), and the real submission would pend for ever with
``Reason=QOSMaxWallDurationPerJobLimit``. Limits of associations (per user or account) and
group limits (``GrpTRES``) are not read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import selectors
import shlex
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from gpuplace._util.documents import MAX_DOCUMENT_BYTES
from gpuplace._util.hostlist import HostlistError, compress, expand
from gpuplace.cluster.state import ClusterState
from gpuplace.errors import Infeasible, InvalidJob, InvalidState
from gpuplace.integrations.slurm import SlurmError, SlurmNode, read_sinfo, read_squeue
from gpuplace.model.job import Job
from gpuplace.placement.place import place
from gpuplace.placement.result import Placement

__all__ = [
    "Eligibility",
    "Partition",
    "Qos",
    "Reservation",
    "SlurmPlacement",
    "SlurmRequest",
    "SlurmUnavailable",
    "SlurmView",
    "Slurmctld",
    "eligible",
    "hosts_mask",
    "parse_constraint",
    "parse_time_limit",
    "place_slurm_job",
    "placement_counts",
    "read_qos",
    "read_records",
    "request_from_sbatch_args",
]

#: Seconds a Slurm client may take before gpuplace says slurmctld does not answer.
DEFAULT_TIMEOUT = 5.0
_DOWN_WORDS = (
    "Unable to contact slurm controller",
    "Connection refused",
    "Zero Bytes were transmitted or received",
    "Socket timed out",
    "Communication connection failure",
)


class SlurmUnavailable(SlurmError):
    """slurmctld did not answer (down, unreachable or too slow)."""


# ----------------------------------------------------------------------------- commands


class _OutputTooLarge(Exception):
    """A Slurm client wrote more than the bound on one of its streams."""


def _bounded_run(
    argv: Sequence[str], env: dict[str, str], timeout: float, limit: int
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=timeout)`` that reads at
    most ``limit`` bytes of each stream (the client is killed past it: a runaway output would
    otherwise be held whole in memory) and decodes bytes that are not UTF-8 as U+FFFD (a raw
    ``UnicodeDecodeError`` is no error a user can act on; the readers then name the line)."""
    deadline = time.monotonic() + timeout
    with subprocess.Popen(
        list(argv),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
        try:
            with selectors.DefaultSelector() as selector:
                for stream in (proc.stdout, proc.stderr):
                    selector.register(stream, selectors.EVENT_READ)
                while selector.get_map():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise subprocess.TimeoutExpired(list(argv), timeout)
                    for key, _ in selector.select(left):
                        chunk = os.read(key.fd, 1 << 16)
                        if not chunk:
                            selector.unregister(key.fileobj)
                            continue
                        buffer = buffers[key.fd]
                        buffer += chunk
                        if len(buffer) > limit:
                            raise _OutputTooLarge
            returncode = proc.wait(timeout=max(deadline - time.monotonic(), 0.001))
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        # Decoded from the buffers themselves, each dropped once decoded: a large output is
        # held at most twice (its bytes and its text), not three times.
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        stdout = buffers.pop(out_fd).decode("utf-8", errors="replace")
        stderr = buffers.pop(err_fd).decode("utf-8", errors="replace")
    return subprocess.CompletedProcess(list(argv), returncode, stdout, stderr)


@dataclass
class Slurmctld:
    """One Slurm cluster, reached through its clients. ``conf``: its slurm.conf (several
    clusters on one host, each with its own); ``cluster``: a name for ``-M`` (clusters that
    slurmdbd knows); ``timeout``: seconds per command."""

    conf: str | None = None
    cluster: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    #: Environment of the clients (default: this process's).
    env: dict[str, str] | None = None

    @property
    def label(self) -> str:
        return self.cluster or (f"the cluster of {self.conf}" if self.conf else "slurmctld")

    def _env(self) -> dict[str, str]:
        env = dict(self.env if self.env is not None else os.environ)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        return env

    def _argv(self, argv: Sequence[str]) -> list[str]:
        if self.cluster:
            return [argv[0], f"--clusters={self.cluster}", *argv[1:]]
        return list(argv)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client against this cluster; raises :class:`SlurmUnavailable` when it
        does not answer within the timeout or cannot reach slurmctld, :class:`SlurmError` when
        it fails otherwise (with ``check``)."""
        full = self._argv(argv)
        try:
            out = _bounded_run(full, self._env(), self.timeout, MAX_DOCUMENT_BYTES)
        except _OutputTooLarge:
            raise SlurmError(
                f"{self.label}: `{shlex.join(argv)}` wrote more than {MAX_DOCUMENT_BYTES} bytes; "
                "at most that much of a Slurm client's output is read"
            ) from None
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]} not found: is Slurm's client installed?") from None
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(
                f"{self.label}: slurmctld did not answer `{' '.join(argv[:3])}` within "
                f"{self.timeout:g} s (is slurmctld running and reachable?)"
            ) from None
        if out.returncode != 0:
            text = (out.stderr.strip() or out.stdout.strip()).splitlines()
            message = text[-1] if text else f"exit status {out.returncode}"
            if any(word in " ".join(text) for word in _DOWN_WORDS):
                raise SlurmUnavailable(
                    f"{self.label}: slurmctld does not answer ({message}); is it running?"
                )
            if check:
                raise SlurmError(f"{self.label}: `{shlex.join(argv)}` failed: {message}")
        return out

    def json(self, command: str, *args: str) -> Any:
        """``command args --json``, parsed; its ``errors`` array raised as a SlurmError."""
        out = self.run(command, *args, "--json")
        try:
            doc = json.loads(out.stdout)
        except json.JSONDecodeError as exc:
            raise SlurmError(f"{self.label}: {command} --json: not JSON ({exc.msg})") from None
        errors = doc.get("errors") if isinstance(doc, dict) else None
        if errors:
            described = "; ".join(
                str(e.get("description") or e.get("error") or e) if isinstance(e, dict) else str(e)
                for e in (errors if isinstance(errors, list) else [errors])
            )
            raise SlurmError(f"{self.label}: {command} --json reported errors: {described}")
        return doc

    def nodes(self) -> list[SlurmNode]:
        return read_sinfo(self.json("sinfo"))

    def show(self, kind: str) -> list[dict[str, str]]:
        """``scontrol show <kind> -o`` (partition, reservation, ...) as records."""
        out = self.run("scontrol", "show", kind, "-o", check=False)
        if out.returncode != 0:
            text = (out.stderr + out.stdout).strip()
            if "No reservations in the system" in text or "No partitions in the system" in text:
                return []
            raise SlurmError(f"{self.label}: scontrol show {kind} failed: {text}")
        if "No reservations in the system" in out.stdout:
            return []
        return read_records(out.stdout)

    def partitions(self) -> list[Partition]:
        return [Partition.from_record(r) for r in self.show("partition")]

    def reservations(self) -> list[Reservation]:
        return [Reservation.from_record(r) for r in self.show("reservation")]

    def qos(self) -> list[Qos]:
        """The QOS slurmctld knows from slurmdbd (``scontrol show assoc_mgr flags=qos``);
        none on a cluster without accounting, or where slurmctld does not show them to this
        user (then Slurm alone checks the QOS)."""
        out = self.run("scontrol", "show", "assoc_mgr", "flags=qos", check=False)
        if out.returncode != 0:
            text = (out.stderr + out.stdout).strip()
            if "denied" in text.lower() or "permission" in text.lower():
                return []
            raise SlurmError(f"{self.label}: scontrol show assoc_mgr flags=qos failed: {text}")
        return read_qos(out.stdout)

    def topology(self) -> str:
        """``scontrol show topology``, refusing an answer without switches."""
        out = self.run("scontrol", "show", "topology", check=False)
        if out.returncode != 0:
            raise SlurmError(
                f"{self.label}: scontrol show topology failed: {(out.stderr or out.stdout).strip()}"
            )
        if "SwitchName=" not in out.stdout:
            raise SlurmError(
                f"{self.label}: scontrol show topology gave no switches (is "
                "TopologyPlugin=topology/tree set?); give the topology.conf with --topology"
            )
        return out.stdout

    def drain(self, hosts: Iterable[str], reason: str) -> None:
        """Drain nodes with a reason (``scontrol update NodeName=... State=DRAIN``)."""
        names = sorted(set(hosts))
        if not names:
            return
        text = " ".join(reason.split())[:200] or "gpuplace"
        self.run(
            "scontrol", "update", f"NodeName={compress(names)}", "State=DRAIN", f"Reason={text}"
        )

    def why_not_now(self, hosts: Sequence[str]) -> str:
        """A sentence naming, for each of ``hosts`` that a job could not use now, the reason:
        a job holding it (id, user, end), its drain/down reason, a reservation."""
        wanted = set(hosts)
        parts: list[str] = []
        try:
            for node in read_sinfo(self.json("sinfo", "--nodes", compress(sorted(wanted)))):
                if node.name in wanted and node.out_of_service:
                    parts.append(f"{node.name} is {node.state} ({node.out_of_service})")
            for job in read_squeue(self.json("squeue", "--nodelist", compress(sorted(wanted)))):
                for host in sorted(wanted & set(job.nodes)):
                    parts.append(f"{host} is held by job {job.job_id} ({job.name or 'no name'})")
            now = datetime.now()
            for res in self.reservations():
                for host in sorted(wanted & set(res.nodes)):
                    if res.end > now:
                        parts.append(
                            f"{host} is in reservation {res.name} ({res.start:%Y-%m-%dT%H:%M} "
                            f"to {res.end:%Y-%m-%dT%H:%M})"
                        )
        except SlurmUnavailable as exc:
            return str(exc)
        return "; ".join(parts)


#: A key of a ``Key=value`` word: ``\w+=`` tried only where a word starts (linear).
_RECORD_KEY = re.compile(r"(?<!\w)(\w+)=")


#: The most of ``scontrol show <kind> -o`` output read: half the other documents' bound. Its
#: records become a dict of short strings per line, several times the text's size in memory
#: (60 MB of output took 230 MB, past the readers' 256 MB budget under the fuzzer); a node's
#: line is about 700 bytes, so this still covers some 45,000 nodes, several times the largest
#: Slurm clusters.
MAX_SCONTROL_BYTES = MAX_DOCUMENT_BYTES // 2


def read_records(text: str) -> list[dict[str, str]]:
    """One record per line of ``scontrol show <kind> -o``: ``Key=value`` words (a value may
    hold spaces up to the next ``Key=``). Output over :data:`MAX_SCONTROL_BYTES` is refused."""
    if len(text) > MAX_SCONTROL_BYTES:
        raise InvalidState(
            f"scontrol show: output of {len(text)} characters; at most {MAX_SCONTROL_BYTES} "
            "are read"
        )
    records = []
    # Lines are found by index and searched in place (``finditer`` with bounds): a copy of the
    # text as lines, and of each line stripped, took 60 MB of output past the readers' 256 MB
    # budget under the fuzzer; only the values read are copied.
    start, size = 0, len(text)
    while start < size:
        stop = text.find("\n", start)
        stop = size if stop < 0 else stop
        record: dict[str, str] = {}
        # Each key starts a word and ends at '='; the first one anywhere, the next ones after
        # blanks (a value runs up to the blanks before the next key). In one linear pass: the
        # lazy value and its look-ahead ``(\w+)=(.*?)(?=\s+\w+=|$)`` backtracked
        # quadratically on a long run of blanks (20 kB: seconds).
        keys = [
            m
            for i, m in enumerate(_RECORD_KEY.finditer(text, start, stop))
            if i == 0 or text[m.start() - 1].isspace()
        ]
        for k, m in enumerate(keys):
            end = keys[k + 1].start() if k + 1 < len(keys) else stop
            record[m.group(1)] = text[m.end() : end].strip()
        if record:
            records.append(record)
        start = stop + 1
    return records


# ---------------------------------------------------------------------------- time limits
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_time_limit(text: str | int | None, what: str = "time limit") -> int | None:
    """Minutes of a Slurm time (``60``, ``1:30:00``, ``2-00``, ``2-12:00:00``,
    ``UNLIMITED``); None for unlimited or not given."""
    if text is None:
        return None
    if isinstance(text, int) and not isinstance(text, bool):
        return text if text >= 0 else None
    word = str(text).strip()
    if word.upper() in ("", "UNLIMITED", "INFINITE", "NONE", "N/A"):
        return None
    m = _TIME.match(word)
    if m is None:
        raise InvalidJob(
            f"{what}: cannot read Slurm time {word!r} (expected minutes, MM:SS, HH:MM:SS, "
            "D-HH, D-HH:MM or D-HH:MM:SS)"
        )
    days, first, second, third = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        minutes = int(days) * 1440 + int(first) * 60 + int(second or 0)
        return minutes + (1 if third and int(third) > 0 else 0)
    if third is not None:  # HH:MM:SS
        return int(first) * 60 + int(second) + (1 if int(third) > 0 else 0)
    if second is not None:  # MM:SS
        return int(first) + (1 if int(second) > 0 else 0)
    return int(first)


def _when(text: str | None) -> datetime | None:
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _names(text: str | None) -> list[str]:
    if not text or text in ("(null)", "ALL", "N/A"):
        return []
    return [w for w in text.split(",") if w]


def _hosts(text: str | None, where: str) -> list[str]:
    if not text or text in ("(null)",):
        return []
    try:
        return expand(text)
    except HostlistError as exc:
        raise SlurmError(f"{where}: cannot read node list {text!r}: {exc}") from None


# ---------------------------------------------------------------------- partitions, reservations
@dataclass
class Partition:
    name: str
    state: str = "UP"
    default: bool = False
    #: minutes; None for UNLIMITED
    max_time: int | None = None
    default_time: int | None = None
    #: None: all QOS allowed
    allow_qos: list[str] | None = None
    deny_qos: list[str] = field(default_factory=list)
    allow_accounts: list[str] | None = None
    max_nodes: int | None = None

    @classmethod
    def from_record(cls, r: dict[str, str]) -> Partition:
        name = r.get("PartitionName", "")
        where = f"partition {name}"
        allow = r.get("AllowQos", "ALL")
        accounts = r.get("AllowAccounts", "ALL")
        max_nodes = r.get("MaxNodes", "UNLIMITED")
        return cls(
            name=name,
            state=r.get("State", "UP").upper(),
            default=r.get("Default", "NO").upper() == "YES",
            max_time=parse_time_limit(r.get("MaxTime"), f"{where} MaxTime"),
            default_time=parse_time_limit(r.get("DefaultTime"), f"{where} DefaultTime"),
            allow_qos=None if allow in ("ALL", "") else _names(allow),
            deny_qos=_names(r.get("DenyQos")),
            allow_accounts=None if accounts in ("ALL", "") else _names(accounts),
            max_nodes=int(max_nodes) if max_nodes.isdigit() else None,
        )


@dataclass
class Reservation:
    name: str
    nodes: list[str]
    start: datetime
    end: datetime
    users: list[str] = field(default_factory=list)
    accounts: list[str] = field(default_factory=list)
    partition: str | None = None
    flags: list[str] = field(default_factory=list)

    @classmethod
    def from_record(cls, r: dict[str, str]) -> Reservation:
        name = r.get("ReservationName", "")
        start = _when(r.get("StartTime")) or datetime.now()
        end = _when(r.get("EndTime")) or datetime.max
        partition = r.get("PartitionName")
        return cls(
            name=name,
            nodes=_hosts(r.get("Nodes"), f"reservation {name}"),
            start=start,
            end=end,
            users=_names(r.get("Users")),
            accounts=_names(r.get("Accounts")),
            partition=None if partition in (None, "", "(null)") else partition,
            flags=_names(r.get("Flags")),
        )

    def admits(self, user: str | None, account: str | None) -> bool | None:
        """Whether the user/account may use it (None: not known, no user given)."""
        if user is None and account is None:
            return None
        for names, who in ((self.users, user), (self.accounts, account)):
            if not names or who is None:
                continue
            denied = [n[1:] for n in names if n.startswith("-")]
            if denied:
                if who not in denied:
                    return True
            elif who in names:
                return True
        return not self.users and not self.accounts


@dataclass
class Qos:
    """A QOS's limits that decide whether a job can start at all (None: no limit)."""

    name: str
    #: MaxWall, minutes
    max_wall: int | None = None
    #: MaxTRESPerJob node=
    max_nodes: int | None = None
    #: MaxTRESPerJob gres/gpu=
    max_gpus: int | None = None
    #: MaxTRESPerNode gres/gpu=
    max_gpus_per_node: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, doc: Any) -> Qos:
        def number(key: str) -> int | None:
            value = doc.get(key)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"qos {key}: expected a whole number >= 0 or null, got {value!r}")
            return value

        return cls(
            str(doc["name"]),
            number("max_wall"),
            number("max_nodes"),
            number("max_gpus"),
            number("max_gpus_per_node"),
        )


_QOS_HEAD = re.compile(r"^QOS=(\S+?)\(\d+\)\s*$")
_QOS_LIMIT = re.compile(r"^\s+(MaxWallPJ|MaxTRESPJ|MaxTRESPN)=(\S*)\s*$")


def _tres_count(tres: str, name: str, where: str) -> int | None:
    """The limit on ``name`` (``node``, ``gres/gpu``) in a TRES list such as
    ``node=2,gres/gpu=8`` (None: no limit on it)."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == name:
            if not value.isdigit():
                raise SlurmError(f"{where}: cannot read TRES limit {item!r}")
            return int(value)
    return None


def read_qos(text: str) -> list[Qos]:
    """The QOS of ``scontrol show assoc_mgr flags=qos`` (``QOS=name(id)`` then indented
    ``MaxWallPJ=minutes``, ``MaxTRESPJ=node=2,gres/gpu=8``, ``MaxTRESPN=...`` lines)."""
    if len(text) > MAX_SCONTROL_BYTES:
        raise InvalidState(
            f"scontrol show assoc_mgr: output of {len(text)} characters; at most "
            f"{MAX_SCONTROL_BYTES} are read"
        )
    found: list[Qos] = []
    for line in text.splitlines():
        head = _QOS_HEAD.match(line)
        if head is not None:
            found.append(Qos(head.group(1)))
            continue
        limit = _QOS_LIMIT.match(line)
        if limit is None or not found:
            continue
        qos, key, value = found[-1], limit.group(1), limit.group(2)
        where = f"QOS {qos.name} {key}"
        if key == "MaxWallPJ":
            qos.max_wall = int(value) if value.isdigit() else None
        elif key == "MaxTRESPJ":
            qos.max_nodes = _tres_count(value, "node", where)
            qos.max_gpus = _tres_count(value, "gres/gpu", where)
        else:
            qos.max_gpus_per_node = _tres_count(value, "gres/gpu", where)
    return found


# ------------------------------------------------------------------------------- features
def parse_constraint(expression: str | None) -> Callable[[set[str]], bool]:
    """A ``-C`` expression as a test of a node's features: names joined by ``&`` (and), ``|``
    (or) and parentheses. Counts (``a*2``) and matching-OR brackets (``[a|b]``) are refused:
    they constrain the job's nodes together, not each node."""
    if not expression:
        return lambda features: True
    text = expression.strip()
    if "[" in text or "]" in text or "*" in text:
        raise InvalidJob(
            f"constraint {expression!r}: counts (*) and matching-OR brackets ([...]) are not "
            "supported by gpuplace; use names joined by & and |"
        )
    tokens = re.findall(r"[()&|]|[^()&|\s]+", text.replace(",", "&"))
    position = 0

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def take() -> str:
        nonlocal position
        if position >= len(tokens):
            raise InvalidJob(f"constraint {expression!r}: ends too early")
        position += 1
        return tokens[position - 1]

    def atom() -> Callable[[set[str]], bool]:
        token = take()
        if token == "(":
            inner = either()
            if take() != ")":
                raise InvalidJob(f"constraint {expression!r}: expected )")
            return inner
        if token in (")", "&", "|"):
            raise InvalidJob(f"constraint {expression!r}: unexpected {token!r}")

        def has(features: set[str], name: str = token) -> bool:
            return name in features

        return has

    def both() -> Callable[[set[str]], bool]:
        terms = [atom()]
        while peek() == "&":
            take()
            terms.append(atom())
        return lambda features: all(t(features) for t in terms)

    def either() -> Callable[[set[str]], bool]:
        terms = [both()]
        while peek() == "|":
            take()
            terms.append(both())
        return lambda features: any(t(features) for t in terms)

    test = either()
    if position != len(tokens):
        raise InvalidJob(f"constraint {expression!r}: unexpected {tokens[position]!r}")
    return test


# ----------------------------------------------------------------------------- requests
@dataclass
class SlurmRequest:
    """What a Slurm job asks for beyond its GPUs: partitions (tried in order, as Slurm does),
    a feature constraint, a reservation, a QOS, a time limit in minutes (None: the
    partition's default), the user and account."""

    partitions: list[str] = field(default_factory=list)
    constraint: str | None = None
    reservation: str | None = None
    qos: str | None = None
    time_limit: int | None = None
    user: str | None = None
    account: str | None = None

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> SlurmRequest:
        def text(key: str) -> str | None:
            value = doc.get(key)
            if value is None or value == "":
                return None
            if not isinstance(value, str | int) or isinstance(value, bool):
                raise InvalidJob(f"{key}: expected a string, got {type(value).__name__}")
            return str(value)

        partitions = text("partition")
        limit = doc.get("time_limit")
        return cls(
            partitions=_names(partitions),
            constraint=text("constraint"),
            reservation=text("reservation"),
            qos=text("qos"),
            time_limit=parse_time_limit(limit if isinstance(limit, int) else text("time_limit")),
            user=text("user"),
            account=text("account"),
        )


_PASSED = {
    "-p": "partition",
    "--partition": "partition",
    "-C": "constraint",
    "--constraint": "constraint",
    "--reservation": "reservation",
    "-q": "qos",
    "--qos": "qos",
    "-t": "time_limit",
    "--time": "time_limit",
    "-A": "account",
    "--account": "account",
}


def request_from_sbatch_args(args: Sequence[str]) -> dict[str, str]:
    """The placement-relevant options among sbatch arguments (before the script):
    ``-p/--partition``, ``-C/--constraint``, ``--reservation``, ``-q/--qos``, ``-t/--time``,
    ``-A/--account``, in either ``-t 60`` or ``--time=60`` form."""
    found: dict[str, str] = {}
    options = list(args[:-1])
    i = 0
    while i < len(options):
        word = options[i]
        flag, sep, value = word.partition("=")
        if flag in _PASSED and flag.startswith("--") and sep:
            found[_PASSED[flag]] = value
        elif word in _PASSED and i + 1 < len(options):
            found[_PASSED[word]] = options[i + 1]
            i += 1
        elif len(word) > 2 and word[:2] in _PASSED and not word.startswith("--"):
            found[_PASSED[word[:2]]] = word[2:]  # -pgpu, -t60
        i += 1
    return found


@dataclass
class Eligibility:
    """The nodes a request may use, in Slurm's node order, and why each other node may not."""

    partition: str | None
    hosts: list[str]
    excluded: dict[str, str]
    #: The time limit that applies (minutes; None: unlimited).
    time_limit: int | None

    def describe(self, limit: int = 6) -> str:
        """The excluded nodes grouped by reason, for an error message."""
        by_reason: dict[str, list[str]] = {}
        for host, reason in self.excluded.items():
            by_reason.setdefault(reason, []).append(host)
        parts = [
            f"{compress(hosts)}: {reason}"
            for reason, hosts in sorted(by_reason.items(), key=lambda kv: -len(kv[1]))
        ]
        more = len(parts) - limit
        return "; ".join(parts[:limit]) + (f"; and {more} more reasons" if more > 0 else "")


def eligible(
    nodes: Sequence[SlurmNode],
    partitions: Sequence[Partition],
    reservations: Sequence[Reservation],
    request: SlurmRequest,
    *,
    partition: str | None = None,
    now: datetime | None = None,
    qos: Sequence[Qos] = (),
) -> Eligibility:
    """The nodes ``request`` may use in ``partition`` (default: the request's first, else the
    cluster's default partition). Raises :class:`SlurmError` naming the partition or
    reservation when the request cannot run there at all (partition down, QOS denied, time
    limit over MaxTime, reservation unknown or ending too soon). ``qos``: the QOS slurmdbd
    knows (empty: not known, no accounting); with them, a QOS that does not exist and a time
    limit over the QOS's MaxWall are refused too."""
    now = now or datetime.now()
    by_name = {p.name: p for p in partitions}
    chosen = partition or (request.partitions[0] if request.partitions else None)
    if chosen is None:
        defaults = [p.name for p in partitions if p.default]
        chosen = defaults[0] if defaults else None
    part = by_name.get(chosen) if chosen is not None else None
    if chosen is not None and part is None and partitions:
        raise SlurmError(
            f"partition {chosen!r} does not exist (partitions: {', '.join(by_name) or 'none'})"
        )
    limit = request.time_limit
    if part is not None:
        if part.state != "UP":
            raise SlurmError(f"partition {part.name} is {part.state}, not UP")
        if request.qos is not None:
            if part.allow_qos is not None and request.qos not in part.allow_qos:
                raise SlurmError(
                    f"partition {part.name} does not allow QOS {request.qos} (AllowQos="
                    f"{','.join(part.allow_qos)})"
                )
            if request.qos in part.deny_qos:
                raise SlurmError(f"partition {part.name} denies QOS {request.qos}")
        if (
            request.account is not None
            and part.allow_accounts is not None
            and request.account not in part.allow_accounts
        ):
            raise SlurmError(f"partition {part.name} does not allow account {request.account}")
        if limit is not None and part.max_time is not None and limit > part.max_time:
            raise SlurmError(
                f"time limit {limit} min is over partition {part.name}'s MaxTime "
                f"{part.max_time} min"
            )
        if limit is None:
            limit = part.default_time if part.default_time is not None else part.max_time
    known = _known_qos(request, qos)
    if known is not None and known.max_wall is not None:
        if request.time_limit is not None and request.time_limit > known.max_wall:
            raise SlurmError(
                f"time limit {request.time_limit} min is over QOS {known.name}'s MaxWall "
                f"{known.max_wall} min (Slurm would queue the job and never start it)"
            )
        if request.time_limit is None and (limit is None or limit > known.max_wall):
            limit = known.max_wall  # Slurm gives a job without -t the QOS's MaxWall
    end = now + timedelta(minutes=limit) if limit is not None else datetime.max
    excluded: dict[str, str] = {}
    test = parse_constraint(request.constraint)
    inside: set[str] | None = None
    if request.reservation is not None:
        named = [r for r in reservations if r.name == request.reservation]
        if not named:
            raise SlurmError(f"reservation {request.reservation} does not exist")
        res = named[0]
        if res.end <= now:
            raise SlurmError(f"reservation {res.name} has ended ({res.end:%Y-%m-%dT%H:%M})")
        if res.start > now + timedelta(seconds=60):
            raise SlurmError(
                f"reservation {res.name} starts at {res.start:%Y-%m-%dT%H:%M}, not now"
            )
        # A time limit past the reservation's end does not keep a job out: Slurm starts it and
        # ends it at the reservation's end plus ResvOverRun (slurm.conf(5)), as a real slurmctld
        # does in tests/test_slurm_serve.py.
        if res.admits(request.user, request.account) is False:
            raise SlurmError(
                f"reservation {res.name} does not admit user {request.user} / account "
                f"{request.account}"
            )
        inside = set(res.nodes)
    for node in nodes:
        why: str | None = None
        if node.out_of_service:
            why = f"{node.state} ({node.out_of_service})"
        elif part is not None and node.partitions and part.name not in node.partitions:
            why = f"not in partition {part.name}"
        elif not test(set(node.features)):
            why = (
                f"features {','.join(node.features) or 'none'} do not match -C {request.constraint}"
            )
        elif inside is not None and node.name not in inside:
            why = f"not in reservation {request.reservation}"
        elif inside is None:
            for res in reservations:
                if node.name in res.nodes and res.start < end and res.end > now:
                    state = "active" if res.start <= now else f"from {res.start:%Y-%m-%dT%H:%M}"
                    why = (
                        f"in reservation {res.name} ({state}"
                        + (
                            ""
                            if res.start <= now
                            else f", before the job's {'unlimited ' if limit is None else f'{limit} min '}time limit ends"
                        )
                        + ")"
                    )
                    break
        if why is not None:
            excluded[node.name] = why
    hosts = [n.name for n in nodes if n.name not in excluded]
    return Eligibility(part.name if part else chosen, hosts, excluded, limit)


def _known_qos(request: SlurmRequest, qos: Sequence[Qos]) -> Qos | None:
    """The request's QOS among those slurmdbd knows; a SlurmError if it is not one of them."""
    if request.qos is None or not qos:
        return None
    for q in qos:
        if q.name == request.qos:
            return q
    raise SlurmError(
        f"QOS {request.qos} does not exist in slurmdbd (QOS: {', '.join(q.name for q in qos)})"
    )


def _check_qos_size(placement: Placement, request: SlurmRequest, qos: Sequence[Qos]) -> None:
    """Refuse a placement over its QOS's MaxTRESPerJob node= / gres/gpu= or MaxTRESPerNode
    gres/gpu=: Slurm would queue such a job and never start it."""
    known = _known_qos(request, qos)
    if known is None:
        return
    counts = placement_counts(placement)
    checks = (
        (known.max_nodes, len(counts), "nodes", "MaxTRESPerJob node"),
        (known.max_gpus, len(placement.gpus), "GPUs", "MaxTRESPerJob gres/gpu"),
        (
            known.max_gpus_per_node,
            max(counts.values()),
            "GPUs on a node",
            "MaxTRESPerNode gres/gpu",
        ),
    )
    over = [
        f"{used} {what}, over QOS {known.name}'s {name}={cap}"
        for cap, used, what, name in checks
        if cap is not None and used > cap
    ]
    if over:
        raise SlurmError(
            f"{placement.job.name}: needs {'; and '.join(over)} (Slurm would queue the job "
            "and never start it)"
        )


# ------------------------------------------------------------------------------- placing
@dataclass
class SlurmView:
    """What slurmctld says about placing: its nodes (partitions, features, states), partitions
    and reservations, read at one time. ``gres``: whether the cluster counts GPUs as GRES."""

    nodes: list[SlurmNode]
    partitions: list[Partition]
    reservations: list[Reservation]
    gres: bool = True
    read_at: datetime = field(default_factory=datetime.now)
    #: The QOS slurmdbd knows (empty: no accounting, or not read).
    qos: list[Qos] = field(default_factory=list)

    @classmethod
    def read(cls, slurm: Slurmctld) -> SlurmView:
        nodes = slurm.nodes()
        return cls(
            nodes,
            slurm.partitions(),
            slurm.reservations(),
            gres=any(n.gpus > 0 for n in nodes),
            qos=slurm.qos(),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "gres": self.gres,
            "read_at": self.read_at.isoformat(),
            "nodes": [
                {
                    "name": n.name,
                    "state": n.state,
                    "flags": n.flags,
                    "partitions": n.partitions,
                    "features": n.features,
                }
                for n in self.nodes
            ],
            "partitions": [
                {
                    "PartitionName": p.name,
                    "State": p.state,
                    "Default": "YES" if p.default else "NO",
                    "MaxTime": _minutes_text(p.max_time),
                    "DefaultTime": _minutes_text(p.default_time),
                    "AllowQos": ",".join(p.allow_qos) if p.allow_qos is not None else "ALL",
                    "DenyQos": ",".join(p.deny_qos),
                    "AllowAccounts": (
                        ",".join(p.allow_accounts) if p.allow_accounts is not None else "ALL"
                    ),
                    "MaxNodes": str(p.max_nodes) if p.max_nodes is not None else "UNLIMITED",
                }
                for p in self.partitions
            ],
            "reservations": [
                {
                    "ReservationName": r.name,
                    "Nodes": compress(r.nodes) if r.nodes else "",
                    "StartTime": r.start.isoformat(timespec="seconds"),
                    "EndTime": r.end.isoformat(timespec="seconds") if r.end != datetime.max else "",
                    "Users": ",".join(r.users),
                    "Accounts": ",".join(r.accounts),
                    "PartitionName": r.partition or "",
                    "Flags": ",".join(r.flags),
                }
                for r in self.reservations
            ],
            "qos": [q.to_dict() for q in self.qos],
        }

    @classmethod
    def from_dict(cls, doc: Any, source: str = "slurm view") -> SlurmView:
        if not isinstance(doc, dict):
            raise SlurmError(f"{source}: expected an object")
        try:
            nodes = [
                SlurmNode(
                    str(n["name"]),
                    str(n["state"]),
                    [str(f) for f in n.get("flags", [])],
                    partitions=[str(p) for p in n.get("partitions", [])],
                    features=[str(f) for f in n.get("features", [])],
                )
                for n in doc.get("nodes", [])
            ]
            return cls(
                nodes,
                [Partition.from_record(dict(r)) for r in doc.get("partitions", [])],
                [Reservation.from_record(dict(r)) for r in doc.get("reservations", [])],
                gres=bool(doc.get("gres", True)),
                read_at=datetime.fromisoformat(str(doc.get("read_at"))),
                qos=[Qos.from_dict(q) for q in doc.get("qos", [])],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SlurmError(f"{source}: not a slurm view written by gpuplace ({exc})") from None


def _minutes_text(minutes: int | None) -> str:
    if minutes is None:
        return "UNLIMITED"
    return f"{minutes // 1440}-{minutes % 1440 // 60:02d}:{minutes % 60:02d}:00"


def placement_counts(placement: Placement) -> dict[str, int]:
    """GPUs a placement takes on each node."""
    counts: dict[str, int] = {}
    for gpu in placement.gpus:
        host = placement.topology.host_of(int(gpu))
        counts[host] = counts.get(host, 0) + 1
    return counts


def _exactly(state: ClusterState, allowed: Any, per_node: int) -> Any:
    """``allowed`` keeping, on each node, its first ``per_node`` free usable GPUs (none on a
    node with fewer)."""
    free = state.free_mask() & allowed
    out = np.zeros_like(allowed)
    topo = state.topology
    for host in topo.hosts:
        gpus = topo.host_gpus(host)
        usable = gpus[free[gpus]]
        if len(usable) >= per_node:
            out[usable[:per_node]] = True
    return out


def _at_most(state: ClusterState, allowed: Any, cap: int) -> Any:
    """``allowed`` keeping, on each node, at most its first ``cap`` free usable GPUs."""
    free = state.free_mask() & allowed
    out = np.zeros_like(allowed)
    topo = state.topology
    for host in topo.hosts:
        gpus = topo.host_gpus(host)
        out[gpus[free[gpus]][:cap]] = True
    return out


def hosts_mask(topology: Any, hosts: Iterable[str]) -> Any:
    """GPUs of ``hosts`` as a boolean mask over the topology's GPUs."""
    mask = np.zeros(topology.num_gpus, dtype=bool)
    for host in hosts:
        mask[topology.host_gpus(host)] = True
    return mask


@dataclass
class SlurmPlacement:
    placement: Placement
    eligibility: Eligibility


def place_slurm_job(
    state: ClusterState,
    job: Job,
    request: SlurmRequest,
    view: SlurmView,
    *,
    solver: str = "greedy",
    now: datetime | None = None,
    per_node: int | None = None,
) -> SlurmPlacement:
    """Place ``job`` on the nodes ``request`` may use, trying its partitions in order as Slurm
    does; the state is not changed. Raises :class:`gpuplace.Infeasible` or
    :class:`SlurmError` naming, for every node left out, the reason.

    With QOS known to slurmdbd (``view.qos``), the request's QOS caps the GPUs per node
    (``MaxTRESPerNode``) while placing, and a placement over its ``MaxTRESPerJob`` nodes or
    GPUs is refused naming the QOS.

    ``per_node``: the job must take the same number of GPUs on every node it uses, which is
    all Slurm can grant a job (``--gres=gpu:k`` is per node): only nodes with that many usable
    GPUs are offered, each with exactly that many, and a placement that still differs per node
    is refused."""
    tried = request.partitions or [None]  # type: ignore[list-item]
    errors: list[str] = []
    for partition in tried:
        try:
            room = eligible(
                view.nodes,
                view.partitions,
                view.reservations,
                request,
                partition=partition,
                now=now,
                qos=view.qos,
            )
        except SlurmError as exc:
            errors.append(str(exc))
            continue
        known = [h for h in room.hosts if h in state.topology.hosts]
        allowed = hosts_mask(state.topology, known)
        if per_node is not None:
            allowed = _exactly(state, allowed, per_node)
            known = [h for h in known if allowed[state.topology.host_gpus(h)].any()]
        qos = _known_qos(request, view.qos)
        if qos is not None and qos.max_gpus_per_node is not None:
            # The QOS's MaxTRESPerNode gres/gpu: no more than that many GPUs on any node.
            allowed = _at_most(state, allowed, qos.max_gpus_per_node)
        try:
            placement = place(state.fenced_view(allowed), job, solver)
            if per_node is not None:
                counts = placement_counts(placement)
                if set(counts.values()) != {per_node}:
                    raise Infeasible(
                        f"needs {per_node} GPUs on each node it uses (Slurm grants GPUs per "
                        f"node alike), but the placement found takes {counts}"
                    )
            _check_qos_size(placement, request, view.qos)
        except Infeasible as exc:
            where = f"in partition {room.partition}" if room.partition else "on this cluster"
            left = room.describe()
            errors.append(
                f"{exc} ({where}: {len(known)} nodes usable"
                + (f"; left out: {left}" if left else "")
                + ")"
            )
            continue
        return SlurmPlacement(placement, room)
    message = " | ".join(errors)
    raise Infeasible(f"{job.name}: {message}")
