"""Calibration: fit a topology's bandwidths, latencies and NVLS figures to measured collective
times, so that the one cost model (in the Rust core) reproduces real measurements.

``calibrate(topology, samples)`` takes ``(Job, gpus, seconds)`` samples, e.g. from
:meth:`gpuplace.io.NcclTestsRun.samples` or :func:`gpuplace.io.read_placement_table`, and returns
a new topology whose parameters minimise the squared log error of the predicted times
(``scipy.optimize.least_squares``, trust region reflective, bounded to a factor of e^6 either
way). Every prediction is the core's ``evaluate``: pricing never leaves the core. Fitted are:

* each level's ``bandwidth_gbps`` and ``latency_us`` that some sample's prediction depends on;
* each host type's ``nvls_gbps`` (the NVLS algorithm's bus bandwidth), where a sample uses it;
* the bandwidth efficiency of the tree and CollNet algorithms (``algorithm_efficiency`` in the
  topology format) relative to the ring, when samples run both the ring and that algorithm
  (the ring's bandwidth is the levels', NVLS's the host types' ``nvls_gbps``);
* the ``routing`` and ``qps_per_connection`` of each level above the hosts whose routing
  changes some sample's prediction (a level the samples' flows cross between domains, with
  uplinks): each of :data:`ROUTING_CANDIDATES` is tried there, the continuous parameters
  refitted for each, and the best kept (``routing=True``) or, by default (``"auto"``), kept
  only when it lowers the root-mean-square log error by at least 10 % against the routing the
  topology declares. Hash collisions grow with the flows a job sends across a level, so runs
  at several node counts of one cluster tell a hashed fabric from a slower balanced one; a
  single size sweep on one placement cannot (a lower bandwidth fits it as well). Whether a
  level's routing changes a prediction is judged at the parameters as given (a fabric far
  faster than the NVLink side may hide it);
* with ``host_count_factors=True``, or ``"auto"`` when the samples span at least three distinct
  host counts and the fit without them leaves a root-mean-square log error above 10 %, one
  factor per host count seen (``host_count_factors`` in the topology format): the documented
  correction for measurements whose structure the topology alone cannot produce.

Parameters no sample depends on are left as they are. :func:`calibration` returns the fitted
topology with the root-mean-square log errors and every routing tried (what ``gpuplace
calibrate`` prints); :func:`calibrate` the topology alone.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace.errors import InvalidJob, InvalidTopology
from gpuplace.model.topology import Topology as _Topology
from gpuplace.placement.place import evaluate

if TYPE_CHECKING:
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = [
    "ROUTING_CANDIDATES",
    "Calibration",
    "RoutingTrial",
    "calibrate",
    "calibration",
    "fitted_parameters",
    "routing_levels",
    "sample_errors",
]

Sample = tuple["Job", Any, float]
_MIN_LATENCY_US = 1e-3
_SPAN = 6.0  # log-space bound on each parameter's change
_AUTO_RMS = 0.10


def _checked(samples: Iterable[Sample], topology: Topology) -> list[tuple[Job, np.ndarray, float]]:
    out = []
    for i, sample in enumerate(samples):
        try:
            job, gpus, seconds = sample
        except (TypeError, ValueError):
            raise InvalidJob(f"samples[{i}]: expected (job, gpus, seconds)") from None
        seconds = float(seconds)
        if not (math.isfinite(seconds) and seconds > 0):
            raise InvalidJob(f"samples[{i}] ({job.name}): seconds must be > 0, got {seconds}")
        g = np.asarray(gpus, dtype=np.int64)
        evaluate(topology, job, g)  # validates the placement against the topology
        out.append((job, g, seconds))
    if not out:
        raise InvalidJob("calibrate: no samples")
    return out


def predict(topology: Topology, samples: list[tuple[Job, np.ndarray, float]]) -> np.ndarray:
    """The core's predicted seconds of every sample."""
    return np.array([evaluate(topology, job, g).comm_seconds for job, g, _ in samples])


def sample_errors(topology: Topology, samples: Iterable[Sample]) -> list[float]:
    """Relative error (predicted / measured - 1) of every sample."""
    checked = _checked(samples, topology)
    measured = np.array([s for _, _, s in checked])
    return [float(e) for e in predict(topology, checked) / measured - 1]


def fitted_parameters(before: Topology, after: Topology) -> list[dict[str, Any]]:
    """Every parameter calibration may fit, with its value before and after (None where a
    topology does not set it) and whether it changed: each level's ``bandwidth_gbps`` (GB/s)
    and ``latency_us`` (µs), the ``routing`` (a name) and ``qps_per_connection`` of the levels
    above the hosts that have uplinks, each host type's ``nvls_gbps``, the ``algorithm_efficiency`` of
    each algorithm and the ``host_count_factors``. Named as ``-p`` names them
    (``levels.leaf.bandwidth_gbps``)."""
    old, new = before.to_dict(), after.to_dict()
    rows: list[dict[str, Any]] = []

    def add(name: str, a: Any, b: Any) -> None:
        numbers = isinstance(a, (int, float)) and isinstance(b, (int, float))
        changed = a != b and not (numbers and math.isclose(a, b, rel_tol=1e-12))
        rows.append({"parameter": name, "before": a, "after": b, "changed": changed})

    top = len(before.levels) - 1
    first = max(before.nvlink_level, before.node_level + 1)
    for i, (lv_old, lv_new) in enumerate(zip(old["levels"], new["levels"], strict=True)):
        for key in ("bandwidth_gbps", "latency_us"):
            add(f"levels.{lv_old['name']}.{key}", lv_old[key], lv_new[key])
        if first <= i < top:
            add(
                f"levels.{lv_old['name']}.routing",
                lv_old.get("routing", "adaptive"),
                lv_new.get("routing", "adaptive"),
            )
            add(
                f"levels.{lv_old['name']}.qps_per_connection",
                lv_old.get("qps_per_connection", 1),
                lv_new.get("qps_per_connection", 1),
            )
    for name, nt in old["node_types"].items():
        a, b = nt.get("nvls_gbps"), new["node_types"].get(name, {}).get("nvls_gbps")
        if a is not None or b is not None:
            add(f"node_types.{name}.nvls_gbps", a, b)
    efficiency_old = old.get("algorithm_efficiency", {})
    efficiency_new = new.get("algorithm_efficiency", {})
    for algorithm in sorted(set(efficiency_old) | set(efficiency_new)):
        add(
            f"algorithm_efficiency.{algorithm}",
            efficiency_old.get(algorithm, 1.0),
            efficiency_new.get(algorithm, 1.0),
        )
    factors_old = list(old.get("host_count_factors", []))
    factors_new = list(new.get("host_count_factors", []))
    for k in range(max(len(factors_old), len(factors_new))):
        add(
            f"host_count_factors[{k}] ({k + 1} hosts)",
            factors_old[k] if k < len(factors_old) else None,
            factors_new[k] if k < len(factors_new) else None,
        )
    return rows


class _Params:
    """The fitted parameters as log values written into a topology dictionary."""

    def __init__(self, doc: dict[str, Any], factors: list[int], algorithms: Sequence[str]):
        self.doc = doc
        self.slots: list[tuple[str, Any, str]] = []
        for i, _ in enumerate(doc["levels"]):
            self.slots.append(("level", i, "bandwidth_gbps"))
            self.slots.append(("level", i, "latency_us"))
        for t, nt in doc["node_types"].items():
            if nt.get("nvls_gbps"):
                self.slots.append(("type", t, "nvls_gbps"))
        for a in algorithms:
            self.slots.append(("algorithm", a, ""))
        self.factor_hosts = factors
        for k in factors:
            self.slots.append(("factor", k, ""))

    def initial(self) -> np.ndarray:
        x = []
        current = list(self.doc.get("host_count_factors") or [])
        for kind, key, field in self.slots:
            if kind == "level":
                v = self.doc["levels"][key][field]
                x.append(math.log(max(v, _MIN_LATENCY_US)))
            elif kind == "type":
                x.append(math.log(self.doc["node_types"][key][field]))
            elif kind == "algorithm":
                x.append(math.log(self.doc.get("algorithm_efficiency", {}).get(key, 1.0)))
            else:
                x.append(math.log(current[min(key, len(current)) - 1]) if current else 0.0)
        return np.array(x)

    def apply(self, x: np.ndarray, active: np.ndarray) -> dict[str, Any]:
        doc = copy.deepcopy(self.doc)
        factors: dict[int, float] = {}
        for (kind, key, field), v, on in zip(self.slots, x, active, strict=True):
            if not on:
                continue
            if kind == "level":
                doc["levels"][key][field] = float(math.exp(v))
            elif kind == "type":
                doc["node_types"][key][field] = float(math.exp(v))
            elif kind == "algorithm":
                doc.setdefault("algorithm_efficiency", {})[key] = float(math.exp(v))
            else:
                factors[key] = float(math.exp(v))
        if factors:
            top = max(factors)
            old = list(doc.get("host_count_factors") or [])
            doc["host_count_factors"] = [
                factors.get(k, old[min(k, len(old)) - 1] if old else 1.0) for k in range(1, top + 1)
            ]
        return doc


def _fit(
    topology: Topology,
    checked: list,
    factors: list[int],
    max_evaluations: int,
    fit_algorithms: bool = True,
) -> tuple[Topology, float]:
    from scipy.optimize import least_squares

    doc = topology.to_dict()
    doc.pop("provenance", None)
    # Ring bandwidth is the levels' own and NVLS bandwidth the host types' nvls_gbps; a tree
    # or CollNet efficiency is identifiable (apart from the level bandwidths) only when the
    # ring also runs in some sample.
    used = {
        a for job, g, _ in checked for a in evaluate(topology, job, g).class_algorithms.values()
    }
    algorithms = [a for a in ("tree", "collnet") if fit_algorithms and a in used and "ring" in used]
    params = _Params(doc, factors, algorithms)
    x0 = params.initial()
    measured = np.log([s for _, _, s in checked])
    everything = np.ones(len(x0), dtype=bool)

    def build(x: np.ndarray, active: np.ndarray) -> Topology:
        return _Topology.from_dict(params.apply(x, active))

    base = np.log(predict(build(x0, everything), checked))
    # Only parameters some prediction depends on are fitted: probed both ways, since a
    # bandwidth at a kink (as fast as the level below it, whose smaller figure a path takes)
    # moves the predictions only when lowered.
    active = np.zeros(len(x0), dtype=bool)
    for i in range(len(x0)):
        for step in (0.2, -0.2):
            probe = x0.copy()
            probe[i] += step
            moved = np.log(predict(build(probe, everything), checked))
            if np.any(np.abs(moved - base) > 1e-9):
                active[i] = True
                break
    if not active.any():
        return build(x0, active), float(np.sqrt(np.mean((base - measured) ** 2)))
    idx = np.flatnonzero(active)

    def residual(free: np.ndarray) -> np.ndarray:
        x = x0.copy()
        x[idx] = free
        return np.log(predict(build(x, active), checked)) - measured

    result = least_squares(
        residual,
        x0[idx],
        bounds=(x0[idx] - _SPAN, x0[idx] + _SPAN),
        method="trf",
        x_scale=1.0,
        # Central differences: at a kink a one-sided step may see no slope at all.
        jac="3-point",
        diff_step=1e-3,
        max_nfev=max_evaluations,
    )
    x = x0.copy()
    x[idx] = result.x
    fitted = build(x, active)
    return fitted, float(np.sqrt(np.mean(result.fun**2)))


#: The routings calibration tries on a level, as (routing, queue pairs per connection).
#: ``static`` prices as ``ecmp`` with one queue pair (one path per destination), so the two
#: are one candidate: the topology's own name for it is kept when it declares ``static``.
ROUTING_CANDIDATES: tuple[tuple[str, int], ...] = (
    ("adaptive", 1),
    ("ecmp", 1),
    ("ecmp", 2),
    ("ecmp", 4),
    ("ecmp", 8),
)


@dataclass(frozen=True)
class RoutingTrial:
    """One routing tried on one level: the root-mean-square log error of the full fit with it
    (every other parameter refitted), and whether calibration kept it."""

    level: str
    routing: str
    qps_per_connection: int
    rms_log_error: float
    chosen: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibration` found: the fitted topology, the root-mean-square log error of
    the samples before and after, and every routing tried (empty when no level's routing
    changes a prediction, or with ``routing=False``)."""

    topology: Topology
    rms_before: float
    rms_after: float
    routing: list[RoutingTrial]


def _set_routing(topology: Topology, level: int, routing: str, qps: int) -> Topology:
    doc = topology.to_dict()
    doc.pop("provenance", None)
    lv = doc["levels"][level]
    lv["routing"] = routing
    lv["qps_per_connection"] = qps
    return _Topology.from_dict(doc)


def routing_levels(topology: Topology, samples: Iterable[Sample]) -> list[int]:
    """The levels whose routing calibration fits: above the hosts (a host's NICs are chosen by
    NCCL, not hashed) and below the top (the top level has no uplinks), not ``sharp``, and
    where hashing changes some sample's prediction."""
    checked = _checked(samples, topology)
    top = len(topology.levels) - 1
    first = max(topology.nvlink_level, topology.node_level + 1)
    out = []
    for level in range(first, top):
        if topology.levels[level].routing == "sharp":
            continue
        hashed = predict(_set_routing(topology, level, "ecmp", 1), checked)
        balanced = predict(_set_routing(topology, level, "adaptive", 1), checked)
        if np.any(np.abs(np.log(hashed) - np.log(balanced)) > 1e-9):
            out.append(level)
    return out


def _fit_routing(
    topology: Topology,
    checked: list,
    fitted: Topology,
    rms: float,
    mode: bool | str,
    max_evaluations: int,
    fit_algorithms: bool,
) -> tuple[Topology, Topology, float, list[RoutingTrial]]:
    """Try every candidate routing on each level in :func:`routing_levels` in turn (bottom-up,
    the choices below kept): returns the start topology with the routing chosen, its fit, the
    fit's rms log error, and the trials."""
    trials: list[RoutingTrial] = []
    start = topology
    for level in routing_levels(topology, [(j, g, s) for j, g, s in checked]):
        declared = (start.levels[level].routing, start.levels[level].qps_per_connection)
        if declared[0] == "static":
            declared = ("static", 1)
        candidates = [
            ("static", 1) if c == ("ecmp", 1) and declared == ("static", 1) else c
            for c in ROUTING_CANDIDATES
        ]
        if declared not in candidates:
            candidates.append(declared)
        results: list[tuple[str, int, float, Topology, Topology]] = []
        for routing, qps in candidates:
            if (routing, qps) == declared:
                results.append((routing, qps, rms, start, fitted))
                continue
            base = _set_routing(start, level, routing, qps)
            fit, r = _fit(base, checked, [], max_evaluations, fit_algorithms)
            results.append((routing, qps, r, base, fit))
        best = min(results, key=lambda t: t[2])
        keep = best if (mode is True or best[2] < 0.9 * rms) else None
        if keep is not None:
            _, _, rms, start, fitted = keep
        chosen = (keep[0], keep[1]) if keep is not None else declared
        name = topology.levels[level].name
        trials += [
            RoutingTrial(name, routing, qps, float(r), (routing, qps) == chosen)
            for routing, qps, r, _, _ in results
        ]
    return start, fitted, rms, trials


def calibration(
    topology: Topology,
    samples: Iterable[Sample],
    *,
    routing: bool | str = "auto",
    host_count_factors: bool | str = "auto",
    algorithm_efficiency: bool = True,
    max_evaluations: int = 200,
) -> Calibration:
    """Fit ``topology`` to ``samples`` of ``(Job, gpus, seconds)`` (see the module docs) and
    return the fitted topology with its errors and the routings tried. Raises InvalidJob for
    a bad sample or option, InvalidTopology when scipy is missing."""
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:
        raise InvalidTopology("calibrate needs scipy: pip install 'gpuplace[calibrate]'") from None
    if host_count_factors not in (True, False, "auto"):
        raise InvalidJob(
            f"host_count_factors: expected True, False or 'auto', got {host_count_factors!r}"
        )
    if routing not in (True, False, "auto"):
        raise InvalidJob(f"routing: expected True, False or 'auto', got {routing!r}")
    checked = _checked(samples, topology)
    fitted, rms = _fit(topology, checked, [], max_evaluations, algorithm_efficiency)
    trials: list[RoutingTrial] = []
    if routing is not False:
        _, fitted, rms, trials = _fit_routing(
            topology, checked, fitted, rms, routing, max_evaluations, algorithm_efficiency
        )
    hosts = sorted({len({topology.host_of(int(g)) for g in gpus}) for _, gpus, _ in checked})
    want = host_count_factors is True or (
        host_count_factors == "auto" and len(hosts) >= 3 and rms > _AUTO_RMS
    )
    if want:
        with_factors, rms2 = _fit(fitted, checked, hosts, max_evaluations, algorithm_efficiency)
        if host_count_factors is True or rms2 < rms * 0.9:
            fitted, rms = with_factors, rms2
    before = np.array(sample_errors(topology, checked))
    rms_before = math.sqrt(float(np.mean(np.log1p(before) ** 2)))
    fitted.provenance = {
        **topology.provenance,
        "warnings": [
            *topology.provenance.get("warnings", []),
            f"calibrated on {len(checked)} samples: rms log error {rms_before:.3f} -> {rms:.3f}",
        ],
    }
    fitted.origin = None
    return Calibration(fitted, rms_before, rms, trials)


def calibrate(
    topology: Topology,
    samples: Iterable[Sample],
    *,
    routing: bool | str = "auto",
    host_count_factors: bool | str = "auto",
    algorithm_efficiency: bool = True,
    max_evaluations: int = 200,
) -> Topology:
    """A copy of ``topology`` whose per-level bandwidth and latency, NVLS bandwidth, tree and
    CollNet efficiency (unless ``algorithm_efficiency=False``), the routing of the levels the
    samples cross (unless ``routing=False``) and (when the data demand them) host-count
    factors fit ``samples`` of ``(Job, gpus, seconds)``; see the module docs and
    :func:`calibration`. Raises InvalidJob for a bad sample, InvalidTopology when scipy is
    missing."""
    return calibration(
        topology,
        samples,
        routing=routing,
        host_count_factors=host_count_factors,
        algorithm_efficiency=algorithm_efficiency,
        max_evaluations=max_evaluations,
    ).topology
