//! `gpuplace._core.Topology`: the compiled cluster (flat arrays of domain ids per level).

use std::sync::Arc;

use gpuplace_core::job::CollectiveKind;
use gpuplace_core::topology::{Level, NodeType};
use gpuplace_core::{CoreError, Topology};
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;

use crate::convert::{ids, to_u32};
use crate::errors::{enter, invalid_job, invalid_state, invalid_topology, CoreResultExt, Stop};

#[pyclass(name = "Topology", module = "gpuplace._core", frozen)]
pub(crate) struct PyTopology {
    pub(crate) inner: Arc<Topology>,
}

#[pymethods]
impl PyTopology {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (level_names, bandwidth_gbps, latency_us, node_level, nvlink_level, path, node_type_names, node_type_gpus, node_type_matrices, node_type_of_node, gpu_local))]
    fn new(
        py: Python<'_>,
        level_names: Vec<String>,
        bandwidth_gbps: Vec<f64>,
        latency_us: Vec<f64>,
        node_level: usize,
        nvlink_level: usize,
        path: PyReadonlyArray2<'_, i64>,
        node_type_names: Vec<String>,
        node_type_gpus: Vec<usize>,
        node_type_matrices: Vec<Option<PyReadonlyArray2<'_, f64>>>,
        node_type_of_node: PyReadonlyArray1<'_, i64>,
        gpu_local: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<Self> {
        if level_names.len() != bandwidth_gbps.len() || level_names.len() != latency_us.len() {
            return Err(invalid_topology(
                "level names, bandwidths and latencies differ in length",
            ));
        }
        if node_type_names.len() != node_type_gpus.len()
            || node_type_names.len() != node_type_matrices.len()
        {
            return Err(invalid_topology(
                "node type names, GPU counts and matrices differ in length",
            ));
        }
        let levels = level_names
            .into_iter()
            .zip(bandwidth_gbps)
            .zip(latency_us)
            .map(|((name, bandwidth_gbps), latency_us)| Level {
                name,
                bandwidth_gbps,
                latency_us,
            })
            .collect::<Vec<_>>();
        let shape = path.shape();
        if shape[1] != levels.len() {
            return Err(invalid_topology(format!(
                "path must have one column per level ({}), got {}",
                levels.len(),
                shape[1]
            )));
        }
        let path_owned: Vec<i64> = path.as_array().iter().copied().collect();
        let path_u32 = to_u32("path", &path_owned, CoreError::InvalidTopology).py()?;
        let node_types = node_type_names
            .into_iter()
            .zip(node_type_gpus)
            .zip(node_type_matrices)
            .map(|((name, gpus), matrix)| NodeType {
                name,
                gpus,
                bandwidth_gbps: matrix.map(|m| m.as_array().iter().copied().collect()),
            })
            .collect();
        let types = ids(
            "node_type_of_node",
            &node_type_of_node,
            CoreError::InvalidTopology,
        )?;
        let local = ids("gpu_local", &gpu_local, CoreError::InvalidTopology)?;
        let topo = enter(py, Stop::Never, || {
            Topology::new(
                levels,
                node_level,
                nvlink_level,
                path_u32,
                node_types,
                types,
                local,
            )
        })?;
        Ok(PyTopology {
            inner: Arc::new(topo),
        })
    }

    #[getter]
    fn num_gpus(&self) -> usize {
        self.inner.num_gpus()
    }
    #[getter]
    fn num_levels(&self) -> usize {
        self.inner.num_levels()
    }
    #[getter]
    fn node_level(&self) -> usize {
        self.inner.node_level()
    }
    #[getter]
    fn nvlink_level(&self) -> usize {
        self.inner.nvlink_level()
    }
    #[getter]
    fn level_names(&self) -> Vec<String> {
        self.inner.levels().iter().map(|l| l.name.clone()).collect()
    }
    fn domain_count(&self, level: usize) -> PyResult<usize> {
        self.check_level(level)?;
        Ok(self.inner.domain_count(level))
    }
    /// GPUs per domain at a level.
    fn domain_sizes<'py>(
        &self,
        py: Python<'py>,
        level: usize,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        self.check_level(level)?;
        Ok(crate::convert::id_array(py, self.inner.domain_sizes(level)))
    }
    /// Parent domain (at level + 1) of every domain at a level.
    fn parents<'py>(&self, py: Python<'py>, level: usize) -> PyResult<Bound<'py, PyArray1<i64>>> {
        self.check_level(level)?;
        Ok(crate::convert::id_array(py, self.inner.parents(level)))
    }
    /// Domain ids of every GPU, shape (num_gpus, num_levels).
    fn path<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<i64>>> {
        let nl = self.inner.num_levels();
        let v: Vec<i64> = self.inner.path().iter().map(|&s| s as i64).collect();
        v.into_pyarray(py).reshape([self.inner.num_gpus(), nl])
    }
    /// Per level, the bandwidth (GB/s) of traffic that spans it: the slowest level up to it.
    #[getter]
    fn effective_bandwidth_gbps(&self) -> Vec<f64> {
        (0..self.inner.num_levels())
            .map(|l| self.inner.effective_bandwidth(l))
            .collect()
    }

    /// Seconds of one call of a collective (by kind name) over `n` ranks whose group spans
    /// each level, from the core's cost formulas on healthy hardware.
    fn collective_seconds_by_level(&self, kind: &str, n: usize, bytes: f64) -> PyResult<Vec<f64>> {
        let kind = CollectiveKind::from_name(kind)
            .ok_or_else(|| invalid_job(format!("unknown collective kind {kind:?}")))?;
        Ok(gpuplace_core::cost::collective_seconds_by_level(
            &self.inner,
            kind,
            n,
            bytes,
        ))
    }

    /// Bandwidth (GB/s) between every pair of the given GPUs as the cost model sees it on
    /// healthy hardware; 0 on the diagonal.
    fn bandwidth_matrix<'py>(
        &self,
        py: Python<'py>,
        gpus: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let gpus = crate::convert::gpus_from(&gpus)?;
        if let Some(&g) = gpus.iter().find(|&&g| g as usize >= self.inner.num_gpus()) {
            return Err(invalid_state(format!("GPU {g} does not exist")));
        }
        let n = gpus.len();
        let topo = self.inner.clone();
        let values = enter(py, Stop::Never, || {
            let mut out = vec![0.0; n * n];
            for i in 0..n {
                for j in 0..n {
                    if gpus[i] != gpus[j] {
                        out[i * n + j] = topo.pair_bandwidth(gpus[i] as usize, gpus[j] as usize);
                    }
                }
            }
            Ok(out)
        })?;
        values.into_pyarray(py).reshape([n, n])
    }
}

impl PyTopology {
    fn check_level(&self, level: usize) -> PyResult<()> {
        if level >= self.inner.num_levels() {
            return Err(invalid_topology(format!(
                "level {level} does not exist (the topology has {})",
                self.inner.num_levels()
            )));
        }
        Ok(())
    }
}
