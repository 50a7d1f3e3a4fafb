//! `gpuplace._core`: thin PyO3 bindings over gpuplace-core.
//!
//! Inputs arrive as numpy arrays and are copied into owned Rust data while attached; long
//! calls then run with the GIL released (`py.detach`). Core errors map onto the exception
//! classes of `gpuplace.errors` in one place ([`to_pyerr`]).

use std::sync::Arc;

use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use gpuplace_core::job::{Collective, CollectiveKind, Dim};
use gpuplace_core::repair::{self, MoveReason, RepairOptions, SparePolicy};
use gpuplace_core::solvers::{self, SolveOptions};
use gpuplace_core::state::{Component, ComponentHealth, Condition, GpuStatus};
use gpuplace_core::topology::{Level, NodeType};
use gpuplace_core::{ClusterState, CoreError, JobSpec, Topology};

mod pricing;

/// Map a core error onto the matching `gpuplace.errors` class.
fn to_pyerr(py: Python<'_>, err: CoreError) -> PyErr {
    let class = match &err {
        CoreError::InvalidTopology(_) => "InvalidTopology",
        CoreError::InvalidJob(_) => "InvalidJob",
        CoreError::InvalidState(_) => "InvalidState",
        CoreError::Infeasible(_) => "Infeasible",
    };
    match py.import("gpuplace.errors").and_then(|m| m.getattr(class)) {
        Ok(ty) => match ty.call1((err.to_string(),)) {
            Ok(instance) => PyErr::from_value(instance),
            Err(e) => e,
        },
        Err(e) => e,
    }
}

trait IntoPy<T> {
    fn py_ok(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, CoreError> {
    fn py_ok(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_pyerr(py, e))
    }
}

/// Copy a non-negative integer array into u32s; a bad value is a `kind` error naming the
/// argument (so a negative GPU id is an InvalidState, a bad domain id an InvalidTopology).
fn to_u32(
    what: &str,
    values: &[i64],
    kind: fn(String) -> CoreError,
) -> Result<Vec<u32>, CoreError> {
    values
        .iter()
        .map(|&v| {
            u32::try_from(v)
                .map_err(|_| kind(format!("{what}: {v} is not a valid id (ids are 0 or more)")))
        })
        .collect()
}

fn array_u32(
    what: &str,
    a: &PyReadonlyArray1<'_, i64>,
    kind: fn(String) -> CoreError,
) -> Result<Vec<u32>, CoreError> {
    let owned: Vec<i64> = a.as_array().iter().copied().collect();
    to_u32(what, &owned, kind)
}

#[pyclass(name = "Topology", module = "gpuplace._core", frozen)]
struct PyTopology {
    inner: Arc<Topology>,
}

#[pymethods]
impl PyTopology {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (level_names, bandwidth_gbps, latency_us, node_level, nvlink_level, path, node_type_names, node_type_gpus, node_type_matrices, node_type_of_node, gpu_local))]
    fn new(
        py: Python<'_>,
        level_names: Vec<String>,
        bandwidth_gbps: Vec<f64>,
        latency_us: Vec<f64>,
        node_level: usize,
        nvlink_level: usize,
        path: PyReadonlyArray2<'_, i64>,
        node_type_names: Vec<String>,
        node_type_gpus: Vec<usize>,
        node_type_matrices: Vec<Option<PyReadonlyArray2<'_, f64>>>,
        node_type_of_node: PyReadonlyArray1<'_, i64>,
        gpu_local: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<Self> {
        if level_names.len() != bandwidth_gbps.len() || level_names.len() != latency_us.len() {
            return Err(PyValueError::new_err("level arrays differ in length"));
        }
        if node_type_names.len() != node_type_gpus.len()
            || node_type_names.len() != node_type_matrices.len()
        {
            return Err(PyValueError::new_err("node type arrays differ in length"));
        }
        let levels = level_names
            .into_iter()
            .zip(bandwidth_gbps)
            .zip(latency_us)
            .map(|((name, bandwidth_gbps), latency_us)| Level {
                name,
                bandwidth_gbps,
                latency_us,
            })
            .collect::<Vec<_>>();
        let shape = path.shape();
        if shape[1] != levels.len() {
            return Err(PyValueError::new_err(format!(
                "path must have one column per level ({}), got {}",
                levels.len(),
                shape[1]
            )));
        }
        let path_owned: Vec<i64> = path.as_array().iter().copied().collect();
        let path_u32 = to_u32("path", &path_owned, CoreError::InvalidTopology).py_ok(py)?;
        let node_types = node_type_names
            .into_iter()
            .zip(node_type_gpus)
            .zip(node_type_matrices)
            .map(|((name, gpus), matrix)| NodeType {
                name,
                gpus,
                bandwidth_gbps: matrix.map(|m| m.as_array().iter().copied().collect()),
            })
            .collect();
        let types = array_u32(
            "node_type_of_node",
            &node_type_of_node,
            CoreError::InvalidTopology,
        )
        .py_ok(py)?;
        let local = array_u32("gpu_local", &gpu_local, CoreError::InvalidTopology).py_ok(py)?;
        let topo = py
            .detach(|| {
                Topology::new(
                    levels,
                    node_level,
                    nvlink_level,
                    path_u32,
                    node_types,
                    types,
                    local,
                )
            })
            .py_ok(py)?;
        Ok(PyTopology {
            inner: Arc::new(topo),
        })
    }

    #[getter]
    fn num_gpus(&self) -> usize {
        self.inner.num_gpus()
    }
    #[getter]
    fn num_levels(&self) -> usize {
        self.inner.num_levels()
    }
    #[getter]
    fn node_level(&self) -> usize {
        self.inner.node_level()
    }
    #[getter]
    fn nvlink_level(&self) -> usize {
        self.inner.nvlink_level()
    }
    #[getter]
    fn level_names(&self) -> Vec<String> {
        self.inner.levels().iter().map(|l| l.name.clone()).collect()
    }
    #[getter]
    fn bandwidth_gbps(&self) -> Vec<f64> {
        self.inner
            .levels()
            .iter()
            .map(|l| l.bandwidth_gbps)
            .collect()
    }
    #[getter]
    fn latency_us(&self) -> Vec<f64> {
        self.inner.levels().iter().map(|l| l.latency_us).collect()
    }
    fn domain_count(&self, level: usize) -> PyResult<usize> {
        self.check_level(level)?;
        Ok(self.inner.domain_count(level))
    }
    /// GPUs per domain at a level.
    fn domain_sizes<'py>(
        &self,
        py: Python<'py>,
        level: usize,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        self.check_level(level)?;
        let v: Vec<i64> = self
            .inner
            .domain_sizes(level)
            .iter()
            .map(|&s| s as i64)
            .collect();
        Ok(v.into_pyarray(py))
    }
    /// Parent domain (at level + 1) of every domain at a level.
    fn parents<'py>(&self, py: Python<'py>, level: usize) -> PyResult<Bound<'py, PyArray1<i64>>> {
        self.check_level(level)?;
        let v: Vec<i64> = self
            .inner
            .parents(level)
            .iter()
            .map(|&s| s as i64)
            .collect();
        Ok(v.into_pyarray(py))
    }
    /// Domain ids of every GPU, shape (num_gpus, num_levels).
    fn path<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<i64>>> {
        let nl = self.inner.num_levels();
        let v: Vec<i64> = self.inner.path().iter().map(|&s| s as i64).collect();
        v.into_pyarray(py).reshape([self.inner.num_gpus(), nl])
    }
    /// Per level, the bandwidth (GB/s) of traffic that spans it: the slowest level up to it.
    #[getter]
    fn effective_bandwidth_gbps(&self) -> Vec<f64> {
        (0..self.inner.num_levels())
            .map(|l| self.inner.effective_bandwidth(l))
            .collect()
    }

    /// Seconds of one call of a collective (kind code as in JobSpec) over `n` ranks whose group
    /// spans each level, from the core's cost formulas on healthy hardware.
    fn collective_seconds_by_level(
        &self,
        py: Python<'_>,
        kind: u8,
        n: usize,
        bytes: f64,
    ) -> PyResult<Vec<f64>> {
        let kind = CollectiveKind::from_code(kind).ok_or_else(|| {
            to_pyerr(
                py,
                CoreError::InvalidJob(format!("unknown collective kind {kind}")),
            )
        })?;
        Ok(gpuplace_core::cost::collective_seconds_by_level(
            &self.inner,
            kind,
            n,
            bytes,
        ))
    }

    /// Bandwidth (GB/s) between every pair of the given GPUs as the cost model sees it on
    /// healthy hardware; 0 on the diagonal.
    fn bandwidth_matrix<'py>(
        &self,
        py: Python<'py>,
        gpus: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let gpus = array_u32("GPU", &gpus, CoreError::InvalidState).py_ok(py)?;
        if let Some(&g) = gpus.iter().find(|&&g| g as usize >= self.inner.num_gpus()) {
            return Err(to_pyerr(
                py,
                CoreError::InvalidState(format!("GPU {g} does not exist")),
            ));
        }
        let n = gpus.len();
        let topo = self.inner.clone();
        let values = py.detach(|| {
            let mut out = vec![0.0; n * n];
            for i in 0..n {
                for j in 0..n {
                    if gpus[i] != gpus[j] {
                        out[i * n + j] = topo.pair_bandwidth(gpus[i] as usize, gpus[j] as usize);
                    }
                }
            }
            out
        });
        values.into_pyarray(py).reshape([n, n])
    }

    fn lca(&self, a: usize, b: usize) -> PyResult<usize> {
        self.check_gpu(a)?;
        self.check_gpu(b)?;
        Ok(if a == b { 0 } else { self.inner.lca(a, b) })
    }
    /// Bandwidth (GB/s) between two distinct GPUs as the cost model sees it.
    fn pair_bandwidth(&self, a: usize, b: usize) -> PyResult<f64> {
        self.check_gpu(a)?;
        self.check_gpu(b)?;
        if a == b {
            return Err(PyValueError::new_err(
                "pair_bandwidth needs two distinct GPUs",
            ));
        }
        Ok(self.inner.pair_bandwidth(a, b))
    }
}

impl PyTopology {
    fn check_level(&self, level: usize) -> PyResult<()> {
        if level >= self.inner.num_levels() {
            return Err(PyValueError::new_err(format!(
                "level {level} does not exist (the topology has {})",
                self.inner.num_levels()
            )));
        }
        Ok(())
    }
    fn check_gpu(&self, gpu: usize) -> PyResult<()> {
        if gpu >= self.inner.num_gpus() {
            return Err(PyValueError::new_err(format!(
                "GPU {gpu} does not exist (the topology has {})",
                self.inner.num_gpus()
            )));
        }
        Ok(())
    }
}

#[pyclass(name = "JobSpec", module = "gpuplace._core", frozen)]
struct PyJobSpec {
    inner: Arc<JobSpec>,
    /// The topology the job was compiled and validated against.
    topology: Arc<Topology>,
}

#[pymethods]
impl PyJobSpec {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (topology, num_ranks, dim_names, dim_sizes, dim_confine, max_span, group_offsets, group_ranks, coll_group, coll_kind, coll_bytes, coll_count, coll_class, coll_dim, traffic_src, traffic_dst, traffic_bytes))]
    fn new(
        py: Python<'_>,
        topology: &PyTopology,
        num_ranks: usize,
        dim_names: Vec<String>,
        dim_sizes: Vec<usize>,
        dim_confine: Vec<i64>,
        max_span: usize,
        group_offsets: PyReadonlyArray1<'_, i64>,
        group_ranks: PyReadonlyArray1<'_, i64>,
        coll_group: PyReadonlyArray1<'_, i64>,
        coll_kind: PyReadonlyArray1<'_, i64>,
        coll_bytes: PyReadonlyArray1<'_, f64>,
        coll_count: PyReadonlyArray1<'_, f64>,
        coll_class: PyReadonlyArray1<'_, i64>,
        coll_dim: PyReadonlyArray1<'_, i64>,
        traffic_src: PyReadonlyArray1<'_, i64>,
        traffic_dst: PyReadonlyArray1<'_, i64>,
        traffic_bytes: PyReadonlyArray1<'_, f64>,
    ) -> PyResult<Self> {
        if dim_names.len() != dim_sizes.len() || dim_names.len() != dim_confine.len() {
            return Err(PyValueError::new_err("dimension arrays differ in length"));
        }
        let dims = dim_names
            .into_iter()
            .zip(dim_sizes)
            .zip(dim_confine)
            .map(|((name, size), c)| Dim {
                name,
                size,
                confine: usize::try_from(c).ok(),
            })
            .collect();
        let offsets: Vec<usize> = array_u32("group_offsets", &group_offsets, CoreError::InvalidJob)
            .py_ok(py)?
            .into_iter()
            .map(|v| v as usize)
            .collect();
        let ranks = array_u32("group_ranks", &group_ranks, CoreError::InvalidJob).py_ok(py)?;
        let groups = array_u32("coll_group", &coll_group, CoreError::InvalidJob).py_ok(py)?;
        let kinds = array_u32("coll_kind", &coll_kind, CoreError::InvalidJob).py_ok(py)?;
        let classes = array_u32("coll_class", &coll_class, CoreError::InvalidJob).py_ok(py)?;
        let bytes: Vec<f64> = coll_bytes.as_array().iter().copied().collect();
        let counts: Vec<f64> = coll_count.as_array().iter().copied().collect();
        let dims_of: Vec<i64> = coll_dim.as_array().iter().copied().collect();
        let n = groups.len();
        if [
            kinds.len(),
            classes.len(),
            bytes.len(),
            counts.len(),
            dims_of.len(),
        ]
        .iter()
        .any(|&m| m != n)
        {
            return Err(PyValueError::new_err("collective arrays differ in length"));
        }
        let mut collectives = Vec::with_capacity(n);
        for i in 0..n {
            let kind = CollectiveKind::from_code(kinds[i] as u8)
                .filter(|_| kinds[i] < 256)
                .ok_or_else(|| {
                    PyValueError::new_err(format!("unknown collective kind {}", kinds[i]))
                })?;
            collectives.push(Collective {
                group: groups[i],
                kind,
                bytes: bytes[i],
                count: counts[i],
                class: classes[i],
                dim: u32::try_from(dims_of[i]).ok(),
            });
        }
        let src = array_u32("traffic_src", &traffic_src, CoreError::InvalidJob).py_ok(py)?;
        let dst = array_u32("traffic_dst", &traffic_dst, CoreError::InvalidJob).py_ok(py)?;
        let tb: Vec<f64> = traffic_bytes.as_array().iter().copied().collect();
        if src.len() != dst.len() || src.len() != tb.len() {
            return Err(PyValueError::new_err("traffic arrays differ in length"));
        }
        let traffic = src
            .into_iter()
            .zip(dst)
            .zip(tb)
            .map(|((a, b), t)| (a, b, t))
            .collect();
        let topo = topology.inner.clone();
        let spec = py
            .detach(|| {
                JobSpec::new(
                    num_ranks,
                    dims,
                    max_span,
                    offsets,
                    ranks,
                    collectives,
                    traffic,
                    &topo,
                )
            })
            .py_ok(py)?;
        Ok(PyJobSpec {
            inner: Arc::new(spec),
            topology: topo,
        })
    }

    #[getter]
    fn num_ranks(&self) -> usize {
        self.inner.num_ranks
    }

    /// Layout order (innermost first) the greedy placer uses, as dimension indices.
    fn layout_order(&self) -> Vec<usize> {
        gpuplace_core::greedy::layout_order(&self.inner)
    }
}

#[pyclass(name = "ClusterState", module = "gpuplace._core")]
struct PyClusterState {
    inner: ClusterState,
}

fn gpus_from(py: Python<'_>, gpus: &PyReadonlyArray1<'_, i64>) -> PyResult<Vec<u32>> {
    array_u32("GPU", gpus, CoreError::InvalidState).py_ok(py)
}

/// Decode components given as parallel arrays: kind 0 GPU (a = id), 1 host (a = host index),
/// 2 NIC (a = NIC id), 3 switch (a = level, b = domain).
fn components_from(kinds: &[i64], a: &[i64], b: &[i64]) -> PyResult<Vec<Component>> {
    if kinds.len() != a.len() || kinds.len() != b.len() {
        return Err(PyValueError::new_err("component arrays differ in length"));
    }
    let id = |v: i64| {
        u32::try_from(v).map_err(|_| PyValueError::new_err(format!("{v} is not a valid id")))
    };
    kinds
        .iter()
        .zip(a.iter().zip(b))
        .map(|(&k, (&a, &b))| {
            Ok(match k {
                0 => Component::Gpu(id(a)?),
                1 => Component::Node(id(a)?),
                2 => Component::Nic(id(a)?),
                3 => Component::Switch {
                    level: id(a)?,
                    domain: id(b)?,
                },
                other => {
                    return Err(PyValueError::new_err(format!(
                        "unknown component kind {other}"
                    )))
                }
            })
        })
        .collect()
}

fn affected_list<'py>(
    py: Python<'py>,
    affected: Vec<(String, Vec<u32>)>,
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for (name, ranks) in affected {
        let ranks = ranks
            .into_iter()
            .map(|r| r as i64)
            .collect::<Vec<_>>()
            .into_pyarray(py);
        out.append((name, ranks))?;
    }
    Ok(out)
}

/// (kind, a, b) of a component: 0 GPU a, 1 host a, 2 NIC a, 3 switch (level a, domain b).
fn component_code(c: Component) -> (u8, u32, u32) {
    match c {
        Component::Gpu(g) => (0, g, 0),
        Component::Node(n) => (1, n, 0),
        Component::Nic(n) => (2, n, 0),
        Component::Switch { level, domain } => (3, level, domain),
    }
}

fn i64s(a: &PyReadonlyArray1<'_, i64>) -> Vec<i64> {
    a.as_array().iter().copied().collect()
}

impl PyClusterState {
    /// A per-GPU boolean array from a state predicate.
    fn gpu_mask<'py>(
        &self,
        py: Python<'py>,
        predicate: fn(&ClusterState, usize) -> bool,
    ) -> Bound<'py, PyArray1<bool>> {
        let n = self.inner.topology().num_gpus();
        (0..n)
            .map(|g| predicate(&self.inner, g))
            .collect::<Vec<_>>()
            .into_pyarray(py)
    }

    /// A per-domain counter of one level, checking the level exists.
    fn per_domain<'py>(
        &self,
        py: Python<'py>,
        level: usize,
        count: fn(&ClusterState, usize, usize) -> u32,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let topo = self.inner.topology();
        if level >= topo.num_levels() {
            return Err(PyValueError::new_err(format!(
                "level {level} does not exist"
            )));
        }
        Ok((0..topo.domain_count(level))
            .map(|d| count(&self.inner, level, d) as i64)
            .collect::<Vec<_>>()
            .into_pyarray(py))
    }
}

#[pymethods]
impl PyClusterState {
    /// `gpu_nic[g]`: dense NIC id of GPU g, or -1 for none.
    #[new]
    #[pyo3(signature = (topology, gpu_nic=None))]
    fn new(
        py: Python<'_>,
        topology: &PyTopology,
        gpu_nic: Option<PyReadonlyArray1<'_, i64>>,
    ) -> PyResult<Self> {
        let inner = match gpu_nic {
            None => ClusterState::new(topology.inner.clone()),
            Some(map) => {
                let map: Vec<u32> = i64s(&map)
                    .into_iter()
                    .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
                    .collect();
                ClusterState::with_nics(topology.inner.clone(), map).py_ok(py)?
            }
        };
        Ok(PyClusterState { inner })
    }

    /// Set the condition of components (code 0 ok = recover, 1 degraded, 2 failed,
    /// 3 drained); all or nothing. Returns [(job, ranks)] of the jobs on the GPUs affected.
    #[allow(clippy::too_many_arguments)]
    fn set_condition<'py>(
        &mut self,
        py: Python<'py>,
        kinds: PyReadonlyArray1<'_, i64>,
        a: PyReadonlyArray1<'_, i64>,
        b: PyReadonlyArray1<'_, i64>,
        code: u8,
        factor: f64,
        reason: String,
    ) -> PyResult<Bound<'py, PyList>> {
        let targets = components_from(&i64s(&kinds), &i64s(&a), &i64s(&b))?;
        let health = match code {
            0 => None,
            c => Some(ComponentHealth {
                condition: Condition::from_code(c)
                    .ok_or_else(|| PyValueError::new_err(format!("unknown condition {c}")))?,
                factor,
                reason,
            }),
        };
        let inner = &mut self.inner;
        let affected = py
            .detach(|| inner.set_condition(&targets, health))
            .py_ok(py)?;
        affected_list(py, affected)
    }

    /// Components that are not ok: [(kind, a, b, condition code, factor, reason)].
    fn components(&self) -> Vec<(u8, u32, u32, u8, f64, String)> {
        self.inner
            .components()
            .into_iter()
            .map(|(c, h)| {
                let (kind, a, b) = component_code(c);
                (kind, a, b, h.condition as u8, h.factor, h.reason)
            })
            .collect()
    }

    /// Reserve (or un-reserve) spare GPUs for repairs; all or nothing.
    fn set_spare(
        &mut self,
        py: Python<'_>,
        gpus: PyReadonlyArray1<'_, i64>,
        spare: bool,
    ) -> PyResult<()> {
        let gpus = gpus_from(py, &gpus)?;
        self.inner.set_spare(&gpus, spare).py_ok(py)
    }

    /// Reserved spare mask.
    fn spare_mask<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        self.inner.spares().to_vec().into_pyarray(py)
    }

    /// Mask of GPUs some degraded component slows down.
    fn degraded_mask<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        self.gpu_mask(py, ClusterState::is_degraded)
    }

    /// Free spare GPUs per domain of a level.
    fn spare_counts<'py>(
        &self,
        py: Python<'py>,
        level: usize,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        self.per_domain(py, level, ClusterState::spare_free_count)
    }

    /// Check every incremental counter and derived array against a recount; raises
    /// InvalidState naming the first difference.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| inner.check()).py_ok(py)
    }

    /// Replace a running job's GPUs (all or nothing; spares allowed).
    fn replace_allocation(
        &mut self,
        py: Python<'_>,
        name: &str,
        gpus: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<()> {
        let gpus = gpus_from(py, &gpus)?;
        self.inner.replace_allocation(name, &gpus).py_ok(py)
    }

    /// Repair job `name` in place (all or nothing); returns a dict with the new GPUs, the
    /// moves (rank, old GPU, new GPU, reason code 0 lost / 1 unit moved / 2 improvement /
    /// 3 evacuated, level of the unit or -1), the component each evacuated rank left
    /// (`evacuated`: rank, kind, a, b as in `components`) and the costs before and after (s).
    #[pyo3(signature = (job, name, max_moves=0, spares="allow", max_evaluations=24, time_limit=None))]
    #[allow(clippy::too_many_arguments)]
    fn repair<'py>(
        &mut self,
        py: Python<'py>,
        job: &PyJobSpec,
        name: &str,
        max_moves: usize,
        spares: &str,
        max_evaluations: usize,
        time_limit: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        if !Arc::ptr_eq(self.inner.topology(), &job.topology) {
            return Err(to_pyerr(
                py,
                CoreError::InvalidJob(
                    "the job was compiled for another topology than the state's".into(),
                ),
            ));
        }
        let spares = match spares {
            "allow" => SparePolicy::Allow,
            "forbid" => SparePolicy::Forbid,
            "only" => SparePolicy::Only,
            other => {
                return Err(PyValueError::new_err(format!(
                    "spares must be allow, forbid or only, got {other:?}"
                )))
            }
        };
        let time_limit = match time_limit {
            None => None,
            Some(t) if t.is_finite() && t > 0.0 => Some(std::time::Duration::from_secs_f64(t)),
            Some(t) => {
                return Err(PyValueError::new_err(format!(
                    "time_limit must be > 0 seconds, got {t}"
                )))
            }
        };
        let opts = RepairOptions {
            max_moves,
            spares,
            max_evaluations,
            time_limit,
        };
        let spec = job.inner.clone();
        let inner = &mut self.inner;
        let plan = py
            .detach(|| repair::repair(inner, &spec, name, &opts))
            .py_ok(py)?;
        let out = PyDict::new(py);
        let gpus: Vec<i64> = plan.gpus.iter().map(|&g| g as i64).collect();
        out.set_item("gpus", gpus.into_pyarray(py))?;
        let moves: Vec<(u32, u32, u32, u8, i64)> = plan
            .moves
            .iter()
            .map(|m| {
                let (code, level) = match m.reason {
                    MoveReason::Lost => (0, -1),
                    MoveReason::UnitMoved { level } => (1, level as i64),
                    MoveReason::Improvement => (2, -1),
                    MoveReason::Evacuated { .. } => (3, -1),
                };
                (m.rank, m.old_gpu, m.new_gpu, code, level)
            })
            .collect();
        out.set_item("moves", moves)?;
        // Per evacuated rank, the component it left: (rank, kind, a, b) as in `components`.
        let evacuated: Vec<(u32, u8, u32, u32)> = plan
            .moves
            .iter()
            .filter_map(|m| match m.reason {
                MoveReason::Evacuated { component } => {
                    let (kind, a, b) = component_code(component);
                    Some((m.rank, kind, a, b))
                }
                _ => None,
            })
            .collect();
        out.set_item("evacuated", evacuated)?;
        out.set_item("cost_before", plan.cost_before)?;
        out.set_item("cost_after", plan.cost_after)?;
        out.set_item("evaluations", plan.evaluations)?;
        Ok(out)
    }

    fn copy(&self) -> Self {
        PyClusterState {
            inner: self.inner.clone(),
        }
    }

    fn allocate(
        &mut self,
        py: Python<'_>,
        name: &str,
        gpus: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<()> {
        let gpus = gpus_from(py, &gpus)?;
        self.inner.allocate(name, &gpus).py_ok(py)
    }

    fn release<'py>(&mut self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let gpus = self.inner.release(name).py_ok(py)?;
        Ok(gpus
            .into_iter()
            .map(|g| g as i64)
            .collect::<Vec<_>>()
            .into_pyarray(py))
    }

    /// Set the health code (0 ok, 1 failed, 2 drained) of GPUs; returns [(job, ranks)].
    fn set_health<'py>(
        &mut self,
        py: Python<'py>,
        gpus: PyReadonlyArray1<'_, i64>,
        code: u8,
    ) -> PyResult<Bound<'py, PyList>> {
        let status = GpuStatus::from_code(code)
            .ok_or_else(|| PyValueError::new_err(format!("unknown health code {code}")))?;
        let gpus = gpus_from(py, &gpus)?;
        let affected = self.inner.set_health(&gpus, status).py_ok(py)?;
        let out = PyList::empty(py);
        for (name, ranks) in affected {
            let ranks = ranks
                .into_iter()
                .map(|r| r as i64)
                .collect::<Vec<_>>()
                .into_pyarray(py);
            out.append((name, ranks))?;
        }
        Ok(out)
    }

    /// Health code of every GPU.
    fn health<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u8>> {
        self.inner
            .health()
            .iter()
            .map(|&h| h as u8)
            .collect::<Vec<_>>()
            .into_pyarray(py)
    }

    /// Free usable GPU mask.
    fn free_mask<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        self.gpu_mask(py, ClusterState::is_free)
    }

    fn free_counts<'py>(
        &self,
        py: Python<'py>,
        level: usize,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        self.per_domain(py, level, ClusterState::free_count)
    }

    /// Free counters recounted from scratch, per level (for consistency checks).
    fn recount<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyArray1<i64>>> {
        self.inner
            .recount()
            .into_iter()
            .map(|v| {
                v.into_iter()
                    .map(|c| c as i64)
                    .collect::<Vec<_>>()
                    .into_pyarray(py)
            })
            .collect()
    }

    #[getter]
    fn total_free(&self) -> u32 {
        self.inner.total_free()
    }

    fn owner_of(&self, gpu: usize) -> PyResult<Option<String>> {
        if gpu >= self.inner.topology().num_gpus() {
            return Err(PyValueError::new_err(format!("GPU {gpu} does not exist")));
        }
        Ok(self.inner.owner_of(gpu).map(str::to_string))
    }

    /// GPU of each rank of one job, or None when no job has that name.
    fn job_gpus<'py>(&self, py: Python<'py>, name: &str) -> Option<Bound<'py, PyArray1<i64>>> {
        self.inner.job(name).map(|alloc| {
            alloc
                .gpus
                .iter()
                .map(|&g| g as i64)
                .collect::<Vec<_>>()
                .into_pyarray(py)
        })
    }

    /// {job name: GPU per rank}, in allocation-slot order.
    fn jobs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for alloc in self.inner.jobs() {
            let gpus = alloc
                .gpus
                .iter()
                .map(|&g| g as i64)
                .collect::<Vec<_>>()
                .into_pyarray(py);
            out.set_item(&alloc.name, gpus)?;
        }
        Ok(out)
    }

    fn memory_bytes(&self) -> usize {
        self.inner.memory_bytes()
    }
}

/// Evaluate a placement with the one cost model, on the hardware of `state` (degraded
/// components included) when given. Returns a dict of plain values.
#[pyfunction]
#[pyo3(signature = (topology, job, gpus, state=None))]
fn evaluate<'py>(
    py: Python<'py>,
    topology: &PyTopology,
    job: &PyJobSpec,
    gpus: PyReadonlyArray1<'_, i64>,
    state: Option<PyRef<'py, PyClusterState>>,
) -> PyResult<Bound<'py, PyDict>> {
    let gpus = gpus_from(py, &gpus)?;
    if !Arc::ptr_eq(&topology.inner, &job.topology) {
        return Err(to_pyerr(
            py,
            CoreError::InvalidJob("the job was compiled for another topology".into()),
        ));
    }
    let (topo, spec) = (topology.inner.clone(), job.inner.clone());
    if let Some(st) = &state {
        if !Arc::ptr_eq(st.inner.topology(), &topo) {
            return Err(to_pyerr(
                py,
                CoreError::InvalidState("the state belongs to another topology".into()),
            ));
        }
    }
    let factors = state.as_ref().and_then(|st| st.inner.path_factors());
    let report = py
        .detach(|| gpuplace_core::cost::evaluate_with(&topo, factors, &spec, &gpus))
        .py_ok(py)?;
    let out = PyDict::new(py);
    out.set_item("comm_seconds", report.comm_seconds)?;
    out.set_item("class_seconds", report.class_seconds)?;
    out.set_item("traffic_seconds", report.traffic_seconds)?;
    out.set_item("bytes_by_level", report.bytes_by_level.into_pyarray(py))?;
    out.set_item("span_level", report.span_level)?;
    out.set_item("confinement_ok", report.confinement_ok)?;
    out.set_item("violations", report.violations)?;
    Ok(out)
}

/// Run a Rust solver; returns the GPU of each rank. The state is not changed.
#[pyfunction]
#[pyo3(signature = (state, job, solver, seed=0, time_limit=None))]
fn place<'py>(
    py: Python<'py>,
    state: PyRef<'py, PyClusterState>,
    job: &PyJobSpec,
    solver: &str,
    seed: u64,
    time_limit: Option<f64>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let spec = job.inner.clone();
    if !Arc::ptr_eq(state.inner.topology(), &job.topology) {
        return Err(to_pyerr(
            py,
            CoreError::InvalidJob(
                "the job was compiled for another topology than the state's".into(),
            ),
        ));
    }
    let inner = &state.inner;
    let opts = SolveOptions { seed, time_limit };
    let gpus = py
        .detach(|| solvers::solve(solver, inner, &spec, &opts))
        .py_ok(py)?;
    Ok(gpus
        .into_iter()
        .map(|g| g as i64)
        .collect::<Vec<_>>()
        .into_pyarray(py))
}

/// Improve a placement by local search; returns (gpus, start seconds, final seconds,
/// iterations, accepted moves). The GPUs of `start` count as usable even if allocated.
#[pyfunction]
#[pyo3(signature = (state, job, start, time_limit=0.5, seed=0, max_iterations=200_000))]
fn refine<'py>(
    py: Python<'py>,
    state: PyRef<'py, PyClusterState>,
    job: &PyJobSpec,
    start: PyReadonlyArray1<'_, i64>,
    time_limit: f64,
    seed: u64,
    max_iterations: u64,
) -> PyResult<(Bound<'py, PyArray1<i64>>, f64, f64, u64, u64)> {
    if !Arc::ptr_eq(state.inner.topology(), &job.topology) {
        return Err(to_pyerr(
            py,
            CoreError::InvalidJob(
                "the job was compiled for another topology than the state's".into(),
            ),
        ));
    }
    let start = gpus_from(py, &start)?;
    let spec = job.inner.clone();
    let inner = &state.inner;
    let opts = gpuplace_core::refine::RefineOptions {
        time_limit: std::time::Duration::from_secs_f64(time_limit.max(0.0)),
        max_iterations,
        seed,
    };
    let out = py
        .detach(|| gpuplace_core::refine::refine(inner, &spec, &start, &opts))
        .py_ok(py)?;
    let gpus = out
        .gpus
        .into_iter()
        .map(|g| g as i64)
        .collect::<Vec<_>>()
        .into_pyarray(py);
    Ok((
        gpus,
        out.start_seconds,
        out.final_seconds,
        out.iterations,
        out.accepted,
    ))
}

/// Bandwidth factor of a path with packet loss rate `loss` (0.01 = 1 %), per the cost model.
#[pyfunction]
fn loss_factor(loss: f64) -> f64 {
    gpuplace_core::cost::loss_factor(loss)
}

/// Quadratic assignment: minimise sum_ij traffic[i,j] * distance[perm[i], perm[j]]. Traffic is
/// either dense (`n x n`) or sparse rows (src, dst, weight) with `n`; distance is `m x m`.
/// Returns (perm, cost, iterations, elapsed seconds).
#[pyfunction]
#[pyo3(signature = (distance, n, traffic_dense=None, traffic_src=None, traffic_dst=None, traffic_weight=None, time_limit=1.0, seed=0, threads=1, initial=None, max_iterations=None))]
#[allow(clippy::too_many_arguments)]
fn map_ranks<'py>(
    py: Python<'py>,
    distance: PyReadonlyArray2<'_, f64>,
    n: usize,
    traffic_dense: Option<PyReadonlyArray2<'_, f64>>,
    traffic_src: Option<PyReadonlyArray1<'_, i64>>,
    traffic_dst: Option<PyReadonlyArray1<'_, i64>>,
    traffic_weight: Option<PyReadonlyArray1<'_, f64>>,
    time_limit: f64,
    seed: u64,
    threads: usize,
    initial: Option<PyReadonlyArray1<'_, i64>>,
    max_iterations: Option<u64>,
) -> PyResult<(Bound<'py, PyArray1<i64>>, f64, u64, f64)> {
    use gpuplace_core::qap::{QapOptions, Traffic};
    let shape = distance.shape();
    if shape[0] != shape[1] {
        return Err(to_pyerr(
            py,
            CoreError::InvalidJob(format!(
                "distance must be a square matrix, got {} x {}",
                shape[0], shape[1]
            )),
        ));
    }
    let m = shape[0];
    let distance: Vec<f64> = distance.as_array().iter().copied().collect();
    let traffic = match (traffic_dense, traffic_src, traffic_dst, traffic_weight) {
        (Some(dense), None, None, None) => {
            let t = dense.shape();
            if t[0] != t[1] || t[0] != n {
                return Err(to_pyerr(
                    py,
                    CoreError::InvalidJob(format!(
                        "traffic must be a square n x n matrix, got {} x {}",
                        t[0], t[1]
                    )),
                ));
            }
            Traffic::Dense {
                n,
                values: dense.as_array().iter().copied().collect(),
            }
        }
        (None, Some(src), Some(dst), Some(w)) => {
            let src = array_u32("traffic source rank", &src, CoreError::InvalidJob).py_ok(py)?;
            let dst =
                array_u32("traffic destination rank", &dst, CoreError::InvalidJob).py_ok(py)?;
            let w: Vec<f64> = w.as_array().iter().copied().collect();
            if src.len() != dst.len() || src.len() != w.len() {
                return Err(to_pyerr(
                    py,
                    CoreError::InvalidJob("traffic rows differ in length".into()),
                ));
            }
            Traffic::Sparse {
                n,
                edges: src
                    .into_iter()
                    .zip(dst)
                    .zip(w)
                    .map(|((a, b), t)| (a, b, t))
                    .collect(),
            }
        }
        _ => {
            return Err(to_pyerr(
                py,
                CoreError::InvalidJob("give either a dense traffic matrix or sparse rows".into()),
            ))
        }
    };
    let initial = match initial {
        None => None,
        Some(a) => Some(
            array_u32("initial", &a, CoreError::InvalidJob)
                .py_ok(py)?
                .into_iter()
                .map(|v| v as usize)
                .collect(),
        ),
    };
    if !(time_limit.is_finite() && time_limit >= 0.0) {
        return Err(to_pyerr(
            py,
            CoreError::InvalidJob(format!("time_limit must be >= 0 seconds, got {time_limit}")),
        ));
    }
    let opts = QapOptions {
        time_limit: std::time::Duration::from_secs_f64(time_limit),
        seed,
        threads,
        initial,
        max_iterations,
    };
    let mapping = py
        .detach(|| gpuplace_core::qap::map_ranks(&traffic, &distance, m, &opts))
        .map_err(CoreError::from)
        .py_ok(py)?;
    let perm = mapping
        .perm
        .into_iter()
        .map(|p| p as i64)
        .collect::<Vec<_>>()
        .into_pyarray(py);
    Ok((
        perm,
        mapping.cost,
        mapping.iterations,
        mapping.elapsed.as_secs_f64(),
    ))
}

/// Names of the solvers implemented in Rust.
#[pyfunction]
fn rust_solvers() -> Vec<&'static str> {
    solvers::SOLVERS.to_vec()
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTopology>()?;
    m.add_class::<PyJobSpec>()?;
    m.add_class::<PyClusterState>()?;
    m.add_function(wrap_pyfunction!(evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(place, m)?)?;
    m.add_function(wrap_pyfunction!(refine, m)?)?;
    m.add_function(wrap_pyfunction!(map_ranks, m)?)?;
    m.add_function(wrap_pyfunction!(rust_solvers, m)?)?;
    m.add_function(wrap_pyfunction!(loss_factor, m)?)?;
    pricing::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
