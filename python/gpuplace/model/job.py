"""Distributed jobs: parallel layout, communication per step, and placement constraints.

A :class:`Job` is a gang of ``tp * cp * ep * dp * pp`` ranks. Its communication is either
given per dimension (``communication``), derived from a transformer description (``model``)
with the standard formulas below, or given as an explicit traffic matrix (``traffic``). It
compiles, per topology, into the arrays the Rust core solves over (:meth:`Job.compile`).

Transformer formulas (bytes per rank per call, calls per step), with ``b`` micro-batch size,
``s`` sequence length, ``h`` hidden size, ``e`` bytes per element, ``L`` layers, ``m``
micro-batches per step and ``P`` parameters:

* tp, all-reduce of ``b*(s/cp)*h*e`` bytes, ``4 * L/pp * m`` calls: two all-reduces in the
  forward and two in the backward pass of every layer (Shoeybi et al., "Megatron-LM", 2019,
  section 3; Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", SC21, section 3.2). Sequence parallelism replaces each with a
  reduce-scatter and an all-gather of the same total volume (Korthikanti et al., 2022).
* cp, all-gather of the keys and values, ``2*b*s*h*e/tp`` bytes, ``2 * L/pp * m`` calls
  (forward all-gather, backward reduce-scatter; ring attention as in Megatron-Core context
  parallelism, without grouped-query attention).
* ep, all-to-all of ``b*(s/cp)*h*e*top_k`` bytes, ``4 * L/pp * m`` calls (token dispatch and
  combine, forward and backward, every layer an MoE layer; GShard, Lepikhin et al. 2020).
* pp, point-to-point of ``b*(s/cp)*h*e/tp`` bytes between neighbouring stages, ``2 * m * v``
  calls (activations forward, gradients backward; with the scatter/gather optimisation of SC21
  section 4.1), ``v`` the model chunks per pipeline rank of an interleaved schedule (1 for
  1F1B): each chunk sends its own activations and gradients, so interleaving multiplies the
  sends by ``v`` (SC21 section 2.2.2). The schedule also sets the pipeline bubble
  (``rust/core/src/pipeline.rs``): ``pipeline_schedule`` is ``1f1b`` (Megatron's default,
  ``virtual_stages`` 1), ``interleaved-1f1b`` (Megatron's interleaved schedule, ``virtual_stages``
  >= 2, micro-batches a multiple of pp) or ``llama3`` (Dubey et al. 2024, section 3.3.2:
  interleaved, any number of micro-batches).
* dp, all-reduce of the gradients, ``P * grad_bytes / (tp*pp)`` bytes, once per step (the
  distributed optimizer's reduce-scatter + all-gather moves the same volume). For a mixture of
  experts with ``experts`` routed experts of which ``top_k`` are active, the expert weights
  are split over the ep ranks (each holds ``experts/ep`` of them; Megatron-Core's expert
  parallelism, DeepSpeed-MoE), so a rank reduces ``(P_dense + P_expert/ep) * grad_bytes /
  (tp*pp)``, where ``P_expert = (P - P_active) * experts / (experts - top_k)`` and ``P_dense =
  P - P_expert`` follow from the total and active parameter counts (Mixtral 8x7B: 46.7B total,
  12.9B active, 8 experts, top-2 gives 45.1B of expert and 1.6B of shared weights).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core
from gpuplace._util.documents import Checker, read_document
from gpuplace.errors import InvalidJob, InvalidTopology
from gpuplace.model.policy import JobPolicy
from gpuplace.model.power import JobPower, parse_job_power
from gpuplace.model.step import StepOptions, step_args
from gpuplace.model.storage import DataAccess, parse_data

if TYPE_CHECKING:
    from gpuplace.model.topology import Topology

__all__ = ["DIMENSIONS", "KINDS", "Communication", "Job", "TransformerModel"]

#: Parallel dimensions in Megatron's default rank order (tp fastest, pp slowest).
DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")
#: Collective kinds, as the core names them (the core defines them once).
KINDS: tuple[str, ...] = tuple(k.label for k in _core.CollectiveKind.members())
#: The most ranks a job may have: larger than any cluster, small enough to compile.
MAX_RANKS = 1 << 22
#: Pipeline schedules (``model.pipeline_schedule``; see ``rust/core/src/pipeline.rs``).
PIPELINE_SCHEDULES = ("1f1b", "interleaved-1f1b", "llama3")
_DEFAULT_KIND = {
    "tp": "all-reduce",
    "cp": "all-gather",
    "ep": "all-to-all",
    "dp": "all-reduce",
    "pp": "p2p",
}


@dataclass(frozen=True)
class Elastic:
    """A range of one degree (``dim`` in ``[low, high]``; the job's own degree is ``high``)
    and layout alternatives (each a job, possibly with its own range)."""

    dim: str | None = None
    low: int = 1
    high: int = 1
    alternatives: tuple[Job, ...] = ()

    def sizes(self) -> range:
        return range(self.high, self.low - 1, -1)


def parse_degree(c: Checker, value: Any, path: str, maximum: int) -> tuple[int, int] | None:
    """A ``{min: a, max: b}`` range (returns (a, b)), or None for a plain degree."""
    if not isinstance(value, Mapping):
        return None
    entry = c.mapping(value, path)
    c.keys(entry, path, {"min", "max"})
    low = c.integer(entry.get("min"), f"{path}.min", minimum=1, maximum=maximum)
    high = c.integer(entry.get("max"), f"{path}.max", minimum=1, maximum=maximum)
    if low > high:
        raise c.fail(path, f"min ({low}) is above max ({high})")
    return low, high


@dataclass(frozen=True)
class Communication:
    """One dimension's traffic: ``count`` calls per step of ``kind``, ``bytes`` per rank."""

    kind: str
    bytes: float
    count: float = 1.0


@dataclass(frozen=True)
class TransformerModel:
    """A transformer, for deriving bytes per step (see the module docstring)."""

    parameters: float
    layers: int
    hidden_size: int
    sequence_length: int
    micro_batch_size: int = 1
    micro_batches: int = 1
    bytes_per_element: float = 2.0
    grad_bytes_per_element: float | None = None
    moe_top_k: int = 2
    #: Parameters active per token (mixture of experts); None: all of ``parameters``.
    active_parameters: float | None = None
    #: Routed experts per MoE layer; with ``active_parameters``, the expert weights are split
    #: over the ep ranks in the gradient all-reduce. None: every weight on every ep rank.
    experts: int | None = None
    #: Pipeline schedule (one of :data:`PIPELINE_SCHEDULES`) and model chunks per pipeline
    #: rank; the default is Megatron-LM's, non-interleaved 1F1B.
    pipeline_schedule: str = "1f1b"
    virtual_stages: int = 1

    def __post_init__(self) -> None:
        problem = _schedule_problem(self.pipeline_schedule, self.virtual_stages)
        if problem is not None:
            raise InvalidJob(problem)
        if self.experts is not None:
            if self.active_parameters is None:
                raise InvalidJob("model.experts: needs model.active_parameters as well")
            if self.experts <= self.moe_top_k:
                raise InvalidJob(
                    f"model.experts: expected more than moe_top_k ({self.moe_top_k}) experts, "
                    f"got {self.experts}"
                )
        if self.active_parameters is not None and self.active_parameters > self.parameters:
            raise InvalidJob(
                f"model.active_parameters: expected at most parameters ({self.parameters:.4g}), "
                f"got {self.active_parameters:.4g}"
            )

    @property
    def expert_parameters(self) -> float:
        """Parameters in routed experts (0 for a dense model): the inactive ones are
        ``experts - top_k`` of ``experts`` expert blocks, so the experts hold
        ``(parameters - active) * experts / (experts - top_k)``."""
        if self.experts is None or self.active_parameters is None:
            return 0.0
        inactive = self.parameters - self.active_parameters
        return min(self.parameters, inactive * self.experts / (self.experts - self.moe_top_k))

    def communication(
        self, tp: int, cp: int, ep: int, dp: int, pp: int
    ) -> dict[str, Communication]:
        b, s, h, e = (
            self.micro_batch_size,
            self.sequence_length,
            self.hidden_size,
            self.bytes_per_element,
        )
        layers_per_stage = self.layers / pp
        m = self.micro_batches
        activation = b * (s / cp) * h * e
        grad_e = self.grad_bytes_per_element or e
        out: dict[str, Communication] = {}
        if tp > 1:
            out["tp"] = Communication("all-reduce", activation, 4 * layers_per_stage * m)
        if cp > 1:
            out["cp"] = Communication(
                "all-gather", 2 * b * s * h * e / tp, 2 * layers_per_stage * m
            )
        if ep > 1:
            out["ep"] = Communication(
                "all-to-all", activation * self.moe_top_k, 4 * layers_per_stage * m
            )
        if pp > 1:
            out["pp"] = Communication("p2p", activation / tp, 2 * m * self.virtual_stages)
        if dp > 1:
            expert = self.expert_parameters
            per_rank = (self.parameters - expert) + expert / ep
            out["dp"] = Communication("all-reduce", per_rank * grad_e / (tp * pp), 1)
        return out


@dataclass(frozen=True)
class Job:
    """A gang-scheduled distributed job.

    ``confine`` maps a dimension to the level its groups must stay inside (a level name of the
    topology, or ``nvlink_domain`` / ``node``); by default every tp group stays inside one
    NVLink domain. ``max_span`` is the highest level the whole job may span (None: anywhere).
    """

    name: str
    tp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1
    rank_order: tuple[str, ...] = DIMENSIONS
    communication: Mapping[str, Communication] = field(default_factory=dict)
    model: TransformerModel | None = None
    #: Explicit traffic as (src rank, dst rank, bytes per step) rows, for jobs without layout.
    traffic: np.ndarray | None = None
    traffic_ranks: int | None = None
    confine: Mapping[str, str] = field(default_factory=lambda: {"tp": "nvlink_domain"})
    max_span: str | None = None
    #: Per-GPU draw and synchronised peaks (``gpuplace.cluster.power``); None: board power, unsynced.
    power: JobPower | None = None
    #: Dataset reads and checkpoint writes (``gpuplace.model.storage``).
    data: DataAccess | None = None
    #: Pool, priority class and hardware rules (``gpuplace.policy``); None: no restriction.
    policy: JobPolicy | None = None
    #: A degree range and layout alternatives (``gpuplace.placement.elastic``); None: a fixed layout.
    elastic: Elastic | None = None
    #: Compute per step and overlap, for step time and MFU (``gpuplace.model.step``).
    step: StepOptions | None = None

    def __post_init__(self) -> None:
        c = Checker(InvalidJob, None)
        if not isinstance(self.name, str) or not self.name:
            raise InvalidJob("name: expected a non-empty string")
        for d in DIMENSIONS:
            c.integer(getattr(self, d), d, minimum=1, maximum=MAX_RANKS)
        if self.gpus > MAX_RANKS:
            raise InvalidJob(
                f"the job needs {self.gpus:.3g} GPUs (one per rank); "
                f"at most {MAX_RANKS} per job are supported"
            )
        if sorted(self.rank_order) != sorted(DIMENSIONS):
            raise InvalidJob(
                f"rank_order: expected an order of {', '.join(DIMENSIONS)}, got {list(self.rank_order)}"
            )
        for d, comm in self.communication.items():
            if d not in DIMENSIONS:
                raise InvalidJob(
                    f"communication.{d}: not a parallel dimension ({', '.join(DIMENSIONS)})"
                )
            if comm.kind not in KINDS:
                raise InvalidJob(
                    f"communication.{d}.kind: expected one of {', '.join(KINDS)}, got {comm.kind!r}"
                )
        for d in self.confine:
            if d not in DIMENSIONS:
                raise InvalidJob(
                    f"constraints.confine.{d}: not a parallel dimension ({', '.join(DIMENSIONS)})"
                )
        if self.traffic is not None:
            if any(getattr(self, d) > 1 for d in DIMENSIONS):
                raise InvalidJob(
                    "traffic: give either parallel degrees or a traffic matrix, not both"
                )
            if self.traffic_ranks is None or self.traffic_ranks < 1:
                raise InvalidJob("traffic: the number of ranks must be >= 1")

    # ----------------------------------------------------------------- shape
    @property
    def gpus(self) -> int:
        """Number of ranks (one GPU each)."""
        if self.traffic is not None and self.traffic_ranks is not None:
            return self.traffic_ranks
        return self.tp * self.cp * self.ep * self.dp * self.pp

    @property
    def degrees(self) -> dict[str, int]:
        return {d: getattr(self, d) for d in DIMENSIONS}

    def resolved_communication(self) -> dict[str, Communication]:
        """Per-dimension traffic: explicit entries win over the model's derived ones."""
        derived = (
            self.model.communication(self.tp, self.cp, self.ep, self.dp, self.pp)
            if self.model
            else {}
        )
        derived.update(self.communication)
        return {d: c for d, c in derived.items() if getattr(self, d) > 1}

    def rank_groups(self, dim: str) -> np.ndarray:
        """Ranks of every group of one dimension, shape (groups, degree), from the core's
        rank layout (rank order: the first dimension of ``rank_order`` fastest)."""
        sizes = [getattr(self, d) for d in self.rank_order]
        return _core.rank_groups(sizes, self.rank_order.index(dim))

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_traffic(cls, name: str, traffic: Any, **kwargs: Any) -> Job:
        """A job given by its traffic matrix (bytes per step from rank i to rank j): a dense
        square array, a scipy.sparse matrix, or (src, dst, bytes) rows with ``ranks=N``."""
        ranks = kwargs.pop("ranks", None)
        rows = _traffic_rows(traffic, ranks)
        n = ranks if ranks is not None else _square_size(traffic)
        kwargs.setdefault("confine", {})
        return cls(name=name, traffic=rows, traffic_ranks=n, **kwargs)

    @classmethod
    def from_dict(cls, document: Any, *, source: str | None = None) -> Job:
        """Build from the job file form (see ``docs/job-format.md``), validating every field."""
        c = Checker(InvalidJob, source)
        doc = c.mapping(document, "")
        c.keys(
            doc,
            "",
            {
                "name",
                "parallelism",
                "rank_order",
                "model",
                "communication",
                "traffic",
                "constraints",
                "power",
                "data",
                "checkpoint",
                "policy",
                "alternatives",
                "step",
            },
        )
        name = c.string(doc.get("name"), "name")
        par = c.mapping(doc.get("parallelism", {}), "parallelism")
        c.keys(par, "parallelism", set(DIMENSIONS))
        ranges = {
            d: r
            for d in DIMENSIONS
            if (r := parse_degree(c, par.get(d), f"parallelism.{d}", MAX_RANKS)) is not None
        }
        if len(ranges) > 1:
            raise c.fail("parallelism", "at most one dimension may be a {min, max} range")
        degrees = {
            d: ranges[d][1]
            if d in ranges
            else c.integer(par.get(d, 1), f"parallelism.{d}", minimum=1, maximum=MAX_RANKS)
            for d in DIMENSIONS
        }
        kwargs: dict[str, Any] = dict(degrees)
        if "rank_order" in doc:
            order = [
                c.string(v, f"rank_order[{i}]")
                for i, v in enumerate(c.sequence(doc["rank_order"], "rank_order"))
            ]
            if sorted(order) != sorted(DIMENSIONS):
                raise c.fail(
                    "rank_order", f"expected an order of {', '.join(DIMENSIONS)}, got {order}"
                )
            kwargs["rank_order"] = tuple(order)
        if "model" in doc:
            model = kwargs["model"] = _model(c, doc["model"])
            pp = degrees["pp"]
            if model.pipeline_schedule == "interleaved-1f1b" and model.micro_batches % pp:
                # Megatron-LM's interleaved schedule (SC21 section 2.2.2); llama3 lifts it.
                raise c.fail(
                    "model.micro_batches",
                    f"interleaved-1f1b needs a multiple of pp ({pp}), got "
                    f"{model.micro_batches} (the llama3 schedule takes any number)",
                )
            # Every chunk holds at least one layer (llama3's first and last chunks may hold
            # only the embedding and the loss: two more chunks than layers).
            spare = 2 if model.pipeline_schedule == "llama3" else 0
            if pp * model.virtual_stages > model.layers + spare:
                raise c.fail(
                    "model.virtual_stages",
                    f"{model.virtual_stages} chunks on each of {pp} pipeline ranks need at least "
                    f"{pp * model.virtual_stages - spare} layers, the model has {model.layers}",
                )
        if "communication" in doc:
            comm = {}
            for d, raw in c.mapping(doc["communication"], "communication").items():
                p = f"communication.{d}"
                if d not in DIMENSIONS:
                    raise c.fail(p, f"not a parallel dimension ({', '.join(DIMENSIONS)})")
                entry = c.mapping(raw, p)
                c.keys(entry, p, {"kind", "bytes", "count"})
                kind = c.string(entry.get("kind", _DEFAULT_KIND[d]), f"{p}.kind")
                if kind not in KINDS:
                    raise c.fail(f"{p}.kind", f"expected one of {', '.join(KINDS)}, got {kind!r}")
                if kind == "p2p" and d != "pp":
                    raise c.fail(f"{p}.kind", "p2p traffic is defined between pipeline stages only")
                comm[d] = Communication(
                    kind,
                    c.number(entry.get("bytes"), f"{p}.bytes", minimum=0.0),
                    c.number(entry.get("count", 1), f"{p}.count", minimum=0.0),
                )
            kwargs["communication"] = comm
        if doc.get("step") is not None:
            kwargs["step"] = StepOptions.from_dict(c, doc["step"])
        constraints = c.mapping(doc.get("constraints", {}), "constraints")
        c.keys(constraints, "constraints", {"confine", "max_span"})
        if "confine" in constraints:
            conf = c.mapping(constraints["confine"], "constraints.confine")
            for d, lv in conf.items():
                if d not in DIMENSIONS:
                    raise c.fail(
                        f"constraints.confine.{d}",
                        f"not a parallel dimension ({', '.join(DIMENSIONS)})",
                    )
                c.string(lv, f"constraints.confine.{d}")
            kwargs["confine"] = dict(conf)
        if constraints.get("max_span") is not None:
            kwargs["max_span"] = c.string(constraints["max_span"], "constraints.max_span")
        if "traffic" in doc:
            if any(v > 1 for v in degrees.values()):
                raise c.fail("traffic", "give either parallelism or a traffic matrix, not both")
            t = c.mapping(doc["traffic"], "traffic")
            c.keys(t, "traffic", {"ranks", "matrix", "edges"})
            if ("matrix" in t) == ("edges" in t):
                raise c.fail("traffic", "expected exactly one of matrix or edges")
            if "matrix" in t:
                rows = c.sequence(t["matrix"], "traffic.matrix")
                n = len(rows)
                values = []
                for i, row in enumerate(rows):
                    cells = c.sequence(row, f"traffic.matrix[{i}]")
                    if len(cells) != n:
                        raise c.fail(
                            f"traffic.matrix[{i}]",
                            f"expected {n} entries (a square matrix), got {len(cells)}",
                        )
                    values.append(
                        [
                            c.number(v, f"traffic.matrix[{i}][{j}]", minimum=0.0)
                            for j, v in enumerate(cells)
                        ]
                    )
                if n == 0:
                    raise c.fail("traffic.matrix", "expected at least one row")
                kwargs["traffic"] = _traffic_rows(np.array(values, dtype=np.float64), None)
                kwargs["traffic_ranks"] = n
            else:
                n = c.integer(t.get("ranks"), "traffic.ranks", minimum=1, maximum=MAX_RANKS)
                edges = []
                for i, e in enumerate(c.sequence(t["edges"], "traffic.edges")):
                    row = c.sequence(e, f"traffic.edges[{i}]")
                    if len(row) != 3:
                        raise c.fail(f"traffic.edges[{i}]", "expected [src, dst, bytes]")
                    a = c.integer(row[0], f"traffic.edges[{i}][0]", minimum=0)
                    b = c.integer(row[1], f"traffic.edges[{i}][1]", minimum=0)
                    if a >= n or b >= n:
                        raise c.fail(f"traffic.edges[{i}]", f"ranks must be < traffic.ranks ({n})")
                    edges.append((a, b, c.number(row[2], f"traffic.edges[{i}][2]", minimum=0.0)))
                kwargs["traffic"] = np.array(edges, dtype=np.float64).reshape(-1, 3)
                kwargs["traffic_ranks"] = n
            kwargs.setdefault("confine", {})
        if doc.get("power") is not None:
            kwargs["power"] = parse_job_power(c, doc["power"])
        access = parse_data(c, doc.get("data"), doc.get("checkpoint"))
        if access is not None:
            kwargs["data"] = access
        if "policy" in doc:
            kwargs["policy"] = JobPolicy.from_dict(doc["policy"], c)
        alternatives = []
        for i, raw in enumerate(c.sequence(doc.get("alternatives", []), "alternatives")):
            p = f"alternatives[{i}]"
            alt = c.mapping(raw, p)
            c.keys(alt, p, {"parallelism", "rank_order", "model", "communication", "constraints"})
            base = {k: v for k, v in doc.items() if k not in ("alternatives", *alt)}
            where = f"{source}: {p}" if source else p
            alternatives.append(Job.from_dict({**base, **alt}, source=where))
        if ranges or alternatives:
            dim = next(iter(ranges), None)
            low, high = ranges[dim] if dim else (1, 1)
            kwargs["elastic"] = Elastic(dim, low, high, tuple(alternatives))
        try:
            return cls(name=name, **kwargs)
        except InvalidJob as exc:
            raise c.fail("", str(exc)) from None

    @classmethod
    def load(cls, path: str | Path) -> Job:
        """Read a job file (YAML, or JSON for ``.json``)."""
        return cls.from_dict(read_document(path, InvalidJob), source=str(path))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.traffic is not None:
            out["traffic"] = {
                "ranks": self.gpus,
                "edges": [[int(a), int(b), float(t)] for a, b, t in self.traffic],
            }
        else:
            out["parallelism"] = {d: v for d, v in self.degrees.items() if v > 1} or {"tp": 1}
            if self.rank_order != DIMENSIONS:
                out["rank_order"] = list(self.rank_order)
            if self.model is not None:
                out["model"] = {
                    k: v
                    for k, v in self.model.__dict__.items()
                    if v is not None
                    and not (k in _PIPELINE_DEFAULTS and v == _PIPELINE_DEFAULTS[k])
                }
            if self.communication:
                out["communication"] = {
                    d: {"kind": cm.kind, "bytes": cm.bytes, "count": cm.count}
                    for d, cm in self.communication.items()
                }
        if self.step is not None and self.step.to_dict():
            out["step"] = self.step.to_dict()
        constraints: dict[str, Any] = {"confine": dict(self.confine)}
        if self.max_span is not None:
            constraints["max_span"] = self.max_span
        out["constraints"] = constraints
        if self.power is not None:
            out["power"] = self.power.to_dict()
        if self.data is not None:
            out.update(self.data.to_dict())
        if self.policy is not None and self.policy.to_dict():
            out["policy"] = self.policy.to_dict()
        if self.elastic is not None:
            if self.elastic.dim is not None:
                out["parallelism"][self.elastic.dim] = {
                    "min": self.elastic.low,
                    "max": self.elastic.high,
                }
            if self.elastic.alternatives:
                out["alternatives"] = [
                    {k: v for k, v in alt.to_dict().items() if k not in ("name", "policy")}
                    for alt in self.elastic.alternatives
                ]
        return out

    # ----------------------------------------------------------------- compilation
    def compile(self, topology: Topology) -> _core.JobSpec:
        """The arrays the core solves over, for one topology (cached per topology).

        Jobs that declare the same layout, communication, model, step and constraints compile
        to the same arrays whatever their names (the core's compiled job holds no name), so
        a scheduler placing many jobs of a few shapes compiles each shape once per topology:
        the spec is shared through a per-topology cache keyed by that content (see
        :meth:`_content_key`). A job given by a traffic matrix is cached per job only."""
        # The last topology's spec first (a job placed and allocated on one cluster asks for
        # it twice per placement), then the shared cache, then the job's own cache. The
        # instance's dict is read and written directly (the class is frozen), once.
        own = self.__dict__
        last: tuple[weakref.ref[Topology], _core.JobSpec] | None = own.get("_last_compiled")
        if last is not None and last[0]() is topology:
            return last[1]
        key = self._content_key()
        spec: _core.JobSpec | None = None
        if key is not None:
            shared = _SHARED_SPECS.get(topology)
            if shared is None:
                shared = _SHARED_SPECS[topology] = _SpecCache()
            try:
                spec = shared.specs.get(key)
            except TypeError:  # an unhashable field: this job's own cache
                pass
            else:
                if spec is None:
                    spec = shared.put(key, self._compile(topology))
        if spec is None:
            cache: weakref.WeakKeyDictionary[Topology, _core.JobSpec] | None = own.get("_compiled")
            if cache is None:
                cache = own["_compiled"] = weakref.WeakKeyDictionary()
            spec = cache.get(topology)
            if spec is None:
                spec = cache[topology] = self._compile(topology)
        own["_last_compiled"] = (weakref.ref(topology), spec)
        return spec

    def _content_key(self) -> tuple[Any, ...] | None:
        """Everything :meth:`_compile` reads but the name, as a hashable key, or None when the
        job cannot share its compiled arrays: a traffic matrix, a degree that is not a plain
        ``int`` (``8.0`` passes the checks but is refused by the core, where ``8`` is not,
        and both are equal as keys). A key with an unhashable field is not shared either
        (:meth:`compile` finds out when it looks the key up)."""
        tp, cp, ep, dp, pp = self.tp, self.cp, self.ep, self.dp, self.pp
        plain = type(tp) is int and type(cp) is int and type(ep) is int and type(dp) is int
        if self.traffic is not None or not plain or type(pp) is not int:
            return None
        m, st, comm = self.model, self.step, self.communication
        return (
            type(self),
            tp,
            cp,
            ep,
            dp,
            pp,
            tuple(self.rank_order),
            tuple(comm.items()) if comm else (),
            # The model's counts the core takes as integers, with their types (as for the
            # degrees), then every field by value.
            None if m is None else (m, type(m), type(m.micro_batches), type(m.virtual_stages)),
            None
            if st is None
            else (
                type(st),
                st.flops_per_step,
                st.tokens_per_step,
                st.efficiency,
                st.backward_fraction,
                tuple(st.overlap.items()),
            ),
            tuple(self.confine.items()),
            self.max_span,
        )

    def _level(self, topology: Topology, name: str, what: str) -> int:
        try:
            return topology.level_index(name)
        except InvalidTopology:
            raise InvalidJob(
                f"{self.name}: {what}: {name!r} is not a level of {topology.name} "
                f"(levels: {', '.join(topology.level_names)}, or nvlink_domain)"
            ) from None

    def _declaration(
        self,
    ) -> tuple[list[str], list[int], list[str | None], list[float], list[float]]:
        """Dimensions in rank order with their degree and communication (kind, bytes, count)."""
        if self.traffic is not None:
            return [], [], [], [], []
        comm = self.resolved_communication()
        dims = list(self.rank_order)
        kinds = [comm[d].kind if d in comm else None for d in dims]
        return (
            dims,
            [getattr(self, d) for d in dims],
            kinds,
            [comm[d].bytes if d in comm else 0.0 for d in dims],
            [comm[d].count if d in comm else 0.0 for d in dims],
        )

    def _compile(self, topology: Topology) -> _core.JobSpec:
        """Pass the declaration to the core, which builds the groups, collectives, class names
        and rank layout (and refuses a job larger than the cluster)."""
        max_span = (
            len(topology.levels) - 1
            if self.max_span is None
            else self._level(topology, self.max_span, "constraints.max_span")
        )
        dims, sizes, kinds, nbytes, counts = self._declaration()
        confine = [
            self._level(topology, self.confine[d], f"constraints.confine.{d}")
            if d in self.confine
            else -1
            for d in dims
        ]
        traffic = self.traffic if self.traffic is not None else np.zeros((0, 3))
        return _core.JobSpec(
            topology._core,
            self.name,
            self.gpus,
            dims,
            sizes,
            confine,
            kinds,
            nbytes,
            counts,
            max_span,
            np.ascontiguousarray(traffic[:, 0], dtype=np.int64),
            np.ascontiguousarray(traffic[:, 1], dtype=np.int64),
            np.ascontiguousarray(traffic[:, 2], dtype=np.float64),
            step_args(self),
        )

    def class_names(self) -> list[str]:
        """Names of the collective classes, in the order of ``CostReport.class_seconds`` (the
        core names and orders them)."""
        dims, sizes, kinds, _, _ = self._declaration()
        return _core.class_names(dims, sizes, kinds)


def _model(c: Checker, raw: Any) -> TransformerModel:
    m = c.mapping(raw, "model")
    fields = {
        "parameters",
        "layers",
        "hidden_size",
        "sequence_length",
        "micro_batch_size",
        "micro_batches",
        "bytes_per_element",
        "grad_bytes_per_element",
        "moe_top_k",
        "active_parameters",
        "experts",
        "pipeline_schedule",
        "virtual_stages",
    }
    c.keys(m, "model", fields)
    for required in ("parameters", "layers", "hidden_size", "sequence_length"):
        if required not in m:
            raise c.fail(f"model.{required}", "required")
    grad = m.get("grad_bytes_per_element")
    if m.get("experts") is not None and m.get("active_parameters") is None:
        raise c.fail("model.experts", "needs model.active_parameters as well")
    try:
        return _model_fields(c, m, grad)
    except InvalidJob as exc:  # the cross-field checks of TransformerModel, named in the file
        field_name, _, message = str(exc).partition(": ")
        raise c.fail(field_name, message) from None


def _model_fields(c: Checker, m: Mapping[str, Any], grad: Any) -> TransformerModel:
    return TransformerModel(
        parameters=c.number(m["parameters"], "model.parameters", positive=True),
        layers=c.integer(m["layers"], "model.layers", minimum=1),
        hidden_size=c.integer(m["hidden_size"], "model.hidden_size", minimum=1),
        sequence_length=c.integer(m["sequence_length"], "model.sequence_length", minimum=1),
        micro_batch_size=c.integer(
            m.get("micro_batch_size", 1), "model.micro_batch_size", minimum=1
        ),
        micro_batches=c.integer(m.get("micro_batches", 1), "model.micro_batches", minimum=1),
        bytes_per_element=c.number(
            m.get("bytes_per_element", 2), "model.bytes_per_element", positive=True
        ),
        grad_bytes_per_element=None
        if grad is None
        else c.number(grad, "model.grad_bytes_per_element", positive=True),
        moe_top_k=c.integer(m.get("moe_top_k", 2), "model.moe_top_k", minimum=1),
        active_parameters=None
        if m.get("active_parameters") is None
        else c.number(m["active_parameters"], "model.active_parameters", positive=True),
        experts=None
        if m.get("experts") is None
        else c.integer(m["experts"], "model.experts", minimum=2),
        pipeline_schedule=c.string(m.get("pipeline_schedule", "1f1b"), "model.pipeline_schedule"),
        virtual_stages=c.integer(
            m.get("virtual_stages", 1), "model.virtual_stages", minimum=1, maximum=1 << 16
        ),
    )


#: The pipeline fields' defaults (left out of ``to_dict``).
_PIPELINE_DEFAULTS: dict[str, Any] = {"pipeline_schedule": "1f1b", "virtual_stages": 1}


def _schedule_problem(schedule: Any, virtual_stages: Any) -> str | None:
    """Why a pipeline schedule and its chunks per rank do not go together, or None."""
    if schedule not in PIPELINE_SCHEDULES:
        return (
            f"model.pipeline_schedule: expected one of {', '.join(PIPELINE_SCHEDULES)}, "
            f"got {schedule!r}"
        )
    if (
        not isinstance(virtual_stages, int)
        or isinstance(virtual_stages, bool)
        or virtual_stages < 1
    ):
        return f"model.virtual_stages: expected an integer >= 1, got {virtual_stages!r}"
    if schedule == "1f1b" and virtual_stages != 1:
        return (
            f"model.virtual_stages: 1f1b runs one model chunk per pipeline rank, got "
            f"{virtual_stages} (interleaved-1f1b or llama3 interleave chunks)"
        )
    if schedule == "interleaved-1f1b" and virtual_stages < 2:
        return "model.virtual_stages: interleaved-1f1b needs at least 2 chunks per pipeline rank"
    return None


def _square_size(traffic: Any) -> int:
    shape = getattr(traffic, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != shape[1]:
        raise InvalidJob(
            "traffic: expected a square matrix, or (src, dst, bytes) rows with ranks=N"
        )
    return int(shape[0])


def _traffic_rows(traffic: Any, ranks: int | None) -> np.ndarray:
    """(src, dst, bytes) rows from a dense matrix, a scipy.sparse matrix or rows."""
    if hasattr(traffic, "tocoo"):
        coo = traffic.tocoo()
        if coo.shape[0] != coo.shape[1]:
            raise InvalidJob(f"traffic: expected a square matrix, got shape {coo.shape}")
        rows = np.stack([coo.row, coo.col, coo.data], axis=1).astype(np.float64)
    else:
        arr = np.asarray(traffic, dtype=np.float64)
        if ranks is None:
            n = _square_size(arr)
            src, dst = np.nonzero(arr)
            rows = np.stack([src, dst, arr[src, dst]], axis=1).astype(np.float64)
            del n
        else:
            if arr.ndim != 2 or arr.shape[1] != 3:
                raise InvalidJob("traffic: with ranks=N, expected (src, dst, bytes) rows")
            rows = arr
    if not np.all(np.isfinite(rows)) or np.any(rows[:, 2] < 0):
        raise InvalidJob("traffic: bytes must be finite and >= 0")
    rows = rows[(rows[:, 0] != rows[:, 1]) & (rows[:, 2] > 0)]
    return rows.reshape(-1, 3)


class _SpecCache:
    """Compiled jobs of one topology by content (:meth:`Job._content_key`). Bounded: past
    :data:`_SPEC_CACHE_RANKS` ranks of compiled arrays (a 16,384-rank job holds megabytes) or
    :data:`_SPEC_CACHE_ENTRIES` shapes it starts again empty."""

    __slots__ = ("ranks", "specs")

    def __init__(self) -> None:
        self.specs: dict[tuple[Any, ...], _core.JobSpec] = {}
        self.ranks = 0

    def get(self, key: tuple[Any, ...]) -> _core.JobSpec | None:
        return self.specs.get(key)

    def put(self, key: tuple[Any, ...], spec: _core.JobSpec) -> _core.JobSpec:
        ranks = spec.num_ranks
        if len(self.specs) >= _SPEC_CACHE_ENTRIES or self.ranks + ranks > _SPEC_CACHE_RANKS:
            self.specs.clear()
            self.ranks = 0
        self.specs[key] = spec
        self.ranks += ranks
        return spec


#: Bounds of the compiled jobs kept per topology (:class:`_SpecCache`).
_SPEC_CACHE_ENTRIES = 4096
_SPEC_CACHE_RANKS = 1 << 18

#: Topology -> its compiled jobs by content; an entry goes with its topology.
_SHARED_SPECS: weakref.WeakKeyDictionary[Topology, _SpecCache] = weakref.WeakKeyDictionary()
