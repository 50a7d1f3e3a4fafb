//! `gpuplace._core.ClusterState`: which GPUs are free, allocated or out of service, the
//! health of every component, spares, and repair of a running job.

use gpuplace_core::repair::{self, MoveReason as CoreMoveReason, RepairOptions};
use gpuplace_core::request::{self, Report, Request};
use gpuplace_core::state::{Component, ComponentHealth};
use gpuplace_core::ClusterState;
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::convert::{affected_list, gpus_from, i64s, id_array};
use crate::enums::{ComponentKind, Condition as EnumCondition, Health, MoveReason, SparePolicy};
use crate::errors::{enter, invalid_job, invalid_state, invalid_topology, CoreResultExt, Stop};
use crate::fabric::{io_demands, IoTuple};
use crate::job::PyJobSpec;
use crate::solve::PyCostReport;
use crate::topology::PyTopology;

#[pyclass(name = "ClusterState", module = "gpuplace._core")]
pub(crate) struct PyClusterState {
    pub(crate) inner: ClusterState,
}

/// Decode components given as parallel arrays of `ComponentKind` codes and ids: a GPU or a
/// host (a = its id or host index), a NIC (a = NIC id) or a switch (a = level, b = domain).
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
            let kind = usize::try_from(k)
                .ok()
                .and_then(|k| ComponentKind::MEMBERS.get(k))
                .ok_or_else(|| invalid_state(format!("unknown component kind {k}")))?;
            Ok(match kind {
                ComponentKind::Gpu => Component::Gpu(id(a)?),
                ComponentKind::Host => Component::Node(id(a)?),
                ComponentKind::Nic => Component::Nic(id(a)?),
                ComponentKind::Switch => Component::Switch {
                    level: id(a)?,
                    domain: id(b)?,
                },
            })
        })
        .collect()
}

/// A component as (kind, a, b): a GPU or host (a = its id), a NIC (a = NIC id) or a switch
/// (a = level, b = domain); the inverse of [`components_from`].
fn component_code(c: Component) -> (ComponentKind, u32, u32) {
    match c {
        Component::Gpu(g) => (ComponentKind::Gpu, g, 0),
        Component::Node(n) => (ComponentKind::Host, n, 0),
        Component::Nic(n) => (ComponentKind::Nic, n, 0),
        Component::Switch { level, domain } => (ComponentKind::Switch, level, domain),
    }
}

/// One rank a repair moved.
#[pyclass(frozen, get_all, module = "gpuplace._core", name = "RankMove")]
pub(crate) struct PyRankMove {
    rank: u32,
    old_gpu: u32,
    new_gpu: u32,
    reason: MoveReason,
    /// The level of the confined group that moved whole (None unless `GroupMoved`).
    level: Option<usize>,
    /// The degraded component it left, as in `ClusterState.components()` (None unless
    /// `Evacuated`).
    component: Option<(ComponentKind, u32, u32)>,
}

/// What a repair did (already applied to the state).
#[pyclass(frozen, module = "gpuplace._core", name = "RepairPlan")]
pub(crate) struct PyRepairPlan {
    gpus: Vec<u32>,
    #[pyo3(get)]
    moves: Vec<Py<PyRankMove>>,
    /// Communication time per step (s) before (as if the lost hardware still worked) and
    /// after the repair.
    #[pyo3(get)]
    cost_before: f64,
    #[pyo3(get)]
    cost_after: f64,
    /// The cost reports behind `cost_before` and `cost_after` (the repair priced both).
    #[pyo3(get)]
    report_before: Py<PyCostReport>,
    #[pyo3(get)]
    report_after: Py<PyCostReport>,
    #[pyo3(get)]
    evaluations: usize,
    /// Seconds the repair itself took inside the core (pricing what the placements share
    /// with the running jobs and the stores, done in the same call, not included).
    #[pyo3(get)]
    repair_seconds: f64,
}

#[pymethods]
impl PyRepairPlan {
    /// The new GPU of every rank.
    #[getter]
    fn gpus<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        id_array(py, &self.gpus)
    }
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

    /// Set the condition of components (`Condition.Ok` recovers them); all or nothing.
    /// Returns [(job, ranks)] of the jobs on the GPUs affected.
    #[allow(clippy::too_many_arguments)]
    fn set_condition<'py>(
        &mut self,
        py: Python<'py>,
        kinds: PyReadonlyArray1<'_, i64>,
        a: PyReadonlyArray1<'_, i64>,
        b: PyReadonlyArray1<'_, i64>,
        condition: EnumCondition,
        factor: f64,
        reason: String,
    ) -> PyResult<Bound<'py, PyList>> {
        let targets = components_from(&i64s(&kinds), &i64s(&a), &i64s(&b))?;
        let health = condition.to_core().map(|condition| ComponentHealth {
            condition,
            factor,
            reason,
        });
        let inner = &mut self.inner;
        let affected = enter(py, Stop::Never, || inner.set_condition(&targets, health))?;
        affected_list(py, affected)
    }

    /// Components that are not ok: [(kind, a, b, condition, factor, reason)].
    fn components(&self) -> Vec<(ComponentKind, u32, u32, EnumCondition, f64, String)> {
        self.inner
            .components()
            .into_iter()
            .map(|(c, h)| {
                let (kind, a, b) = component_code(c);
                let condition = EnumCondition::from_core(Some(h.condition));
                (kind, a, b, condition, h.factor, h.reason)
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

    /// Repair job `name` in place (all or nothing); returns what it did, with the full
    /// reports (contention, the storage seconds of `io`) of the placement before and after.
    /// Ctrl-C stops it (the state is then unchanged).
    #[pyo3(signature = (job, name, max_moves=0, spares=SparePolicy::Allow, max_evaluations=24, time_limit=None, io=None))]
    #[allow(clippy::too_many_arguments)]
    fn repair(
        &mut self,
        py: Python<'_>,
        job: &PyJobSpec,
        name: &str,
        max_moves: usize,
        spares: SparePolicy,
        max_evaluations: usize,
        time_limit: Option<f64>,
        io: Option<Vec<IoTuple>>,
    ) -> PyResult<PyRepairPlan> {
        job.check_state(self)?;
        let request = Request {
            io: io_demands(&self.inner, io.unwrap_or_default())?,
            power: None,
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
            spares: spares.to_core(),
            max_evaluations,
            time_limit,
        };
        let spec = job.inner.clone();
        let inner = &mut self.inner;
        let (plan, before, seconds, after) = enter(py, Stop::OnSignal, || {
            // What the old placement shares with the others, seen before it moves (priced
            // with the repair's own report of it when no neighbour meets it).
            let shared = match inner.job(name) {
                Some(alloc) => Some(request::Shared::of(inner, &spec, &alloc.gpus, &request)?),
                None => None,
            };
            let start = std::time::Instant::now();
            let plan = repair::repair(inner, &spec, name, &opts)?;
            let seconds = start.elapsed().as_secs_f64();
            let (contention, io) = shared
                .map(|s| s.finish(plan.report_before.comm_seconds))
                .unwrap_or_default();
            let before = Report::new(plan.report_before.clone(), contention, io);
            // Nothing moved: the placement and its costs are as they were.
            let after = if plan.moves.is_empty() {
                before.clone()
            } else {
                let cost = plan.report_after.clone();
                request::complete(inner, &spec, &plan.gpus, cost, &request)?
            };
            Ok((plan, before, seconds, after))
        })?;
        let before = PyCostReport::from_report(py, before)?;
        let after = PyCostReport::from_report(py, after)?;
        let moves = plan
            .moves
            .iter()
            .map(|m| {
                let (reason, level, component) = match m.reason {
                    CoreMoveReason::Lost => (MoveReason::Lost, None, None),
                    CoreMoveReason::UnitMoved { level } => {
                        (MoveReason::GroupMoved, Some(level), None)
                    }
                    CoreMoveReason::Improvement => (MoveReason::Improvement, None, None),
                    CoreMoveReason::Evacuated { component } => {
                        (MoveReason::Evacuated, None, Some(component_code(component)))
                    }
                };
                let moved = PyRankMove {
                    rank: m.rank,
                    old_gpu: m.old_gpu,
                    new_gpu: m.new_gpu,
                    reason,
                    level,
                    component,
                };
                Py::new(py, moved)
            })
            .collect::<PyResult<_>>()?;
        Ok(PyRepairPlan {
            gpus: plan.gpus,
            moves,
            cost_before: plan.cost_before,
            cost_after: plan.cost_after,
            report_before: Py::new(py, before)?,
            report_after: Py::new(py, after)?,
            evaluations: plan.evaluations,
            repair_seconds: seconds,
        })
    }

    fn copy(&self) -> Self {
        PyClusterState {
            inner: self.inner.clone(),
        }
    }

    /// With `job`, the job's flows load the fabric's uplinks until it is released; `io`
    /// adds its storage traffic (see `fabric::io_demands`).
    #[pyo3(signature = (name, gpus, job=None, io=None))]
    fn allocate(
        &mut self,
        name: &str,
        gpus: PyReadonlyArray1<'_, i64>,
        job: Option<&PyJobSpec>,
        io: Option<Vec<IoTuple>>,
    ) -> PyResult<()> {
        let gpus = gpus_from(&gpus)?;
        let spec = match job {
            Some(j) => {
                j.check_state(self)?;
                Some(j.inner.clone())
            }
            None => None,
        };
        let io = io_demands(&self.inner, io.unwrap_or_default())?;
        self.inner.allocate_job_io(name, &gpus, spec, io).py()
    }

    fn release<'py>(&mut self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let gpus = self.inner.release(name).py()?;
        Ok(id_array(py, &gpus))
    }

    /// Set the health of GPUs; returns [(job, ranks)] of the jobs holding them.
    fn set_health<'py>(
        &mut self,
        py: Python<'py>,
        gpus: PyReadonlyArray1<'_, i64>,
        status: Health,
    ) -> PyResult<Bound<'py, PyList>> {
        let gpus = gpus_from(&gpus)?;
        let affected = self.inner.set_health(&gpus, status.to_core()).py()?;
        affected_list(py, affected)
    }

    /// Health of every GPU, as `Health` codes.
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

    #[getter]
    fn total_free(&self) -> u32 {
        self.inner.total_free()
    }

    /// Raises Infeasible (the core's message, with the counts) unless `num_ranks` GPUs are
    /// free and healthy.
    fn check_capacity(&self, num_ranks: usize) -> PyResult<()> {
        self.inner.check_capacity(num_ranks).py()
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
