//! Bindings of the policy layer: the fence that confines one job's placement or repair to the
//! GPUs its pool and hardware rules allow (`ClusterState::set_fence` in the core).

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use crate::convert::gpus_from;
use crate::errors::{enter, Stop};
use crate::state::PyClusterState;

/// Fence GPUs off (`fenced=True`) or lift the fence; all or nothing (an unknown GPU is an
/// InvalidState and changes nothing).
#[pyfunction]
fn set_fence(
    py: Python<'_>,
    state: &mut PyClusterState,
    gpus: PyReadonlyArray1<'_, i64>,
    fenced: bool,
) -> PyResult<()> {
    let gpus = gpus_from(&gpus)?;
    let inner = &mut state.inner;
    enter(py, Stop::Never, || inner.set_fence(&gpus, fenced))
}

/// The fence mask: GPUs no solver may give the job being placed. Used only by tests
/// (tests/bindings/).
#[pyfunction]
fn fence_mask<'py>(py: Python<'py>, state: &PyClusterState) -> Bound<'py, PyArray1<bool>> {
    state.inner.fenced().to_vec().into_pyarray(py)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(set_fence, m)?)?;
    m.add_function(wrap_pyfunction!(fence_mask, m)?)?;
    Ok(())
}
