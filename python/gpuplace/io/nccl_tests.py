"""Reader of nccl-tests performance output (``all_reduce_perf``, ``all_gather_perf``,
``reduce_scatter_perf``, ``alltoall_perf``, ``sendrecv_perf``), any version.

Tolerated as real logs have them: MPI/Slurm line prefixes (``0: ``, ``[1,0]<stdout>:``),
Markdown indentation, NCCL INFO lines between rows, ``...`` elisions, the old format (no
``root`` column, ``error`` instead of ``#wrong``), an empty ``redop`` (alltoall) and ``N/A``
in the error columns. Hosts and GPUs come from the ``# Rank N ... on HOST device D`` lines;
when a file lists none or only some, the rank count is inferred from the bus-bandwidth
factor of the largest row (busbw/algbw = 2(n-1)/n for all-reduce, (n-1)/n for all-gather,
reduce-scatter and all-to-all). Bad input raises :class:`gpuplace.errors.InvalidTopology`
naming the file and line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace.errors import InvalidTopology
from gpuplace.io._common import fail, read_source
from gpuplace.model.job import Communication, Job

if TYPE_CHECKING:
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = ["NcclTestsRow", "NcclTestsRun", "read_nccl_tests"]

#: nccl-tests binary name -> the collective kind of the job model.
COLLECTIVES = {
    "all_reduce": "all-reduce",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "alltoall": "all-to-all",
    "sendrecv": "p2p",
}
_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:(?=\s|#))\s?")
_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)"
)
_HEADER = re.compile(r"nGpus\s+(\d+)")
_MAX_ROWS = 100_000
_TYPE_BYTES = {
    "int8": 1,
    "uint8": 1,
    "char": 1,
    "half": 2,
    "bfloat16": 2,
    "fp16": 2,
    "bf16": 2,
    "float": 4,
    "int32": 4,
    "uint32": 4,
    "int": 4,
    "double": 8,
    "int64": 8,
    "uint64": 8,
}


@dataclass(frozen=True)
class NcclTestsRow:
    """One size of the table: out-of-place and in-place time (µs) and bandwidths (GB/s)."""

    line: int
    size_bytes: int
    count: int
    dtype: str
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    inplace_time_us: float
    inplace_algbw_gbps: float
    inplace_busbw_gbps: float


@dataclass(frozen=True)
class NcclTestsRun:
    """One nccl-tests run: its collective, the ranks it lists and its table."""

    source: str
    collective: str | None
    #: (rank, host, device) of every ``# Rank`` line, in rank order.
    ranks: tuple[tuple[int, str, int], ...]
    rows: tuple[NcclTestsRow, ...]
    #: GPUs per process from the header (``nGpus``), if printed.
    gpus_per_process: int | None = None
    #: The rank count given to the reader, if any.
    declared_ranks: int | None = None
    #: The rank lines were elided (``...``) or listed only in part.
    elided: bool = False

    @property
    def kind(self) -> str | None:
        """The job-model kind (all-reduce, ..., p2p), if the collective is known."""
        return None if self.collective is None else COLLECTIVES[self.collective]

    @property
    def hosts(self) -> list[str]:
        """Hosts in order of their lowest rank (as far as rank lines are printed)."""
        seen: dict[str, None] = {}
        for _, host, _ in self.ranks:
            seen.setdefault(host, None)
        return list(seen)

    def num_ranks(self) -> int | None:
        """Ranks of the run: ``ranks=`` given to the reader; else, for all-gather,
        reduce-scatter and all-to-all, size / (count x element size) of the largest row
        (nccl-tests prints the per-rank count); else the rank lines when they run 0..N-1
        without elision; else the bus-bandwidth factor of the largest row (approximate: the
        printed bandwidths are rounded)."""
        if self.declared_ranks is not None:
            return self.declared_ranks
        big = self.largest()
        width = _TYPE_BYTES.get(big.dtype)
        if self.kind in ("all-gather", "reduce-scatter", "all-to-all") and width and big.count:
            n = big.size_bytes / (big.count * width)
            if n >= 2 and abs(n - round(n)) < 1e-6:
                return round(n)
        listed = [rank for rank, _, _ in self.ranks]
        if listed and not self.elided and listed == list(range(len(listed))) and len(listed) > 1:
            return len(listed)
        if big.algbw_gbps > 0:
            r = big.busbw_gbps / big.algbw_gbps
            if self.kind == "all-reduce" and 1 < r < 2:
                return max(round(2 / (2 - r)), len(listed))
            if self.kind in ("all-gather", "reduce-scatter", "all-to-all") and 0.5 <= r < 1:
                return max(round(1 / (1 - r)), len(listed))
        return len(listed) if len(listed) > 1 else None

    def largest(self) -> NcclTestsRow:
        return max(self.rows, key=lambda r: r.size_bytes)

    def job(self, row: NcclTestsRow, ranks: int) -> Job:
        """One call of the run's collective at ``row``'s size over ``ranks`` ranks, as a job.

        ``sendrecv_perf`` over ``ranks`` ranks has every rank send ``row``'s size to the next
        rank and receive as much from the previous one, all at once; as a job that is a
        pipeline of ``ranks`` stages whose neighbour pairs exchange concurrently (the class
        costs its slowest pair). The closing pair (last rank to rank 0) is not a pipeline pair:
        it moves as much as the others, so it changes nothing where every pair has the same
        path (one NVLink domain), but where it crosses the fabric the job has one crossing
        fewer than the run; the class cost is the slowest pair either way."""

        if self.kind is None:
            raise InvalidTopology(f"{self.source}: the collective is unknown; pass collective=")
        if self.kind == "p2p":
            return Job(
                name=f"{self.collective}-{row.size_bytes}",
                pp=ranks,
                communication={"pp": Communication("p2p", float(row.size_bytes), 1.0)},
                confine={},
            )
        return Job(
            name=f"{self.collective}-{row.size_bytes}",
            dp=ranks,
            communication={"dp": Communication(self.kind, float(row.size_bytes), 1.0)},
            confine={},
        )

    def samples(
        self, topology: Topology, gpus: Any = None, *, min_bytes: int = 0
    ) -> list[tuple[Job, np.ndarray, float]]:
        """(job, GPU of each rank, measured seconds) per row of at least ``min_bytes``, for
        :func:`gpuplace.calibrate`. The GPUs are ``gpus`` if given, else the listed ranks'
        hosts and devices looked up in ``topology`` (hosts missing from it, or ranks not
        listed, take the topology's first hosts in order)."""
        n = self.num_ranks()
        if n is None or n < 2:
            raise InvalidTopology(f"{self.source}: cannot tell how many ranks the run had")
        if gpus is None:
            gpus = self.gpus_on(topology, n)
        gpus = np.asarray(gpus, dtype=np.int64)
        if len(gpus) != n:
            raise InvalidTopology(f"{self.source}: {len(gpus)} GPUs given for {n} ranks")
        return [
            (self.job(row, n), gpus, row.time_us * 1e-6)
            for row in self.rows
            if row.size_bytes >= max(min_bytes, 1)
        ]

    def gpus_on(self, topology: Topology, n: int) -> np.ndarray:
        """GPU ids of the run's ``n`` ranks on ``topology``: the listed hosts and devices when
        every rank is listed under a host name of the topology; otherwise the first hosts in
        order, with as many GPUs per host as the complete rank list shows (or all of them)."""
        listed = {rank: (host, dev) for rank, host, dev in self.ranks}
        index = {h: i for i, h in enumerate(topology.hosts)}
        if len(listed) == n and all(h in index for h, _ in listed.values()):
            first = np.concatenate(
                ([0], np.cumsum([topology.node_types[t].gpus for t in topology.host_types]))
            )
            return np.array(
                [first[index[listed[r][0]]] + listed[r][1] for r in range(n)], dtype=np.int64
            )
        # Hosts in order, as many GPUs per host as the listed ranks show (or all of them).
        per_host = None
        if self.ranks and not self.elided and len(self.ranks) == n:
            counts: dict[str, int] = {}
            for _, host, _ in self.ranks:
                counts[host] = counts.get(host, 0) + 1
            full = [c for h, c in counts.items()]
            per_host = max(full)
        out: list[int] = []
        g = 0
        for t in topology.host_types:
            size = topology.node_types[t].gpus
            take = size if per_host is None else min(size, per_host)
            out.extend(range(g, g + take))
            g += size
            if len(out) >= n:
                break
        if len(out) < n:
            raise InvalidTopology(
                f"{self.source}: the run had {n} ranks but {topology.name} has room for {len(out)}"
            )
        return np.array(out[:n], dtype=np.int64)


def _collective_of(name: str) -> str | None:
    for key in sorted(COLLECTIVES, key=len, reverse=True):
        if key + "_perf" in name or name.startswith(key):
            return key
    return None


def _number(name: str, line: int, token: str, what: str) -> float:
    try:
        v = float(token)
    except ValueError:
        raise fail(name, line, f"{what}: expected a number, got {token!r}") from None
    if not np.isfinite(v) or v < 0:
        raise fail(name, line, f"{what}: expected a finite number >= 0, got {token!r}")
    return v


def read_nccl_tests(
    source: Any, *, collective: str | None = None, ranks: int | None = None
) -> NcclTestsRun:
    """Read one nccl-tests run (a path or an open file). ``collective`` (all_reduce,
    all_gather, reduce_scatter, alltoall, sendrecv) defaults to the one the file name or the
    output names; ``ranks`` overrides the rank count the file implies."""
    name, text = read_source(source)
    if collective is not None and collective not in COLLECTIVES:
        raise InvalidTopology(
            f"{name}: collective: expected one of {', '.join(COLLECTIVES)}, got {collective!r}"
        )
    coll = collective or _collective_of(name)
    rank_rows: list[tuple[int, str, int]] = []
    rows: list[NcclTestsRow] = []
    if ranks is not None and (isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2):
        raise InvalidTopology(f"{name}: ranks: expected an integer >= 2, got {ranks!r}")
    gpus_per_process = None
    elided = False
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = _PREFIX.sub("", raw).strip()
        if line.lstrip("# ").startswith("..."):
            elided = True
            continue
        if not line or "NCCL INFO" in line:
            continue
        if line.startswith("#"):
            m = _RANK.match(line)
            if m:
                rank, host, dev = int(m.group(1)), m.group(2), int(m.group(3))
                if rank > 1 << 22 or dev > 1024:
                    raise fail(name, lineno, f"rank {rank} device {dev}: out of range")
                rank_rows.append((rank, host, dev))
            h = _HEADER.search(line)
            if h and gpus_per_process is None:
                gpus_per_process = int(h.group(1))
            if coll is None:
                for key in COLLECTIVES:
                    if key + "_perf" in line:
                        coll = key
            continue
        tokens = line.split()
        if not tokens[0].isdigit():
            continue  # NCCL version banners, host:pid:tid log lines, prose
        if not 11 <= len(tokens) <= 13:
            raise fail(
                name,
                lineno,
                f"a table row needs size, count, type, [redop], [root] and 8 timing columns, "
                f"got {len(tokens)} fields",
            )
        if len(rows) >= _MAX_ROWS:
            raise fail(name, lineno, f"more than {_MAX_ROWS} rows")
        size = _number(name, lineno, tokens[0], "size")
        count = _number(name, lineno, tokens[1], "count")
        t = tokens[-8:]
        values = [
            _number(name, lineno, t[i], col)
            for i, col in (
                (0, "time"),
                (1, "algbw"),
                (2, "busbw"),
                (4, "in-place time"),
                (5, "in-place algbw"),
                (6, "in-place busbw"),
            )
        ]
        if size > 1 << 50 or count > 1 << 50:
            raise fail(name, lineno, f"size {tokens[0]}: out of range")
        rows.append(
            NcclTestsRow(
                lineno,
                int(size),
                int(count),
                tokens[2],
                values[0],
                values[1],
                values[2],
                values[3],
                values[4],
                values[5],
            )
        )
    if not rows:
        raise fail(name, None, "no nccl-tests table rows found (size count type ... busbw)")
    rank_rows.sort()
    seen: set[int] = set()
    for rank, _, _ in rank_rows:
        if rank in seen:
            raise fail(name, None, f"rank {rank} is listed twice")
        seen.add(rank)
    return NcclTestsRun(name, coll, tuple(rank_rows), tuple(rows), gpus_per_process, ranks, elided)
