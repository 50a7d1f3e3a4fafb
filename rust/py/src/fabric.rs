//! Bindings of the fabric model (`gpuplace_core::fabric`): uplink capacities, the running
//! jobs' load and contention reports.

use std::sync::Arc;

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use gpuplace_core::{fabric, storage, CoreError};

use super::{gpus_from, to_pyerr, IntoPy, PyClusterState, PyJobSpec, PyTopology};

type Ids<'py> = Bound<'py, PyArray1<i64>>;
type Values<'py> = Bound<'py, PyArray1<f64>>;
/// (uplink id, direction, capacity, own GB/s, others GB/s, [(job, GB/s)]).
type UplinkRow = (usize, usize, f64, f64, f64, Vec<(String, f64)>);

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
    let capacity: Vec<f64> = capacity.as_array().iter().copied().collect();
    let inner = topology
        .inner
        .as_ref()
        .clone()
        .with_uplink_gbps(capacity)
        .py_ok(py)?;
    Ok(PyTopology {
        inner: Arc::new(inner),
    })
}

fn same_topology(py: Python<'_>, state: &PyClusterState, job: &PyJobSpec) -> PyResult<()> {
    if Arc::ptr_eq(state.inner.topology(), &job.topology) {
        Ok(())
    } else {
        Err(to_pyerr(
            py,
            CoreError::InvalidJob(
                "the job was compiled for another topology than the state's".into(),
            ),
        ))
    }
}

/// The running jobs' load per uplink direction (GB/s; index 2 * uplink + 0 up, + 1 down).
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

/// A job's load per uplink direction: (slots, GB/s).
#[pyfunction]
fn job_load<'py>(
    py: Python<'py>,
    job: &PyJobSpec,
    gpus: PyReadonlyArray1<'_, i64>,
) -> PyResult<(Ids<'py>, Values<'py>)> {
    let gpus = gpus_from(py, &gpus)?;
    gpuplace_core::cost::check_placement(&job.topology, job.inner.num_ranks, &gpus).py_ok(py)?;
    let load = fabric::job_load(&job.topology, &job.inner, &gpus);
    let (slots, values): (Vec<i64>, Vec<f64>) =
        load.into_iter().map(|(s, v)| (s as i64, v)).unzip();
    Ok((slots.into_pyarray(py), values.into_pyarray(py)))
}

/// A job priced with its neighbours: alone and contended seconds, and the uplinks over
/// capacity on its paths.
#[pyfunction]
fn contention<'py>(
    py: Python<'py>,
    state: PyRef<'py, PyClusterState>,
    job: &PyJobSpec,
    gpus: PyReadonlyArray1<'_, i64>,
) -> PyResult<Bound<'py, PyDict>> {
    same_topology(py, &state, job)?;
    let gpus = gpus_from(py, &gpus)?;
    let (inner, spec) = (&state.inner, job.inner.clone());
    let report = py
        .detach(|| fabric::contention(inner, &spec, &gpus))
        .py_ok(py)?;
    let out = PyDict::new(py);
    out.set_item("alone_seconds", report.alone_seconds)?;
    out.set_item("contended_seconds", report.contended_seconds)?;
    let uplinks: Vec<UplinkRow> = report
        .uplinks
        .into_iter()
        .map(|u| {
            (
                u.uplink,
                u.direction,
                u.capacity_gbps,
                u.own_gbps,
                u.others_gbps,
                u.jobs,
            )
        })
        .collect();
    out.set_item("uplinks", uplinks)?;
    Ok(out)
}

/// Seconds per step placing `job` on `gpus` adds to the running jobs.
#[pyfunction]
fn added_to_neighbours(
    py: Python<'_>,
    state: PyRef<'_, PyClusterState>,
    job: &PyJobSpec,
    gpus: PyReadonlyArray1<'_, i64>,
) -> PyResult<f64> {
    same_topology(py, &state, job)?;
    let gpus = gpus_from(py, &gpus)?;
    gpuplace_core::cost::check_placement(&job.topology, job.inner.num_ranks, &gpus).py_ok(py)?;
    let (inner, spec) = (&state.inner, job.inner.clone());
    py.detach(|| fabric::added_to_neighbours(inner, &spec, &gpus))
        .py_ok(py)
}

/// The most loaded uplink directions: [(slot, load GB/s, capacity GB/s)].
#[pyfunction]
fn hottest_uplinks(state: PyRef<'_, PyClusterState>, count: usize) -> Vec<(usize, f64, f64)> {
    fabric::hottest_uplinks(&state.inner, count)
}

/// Running jobs by slowdown from contention: [(name, alone s, contended s)].
#[pyfunction]
fn jobs_hurt(
    py: Python<'_>,
    state: PyRef<'_, PyClusterState>,
) -> PyResult<Vec<(String, f64, f64)>> {
    let inner = &state.inner;
    py.detach(|| fabric::jobs_hurt(inner)).py_ok(py)
}

/// A job's storage traffic on one store: (level, domain, read GB/s, write GB/s, read bytes,
/// write bytes), level < 0 for a store on every host.
pub(crate) type IoTuple = (i64, usize, f64, f64, f64, f64);

fn store_of(
    py: Python<'_>,
    state: &gpuplace_core::ClusterState,
    level: i64,
    domain: usize,
    read_gbps: f64,
    write_gbps: f64,
) -> PyResult<storage::Store> {
    let attach = match usize::try_from(level) {
        Ok(level) => storage::Attach::Domain { level, domain },
        Err(_) => storage::Attach::Local,
    };
    storage::Store::new(state.topology(), attach, read_gbps, write_gbps).py_ok(py)
}

pub(crate) fn io_demands(
    py: Python<'_>,
    state: &gpuplace_core::ClusterState,
    io: Vec<IoTuple>,
) -> PyResult<Vec<storage::IoDemand>> {
    io.into_iter()
        .map(
            |(level, domain, read_gbps, write_gbps, read_bytes, write_bytes)| {
                Ok(storage::IoDemand {
                    store: store_of(py, state, level, domain, read_gbps, write_gbps)?,
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
    let gpus = gpus_from(py, &gpus)?;
    let inner = &state.inner;
    let store = store_of(py, inner, level, domain, read_gbps, write_gbps)?;
    py.detach(|| storage::io_seconds(inner, &store, read_bytes, write_bytes, &gpus))
        .py_ok(py)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(uplinks, m)?)?;
    m.add_function(wrap_pyfunction!(with_uplink_gbps, m)?)?;
    m.add_function(wrap_pyfunction!(fabric_load, m)?)?;
    m.add_function(wrap_pyfunction!(job_load, m)?)?;
    m.add_function(wrap_pyfunction!(contention, m)?)?;
    m.add_function(wrap_pyfunction!(added_to_neighbours, m)?)?;
    m.add_function(wrap_pyfunction!(hottest_uplinks, m)?)?;
    m.add_function(wrap_pyfunction!(jobs_hurt, m)?)?;
    m.add_function(wrap_pyfunction!(io_seconds, m)?)?;
    Ok(())
}
