//! The NCCL side of a topology (`gpuplace_core::nccl`): NVLS bandwidth, NICs, SHARP levels,
//! host-count factors, algorithm efficiencies and GPU peaks per host type, and the hops of
//! NCCL's ring over a group.

use std::sync::Arc;

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;

use gpuplace_core::nccl;

use crate::convert::gpus_from;
use crate::errors::{enter, invalid_state, Stop};
use crate::topology::PyTopology;

/// The same topology with, per host type in the order it was built with, the NVLink SHARP
/// all-reduce bus bandwidth (GB/s, 0 for none), the NIC count (0: one per GPU) and the dense
/// peak TFLOPS of one GPU (0: unknown); the correction factors by the number of hosts a
/// collective spans; per level whether its switches reduce in the network (SHARP; empty for
/// none); and the bandwidth efficiency of ring, tree, NVLS and CollNet.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (topology, nvls_gbps, nics, host_count_factors, sharp, algorithm_efficiency, peak_tflops))]
fn topology_with_fabric(
    py: Python<'_>,
    topology: &PyTopology,
    nvls_gbps: Vec<f64>,
    nics: Vec<u32>,
    host_count_factors: Vec<f64>,
    sharp: Vec<bool>,
    algorithm_efficiency: [f64; 4],
    peak_tflops: Vec<f64>,
) -> PyResult<PyTopology> {
    let topo = topology.inner.as_ref().clone();
    let inner = enter(py, Stop::Never, || {
        topo.with_fabric(nvls_gbps, nics)
            .and_then(|t| t.with_host_count_factors(host_count_factors))
            .and_then(|t| t.with_sharp(sharp))
            .and_then(|t| t.with_algorithm_efficiency(algorithm_efficiency))
            .and_then(|t| t.with_peak_tflops(peak_tflops))
    })?;
    Ok(PyTopology {
        inner: Arc::new(inner),
    })
}

/// The same topology with, per host type in the order it was built with, whether its GPUs
/// have peer-to-peer access to each other (false: NCCL's SHM transport through host memory)
/// and GPUDirect RDMA to their NICs (false: network hops staged through host memory).
#[pyfunction]
fn with_transports(
    py: Python<'_>,
    topology: &PyTopology,
    p2p: Vec<bool>,
    gpudirect_rdma: Vec<bool>,
) -> PyResult<PyTopology> {
    let topo = topology.inner.as_ref().clone();
    let inner = enter(py, Stop::Never, || {
        topo.with_transports(p2p, gpudirect_rdma)
    })?;
    Ok(PyTopology {
        inner: Arc::new(inner),
    })
}

/// The same topology with, per level, whether its switches are cabled rail by rail (a hashed
/// flow takes only its own rail's uplink links where the hosts list their NICs).
#[pyfunction]
fn with_rail_alignment(
    py: Python<'_>,
    topology: &PyTopology,
    rail_aligned: Vec<bool>,
) -> PyResult<PyTopology> {
    let topo = topology.inner.as_ref().clone();
    let inner = enter(py, Stop::Never, || topo.with_rail_alignment(rail_aligned))?;
    Ok(PyTopology {
        inner: Arc::new(inner),
    })
}

/// (from GPU, to GPU, from host, to host, level, NIC shares) of one ring hop.
type HopRow = (u32, u32, u32, u32, usize, f64);

/// The hops of NCCL's ring over `gpus` (GPU ids in rank order) that leave an NVLink domain,
/// in ring order: (from GPU, to GPU, from host, to host, level, NIC shares driven). Used only
/// by tests (tests/bindings/).
#[pyfunction]
fn ring_hops(topology: &PyTopology, gpus: PyReadonlyArray1<'_, i64>) -> PyResult<Vec<HopRow>> {
    let gpus = gpus_from(&gpus)?;
    let topo = &topology.inner;
    if let Some(&g) = gpus.iter().find(|&&g| g as usize >= topo.num_gpus()) {
        return Err(invalid_state(format!(
            "GPU {g} does not exist (the cluster has {})",
            topo.num_gpus()
        )));
    }
    Ok(nccl::ring_hops(topo, &gpus)
        .into_iter()
        .map(|h| {
            (
                h.from_gpu,
                h.to_gpu,
                h.from_host,
                h.to_host,
                h.level,
                h.lanes,
            )
        })
        .collect())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(topology_with_fabric, m)?)?;
    m.add_function(wrap_pyfunction!(with_transports, m)?)?;
    m.add_function(wrap_pyfunction!(with_rail_alignment, m)?)?;
    m.add_function(wrap_pyfunction!(ring_hops, m)?)?;
    Ok(())
}
