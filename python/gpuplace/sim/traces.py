"""Workloads for the cluster simulator: jobs that arrive over time.

A :class:`SimJob` is one submission: when it arrives, how many GPUs it gangs, its work (its
runtime in seconds at its reference step time, see :mod:`gpuplace.sim.speed`), an optional
runtime estimate (for EASY backfill), a priority class and its parallel layout and model.

Sources:

* :func:`philly` -- Microsoft's Philly trace as derived by the Pollux authors (shipped,
  gzip-compressed, in ``gpuplace/sim/data``; provenance in its README);
* :func:`openb` -- Alibaba's openb pod list (FGD, ATC'23), also shipped;
* :func:`llm_mix` -- a synthetic LLM-era mix (8 to 16,384 GPUs, Llama-3-like models, tp/pp/dp
  as people run them, durations resampled from the Philly trace's multi-GPU jobs);
* :func:`load_workload` -- a CSV or YAML file a user writes (see ``docs/simulate.md``).

Trace jobs have no model or layout: they run as :func:`gpuplace.sim.workload.training_job`
layouts (tp up to 8) of a Llama-2-13B-like model, so placement changes their speed the way it
changes a transformer's; a GPU count that is one GPU has no communication and runs at speed 1.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from gpuplace._util.documents import (
    MAX_DOCUMENT_BYTES,
    csv_rows,
    decode_utf8,
    describe,
    read_document,
    read_text,
    text_lines,
)
from gpuplace.errors import GpuplaceError, InvalidJob
from gpuplace.model.job import Job, TransformerModel
from gpuplace.sim.workload import DEFAULT_MODEL, MOE_MODEL

__all__ = [
    "LLM_MOE_SHARE",
    "MODELS",
    "SimJob",
    "Workload",
    "job_template",
    "llm_mix",
    "llm_moe_layout",
    "load_workload",
    "openb",
    "philly",
    "trace",
]

#: Models a workload may name. Dense ones Llama-3-like (Llama 3 paper, table 3: layers, model
#: dimension; 8k-token sequences, micro-batches enough to fill a 16-stage pipeline). Mixtures of
#: experts: Mixtral 8x7B (Jiang et al. 2024: 46.7B parameters, 12.9B active, 32 layers, model
#: dimension 4096, 8 experts, top-2) and DeepSeek-V3 (DeepSeek-AI 2024, tables 1 and section
#: 3.2/4.2: 671B parameters, 37B active, 61 layers, model dimension 7168, 256 routed experts,
#: top-8, 4k-token pre-training sequences); every layer is counted as an MoE layer.
MODELS: dict[str, TransformerModel | None] = {
    "none": None,
    "llama2-13b": DEFAULT_MODEL,
    "llama3-8b": TransformerModel(8e9, 32, 4096, 8192, 1, 4),
    "llama3-70b": TransformerModel(70e9, 80, 8192, 8192, 1, 8),
    "llama3-405b": TransformerModel(405e9, 126, 16384, 8192, 1, 16),
    "mixtral-8x7b": MOE_MODEL,
    "deepseek-v3": TransformerModel(
        671e9, 61, 7168, 4096, 1, 16, moe_top_k=8, active_parameters=37e9, experts=256
    ),
}


@dataclass(frozen=True)
class SimJob:
    """One submission. ``work_s``: runtime (s) at the job's reference step time;
    ``estimate_s``: the runtime the user declared (backfill), None to use ``work_s`` times the
    simulator's estimate factor; ``priority``: a class, higher first under the priority
    policy; ``tp``/``pp``/``ep``: layout (dp = gpus / (tp * pp * ep)); ``ep`` > 1 (expert
    parallelism, all-to-all) needs a mixture-of-experts model; ``model``: a key of :data:`MODELS`;
    ``exclusive``: whole nodes under Slurm; ``pod``: one Kubernetes pod, on one host."""

    name: str
    submit_s: float
    gpus: int
    work_s: float
    estimate_s: float | None = None
    priority: int = 0
    tp: int = 1
    pp: int = 1
    model: str = "llama2-13b"
    ep: int = 1
    #: The job asked for whole nodes (Slurm ``--exclusive``): ``slurm-tree`` then gives it idle
    #: nodes only; other policies place it as any job.
    exclusive: bool = False
    #: The job is one Kubernetes pod (openb): it never spans hosts, and the topology-blind
    #: peers place it as kube-scheduler binds a pod (``first-fit-pod``, ``random-pod``).
    pod: bool = False

    @property
    def shape(self) -> tuple[int, int, int, str, int]:
        return (self.gpus, self.tp, self.pp, self.model, self.ep)


@dataclass(frozen=True)
class Workload:
    """Jobs in submission order, and where they came from."""

    name: str
    jobs: tuple[SimJob, ...]

    def __len__(self) -> int:
        return len(self.jobs)

    def head(self, count: int) -> Workload:
        return Workload(self.name, self.jobs[:count])

    def scaled(self, max_gpus: int) -> Workload:
        """The same workload without the jobs larger than ``max_gpus`` (a smaller cluster)."""
        return Workload(self.name, tuple(j for j in self.jobs if j.gpus <= max_gpus))


def _sorted(name: str, jobs: Iterable[SimJob]) -> Workload:
    return Workload(name, tuple(sorted(jobs, key=lambda j: (j.submit_s, j.name))))


def trace_layout(gpus: int) -> tuple[int, int]:
    """(tp, pp) of a trace job of ``gpus`` GPUs: tp the largest of 8, 4, 2, 1 dividing it."""
    return next(t for t in (8, 4, 2, 1) if gpus % t == 0), 1


def job_template(job: SimJob) -> Job:
    """The :class:`gpuplace.Job` a simulated job runs as (one per shape, shared)."""
    gpus, tp, pp, model_name, ep = job.shape
    return Job(
        name=f"{model_name}-{gpus}g-tp{tp}-pp{pp}" + (f"-ep{ep}" if ep > 1 else ""),
        tp=tp,
        pp=pp,
        ep=ep,
        dp=gpus // (tp * pp * ep),
        model=MODELS[model_name],
    )


def _package_text(name: str) -> str:
    raw = resources.files("gpuplace.sim").joinpath(f"data/{name}").read_bytes()
    return gzip.decompress(raw).decode()


def _open_text(
    path: str | Path | None, packaged: str, error: type[GpuplaceError] = InvalidJob
) -> tuple[str, str]:
    """``(text, name)`` of a trace file (``.gz`` decompressed), with the limits of every
    reader: at most :data:`MAX_DOCUMENT_BYTES` (after decompression: a small gzip bomb is
    refused, not inflated), UTF-8; errors are ``error`` naming the file."""
    if path is None:
        return _package_text(packaged), packaged.removesuffix(".gz")
    p = Path(path)
    if p.suffix != ".gz":
        return read_text(p, error), str(p)
    try:
        with gzip.open(p, "rb") as handle:
            data = handle.read(MAX_DOCUMENT_BYTES + 1)
    except FileNotFoundError:
        raise error(f"{p}: no such file") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise error(f"{p}: cannot read gzip file: {exc}") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise error(f"{p}: larger than {MAX_DOCUMENT_BYTES} bytes uncompressed; refusing it")
    return decode_utf8(data, p, error), str(p)


def _trace_rows(
    reader: Iterable[Any], source: str, error: type[GpuplaceError] = InvalidJob
) -> Iterator[tuple[int, Any]]:
    """``(line, row)`` of a trace's csv reader, the csv module's own errors (a field over its
    size limit, a bare carriage return) raised as ``error`` naming the file and line."""
    return csv_rows(reader, source, error, location=lambda line: f"{source} line {line}")


_EPOCH, _SECOND = datetime(1970, 1, 1), timedelta(seconds=1)


def _timestamp(text: str) -> int | None:
    """Seconds since 1970 of ``YYYY-MM-DD HH:MM:SS`` (a ``T`` also separates), or None.
    (Checked field by field: numpy's own parser takes ``today``, ``NaT`` and a 30-digit number
    as times.)"""
    if (
        len(text) != 19
        or not text.isascii()
        or text[4] != "-"
        or text[7] != "-"
        or text[10] not in " T"
        or text[13] != ":"
        or text[16] != ":"
    ):
        return None
    if not (text[0:4] + text[5:7] + text[8:10] + text[11:13] + text[14:16] + text[17:]).isdigit():
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:  # a month 13, a 31st of June
        return None
    return (moment - _EPOCH) // _SECOND


def _seconds(text: str, where: str, field: str) -> float:
    """A finite number of seconds >= 0 of a trace's field, else InvalidJob naming it."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise InvalidJob(f"{where}: {field}: expected seconds >= 0, got {describe(text)}")
    return value


#: The most GPUs one trace job may ask for (the largest trace jobs ask for 128).
MAX_TRACE_GPUS = 1 << 20


def _gpu_count(text: str, where: str, field: str, *, minimum: int) -> int:
    """A GPU count of a trace's field (an integer from ``minimum`` to :data:`MAX_TRACE_GPUS`),
    else InvalidJob naming it."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 9) or not (
        minimum <= int(digits) <= MAX_TRACE_GPUS
    ):
        raise InvalidJob(
            f"{where}: {field}: expected an integer from {minimum} to {MAX_TRACE_GPUS}, "
            f"got {describe(text)}"
        )
    return int(digits)


_PHILLY_TIMES = re.compile(r"(?:[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9]{2}\n)*")


def _philly_columns(rows: list[list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The submit times (s), durations (s) and GPU counts of Philly rows, parsed column by
    column (fast); None (or an exception numpy raises) when a row is bad."""
    if any(len(row) < 3 for row in rows):
        return None
    times = [row[0].strip() for row in rows]
    # numpy's own time parser also takes "today", "NaT" and 30-digit numbers: the shape of
    # every time is checked first, in one linear pass.
    if _PHILLY_TIMES.fullmatch("".join(t + "\n" for t in times)) is None:
        return None
    submit = np.array(times, dtype="datetime64[s]").astype(np.int64)
    duration = np.array([row[1] for row in rows], dtype=np.float64)
    counts = [row[2].strip() for row in rows]
    if not all(c.isascii() and c.isdigit() and len(c) <= 9 for c in counts):
        return None
    gpus = np.array(counts, dtype=np.int64)
    if np.any((gpus < 1) | (gpus > MAX_TRACE_GPUS) | ~np.isfinite(duration) | (duration < 0)):
        return None
    return submit, duration, gpus


def _philly_row(row: list[str], where: str) -> tuple[int, float, int]:
    """One Philly row, checked field by field: InvalidJob naming ``where`` and the field."""
    if len(row) < 3:
        raise InvalidJob(
            f"{where}: expected the fields timestamp,duration,num_gpus; got {len(row)} field(s)"
        )
    submit = _timestamp(row[0].strip())
    if submit is None:
        raise InvalidJob(
            f"{where}: timestamp: expected a time as YYYY-MM-DD HH:MM:SS, got {describe(row[0])}"
        )
    return (
        submit,
        _seconds(row[1], where, "duration"),
        _gpu_count(row[2], where, "num_gpus", minimum=1),
    )


def philly(
    path: str | Path | None = None,
    *,
    min_duration_s: float = 0.0,
    model: str = "llama2-13b",
) -> Workload:
    """Microsoft's Philly trace (Pollux's derivation, 82,247 jobs, Sep--Dec 2017): submit
    times relative to the first, durations as work, GPU counts as given. ``path``: another
    copy of ``pollux_philly.csv`` (default: the one shipped in the package; ``.gz`` is read
    compressed). Pollux's own generator drops jobs shorter than 60 s; pass
    ``min_duration_s=60`` to do the same. A bad row raises InvalidJob naming the file, the
    line, the field and what was expected."""
    text, source = _open_text(path, "pollux_philly.csv.gz")
    reader = csv.reader(text_lines(text))
    rows = _trace_rows(reader, source)
    header = next((row for _, row in rows), None)
    if header is None or [h.strip() for h in header[:3]] != ["timestamp", "duration", "num_gpus"]:
        raise InvalidJob(
            f"{source} line 1: expected a Philly trace with columns timestamp,duration,num_gpus,..."
        )
    body = [(line, row) for line, row in rows if row and row != [""]]
    try:
        columns = _philly_columns([row for _, row in body])
    except (ValueError, OverflowError, TypeError):
        columns = None
    if columns is None:
        # The slow path, on bad input only: row by row, the first bad row named with its line
        # and field (and if every row passes here, these are the rows).
        parsed = [_philly_row(row, f"{source} line {line}") for line, row in body]
        columns = (
            np.array([r[0] for r in parsed], dtype=np.int64),
            np.array([r[1] for r in parsed], dtype=np.float64),
            np.array([r[2] for r in parsed], dtype=np.int64),
        )
    submits, durations, counts = columns
    keep = durations >= min_duration_s
    kept = list(
        zip(submits[keep].tolist(), durations[keep].tolist(), counts[keep].tolist(), strict=True)
    )
    if not kept:
        raise InvalidJob(f"{source}: no job lasts {min_duration_s} s or more")
    first = min(r[0] for r in kept)
    jobs = []
    for i, (submit, duration, gpus) in enumerate(kept):
        tp, pp = trace_layout(gpus)
        jobs.append(
            SimJob(
                f"philly-{i:05d}",
                submit - first,
                gpus,
                max(duration, 1.0),
                tp=tp,
                pp=pp,
                model=model,
            )
        )
    return _sorted("philly", jobs)


def openb(path: str | Path | None = None, *, model: str = "llama2-13b") -> Workload:
    """Alibaba's openb pod list (``openb_pod_list_default.csv``, FGD, ATC'23). Pods without GPUs
    and pods never scheduled (no ``scheduled_time``: no runtime) are skipped; a pod sharing a
    GPU (``gpu_milli`` < 1000) takes one whole GPU, since gpuplace allocates whole GPUs. Work is
    ``deletion_time - scheduled_time``. A bad row raises InvalidJob naming the file, the line,
    the field and what was expected."""
    text, source = _open_text(path, "openb_pod_list_default.csv.gz")
    reader = csv.DictReader(text_lines(text))
    need = ("name", "num_gpu", "creation_time", "deletion_time", "scheduled_time")
    try:
        fieldnames = reader.fieldnames
    except csv.Error as exc:
        raise InvalidJob(f"{source} line 1: not valid CSV: {exc}") from None
    missing = [f for f in need if f not in (fieldnames or ())]
    if missing:
        raise InvalidJob(
            f"{source} line 1: expected an openb pod list with columns {', '.join(need)}; "
            f"missing {', '.join(missing)}"
        )
    jobs = []
    seen: set[str] = set()
    for line, row in _trace_rows(reader, source):
        where = f"{source} line {line}"
        if None in row:
            raise InvalidJob(f"{where}: more fields than the header's {len(fieldnames or ())}")
        short = next((f for f in need if row[f] is None), None)
        if short is not None:
            raise InvalidJob(f"{where}: {short}: missing (fewer fields than the header)")
        gpus = _gpu_count(row["num_gpu"], where, "num_gpu", minimum=0)
        if gpus == 0 or not row["scheduled_time"].strip():
            continue
        name = row["name"].strip()
        if not name:
            raise InvalidJob(f"{where}: name: expected a pod name")
        if name in seen:
            raise InvalidJob(f"{where}: name: pod {name!r} is listed twice")
        seen.add(name)
        created = _seconds(row["creation_time"], where, "creation_time")
        start = _seconds(row["scheduled_time"], where, "scheduled_time")
        end = _seconds(row["deletion_time"], where, "deletion_time")
        tp, pp = trace_layout(gpus)
        jobs.append(
            SimJob(
                name,
                created,
                gpus,
                max(end - start, 1.0),
                tp=tp,
                pp=pp,
                model=model,
                pod=True,
            )
        )
    return _sorted("openb", jobs)


# ---------------------------------------------------------------------------------------------
# Files users write

#: Columns of a workload file; ``name``, ``submit_s``, ``gpus`` and ``duration_s`` are required.
COLUMNS = (
    "name",
    "submit_s",
    "gpus",
    "duration_s",
    "estimate_s",
    "priority",
    "tp",
    "pp",
    "ep",
    "model",
    "exclusive",
)
_TRUE, _FALSE = ("1", "true", "yes"), ("", "0", "false", "no")


def _job_from_fields(fields: dict[str, Any], where: str) -> SimJob:
    def need(key: str) -> Any:
        value = fields.get(key)
        if value is None or value == "":
            raise InvalidJob(f"{where}: {key}: required")
        return value

    def number(key: str, value: Any, *, minimum: float, integer: bool = False) -> Any:
        try:
            out = float(value)
            if integer:
                if not out.is_integer():
                    raise ValueError
                out = int(out)
        except (TypeError, ValueError):
            kind = "an integer" if integer else "a number"
            raise InvalidJob(
                f"{where}: {key}: expected {kind} >= {minimum:g}, got {describe(value)}"
            ) from None
        if not math.isfinite(out) or out < minimum or abs(out) > 2**63 - 1:
            kind = "an integer" if integer else "a number"
            raise InvalidJob(
                f"{where}: {key}: expected {kind} >= {minimum:g}, got {describe(value)}"
            )
        return out

    def text(key: str, value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise InvalidJob(f"{where}: {key}: expected a string, got {describe(value)}")
        return str(value)

    for key in fields:
        if not isinstance(key, str):
            raise InvalidJob(f"{where}: field names must be strings, got {describe(key)}")
    unknown = set(fields) - set(COLUMNS)
    if unknown:
        raise InvalidJob(
            f"{where}: unknown field {sorted(unknown)[0]!r}; the fields are {', '.join(COLUMNS)}"
        )
    name = text("name", need("name"))
    gpus = number("gpus", need("gpus"), minimum=1, integer=True)
    pp = number("pp", fields.get("pp") or 1, minimum=1, integer=True)
    ep = number("ep", fields.get("ep") or 1, minimum=1, integer=True)
    # No tp given: the largest of 8, 4, 2, 1 that the other degrees leave room for.
    fit = next((t for t in (8, 4, 2, 1) if gpus % (t * pp * ep) == 0), 1)
    tp = number("tp", fields.get("tp") or fit, minimum=1, integer=True)
    if gpus % (tp * pp * ep):
        raise InvalidJob(
            f"{where}: gpus: {gpus} is not a multiple of tp * pp * ep = {tp * pp * ep}"
        )
    model = text("model", fields.get("model") or "llama2-13b")
    if model not in MODELS:
        raise InvalidJob(f"{where}: model: expected one of {', '.join(MODELS)}, got {model!r}")
    experts = getattr(MODELS[model], "experts", None)
    if ep > 1 and experts is None:
        raise InvalidJob(
            f"{where}: ep: expert parallelism needs a mixture-of-experts model "
            f"({', '.join(k for k, m in MODELS.items() if m is not None and m.experts)}), "
            f"got {model!r}"
        )
    if experts is not None and ep > experts:
        raise InvalidJob(f"{where}: ep: {ep} is over {model}'s {experts} experts")
    estimate = fields.get("estimate_s")
    exclusive = fields.get("exclusive")
    flag = str(exclusive).strip().lower() if exclusive is not None else ""
    if flag not in _TRUE + _FALSE:
        raise InvalidJob(f"{where}: exclusive: expected true or false, got {exclusive!r}")
    return SimJob(
        name=name,
        submit_s=number("submit_s", need("submit_s"), minimum=0),
        gpus=gpus,
        work_s=number("duration_s", need("duration_s"), minimum=1e-9),
        estimate_s=None if estimate in (None, "") else number("estimate_s", estimate, minimum=1e-9),
        priority=number("priority", fields.get("priority") or 0, minimum=-1_000_000, integer=True),
        tp=tp,
        pp=pp,
        ep=ep,
        model=model,
        exclusive=flag in _TRUE,
    )


def load_workload(path: str | Path) -> Workload:
    """A workload file: CSV with a header row of :data:`COLUMNS` (one job per line), or YAML /
    JSON ``{jobs: [{name: ..., submit_s: ..., gpus: ..., duration_s: ...}, ...]}``. A bad line
    raises :class:`InvalidJob` naming the file, the line (CSV) or job index (YAML) and field."""
    p = Path(path)
    jobs: list[SimJob] = []
    if p.suffix.lower() in (".yaml", ".yml", ".json"):
        document = read_document(p, InvalidJob)
        if not isinstance(document, dict) or not isinstance(document.get("jobs"), list):
            raise InvalidJob(f"{p}: expected a mapping with a list 'jobs'")
        for i, entry in enumerate(document["jobs"]):
            if not isinstance(entry, dict):
                raise InvalidJob(f"{p}: jobs[{i}]: expected a mapping")
            jobs.append(_job_from_fields(entry, f"{p}: jobs[{i}]"))
    else:
        reader = csv.DictReader(text_lines(read_text(p, InvalidJob)))
        try:
            fieldnames = reader.fieldnames
        except csv.Error as exc:
            raise InvalidJob(f"{p}: line 1: not valid CSV: {exc}") from None
        if fieldnames is None:
            raise InvalidJob(
                f"{p}: empty workload file; expected a header row of {', '.join(COLUMNS)}"
            )
        for line, row in csv_rows(reader, p, InvalidJob):
            if None in row:
                raise InvalidJob(
                    f"{p} line {line}: more fields than the header's {len(fieldnames)}"
                )
            fields = {k.strip(): (v.strip() if isinstance(v, str) else v) for k, v in row.items()}
            if not any(fields.values()):
                continue
            jobs.append(_job_from_fields(fields, f"{p} line {line}"))
    seen: set[str] = set()
    for job in jobs:  # linear: a list.count per name was quadratic in a long file
        if job.name in seen:
            raise InvalidJob(f"{p}: job name {job.name!r} appears twice")
        seen.add(job.name)
    if not jobs:
        raise InvalidJob(f"{p}: no jobs")
    return _sorted(p.stem, jobs)


# ---------------------------------------------------------------------------------------------
# Synthetic LLM-era mix

#: Job sizes of the LLM mix and their weights: a power law in the size, P(n) ~ n^-0.6, so most
#: jobs are small but most GPU-time is in large jobs (as on LLM clusters: Meta's RSC and
#: Research SuperCluster reports, Acme/Kalos in the shared traces' summary tables).
LLM_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
LLM_SIZE_EXPONENT = 0.6


def llm_layout(gpus: int) -> tuple[str, int, int]:
    """(model, tp, pp) as people run them: 8B models data-parallel with tp 2 up to 64 GPUs,
    70B with tp 8 and pp 4 (Llama 3 70B style) up to 1,024 GPUs, 405B with tp 8 and pp 16
    (the Llama 3 405B layout on 16,384 GPUs) above."""
    if gpus <= 64:
        return "llama3-8b", 2, 1
    if gpus <= 1024:
        return "llama3-70b", 8, 4
    return "llama3-405b", 8, 16


#: Share of the LLM mix's jobs that train a mixture of experts (a modelling choice, not a
#: measured figure: no public trace labels its jobs dense or MoE).
LLM_MOE_SHARE = 0.25


def llm_moe_layout(gpus: int) -> tuple[str, int, int, int]:
    """(model, tp, pp, ep) of a mixture-of-experts job as people run them: Mixtral 8x7B with
    ep 8 (and pp 4 from 32 GPUs: Megatron-Core's MoE README gives TP1 EP8 PP4 for it) up to
    256 GPUs; DeepSeek-V3 above, with pp 16 and ep 64 (its paper, section 3.2: 16-way pipeline,
    64-way expert parallelism over 8 nodes, ZeRO-1 data parallelism), ep smaller below 1,024
    GPUs."""
    if gpus <= 16:
        return "mixtral-8x7b", 1, 1, min(8, gpus)
    if gpus <= 256:
        return "mixtral-8x7b", 1, 4, 8
    return "deepseek-v3", 1, 16, min(64, gpus // 16)


def _philly_multi_gpu_durations() -> np.ndarray:
    text = _package_text("pollux_philly.csv.gz")
    durations = [
        float(row[1])
        for row in csv.reader(io.StringIO(text))
        if row and row[0] != "timestamp" and int(row[2]) >= 8 and float(row[1]) >= 60
    ]
    return np.asarray(durations)


def llm_mix(
    count: int,
    *,
    cluster_gpus: int,
    load: float = 0.9,
    seed: int = 0,
    max_gpus: int | None = None,
    moe_share: float = LLM_MOE_SHARE,
) -> Workload:
    """``count`` synthetic LLM training jobs for a cluster of ``cluster_gpus`` GPUs. Sizes are
    drawn from :data:`LLM_SIZES` (up to ``max_gpus``, default half the cluster: a job needing
    every GPU could only start when no GPU is broken, and Llama 3 405B's 16,384 GPUs were part
    of a 24,576-GPU cluster) with weights
    n^-:data:`LLM_SIZE_EXPONENT`; layouts from :func:`llm_layout`; durations resampled from the
    Philly trace's jobs of 8 GPUs or more lasting 60 s or more; arrivals Poisson with the rate
    that offers ``load`` times the cluster's GPU-time. A ``moe_share`` of the jobs train a
    mixture of experts instead (:func:`llm_moe_layout`: expert parallelism, all-to-all every
    layer). Deterministic for a seed."""
    if count < 1 or cluster_gpus < 8:
        raise InvalidJob("llm_mix: needs count >= 1 and a cluster of at least 8 GPUs")
    if not 0.0 <= moe_share <= 1.0:
        raise InvalidJob(f"llm_mix: moe_share: expected a share in [0, 1], got {moe_share!r}")
    cap = min(max_gpus or cluster_gpus // 2, cluster_gpus)
    sizes = np.array([s for s in LLM_SIZES if s <= cap], dtype=np.int64)
    weights = sizes.astype(float) ** -LLM_SIZE_EXPONENT
    rng = np.random.default_rng(seed)
    drawn = rng.choice(sizes, size=count, p=weights / weights.sum())
    durations = rng.choice(_philly_multi_gpu_durations(), size=count)
    offered = float(np.sum(drawn * durations))
    rate = count / (offered / (load * cluster_gpus))  # arrivals per second
    submits = np.cumsum(rng.exponential(1.0 / rate, size=count))
    submits -= submits[0]
    # Drawn last, so the sizes, durations and arrivals do not depend on the share.
    moe = rng.random(count) < moe_share
    jobs = []
    for i in range(count):
        if moe[i]:
            model, tp, pp, ep = llm_moe_layout(int(drawn[i]))
        else:
            (model, tp, pp), ep = llm_layout(int(drawn[i])), 1
        jobs.append(
            SimJob(
                f"llm-{i:05d}",
                float(submits[i]),
                int(drawn[i]),
                float(durations[i]),
                tp=tp,
                pp=pp,
                model=model,
                ep=ep,
            )
        )
    return _sorted("llm-mix", jobs)


def trace(name: str, **kwargs: Any) -> Workload:
    """A named trace (``philly``, ``openb``) or a workload file."""
    if name == "philly":
        return philly(**kwargs)
    if name == "openb":
        return openb(**kwargs)
    path = Path(name)
    if not path.exists():
        raise InvalidJob(
            f"unknown trace {name!r}: neither philly, openb, llm-mix nor an existing workload file"
        )
    return load_workload(path)


def with_estimates(workload: Workload, factor: float) -> Workload:
    """The workload with every missing runtime estimate set to ``factor`` times the work."""
    return Workload(
        workload.name,
        tuple(
            j if j.estimate_s is not None else replace(j, estimate_s=j.work_s * factor)
            for j in workload.jobs
        ),
    )
