//! Solving and pricing: the cost model, the Rust solvers behind the placement gate, refine and
//! the rank-mapping (quadratic assignment) search.

use std::sync::Arc;

use gpuplace_core::request::{self, Report, Request};
use gpuplace_core::solvers::{self, SolveOptions};
use gpuplace_core::{CoreError, CostReport};
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::convert::{f64s, gpus_from, id_array, ids};
use crate::errors::{enter, invalid_job, invalid_state, Stop};
use crate::fabric::{hot_uplinks, io_demands, IoTuple, PyHotUplink};
use crate::job::PyJobSpec;
use crate::power::{Declared, PyPowerLedger};
use crate::state::PyClusterState;
use crate::topology::PyTopology;

/// Everything one placement costs (see `request::Report` in the core): the cost model's
/// report, and what the placement shares with the running jobs and its stores.
#[pyclass(frozen, module = "gpuplace._core", name = "CostReport")]
pub(crate) struct PyCostReport {
    pub(crate) inner: CostReport,
    alone_seconds: Option<f64>,
    hot_uplinks: Vec<Py<PyHotUplink>>,
    io_seconds: f64,
}

impl PyCostReport {
    /// A report with nothing shared (priced without a state).
    pub(crate) fn plain(inner: CostReport) -> PyCostReport {
        PyCostReport {
            inner,
            alone_seconds: None,
            hot_uplinks: Vec::new(),
            io_seconds: 0.0,
        }
    }

    /// The bindings' form of the core's one report.
    pub(crate) fn from_report(py: Python<'_>, report: Report) -> PyResult<PyCostReport> {
        let (alone_seconds, hot_uplinks) = match report.contention {
            Some(seen) => (Some(seen.alone_seconds), hot_uplinks(py, seen.uplinks)?),
            None => (None, Vec::new()),
        };
        Ok(PyCostReport {
            inner: report.cost,
            alone_seconds,
            hot_uplinks,
            io_seconds: report.io_seconds,
        })
    }
}

/// The request's storage traffic in the core's form.
fn request_of(state: &PyClusterState, io: Option<Vec<IoTuple>>) -> PyResult<Request> {
    Ok(Request {
        io: io_demands(&state.inner, io.unwrap_or_default())?,
        power: None,
    })
}

#[pymethods]
impl PyCostReport {
    /// In a state whose running jobs load the fabric: the same placement's communication
    /// seconds per step with nobody else on it (`comm_seconds` is then the contended time);
    /// None when nobody loads the fabric.
    #[getter]
    fn alone_seconds(&self) -> Option<f64> {
        self.alone_seconds
    }
    /// The uplink directions over capacity on the placement's paths, most oversubscribed
    /// first (empty unless the fabric is loaded).
    #[getter]
    fn hot_uplinks(&self, py: Python<'_>) -> Vec<Py<PyHotUplink>> {
        self.hot_uplinks.iter().map(|u| u.clone_ref(py)).collect()
    }
    /// Seconds per step of the job's storage traffic (not part of `comm_seconds`).
    #[getter]
    fn io_seconds(&self) -> f64 {
        self.io_seconds
    }
    /// Communication time per step (s).
    #[getter]
    fn comm_seconds(&self) -> f64 {
        self.inner.comm_seconds
    }
    /// Time per collective class (s), in the order of the job's `class_names`.
    #[getter]
    fn class_seconds(&self) -> Vec<f64> {
        self.inner.class_seconds.clone()
    }
    /// Time of the explicit traffic (s), included in `comm_seconds`.
    #[getter]
    fn traffic_seconds(&self) -> f64 {
        self.inner.traffic_seconds
    }
    /// Bytes per step whose path's lowest common level is each level.
    #[getter]
    fn bytes_by_level<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        self.inner.bytes_by_level.clone().into_pyarray(py)
    }
    /// The lowest level whose one domain holds every GPU of the job (None for one GPU).
    #[getter]
    fn span_level(&self) -> Option<usize> {
        self.inner.span_level
    }
    #[getter]
    fn confinement_ok(&self) -> bool {
        self.inner.confinement_ok
    }
    /// What broke confinement, in words.
    #[getter]
    fn violations(&self) -> Vec<String> {
        self.inner.violations.clone()
    }
    /// The NCCL algorithm priced for the slowest collective of each class (`ring`, `tree`,
    /// `nvls`, `nvls-tree`, `collnet`, `pairwise`, `p2p`), in the order of `class_seconds`.
    #[getter]
    fn class_algorithms(&self) -> Vec<&'static str> {
        self.inner
            .class_algorithms
            .iter()
            .map(|a| a.name())
            .collect()
    }
    /// Step time (s): compute + pipeline bubble + exposed communication, plus the storage
    /// stalls (input reads longer than the step, checkpoint writes); None unless the job
    /// declares its compute and every host type it uses has a known GPU peak (likewise below).
    #[getter]
    fn step_seconds(&self) -> Option<f64> {
        self.inner.step.as_ref().map(|s| s.step_seconds)
    }
    /// Communication not hidden under compute (s).
    #[getter]
    fn exposed_comm_seconds(&self) -> Option<f64> {
        self.inner.step.as_ref().map(|s| s.exposed_comm_seconds)
    }
    /// Exposed time of each collective class (s), in the order of `class_seconds`.
    #[getter]
    fn exposed_class_seconds(&self) -> Option<Vec<f64>> {
        self.inner
            .step
            .as_ref()
            .map(|s| s.exposed_class_seconds.clone())
    }
    /// Compute per step without the bubble (s).
    #[getter]
    fn compute_seconds(&self) -> Option<f64> {
        self.inner.step.as_ref().map(|s| s.compute_seconds)
    }
    /// Pipeline bubble per step (s).
    #[getter]
    fn bubble_seconds(&self) -> Option<f64> {
        self.inner.step.as_ref().map(|s| s.bubble_seconds)
    }
    /// Model FLOPs utilisation (0..1).
    #[getter]
    fn mfu(&self) -> Option<f64> {
        self.inner.step.as_ref().map(|s| s.mfu)
    }
    /// Tokens per second (0 when the job's tokens per step are unknown).
    #[getter]
    fn tokens_per_second(&self) -> Option<f64> {
        self.inner.step.as_ref().map(|s| s.tokens_per_second)
    }
    /// The per-GPU peak the step was priced at (TFLOPS): the slowest host type's.
    #[getter]
    fn peak_tflops(&self) -> Option<f64> {
        self.inner.step.as_ref().map(|s| s.peak_tflops)
    }
    /// Input reads per step (s), prefetched under the step (`step_seconds` includes only
    /// `input_stall_seconds`, the part longer than the step).
    #[getter]
    fn input_seconds(&self) -> Option<f64> {
        self.inner.step.as_ref().map(|s| s.input_seconds)
    }
    /// The input reads not hidden under the step: the GPUs wait for data (s).
    #[getter]
    fn input_stall_seconds(&self) -> Option<f64> {
        self.inner.step.as_ref().map(|s| s.input_stall_seconds)
    }
    /// Checkpoint writes amortized per step: a checkpoint's stall over its interval (s).
    #[getter]
    fn checkpoint_seconds(&self) -> Option<f64> {
        self.inner.step.as_ref().map(|s| s.checkpoint_seconds)
    }
}

/// Evaluate a placement with the one cost model, on the hardware of `state` (degraded
/// components included) and against its running jobs' load on the fabric, when given; with
/// a state, the report also carries the contention and the storage seconds of `io`.
#[pyfunction]
#[pyo3(signature = (topology, job, gpus, state=None, io=None))]
pub(crate) fn evaluate<'py>(
    py: Python<'py>,
    topology: &PyTopology,
    job: &PyJobSpec,
    gpus: PyReadonlyArray1<'_, i64>,
    state: Option<PyRef<'py, PyClusterState>>,
    io: Option<Vec<IoTuple>>,
) -> PyResult<PyCostReport> {
    let gpus = gpus_from(&gpus)?;
    if !Arc::ptr_eq(&topology.inner, &job.topology) {
        return Err(invalid_job("the job was compiled for another topology"));
    }
    let (topo, spec) = (topology.inner.clone(), job.inner.clone());
    if let Some(st) = &state {
        if !Arc::ptr_eq(st.inner.topology(), &topo) {
            return Err(invalid_state("the state belongs to another topology"));
        }
    }
    // In a state: its degraded hardware and its running jobs' load on the fabric.
    match &state {
        Some(st) => {
            let request = request_of(st, io)?;
            let inner = &st.inner;
            let report = enter(py, Stop::Never, || {
                request::price(inner, &spec, &gpus, &request)
            })?;
            PyCostReport::from_report(py, report)
        }
        None => {
            if io.is_some_and(|io| !io.is_empty()) {
                return Err(invalid_state(
                    "storage seconds need a state to price them in",
                ));
            }
            let report = enter(py, Stop::Never, || {
                gpuplace_core::cost::evaluate(&topo, &spec, &gpus)
            })?;
            Ok(PyCostReport::plain(report))
        }
    }
}

/// The placement gate: check `gpus` proposed by `solver` against the state (length, no GPU
/// twice, free and healthy GPUs, confinement when the solver promises it) and price them on
/// the state's hardware, among its running jobs, with the storage seconds of `io`, in the
/// same call. Raises InvalidState naming what is wrong.
#[pyfunction]
#[pyo3(signature = (state, job, gpus, solver, confining, io=None))]
pub(crate) fn admit<'py>(
    py: Python<'py>,
    state: PyRef<'py, PyClusterState>,
    job: &PyJobSpec,
    gpus: PyReadonlyArray1<'_, i64>,
    solver: &str,
    confining: bool,
    io: Option<Vec<IoTuple>>,
) -> PyResult<PyCostReport> {
    job.check_state(&state)?;
    let what = format!("solver '{solver}' returned an invalid placement: GPU id");
    let gpus = ids(&what, &gpus, CoreError::InvalidState)?;
    let request = request_of(&state, io)?;
    let spec = job.inner.clone();
    let inner = &state.inner;
    let report = enter(py, Stop::Never, || {
        request::admit(inner, &spec, &gpus, solver, confining, &request)
    })?;
    PyCostReport::from_report(py, report)
}

/// What `place` returns: the GPU of each rank and its full cost report.
#[pyclass(frozen, get_all, module = "gpuplace._core", name = "PlaceResult")]
pub(crate) struct PyPlaceResult {
    /// The GPU of each rank.
    gpus: Py<PyArray1<i64>>,
    /// The placement's cost report (contention and storage included).
    cost: Py<PyCostReport>,
    /// The power phase slot it was placed in (0 without power domains).
    phase_slot: u32,
}

/// Run a Rust solver and pass its placement through the gate; returns the GPU of each rank
/// and its full cost report (contention, storage seconds of `io`), in one call. The state is
/// not changed. Ctrl-C stops a search. Where running jobs load the fabric, a candidate is
/// priced with that load and, with `neighbours`, with the time it adds to the running jobs.
/// With `power` (the budgets' ledger of the state's running jobs and the job's declared draw),
/// the solver runs in each phase slot on what the budgets leave free and the cheapest
/// placement wins (`request::place_within_power`); the result says its slot.
#[pyfunction]
#[pyo3(signature = (state, job, solver, seed=0, time_limit=None, neighbours=true, io=None, power=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn place<'py>(
    py: Python<'py>,
    state: Bound<'py, PyClusterState>,
    job: &PyJobSpec,
    solver: &str,
    seed: u64,
    time_limit: Option<f64>,
    neighbours: bool,
    io: Option<Vec<IoTuple>>,
    power: Option<(PyRef<'py, PyPowerLedger>, Declared)>,
) -> PyResult<PyPlaceResult> {
    let (opts, stop) = solve_options(solver, seed, time_limit, neighbours);
    let spec = job.inner.clone();
    let (gpus, report, phase_slot) = match power {
        // Without power the state is only read (other readers may hold it meanwhile).
        None => {
            let state = state.try_borrow()?;
            job.check_state(&state)?;
            let request = request_of(&state, io)?;
            let inner = &state.inner;
            enter(py, stop, || {
                let (gpus, report) = request::place(inner, &spec, solver, &opts, &request)?;
                Ok((gpus, report, 0))
            })?
        }
        // With power the budgets' fence is set and lifted around each slot's solve.
        Some((ledger, declared)) => {
            let mut state = state.try_borrow_mut()?;
            job.check_state(&state)?;
            let mut request = request_of(&state, io)?;
            request.power = Some(ledger.request(declared));
            let inner = &mut state.inner;
            enter(py, stop, || {
                request::place_within_power(inner, &spec, solver, &opts, &request)
            })?
        }
    };
    Ok(PyPlaceResult {
        gpus: id_array(py, &gpus).unbind(),
        cost: Py::new(py, PyCostReport::from_report(py, report)?)?,
        phase_slot,
    })
}

/// Run a Rust solver without the gate or pricing: the GPU of each rank. What a solver
/// written in Python calls to start from a Rust solver's answer (the placement then passes the
/// gate once, in `gpuplace.place`), and what asks whether a job fits now.
#[pyfunction]
#[pyo3(signature = (state, job, solver, seed=0, time_limit=None, neighbours=true))]
pub(crate) fn solve<'py>(
    py: Python<'py>,
    state: PyRef<'py, PyClusterState>,
    job: &PyJobSpec,
    solver: &str,
    seed: u64,
    time_limit: Option<f64>,
    neighbours: bool,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    job.check_state(&state)?;
    let spec = job.inner.clone();
    let inner = &state.inner;
    let (opts, stop) = solve_options(solver, seed, time_limit, neighbours);
    let gpus = enter(py, stop, || solvers::solve(solver, inner, &spec, &opts))?;
    Ok(id_array(py, &gpus))
}

/// A Rust solver's options, and whether its call checks for Ctrl-C (only the searching
/// solvers run long enough to need it).
fn solve_options(
    solver: &str,
    seed: u64,
    time_limit: Option<f64>,
    neighbours: bool,
) -> (SolveOptions, Stop) {
    let opts = SolveOptions {
        seed,
        time_limit,
        ignore_neighbours: !neighbours,
    };
    let stop = if solvers::searches(solver) {
        Stop::OnSignal
    } else {
        Stop::Never
    };
    (opts, stop)
}

/// What `refine` returns: the improved placement, its report, and how the search went.
#[pyclass(frozen, get_all, module = "gpuplace._core", name = "RefineResult")]
pub(crate) struct PyRefineResult {
    /// The GPU of each rank.
    gpus: Py<PyArray1<i64>>,
    /// The cost report of the result on the state (contention and storage included).
    cost: Py<PyCostReport>,
    /// Moves tried and accepted.
    iterations: u64,
    accepted: u64,
}

/// Improve a placement by local search; returns the GPUs, their full cost report on the
/// state (its hardware, its running jobs, the storage seconds of `io`), the iterations and
/// the accepted moves. The GPUs of `start` count as usable even if
/// allocated. Ctrl-C stops the search.
#[pyfunction]
#[pyo3(signature = (state, job, start, time_limit=0.5, seed=0, max_iterations=200_000, io=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn refine<'py>(
    py: Python<'py>,
    state: PyRef<'py, PyClusterState>,
    job: &PyJobSpec,
    start: PyReadonlyArray1<'_, i64>,
    time_limit: f64,
    seed: u64,
    max_iterations: u64,
    io: Option<Vec<IoTuple>>,
) -> PyResult<PyRefineResult> {
    job.check_state(&state)?;
    let start = gpus_from(&start)?;
    let request = request_of(&state, io)?;
    let spec = job.inner.clone();
    let inner = &state.inner;
    let opts = gpuplace_core::refine::RefineOptions {
        time_limit: std::time::Duration::from_secs_f64(time_limit.max(0.0)),
        max_iterations,
        seed,
    };
    let (out, report) = enter(py, Stop::OnSignal, || {
        let out = gpuplace_core::refine::refine(inner, &spec, &start, &opts)?;
        let report = request::price(inner, &spec, &out.gpus, &request)?;
        Ok((out, report))
    })?;
    Ok(PyRefineResult {
        gpus: id_array(py, &out.gpus).unbind(),
        cost: Py::new(py, PyCostReport::from_report(py, report)?)?,
        iterations: out.iterations,
        accepted: out.accepted,
    })
}

/// What `map_ranks` returns: the slot of each rank and what the search found.
#[pyclass(frozen, get_all, module = "gpuplace._core", name = "RankMapping")]
pub(crate) struct PyRankMapping {
    /// `perm[rank]` = the slot (row of the distance matrix) of each rank.
    perm: Py<PyArray1<i64>>,
    /// sum_ij traffic[i, j] * distance[perm[i], perm[j]].
    cost: f64,
    iterations: u64,
    /// Seconds the search ran.
    elapsed_s: f64,
}

/// Bandwidth factor of a link of `transport` (`roce`, the default, or `infiniband`) with
/// packet loss rate `loss` (0.01 = 1 %), per the cost model.
#[pyfunction]
#[pyo3(signature = (loss, transport = "roce"))]
pub(crate) fn loss_factor(loss: f64, transport: &str) -> PyResult<f64> {
    let transport = gpuplace_core::cost::LinkTransport::from_label(transport)
        .map_err(|e| crate::errors::invalid_topology(e.to_string()))?;
    Ok(gpuplace_core::cost::link_loss_factor(loss, transport))
}

/// Quadratic assignment: minimise sum_ij traffic[i,j] * distance[perm[i], perm[j]]. Traffic is
/// either dense (`n x n`) or sparse rows (src, dst, weight) with `n`; distance is `m x m`.
/// Returns a `RankMapping` (perm, cost, iterations, elapsed seconds).
#[pyfunction]
#[pyo3(signature = (distance, n, traffic_dense=None, traffic_src=None, traffic_dst=None, traffic_weight=None, time_limit=1.0, seed=0, threads=1, initial=None, max_iterations=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn map_ranks<'py>(
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
) -> PyResult<PyRankMapping> {
    use gpuplace_core::qap::{QapOptions, Traffic};
    let shape = distance.shape();
    if shape[0] != shape[1] {
        return Err(invalid_job(format!(
            "distance must be a square matrix, got {} x {}",
            shape[0], shape[1]
        )));
    }
    let m = shape[0];
    let distance: Vec<f64> = distance.as_array().iter().copied().collect();
    let traffic = match (traffic_dense, traffic_src, traffic_dst, traffic_weight) {
        (Some(dense), None, None, None) => {
            let t = dense.shape();
            if t[0] != t[1] || t[0] != n {
                return Err(invalid_job(format!(
                    "traffic must be a square n x n matrix, got {} x {}",
                    t[0], t[1]
                )));
            }
            Traffic::Dense {
                n,
                values: dense.as_array().iter().copied().collect(),
            }
        }
        (None, Some(src), Some(dst), Some(w)) => {
            let src = ids("traffic source rank", &src, CoreError::InvalidJob)?;
            let dst = ids("traffic destination rank", &dst, CoreError::InvalidJob)?;
            let w = f64s(&w);
            if src.len() != dst.len() || src.len() != w.len() {
                return Err(invalid_job("traffic rows differ in length"));
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
            return Err(invalid_job(
                "give either a dense traffic matrix or sparse rows",
            ))
        }
    };
    let initial = match initial {
        None => None,
        Some(a) => Some(
            ids("initial", &a, CoreError::InvalidJob)?
                .into_iter()
                .map(|v| v as usize)
                .collect(),
        ),
    };
    if !(time_limit.is_finite() && time_limit >= 0.0) {
        return Err(invalid_job(format!(
            "time_limit must be >= 0 seconds, got {time_limit}"
        )));
    }
    let opts = QapOptions {
        time_limit: std::time::Duration::from_secs_f64(time_limit),
        seed,
        threads,
        initial,
        max_iterations,
    };
    let mapping = enter(py, Stop::OnSignal, || {
        gpuplace_core::qap::map_ranks(&traffic, &distance, m, &opts).map_err(CoreError::from)
    })?;
    let perm = mapping
        .perm
        .into_iter()
        .map(|p| p as i64)
        .collect::<Vec<_>>()
        .into_pyarray(py);
    Ok(PyRankMapping {
        perm: perm.unbind(),
        cost: mapping.cost,
        iterations: mapping.iterations,
        elapsed_s: mapping.elapsed.as_secs_f64(),
    })
}

/// The solvers implemented in Rust: (name, description, keeps confinement).
#[pyfunction]
pub(crate) fn rust_solvers() -> Vec<(&'static str, &'static str, bool)> {
    solvers::SOLVERS
        .iter()
        .map(|&(name, description)| (name, description, solvers::confining(name)))
        .collect()
}

/// A lower bound on the communication seconds per step of every placement of `job` on the
/// free GPUs of `state`, in any state of its hardware and running jobs
/// (`cost::lower_bound` in the core), or None on hosts with a GPU bandwidth matrix. A
/// placement whose evaluated `comm_seconds` meets it is optimal.
#[pyfunction]
pub(crate) fn lower_bound(
    py: Python<'_>,
    state: PyRef<'_, PyClusterState>,
    job: &PyJobSpec,
) -> PyResult<Option<f64>> {
    job.check_state(&state)?;
    let spec = job.inner.clone();
    let inner = &state.inner;
    enter(py, Stop::Never, || {
        Ok(gpuplace_core::cost::lower_bound(inner, &spec))
    })
}
