//! Bindings of the fabric model (`gpuplace_core::fabric`): uplink capacities, the running
//! jobs' load, contention reports, and storage traffic (`gpuplace_core::storage`).

use std::sync::Arc;

use gpuplace_core::topology::check_placement;
use gpuplace_core::{fabric, storage, ClusterState, Routing};
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use crate::convert::{f64s, gpus_from};
use crate::errors::{enter, CoreResultExt, Stop};
use crate::job::PyJobSpec;
use crate::state::PyClusterState;
use crate::topology::PyTopology;

type Ids<'py> = Bound<'py, PyArray1<i64>>;
type Values<'py> = Bound<'py, PyArray1<f64>>;

/// The topology with, per level, its routing (`adaptive`, `ecmp`, `static`, `sharp`) and queue
/// pairs per connection (empty lists: adaptive, one queue pair).
#[pyfunction]
fn with_routing(
    py: Python<'_>,
    topology: &PyTopology,
    routing: Vec<String>,
    qps_per_connection: Vec<u32>,
) -> PyResult<PyTopology> {
    let topo = topology.inner.as_ref().clone();
    let inner = enter(py, Stop::Never, || {
        let routing = routing
            .iter()
            .map(|r| Routing::from_label(r))
            .collect::<gpuplace_core::Result<Vec<_>>>()?;
        topo.with_routing(routing, qps_per_connection)
    })?;
    Ok(PyTopology {
        inner: Arc::new(inner),
    })
}

/// One level's uplinks as a job's flows cross them (see `fabric::LevelCrossing`).
#[pyclass(frozen, get_all, module = "gpuplace._core", name = "LevelCrossing")]
pub(crate) struct PyLevelCrossing {
    /// The level whose domains' uplinks these are.
    level: usize,
    /// `adaptive`, `ecmp`, `static` or `sharp`.
    routing: &'static str,
    qps_per_connection: u32,
    /// Connections at the link rate of the job's heaviest class leaving domains of the level.
    flows: f64,
    /// Uplinks of the level the job's flows leave by.
    uplinks: usize,
    /// Parallel links of the worst of them.
    links: usize,
    /// Expected load of its fullest link (hashed) or mean load per link (balanced).
    fullest: f64,
    /// The smallest share of a link's rate one of the job's flows gets there.
    share: f64,
}

/// What hashing costs a placed job (see `fabric::CollisionReport`).
#[pyclass(frozen, get_all, module = "gpuplace._core", name = "CollisionReport")]
pub(crate) struct PyCollisionReport {
    /// Every level with uplinks, bottom-up.
    levels: Vec<Py<PyLevelCrossing>>,
    /// Communication time per step as routed (s).
    seconds: f64,
    /// The same with every level balanced (s).
    balanced_seconds: f64,
}

/// The flows of a placed job crossing each uplink level, their share among the running jobs'
/// flows (hash collisions included), and its time as routed and balanced.
#[pyfunction]
fn collisions(
    py: Python<'_>,
    state: PyRef<'_, PyClusterState>,
    job: &PyJobSpec,
    gpus: PyReadonlyArray1<'_, i64>,
) -> PyResult<PyCollisionReport> {
    job.check_state(&state)?;
    let gpus = gpus_from(&gpus)?;
    let (inner, spec) = (&state.inner, job.inner.clone());
    let report = enter(py, Stop::Never, || fabric::collisions(inner, &spec, &gpus))?;
    let levels = report
        .levels
        .into_iter()
        .map(|c| {
            Py::new(
                py,
                PyLevelCrossing {
                    level: c.level,
                    routing: c.routing.label(),
                    qps_per_connection: c.qps_per_connection,
                    flows: c.flows,
                    uplinks: c.uplinks,
                    links: c.links,
                    fullest: c.fullest,
                    share: c.share,
                },
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(PyCollisionReport {
        levels,
        seconds: report.seconds,
        balanced_seconds: report.balanced_seconds,
    })
}

/// Every uplink of a topology: (level, domain, capacity GB/s each direction) as arrays,
/// indexed by uplink id.
#[pyfunction]
fn uplinks<'py>(py: Python<'py>, topology: &PyTopology) -> (Ids<'py>, Ids<'py>, Values<'py>) {
    let topo = &topology.inner;
    let (levels, domains): (Vec<i64>, Vec<i64>) = (0..topo.uplink_count())
        .map(|u| {
            let (l, d) = topo.uplink_owner(u);
            (l as i64, d as i64)
        })
        .unzip();
    (
        levels.into_pyarray(py),
        domains.into_pyarray(py),
        topo.uplink_gbps().to_vec().into_pyarray(py),
    )
}

/// The topology with other uplink capacities (GB/s each direction, by uplink id).
#[pyfunction]
fn with_uplink_gbps(
    py: Python<'_>,
    topology: &PyTopology,
    capacity: PyReadonlyArray1<'_, f64>,
) -> PyResult<PyTopology> {
    let capacity = f64s(&capacity);
    let topo = topology.inner.as_ref().clone();
    let inner = enter(py, Stop::Never, || topo.with_uplink_gbps(capacity))?;
    Ok(PyTopology {
        inner: Arc::new(inner),
    })
}

/// The running jobs' load per uplink direction (GB/s; index 2 * uplink + 0 up, + 1 down). Used
/// only by tests (tests/bindings/).
#[pyfunction]
fn fabric_load<'py>(
    py: Python<'py>,
    state: PyRef<'py, PyClusterState>,
) -> Bound<'py, PyArray1<f64>> {
    let n = 2 * state.inner.topology().uplink_count();
    state
        .inner
        .fabric_load()
        .map(<[f64]>::to_vec)
        .unwrap_or_else(|| vec![0.0; n])
        .into_pyarray(py)
}

/// A job's load per uplink direction: (slots, GB/s). Used only by tests (tests/bindings/).
#[pyfunction]
fn job_load<'py>(
    py: Python<'py>,
    job: &PyJobSpec,
    gpus: PyReadonlyArray1<'_, i64>,
) -> PyResult<(Ids<'py>, Values<'py>)> {
    let gpus = gpus_from(&gpus)?;
    check_placement(&job.topology, job.inner.num_ranks, &gpus).py()?;
    let (topo, spec) = (&job.topology, &job.inner);
    let load = enter(py, Stop::Never, || Ok(fabric::job_load(topo, spec, &gpus)))?;
    let (slots, values): (Vec<i64>, Vec<f64>) =
        load.into_iter().map(|(s, v)| (s as i64, v)).unzip();
    Ok((slots.into_pyarray(py), values.into_pyarray(py)))
}

/// One uplink direction over capacity on a job's path (see `fabric::HotUplink`).
#[pyclass(frozen, get_all, module = "gpuplace._core", name = "HotUplink")]
pub(crate) struct PyHotUplink {
    /// The uplink id (see `uplinks`).
    uplink: usize,
    /// 0 up (towards the top of the tree), 1 down.
    direction: usize,
    /// Capacity, each direction (GB/s).
    capacity_gbps: f64,
    /// The job's own demand (its heaviest class) on it (GB/s).
    own_gbps: f64,
    /// Every other job's demand (GB/s).
    others_gbps: f64,
    /// The other jobs loading it, heaviest first: [(job, GB/s)].
    jobs: Vec<(String, f64)>,
}

/// A job priced with its neighbours (see `fabric::ContentionReport`).
#[pyclass(frozen, get_all, module = "gpuplace._core", name = "ContentionReport")]
pub(crate) struct PyContentionReport {
    /// Communication time per step with nobody else on the fabric (s).
    alone_seconds: f64,
    /// Communication time per step with the running jobs' load (s).
    contended_seconds: f64,
    /// The uplinks over capacity on the job's paths, most oversubscribed first.
    uplinks: Vec<Py<PyHotUplink>>,
}

/// The bindings' form of the core's hot uplinks.
pub(crate) fn hot_uplinks(
    py: Python<'_>,
    uplinks: Vec<fabric::HotUplink>,
) -> PyResult<Vec<Py<PyHotUplink>>> {
    uplinks
        .into_iter()
        .map(|u| {
            Py::new(
                py,
                PyHotUplink {
                    uplink: u.uplink,
                    direction: u.direction,
                    capacity_gbps: u.capacity_gbps,
                    own_gbps: u.own_gbps,
                    others_gbps: u.others_gbps,
                    jobs: u.jobs,
                },
            )
        })
        .collect()
}

/// A job priced with its neighbours: alone and contended seconds, and the uplinks over
/// capacity on its paths.
#[pyfunction]
fn contention(
    py: Python<'_>,
    state: PyRef<'_, PyClusterState>,
    job: &PyJobSpec,
    gpus: PyReadonlyArray1<'_, i64>,
) -> PyResult<PyContentionReport> {
    job.check_state(&state)?;
    let gpus = gpus_from(&gpus)?;
    let (inner, spec) = (&state.inner, job.inner.clone());
    let report = enter(py, Stop::Never, || fabric::contention(inner, &spec, &gpus))?;
    let uplinks = hot_uplinks(py, report.uplinks)?;
    Ok(PyContentionReport {
        alone_seconds: report.alone_seconds,
        contended_seconds: report.contended_seconds,
        uplinks,
    })
}

/// Seconds per step placing `job` on `gpus` adds to the running jobs.
#[pyfunction]
fn added_to_neighbours(
    py: Python<'_>,
    state: PyRef<'_, PyClusterState>,
    job: &PyJobSpec,
    gpus: PyReadonlyArray1<'_, i64>,
) -> PyResult<f64> {
    job.check_state(&state)?;
    let gpus = gpus_from(&gpus)?;
    check_placement(&job.topology, job.inner.num_ranks, &gpus).py()?;
    let (inner, spec) = (&state.inner, job.inner.clone());
    enter(py, Stop::Never, || {
        fabric::added_to_neighbours(inner, &spec, &gpus)
    })
}

/// The most loaded uplink directions: [(slot, load GB/s, capacity GB/s)].
#[pyfunction]
fn hottest_uplinks(state: PyRef<'_, PyClusterState>, count: usize) -> Vec<(usize, f64, f64)> {
    fabric::hottest_uplinks(&state.inner, count)
}

/// Per uplink level, bottom-up: (level, directions, loaded, over capacity, the `count`
/// hottest [(slot, load GB/s, capacity GB/s)]).
#[pyfunction]
fn uplinks_by_level(state: PyRef<'_, PyClusterState>, count: usize) -> Vec<LevelLoadTuple> {
    fabric::uplinks_by_level(&state.inner, count)
        .into_iter()
        .map(|l| (l.level, l.directions, l.loaded, l.over_capacity, l.hottest))
        .collect()
}

type LevelLoadTuple = (usize, usize, usize, usize, Vec<(usize, f64, f64)>);

/// Running jobs by slowdown from contention: [(name, alone s, contended s)].
#[pyfunction]
fn jobs_hurt(
    py: Python<'_>,
    state: PyRef<'_, PyClusterState>,
) -> PyResult<Vec<(String, f64, f64)>> {
    let inner = &state.inner;
    enter(py, Stop::Never, || fabric::jobs_hurt(inner))
}

/// A job's storage traffic on one store: (level, domain, read GB/s, write GB/s, read bytes,
/// write bytes), level < 0 for a store on every host.
pub(crate) type IoTuple = (i64, usize, f64, f64, f64, f64);

fn store_of(
    state: &ClusterState,
    level: i64,
    domain: usize,
    read_gbps: f64,
    write_gbps: f64,
) -> PyResult<storage::Store> {
    let attach = match usize::try_from(level) {
        Ok(level) => storage::Attach::Domain { level, domain },
        Err(_) => storage::Attach::Local,
    };
    storage::Store::new(state.topology(), attach, read_gbps, write_gbps).py()
}

pub(crate) fn io_demands(
    state: &ClusterState,
    io: Vec<IoTuple>,
) -> PyResult<Vec<storage::IoDemand>> {
    io.into_iter()
        .map(
            |(level, domain, read_gbps, write_gbps, read_bytes, write_bytes)| {
                Ok(storage::IoDemand {
                    store: store_of(state, level, domain, read_gbps, write_gbps)?,
                    read_bytes,
                    write_bytes,
                })
            },
        )
        .collect()
}

/// Seconds per step a job on `gpus` spends reading `read_bytes` and writing `write_bytes`
/// (whole job, per step) from a store attached to every host (`level` < 0) or to domain
/// `domain` of `level`, with the running jobs of `state` on the fabric.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn io_seconds(
    py: Python<'_>,
    state: PyRef<'_, PyClusterState>,
    gpus: PyReadonlyArray1<'_, i64>,
    level: i64,
    domain: usize,
    read_gbps: f64,
    write_gbps: f64,
    read_bytes: f64,
    write_bytes: f64,
) -> PyResult<f64> {
    let gpus = gpus_from(&gpus)?;
    let inner = &state.inner;
    let store = store_of(inner, level, domain, read_gbps, write_gbps)?;
    enter(py, Stop::Never, || {
        storage::io_seconds(inner, &store, read_bytes, write_bytes, &gpus)
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyContentionReport>()?;
    m.add_class::<PyHotUplink>()?;
    m.add_class::<PyLevelCrossing>()?;
    m.add_class::<PyCollisionReport>()?;
    m.add_function(wrap_pyfunction!(with_routing, m)?)?;
    m.add_function(wrap_pyfunction!(collisions, m)?)?;
    m.add_function(wrap_pyfunction!(uplinks, m)?)?;
    m.add_function(wrap_pyfunction!(with_uplink_gbps, m)?)?;
    m.add_function(wrap_pyfunction!(fabric_load, m)?)?;
    m.add_function(wrap_pyfunction!(job_load, m)?)?;
    m.add_function(wrap_pyfunction!(contention, m)?)?;
    m.add_function(wrap_pyfunction!(added_to_neighbours, m)?)?;
    m.add_function(wrap_pyfunction!(hottest_uplinks, m)?)?;
    m.add_function(wrap_pyfunction!(uplinks_by_level, m)?)?;
    m.add_function(wrap_pyfunction!(jobs_hurt, m)?)?;
    m.add_function(wrap_pyfunction!(io_seconds, m)?)?;
    Ok(())
}
