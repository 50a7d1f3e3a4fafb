"""Step time, MFU and tokens per second: what a placement buys, in the units people decide on.

The model itself is in the Rust core (``rust/core/src/step.rs``, its rules and sources in the
module docs) and runs inside the cost model: a job compiled with its compute (:func:`step_args`)
gets step time, MFU and tokens/s in every cost report, priced at the slowest GPU peak among the
hosts a placement uses (each host type's ``peak_tflops``, else its ``gpu_model`` in the core's
table). This module reads a job's ``step`` section and names the details. In short:

* compute per step = model FLOPs / (GPUs x peak x efficiency); the FLOPs are
  ``6 * parameters * tokens`` for a dense transformer (``6 * active_parameters * tokens`` for a
  mixture of experts), or given directly;
* the pipeline bubble adds ``(pp - 1) / (v * m)`` of compute, ``v`` the model's
  ``virtual_stages`` (1 for 1F1B, Megatron's default: (pp-1)/(m+pp-1) of the pipelined time;
  more for interleaved schedules, ``rust/core/src/pipeline.rs``);
* dp gradient reduction hides under the backward pass (2/3 of compute); tp, cp, ep and pp
  communication is exposed; every dimension's overlap fraction may be overridden per job;
* step = compute + bubble + exposed communication; MFU = FLOPs / (step x GPUs x peak).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuplace._util.documents import Checker

if TYPE_CHECKING:
    from gpuplace.model.job import Job

__all__ = ["DEFAULT_EFFICIENCY", "StepOptions", "flops_and_tokens", "step_args"]

#: Achievable fraction of peak for compute (an assumption; see ``rust/core/src/step.rs``).
DEFAULT_EFFICIENCY = 0.6
#: Share of compute in the backward pass (twice the forward FLOPs).
DEFAULT_BACKWARD_FRACTION = 2.0 / 3.0
_DIMS = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True)
class StepOptions:
    """A job's ``step`` section: what one step computes and how communication overlaps it.

    ``flops_per_step`` / ``tokens_per_step`` override what the job's model gives; ``overlap``
    maps a dimension to the fraction of its window (backward for dp, compute otherwise) that may
    hide its communication (defaults: dp 1, others 0).
    """

    flops_per_step: float | None = None
    tokens_per_step: float | None = None
    efficiency: float = DEFAULT_EFFICIENCY
    backward_fraction: float = DEFAULT_BACKWARD_FRACTION
    overlap: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.flops_per_step is not None:
            out["flops_per_step"] = self.flops_per_step
        if self.tokens_per_step is not None:
            out["tokens_per_step"] = self.tokens_per_step
        if self.efficiency != DEFAULT_EFFICIENCY:
            out["efficiency"] = self.efficiency
        if self.backward_fraction != DEFAULT_BACKWARD_FRACTION:
            out["backward_fraction"] = self.backward_fraction
        if self.overlap:
            out["overlap"] = dict(self.overlap)
        return out

    @classmethod
    def from_dict(cls, c: Checker, raw: Any) -> StepOptions:
        doc = c.mapping(raw, "step")
        c.keys(
            doc,
            "step",
            {"flops_per_step", "tokens_per_step", "efficiency", "backward_fraction", "overlap"},
        )
        kwargs: dict[str, Any] = {}
        if doc.get("flops_per_step") is not None:
            kwargs["flops_per_step"] = c.number(
                doc["flops_per_step"], "step.flops_per_step", positive=True
            )
        if doc.get("tokens_per_step") is not None:
            kwargs["tokens_per_step"] = c.number(
                doc["tokens_per_step"], "step.tokens_per_step", minimum=0.0
            )
        if "efficiency" in doc:
            eff = c.number(doc["efficiency"], "step.efficiency", positive=True)
            if eff > 1:
                raise c.fail("step.efficiency", f"expected a fraction in (0, 1], got {eff}")
            kwargs["efficiency"] = eff
        if "backward_fraction" in doc:
            kwargs["backward_fraction"] = _fraction(
                c, doc["backward_fraction"], "step.backward_fraction"
            )
        if "overlap" in doc:
            overlap = {}
            for d, v in c.mapping(doc["overlap"], "step.overlap").items():
                if d not in _DIMS:
                    raise c.fail(
                        f"step.overlap.{d}", f"not a parallel dimension ({', '.join(_DIMS)})"
                    )
                overlap[d] = _fraction(c, v, f"step.overlap.{d}")
            kwargs["overlap"] = overlap
        return cls(**kwargs)


def _fraction(c: Checker, value: Any, path: str) -> float:
    v = c.number(value, path, minimum=0.0)
    if v > 1:
        raise c.fail(path, f"expected a fraction in [0, 1], got {v}")
    return v


def flops_and_tokens(job: Job) -> tuple[float, float] | None:
    """Model FLOPs and tokens of one step of ``job``, or None when it declares neither."""
    opts = job.step or StepOptions()
    tokens = opts.tokens_per_step
    flops = opts.flops_per_step
    m = job.model
    if m is not None:
        if tokens is None:
            # Every dp replica and every expert-parallel rank takes its own micro-batches (ep
            # ranks exchange tokens, GShard); cp ranks share one sequence.
            tokens = float(
                m.micro_batch_size * m.sequence_length * m.micro_batches * job.dp * job.ep
            )
        if flops is None:
            active = m.active_parameters if m.active_parameters is not None else m.parameters
            flops = 6.0 * active * tokens
    if flops is None:
        return None
    return float(flops), float(tokens or 0.0)


def step_args(
    job: Job,
) -> tuple[float, float, float, float, int, int, int, list[tuple[str, float]]] | None:
    """What ``_core.JobSpec`` takes as ``step``: (model FLOPs, tokens, efficiency, backward
    fraction, pipeline stages, micro-batches, virtual stages per pipeline rank, overlap by
    dimension), or None when the job declares no compute (no model and no
    ``step.flops_per_step``)."""
    ft = flops_and_tokens(job)
    if ft is None or job.gpus == 0:
        return None
    opts = job.step or StepOptions()
    micro_batches = job.model.micro_batches if job.model is not None else 1
    virtual_stages = job.model.virtual_stages if job.model is not None else 1
    return (
        ft[0],
        ft[1],
        opts.efficiency,
        opts.backward_fraction,
        job.pp,
        micro_batches,
        virtual_stages,
        sorted(opts.overlap.items()),
    )
