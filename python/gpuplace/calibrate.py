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
* with ``host_count_factors=True``, or ``"auto"`` when the samples span at least three distinct
  host counts and the fit without them leaves a root-mean-square log error above 10 %, one
  factor per host count seen (``host_count_factors`` in the topology format): the documented
  correction for measurements whose structure the topology alone cannot produce.

Parameters no sample depends on are left as they are.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace.errors import InvalidJob, InvalidTopology
from gpuplace.model.topology import Topology as _Topology
from gpuplace.placement.place import evaluate

if TYPE_CHECKING:
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = ["calibrate", "fitted_parameters", "sample_errors"]

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
    and ``latency_us`` (µs), each host type's ``nvls_gbps``, the ``algorithm_efficiency`` of
    each algorithm and the ``host_count_factors``. Named as ``-p`` names them
    (``levels.leaf.bandwidth_gbps``)."""
    old, new = before.to_dict(), after.to_dict()
    rows: list[dict[str, Any]] = []

    def add(name: str, a: Any, b: Any) -> None:
        changed = a != b and not (
            a is not None and b is not None and math.isclose(a, b, rel_tol=1e-12)
        )
        rows.append({"parameter": name, "before": a, "after": b, "changed": changed})

    for lv_old, lv_new in zip(old["levels"], new["levels"], strict=True):
        for key in ("bandwidth_gbps", "latency_us"):
            add(f"levels.{lv_old['name']}.{key}", lv_old[key], lv_new[key])
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
    # Only parameters some prediction depends on are fitted.
    active = np.zeros(len(x0), dtype=bool)
    for i in range(len(x0)):
        probe = x0.copy()
        probe[i] += 0.2
        moved = np.log(predict(build(probe, everything), checked))
        active[i] = bool(np.any(np.abs(moved - base) > 1e-9))
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
        diff_step=1e-3,
        max_nfev=max_evaluations,
    )
    x = x0.copy()
    x[idx] = result.x
    fitted = build(x, active)
    return fitted, float(np.sqrt(np.mean(result.fun**2)))


def calibrate(
    topology: Topology,
    samples: Iterable[Sample],
    *,
    host_count_factors: bool | str = "auto",
    algorithm_efficiency: bool = True,
    max_evaluations: int = 200,
) -> Topology:
    """A copy of ``topology`` whose per-level bandwidth and latency, NVLS bandwidth, tree and
    CollNet efficiency (unless ``algorithm_efficiency=False``) and (when the data demand it)
    host-count factors fit ``samples`` of ``(Job, gpus, seconds)``; see the module docs.
    Raises InvalidJob for a bad sample, InvalidTopology when scipy is missing."""
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:
        raise InvalidTopology("calibrate needs scipy: pip install 'gpuplace[calibrate]'") from None
    if host_count_factors not in (True, False, "auto"):
        raise InvalidJob(
            f"host_count_factors: expected True, False or 'auto', got {host_count_factors!r}"
        )
    checked = _checked(samples, topology)
    fitted, rms = _fit(topology, checked, [], max_evaluations, algorithm_efficiency)
    hosts = sorted({len({topology.host_of(int(g)) for g in gpus}) for _, gpus, _ in checked})
    want = host_count_factors is True or (
        host_count_factors == "auto" and len(hosts) >= 3 and rms > _AUTO_RMS
    )
    if want:
        with_factors, rms2 = _fit(fitted, checked, hosts, max_evaluations, algorithm_efficiency)
        if host_count_factors is True or rms2 < rms * 0.9:
            fitted, rms = with_factors, rms2
    before = np.array(sample_errors(topology, checked))
    fitted.provenance = {
        **topology.provenance,
        "warnings": [
            *topology.provenance.get("warnings", []),
            f"calibrated on {len(checked)} samples: rms log error "
            f"{math.sqrt(np.mean(np.log1p(before) ** 2)):.3f} -> {rms:.3f}",
        ],
    }
    fitted.origin = None
    return fitted
