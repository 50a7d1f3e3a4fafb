"""What a simulation delivered: the summary operators are judged by, per-job rows and
per-time-bin rows (see ``docs/simulate.md`` for every field).

Definitions (GPU-seconds; the span is the makespan, first arrival to last finish):

* ``utilization``: GPU-time held by jobs over GPU-time available (GPUs not failed or drained);
* ``goodput``: useful GPU-time over all GPU-time of the cluster, where a job's useful GPU-time is
  its GPUs times its *kept* work (work at its reference step time; lost work, restarts and the
  slowdown of a worse placement are not useful);
* ``mfu``: model FLOPs of kept work over the cluster's peak FLOPs in the span (each GPU at its
  own host type's peak; jobs with a model); a job's MFU is over the peak of the GPUs it held;
* ``jct``, ``queue``: completion and queueing times of the finished jobs, also by size class;
* ``gpu_hours_lost``: held GPU-time whose work was lost to failures (since the last checkpoint)
  or spent restarting, per cause;
* ``utilization_steady``, ``goodput_steady``: the same over the steady window, the middle
  80 % of the arrivals (10th to 90th percentile of submit times), without the ramp-up and the
  drain that dominate the whole-run figures;
* ``ettr``: effective training time ratio (Kokolis et al., HPCA'25): per job, the share of the
  wall time from its first start to its finish spent on progress it kept; for the cluster,
  the same GPU-weighted over the finished jobs;
* ``interruptions_by_cause``: failures that stopped or moved a job (events on idle hardware
  are in ``failure_events`` only); ``failure_horizon_s``: how far failures were drawn;
* ``contention_slowdown``, ``degraded_slowdown``: per job, the time-weighted mean factor by
  which neighbours' traffic on shared uplinks, and degraded hardware under the job, lengthened
  its step over the same placement alone on healthy hardware (1.0: never slowed); summarised
  as mean and 95th percentile over the jobs that ran, and the share of jobs slowed by > 1 %.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuplace.sim.engine import SimResult

__all__ = [
    "SIZE_CLASSES",
    "confidence_interval",
    "job_rows",
    "size_class",
    "summary",
    "time_bins",
]

#: Size classes of the per-class JCT table: upper bounds in GPUs.
SIZE_CLASSES = (
    (1, "1"),
    (8, "2-8"),
    (64, "9-64"),
    (512, "65-512"),
    (4096, "513-4096"),
    (1 << 40, ">4096"),
)


def size_class(gpus: int) -> str:
    return next(label for bound, label in SIZE_CLASSES if gpus <= bound)


def _integral(times: np.ndarray, values: np.ndarray, end: float) -> float:
    widths = np.diff(np.append(times, max(end, times[-1])))
    return float(np.sum(values * widths))


def _integral_between(times: np.ndarray, values: np.ndarray, a: float, b: float) -> float:
    """Integral over [a, b] of the step function ``values`` changing at ``times``."""
    if b <= a:
        return 0.0
    edges = np.clip(np.append(times, max(b, float(times[-1]))), a, b)
    return float(np.sum(values * np.diff(edges)))


def _stats(seconds: Sequence[float | None]) -> dict[str, float | None]:
    """Mean, median and 99th percentile of the known values (None where none is known)."""
    values = [v for v in seconds if v is not None]
    if not values:
        return {"mean": None, "p50": None, "p95": None, "p99": None}
    arr = np.asarray(values)
    return {
        "mean": float(arr.mean()),
        "p50": float(np.percentile(arr, 50)),
        "p95": float(np.percentile(arr, 95)),
        "p99": float(np.percentile(arr, 99)),
    }


def confidence_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """The Student-t confidence interval of the mean of independent runs (seeds); None for
    fewer than two runs. Equal values give a zero-width interval."""
    if len(values) < 2:
        return None
    from scipy import stats

    arr = np.asarray(values, dtype=np.float64)
    mean = float(arr.mean())
    half = float(stats.t.ppf(0.5 + level / 2, arr.size - 1) * arr.std(ddof=1) / np.sqrt(arr.size))
    return mean - half, mean + half


def _slowdowns(values: list[float | None]) -> dict[str, float | None]:
    known = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if known.size == 0:
        return {"mean": None, "p95": None, "share_slowed": None}
    return {
        "mean": float(known.mean()),
        "p95": float(np.percentile(known, 95)),
        "share_slowed": float(np.mean(known > 1.01)),
    }


def summary(result: SimResult) -> dict[str, Any]:
    """The summary of one run; the first keys are the CLI's JSON table, in its order."""
    records = result.records
    finished = [r for r in records if r.finish is not None]
    first = min((r.job.submit_s for r in records), default=0.0)
    last = max((r.finish for r in finished if r.finish is not None), default=first)
    makespan = max(0.0, last - first)
    span_end = first + makespan
    held = _integral(result.times, result.allocated, span_end)
    unusable = _integral(result.times, result.unusable, span_end)
    total = result.num_gpus * makespan
    available = total - unusable
    useful = sum(r.job.gpus * r.kept_work_s for r in records)
    flops = sum(r.model_flops for r in records)
    lost = sum(result.lost_gpu_s.values())
    jct = [r.jct_s for r in finished]
    queue = [r.queue_s for r in records if r.queue_s is not None]
    by_class: dict[str, dict[str, Any]] = {}
    for _, label in SIZE_CLASSES:
        members = [r for r in finished if size_class(r.job.gpus) == label]
        if members:
            by_class[label] = {
                "jobs_finished": len(members),
                "jct_s": _stats([r.jct_s for r in members]),
                "queue_s": _stats([r.queue_s for r in members]),
            }
    jct_stats, queue_stats = _stats(jct), _stats(queue)
    cfg = result.config
    # The steady window: the middle 80 % of the arrivals (ramp-up and drain left out).
    w0, w1 = result.window
    window_s = max(0.0, w1 - w0)
    held_window = _integral_between(result.times, result.allocated, w0, w1)
    unusable_window = _integral_between(result.times, result.unusable, w0, w1)
    available_window = result.num_gpus * window_s - unusable_window
    useful_window = sum(r.job.gpus * r.kept_work_window_s for r in records)
    interruptions: dict[str, int] = {}
    for r in records:
        for cause, n in r.interruptions.items():
            interruptions[cause] = interruptions.get(cause, 0) + n
    spans = [
        (r, r.finish - r.first_start)
        for r in finished
        if r.finish is not None and r.first_start is not None and r.finish > r.first_start
    ]
    ettr_span = sum(r.job.gpus * span for r, span in spans)
    contention = _slowdowns([r.contention_slowdown for r in records])
    degraded = _slowdowns([r.degraded_slowdown for r in records])
    return {
        "jobs": len(records),
        "jobs_finished": len(finished),
        "makespan_s": makespan,
        "utilization": held / available if available > 0 else 0.0,
        "goodput": useful / total if total > 0 else 0.0,
        "mfu": flops / (result.peak_flops * total)
        if total > 0 and result.peak_flops > 0 and flops > 0
        else None,
        "jct_mean_s": jct_stats["mean"],
        "jct_p99_s": jct_stats["p99"],
        "queue_mean_s": float(np.mean(queue)) if queue else None,
        "gpu_hours_lost": lost / 3600.0,
        "elapsed_s": result.elapsed_s,
        "utilization_steady": held_window / available_window if available_window > 0 else None,
        "goodput_steady": useful_window / (result.num_gpus * window_s) if window_s > 0 else None,
        "steady_window_s": [w0, w1],
        "ettr": sum(r.kept_gpu_s for r, _ in spans) / ettr_span if ettr_span > 0 else None,
        "ettr_job": _stats([r.ettr for r in finished]),
        "interruptions_by_cause": dict(sorted(interruptions.items())),
        "jobs_interrupted": sum(1 for r in records if r.interruptions),
        "failure_horizon_s": result.failure_horizon_s,
        "failures_cover_run": None
        if result.failure_horizon_s is None
        else result.failure_horizon_s >= result.end_s,
        # Beyond the table:
        "solver": cfg.solver,
        "policy": cfg.policy,
        "failures": None if cfg.failures is None else cfg.failures.name,
        "response": cfg.response,
        "evacuate": cfg.evacuate,
        "checkpoint_store": cfg.checkpoint_store,
        "restart_sigma": cfg.restart_sigma,
        "health_ingest_s": cfg.health_ingest_s,
        "detect_s": cfg.detect_s,
        "seed": cfg.seed,
        "cluster": result.cluster,
        "gpus": result.num_gpus,
        "workload": result.workload,
        "jobs_unfinished": len(records) - len(finished),
        "jct_p50_s": jct_stats["p50"],
        "jct_p95_s": jct_stats["p95"],
        "queue_p50_s": queue_stats["p50"],
        "queue_p95_s": queue_stats["p95"],
        "jobs_per_s": len(records) / result.elapsed_s if result.elapsed_s > 0 else None,
        "gpu_hours_lost_by_cause": {k: v / 3600.0 for k, v in result.lost_gpu_s.items()},
        "checkpoint_gpu_hours": sum(r.checkpoint_gpu_s for r in records) / 3600.0,
        "failure_events": result.failures,
        "fabric_bytes_by_level": result.fabric_bytes,
        "contention_slowdown": contention,
        "degraded_slowdown": degraded,
        "contention_slowdown_mean": contention["mean"],
        "contention_slowdown_p95": contention["p95"],
        "degraded_slowdown_mean": degraded["mean"],
        "largest_tp8_mean": float(np.mean(result.largest_tp8)),
        "fgd_unallocated_mean": float(np.mean(result.fgd_unallocated)),
        "by_size": by_class,
    }


def job_rows(result: SimResult) -> list[dict[str, Any]]:
    """One row per job: its submission, when it started and finished, GPU-time and MFU."""
    rows = []
    for r in result.records:
        mfu = r.mfu
        rows.append(
            {
                "name": r.job.name,
                "gpus": r.job.gpus,
                "model": r.job.model,
                "tp": r.job.tp,
                "pp": r.job.pp,
                "ep": r.job.ep,
                "submit_s": r.job.submit_s,
                "start_s": r.first_start,
                "finish_s": r.finish,
                "queue_s": r.queue_s,
                "jct_s": r.jct_s,
                "work_s": r.job.work_s,
                "held_gpu_s": r.held_gpu_s,
                "lost_gpu_s": sum(r.lost_gpu_s.values()),
                "checkpoint_gpu_s": r.checkpoint_gpu_s,
                "restarts": r.restarts,
                "interruptions": sum(r.interruptions.values()),
                "interruptions_by_cause": ";".join(
                    f"{cause}:{n}" for cause, n in sorted(r.interruptions.items())
                ),
                "ettr": r.ettr,
                "hosts": r.hosts,
                "mfu": mfu,
                "contention_slowdown": r.contention_slowdown,
                "degraded_slowdown": r.degraded_slowdown,
                "status": "finished" if r.finish is not None else (r.reason or "unfinished"),
            }
        )
    return rows


def time_bins(result: SimResult, bins: int | None = None) -> list[dict[str, Any]]:
    """Per time bin: mean allocated and unusable GPUs, utilization, mean queued and running
    jobs (time-weighted), and the fragmentation sampled in the bin."""
    bins = bins or result.config.bins
    t = result.times
    end = max(result.end_s, float(t[-1]))
    edges = np.linspace(float(t[0]), end if end > t[0] else t[0] + 1.0, bins + 1)
    # Integrate the step functions on the union of change points and bin edges.
    grid = np.union1d(t, edges)
    idx = np.searchsorted(t, grid, side="right") - 1
    widths = np.diff(grid)
    which = np.searchsorted(edges, grid[:-1], side="right") - 1
    which = np.clip(which, 0, bins - 1)
    out = []
    bin_width = np.diff(edges)

    def mean_of(series: np.ndarray) -> np.ndarray:
        return np.bincount(which, weights=series[idx[:-1]] * widths, minlength=bins) / bin_width

    allocated, unusable = (
        mean_of(result.allocated.astype(float)),
        mean_of(result.unusable.astype(float)),
    )
    queued, running = mean_of(result.queued.astype(float)), mean_of(result.running.astype(float))
    frag_bin = np.clip(np.searchsorted(edges, result.frag_times, side="right") - 1, 0, bins - 1)
    for b in range(bins):
        samples = np.flatnonzero(frag_bin == b)
        available = result.num_gpus - unusable[b]
        out.append(
            {
                "t_start_s": float(edges[b]),
                "t_end_s": float(edges[b + 1]),
                "allocated_gpus": float(allocated[b]),
                "unusable_gpus": float(unusable[b]),
                "utilization": float(allocated[b] / available) if available > 0 else 0.0,
                "queued_jobs": float(queued[b]),
                "running_jobs": float(running[b]),
                "largest_tp8_gpus": int(result.largest_tp8[samples].min())
                if samples.size
                else None,
                "fgd_unallocated_gpus": float(result.fgd_unallocated[samples].mean())
                if samples.size
                else None,
            }
        )
    return out
