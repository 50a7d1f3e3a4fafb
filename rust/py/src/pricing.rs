//! Bindings of the pricing view (`gpuplace_core::pricing`): what Python solvers read instead
//! of re-deriving health rules.

use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1};
use pyo3::prelude::*;

use gpuplace_core::pricing::PricingView;
use gpuplace_core::{CollectiveKind, CoreError};

use super::{gpus_from, to_pyerr, IntoPy, PyClusterState};

/// (usable mask, degraded mask, side factors `num_gpus x levels`).
type ViewArrays<'py> = (
    Bound<'py, PyArray1<bool>>,
    Bound<'py, PyArray1<bool>>,
    Bound<'py, PyArray2<f32>>,
);

/// The state's pricing view: (usable mask, degraded mask, side factors `num_gpus x levels`).
#[pyfunction]
fn pricing_view<'py>(
    py: Python<'py>,
    state: PyRef<'py, PyClusterState>,
) -> PyResult<ViewArrays<'py>> {
    let view = PricingView::of(&state.inner);
    let levels = state.inner.topology().num_levels();
    let factors = view.side_factors();
    let rows = factors.len() / levels.max(1);
    let factors = numpy::ndarray::Array2::from_shape_vec((rows, levels), factors)
        .map_err(|e| to_pyerr(py, CoreError::InvalidState(e.to_string())))?;
    Ok((
        view.usable().into_pyarray(py),
        view.degraded().into_pyarray(py),
        factors.into_pyarray(py),
    ))
}

/// Bandwidth (GB/s) between every two of `gpus` on the state's hardware (`k x k`, infinite
/// diagonal), as the cost model prices the paths.
#[pyfunction]
fn pair_bandwidth_matrix<'py>(
    py: Python<'py>,
    state: PyRef<'py, PyClusterState>,
    gpus: PyReadonlyArray1<'_, i64>,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let gpus = gpus_from(py, &gpus)?;
    let k = gpus.len();
    let view = PricingView::of(&state.inner);
    let flat = view.bandwidth_matrix(&gpus).py_ok(py)?;
    let matrix = numpy::ndarray::Array2::from_shape_vec((k, k), flat)
        .map_err(|e| to_pyerr(py, CoreError::InvalidState(e.to_string())))?;
    Ok(matrix.into_pyarray(py))
}

/// (latency steps, bytes each rank sends) of one call of a collective (kind code as in
/// JobSpec) over `n` ranks moving `bytes` per rank, from the cost model's ring formulas.
#[pyfunction]
fn collective_terms(py: Python<'_>, kind: u8, n: usize, bytes: f64) -> PyResult<(f64, f64)> {
    let kind = CollectiveKind::from_code(kind).ok_or_else(|| {
        to_pyerr(
            py,
            CoreError::InvalidJob(format!("unknown collective kind {kind}")),
        )
    })?;
    Ok(gpuplace_core::cost::ring_terms(kind, n, bytes))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pricing_view, m)?)?;
    m.add_function(wrap_pyfunction!(pair_bandwidth_matrix, m)?)?;
    m.add_function(wrap_pyfunction!(collective_terms, m)?)?;
    Ok(())
}
