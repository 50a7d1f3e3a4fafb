//! `gpuplace._core.JobSpec`: a job compiled against one topology.

use std::sync::Arc;

use gpuplace_core::job::{Collective, CollectiveKind, Dim};
use gpuplace_core::{CoreError, JobSpec, Topology};
use numpy::PyReadonlyArray1;
use pyo3::prelude::*;

use crate::convert::{f64s, i64s, ids};
use crate::errors::{enter, invalid_job, Stop};
use crate::state::PyClusterState;
use crate::topology::PyTopology;

#[pyclass(name = "JobSpec", module = "gpuplace._core", frozen)]
pub(crate) struct PyJobSpec {
    pub(crate) inner: Arc<JobSpec>,
    /// The topology the job was compiled and validated against.
    pub(crate) topology: Arc<Topology>,
}

impl PyJobSpec {
    /// The job was compiled for the state's topology (an InvalidJob otherwise).
    pub(crate) fn check_state(&self, state: &PyClusterState) -> PyResult<()> {
        if Arc::ptr_eq(state.inner.topology(), &self.topology) {
            Ok(())
        } else {
            Err(invalid_job(
                "the job was compiled for another topology than the state's",
            ))
        }
    }
}

#[pymethods]
impl PyJobSpec {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (topology, num_ranks, dim_names, dim_sizes, dim_confine, max_span, group_offsets, group_ranks, coll_group, coll_kind, coll_bytes, coll_count, coll_class, coll_dim, traffic_src, traffic_dst, traffic_bytes))]
    fn new(
        py: Python<'_>,
        topology: &PyTopology,
        num_ranks: usize,
        dim_names: Vec<String>,
        dim_sizes: Vec<usize>,
        dim_confine: Vec<i64>,
        max_span: usize,
        group_offsets: PyReadonlyArray1<'_, i64>,
        group_ranks: PyReadonlyArray1<'_, i64>,
        coll_group: PyReadonlyArray1<'_, i64>,
        coll_kind: PyReadonlyArray1<'_, i64>,
        coll_bytes: PyReadonlyArray1<'_, f64>,
        coll_count: PyReadonlyArray1<'_, f64>,
        coll_class: PyReadonlyArray1<'_, i64>,
        coll_dim: PyReadonlyArray1<'_, i64>,
        traffic_src: PyReadonlyArray1<'_, i64>,
        traffic_dst: PyReadonlyArray1<'_, i64>,
        traffic_bytes: PyReadonlyArray1<'_, f64>,
    ) -> PyResult<Self> {
        if dim_names.len() != dim_sizes.len() || dim_names.len() != dim_confine.len() {
            return Err(invalid_job(
                "dimension names, sizes and confinement levels differ in length",
            ));
        }
        let dims = dim_names
            .into_iter()
            .zip(dim_sizes)
            .zip(dim_confine)
            .map(|((name, size), c)| Dim {
                name,
                size,
                confine: usize::try_from(c).ok(),
            })
            .collect();
        let offsets: Vec<usize> = ids("group_offsets", &group_offsets, CoreError::InvalidJob)?
            .into_iter()
            .map(|v| v as usize)
            .collect();
        let ranks = ids("group_ranks", &group_ranks, CoreError::InvalidJob)?;
        let groups = ids("coll_group", &coll_group, CoreError::InvalidJob)?;
        let kinds = ids("coll_kind", &coll_kind, CoreError::InvalidJob)?;
        let classes = ids("coll_class", &coll_class, CoreError::InvalidJob)?;
        let bytes = f64s(&coll_bytes);
        let counts = f64s(&coll_count);
        let dims_of = i64s(&coll_dim);
        let n = groups.len();
        if [
            kinds.len(),
            classes.len(),
            bytes.len(),
            counts.len(),
            dims_of.len(),
        ]
        .iter()
        .any(|&m| m != n)
        {
            return Err(invalid_job("collective arrays differ in length"));
        }
        let mut collectives = Vec::with_capacity(n);
        for i in 0..n {
            let kind = u8::try_from(kinds[i])
                .ok()
                .and_then(CollectiveKind::from_code)
                .ok_or_else(|| invalid_job(format!("unknown collective kind {}", kinds[i])))?;
            collectives.push(Collective {
                group: groups[i],
                kind,
                bytes: bytes[i],
                count: counts[i],
                class: classes[i],
                dim: u32::try_from(dims_of[i]).ok(),
            });
        }
        let src = ids("traffic_src", &traffic_src, CoreError::InvalidJob)?;
        let dst = ids("traffic_dst", &traffic_dst, CoreError::InvalidJob)?;
        let tb = f64s(&traffic_bytes);
        if src.len() != dst.len() || src.len() != tb.len() {
            return Err(invalid_job(
                "traffic sources, destinations and bytes differ in length",
            ));
        }
        let traffic = src
            .into_iter()
            .zip(dst)
            .zip(tb)
            .map(|((a, b), t)| (a, b, t))
            .collect();
        let topo = topology.inner.clone();
        let spec = enter(py, Stop::Never, || {
            JobSpec::new(
                num_ranks,
                dims,
                max_span,
                offsets,
                ranks,
                collectives,
                traffic,
                &topo,
            )
        })?;
        Ok(PyJobSpec {
            inner: Arc::new(spec),
            topology: topo,
        })
    }

    #[getter]
    fn num_ranks(&self) -> usize {
        self.inner.num_ranks
    }
}
