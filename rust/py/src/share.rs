//! Shared GPUs (`gpuplace_core::share`): the cluster of nodes with CPU, memory and GPUs shared
//! by the milli-GPU or as MIG instances, the pod distribution FGD weighs fragmentation by, a
//! scheduler under one policy, and the arrival-only replay of many runs at once.
//!
//! A pod crosses as a row of six integers, `(cpu_milli, memory_mib, gpus, gpu_milli,
//! gpu_memory_mib, isolation code)`, and its model set (`u64`); many pods as an `(n, 6)` array
//! and an array of model sets.

use std::sync::Arc;

use gpuplace_core::share::{
    self, Arrivals, Distribution, MigProfile, MigRules, NodePrice, NodeSpec, PodRequest, Run,
    Scheduler, SharePolicy, SharedCluster, Slot,
};
use gpuplace_core::CoreError;
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use crate::convert::i64s;
use crate::enums::{GpuMode, Isolation};
use crate::errors::{enter, invalid_job, invalid_state, invalid_topology, CoreResultExt, Stop};

fn to<T: TryFrom<i64>>(what: &str, v: i64, err: fn(String) -> PyErr) -> PyResult<T> {
    T::try_from(v).map_err(|_| err(format!("{what}: {v} is out of range")))
}

/// A pod from its row (see the module docs).
fn pod(row: [i64; 6], models: u64) -> PyResult<PodRequest> {
    let isolation = usize::try_from(row[5])
        .ok()
        .and_then(|k| Isolation::MEMBERS.get(k))
        .ok_or_else(|| invalid_job(format!("isolation code {} is not one", row[5])))?;
    let pod = PodRequest {
        cpu_milli: to("cpu_milli", row[0], invalid_job)?,
        memory_mib: to("memory_mib", row[1], invalid_job)?,
        gpus: to("gpus", row[2], invalid_job)?,
        gpu_milli: to("gpu_milli", row[3], invalid_job)?,
        models,
        gpu_memory_mib: to("gpu_memory_mib", row[4], invalid_job)?,
        isolation: isolation.to_core(),
    };
    pod.check().py()?;
    Ok(pod)
}

/// Pods from an `(n, 6)` array of rows and their model sets.
fn pods(
    rows: &PyReadonlyArray2<'_, i64>,
    models: &PyReadonlyArray1<'_, u64>,
) -> PyResult<Vec<PodRequest>> {
    let a = rows.as_array();
    let masks: Vec<u64> = models.as_array().iter().copied().collect();
    if a.ncols() != 6 || a.nrows() != masks.len() {
        return Err(invalid_job(format!(
            "pods: expected an (n, 6) array and n model sets, got {:?} and {}",
            a.shape(),
            masks.len()
        )));
    }
    a.rows()
        .into_iter()
        .zip(masks)
        .enumerate()
        .map(|(i, (r, m))| {
            pod([r[0], r[1], r[2], r[3], r[4], r[5]], m)
                .map_err(|e| invalid_job(format!("pod {i}: {e}")))
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

/// A profile as it crosses: (name, compute slices, memory slices, starts, max instances,
/// memory MiB).
type ProfileRow = (String, u8, u8, Vec<u8>, u8, u64);

/// `gpuplace._core.SharedCluster`: nodes with CPU, memory and shared GPUs.
#[pyclass(name = "SharedCluster", module = "gpuplace._core")]
pub(crate) struct PySharedCluster {
    pub(crate) inner: SharedCluster,
}

impl PySharedCluster {
    fn node_index(&self, node: i64) -> PyResult<usize> {
        usize::try_from(node)
            .ok()
            .filter(|&n| n < self.inner.num_nodes())
            .ok_or_else(|| {
                invalid_state(format!(
                    "node {node} does not exist ({} nodes)",
                    self.inner.num_nodes()
                ))
            })
    }
}

#[pymethods]
impl PySharedCluster {
    /// Nodes as parallel arrays; `model` is an index into `models` (-1: no GPUs). Every GPU
    /// starts fractional.
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

    /// Give GPU model `model` (an index into `models`) its MIG rules: the model's name,
    /// memory and compute slices, and its profiles (media profiles left out).
    fn set_mig_rules(
        &mut self,
        model: u8,
        name: String,
        memory_slices: u8,
        compute_slices: u8,
        profiles: Vec<ProfileRow>,
    ) -> PyResult<()> {
        let rules = MigRules {
            model: name,
            memory_slices,
            compute_slices,
            profiles: profiles
                .into_iter()
                .map(
                    |(name, compute, size, starts, max_instances, memory_mib)| MigProfile {
                        name,
                        compute,
                        size,
                        starts,
                        max_instances,
                        memory_mib,
                    },
                )
                .collect(),
        };
        self.inner.set_mig_rules(model, rules).py()
    }

    /// Put an idle GPU in a mode (a reconfiguration when it changes).
    fn set_mode(&mut self, node: i64, gpu: u32, mode: GpuMode) -> PyResult<()> {
        let n = self.node_index(node)?;
        self.inner.set_mode(n, gpu, mode.to_core()).py()
    }

    /// The modes of one node's GPUs, by local index.
    fn gpu_modes(&self, node: i64) -> PyResult<Vec<GpuMode>> {
        let n = self.node_index(node)?;
        Ok(self
            .inner
            .node(n)
            .mode
            .iter()
            .map(|&m| GpuMode::from_core(m))
            .collect())
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

    /// Idle GPUs switched between fractional and MIG mode so far.
    #[getter]
    fn reconfigurations(&self) -> u64 {
        self.inner.reconfigurations()
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

    /// Free milli-GPUs of one node's GPUs, by local index (a MIG GPU's free compute share).
    fn gpu_left<'py>(&self, py: Python<'py>, node: i64) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let n = self.node_index(node)?;
        Ok(self
            .inner
            .node(n)
            .gpu_left
            .iter()
            .map(|&g| g as i64)
            .collect::<Vec<_>>()
            .into_pyarray(py))
    }

    /// Can the pod run on the node now (as the policies filter)?
    fn fits(&self, node: i64, pod_row: [i64; 6], models: u64) -> PyResult<bool> {
        let n = self.node_index(node)?;
        Ok(self.inner.node(n).fits(&pod(pod_row, models)?))
    }

    /// Put a pod on `node`: these local GPUs, MIG instances at these starts, after switching
    /// the `reconfigure` GPUs' mode (checked; all or nothing).
    #[pyo3(signature = (pod_row, models, node, gpus, starts, reconfigure=Vec::new()))]
    fn allocate(
        &mut self,
        pod_row: [i64; 6],
        models: u64,
        node: u32,
        gpus: Vec<u32>,
        starts: Vec<u8>,
        reconfigure: Vec<u32>,
    ) -> PyResult<()> {
        let p = pod(pod_row, models)?;
        let slot = Slot {
            node,
            gpus,
            starts,
            reconfigure,
        };
        self.inner.allocate(&p, &slot).py()
    }

    /// Take a pod off its slot (checked).
    fn release(
        &mut self,
        pod_row: [i64; 6],
        models: u64,
        node: u32,
        gpus: Vec<u32>,
        starts: Vec<u8>,
    ) -> PyResult<()> {
        let p = pod(pod_row, models)?;
        self.inner
            .release(
                &p,
                &Slot {
                    node,
                    gpus,
                    starts,
                    reconfigure: Vec::new(),
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
    fn new(
        pods_rows: PyReadonlyArray2<'_, i64>,
        models: PyReadonlyArray1<'_, u64>,
        weights: PyReadonlyArray1<'_, f64>,
        num_models: usize,
    ) -> PyResult<Self> {
        let list = pods(&pods_rows, &models)?;
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

/// `gpuplace._core.ShareSlot`: a node, the local GPUs a pod gets there, the first memory slice
/// of its MIG instance on each (0 on fractional GPUs), and the GPUs to reconfigure first.
#[pyclass(frozen, get_all, name = "ShareSlot", module = "gpuplace._core")]
pub(crate) struct PyShareSlot {
    node: u32,
    gpus: Vec<u32>,
    starts: Vec<u8>,
    reconfigure: Vec<u32>,
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
    /// gpuplace policy; `reconfigure`: switch idle GPUs' mode for pods no GPU in its mode
    /// takes.
    #[new]
    #[pyo3(signature = (policy, seed, distribution=None, prices=None, reconfigure=false))]
    fn new(
        policy: &str,
        seed: u64,
        distribution: Option<&PyShareDistribution>,
        prices: Option<PyReadonlyArray2<'_, f64>>,
        reconfigure: bool,
    ) -> PyResult<Self> {
        let policy = SharePolicy::from_label(policy).py()?;
        let prices = node_prices(prices)?;
        let nodes = prices.as_ref().map(|p| p.len());
        Ok(PyShareScheduler {
            inner: Scheduler::new(policy, seed, distribution.map(|d| Arc::clone(&d.inner)))
                .py()?
                .with_prices(prices)
                .with_reconfiguration(reconfigure),
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
        pod_row: [i64; 6],
        models: u64,
    ) -> PyResult<Option<PyShareSlot>> {
        let p = pod(pod_row, models)?;
        if let Some(n) = self.nodes.filter(|&n| n != cluster.inner.num_nodes()) {
            return Err(invalid_job(format!(
                "the scheduler's prices are for {n} nodes; the cluster has {}",
                cluster.inner.num_nodes()
            )));
        }
        Ok(self.inner.choose(&cluster.inner, &p).map(|s| PyShareSlot {
            node: s.node,
            gpus: s.gpus,
            starts: s.starts,
            reconfigure: s.reconfigure,
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

    /// Idle GPUs switched between fractional and MIG mode in the run.
    #[getter]
    fn reconfigurations(&self) -> u64 {
        self.inner.reconfigurations
    }
}

/// Replay arrival-only runs (one per entry of `orders`, `policies`, `seeds`) on copies of
/// `cluster`, in parallel, without the GIL; Ctrl-C stops them.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (cluster, pods_rows, models, orders, policies, seeds, distribution=None, prices=None, reconfigure=false))]
fn replay_arrivals(
    py: Python<'_>,
    cluster: &PySharedCluster,
    pods_rows: PyReadonlyArray2<'_, i64>,
    models: PyReadonlyArray1<'_, u64>,
    orders: Vec<PyReadonlyArray1<'_, i64>>,
    policies: Vec<String>,
    seeds: Vec<u64>,
    distribution: Option<&PyShareDistribution>,
    prices: Option<PyReadonlyArray2<'_, f64>>,
    reconfigure: bool,
) -> PyResult<Vec<PyArrivalRecord>> {
    let list = pods(&pods_rows, &models)?;
    let prices = node_prices(prices)?;
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
            share::replay_all(cluster, &list, &runs, dist, prices, reconfigure)
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
