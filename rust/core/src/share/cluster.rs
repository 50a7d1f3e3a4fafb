//! Nodes with CPU, memory and GPUs that pods share by the milli-GPU, and the requests placed
//! on them.
//!
//! A node has `cpu_milli` CPU, `memory_mib` memory and `gpus` GPUs of one model (none on a
//! CPU-only node). Each GPU has 1000 milli-GPUs. A pod asks for CPU, memory and either no
//! GPU, a share of one GPU (`gpus == 1`, `gpu_milli < 1000`: time-sliced with other shares,
//! as Alibaba's GPU-sharing clusters run them), or whole GPUs (`gpu_milli == 1000`, `gpus >=
//! 1`). It may restrict the GPU models it runs on ([`ModelSet`]). Every change is
//! all-or-nothing and bumps the node's stamp, so a caller that caches per-node scores knows
//! exactly which nodes changed since it last looked.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{CoreError, Result};

/// Milli-GPUs in one GPU.
pub const MILLI: u16 = 1000;

/// A set of GPU models, by the model ids the cluster's nodes carry (bit `m` for model `m`);
/// empty means any model. Bit 63 names no model: a set of only it accepts none (a request for
/// models the cluster lacks).
pub type ModelSet = u64;

/// The most distinct GPU models a cluster may have (the bits of a [`ModelSet`] but the last).
pub const MAX_MODELS: usize = 63;

/// One node: its name, capacity and its GPUs' model.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    pub name: String,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub gpus: u32,
    /// Model id of its GPUs; None for a node without GPUs.
    pub model: Option<u8>,
}

/// What a pod asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PodRequest {
    pub cpu_milli: u32,
    pub memory_mib: u64,
    /// GPUs: 0, 1 (whole or shared), or several whole ones.
    pub gpus: u32,
    /// Milli-GPUs on each of its GPUs: 1..=1000 with one GPU, 1000 with several, 0 without.
    pub gpu_milli: u16,
    /// The GPU models it may run on (empty: any).
    pub models: ModelSet,
}

/// How Kubernetes GPU-sharing schedulers group pods by their GPU ask (FGD's simulator calls it
/// the pod's "GPU affinity"): none, a share of one GPU, or `n` whole GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Affinity {
    NoGpu,
    Shared,
    Whole(u32),
}

impl PodRequest {
    /// A request that breaks the rules above is an InvalidJob naming the rule.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(CoreError::InvalidJob(m));
        match (self.gpus, self.gpu_milli) {
            (0, 0) => Ok(()),
            (0, m) => bad(format!("gpu_milli {m} without a GPU (gpus is 0)")),
            (1, m) if (1..=MILLI).contains(&m) => Ok(()),
            (1, m) => bad(format!("gpu_milli {m}: expected 1 to {MILLI}")),
            (_, MILLI) => Ok(()),
            (n, m) => bad(format!(
                "gpu_milli {m} on {n} GPUs: a share is of one GPU; several GPUs are whole \
                 ({MILLI})"
            )),
        }
    }

    /// A share of one GPU.
    #[inline]
    pub fn shared(&self) -> bool {
        self.gpus == 1 && self.gpu_milli < MILLI
    }

    /// Milli-GPUs in all.
    #[inline]
    pub fn total_gpu_milli(&self) -> u64 {
        self.gpus as u64 * self.gpu_milli as u64
    }

    pub fn affinity(&self) -> Affinity {
        if self.gpus == 0 {
            Affinity::NoGpu
        } else if self.shared() {
            Affinity::Shared
        } else {
            Affinity::Whole(self.gpus)
        }
    }

    /// May it run on GPUs of `model` (a node without GPUs never takes a GPU pod)?
    #[inline]
    pub fn accepts(&self, model: Option<u8>) -> bool {
        match model {
            None => false,
            Some(m) => self.models == 0 || self.models & (1u64 << m) != 0,
        }
    }
}

/// Where a pod goes: a node and the local indexes of its GPUs there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub node: u32,
    pub gpus: Vec<u32>,
}

/// A read-only view of one node's free resources.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    pub spec: &'a NodeSpec,
    pub cpu_left: u32,
    pub memory_left: u64,
    /// Free milli-GPUs of each of its GPUs, by local index.
    pub gpu_left: &'a [u16],
}

impl NodeView<'_> {
    /// Free milli-GPUs on the node.
    #[inline]
    pub fn gpu_left_total(&self) -> u64 {
        self.gpu_left.iter().map(|&g| g as u64).sum()
    }

    /// GPUs with nothing on them.
    #[inline]
    pub fn idle_gpus(&self) -> u32 {
        self.gpu_left.iter().filter(|&&g| g == MILLI).count() as u32
    }

    /// GPUs with at least `milli` free.
    #[inline]
    pub fn gpus_with(&self, milli: u16) -> u32 {
        self.gpu_left.iter().filter(|&&g| g >= milli).count() as u32
    }

    /// Can the pod run here: CPU, memory, its GPU model, and GPUs with room (one GPU with
    /// `gpu_milli` free for a share or a whole GPU; `gpus` idle GPUs for several)?
    #[inline]
    pub fn fits(&self, pod: &PodRequest) -> bool {
        if self.cpu_left < pod.cpu_milli || self.memory_left < pod.memory_mib {
            return false;
        }
        if pod.gpus == 0 {
            return true;
        }
        pod.accepts(self.spec.model) && self.gpus_with(pod.gpu_milli) >= pod.gpus
    }

    /// The lowest-indexed GPUs with `milli` free, `count` of them (how Kubernetes GPU-sharing
    /// device plugins hand out whole GPUs); None when there are fewer.
    pub fn first_gpus(&self, milli: u16, count: u32) -> Option<Vec<u32>> {
        let out: Vec<u32> = (0..self.gpu_left.len() as u32)
            .filter(|&g| self.gpu_left[g as usize] >= milli)
            .take(count as usize)
            .collect();
        (out.len() == count as usize).then_some(out)
    }

    /// The GPU a share goes to by best fit: the least free GPU that holds it (the lowest
    /// index among equals).
    pub fn tightest_gpu(&self, milli: u16) -> Option<u32> {
        let mut best: Option<u32> = None;
        for (g, &left) in self.gpu_left.iter().enumerate() {
            if left >= milli && best.is_none_or(|b| left < self.gpu_left[b as usize]) {
                best = Some(g as u32);
            }
        }
        best
    }
}

/// GPU pods on a node by [`Affinity`] (for the clustering policy).
#[derive(Debug, Clone, Default, PartialEq)]
struct AffinityCounts(Vec<(Affinity, u32)>);

impl AffinityCounts {
    fn change(&mut self, a: Affinity, add: bool) {
        match self.0.iter().position(|(k, _)| *k == a) {
            Some(i) if add => self.0[i].1 += 1,
            Some(i) => {
                self.0[i].1 -= 1;
                if self.0[i].1 == 0 {
                    self.0.swap_remove(i);
                }
            }
            None if add => self.0.push((a, 1)),
            None => {}
        }
    }
}

static NEXT_EPOCH: AtomicU64 = AtomicU64::new(1);

fn next_epoch() -> u64 {
    NEXT_EPOCH.fetch_add(1, Ordering::Relaxed)
}

/// Nodes, their free resources, and what runs on them.
#[derive(Debug)]
pub struct SharedCluster {
    nodes: Vec<NodeSpec>,
    models: Vec<String>,
    first_gpu: Vec<u32>,
    gpu_left: Vec<u16>,
    cpu_left: Vec<u32>,
    memory_left: Vec<u64>,
    affinity: Vec<AffinityCounts>,
    /// Per node, the value of `clock` when it last changed.
    stamp: Vec<u64>,
    clock: u64,
    /// Distinguishes this cluster (and each clone) from every other, for caches keyed on
    /// stamps.
    epoch: u64,
    used_gpu_milli: u64,
}

impl Clone for SharedCluster {
    fn clone(&self) -> Self {
        SharedCluster {
            nodes: self.nodes.clone(),
            models: self.models.clone(),
            first_gpu: self.first_gpu.clone(),
            gpu_left: self.gpu_left.clone(),
            cpu_left: self.cpu_left.clone(),
            memory_left: self.memory_left.clone(),
            affinity: self.affinity.clone(),
            stamp: self.stamp.clone(),
            clock: self.clock,
            epoch: next_epoch(),
            used_gpu_milli: self.used_gpu_milli,
        }
    }
}

impl SharedCluster {
    /// An empty cluster of `nodes`; `models` names the model ids the nodes use.
    pub fn new(nodes: Vec<NodeSpec>, models: Vec<String>) -> Result<SharedCluster> {
        if models.len() > MAX_MODELS {
            return Err(CoreError::InvalidTopology(format!(
                "{} GPU models; at most {MAX_MODELS} are supported",
                models.len()
            )));
        }
        let mut first_gpu = Vec::with_capacity(nodes.len() + 1);
        let mut total = 0u32;
        for n in &nodes {
            match n.model {
                Some(m) if m as usize >= models.len() => {
                    return Err(CoreError::InvalidTopology(format!(
                        "node {}: GPU model id {m}, but only {} models are named",
                        n.name,
                        models.len()
                    )))
                }
                None if n.gpus > 0 => {
                    return Err(CoreError::InvalidTopology(format!(
                        "node {} has {} GPUs but no GPU model",
                        n.name, n.gpus
                    )))
                }
                _ => {}
            }
            first_gpu.push(total);
            total = total.checked_add(n.gpus).ok_or_else(|| {
                CoreError::InvalidTopology("more than 2^32 GPUs in the cluster".into())
            })?;
        }
        first_gpu.push(total);
        Ok(SharedCluster {
            gpu_left: vec![MILLI; total as usize],
            cpu_left: nodes.iter().map(|n| n.cpu_milli).collect(),
            memory_left: nodes.iter().map(|n| n.memory_mib).collect(),
            affinity: vec![AffinityCounts::default(); nodes.len()],
            stamp: vec![0; nodes.len()],
            clock: 0,
            epoch: next_epoch(),
            used_gpu_milli: 0,
            first_gpu,
            nodes,
            models,
        })
    }

    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    pub fn num_gpus(&self) -> usize {
        self.gpu_left.len()
    }

    pub fn models(&self) -> &[String] {
        &self.models
    }

    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    #[inline]
    pub fn node(&self, node: usize) -> NodeView<'_> {
        NodeView {
            spec: &self.nodes[node],
            cpu_left: self.cpu_left[node],
            memory_left: self.memory_left[node],
            gpu_left: &self.gpu_left
                [self.first_gpu[node] as usize..self.first_gpu[node + 1] as usize],
        }
    }

    /// When the node last changed (see the module docs).
    #[inline]
    pub fn stamp(&self, node: usize) -> u64 {
        self.stamp[node]
    }

    #[inline]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The GPU pods on the node of one [`Affinity`].
    pub fn affinity_count(&self, node: usize, a: Affinity) -> u32 {
        self.affinity[node]
            .0
            .iter()
            .find(|(k, _)| *k == a)
            .map_or(0, |(_, c)| *c)
    }

    /// How many distinct [`Affinity`] kinds of GPU pods the node holds.
    pub fn affinity_kinds(&self, node: usize) -> usize {
        self.affinity[node].0.len()
    }

    /// Milli-GPUs allocated, and in all.
    pub fn used_gpu_milli(&self) -> u64 {
        self.used_gpu_milli
    }

    pub fn total_gpu_milli(&self) -> u64 {
        self.gpu_left.len() as u64 * MILLI as u64
    }

    /// CPU (milli) allocated and in all.
    pub fn cpu_used_and_total(&self) -> (u64, u64) {
        let total: u64 = self.nodes.iter().map(|n| n.cpu_milli as u64).sum();
        let left: u64 = self.cpu_left.iter().map(|&c| c as u64).sum();
        (total - left, total)
    }

    fn check_slot(&self, pod: &PodRequest, slot: &Slot) -> Result<()> {
        pod.check()?;
        let bad = |m: String| Err(CoreError::InvalidState(m));
        let node = slot.node as usize;
        if node >= self.nodes.len() {
            return bad(format!(
                "node {node} does not exist ({} nodes)",
                self.nodes.len()
            ));
        }
        let view = self.node(node);
        let name = &view.spec.name;
        if view.cpu_left < pod.cpu_milli {
            return bad(format!(
                "node {name} has {} milli-CPU free; the pod asks {}",
                view.cpu_left, pod.cpu_milli
            ));
        }
        if view.memory_left < pod.memory_mib {
            return bad(format!(
                "node {name} has {} MiB memory free; the pod asks {}",
                view.memory_left, pod.memory_mib
            ));
        }
        if slot.gpus.len() != pod.gpus as usize {
            return bad(format!(
                "the pod asks {} GPUs; the slot names {}",
                pod.gpus,
                slot.gpus.len()
            ));
        }
        if pod.gpus > 0 && !pod.accepts(view.spec.model) {
            let model = view
                .spec
                .model
                .map_or("none", |m| self.models[m as usize].as_str());
            return bad(format!(
                "node {name}'s GPU model ({model}) is not one the pod accepts"
            ));
        }
        for (k, &g) in slot.gpus.iter().enumerate() {
            if slot.gpus[..k].contains(&g) {
                return bad(format!("GPU {g} of node {name} named twice"));
            }
            match view.gpu_left.get(g as usize) {
                None => {
                    return bad(format!(
                        "node {name} has no GPU {g} ({} GPUs)",
                        view.gpu_left.len()
                    ))
                }
                Some(&left) if left < pod.gpu_milli => {
                    return bad(format!(
                        "GPU {g} of node {name} has {left} milli-GPUs free; the pod asks {}",
                        pod.gpu_milli
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Put a pod on a slot (checked: the node fits it and the GPUs have room; nothing changes
    /// otherwise).
    pub fn allocate(&mut self, pod: &PodRequest, slot: &Slot) -> Result<()> {
        self.check_slot(pod, slot)?;
        self.apply(pod, slot, true);
        Ok(())
    }

    /// Allocate without the checks, for a slot a policy just chose on this cluster.
    pub(crate) fn allocate_chosen(&mut self, pod: &PodRequest, slot: &Slot) {
        debug_assert!(self.check_slot(pod, slot).is_ok());
        self.apply(pod, slot, true);
    }

    /// Take a pod off its slot (checked: the slot must hold what the pod asked).
    pub fn release(&mut self, pod: &PodRequest, slot: &Slot) -> Result<()> {
        pod.check()?;
        let node = slot.node as usize;
        let bad = |m: String| Err(CoreError::InvalidState(m));
        if node >= self.nodes.len() || slot.gpus.len() != pod.gpus as usize {
            return bad(format!("no such allocation on node {node}"));
        }
        let spec = &self.nodes[node];
        let name = &spec.name;
        if self.cpu_left[node] as u64 + pod.cpu_milli as u64 > spec.cpu_milli as u64
            || self.memory_left[node] + pod.memory_mib > spec.memory_mib
            || (pod.gpus > 0 && self.affinity_count(node, pod.affinity()) == 0)
        {
            return bad(format!("node {name} does not hold such a pod"));
        }
        let view = self.node(node);
        for (k, &g) in slot.gpus.iter().enumerate() {
            if slot.gpus[..k].contains(&g)
                || view
                    .gpu_left
                    .get(g as usize)
                    .is_none_or(|&left| left + pod.gpu_milli > MILLI)
            {
                return bad(format!(
                    "GPU {g} of node {} does not hold such a pod",
                    view.spec.name
                ));
            }
        }
        self.apply(pod, slot, false);
        Ok(())
    }

    fn apply(&mut self, pod: &PodRequest, slot: &Slot, add: bool) {
        let node = slot.node as usize;
        let base = self.first_gpu[node] as usize;
        for &g in &slot.gpus {
            let left = &mut self.gpu_left[base + g as usize];
            if add {
                *left -= pod.gpu_milli;
            } else {
                *left += pod.gpu_milli;
            }
        }
        if add {
            self.cpu_left[node] -= pod.cpu_milli;
            self.memory_left[node] -= pod.memory_mib;
            self.used_gpu_milli += pod.total_gpu_milli();
        } else {
            self.cpu_left[node] += pod.cpu_milli;
            self.memory_left[node] += pod.memory_mib;
            self.used_gpu_milli -= pod.total_gpu_milli();
        }
        if pod.gpus > 0 {
            self.affinity[node].change(pod.affinity(), add);
        }
        self.clock += 1;
        self.stamp[node] = self.clock;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Two 8-GPU nodes of model 0 and one 2-GPU node of model 1, 64 cores and 256 GiB each.
    pub(crate) fn small() -> SharedCluster {
        let node = |gpus, model| NodeSpec {
            name: format!("n{gpus}"),
            cpu_milli: 64_000,
            memory_mib: 262_144,
            gpus,
            model: Some(model),
        };
        SharedCluster::new(
            vec![node(8, 0), node(8, 0), node(2, 1)],
            vec!["G2".into(), "T4".into()],
        )
        .unwrap()
    }

    pub(crate) fn pod(cpu: u32, gpus: u32, milli: u16) -> PodRequest {
        PodRequest {
            cpu_milli: cpu,
            memory_mib: 1024,
            gpus,
            gpu_milli: milli,
            models: 0,
        }
    }

    #[test]
    fn allocate_then_release_restores_the_state() {
        let mut c = small();
        let p = pod(4000, 1, 300);
        let slot = Slot {
            node: 2,
            gpus: vec![1],
        };
        c.allocate(&p, &slot).unwrap();
        assert_eq!(c.node(2).gpu_left, &[1000, 700]);
        assert_eq!(c.used_gpu_milli(), 300);
        assert_eq!(c.affinity_count(2, Affinity::Shared), 1);
        c.release(&p, &slot).unwrap();
        assert_eq!(c.node(2).gpu_left, &[1000, 1000]);
        assert_eq!(c.node(2).cpu_left, 64_000);
        assert_eq!(c.used_gpu_milli(), 0);
        assert_eq!(c.affinity_kinds(2), 0);
    }

    #[test]
    fn a_bad_slot_changes_nothing() {
        let mut c = small();
        let before = (c.node(0).gpu_left.to_vec(), c.stamp(0));
        let whole = pod(1000, 2, 1000);
        for slot in [
            Slot {
                node: 0,
                gpus: vec![0],
            },
            Slot {
                node: 0,
                gpus: vec![3, 3],
            },
            Slot {
                node: 0,
                gpus: vec![0, 9],
            },
            Slot {
                node: 7,
                gpus: vec![0, 1],
            },
        ] {
            assert!(matches!(
                c.allocate(&whole, &slot),
                Err(CoreError::InvalidState(_))
            ));
        }
        assert!(c
            .allocate(
                &pod(100_000, 0, 0),
                &Slot {
                    node: 0,
                    gpus: vec![]
                }
            )
            .is_err());
        assert_eq!((c.node(0).gpu_left.to_vec(), c.stamp(0)), before);
    }

    #[test]
    fn model_constraints_hold() {
        let c = small();
        let mut p = pod(1000, 1, 500);
        p.models = 1 << 1;
        assert!(!c.node(0).fits(&p));
        assert!(c.node(2).fits(&p));
        assert!(!p.accepts(None));
    }

    #[test]
    fn requests_are_checked() {
        assert!(pod(0, 2, 500).check().is_err());
        assert!(pod(0, 0, 5).check().is_err());
        assert!(pod(0, 1, 0).check().is_err());
        assert!(pod(0, 1, 1001).check().is_err());
        assert!(pod(0, 4, 1000).check().is_ok());
    }

    #[test]
    fn gpu_choices() {
        let mut c = small();
        c.allocate(
            &pod(0, 1, 600),
            &Slot {
                node: 0,
                gpus: vec![3],
            },
        )
        .unwrap();
        c.allocate(
            &pod(0, 1, 200),
            &Slot {
                node: 0,
                gpus: vec![5],
            },
        )
        .unwrap();
        let v = c.node(0);
        assert_eq!(v.tightest_gpu(300), Some(3));
        assert_eq!(v.tightest_gpu(500), Some(5));
        assert_eq!(v.first_gpus(MILLI, 3), Some(vec![0, 1, 2]));
        assert_eq!(v.first_gpus(MILLI, 7), None);
        assert_eq!(v.idle_gpus(), 6);
    }
}
