//! The GPU peak table (`gpuplace_core::gpu`). The step-time model itself
//! (`gpuplace_core::step`) runs inside the cost model: a job compiled with its step
//! (`JobSpec(..., step=...)`) gets step time, MFU and tokens/s in every `CostReport`.

use pyo3::prelude::*;

use gpuplace_core::gpu;

/// Peak dense TFLOPS of a GPU model name, or None when the table does not know it.
#[pyfunction]
fn gpu_peak_tflops(model: &str) -> Option<f64> {
    gpu::peak_tflops(model)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gpu_peak_tflops, m)?)?;
    Ok(())
}
