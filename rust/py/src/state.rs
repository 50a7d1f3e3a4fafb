//! `gpuplace._core.ClusterState`: which GPUs are free, allocated or out of service, the
//! health of every component, spares, and repair of a running job.

use gpuplace_core::repair::{self, MoveReason, RepairOptions, SparePolicy};
use gpuplace_core::state::{Component, ComponentHealth, Condition, GpuStatus};
use gpuplace_core::ClusterState;
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::convert::{affected_list, gpus_from, i64s, id_array};
use crate::errors::{enter, invalid_job, invalid_state, invalid_topology, CoreResultExt, Stop};
use crate::job::PyJobSpec;
use crate::topology::PyTopology;

#[pyclass(name = "ClusterState", module = "gpuplace._core")]
pub(crate) struct PyClusterState {
    pub(crate) inner: ClusterState,
}

/// Decode components given as parallel arrays: kind 0 GPU (a = id), 1 host (a = host index),
/// 2 NIC (a = NIC id), 3 switch (a = level, b = domain).
fn components_from(kinds: &[i64], a: &[i64], b: &[i64]) -> PyResult<Vec<Component>> {
    if kinds.len() != a.len() || kinds.len() != b.len() {
        return Err(invalid_state("component kinds and ids differ in length"));
    }
    let id = |v: i64| {
        u32::try_from(v).map_err(|_| invalid_state(format!("{v} is not a valid component id")))
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
                other => return Err(invalid_state(format!("unknown component kind {other}"))),
            })
        })
        .collect()
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
            return Err(invalid_topology(format!("level {level} does not exist")));
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
    fn new(topology: &PyTopology, gpu_nic: Option<PyReadonlyArray1<'_, i64>>) -> PyResult<Self> {
        let inner = match gpu_nic {
            None => ClusterState::new(topology.inner.clone()),
            Some(map) => {
                let map: Vec<u32> = i64s(&map)
                    .into_iter()
                    .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
                    .collect();
                ClusterState::with_nics(topology.inner.clone(), map).py()?
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
                    .ok_or_else(|| invalid_state(format!("unknown condition {c}")))?,
                factor,
                reason,
            }),
        };
        let inner = &mut self.inner;
        let affected = enter(py, Stop::Never, || inner.set_condition(&targets, health))?;
        affected_list(py, affected)
    }

    /// Components that are not ok: [(kind, a, b, condition code, factor, reason)].
    fn components(&self) -> Vec<(u8, u32, u32, u8, f64, String)> {
        self.inner
            .components()
            .into_iter()
            .map(|(c, h)| {
                let (kind, a, b) = match c {
                    Component::Gpu(g) => (0, g, 0),
                    Component::Node(n) => (1, n, 0),
                    Component::Nic(n) => (2, n, 0),
                    Component::Switch { level, domain } => (3, level, domain),
                };
                (kind, a, b, h.condition as u8, h.factor, h.reason)
            })
            .collect()
    }

    /// Reserve (or un-reserve) spare GPUs for repairs; all or nothing.
    fn set_spare(&mut self, gpus: PyReadonlyArray1<'_, i64>, spare: bool) -> PyResult<()> {
        let gpus = gpus_from(&gpus)?;
        self.inner.set_spare(&gpus, spare).py()
    }

    /// Reserved spare mask.
    fn spare_mask<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        self.inner.spares().to_vec().into_pyarray(py)
    }

    /// Mask of GPUs some degraded component slows down.
    fn degraded_mask<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        self.gpu_mask(py, ClusterState::is_degraded)
    }

    /// Check every incremental counter and derived array against a recount; raises
    /// InvalidState naming the first difference.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        let inner = &self.inner;
        enter(py, Stop::Never, || inner.check())
    }

    /// Repair job `name` in place (all or nothing); returns a dict with the new GPUs, the
    /// moves (rank, old GPU, new GPU, reason code 0 lost / 1 unit moved / 2 improvement,
    /// level of the unit or -1) and the costs before and after (s).
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
        job.check_state(self)?;
        let spares = match spares {
            "allow" => SparePolicy::Allow,
            "forbid" => SparePolicy::Forbid,
            "only" => SparePolicy::Only,
            other => {
                return Err(invalid_job(format!(
                    "spares must be allow, forbid or only, got {other:?}"
                )))
            }
        };
        let time_limit = match time_limit {
            None => None,
            Some(t) if t.is_finite() && t > 0.0 => Some(std::time::Duration::from_secs_f64(t)),
            Some(t) => {
                return Err(invalid_job(format!(
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
        let plan = enter(py, Stop::OnSignal, || {
            repair::repair(inner, &spec, name, &opts)
        })?;
        let out = PyDict::new(py);
        out.set_item("gpus", id_array(py, &plan.gpus))?;
        let moves: Vec<(u32, u32, u32, u8, i64)> = plan
            .moves
            .iter()
            .map(|m| {
                let (code, level) = match m.reason {
                    MoveReason::Lost => (0, -1),
                    MoveReason::UnitMoved { level } => (1, level as i64),
                    MoveReason::Improvement => (2, -1),
                };
                (m.rank, m.old_gpu, m.new_gpu, code, level)
            })
            .collect();
        out.set_item("moves", moves)?;
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

    fn allocate(&mut self, name: &str, gpus: PyReadonlyArray1<'_, i64>) -> PyResult<()> {
        let gpus = gpus_from(&gpus)?;
        self.inner.allocate(name, &gpus).py()
    }

    fn release<'py>(&mut self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let gpus = self.inner.release(name).py()?;
        Ok(id_array(py, &gpus))
    }

    /// Set the health code (0 ok, 1 failed, 2 drained) of GPUs; returns [(job, ranks)].
    fn set_health<'py>(
        &mut self,
        py: Python<'py>,
        gpus: PyReadonlyArray1<'_, i64>,
        code: u8,
    ) -> PyResult<Bound<'py, PyList>> {
        let status = GpuStatus::from_code(code)
            .ok_or_else(|| invalid_state(format!("unknown health code {code}")))?;
        let gpus = gpus_from(&gpus)?;
        let affected = self.inner.set_health(&gpus, status).py()?;
        affected_list(py, affected)
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
            return Err(invalid_state(format!("GPU {gpu} does not exist")));
        }
        Ok(self.inner.owner_of(gpu).map(str::to_string))
    }

    /// GPU of each rank of one job, or None when no job has that name.
    fn job_gpus<'py>(&self, py: Python<'py>, name: &str) -> Option<Bound<'py, PyArray1<i64>>> {
        self.inner.job(name).map(|alloc| id_array(py, &alloc.gpus))
    }

    /// {job name: GPU per rank}, in allocation-slot order.
    fn jobs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for alloc in self.inner.jobs() {
            out.set_item(&alloc.name, id_array(py, &alloc.gpus))?;
        }
        Ok(out)
    }

    fn memory_bytes(&self) -> usize {
        self.inner.memory_bytes()
    }
}
