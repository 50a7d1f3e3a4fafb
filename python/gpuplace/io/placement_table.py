"""Reader of measured placement tables in the Pollux format (Qiao et al., OSDI'21 artifact,
``simulator/traces/<model>/placements.csv``): ``placement,local_bsz,step_time,sync_time`` rows,
``placement`` a digit string with the GPUs used on each host (``22`` = 2 + 2 GPUs on two hosts),
``sync_time`` the measured gradient synchronisation seconds per iteration."""

from __future__ import annotations

import csv
import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace._util.documents import csv_rows, describe, text_lines
from gpuplace.errors import InvalidJob, InvalidTopology
from gpuplace.io._common import read_source

if TYPE_CHECKING:
    from gpuplace.model.job import Job

__all__ = ["read_placement_table"]

_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")


def read_placement_table(
    source: Any, job: Job, *, gpus_per_host: int = 4
) -> list[tuple[Job, np.ndarray, float]]:
    """Samples ``(job, gpus, seconds)`` for :func:`gpuplace.calibrate`, one per placement of
    two or more GPUs: ``job`` with ``dp`` set to the placement's GPUs (its dp communication is
    the gradient all-reduce), the GPUs the first ones of consecutive hosts of
    ``gpus_per_host`` GPUs (GPU id = host * gpus_per_host + local index, as a topology of
    uniform hosts numbers them), and the mean ``sync_time`` over the table's batch sizes.
    Bad rows raise :class:`gpuplace.errors.InvalidJob` naming the file and line."""
    try:
        name, text = read_source(source)
    except InvalidTopology as exc:
        raise InvalidJob(str(exc)) from None
    reader = csv.reader(text_lines(text))
    rows = csv_rows(reader, name, InvalidJob, location=lambda line: f"{name}:{line}")
    _, header = next(rows, (1, None))
    if header is None or tuple(h.strip() for h in header) != _COLUMNS:
        raise InvalidJob(
            f"{name}:1: expected the header {','.join(_COLUMNS)}, got {describe(header)}"
        )
    times: dict[str, list[float]] = {}
    for lineno, row in rows:
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(_COLUMNS):
            raise InvalidJob(f"{name}:{lineno}: expected {len(_COLUMNS)} columns, got {len(row)}")
        placement = row[0].strip()
        if not (placement.isascii() and placement.isdigit()) or "0" in placement:
            raise InvalidJob(
                f"{name}:{lineno}: placement: expected digits 1-9, one per host, "
                f"got {describe(placement)}"
            )
        if len(placement) > 64:
            raise InvalidJob(f"{name}:{lineno}: placement: more than 64 hosts")
        if any(int(d) > gpus_per_host for d in placement):
            raise InvalidJob(
                f"{name}:{lineno}: placement {placement} puts more than {gpus_per_host} GPUs on a host"
            )
        try:
            sync = float(row[3])
        except ValueError:
            raise InvalidJob(
                f"{name}:{lineno}: sync_time: expected a number, got {describe(row[3])}"
            ) from None
        if not (math.isfinite(sync) and sync > 0):
            raise InvalidJob(
                f"{name}:{lineno}: sync_time: expected a number > 0, got {describe(row[3])}"
            )
        times.setdefault(placement, []).append(sync)
    if not times:
        raise InvalidJob(f"{name}: no placement rows")
    out = []
    for placement, values in times.items():
        counts = [int(d) for d in placement]
        n = sum(counts)
        if n < 2:
            continue
        gpus = np.array(
            [h * gpus_per_host + j for h, c in enumerate(counts) for j in range(c)], dtype=np.int64
        )
        sample_job = dataclasses.replace(
            job, name=f"{job.name}-{placement}", dp=n, tp=1, cp=1, ep=1, pp=1
        )
        if "dp" not in sample_job.resolved_communication():
            raise InvalidJob(
                f"{job.name}: the job gives no dp communication (model or communication.dp)"
            )
        out.append((sample_job, gpus, float(np.mean(values))))
    return out
