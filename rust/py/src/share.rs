//! Shared GPUs (`gpuplace_core::share`): the cluster of nodes with CPU, memory and
//! milli-GPUs, the pod distribution FGD weighs fragmentation by, a scheduler under one policy,
//! and the arrival-only replay of many runs at once.

use std::sync::Arc;

use gpuplace_core::share::{
    self, Arrivals, Distribution, NodePrice, NodeSpec, PodRequest, Run, Scheduler, SharePolicy,
    SharedCluster, Slot,
};
use gpuplace_core::CoreError;
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use crate::convert::i64s;
use crate::errors::{enter, invalid_job, invalid_topology, CoreResultExt, Stop};

fn to<T: TryFrom<i64>>(what: &str, v: i64, err: fn(String) -> PyErr) -> PyResult<T> {
    T::try_from(v).map_err(|_| err(format!("{what}: {v} is out of range")))
}

fn pod(
    cpu_milli: i64,
    memory_mib: i64,
    gpus: i64,
    gpu_milli: i64,
    models: u64,
) -> PyResult<PodRequest> {
    let pod = PodRequest {
        cpu_milli: to("cpu_milli", cpu_milli, invalid_job)?,
        memory_mib: to("memory_mib", memory_mib, invalid_job)?,
        gpus: to("gpus", gpus, invalid_job)?,
        gpu_milli: to("gpu_milli", gpu_milli, invalid_job)?,
        models,
    };
    pod.check().py()?;
    Ok(pod)
}

/// Pods from parallel arrays (one entry per pod).
fn pods(
    cpu_milli: &PyReadonlyArray1<'_, i64>,
    memory_mib: &PyReadonlyArray1<'_, i64>,
    gpus: &PyReadonlyArray1<'_, i64>,
    gpu_milli: &PyReadonlyArray1<'_, i64>,
    models: &PyReadonlyArray1<'_, u64>,
) -> PyResult<Vec<PodRequest>> {
    let (c, m, g, k) = (
        i64s(cpu_milli),
        i64s(memory_mib),
        i64s(gpus),
        i64s(gpu_milli),
    );
    let masks: Vec<u64> = models.as_array().iter().copied().collect();
    let n = c.len();
    if [m.len(), g.len(), k.len(), masks.len()]
        .iter()
        .any(|&l| l != n)
    {
        return Err(invalid_job("pod arrays differ in length"));
    }
    (0..n)
        .map(|i| {
            pod(c[i], m[i], g[i], k[i], masks[i])
                .map_err(|e| invalid_job(format!("pod {i}: {}", e)))
        })
        .collect()
}

/// Node prices from an `(nodes, 3)` array of dual values (milli-GPU, milli-CPU, MiB).
fn node_prices(duals: Option<PyReadonlyArray2<'_, f64>>) -> PyResult<Option<Arc<Vec<NodePrice>>>> {
    let Some(duals) = duals else {
        return Ok(None);
    };
    let a = duals.as_array();
    if a.ncols() != 3 {
        return Err(invalid_job(format!(
            "node prices: expected 3 columns (milli-GPU, milli-CPU, MiB), got {}",
            a.ncols()
        )));
    }
    let rows: Vec<[f64; 3]> = a.rows().into_iter().map(|r| [r[0], r[1], r[2]]).collect();
    Ok(Some(Arc::new(NodePrice::from_duals(&rows).py()?)))
}

/// `gpuplace._core.SharedCluster`: nodes with CPU, memory and GPUs shared by the milli-GPU.
#[pyclass(name = "SharedCluster", module = "gpuplace._core")]
pub(crate) struct PySharedCluster {
    pub(crate) inner: SharedCluster,
}

#[pymethods]
impl PySharedCluster {
    /// Nodes as parallel arrays; `model` is an index into `models` (-1: no GPUs).
    #[new]
    fn new(
        names: Vec<String>,
        cpu_milli: PyReadonlyArray1<'_, i64>,
        memory_mib: PyReadonlyArray1<'_, i64>,
        gpus: PyReadonlyArray1<'_, i64>,
        model: PyReadonlyArray1<'_, i64>,
        models: Vec<String>,
    ) -> PyResult<Self> {
        let (c, m, g, k) = (
            i64s(&cpu_milli),
            i64s(&memory_mib),
            i64s(&gpus),
            i64s(&model),
        );
        if [names.len(), m.len(), g.len(), k.len()]
            .iter()
            .any(|&l| l != c.len())
        {
            return Err(invalid_topology("node arrays differ in length"));
        }
        let nodes = (0..c.len())
            .map(|i| {
                Ok(NodeSpec {
                    name: names[i].clone(),
                    cpu_milli: to(&format!("node {i} cpu_milli"), c[i], invalid_topology)?,
                    memory_mib: to(&format!("node {i} memory_mib"), m[i], invalid_topology)?,
                    gpus: to(&format!("node {i} gpus"), g[i], invalid_topology)?,
                    model: if k[i] < 0 {
                        None
                    } else {
                        Some(to(&format!("node {i} model"), k[i], invalid_topology)?)
                    },
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(PySharedCluster {
            inner: SharedCluster::new(nodes, models).py()?,
        })
    }

    fn copy(&self) -> Self {
        PySharedCluster {
            inner: self.inner.clone(),
        }
    }

    #[getter]
    fn num_nodes(&self) -> usize {
        self.inner.num_nodes()
    }

    #[getter]
    fn num_gpus(&self) -> usize {
        self.inner.num_gpus()
    }

    #[getter]
    fn models(&self) -> Vec<String> {
        self.inner.models().to_vec()
    }

    #[getter]
    fn used_gpu_milli(&self) -> u64 {
        self.inner.used_gpu_milli()
    }

    #[getter]
    fn total_gpu_milli(&self) -> u64 {
        self.inner.total_gpu_milli()
    }

    /// Free milli-CPU per node.
    fn cpu_left<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        (0..self.inner.num_nodes())
            .map(|n| self.inner.node(n).cpu_left as i64)
            .collect::<Vec<_>>()
            .into_pyarray(py)
    }

    /// Free memory (MiB) per node.
    fn memory_left<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        (0..self.inner.num_nodes())
            .map(|n| self.inner.node(n).memory_left as i64)
            .collect::<Vec<_>>()
            .into_pyarray(py)
    }

    /// Free milli-GPUs of one node's GPUs, by local index.
    fn gpu_left<'py>(&self, py: Python<'py>, node: usize) -> PyResult<Bound<'py, PyArray1<i64>>> {
        if node >= self.inner.num_nodes() {
            return Err(crate::errors::invalid_state(format!(
                "node {node} does not exist ({} nodes)",
                self.inner.num_nodes()
            )));
        }
        Ok(self
            .inner
            .node(node)
            .gpu_left
            .iter()
            .map(|&g| g as i64)
            .collect::<Vec<_>>()
            .into_pyarray(py))
    }

    /// Put a pod on `node`, on these local GPUs (checked; all or nothing).
    #[allow(clippy::too_many_arguments)]
    fn allocate(
        &mut self,
        cpu_milli: i64,
        memory_mib: i64,
        gpus: i64,
        gpu_milli: i64,
        models: u64,
        node: u32,
        slot_gpus: Vec<u32>,
    ) -> PyResult<()> {
        let p = pod(cpu_milli, memory_mib, gpus, gpu_milli, models)?;
        self.inner
            .allocate(
                &p,
                &Slot {
                    node,
                    gpus: slot_gpus,
                },
            )
            .py()
    }

    /// Take a pod off its slot (checked).
    #[allow(clippy::too_many_arguments)]
    fn release(
        &mut self,
        cpu_milli: i64,
        memory_mib: i64,
        gpus: i64,
        gpu_milli: i64,
        models: u64,
        node: u32,
        slot_gpus: Vec<u32>,
    ) -> PyResult<()> {
        let p = pod(cpu_milli, memory_mib, gpus, gpu_milli, models)?;
        self.inner
            .release(
                &p,
                &Slot {
                    node,
                    gpus: slot_gpus,
                },
            )
            .py()
    }
}

/// `gpuplace._core.ShareDistribution`: typical pods and their weights.
#[pyclass(frozen, name = "ShareDistribution", module = "gpuplace._core")]
pub(crate) struct PyShareDistribution {
    inner: Arc<Distribution>,
}

#[pymethods]
impl PyShareDistribution {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (cpu_milli, memory_mib, gpus, gpu_milli, models, weights, num_models))]
    fn new(
        cpu_milli: PyReadonlyArray1<'_, i64>,
        memory_mib: PyReadonlyArray1<'_, i64>,
        gpus: PyReadonlyArray1<'_, i64>,
        gpu_milli: PyReadonlyArray1<'_, i64>,
        models: PyReadonlyArray1<'_, u64>,
        weights: PyReadonlyArray1<'_, f64>,
        num_models: usize,
    ) -> PyResult<Self> {
        let list = pods(&cpu_milli, &memory_mib, &gpus, &gpu_milli, &models)?;
        let w: Vec<f64> = weights.as_array().iter().copied().collect();
        if w.len() != list.len() {
            return Err(invalid_job(
                "pod distribution: weights and pods differ in length",
            ));
        }
        let inner = Distribution::new(list.into_iter().zip(w).collect(), num_models).py()?;
        Ok(PyShareDistribution {
            inner: Arc::new(inner),
        })
    }

    /// Expected fragmentation (milli-GPUs) of every node of `cluster` as it is.
    fn fragmentation<'py>(
        &self,
        py: Python<'py>,
        cluster: &PySharedCluster,
    ) -> Bound<'py, PyArray1<f64>> {
        (0..cluster.inner.num_nodes())
            .map(|n| self.inner.node_fragmentation(&cluster.inner.node(n)))
            .collect::<Vec<_>>()
            .into_pyarray(py)
    }
}

/// `gpuplace._core.ShareSlot`: a node and the local indexes of the GPUs a pod gets there.
#[pyclass(frozen, get_all, name = "ShareSlot", module = "gpuplace._core")]
pub(crate) struct PyShareSlot {
    node: u32,
    gpus: Vec<u32>,
}

/// `gpuplace._core.ShareScheduler`: chooses slots under one policy (seeded ties; caches
/// fragmentation scores per node between calls).
#[pyclass(name = "ShareScheduler", module = "gpuplace._core")]
pub(crate) struct PyShareScheduler {
    inner: Scheduler,
    /// How many nodes the prices were given for.
    nodes: Option<usize>,
}

#[pymethods]
impl PyShareScheduler {
    /// `prices`: an `(nodes, 3)` array of dual values per node (see `NodePrice`), for the
    /// gpuplace policy.
    #[new]
    #[pyo3(signature = (policy, seed, distribution=None, prices=None))]
    fn new(
        policy: &str,
        seed: u64,
        distribution: Option<&PyShareDistribution>,
        prices: Option<PyReadonlyArray2<'_, f64>>,
    ) -> PyResult<Self> {
        let policy = SharePolicy::from_label(policy).py()?;
        let prices = node_prices(prices)?;
        let nodes = prices.as_ref().map(|p| p.len());
        Ok(PyShareScheduler {
            inner: Scheduler::new(policy, seed, distribution.map(|d| Arc::clone(&d.inner)))
                .py()?
                .with_prices(prices),
            nodes,
        })
    }

    #[getter]
    fn policy(&self) -> &'static str {
        self.inner.policy().label()
    }

    /// The slot the policy picks for the pod, or None when no node fits it.
    fn choose(
        &mut self,
        cluster: &PySharedCluster,
        cpu_milli: i64,
        memory_mib: i64,
        gpus: i64,
        gpu_milli: i64,
        models: u64,
    ) -> PyResult<Option<PyShareSlot>> {
        let p = pod(cpu_milli, memory_mib, gpus, gpu_milli, models)?;
        if let Some(n) = self.nodes.filter(|&n| n != cluster.inner.num_nodes()) {
            return Err(invalid_job(format!(
                "the scheduler's prices are for {n} nodes; the cluster has {}",
                cluster.inner.num_nodes()
            )));
        }
        Ok(self.inner.choose(&cluster.inner, &p).map(|s| PyShareSlot {
            node: s.node,
            gpus: s.gpus,
        }))
    }
}

/// `gpuplace._core.ArrivalRecord`: one replay, one entry per arrival.
#[pyclass(frozen, name = "ArrivalRecord", module = "gpuplace._core")]
pub(crate) struct PyArrivalRecord {
    inner: Arrivals,
}

fn u64_array<'py>(py: Python<'py>, v: &[u64]) -> Bound<'py, PyArray1<i64>> {
    v.iter()
        .map(|&x| x as i64)
        .collect::<Vec<_>>()
        .into_pyarray(py)
}

#[pymethods]
impl PyArrivalRecord {
    /// Milli-GPUs arrived so far (placed or not), after each arrival.
    #[getter]
    fn arrived_gpu_milli<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        u64_array(py, &self.inner.arrived_gpu_milli)
    }

    /// Milli-GPUs allocated after each arrival.
    #[getter]
    fn used_gpu_milli<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        u64_array(py, &self.inner.used_gpu_milli)
    }

    /// Whether each arrival was placed.
    #[getter]
    fn placed<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        self.inner.placed.clone().into_pyarray(py)
    }

    /// Nanoseconds each placement decision took.
    #[getter]
    fn decision_ns<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        u64_array(py, &self.inner.decision_ns)
    }
}

/// Replay arrival-only runs (one per entry of `orders`, `policies`, `seeds`) on copies of
/// `cluster`, in parallel, without the GIL; Ctrl-C stops them.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (cluster, cpu_milli, memory_mib, gpus, gpu_milli, models, orders, policies, seeds, distribution=None, prices=None))]
fn replay_arrivals(
    py: Python<'_>,
    cluster: &PySharedCluster,
    cpu_milli: PyReadonlyArray1<'_, i64>,
    memory_mib: PyReadonlyArray1<'_, i64>,
    gpus: PyReadonlyArray1<'_, i64>,
    gpu_milli: PyReadonlyArray1<'_, i64>,
    models: PyReadonlyArray1<'_, u64>,
    orders: Vec<PyReadonlyArray1<'_, i64>>,
    policies: Vec<String>,
    seeds: Vec<u64>,
    distribution: Option<&PyShareDistribution>,
    prices: Option<PyReadonlyArray2<'_, f64>>,
) -> PyResult<Vec<PyArrivalRecord>> {
    let prices = node_prices(prices)?;
    let list = pods(&cpu_milli, &memory_mib, &gpus, &gpu_milli, &models)?;
    if orders.len() != policies.len() || orders.len() != seeds.len() {
        return Err(invalid_job("orders, policies and seeds differ in length"));
    }
    let runs = orders
        .iter()
        .zip(&policies)
        .zip(&seeds)
        .map(|((order, policy), &seed)| {
            let order = i64s(order)
                .into_iter()
                .map(|i| to("arrival order", i, invalid_job))
                .collect::<PyResult<Vec<u32>>>()?;
            Ok(Run {
                order,
                policy: SharePolicy::from_label(policy).py()?,
                seed,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let dist = distribution.map(|d| Arc::clone(&d.inner));
    let cluster = &cluster.inner;
    let out = enter(
        py,
        Stop::OnSignal,
        || -> Result<Vec<Arrivals>, CoreError> {
            share::replay_all(cluster, &list, &runs, dist, prices)
        },
    )?;
    Ok(out
        .into_iter()
        .map(|inner| PyArrivalRecord { inner })
        .collect())
}

/// The policy labels, in the paper's order, gpuplace's last.
#[pyfunction]
fn share_policies() -> Vec<&'static str> {
    SharePolicy::ALL.iter().map(|p| p.label()).collect()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySharedCluster>()?;
    m.add_class::<PyShareDistribution>()?;
    m.add_class::<PyShareScheduler>()?;
    m.add_class::<PyShareSlot>()?;
    m.add_class::<PyArrivalRecord>()?;
    m.add_function(wrap_pyfunction!(replay_arrivals, m)?)?;
    m.add_function(wrap_pyfunction!(share_policies, m)?)?;
    Ok(())
}
