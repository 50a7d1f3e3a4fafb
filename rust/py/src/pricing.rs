//! The pricing view (`gpuplace_core::pricing`): what Python solvers read instead of
//! re-deriving health rules (usable and degraded GPUs, side factors, path bandwidths), and
//! the collective terms an exact model prices a group with.

use gpuplace_core::pricing::PricingView;
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1};
use pyo3::prelude::*;

use crate::convert::gpus_from;
use crate::enums::CollectiveKind;
use crate::errors::{enter, invalid_state, Stop};
use crate::state::PyClusterState;

/// (usable mask, degraded mask, side factors `num_gpus x levels`).
type ViewArrays<'py> = (
    Bound<'py, PyArray1<bool>>,
    Bound<'py, PyArray1<bool>>,
    Bound<'py, PyArray2<f32>>,
);

/// The state's pricing view: (usable mask, degraded mask, side factors `num_gpus x levels`).
#[pyfunction]
fn pricing_view<'py>(py: Python<'py>, state: &PyClusterState) -> PyResult<ViewArrays<'py>> {
    let inner = &state.inner;
    let levels = inner.topology().num_levels();
    let (usable, degraded, factors) = enter(py, Stop::Never, || {
        let view = PricingView::of(inner);
        Ok((view.usable(), view.degraded(), view.side_factors()))
    })?;
    let rows = factors.len() / levels.max(1);
    let factors = Array2::from_shape_vec((rows, levels), factors)
        .map_err(|e| invalid_state(e.to_string()))?;
    Ok((
        usable.into_pyarray(py),
        degraded.into_pyarray(py),
        factors.into_pyarray(py),
    ))
}

/// Bandwidth (GB/s) between every two of `gpus` on the state's hardware (`k x k`, infinite
/// diagonal), as the cost model prices the paths.
#[pyfunction]
fn pair_bandwidth_matrix<'py>(
    py: Python<'py>,
    state: &PyClusterState,
    gpus: PyReadonlyArray1<'_, i64>,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let gpus = gpus_from(&gpus)?;
    let k = gpus.len();
    let inner = &state.inner;
    let flat = enter(py, Stop::Never, || {
        PricingView::of(inner).bandwidth_matrix(&gpus)
    })?;
    let matrix = Array2::from_shape_vec((k, k), flat).map_err(|e| invalid_state(e.to_string()))?;
    Ok(matrix.into_pyarray(py))
}

/// (latency steps, bytes each rank sends) of one call of a collective of `kind` over `n`
/// ranks moving `bytes` per rank, from the cost model's ring formulas.
#[pyfunction]
fn collective_terms(kind: CollectiveKind, n: usize, bytes: f64) -> (f64, f64) {
    gpuplace_core::cost::ring_terms(kind.to_core(), n, bytes)
}

/// Register the pricing functions.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pricing_view, m)?)?;
    m.add_function(wrap_pyfunction!(pair_bandwidth_matrix, m)?)?;
    m.add_function(wrap_pyfunction!(collective_terms, m)?)?;
    Ok(())
}
