//! Nodes with CPU, memory and GPUs that pods share, and the requests placed on them.
//!
//! A node has `cpu_milli` CPU, `memory_mib` memory and `gpus` GPUs of one model (none on a
//! CPU-only node). Each GPU has 1000 milli-GPUs and is in one of two modes ([`GpuMode`]):
//!
//! - *fractional*: pods share it by the milli-GPU, time-sliced (as Alibaba's GPU-sharing
//!   clusters and Kubernetes GPU-sharing device plugins run them); a whole-GPU pod takes it
//!   only when nothing runs on it;
//! - *MIG*: it is partitioned into GPU instances under its model's profile rules
//!   ([`crate::share::mig`]); a pod gets an instance of the smallest profile that covers its
//!   share, a whole-GPU pod the full profile.
//!
//! A pod asks for CPU, memory and either no GPU, a share of one GPU (`gpus == 1`, `gpu_milli <
//! 1000`), or whole GPUs (`gpu_milli == 1000`); it may restrict the GPU models it runs on
//! ([`ModelSet`]) and the sharing it accepts ([`Isolation`]). An idle GPU can change mode (a
//! *reconfiguration*: enabling or disabling MIG resets the GPU, so it costs downtime; the
//! cluster counts them). Every change is all-or-nothing and bumps the node's stamp, so a caller
//! that caches per-node scores knows exactly which nodes changed since it last looked.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{CoreError, Result};
use crate::share::mig::{MigGpu, MigRules};

/// Milli-GPUs in one GPU.
pub const MILLI: u16 = 1000;

/// A set of GPU models, by the model ids the cluster's nodes carry (bit `m` for model `m`);
/// empty means any model. Bit 63 names no model: a set of only it accepts none (a request for
/// models the cluster lacks).
pub type ModelSet = u64;

/// The most distinct GPU models a cluster may have (the bits of a [`ModelSet`] but the last).
pub const MAX_MODELS: usize = 63;

/// How a GPU is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GpuMode {
    /// Pods share it by the milli-GPU, time-sliced.
    #[default]
    Fractional,
    /// Partitioned into MIG instances under its model's rules.
    Mig,
}

/// The sharing a pod accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Isolation {
    /// A fractional GPU or a MIG instance, whichever the policy picks.
    #[default]
    Any,
    /// A MIG instance only (hardware isolation of memory and compute).
    Mig,
    /// A fractional GPU only (time-sliced; e.g. it needs features MIG instances lack).
    Fractional,
}

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
    /// GPU memory (MiB) it needs on each GPU, which picks its MIG profile (0: not stated; on a
    /// fractional GPU it is the application's to keep within its share).
    pub gpu_memory_mib: u64,
    pub isolation: Isolation,
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
    /// A request for CPU, memory, GPUs and milli-GPUs per GPU, on any model, any sharing.
    pub fn new(cpu_milli: u32, memory_mib: u64, gpus: u32, gpu_milli: u16) -> PodRequest {
        PodRequest {
            cpu_milli,
            memory_mib,
            gpus,
            gpu_milli,
            models: 0,
            gpu_memory_mib: 0,
            isolation: Isolation::Any,
        }
    }

    /// A request that breaks the rules above is an InvalidJob naming the rule.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(CoreError::InvalidJob(m));
        match (self.gpus, self.gpu_milli) {
            (0, 0) if self.gpu_memory_mib == 0 && self.isolation == Isolation::Any => Ok(()),
            (0, 0) => bad("GPU memory or isolation without a GPU (gpus is 0)".into()),
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

    /// May it run on a GPU in `mode`?
    #[inline]
    pub fn accepts_mode(&self, mode: GpuMode) -> bool {
        !matches!(
            (self.isolation, mode),
            (Isolation::Mig, GpuMode::Fractional) | (Isolation::Fractional, GpuMode::Mig)
        )
    }
}

/// Where a pod goes: a node, the local indexes of its GPUs there, the first memory slice of its
/// MIG instance on each (ignored on fractional GPUs), and the idle GPUs whose mode changes first
/// (a reconfiguration, before the pod is placed).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Slot {
    pub node: u32,
    pub gpus: Vec<u32>,
    pub starts: Vec<u8>,
    pub reconfigure: Vec<u32>,
}

impl Slot {
    /// A slot on fractional GPUs (no MIG starts, no reconfiguration).
    pub fn new(node: u32, gpus: Vec<u32>) -> Slot {
        let starts = vec![0; gpus.len()];
        Slot {
            node,
            gpus,
            starts,
            reconfigure: Vec::new(),
        }
    }
}

/// A read-only view of one node's free resources.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    pub spec: &'a NodeSpec,
    pub cpu_left: u32,
    pub memory_left: u64,
    /// Free milli-GPUs of each of its GPUs, by local index (a MIG GPU's free compute share).
    pub gpu_left: &'a [u16],
    pub mode: &'a [GpuMode],
    pub mig: &'a [MigGpu],
    /// The MIG rules of its GPU model, if it has any.
    pub rules: Option<&'a MigRules>,
    /// Any of its GPUs in MIG mode (when none is, every GPU check is a comparison of free
    /// milli-GPUs).
    pub any_mig: bool,
}

/// Can a GPU in `mode` with `left` free milli-GPUs and MIG state `mig` host `milli` milli-GPUs
/// of a pod with this isolation and GPU memory?
#[inline]
pub fn gpu_hosts(
    mode: GpuMode,
    left: u16,
    mig: &MigGpu,
    rules: Option<&MigRules>,
    milli: u16,
    gpu_memory_mib: u64,
    isolation: Isolation,
) -> bool {
    match mode {
        GpuMode::Fractional => isolation != Isolation::Mig && left >= milli,
        GpuMode::Mig => {
            isolation != Isolation::Fractional
                && left > 0
                && rules.is_some_and(|r| r.hosts(mig, milli, gpu_memory_mib))
        }
    }
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

    /// Can GPU `g` host the pod's share or one of its whole GPUs?
    #[inline]
    pub fn hosts(&self, g: usize, pod: &PodRequest) -> bool {
        if !self.any_mig && pod.isolation != Isolation::Mig {
            return self.gpu_left[g] >= pod.gpu_milli;
        }
        gpu_hosts(
            self.mode[g],
            self.gpu_left[g],
            &self.mig[g],
            self.rules,
            pod.gpu_milli,
            pod.gpu_memory_mib,
            pod.isolation,
        )
    }

    /// GPUs that can host the pod (a share, or one of its whole GPUs).
    #[inline]
    pub fn hosting(&self, pod: &PodRequest) -> u32 {
        if !self.any_mig && pod.isolation != Isolation::Mig {
            // Every GPU fractional: one comparison per GPU (the hot path of every policy).
            return self
                .gpu_left
                .iter()
                .filter(|&&g| g >= pod.gpu_milli)
                .count() as u32;
        }
        (0..self.gpu_left.len())
            .filter(|&g| self.hosts(g, pod))
            .count() as u32
    }

    /// Can the pod run here: CPU, memory, its GPU model, and GPUs with room?
    #[inline]
    pub fn fits(&self, pod: &PodRequest) -> bool {
        if self.cpu_left < pod.cpu_milli || self.memory_left < pod.memory_mib {
            return false;
        }
        if pod.gpus == 0 {
            return true;
        }
        pod.accepts(self.spec.model) && self.hosting(pod) >= pod.gpus
    }

    /// The lowest valid first memory slice of the pod's MIG instance on GPU `g` (0 on a
    /// fractional GPU).
    pub fn first_start(&self, g: usize, pod: &PodRequest) -> u8 {
        match (self.mode[g], self.rules) {
            (GpuMode::Mig, Some(r)) => r
                .profile_for(pod.gpu_milli, pod.gpu_memory_mib)
                .and_then(|p| r.starts(&self.mig[g], p).next())
                .unwrap_or(0),
            _ => 0,
        }
    }

    /// The lowest-indexed GPUs that can host the pod, `gpus` of them (how Kubernetes
    /// GPU-sharing device plugins hand out whole GPUs); None when there are fewer.
    pub fn first_gpus(&self, pod: &PodRequest) -> Option<Vec<u32>> {
        let out: Vec<u32> = (0..self.gpu_left.len())
            .filter(|&g| self.hosts(g, pod))
            .map(|g| g as u32)
            .take(pod.gpus as usize)
            .collect();
        (out.len() == pod.gpus as usize).then_some(out)
    }

    /// The GPU a share goes to by best fit: the least free GPU that hosts it (the lowest index
    /// among equals).
    pub fn tightest_gpu(&self, pod: &PodRequest) -> Option<u32> {
        let mut best: Option<u32> = None;
        for g in 0..self.gpu_left.len() {
            if self.hosts(g, pod)
                && best.is_none_or(|b| self.gpu_left[g] < self.gpu_left[b as usize])
            {
                best = Some(g as u32);
            }
        }
        best
    }

    /// A slot for the pod on these GPUs, each MIG instance at its lowest valid start.
    pub fn slot(&self, node: usize, pod: &PodRequest, gpus: Vec<u32>) -> Slot {
        let starts = gpus
            .iter()
            .map(|&g| self.first_start(g as usize, pod))
            .collect();
        Slot {
            node: node as u32,
            gpus,
            starts,
            reconfigure: Vec::new(),
        }
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
    /// Per model, its MIG rules (None: not MIG-capable, or none given).
    rules: Vec<Option<Arc<MigRules>>>,
    first_gpu: Vec<u32>,
    gpu_left: Vec<u16>,
    gpu_mode: Vec<GpuMode>,
    gpu_mig: Vec<MigGpu>,
    /// Per node, its GPUs in MIG mode.
    mig_gpus: Vec<u32>,
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
    reconfigurations: u64,
}

impl Clone for SharedCluster {
    fn clone(&self) -> Self {
        SharedCluster {
            nodes: self.nodes.clone(),
            models: self.models.clone(),
            rules: self.rules.clone(),
            first_gpu: self.first_gpu.clone(),
            gpu_left: self.gpu_left.clone(),
            gpu_mode: self.gpu_mode.clone(),
            gpu_mig: self.gpu_mig.clone(),
            mig_gpus: self.mig_gpus.clone(),
            cpu_left: self.cpu_left.clone(),
            memory_left: self.memory_left.clone(),
            affinity: self.affinity.clone(),
            stamp: self.stamp.clone(),
            clock: self.clock,
            epoch: next_epoch(),
            used_gpu_milli: self.used_gpu_milli,
            reconfigurations: self.reconfigurations,
        }
    }
}

impl SharedCluster {
    /// An empty cluster of `nodes`, every GPU fractional; `models` names the model ids the nodes
    /// use.
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
            rules: vec![None; models.len()],
            gpu_left: vec![MILLI; total as usize],
            gpu_mode: vec![GpuMode::Fractional; total as usize],
            gpu_mig: vec![MigGpu::default(); total as usize],
            mig_gpus: vec![0; nodes.len()],
            cpu_left: nodes.iter().map(|n| n.cpu_milli).collect(),
            memory_left: nodes.iter().map(|n| n.memory_mib).collect(),
            affinity: vec![AffinityCounts::default(); nodes.len()],
            stamp: vec![0; nodes.len()],
            clock: 0,
            epoch: next_epoch(),
            used_gpu_milli: 0,
            reconfigurations: 0,
            first_gpu,
            nodes,
            models,
        })
    }

    /// Give a GPU model its MIG rules (checked), so its GPUs may run in MIG mode.
    pub fn set_mig_rules(&mut self, model: u8, rules: MigRules) -> Result<()> {
        rules.check()?;
        let slot = self.rules.get_mut(model as usize).ok_or_else(|| {
            CoreError::InvalidTopology(format!("GPU model id {model} does not exist"))
        })?;
        let in_use = self
            .nodes
            .iter()
            .enumerate()
            .any(|(n, spec)| spec.model == Some(model) && self.mig_gpus[n] > 0);
        if in_use && slot.is_some() {
            return Err(CoreError::InvalidState(format!(
                "GPU model {} has GPUs in MIG mode; its rules cannot change now",
                self.models[model as usize]
            )));
        }
        *slot = Some(Arc::new(rules));
        Ok(())
    }

    pub fn mig_rules(&self, model: u8) -> Option<&MigRules> {
        self.rules.get(model as usize)?.as_deref()
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
    fn gpu_range(&self, node: usize) -> std::ops::Range<usize> {
        self.first_gpu[node] as usize..self.first_gpu[node + 1] as usize
    }

    #[inline]
    pub fn node(&self, node: usize) -> NodeView<'_> {
        let range = self.gpu_range(node);
        let spec = &self.nodes[node];
        NodeView {
            spec,
            cpu_left: self.cpu_left[node],
            memory_left: self.memory_left[node],
            gpu_left: &self.gpu_left[range.clone()],
            mode: &self.gpu_mode[range.clone()],
            mig: &self.gpu_mig[range],
            rules: spec.model.and_then(|m| self.rules[m as usize].as_deref()),
            any_mig: self.mig_gpus[node] > 0,
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

    /// Mode changes of idle GPUs so far.
    pub fn reconfigurations(&self) -> u64 {
        self.reconfigurations
    }

    /// CPU (milli) allocated and in all.
    pub fn cpu_used_and_total(&self) -> (u64, u64) {
        let total: u64 = self.nodes.iter().map(|n| n.cpu_milli as u64).sum();
        let left: u64 = self.cpu_left.iter().map(|&c| c as u64).sum();
        (total - left, total)
    }

    fn check_node(&self, node: usize) -> Result<()> {
        if node >= self.nodes.len() {
            return Err(CoreError::InvalidState(format!(
                "node {node} does not exist ({} nodes)",
                self.nodes.len()
            )));
        }
        Ok(())
    }

    /// Why GPU `g` of `node` cannot change to `mode` now (None: it can).
    fn mode_blocker(&self, node: usize, g: u32, mode: GpuMode) -> Option<String> {
        let view = self.node(node);
        let name = &view.spec.name;
        let Some(&left) = view.gpu_left.get(g as usize) else {
            return Some(format!(
                "node {name} has no GPU {g} ({} GPUs)",
                view.gpu_left.len()
            ));
        };
        if left != MILLI || !view.mig[g as usize].is_empty() {
            return Some(format!(
                "GPU {g} of node {name} is in use; only an idle GPU changes mode"
            ));
        }
        if mode == GpuMode::Mig && view.rules.is_none() {
            let model = view
                .spec
                .model
                .map_or("none", |m| self.models[m as usize].as_str());
            return Some(format!("GPU model {model} of node {name} has no MIG rules"));
        }
        None
    }

    /// Put an idle GPU in `mode` (a reconfiguration, counted, when the mode changes).
    pub fn set_mode(&mut self, node: usize, g: u32, mode: GpuMode) -> Result<()> {
        self.check_node(node)?;
        if let Some(why) = self.mode_blocker(node, g, mode) {
            return Err(CoreError::InvalidState(why));
        }
        let i = self.first_gpu[node] as usize + g as usize;
        if self.gpu_mode[i] != mode {
            self.flip(node, i);
            self.reconfigurations += 1;
            self.clock += 1;
            self.stamp[node] = self.clock;
        }
        Ok(())
    }

    /// Put an idle GPU in `mode` without counting a reconfiguration, for a scheduler's view of
    /// what switching would allow; false when it cannot change now.
    pub(crate) fn switch_view(&mut self, node: usize, g: u32, mode: GpuMode) -> bool {
        let i = self.first_gpu[node] as usize + g as usize;
        if self.gpu_mode[i] == mode || self.mode_blocker(node, g, mode).is_some() {
            return false;
        }
        self.flip(node, i);
        true
    }

    fn flip(&mut self, node: usize, i: usize) {
        let to = match self.gpu_mode[i] {
            GpuMode::Fractional => GpuMode::Mig,
            GpuMode::Mig => GpuMode::Fractional,
        };
        self.gpu_mode[i] = to;
        if to == GpuMode::Mig {
            self.mig_gpus[node] += 1;
        } else {
            self.mig_gpus[node] -= 1;
        }
    }

    fn check_slot(&self, pod: &PodRequest, slot: &Slot) -> Result<()> {
        pod.check()?;
        let bad = |m: String| Err(CoreError::InvalidState(m));
        let node = slot.node as usize;
        self.check_node(node)?;
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
        if slot.gpus.len() != pod.gpus as usize || slot.starts.len() != slot.gpus.len() {
            return bad(format!(
                "the pod asks {} GPUs; the slot names {} (with {} MIG starts)",
                pod.gpus,
                slot.gpus.len(),
                slot.starts.len()
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
        for (k, &g) in slot.reconfigure.iter().enumerate() {
            if slot.reconfigure[..k].contains(&g) {
                return bad(format!("GPU {g} of node {name} reconfigured twice"));
            }
            let to = match view.mode.get(g as usize) {
                Some(GpuMode::Fractional) => GpuMode::Mig,
                _ => GpuMode::Fractional,
            };
            if let Some(why) = self.mode_blocker(node, g, to) {
                return bad(why);
            }
        }
        for (k, (&g, &start)) in slot.gpus.iter().zip(&slot.starts).enumerate() {
            if slot.gpus[..k].contains(&g) {
                return bad(format!("GPU {g} of node {name} named twice"));
            }
            let Some(&left) = view.gpu_left.get(g as usize) else {
                return bad(format!(
                    "node {name} has no GPU {g} ({} GPUs)",
                    view.gpu_left.len()
                ));
            };
            let mut mode = view.mode[g as usize];
            if slot.reconfigure.contains(&g) {
                mode = match mode {
                    GpuMode::Fractional => GpuMode::Mig,
                    GpuMode::Mig => GpuMode::Fractional,
                };
            }
            if !pod.accepts_mode(mode) {
                return bad(format!(
                    "GPU {g} of node {name} is {}; the pod asks {:?} isolation",
                    if mode == GpuMode::Mig {
                        "in MIG mode"
                    } else {
                        "fractional"
                    },
                    pod.isolation
                ));
            }
            match mode {
                GpuMode::Fractional => {
                    if left < pod.gpu_milli {
                        return bad(format!(
                            "GPU {g} of node {name} has {left} milli-GPUs free; the pod asks {}",
                            pod.gpu_milli
                        ));
                    }
                }
                GpuMode::Mig => {
                    let rules = view.rules.expect("a MIG GPU's model has rules");
                    let Some(p) = rules.profile_for(pod.gpu_milli, pod.gpu_memory_mib) else {
                        return bad(format!(
                            "no {} MIG profile covers {} milli-GPUs and {} MiB",
                            rules.model, pod.gpu_milli, pod.gpu_memory_mib
                        ));
                    };
                    let gpu = if slot.reconfigure.contains(&g) {
                        MigGpu::default()
                    } else {
                        view.mig[g as usize]
                    };
                    if start >= 64 || !rules.fits_at(&gpu, p, start) {
                        return bad(format!(
                            "GPU {g} of node {name}: a {} instance cannot start at memory \
                             slice {start} (allowed {:?}, free where not occupied)",
                            rules.profiles[p].name, rules.profiles[p].starts
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Put a pod on a slot (checked: the node fits it, the GPUs have room under their mode,
    /// the reconfigured GPUs are idle; nothing changes otherwise).
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

    /// Take a pod off its slot (checked: the slot must hold what the pod asked). The GPUs keep
    /// their mode.
    pub fn release(&mut self, pod: &PodRequest, slot: &Slot) -> Result<()> {
        pod.check()?;
        let node = slot.node as usize;
        let bad = |m: String| Err(CoreError::InvalidState(m));
        if node >= self.nodes.len()
            || slot.gpus.len() != pod.gpus as usize
            || slot.starts.len() != slot.gpus.len()
        {
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
        for (k, (&g, &start)) in slot.gpus.iter().zip(&slot.starts).enumerate() {
            let held = slot.gpus[..k].contains(&g)
                || match view.mode.get(g as usize) {
                    None => true,
                    Some(GpuMode::Fractional) => view.gpu_left[g as usize] + pod.gpu_milli > MILLI,
                    Some(GpuMode::Mig) => {
                        let rules = view.rules.expect("a MIG GPU's model has rules");
                        start >= 64
                            || rules
                                .profile_for(pod.gpu_milli, pod.gpu_memory_mib)
                                .and_then(|p| rules.without(&view.mig[g as usize], p, start))
                                .is_none()
                    }
                };
            if held {
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
        if add {
            for &g in &slot.reconfigure {
                self.flip(node, base + g as usize);
                self.reconfigurations += 1;
            }
        }
        let rules = self.nodes[node]
            .model
            .and_then(|m| self.rules[m as usize].clone());
        for (&g, &start) in slot.gpus.iter().zip(&slot.starts) {
            let i = base + g as usize;
            let before = self.gpu_left[i];
            match self.gpu_mode[i] {
                GpuMode::Fractional => {
                    if add {
                        self.gpu_left[i] -= pod.gpu_milli;
                    } else {
                        self.gpu_left[i] += pod.gpu_milli;
                    }
                }
                GpuMode::Mig => {
                    let r = rules.as_deref().expect("a MIG GPU's model has rules");
                    let p = r
                        .profile_for(pod.gpu_milli, pod.gpu_memory_mib)
                        .expect("checked");
                    self.gpu_mig[i] = if add {
                        r.with(&self.gpu_mig[i], p, start)
                    } else {
                        r.without(&self.gpu_mig[i], p, start).expect("checked")
                    };
                    self.gpu_left[i] = r.free_milli(&self.gpu_mig[i]);
                }
            }
            let after = self.gpu_left[i];
            self.used_gpu_milli = self.used_gpu_milli + before as u64 - after as u64;
        }
        if add {
            self.cpu_left[node] -= pod.cpu_milli;
            self.memory_left[node] -= pod.memory_mib;
        } else {
            self.cpu_left[node] += pod.cpu_milli;
            self.memory_left[node] += pod.memory_mib;
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
        PodRequest::new(cpu, 1024, gpus, milli)
    }

    #[test]
    fn allocate_then_release_restores_the_state() {
        let mut c = small();
        let p = pod(4000, 1, 300);
        let slot = Slot::new(2, vec![1]);
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
            Slot::new(0, vec![0]),
            Slot::new(0, vec![3, 3]),
            Slot::new(0, vec![0, 9]),
            Slot::new(7, vec![0, 1]),
        ] {
            assert!(matches!(
                c.allocate(&whole, &slot),
                Err(CoreError::InvalidState(_))
            ));
        }
        assert!(c
            .allocate(&pod(100_000, 0, 0), &Slot::new(0, vec![]))
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
        c.allocate(&pod(0, 1, 600), &Slot::new(0, vec![3])).unwrap();
        c.allocate(&pod(0, 1, 200), &Slot::new(0, vec![5])).unwrap();
        let v = c.node(0);
        assert_eq!(v.tightest_gpu(&pod(0, 1, 300)), Some(3));
        assert_eq!(v.tightest_gpu(&pod(0, 1, 500)), Some(5));
        assert_eq!(v.first_gpus(&pod(0, 3, MILLI)), Some(vec![0, 1, 2]));
        assert_eq!(v.first_gpus(&pod(0, 7, MILLI)), None);
        assert_eq!(v.idle_gpus(), 6);
    }
}
