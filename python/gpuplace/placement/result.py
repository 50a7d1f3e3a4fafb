"""What placing a job gives back: the cost report of the one cost model, the placement, and
what a solver returns.

The report is the core's (``rust/core/src/cost.rs``), named: classes, levels and the step
details by their names in the job and the topology.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core
from gpuplace._util.hostlist import compress
from gpuplace.cluster.fabric import hot_uplinks
from gpuplace.errors import InvalidTopology
from gpuplace.model.step import flops_and_tokens, step_args

if TYPE_CHECKING:
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = [
    "CostReport",
    "Placement",
    "SolveResult",
    "cost_report",
    "gpu_peak_tflops",
    "peak_of_gpus",
]


@dataclass(frozen=True)
class CostReport:
    """The cost model's verdict on one placement.

    ``comm_seconds`` is the estimated communication time per step (s): for each collective
    class (e.g. all tp all-reduces) the slowest member, summed over classes, plus explicit
    traffic; no overlap with computation is assumed. ``bytes_by_level`` gives the bytes per
    step whose path's lowest common level is each level.
    """

    comm_seconds: float
    class_seconds: dict[str, float]
    traffic_seconds: float
    bytes_by_level: dict[str, float]
    span_level: str | None
    confinement_ok: bool
    violations: list[str]
    nvlink_level: str
    #: Step time per step (s): compute + pipeline bubble + exposed communication, plus the
    #: storage stalls (input reads longer than the step, checkpoint writes amortized; see
    #: ``step_details``), when the job declares its compute (``gpuplace.model.step``); None
    #: otherwise, like the four below.
    step_seconds: float | None = None
    #: Communication not hidden under compute (s).
    exposed_comm_seconds: float | None = None
    #: Compute per step without the bubble (s).
    compute_seconds: float | None = None
    #: Model FLOPs utilisation (0..1).
    mfu: float | None = None
    tokens_per_second: float | None = None
    #: The rest of the core's step report (bubble, per-class exposed time, peak, GPU model).
    step_details: dict[str, Any] = field(default_factory=dict)
    #: The NCCL algorithm priced for each class's slowest collective (ring, tree, nvls,
    #: nvls-tree, collnet, pairwise, p2p; ``rust/core/src/nccl.rs``).
    class_algorithms: dict[str, str] = field(default_factory=dict)
    #: Priced in a state whose running jobs load the fabric: the same placement's seconds
    #: with nobody else on it, and the uplinks over capacity on its paths
    #: (``gpuplace.cluster.fabric``); ``comm_seconds`` is then the contended time. The core
    #: prices them in the same call as the rest of the report.
    alone_seconds: float | None = None
    hot_uplinks: tuple[Any, ...] = ()
    #: Seconds per step reading the job's dataset and writing its checkpoints over the path
    #: to their stores (``gpuplace.model.storage``); not part of ``comm_seconds``. In the
    #: step: ``step_details`` ``input_stall_seconds`` and ``checkpoint_seconds``.
    io_seconds: float = 0.0
    #: Storage in the step (``rust/core/src/storage.rs``, ``step_with_io``), when a step is
    #: priced: input reads per step (prefetched under the step), the part of them longer than
    #: the step (the GPUs wait for data), and checkpoint writes amortized per step (a
    #: checkpoint's stall over its interval in steps); ``step_seconds`` holds the last two.
    input_seconds: float | None = None
    input_stall_seconds: float | None = None
    checkpoint_seconds: float | None = None

    @property
    def peak_tflops(self) -> float | None:
        """Peak TFLOPS of one GPU the step was priced at (the slowest host type's of the
        placement, ``step_details["peak_tflops"]``); None when no step was priced."""
        return self.step_details.get("peak_tflops")

    @property
    def slowdown(self) -> float:
        """Contended over alone communication time (1.0 when nobody slows the job)."""
        if self.alone_seconds is None or self.alone_seconds <= 0:
            return 1.0
        return self.comm_seconds / self.alone_seconds

    @property
    def fabric_bytes(self) -> float:
        """Bytes per step that leave the NVLink domain (cross the scale-out fabric)."""
        names = list(self.bytes_by_level)
        start = names.index(self.nvlink_level) + 1
        return float(sum(self.bytes_by_level[n] for n in names[start:]))

    def bytes_above(self, level: str) -> float:
        """Bytes per step whose lowest common level is ``level`` or higher."""
        names = list(self.bytes_by_level)
        if level not in names:
            return 0.0
        return float(sum(self.bytes_by_level[n] for n in names[names.index(level) :]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "comm_seconds": self.comm_seconds,
            "class_seconds": self.class_seconds,
            "class_algorithms": self.class_algorithms,
            "traffic_seconds": self.traffic_seconds,
            "bytes_by_level": self.bytes_by_level,
            "fabric_bytes": self.fabric_bytes,
            "span_level": self.span_level,
            "confinement_ok": self.confinement_ok,
            "violations": self.violations,
            "step_seconds": self.step_seconds,
            "exposed_comm_seconds": self.exposed_comm_seconds,
            "compute_seconds": self.compute_seconds,
            "mfu": self.mfu,
            "tokens_per_second": self.tokens_per_second,
            **({"step": self.step_details} if self.step_details else {}),
            **({"io_seconds": self.io_seconds} if self.io_seconds else {}),
            **(
                {
                    "alone_seconds": self.alone_seconds,
                    "slowdown": self.slowdown,
                    "hot_uplinks": [u.to_dict() for u in self.hot_uplinks],
                }
                if self.alone_seconds is not None
                else {}
            ),
        }


@dataclass(frozen=True)
class Placement:
    """Where a job runs: ``gpus[rank]`` is the GPU id of each rank."""

    job: Job
    topology: Topology
    gpus: np.ndarray
    cost: CostReport
    solver: str
    elapsed_s: float
    #: True when an exact solver proved this placement optimal; None for heuristics.
    optimal: bool | None = None
    #: Best proven lower bound on comm_seconds (s), when an exact solver gives one.
    bound: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        """Relative gap between the cost and the proven bound (0 when optimal)."""
        if self.bound is None:
            return None
        if self.cost.comm_seconds <= 0:
            return 0.0
        return max(0.0, (self.cost.comm_seconds - self.bound) / self.cost.comm_seconds)

    @property
    def nodes(self) -> list[str]:
        """Hosts used, in order of their first rank."""
        seen: dict[str, None] = {}
        for g in self.gpus:
            seen.setdefault(self.topology.host_of(int(g)), None)
        return list(seen)

    def hostlist(self) -> str:
        """The hosts as a compressed Slurm hostlist (``dgx[001-004,010]``)."""
        return compress(sorted(self.nodes))

    def cuda_visible_devices(self) -> dict[str, str]:
        """Per host, ``CUDA_VISIBLE_DEVICES`` listing its GPUs in rank order."""
        out: dict[str, list[str]] = {}
        for g in self.gpus:
            out.setdefault(self.topology.host_of(int(g)), []).append(
                str(self.topology.local_index(int(g)))
            )
        return {h: ",".join(v) for h, v in out.items()}

    def rank_table(self) -> list[dict[str, Any]]:
        """One row per rank: global rank, host, local rank on that host, CUDA device."""
        rows = []
        local_rank: dict[str, int] = {}
        for rank, g in enumerate(self.gpus):
            host = self.topology.host_of(int(g))
            lr = local_rank.get(host, 0)
            local_rank[host] = lr + 1
            rows.append(
                {
                    "rank": rank,
                    "host": host,
                    "local_rank": lr,
                    "device": self.topology.local_index(int(g)),
                }
            )
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job.name,
            "gpus": [int(g) for g in self.gpus],
            "nodes": self.nodes,
            "hostlist": self.hostlist(),
            "cost": self.cost.to_dict(),
            "solver": self.solver,
            "optimal": self.optimal,
            "bound": self.bound,
            "gap": self.gap,
            "elapsed_s": self.elapsed_s,
            **({"details": self.details} if self.details else {}),
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)


@dataclass(frozen=True)
class SolveResult:
    """What a solver returns: the GPU of each rank and, for exact solvers, a proof."""

    gpus: np.ndarray
    optimal: bool | None = None
    bound: float | None = None
    #: The solver that actually ran (``auto`` names its choice).
    solver: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def gpu_peak_tflops(model: str) -> float | None:
    """Dense BF16 (FP16 where there is no BF16) peak TFLOPS of a GPU model name, from the
    table in ``rust/core/src/gpu.rs`` (each row cites its datasheet); None if unknown."""
    return _core.gpu_peak_tflops(model)


def peak_of_gpus(topology: Topology, gpus: Any) -> tuple[float, str]:
    """The peak (TFLOPS) a synchronous job on ``gpus`` runs at: the slowest host type's (a
    type's ``peak_tflops``, else its ``gpu_model`` in the table), with the model it came from.
    Raises InvalidTopology naming the host type when a type has neither."""
    if len(topology._type_names) == 1:  # one host type: no need to look at the GPUs
        used = np.zeros(1, dtype=np.int64)
    else:
        used = np.unique(topology._type_of_gpu[np.asarray(gpus, dtype=np.int64)])
    best: tuple[float, str] | None = None
    for t in sorted(topology._type_names[int(i)] for i in used):
        nt = topology.node_types[t]
        peak = nt.peak_tflops
        if peak is None and nt.gpu_model:
            peak = gpu_peak_tflops(nt.gpu_model)
        if peak is None:
            raise InvalidTopology(
                f"{topology.name}: node_types.{t}: the GPU peak is unknown "
                f"(gpu_model {nt.gpu_model!r} is not in the peak table); give peak_tflops"
            )
        if best is None or peak < best[0]:
            best = (float(peak), nt.gpu_model or t)
    assert best is not None
    return best


def step_details(
    topology: Topology, job: Job, gpus: Any, spec: _core.JobSpec, raw: _core.CostReport
) -> dict[str, Any]:
    """The rest of the core's step report for :class:`gpuplace.CostReport` ``step_details``:
    bubble, exposed time per class, the peak and the GPU model it came from, the FLOPs; or
    ``{"unavailable": reason}`` when the job declares compute but the GPU peak of a host type
    it uses is unknown; ``{}`` when the job declares no compute."""
    if raw.step_seconds is None:
        if step_args(job) is None:
            return {}
        try:
            peak_of_gpus(topology, gpus)
        except InvalidTopology as exc:
            # Comm costs stay available; the step needs the GPU's peak.
            return {"unavailable": str(exc)}
        return {}
    ft = flops_and_tokens(job)
    exposed = raw.exposed_class_seconds or []
    return {
        "bubble_seconds": raw.bubble_seconds,
        "exposed_class_seconds": dict(zip(spec.class_names, exposed, strict=True)),
        "peak_tflops": raw.peak_tflops,
        "gpu_model": peak_of_gpus(topology, gpus)[1],
        "flops_per_step": None if ft is None else ft[0],
        # Storage in the step (rust/core/src/storage.rs, step_with_io): input reads prefetched
        # under the step, the part of them longer than it, checkpoint writes per step.
        "input_seconds": raw.input_seconds,
        "input_stall_seconds": raw.input_stall_seconds,
        "checkpoint_seconds": raw.checkpoint_seconds,
    }


def cost_report(
    topology: Topology,
    job: Job,
    gpus: Any,
    spec: _core.JobSpec,
    raw: _core.CostReport,
) -> CostReport:
    """The core's one report (``_core.CostReport``: the cost model's verdict, the contention
    with the running jobs and the storage seconds, priced in one call) as a
    :class:`CostReport`, named in the words of the topology and the job when read."""
    return _CoreCostReport._of(raw, topology, job, gpus, spec)


class _CoreCostReport(CostReport):
    """A :class:`CostReport` that reads the core's report: the numbers stay in the core's
    object, and the named fields (level, class and uplink names, the step details) are made
    once, when first read. A placement nobody inspects (a scheduler's place + allocate) pays
    for no names. Copies, ``dataclasses.replace`` and pickles are plain :class:`CostReport`
    objects with the same fields."""

    _raw: _core.CostReport
    _source: tuple[Topology, Job, Any, _core.JobSpec]
    _named: dict[str, Any]

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # dataclasses.replace() and copies construct from the fields: give a plain report.
        return CostReport(*args, **kwargs)

    @classmethod
    def _of(
        cls,
        raw: _core.CostReport,
        topology: Topology,
        job: Job,
        gpus: Any,
        spec: _core.JobSpec,
    ) -> _CoreCostReport:
        made: _CoreCostReport = object.__new__(cls)
        # Set in the instance's dict directly (the class is frozen): one report per placement.
        made.__dict__.update(_raw=raw, _source=(topology, job, gpus, spec), _named={})
        return made

    def _field(self, name: str) -> Any:
        """The named field ``name``, made on its first read (each on its own: a simulator
        that reads the bytes per level and the step's peak pays for no uplink or class
        names)."""
        named = self._named
        value = named.get(name, _UNSET)
        if value is _UNSET:
            value = named[name] = _NAMED[name](self._raw, *self._source)
        return value

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(CostReport))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return CostReport, self._values()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CostReport):
            return NotImplemented
        return self._values() == tuple(
            getattr(other, f.name) for f in dataclasses.fields(CostReport)
        )

    __hash__ = CostReport.__hash__

    @property
    def peak_tflops(self) -> float | None:
        # Read from the core's report, without naming the rest of the step details.
        raw = self._raw
        return None if raw.step_seconds is None else raw.peak_tflops

    def __repr__(self) -> str:
        return repr(CostReport(*self._values()))


_UNSET = object()


def _read(name: str) -> property:
    """A field read from the core's report as it is."""
    return property(lambda self: getattr(self._raw, name))


#: How each named field of a :class:`_CoreCostReport` is made from the core's report and the
#: placement's topology, job, GPUs and compiled job (whose class names are read only when
#: a field names classes).
_NAMED: dict[str, Callable[[_core.CostReport, Topology, Job, Any, _core.JobSpec], Any]] = {
    "class_seconds": lambda raw, topo, job, gpus, spec: dict(
        zip(spec.class_names, raw.class_seconds, strict=True)
    ),
    "bytes_by_level": lambda raw, topo, job, gpus, spec: dict(
        zip(topo.level_names, raw.bytes_by_level.tolist(), strict=True)
    ),
    "span_level": lambda raw, topo, job, gpus, spec: (
        None if raw.span_level is None else topo.level_names[raw.span_level]
    ),
    "violations": lambda raw, topo, job, gpus, spec: raw.violations,
    "nvlink_level": lambda raw, topo, job, gpus, spec: topo.level_names[topo.nvlink_level],
    "step_details": lambda raw, topo, job, gpus, spec: step_details(topo, job, gpus, spec, raw),
    "class_algorithms": lambda raw, topo, job, gpus, spec: dict(
        zip(spec.class_names, raw.class_algorithms, strict=True)
    ),
    "hot_uplinks": lambda raw, topo, job, gpus, spec: hot_uplinks(topo, raw.hot_uplinks),
}


def _name(name: str) -> property:
    """A field named in the topology's and the job's words, made on first read."""
    return property(lambda self: self._field(name))


for _field in dataclasses.fields(CostReport):
    _direct = _field.name in (
        "comm_seconds",
        "traffic_seconds",
        "confinement_ok",
        "step_seconds",
        "exposed_comm_seconds",
        "compute_seconds",
        "mfu",
        "tokens_per_second",
        "alone_seconds",
        "io_seconds",
        "input_seconds",
        "input_stall_seconds",
        "checkpoint_seconds",
    )
    setattr(_CoreCostReport, _field.name, (_read if _direct else _name)(_field.name))
