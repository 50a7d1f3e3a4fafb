//! Conversions between numpy arrays / Python values and the core's owned data. Inputs are
//! copied into owned Rust data while attached, so the core can run without the GIL.

use gpuplace_core::CoreError;
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::errors::CoreResultExt;

/// Copy non-negative integers into u32s; a bad value is a `kind` error naming the argument
/// (so a negative GPU id is an InvalidState, a bad domain id an InvalidTopology).
pub(crate) fn to_u32(
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

/// [`to_u32`] over a numpy array.
pub(crate) fn ids(
    what: &str,
    a: &PyReadonlyArray1<'_, i64>,
    kind: fn(String) -> CoreError,
) -> PyResult<Vec<u32>> {
    to_u32(what, &i64s(a), kind).py()
}

/// GPU ids (a bad one is an InvalidState).
pub(crate) fn gpus_from(gpus: &PyReadonlyArray1<'_, i64>) -> PyResult<Vec<u32>> {
    ids("GPU", gpus, CoreError::InvalidState)
}

pub(crate) fn i64s(a: &PyReadonlyArray1<'_, i64>) -> Vec<i64> {
    a.as_array().iter().copied().collect()
}

pub(crate) fn f64s(a: &PyReadonlyArray1<'_, f64>) -> Vec<f64> {
    a.as_array().iter().copied().collect()
}

/// Ids as a numpy int64 array.
pub(crate) fn id_array<'py>(py: Python<'py>, values: &[u32]) -> Bound<'py, PyArray1<i64>> {
    values
        .iter()
        .map(|&v| v as i64)
        .collect::<Vec<_>>()
        .into_pyarray(py)
}

/// `[(job, ranks)]` of the jobs a health change affects.
pub(crate) fn affected_list<'py>(
    py: Python<'py>,
    affected: Vec<(String, Vec<u32>)>,
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for (name, ranks) in affected {
        out.append((name, id_array(py, &ranks)))?;
    }
    Ok(out)
}
