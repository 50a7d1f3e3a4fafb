//! Which GPUs are free, allocated or out of service, with per-domain free counters kept
//! incrementally, so solvers ask "how many usable GPUs does this leaf have" without scanning
//! GPUs. Every change is all-or-nothing: an operation that fails changes nothing.
//!
//! Health is kept per component: a GPU, a host (node-level domain), a NIC (when the caller
//! gave each GPU its NIC) or a switch (a domain at any level above the host). A component is
//! ok, degraded (with a bandwidth factor in (0, 1] and a reason), failed or drained. From the
//! components the state derives, per GPU:
//!
//! - its effective status: failed if any component on its path (itself, its host, its NIC,
//!   any switch above its host) failed, else drained if any is drained, else ok. Only ok GPUs
//!   are ever counted free or given to a job;
//! - its *side factors* (see [`crate::cost`]): for each level `l`, the smallest bandwidth
//!   factor among the components a path leaving this GPU at lowest common level `l` crosses.
//!
//! Spare GPUs (`set_spare`) are held back for repairs: they are never counted free, so normal
//! placement never sees them; a repair may take them, and a spare given to a job stops being a
//! spare.
//!
//! Fenced GPUs (`set_fence`) are out of bounds for the job being placed or repaired (outside
//! its pool, or excluded by a hardware rule): they count neither free nor spare, so every
//! solver and the repair honour the fence without knowing why it is there.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{CoreError, Result};
use crate::fabric::Load;
use crate::job::JobSpec;
use crate::topology::{Csr, Topology};

/// Effective health of one GPU (what solvers see).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum GpuStatus {
    Ok = 0,
    /// Broken: never used by any solver.
    Failed = 1,
    /// Taken out of service by an operator: never used by any solver.
    Drained = 2,
}

impl GpuStatus {
    pub fn from_code(code: u8) -> Option<GpuStatus> {
        match code {
            0 => Some(GpuStatus::Ok),
            1 => Some(GpuStatus::Failed),
            2 => Some(GpuStatus::Drained),
            _ => None,
        }
    }
    pub fn usable(self) -> bool {
        self == GpuStatus::Ok
    }
}

/// A piece of hardware whose health is tracked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    Gpu(u32),
    /// A host: a domain of the topology's node level.
    Node(u32),
    /// A NIC, by the dense id the caller gave in [`ClusterState::with_nics`].
    Nic(u32),
    /// A switch: a domain at a level above the node level.
    Switch {
        level: u32,
        domain: u32,
    },
}

/// The condition of a component that is not ok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Condition {
    /// Works at reduced bandwidth: `factor` scales every path through it.
    Degraded = 1,
    Failed = 2,
    Drained = 3,
}

impl Condition {
    pub fn from_code(code: u8) -> Option<Condition> {
        match code {
            1 => Some(Condition::Degraded),
            2 => Some(Condition::Failed),
            3 => Some(Condition::Drained),
            _ => None,
        }
    }

    /// How far the condition takes a component out of service, above ok (0): degraded (still
    /// used, slower), drained, failed. A GPU under several components takes the most severe
    /// (`derive`), and evidence of a milder condition never replaces a more severe one.
    pub fn severity(self) -> u8 {
        match self {
            Condition::Degraded => 1,
            Condition::Drained => 2,
            Condition::Failed => 3,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ComponentHealth {
    pub condition: Condition,
    /// Bandwidth factor in (0, 1] of every path through the component (1 unless degraded).
    pub factor: f64,
    pub reason: String,
}

const NO_JOB: u32 = u32::MAX;
const NO_NIC: u32 = u32::MAX;

#[derive(Debug, Clone, PartialEq)]
pub struct JobAllocation {
    pub name: String,
    /// GPU of each rank.
    pub gpus: Vec<u32>,
    /// The job's communication, when the caller gave it: its flows load the fabric.
    pub spec: Option<Arc<JobSpec>>,
    /// Its storage traffic ([`crate::storage`]), which loads the uplinks too.
    pub io: Vec<crate::storage::IoDemand>,
    /// The load its collectives and storage traffic put on the fabric's uplinks: per slot,
    /// the heaviest of its classes and its storage traffic ([`ClusterState::flows_of`]).
    pub load: Load,
    /// The flows behind `load`, kept for large jobs so that a repair sums again only those
    /// of the collectives it moves ([`crate::fabric::job_load_moved`]).
    pub flows: FlowCache,
}

/// A job's recorded flows ([`crate::fabric::JobFlows`]), or none: a cache of what its load is
/// summed from, not part of the allocation (two allocations alike are equal whatever they
/// cache).
#[derive(Debug, Clone, Default)]
pub struct FlowCache(Option<Arc<crate::fabric::JobFlows>>);

impl PartialEq for FlowCache {
    fn eq(&self, _: &FlowCache) -> bool {
        true
    }
}

/// Jobs from this many ranks keep their flows ([`FlowCache`]): a repair of a small job sums
/// its few flows again faster than it would copy them.
const FLOW_CACHE_RANKS: usize = 512;

/// Which counters a GPU contributes to.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Flags {
    free: bool,
    spare_free: bool,
    free_degraded: bool,
}

#[derive(Debug, Clone)]
pub struct ClusterState {
    topo: Arc<Topology>,
    /// Effective status per GPU, derived from `components`.
    health: Vec<GpuStatus>,
    owner: Vec<u32>,
    /// `free[l][d]`: GPUs of level-l domain d that are unallocated, usable and not spares.
    free: Vec<Vec<u32>>,
    /// `spare_free[l][d]`: spare GPUs of the domain that are unallocated and usable.
    spare_free: Vec<Vec<u32>>,
    /// `free_degraded[l][d]`: free GPUs of the domain with a side factor below 1.
    free_degraded: Vec<Vec<u32>>,
    /// The running jobs, shared copy-on-write between a state and its copies: the views
    /// solvers build (hot domains held back, a spread, a fence) clone the state but never
    /// change its jobs, and copying every job's GPUs and flows cost more than the packing.
    jobs: Arc<Vec<Option<JobAllocation>>>,
    job_index: Arc<HashMap<String, u32>>,
    /// NIC of every GPU (`NO_NIC` for none) and the GPUs of every NIC.
    gpu_nic: Vec<u32>,
    nic_gpus: Csr,
    spare: Vec<bool>,
    /// GPUs out of bounds for the job being placed (see [`ClusterState::set_fence`]).
    fenced: Vec<bool>,
    /// Components that are not ok.
    components: HashMap<Component, ComponentHealth>,
    degraded_components: usize,
    /// GPU-major side factors (`num_gpus x levels`); empty while nothing is degraded.
    factors: Vec<f32>,
    /// Per GPU: some side factor is below 1.
    degraded: Vec<bool>,
    /// Per uplink direction slot (see [`crate::fabric`]): the running jobs' load (GB/s).
    fabric_load: Vec<f64>,
    /// Jobs whose load is not empty.
    loaded_jobs: usize,
}

fn invalid(msg: impl Into<String>) -> CoreError {
    CoreError::InvalidState(msg.into())
}

impl ClusterState {
    pub fn new(topo: Arc<Topology>) -> ClusterState {
        let n = topo.num_gpus();
        ClusterState::with_nics(topo, vec![NO_NIC; n]).expect("no NICs is always valid")
    }

    /// A state that also tracks NICs: `gpu_nic[g]` is the dense NIC id of GPU g, or
    /// `u32::MAX` for a GPU without one.
    pub fn with_nics(topo: Arc<Topology>, gpu_nic: Vec<u32>) -> Result<ClusterState> {
        let n = topo.num_gpus();
        if gpu_nic.len() != n {
            return Err(invalid(format!(
                "gpu_nic: expected one entry per GPU ({n}), got {}",
                gpu_nic.len()
            )));
        }
        let nics = gpu_nic
            .iter()
            .filter(|&&x| x != NO_NIC)
            .map(|&x| x as usize + 1)
            .max()
            .unwrap_or(0);
        if nics > n {
            return Err(invalid(format!(
                "gpu_nic: NIC ids must be dense (got id {} for {n} GPUs)",
                nics - 1
            )));
        }
        let nic_gpus = Csr::from_pairs(
            nics,
            gpu_nic
                .iter()
                .enumerate()
                .filter(|(_, &x)| x != NO_NIC)
                .map(|(g, &x)| (x as usize, g as u32)),
        );
        let zeros: Vec<Vec<u32>> = (0..topo.num_levels())
            .map(|l| vec![0; topo.domain_count(l)])
            .collect();
        let free = (0..topo.num_levels())
            .map(|l| topo.domain_sizes(l).to_vec())
            .collect();
        Ok(ClusterState {
            health: vec![GpuStatus::Ok; n],
            owner: vec![NO_JOB; n],
            free,
            spare_free: zeros.clone(),
            free_degraded: zeros,
            jobs: Arc::new(Vec::new()),
            job_index: Arc::new(HashMap::new()),
            gpu_nic,
            nic_gpus,
            spare: vec![false; n],
            fenced: vec![false; n],
            components: HashMap::new(),
            degraded_components: 0,
            factors: Vec::new(),
            degraded: vec![false; n],
            fabric_load: vec![0.0; 2 * topo.uplink_count()],
            loaded_jobs: 0,
            topo,
        })
    }

    pub fn topology(&self) -> &Arc<Topology> {
        &self.topo
    }

    /// Unallocated, healthy, not fenced and not a reserved spare: what normal placement may
    /// use.
    #[inline]
    pub fn is_free(&self, gpu: usize) -> bool {
        self.owner[gpu] == NO_JOB
            && self.health[gpu].usable()
            && !self.spare[gpu]
            && !self.fenced[gpu]
    }

    /// A reserved spare that is unallocated, healthy and not fenced: what only a repair may
    /// use.
    #[inline]
    pub fn is_spare_free(&self, gpu: usize) -> bool {
        self.owner[gpu] == NO_JOB
            && self.health[gpu].usable()
            && self.spare[gpu]
            && !self.fenced[gpu]
    }

    /// Effective status of every GPU.
    pub fn health(&self) -> &[GpuStatus] {
        &self.health
    }

    /// Free usable GPUs of a domain.
    #[inline]
    pub fn free_count(&self, level: usize, domain: usize) -> u32 {
        self.free[level][domain]
    }

    pub fn free_counts(&self, level: usize) -> &[u32] {
        &self.free[level]
    }

    /// Free usable spare GPUs of a domain.
    #[inline]
    pub fn spare_free_count(&self, level: usize, domain: usize) -> u32 {
        self.spare_free[level][domain]
    }

    /// Free GPUs of a domain that some degraded component slows down.
    #[inline]
    pub fn free_degraded_count(&self, level: usize, domain: usize) -> u32 {
        self.free_degraded[level][domain]
    }

    pub fn total_free(&self) -> u32 {
        self.free[self.topo.num_levels() - 1][0]
    }

    /// Ok when `num_ranks` GPUs are free and healthy; otherwise the one "not enough GPUs"
    /// error every solver gives (Infeasible, with the counts).
    pub fn check_capacity(&self, num_ranks: usize) -> Result<()> {
        let free = self.total_free() as usize;
        if num_ranks > free {
            return Err(CoreError::Infeasible(format!(
                "needs {num_ranks} GPUs but only {free} of the cluster's {} GPUs are free and \
                 healthy",
                self.topo.num_gpus()
            )));
        }
        Ok(())
    }

    pub fn total_free_degraded(&self) -> u32 {
        self.free_degraded[self.topo.num_levels() - 1][0]
    }

    pub fn total_spare_free(&self) -> u32 {
        self.spare_free[self.topo.num_levels() - 1][0]
    }

    /// Name of the job holding a GPU.
    pub fn owner_of(&self, gpu: usize) -> Option<&str> {
        match self.owner[gpu] {
            NO_JOB => None,
            j => self.jobs[j as usize].as_ref().map(|a| a.name.as_str()),
        }
    }

    pub fn jobs(&self) -> impl Iterator<Item = &JobAllocation> {
        self.jobs.iter().flatten()
    }

    pub fn job(&self, name: &str) -> Option<&JobAllocation> {
        self.job_index
            .get(name)
            .and_then(|&j| self.jobs[j as usize].as_ref())
    }

    pub fn spares(&self) -> &[bool] {
        &self.spare
    }

    /// Components that are not ok, sorted.
    pub fn components(&self) -> Vec<(Component, ComponentHealth)> {
        let mut out: Vec<_> = self
            .components
            .iter()
            .map(|(c, h)| (*c, h.clone()))
            .collect();
        out.sort_by_key(|(c, _)| *c);
        out
    }

    pub fn num_nics(&self) -> usize {
        self.nic_gpus.rows()
    }

    /// Side factors (`num_gpus x levels`, GPU-major) for the cost model, or None while no
    /// component is degraded.
    pub fn path_factors(&self) -> Option<&[f32]> {
        if self.factors.is_empty() {
            None
        } else {
            Some(&self.factors)
        }
    }

    /// Some component slows this GPU's traffic down.
    #[inline]
    pub fn is_degraded(&self, gpu: usize) -> bool {
        self.degraded[gpu]
    }

    /// The degraded component that slows GPU `gpu`'s paths the most (the smallest factor
    /// among the GPU, its host, its NIC and the switches above its host), with its factor;
    /// None when nothing on its path is degraded.
    pub fn slowest_component(&self, gpu: usize) -> Option<(Component, f64)> {
        if !self.degraded[gpu] {
            return None;
        }
        let topo = &self.topo;
        let mut path = vec![
            Component::Gpu(gpu as u32),
            Component::Node(topo.node_of(gpu) as u32),
        ];
        if self.gpu_nic[gpu] != NO_NIC {
            path.push(Component::Nic(self.gpu_nic[gpu]));
        }
        path.extend(
            (topo.node_level() + 1..topo.num_levels()).map(|l| Component::Switch {
                level: l as u32,
                domain: topo.domain_of(gpu, l) as u32,
            }),
        );
        path.into_iter()
            .filter_map(|c| {
                self.components
                    .get(&c)
                    .filter(|h| h.condition == Condition::Degraded)
                    .map(|h| (c, h.factor))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    #[inline]
    fn flags(&self, g: usize) -> Flags {
        let free = self.is_free(g);
        Flags {
            free,
            spare_free: self.is_spare_free(g),
            free_degraded: free && self.degraded[g],
        }
    }

    /// Move GPU g's contribution to the counters from `before` to its current flags.
    fn settle(&mut self, g: usize, before: Flags) {
        let after = self.flags(g);
        if after == before {
            return;
        }
        let delta = |b: bool, a: bool| a as i64 - b as i64;
        let (df, ds, dd) = (
            delta(before.free, after.free),
            delta(before.spare_free, after.spare_free),
            delta(before.free_degraded, after.free_degraded),
        );
        for l in 0..self.topo.num_levels() {
            let d = self.topo.domain_of(g, l);
            self.free[l][d] = (self.free[l][d] as i64 + df) as u32;
            self.spare_free[l][d] = (self.spare_free[l][d] as i64 + ds) as u32;
            self.free_degraded[l][d] = (self.free_degraded[l][d] as i64 + dd) as u32;
        }
    }

    /// Give `gpus` (one per rank) to job `name`; all or nothing. Reserved spares are refused:
    /// only [`ClusterState::replace_allocation`] (a repair) may take them.
    pub fn allocate(&mut self, name: &str, gpus: &[u32]) -> Result<()> {
        self.allocate_job(name, gpus, None)
    }

    /// [`ClusterState::allocate`] with the job's communication, whose flows then load the
    /// fabric's uplinks until the job is released.
    pub fn allocate_job(
        &mut self,
        name: &str,
        gpus: &[u32],
        spec: Option<Arc<JobSpec>>,
    ) -> Result<()> {
        self.allocate_job_io(name, gpus, spec, Vec::new())
    }

    /// [`ClusterState::allocate_job`] with the job's storage traffic, which loads the
    /// uplinks on the paths to its stores.
    pub fn allocate_job_io(
        &mut self,
        name: &str,
        gpus: &[u32],
        spec: Option<Arc<JobSpec>>,
        io: Vec<crate::storage::IoDemand>,
    ) -> Result<()> {
        if let Some(spec) = &spec {
            if spec.num_ranks != gpus.len() {
                return Err(invalid(format!(
                    "job {name:?} has {} ranks but {} GPUs were given",
                    spec.num_ranks,
                    gpus.len()
                )));
            }
        }
        if name.is_empty() {
            return Err(invalid("a job needs a non-empty name"));
        }
        if self.job_index.contains_key(name) {
            return Err(invalid(format!("job {name:?} is already allocated")));
        }
        crate::topology::check_placement(&self.topo, gpus.len(), gpus)?;
        for &g in gpus {
            self.check_takeable(g as usize, None, false)?;
        }
        let slot = match self.jobs.iter().position(Option::is_none) {
            Some(free_slot) => free_slot,
            None => {
                Arc::make_mut(&mut self.jobs).push(None);
                self.jobs.len() - 1
            }
        };
        for &g in gpus {
            let before = self.flags(g as usize);
            self.owner[g as usize] = slot as u32;
            self.settle(g as usize, before);
        }
        let (load, flows) = self.flows_cached(spec.as_deref(), &io, gpus, None);
        self.add_load(&load, 1.0);
        Arc::make_mut(&mut self.jobs)[slot] = Some(JobAllocation {
            name: name.to_string(),
            gpus: gpus.to_vec(),
            spec,
            io,
            load,
            flows,
        });
        Arc::make_mut(&mut self.job_index).insert(name.to_string(), slot as u32);
        Ok(())
    }

    fn check_takeable(&self, g: usize, slot: Option<u32>, spares_ok: bool) -> Result<()> {
        if self.owner[g] != NO_JOB && Some(self.owner[g]) != slot {
            let other = self.owner_of(g).unwrap_or("?");
            return Err(invalid(format!(
                "GPU {g} is already allocated to job {other:?}"
            )));
        }
        if !self.health[g].usable() {
            return Err(invalid(format!(
                "GPU {g} is {:?} and cannot be allocated",
                self.health[g]
            )));
        }
        if self.spare[g] && !spares_ok && self.owner[g] == NO_JOB {
            return Err(invalid(format!(
                "GPU {g} is a reserved spare; only a repair may take it"
            )));
        }
        Ok(())
    }

    /// Replace the GPUs of a running job (a repair), all or nothing: every new GPU must be the
    /// job's already, or unallocated and healthy (reserved spares included; a spare taken
    /// stops being a spare). GPUs the job gives up are freed.
    pub fn replace_allocation(&mut self, name: &str, gpus: &[u32]) -> Result<()> {
        let Some(&slot) = self.job_index.get(name) else {
            return Err(invalid(format!("no job named {name:?} is allocated")));
        };
        let old = self.jobs[slot as usize]
            .as_ref()
            .map(|a| a.gpus.clone())
            .unwrap_or_default();
        crate::topology::check_placement(&self.topo, old.len(), gpus)?;
        for &g in gpus {
            self.check_takeable(g as usize, Some(slot), true)?;
        }
        // Only the GPUs given up and those taken change (a repair moves a few ranks of a job
        // that may hold thousands of GPUs).
        let mut kept = vec![false; self.topo.num_gpus()];
        for &g in gpus {
            kept[g as usize] = self.owner[g as usize] == slot;
        }
        for &g in &old {
            if !kept[g as usize] {
                let before = self.flags(g as usize);
                self.owner[g as usize] = NO_JOB;
                self.settle(g as usize, before);
            }
        }
        for &g in gpus {
            let g = g as usize;
            if kept[g] && !self.spare[g] {
                continue;
            }
            let before = self.flags(g);
            self.owner[g] = slot;
            self.spare[g] = false;
            self.settle(g, before);
        }
        let (old_load, spec, io, cached) =
            match Arc::make_mut(&mut self.jobs)[slot as usize].as_mut() {
                Some(alloc) => {
                    alloc.gpus = gpus.to_vec();
                    let old = std::mem::take(&mut alloc.load);
                    let cached = std::mem::take(&mut alloc.flows);
                    (old, alloc.spec.clone(), alloc.io.clone(), cached)
                }
                None => (Vec::new(), None, Vec::new(), FlowCache::default()),
            };
        self.add_load(&old_load, -1.0);
        let (load, flows) = self.flows_cached(spec.as_deref(), &io, gpus, cached.0.as_deref());
        self.add_load(&load, 1.0);
        if let Some(alloc) = Arc::make_mut(&mut self.jobs)[slot as usize].as_mut() {
            alloc.load = load;
            alloc.flows = flows;
        }
        Ok(())
    }

    /// Free a job's GPUs; returns them. GPUs that failed meanwhile stay out of service.
    pub fn release(&mut self, name: &str) -> Result<Vec<u32>> {
        let Some(slot) = Arc::make_mut(&mut self.job_index).remove(name) else {
            return Err(invalid(format!("no job named {name:?} is allocated")));
        };
        let alloc = Arc::make_mut(&mut self.jobs)[slot as usize]
            .take()
            .ok_or_else(|| invalid(format!("job {name:?} has no allocation")))?;
        for &g in &alloc.gpus {
            let before = self.flags(g as usize);
            self.owner[g as usize] = NO_JOB;
            self.settle(g as usize, before);
        }
        self.add_load(&alloc.load, -1.0);
        Ok(alloc.gpus)
    }

    /// The fabric load of a job on `gpus`: per slot, the heaviest of its collective classes
    /// and its storage traffic (each runs in its own phase of the step).
    pub fn flows_of(
        &self,
        spec: Option<&JobSpec>,
        io: &[crate::storage::IoDemand],
        gpus: &[u32],
    ) -> Load {
        let load = spec
            .map(|j| crate::fabric::job_load(&self.topo, j, gpus))
            .unwrap_or_default();
        self.with_io(load, io, gpus)
    }

    /// A job's collectives' `load` with its storage traffic: per slot, the heavier.
    fn with_io(&self, load: Load, io: &[crate::storage::IoDemand], gpus: &[u32]) -> Load {
        if io.is_empty() {
            return load;
        }
        let mut storage: Load = io
            .iter()
            .flat_map(|d| crate::storage::io_load(&self.topo, d, gpus))
            .collect();
        crate::fabric::merge(&mut storage);
        crate::fabric::peak(&load, &storage)
    }

    /// [`ClusterState::flows_of`], and for a large job its flows: summed again only where
    /// it moved from `before` (the flows of its previous placement) when given.
    fn flows_cached(
        &self,
        spec: Option<&JobSpec>,
        io: &[crate::storage::IoDemand],
        gpus: &[u32],
        before: Option<&crate::fabric::JobFlows>,
    ) -> (Load, FlowCache) {
        let Some(job) = spec.filter(|j| j.num_ranks >= FLOW_CACHE_RANKS) else {
            return (self.flows_of(spec, io, gpus), FlowCache::default());
        };
        let (load, flows) = match before {
            Some(before) => crate::fabric::job_load_moved(&self.topo, job, before, gpus),
            None => crate::fabric::job_load_recorded(&self.topo, job, gpus),
        };
        (
            self.with_io(load, io, gpus),
            FlowCache(Some(Arc::new(flows))),
        )
    }

    /// Add (`sign` 1) or remove (-1) a job's load. When the last loaded job leaves, the
    /// totals are reset to exact zeros so rounding never accumulates.
    fn add_load(&mut self, load: &Load, sign: f64) {
        if load.is_empty() {
            return;
        }
        for &(slot, v) in load {
            self.fabric_load[slot as usize] += sign * v;
        }
        if sign > 0.0 {
            self.loaded_jobs += 1;
        } else {
            self.loaded_jobs -= 1;
            if self.loaded_jobs == 0 {
                self.fabric_load.iter_mut().for_each(|v| *v = 0.0);
            }
        }
    }

    /// The running jobs' load per uplink direction slot (GB/s; see [`crate::fabric`]), or
    /// None while no running job loads the fabric.
    pub fn fabric_load(&self) -> Option<&[f64]> {
        (self.loaded_jobs > 0).then_some(self.fabric_load.as_slice())
    }

    /// The slot of the job that holds exactly `gpus`, if one does.
    pub fn own_slot(&self, gpus: &[u32]) -> Option<u32> {
        let first = *self.owner.get(*gpus.first()? as usize)?;
        let alloc = self.jobs.get(first as usize)?.as_ref()?;
        let same = alloc.gpus.len() == gpus.len()
            && gpus
                .iter()
                .all(|&g| self.owner.get(g as usize) == Some(&first));
        same.then_some(first)
    }

    /// Number of running jobs that load the fabric.
    pub fn loaded_jobs(&self) -> usize {
        self.loaded_jobs
    }

    /// The load of the job that holds exactly `gpus`, if one does.
    pub fn own_load(&self, gpus: &[u32]) -> Option<&[(u32, f64)]> {
        let slot = self.own_slot(gpus)?;
        self.jobs[slot as usize].as_ref().map(|a| a.load.as_slice())
    }

    /// (slot, name, load) of every running job.
    pub fn job_loads(&self) -> impl Iterator<Item = (u32, &str, &Load)> {
        self.jobs
            .iter()
            .enumerate()
            .filter_map(|(slot, a)| a.as_ref().map(|a| (slot as u32, a.name.as_str(), &a.load)))
    }

    /// (slot, name, load, spec, GPUs) of every running job whose spec is known.
    pub fn job_specs(&self) -> impl Iterator<Item = (u32, &str, &Load, &JobSpec, &[u32])> {
        self.jobs.iter().enumerate().filter_map(|(slot, a)| {
            let a = a.as_ref()?;
            let spec = a.spec.as_deref()?;
            Some((
                slot as u32,
                a.name.as_str(),
                &a.load,
                spec,
                a.gpus.as_slice(),
            ))
        })
    }

    /// A copy in which the free GPUs under the given (level, domain)s are fenced off: what a
    /// solver sees when it holds those domains back (e.g. behind hot uplinks). Fenced, not
    /// drained: the view's health stays the state's, so nothing is re-derived per GPU (the
    /// domains behind hot uplinks can hold thousands of GPUs, and greedy builds such a view
    /// for each load threshold it tries).
    pub fn holding_back(&self, domains: &[(usize, usize)]) -> Result<ClusterState> {
        let topo = &self.topo;
        let mut marked: Vec<Vec<bool>> = (0..topo.num_levels()).map(|_| Vec::new()).collect();
        for &(level, domain) in domains {
            if level >= topo.num_levels() || domain >= topo.domain_count(level) {
                return Err(invalid(format!(
                    "no domain {domain} at level {level} to hold back"
                )));
            }
            let row = &mut marked[level];
            if row.is_empty() {
                row.resize(topo.domain_count(level), false);
            }
            row[domain] = true;
        }
        let levels: Vec<usize> = (0..marked.len())
            .filter(|&l| !marked[l].is_empty())
            .collect();
        let held: Vec<u32> = (0..topo.num_gpus())
            .filter(|&g| self.is_free(g) && levels.iter().any(|&l| marked[l][topo.domain_of(g, l)]))
            .map(|g| g as u32)
            .collect();
        let mut view = self.clone();
        view.set_fence(&held, true)?;
        Ok(view)
    }

    /// Reserve (or un-reserve) GPUs as spares for repairs; all or nothing. A GPU held by a
    /// job cannot become a spare.
    pub fn set_spare(&mut self, gpus: &[u32], spare: bool) -> Result<()> {
        for &g in gpus {
            let g = g as usize;
            if g >= self.topo.num_gpus() {
                return Err(invalid(format!(
                    "GPU {g} does not exist (the cluster has {})",
                    self.topo.num_gpus()
                )));
            }
            if spare && self.owner[g] != NO_JOB {
                let other = self.owner_of(g).unwrap_or("?");
                return Err(invalid(format!(
                    "GPU {g} is allocated to job {other:?} and cannot be reserved as a spare"
                )));
            }
        }
        for &g in gpus {
            let g = g as usize;
            let before = self.flags(g);
            self.spare[g] = spare;
            self.settle(g, before);
        }
        Ok(())
    }

    /// Fence GPUs off (`true`) or lift the fence: fenced GPUs are neither free nor spare, so no
    /// solver and no repair takes them. The caller fences what one job may not use (outside
    /// its pool, excluded by a hardware rule) before solving for it. A job keeps the fenced
    /// GPUs it already holds. All or nothing: an unknown GPU changes nothing.
    pub fn set_fence(&mut self, gpus: &[u32], fenced: bool) -> Result<()> {
        if let Some(&g) = gpus.iter().find(|&&g| g as usize >= self.topo.num_gpus()) {
            return Err(invalid(format!(
                "GPU {g} does not exist (the cluster has {})",
                self.topo.num_gpus()
            )));
        }
        for &g in gpus {
            let g = g as usize;
            let before = self.flags(g);
            self.fenced[g] = fenced;
            self.settle(g, before);
        }
        Ok(())
    }

    /// The fence mask (see [`ClusterState::set_fence`]).
    pub fn fenced(&self) -> &[bool] {
        &self.fenced
    }

    /// Set the health of GPUs; returns the jobs holding any of them, with the ranks affected.
    /// All or nothing: an unknown GPU changes nothing.
    pub fn set_health(
        &mut self,
        gpus: &[u32],
        status: GpuStatus,
    ) -> Result<Vec<(String, Vec<u32>)>> {
        let health = match status {
            GpuStatus::Ok => None,
            GpuStatus::Failed => Some(ComponentHealth {
                condition: Condition::Failed,
                factor: 1.0,
                reason: String::new(),
            }),
            GpuStatus::Drained => Some(ComponentHealth {
                condition: Condition::Drained,
                factor: 1.0,
                reason: String::new(),
            }),
        };
        let targets: Vec<Component> = gpus.iter().map(|&g| Component::Gpu(g)).collect();
        self.set_condition(&targets, health)
    }

    fn check_component(&self, c: Component) -> Result<()> {
        let topo = &self.topo;
        match c {
            Component::Gpu(g) if g as usize >= topo.num_gpus() => Err(invalid(format!(
                "GPU {g} does not exist (the cluster has {})",
                topo.num_gpus()
            ))),
            Component::Node(n) if n as usize >= topo.domain_count(topo.node_level()) => {
                Err(invalid(format!("host {n} does not exist")))
            }
            Component::Nic(n) if n as usize >= self.num_nics() => Err(invalid(format!(
                "NIC {n} does not exist (the cluster has {} NICs)",
                self.num_nics()
            ))),
            Component::Switch { level, domain } => {
                let level = level as usize;
                if level <= topo.node_level() || level >= topo.num_levels() {
                    return Err(invalid(format!(
                        "switches are domains above the host level; level {level} is not one"
                    )));
                }
                if domain as usize >= topo.domain_count(level) {
                    return Err(invalid(format!(
                        "{} {domain} does not exist",
                        topo.levels()[level].name
                    )));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The GPUs whose paths cross a component.
    fn gpus_of(&self, c: Component) -> Vec<u32> {
        let topo = &self.topo;
        let under = |level: usize, domain: usize| -> Vec<u32> {
            let mut frontier = vec![domain as u32];
            for l in (1..=level).rev() {
                frontier = frontier
                    .iter()
                    .flat_map(|&d| topo.children(l, d as usize).iter().copied())
                    .collect();
            }
            frontier
                .iter()
                .flat_map(|&d| topo.lowest_members(d as usize).iter().copied())
                .collect()
        };
        match c {
            Component::Gpu(g) => vec![g],
            Component::Node(n) => under(topo.node_level(), n as usize),
            Component::Nic(n) => self.nic_gpus.row(n as usize).to_vec(),
            Component::Switch { level, domain } => under(level as usize, domain as usize),
        }
    }

    /// Set (or, with `None`, clear: recover) the health of components; all or nothing.
    /// Returns the jobs holding a GPU whose path crosses any of them, with those ranks.
    pub fn set_condition(
        &mut self,
        targets: &[Component],
        health: Option<ComponentHealth>,
    ) -> Result<Vec<(String, Vec<u32>)>> {
        for &c in targets {
            self.check_component(c)?;
        }
        if let Some(h) = &health {
            let ok = h.factor.is_finite() && h.factor > 0.0 && h.factor <= 1.0;
            if !ok {
                return Err(invalid(format!(
                    "a bandwidth factor must be in (0, 1], got {}",
                    h.factor
                )));
            }
        }
        for &c in targets {
            let was = match &health {
                Some(h) => self.components.insert(c, h.clone()),
                None => self.components.remove(&c),
            };
            if was.is_some_and(|w| w.condition == Condition::Degraded) {
                self.degraded_components -= 1;
            }
            if health
                .as_ref()
                .is_some_and(|h| h.condition == Condition::Degraded)
            {
                self.degraded_components += 1;
            }
        }
        let mut affected: Vec<u32> = targets.iter().flat_map(|&c| self.gpus_of(c)).collect();
        affected.sort_unstable();
        affected.dedup();
        let nl = self.topo.num_levels();
        if self.degraded_components == 0 {
            if !self.factors.is_empty() {
                // The last degradation is gone: every side factor is 1 again.
                self.factors = Vec::new();
                let was: Vec<usize> = (0..self.degraded.len())
                    .filter(|&g| self.degraded[g])
                    .collect();
                for g in was {
                    let before = self.flags(g);
                    self.degraded[g] = false;
                    self.settle(g, before);
                }
            }
        } else if self.factors.is_empty() {
            self.factors = vec![1.0; self.topo.num_gpus() * nl];
        }
        for &g in &affected {
            self.refresh_gpu(g as usize);
        }
        Ok(self.jobs_on(&affected))
    }

    /// Re-derive a GPU's effective status and side factors from the components.
    fn refresh_gpu(&mut self, g: usize) {
        let before = self.flags(g);
        let (status, side) = self.derive(g);
        self.health[g] = status;
        let nl = self.topo.num_levels();
        let mut degraded = false;
        if !self.factors.is_empty() {
            for (l, &f) in side.iter().enumerate() {
                self.factors[g * nl + l] = f as f32;
                degraded |= f < 1.0;
            }
        }
        self.degraded[g] = degraded;
        self.settle(g, before);
    }

    /// Effective status and side factor per level of GPU g.
    fn derive(&self, g: usize) -> (GpuStatus, Vec<f64>) {
        let topo = &self.topo;
        let nl = topo.num_levels();
        let node_level = topo.node_level();
        let mut status = GpuStatus::Ok;
        let mut worst = |h: Option<&ComponentHealth>| -> f64 {
            let Some(h) = h else { return 1.0 };
            match h.condition {
                Condition::Failed => status = GpuStatus::Failed,
                Condition::Drained if status == GpuStatus::Ok => status = GpuStatus::Drained,
                _ => {}
            }
            if h.condition == Condition::Degraded {
                h.factor
            } else {
                1.0
            }
        };
        let own = worst(self.components.get(&Component::Gpu(g as u32))).min(worst(
            self.components
                .get(&Component::Node(topo.node_of(g) as u32)),
        ));
        let nic = match self.gpu_nic[g] {
            NO_NIC => 1.0,
            n => worst(self.components.get(&Component::Nic(n))),
        };
        let mut side = vec![own; nl];
        let mut running = own;
        for (l, slot) in side.iter_mut().enumerate().skip(node_level + 1) {
            let switch = worst(self.components.get(&Component::Switch {
                level: l as u32,
                domain: topo.domain_of(g, l) as u32,
            }));
            running = running.min(switch);
            // Traffic leaves through the NIC only once it leaves the NVLink domain.
            if l == topo.nvlink_level() + 1 {
                running = running.min(nic);
            }
            *slot = running;
        }
        (status, side)
    }

    /// Jobs holding any of `gpus` (sorted), with the ranks on them.
    fn jobs_on(&self, gpus: &[u32]) -> Vec<(String, Vec<u32>)> {
        let mut slots: Vec<u32> = gpus
            .iter()
            .map(|&g| self.owner[g as usize])
            .filter(|&o| o != NO_JOB)
            .collect();
        slots.sort_unstable();
        slots.dedup();
        let mut out: Vec<(String, Vec<u32>)> = slots
            .into_iter()
            .filter_map(|slot| self.jobs[slot as usize].as_ref())
            .map(|alloc| {
                let ranks = alloc
                    .gpus
                    .iter()
                    .enumerate()
                    .filter(|(_, g)| gpus.binary_search(g).is_ok())
                    .map(|(r, _)| r as u32)
                    .collect();
                (alloc.name.clone(), ranks)
            })
            .collect();
        out.sort();
        out
    }

    /// Recount the free counters from scratch (for tests and consistency checks).
    pub fn recount(&self) -> Vec<Vec<u32>> {
        self.recount_by(|g| self.is_free(g))
    }

    fn recount_by(&self, keep: impl Fn(usize) -> bool) -> Vec<Vec<u32>> {
        let mut counts: Vec<Vec<u32>> = (0..self.topo.num_levels())
            .map(|l| vec![0; self.topo.domain_count(l)])
            .collect();
        for g in 0..self.topo.num_gpus() {
            if keep(g) {
                for (l, c) in counts.iter_mut().enumerate() {
                    c[self.topo.domain_of(g, l)] += 1;
                }
            }
        }
        counts
    }

    /// Check every incremental structure against a recomputation from scratch: the counters,
    /// the derived health and factors, and that no GPU belongs to two jobs. Returns what
    /// differs first.
    pub fn check(&self) -> Result<()> {
        if self.recount() != self.free {
            return Err(invalid("free counters differ from a recount"));
        }
        if self.recount_by(|g| self.is_spare_free(g)) != self.spare_free {
            return Err(invalid("spare counters differ from a recount"));
        }
        if self.recount_by(|g| self.is_free(g) && self.degraded[g]) != self.free_degraded {
            return Err(invalid("degraded counters differ from a recount"));
        }
        let nl = self.topo.num_levels();
        for g in 0..self.topo.num_gpus() {
            let (status, side) = self.derive(g);
            if status != self.health[g] {
                return Err(invalid(format!("GPU {g}: derived health differs")));
            }
            let degraded = side.iter().any(|&f| f < 1.0);
            if degraded != self.degraded[g] {
                return Err(invalid(format!("GPU {g}: degraded flag differs")));
            }
            if !self.factors.is_empty()
                && (0..nl).any(|l| self.factors[g * nl + l] != side[l] as f32)
            {
                return Err(invalid(format!("GPU {g}: side factors differ")));
            }
        }
        let mut seen = vec![NO_JOB; self.topo.num_gpus()];
        for (slot, alloc) in self.jobs.iter().enumerate() {
            let Some(alloc) = alloc else { continue };
            for &g in &alloc.gpus {
                if seen[g as usize] != NO_JOB {
                    return Err(invalid(format!("GPU {g} belongs to two jobs")));
                }
                seen[g as usize] = slot as u32;
            }
        }
        if seen != self.owner {
            return Err(invalid("GPU owners differ from the job allocations"));
        }
        self.check_fabric_load()
    }

    /// Recount the fabric load from every running job's flows.
    fn check_fabric_load(&self) -> Result<()> {
        let mut recount = vec![0.0; self.fabric_load.len()];
        let mut loaded = 0;
        for alloc in self.jobs.iter().flatten() {
            let load = self.flows_of(alloc.spec.as_deref(), &alloc.io, &alloc.gpus);
            if load != alloc.load {
                return Err(invalid(format!(
                    "job {:?}: its fabric load differs from its flows",
                    alloc.name
                )));
            }
            loaded += usize::from(!load.is_empty());
            for (slot, v) in load {
                recount[slot as usize] += v;
            }
        }
        if loaded != self.loaded_jobs {
            return Err(invalid("the count of jobs loading the fabric differs"));
        }
        for (slot, (&kept, &fresh)) in self.fabric_load.iter().zip(&recount).enumerate() {
            if (kept - fresh).abs() > 1e-6 * fresh.abs().max(1.0) {
                return Err(invalid(format!(
                    "uplink slot {slot}: kept load {kept} GB/s differs from the recount {fresh}"
                )));
            }
        }
        Ok(())
    }

    /// Bytes of memory held by the state's arrays (approximate).
    pub fn memory_bytes(&self) -> usize {
        let counters: usize = self.free.iter().map(|v| v.len() * 4 * 3).sum();
        let jobs: usize = self
            .jobs()
            .map(|a| a.gpus.len() * 4 + a.name.len() + 48)
            .sum();
        self.health.len() * 4
            + self.owner.len() * 4
            + self.gpu_nic.len() * 4
            + self.factors.len() * 4
            + counters
            + jobs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::tests::tree;

    #[test]
    fn allocate_release_restores_counters() {
        let topo = Arc::new(tree(4, 8, 2));
        let mut s = ClusterState::new(topo);
        s.allocate("a", &[0, 1, 8]).unwrap();
        assert_eq!(s.free_count(0, 0), 6);
        assert_eq!(s.free_count(1, 0), 13);
        assert!(s.allocate("b", &[1, 2]).is_err());
        assert_eq!(s.free_count(0, 0), 6, "a failed allocation changes nothing");
        s.release("a").unwrap();
        assert_eq!(s.recount(), s.free);
        assert_eq!(s.total_free(), 32);
    }

    #[test]
    fn the_most_severe_condition_over_a_gpu_decides_its_status() {
        let topo = Arc::new(tree(2, 4, 1));
        let mut s = ClusterState::new(topo);
        let set = |s: &mut ClusterState, c: Component, condition: Condition| {
            let health = ComponentHealth {
                condition,
                factor: if condition == Condition::Degraded {
                    0.5
                } else {
                    1.0
                },
                reason: String::new(),
            };
            s.set_condition(&[c], Some(health)).unwrap();
        };
        let mut conditions = [Condition::Failed, Condition::Degraded, Condition::Drained];
        conditions.sort_by_key(|c| c.severity());
        assert_eq!(
            conditions,
            [Condition::Degraded, Condition::Drained, Condition::Failed]
        );
        // A drained host under a failed GPU: the GPU is failed; its neighbours drained.
        set(&mut s, Component::Node(0), Condition::Drained);
        set(&mut s, Component::Gpu(1), Condition::Failed);
        assert_eq!(s.health()[1], GpuStatus::Failed);
        assert_eq!(s.health()[0], GpuStatus::Drained);
        // A degraded GPU on a drained host stays drained (degraded takes nothing out).
        set(&mut s, Component::Gpu(2), Condition::Degraded);
        assert_eq!(s.health()[2], GpuStatus::Drained);
        s.check().unwrap();
    }

    #[test]
    fn failed_gpu_reports_job_and_stays_out() {
        let topo = Arc::new(tree(2, 4, 1));
        let mut s = ClusterState::new(topo);
        s.allocate("a", &[4, 5]).unwrap();
        let hit = s.set_health(&[5, 0], GpuStatus::Failed).unwrap();
        assert_eq!(hit, vec![("a".to_string(), vec![1])]);
        s.release("a").unwrap();
        assert!(!s.is_free(5));
        assert_eq!(s.total_free(), 6);
        assert_eq!(s.recount(), s.free);
    }

    #[test]
    fn switch_failure_and_degradation_are_derived_per_gpu() {
        let topo = Arc::new(tree(4, 8, 2));
        // One NIC per GPU.
        let mut s = ClusterState::with_nics(topo, (0..32).collect()).unwrap();
        s.allocate("a", &[0, 1, 16]).unwrap();
        let hit = s
            .set_condition(
                &[Component::Switch {
                    level: 1,
                    domain: 1,
                }],
                Some(ComponentHealth {
                    condition: Condition::Failed,
                    factor: 1.0,
                    reason: String::new(),
                }),
            )
            .unwrap();
        assert_eq!(hit, vec![("a".to_string(), vec![2])]);
        assert_eq!(s.total_free(), 14);
        s.check().unwrap();
        let slow = ComponentHealth {
            condition: Condition::Degraded,
            factor: 0.5,
            reason: "loss".into(),
        };
        s.set_condition(&[Component::Nic(3)], Some(slow)).unwrap();
        let f = s.path_factors().unwrap();
        // GPU 3's NIC only matters once traffic leaves the host.
        assert_eq!(f[3 * 3], 1.0);
        assert_eq!(f[3 * 3 + 1], 0.5);
        assert_eq!(s.total_free_degraded(), 1);
        s.check().unwrap();
        s.set_condition(&[Component::Nic(3)], None).unwrap();
        assert!(s.path_factors().is_none());
        s.set_condition(
            &[Component::Switch {
                level: 1,
                domain: 1,
            }],
            None,
        )
        .unwrap();
        s.check().unwrap();
        assert_eq!(s.total_free(), 29);
        assert!(s.set_condition(&[Component::Node(9)], None).is_err());
    }

    #[test]
    fn spares_are_held_back_until_a_repair_takes_them() {
        let topo = Arc::new(tree(2, 4, 1));
        let mut s = ClusterState::new(topo);
        s.set_spare(&[4, 5, 6, 7], true).unwrap();
        assert_eq!(s.total_free(), 4);
        assert!(s.allocate("a", &[0, 4]).is_err());
        s.allocate("a", &[0, 1]).unwrap();
        s.replace_allocation("a", &[0, 4]).unwrap();
        assert!(!s.spares()[4]);
        assert_eq!(s.total_spare_free(), 3);
        s.check().unwrap();
    }

    #[test]
    fn fenced_gpus_are_neither_free_nor_spare_and_jobs_keep_theirs() {
        let mut s = ClusterState::new(Arc::new(tree(2, 4, 1)));
        s.set_spare(&[6, 7], true).unwrap();
        s.allocate("a", &[0, 1]).unwrap();
        let free_before = s.total_free();
        s.set_fence(&[1, 2, 3, 7], true).unwrap();
        assert_eq!(s.total_free(), free_before - 2);
        assert_eq!(s.total_spare_free(), 1);
        assert!(!s.is_free(2) && !s.is_spare_free(7));
        assert_eq!(s.job("a").unwrap().gpus, vec![0, 1]);
        s.check().unwrap();
        assert!(s.set_fence(&[4, 1_000_000], true).is_err());
        assert!(!s.fenced()[4], "a refused fence changes nothing");
        s.set_fence(&[1, 2, 3, 7], false).unwrap();
        assert_eq!(s.total_free(), free_before);
        assert_eq!(s.total_spare_free(), 2);
        s.check().unwrap();
    }
}
