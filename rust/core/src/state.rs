//! Which GPUs are free, allocated or out of service, with per-domain free counters kept
//! incrementally, so solvers ask "how many usable GPUs does this leaf have" without scanning
//! GPUs. Every change is all-or-nothing: an operation that fails changes nothing.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{CoreError, Result};
use crate::topology::Topology;

/// Health of one GPU.
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

const NO_JOB: u32 = u32::MAX;

#[derive(Debug, Clone, PartialEq)]
pub struct JobAllocation {
    pub name: String,
    /// GPU of each rank.
    pub gpus: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct ClusterState {
    topo: Arc<Topology>,
    health: Vec<GpuStatus>,
    owner: Vec<u32>,
    /// `free[l][d]`: GPUs of level-l domain d that are unallocated and usable.
    free: Vec<Vec<u32>>,
    jobs: Vec<Option<JobAllocation>>,
    job_index: HashMap<String, u32>,
}

impl ClusterState {
    pub fn new(topo: Arc<Topology>) -> ClusterState {
        let free = (0..topo.num_levels())
            .map(|l| topo.domain_sizes(l).to_vec())
            .collect();
        let n = topo.num_gpus();
        ClusterState {
            topo,
            health: vec![GpuStatus::Ok; n],
            owner: vec![NO_JOB; n],
            free,
            jobs: Vec::new(),
            job_index: HashMap::new(),
        }
    }

    pub fn topology(&self) -> &Arc<Topology> {
        &self.topo
    }

    /// Unallocated and healthy.
    #[inline]
    pub fn is_free(&self, gpu: usize) -> bool {
        self.owner[gpu] == NO_JOB && self.health[gpu].usable()
    }

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

    pub fn total_free(&self) -> u32 {
        self.free[self.topo.num_levels() - 1][0]
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

    fn adjust(&mut self, gpu: usize, delta: i32) {
        for l in 0..self.topo.num_levels() {
            let d = self.topo.domain_of(gpu, l);
            self.free[l][d] = (self.free[l][d] as i64 + delta as i64) as u32;
        }
    }

    /// Give `gpus` (one per rank) to job `name`; all or nothing.
    pub fn allocate(&mut self, name: &str, gpus: &[u32]) -> Result<()> {
        if name.is_empty() {
            return Err(CoreError::InvalidState(
                "a job needs a non-empty name".into(),
            ));
        }
        if self.job_index.contains_key(name) {
            return Err(CoreError::InvalidState(format!(
                "job {name:?} is already allocated"
            )));
        }
        crate::cost::check_placement(&self.topo, gpus.len(), gpus)?;
        for &g in gpus {
            let g = g as usize;
            if let Some(other) = self.owner_of(g) {
                return Err(CoreError::InvalidState(format!(
                    "GPU {g} is already allocated to job {other:?}"
                )));
            }
            if !self.health[g].usable() {
                return Err(CoreError::InvalidState(format!(
                    "GPU {g} is {:?} and cannot be allocated",
                    self.health[g]
                )));
            }
        }
        let slot = match self.jobs.iter().position(Option::is_none) {
            Some(free_slot) => free_slot,
            None => {
                self.jobs.push(None);
                self.jobs.len() - 1
            }
        };
        for &g in gpus {
            self.owner[g as usize] = slot as u32;
            self.adjust(g as usize, -1);
        }
        self.jobs[slot] = Some(JobAllocation {
            name: name.to_string(),
            gpus: gpus.to_vec(),
        });
        self.job_index.insert(name.to_string(), slot as u32);
        Ok(())
    }

    /// Free a job's GPUs; returns them. GPUs that failed meanwhile stay out of service.
    pub fn release(&mut self, name: &str) -> Result<Vec<u32>> {
        let Some(slot) = self.job_index.remove(name) else {
            return Err(CoreError::InvalidState(format!(
                "no job named {name:?} is allocated"
            )));
        };
        let alloc = self.jobs[slot as usize].take().expect("indexed job exists");
        for &g in &alloc.gpus {
            self.owner[g as usize] = NO_JOB;
            if self.health[g as usize].usable() {
                self.adjust(g as usize, 1);
            }
        }
        Ok(alloc.gpus)
    }

    /// Set the health of GPUs; returns the jobs holding any of them, with the ranks affected.
    /// All or nothing: an unknown GPU changes nothing.
    pub fn set_health(
        &mut self,
        gpus: &[u32],
        status: GpuStatus,
    ) -> Result<Vec<(String, Vec<u32>)>> {
        if let Some(&g) = gpus.iter().find(|&&g| g as usize >= self.topo.num_gpus()) {
            return Err(CoreError::InvalidState(format!(
                "GPU {g} does not exist (the cluster has {})",
                self.topo.num_gpus()
            )));
        }
        let mut affected: HashMap<u32, Vec<u32>> = HashMap::new();
        for &g in gpus {
            let g = g as usize;
            let was_free = self.is_free(g);
            self.health[g] = status;
            let now_free = self.is_free(g);
            match (was_free, now_free) {
                (true, false) => self.adjust(g, -1),
                (false, true) => self.adjust(g, 1),
                _ => {}
            }
            if self.owner[g] != NO_JOB && !status.usable() {
                affected.entry(self.owner[g]).or_default().push(g as u32);
            }
        }
        let mut out: Vec<(String, Vec<u32>)> = affected
            .into_iter()
            .map(|(slot, hit)| {
                let alloc = self.jobs[slot as usize].as_ref().expect("owner has a job");
                let mut ranks: Vec<u32> = alloc
                    .gpus
                    .iter()
                    .enumerate()
                    .filter(|(_, g)| hit.contains(g))
                    .map(|(r, _)| r as u32)
                    .collect();
                ranks.sort_unstable();
                (alloc.name.clone(), ranks)
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Recount the free counters from scratch (for tests and consistency checks).
    pub fn recount(&self) -> Vec<Vec<u32>> {
        let mut free: Vec<Vec<u32>> = (0..self.topo.num_levels())
            .map(|l| vec![0; self.topo.domain_count(l)])
            .collect();
        for g in 0..self.topo.num_gpus() {
            if self.is_free(g) {
                for (l, counts) in free.iter_mut().enumerate() {
                    counts[self.topo.domain_of(g, l)] += 1;
                }
            }
        }
        free
    }

    /// Bytes of memory held by the state's arrays (approximate).
    pub fn memory_bytes(&self) -> usize {
        let counters: usize = self.free.iter().map(|v| v.len() * 4).sum();
        let jobs: usize = self
            .jobs()
            .map(|a| a.gpus.len() * 4 + a.name.len() + 48)
            .sum();
        self.health.len() + self.owner.len() * 4 + counters + jobs
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
}
