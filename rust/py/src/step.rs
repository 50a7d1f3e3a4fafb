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

/// The peak table: (tokens the name must contain, TFLOPS, source) per row.
#[pyfunction]
fn gpu_peaks() -> Vec<(Vec<&'static str>, f64, &'static str)> {
    gpu::PEAKS
        .iter()
        .map(|p| (p.tokens.to_vec(), p.tflops, p.source))
        .collect()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gpu_peak_tflops, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_peaks, m)?)?;
    Ok(())
}
