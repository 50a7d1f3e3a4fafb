"""The speed model of the simulator: how fast a job runs on its placement.

This module is the *one* place where the simulator turns the core's cost report of a placement
into a job's speed, so that it switches over to the core's step time when the cost report has
one. A job's *work* is its runtime in seconds at its **reference step time**: the step time of
the same job placed alone on the empty cluster by ``greedy`` (the best the topology offers
without search). On a placement whose step time is ``step_seconds``, the job progresses at

    speed = reference_step_seconds / step_seconds      (work-seconds per wall second)

so a job placed as well as on the empty cluster runs at speed 1 and a job whose step is twice
as long takes twice as long. On a cluster whose host types differ in GPU peak the reference is
placed on the most common peak's GPUs (``gpuplace.sim.engine.reference_gpus``), and the core
prices every step at the peak of the GPUs the placement got. In a what-if between two clusters the reference is one of them
(``simulate(..., reference=)``), so faster GPUs and fabrics run the same work faster. The step time comes from:

1. ``report.step_seconds``, the core's step-time model (``rust/core/src/step.rs``), which also
   prices compute, the pipeline bubble, overlap (dp under the backward pass) and, with fabric
   contention, the other jobs' traffic. The core's cost report carries it for every job with a
   model on GPUs whose peak is known (a host type's ``peak_tflops`` or its ``gpu_model`` in the
   core's table), so it is what simulated jobs run at;
2. otherwise (a GPU whose peak the core does not know) the documented comm-based rule: ``compute_seconds + report.comm_seconds``, where
   ``comm_seconds`` is the core's communication time per step (no overlap with compute, as the
   cost model assumes) and ``compute_seconds`` is the job's model FLOPs per GPU per step
   (``6 * parameters * tokens per step / GPUs``, Kaplan et al. 2020; Narayanan et al., SC21)
   over the GPU's dense BF16 peak times :data:`COMPUTE_EFFICIENCY`. A job without a model has
   no compute estimate: its step is its communication alone, and a job without communication
   either (one GPU, or no traffic declared) runs at speed 1 wherever it is placed.

MFU is ``report.mfu`` when the report carries it, otherwise model FLOPs per GPU per step over
``step_seconds * peak``: available only for jobs with a model. Degraded hardware enters through
the cost report (the job is re-priced on the state when the hardware under it changes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology
    from gpuplace.placement.result import CostReport

__all__ = [
    "COMPUTE_EFFICIENCY",
    "PEAK_FLOPS",
    "JobProfile",
    "Speed",
    "job_profile",
    "job_speed",
    "peak_flops",
]

#: Dense BF16 tensor peak per GPU (FLOP/s), from the vendors' datasheets: H100 SXM 989 TFLOP/s,
#: A100 SXM 312, B200 2.25 PFLOP/s (HGX B200), GB200's B200 2.5 PFLOP/s (GB200 NVL72 spec), V100
#: 125 (FP16 tensor), T4 65, P100 18.7 (FP16). Matched against the host type's ``gpu_model``.
PEAK_FLOPS: dict[str, float] = {
    "gb200": 2.5e15,
    "b200": 2.25e15,
    "h100": 989e12,
    "h800": 989e12,
    "h20": 148e12,
    "a100": 312e12,
    "a800": 312e12,
    "v100": 125e12,
    "t4": 65e12,
    "p100": 18.7e12,
}
#: Peak assumed for a GPU model not in :data:`PEAK_FLOPS` (an H100's).
DEFAULT_PEAK_FLOPS = 989e12
#: Fraction of peak the compute of a step reaches on its own (matrix-multiply efficiency of
#: large transformer layers); with communication not overlapped, MFU is at most this.
COMPUTE_EFFICIENCY = 0.5


def peak_flops(topology: Topology) -> float:
    """Dense BF16 peak of one GPU of ``topology`` (FLOP/s): its first host type's
    ``gpu_model`` looked up in :data:`PEAK_FLOPS`. Used only where the core's step model
    knows no peak (the comm-based rule); steps and MFU otherwise use the placement's own."""
    for node_type in topology.node_types.values():
        model = (getattr(node_type, "gpu_model", None) or "").lower()
        for key, flops in PEAK_FLOPS.items():
            if key in model.replace(" ", "").replace("(", "").replace(")", ""):
                return flops
        if model:
            break
    return DEFAULT_PEAK_FLOPS


@dataclass(frozen=True)
class JobProfile:
    """What the speed model knows about a job shape apart from its placement.

    ``compute_seconds``: compute per step (s) on this cluster's GPUs, 0 when unknown;
    ``model_flops_per_gpu``: model FLOPs per GPU per step, 0 when unknown;
    ``reference_step_seconds``: the step time on the empty cluster (set by :func:`job_profile`).
    """

    compute_seconds: float
    model_flops_per_gpu: float
    peak_flops: float
    reference_step_seconds: float


@dataclass(frozen=True)
class Speed:
    """A job's speed on one placement: ``speed`` work-seconds per wall second, its step time
    (s) and MFU (None when the job has no model)."""

    speed: float
    step_seconds: float
    mfu: float | None


def _compute(job: Job, peak: float) -> tuple[float, float]:
    model = job.model
    if model is None:
        return 0.0, 0.0
    tokens_per_replica = model.sequence_length * model.micro_batch_size * model.micro_batches
    # Each data-parallel replica (tp * cp * ep * pp GPUs) processes its micro-batches per step.
    flops_per_gpu = 6.0 * model.parameters * tokens_per_replica * job.dp / job.gpus
    return flops_per_gpu / (peak * COMPUTE_EFFICIENCY), flops_per_gpu


def _step_seconds(report: CostReport, compute_seconds: float) -> float:
    step = getattr(report, "step_seconds", None)
    if step is not None:
        return float(step)
    return compute_seconds + float(report.comm_seconds)


def job_profile(
    job: Job, topology: Topology, reference: CostReport, reference_topology: Topology | None = None
) -> JobProfile:
    """The profile of ``job`` on ``topology``, with ``reference`` the cost report of its
    reference placement: alone on the empty ``reference_topology`` (default: ``topology``).
    A what-if between clusters takes one of them as the reference of both, so a job's work
    means the same on both and faster GPUs or fabrics shorten it."""
    peak = peak_flops(topology)
    compute, flops = _compute(job, peak)
    reference_compute = _compute(job, peak_flops(reference_topology or topology))[0]
    return JobProfile(compute, flops, peak, _step_seconds(reference, reference_compute))


def job_speed(report: CostReport, profile: JobProfile) -> Speed:
    """The one speed model (see the module docstring): a placement's cost report -> speed."""
    step = _step_seconds(report, profile.compute_seconds)
    if step <= 0.0 or profile.reference_step_seconds <= 0.0:
        # No compute estimate and no communication: placement cannot change the job's speed.
        return Speed(1.0, step, None)
    mfu = getattr(report, "mfu", None)
    if mfu is None and profile.model_flops_per_gpu > 0.0:
        mfu = profile.model_flops_per_gpu / (step * profile.peak_flops)
    return Speed(profile.reference_step_seconds / step, step, mfu)
