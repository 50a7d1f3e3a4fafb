//! `gpuplace._core.JobSpec`: a job compiled against one topology.

use std::sync::Arc;

use gpuplace_core::job::{CollectiveKind, Communication, Dim, DimDecl, JobDecl, RankLayout};
use gpuplace_core::step::StepSpec;
use gpuplace_core::{CoreError, JobSpec, Topology};
use numpy::{IntoPyArray, PyArray2, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;

use crate::convert::{f64s, ids};
use crate::errors::{enter, invalid_job, Stop};
use crate::state::PyClusterState;
use crate::topology::PyTopology;

/// What one step computes (see `gpuplace_core::step::StepSpec`): (model FLOPs, tokens,
/// efficiency, backward fraction, pipeline stages, micro-batches, virtual stages per pipeline
/// rank, overlap by dimension).
type StepArgs = (f64, f64, f64, f64, usize, usize, usize, Vec<(String, f64)>);

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
    /// Compile a declared job (see `JobSpec::compile` in the core): dimensions in rank order
    /// (fastest first) with their degree, confinement level (-1: none) and communication
    /// (kind name or None, bytes per rank per call, calls per step); or, with no dimensions,
    /// `num_ranks` ranks and explicit traffic rows.
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (topology, name, num_ranks, dim_names, dim_sizes, dim_confine, comm_kind, comm_bytes, comm_count, max_span, traffic_src, traffic_dst, traffic_bytes, step=None))]
    fn new(
        py: Python<'_>,
        topology: &PyTopology,
        name: String,
        num_ranks: usize,
        dim_names: Vec<String>,
        dim_sizes: Vec<usize>,
        dim_confine: Vec<i64>,
        comm_kind: Vec<Option<String>>,
        comm_bytes: Vec<f64>,
        comm_count: Vec<f64>,
        max_span: usize,
        traffic_src: PyReadonlyArray1<'_, i64>,
        traffic_dst: PyReadonlyArray1<'_, i64>,
        traffic_bytes: PyReadonlyArray1<'_, f64>,
        step: Option<StepArgs>,
    ) -> PyResult<Self> {
        let dims = dim_decls(
            &name,
            dim_names,
            dim_sizes,
            dim_confine,
            comm_kind,
            comm_bytes,
            comm_count,
        )?;
        let src = ids("traffic_src", &traffic_src, CoreError::InvalidJob)?;
        let dst = ids("traffic_dst", &traffic_dst, CoreError::InvalidJob)?;
        let tb = f64s(&traffic_bytes);
        if src.len() != dst.len() || src.len() != tb.len() {
            return Err(invalid_job(format!(
                "{name}: traffic sources, destinations and bytes differ in length"
            )));
        }
        let traffic = src
            .into_iter()
            .zip(dst)
            .zip(tb)
            .map(|((a, b), t)| (a, b, t))
            .collect();
        let decl = JobDecl {
            name,
            num_ranks,
            dims,
            max_span,
            traffic,
        };
        let topo = topology.inner.clone();
        let step = step.map(
            |(
                flops,
                tokens,
                efficiency,
                backward,
                stages,
                micro_batches,
                virtual_stages,
                overlap,
            )| StepSpec {
                flops_per_step: flops,
                tokens_per_step: tokens,
                efficiency,
                backward_fraction: backward,
                pipeline_stages: stages,
                micro_batches,
                virtual_stages,
                overlap,
            },
        );
        let spec = enter(py, Stop::Never, || {
            let spec = JobSpec::compile(decl, &topo)?;
            match step {
                Some(step) => spec.with_step(step),
                None => Ok(spec),
            }
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

    /// Name of every collective class (`"tp all-reduce"`), in the order of a cost report's
    /// `class_seconds`.
    #[getter]
    fn class_names(&self) -> Vec<String> {
        self.inner.class_names.clone()
    }

    /// Coordinate of every rank along every dimension, shape (ranks, dimensions).
    fn coordinates<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<i64>>> {
        let layout = self.inner.layout();
        let dims = layout.sizes.len();
        let mut out = Vec::with_capacity(layout.num_ranks * dims);
        for r in 0..self.inner.num_ranks {
            out.extend((0..dims).map(|d| layout.coordinate(r, d) as i64));
        }
        out.into_pyarray(py).reshape([self.inner.num_ranks, dims])
    }

    /// The rank groups of every collective of one class, shape (collectives, group size):
    /// a point-to-point class gives its pairs.
    fn class_groups<'py>(
        &self,
        py: Python<'py>,
        index: usize,
    ) -> PyResult<Bound<'py, PyArray2<i64>>> {
        if index >= self.inner.num_classes {
            return Err(invalid_job(format!(
                "class {index} does not exist (the job has {})",
                self.inner.num_classes
            )));
        }
        let mut width = 0;
        let mut out: Vec<i64> = Vec::new();
        let mut rows = 0;
        for c in self
            .inner
            .collectives
            .iter()
            .filter(|c| c.class as usize == index)
        {
            let members = self.inner.groups.row(c.group as usize);
            width = members.len();
            out.extend(members.iter().map(|&r| r as i64));
            rows += 1;
        }
        out.into_pyarray(py).reshape([rows, width])
    }
}

/// Declared dimensions from parallel lists (see `JobSpec.__new__`).
fn dim_decls(
    name: &str,
    dim_names: Vec<String>,
    dim_sizes: Vec<usize>,
    dim_confine: Vec<i64>,
    comm_kind: Vec<Option<String>>,
    comm_bytes: Vec<f64>,
    comm_count: Vec<f64>,
) -> PyResult<Vec<DimDecl>> {
    let n = dim_names.len();
    if [
        dim_sizes.len(),
        dim_confine.len(),
        comm_kind.len(),
        comm_bytes.len(),
        comm_count.len(),
    ]
    .iter()
    .any(|&m| m != n)
    {
        return Err(invalid_job(format!(
            "{name}: the dimension arrays differ in length"
        )));
    }
    let mut dims = Vec::with_capacity(n);
    for (i, dim_name) in dim_names.into_iter().enumerate() {
        let communication = match &comm_kind[i] {
            None => None,
            Some(kind) => Some(Communication {
                kind: CollectiveKind::from_name(kind).ok_or_else(|| {
                    invalid_job(format!(
                        "{name}: communication.{dim_name}.kind: expected one of {}, got {kind:?}",
                        kind_names().join(", ")
                    ))
                })?,
                bytes: comm_bytes[i],
                count: comm_count[i],
            }),
        };
        dims.push(DimDecl {
            dim: Dim {
                name: dim_name,
                size: dim_sizes[i],
                confine: usize::try_from(dim_confine[i]).ok(),
            },
            communication,
        });
    }
    Ok(dims)
}

/// Names of the collective classes of declared dimensions (as `JobSpec.__new__` takes
/// them), in the order of a cost report's `class_seconds`; no topology needed.
#[pyfunction]
pub(crate) fn class_names(
    dim_names: Vec<String>,
    dim_sizes: Vec<usize>,
    comm_kind: Vec<Option<String>>,
) -> PyResult<Vec<String>> {
    let n = dim_names.len();
    let dims = dim_decls(
        "job",
        dim_names,
        dim_sizes,
        vec![-1; n],
        comm_kind,
        vec![0.0; n],
        vec![0.0; n],
    )?;
    Ok(gpuplace_core::job::class_names(&dims))
}

/// Names of the collective kinds, in code order.
pub(crate) fn kind_names() -> Vec<&'static str> {
    CollectiveKind::ALL.iter().map(|k| k.name()).collect()
}

/// The groups of dimension `d` of a layout of `sizes` (rank order, fastest first), shape
/// (groups, sizes[d]); the one definition of the rank layout.
#[pyfunction]
pub(crate) fn rank_groups<'py>(
    py: Python<'py>,
    sizes: Vec<usize>,
    d: usize,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    if d >= sizes.len() || sizes.contains(&0) {
        return Err(invalid_job(format!(
            "rank_groups: dimension {d} of degrees {sizes:?}"
        )));
    }
    let layout = RankLayout::new(sizes);
    let size = layout.sizes[d];
    let rows = layout.num_ranks / size;
    let out: Vec<i64> = layout.groups(d).flatten().map(|r| r as i64).collect();
    out.into_pyarray(py).reshape([rows, size])
}
