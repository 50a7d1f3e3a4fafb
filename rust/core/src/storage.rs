//! Storage and data locality: the time a job spends per step reading its input and writing
//! its checkpoints, priced over the path from each of its hosts to the store.
//!
//! A store is attached to every host (node-local NVMe read through GPUDirect Storage: no
//! network, each host reads its own at the store's bandwidth) or to one domain: a leaf's
//! storage node, or the top level's domain for a remote store above the spine. A job reads
//! `read_bytes` per step and writes `write_bytes` per step (a checkpoint's bytes over its
//! interval), split over its hosts by their GPUs. Each host's transfer runs at the smallest of:
//! its share of the store's bandwidth (the store serves the job's hosts equally), its GPUs'
//! bandwidth at the level where its path to the store meets (`GPUs x` that level's effective
//! bandwidth), and that rate times the fair share it gets among the running jobs' load on the
//! uplinks it crosses ([`crate::fabric`]). The step waits for the slowest host; reads and
//! writes add up, and are not overlapped with communication (as collectives are not).
//!
//! A running job's storage traffic also loads the uplinks ([`io_load`], kept by the state like
//! its collectives' load): each host's transfer at its rate alone, as if input loading and
//! checkpointing were a class of their own (the job's load is its heaviest class's).
//!
//! Left out: several jobs reading one store do not share its bandwidth.

use crate::error::{CoreError, Result};
use crate::fabric::{Background, Load, DOWN, UP};
use crate::state::ClusterState;
use crate::topology::Topology;

/// Where a store is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    /// One on every host (node-local NVMe, GPUDirect Storage).
    Local,
    /// On a domain of a level (a leaf's storage node; the top level's one domain: remote).
    Domain { level: usize, domain: usize },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Store {
    pub attach: Attach,
    /// GB/s the store reads and writes (per host for a local store).
    pub read_gbps: f64,
    pub write_gbps: f64,
}

fn invalid(msg: String) -> CoreError {
    CoreError::InvalidTopology(msg)
}

impl Store {
    pub fn new(topo: &Topology, attach: Attach, read_gbps: f64, write_gbps: f64) -> Result<Store> {
        for (what, v) in [("read_gbps", read_gbps), ("write_gbps", write_gbps)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(invalid(format!(
                    "store {what}: expected a positive number, got {v}"
                )));
            }
        }
        if let Attach::Domain { level, domain } = attach {
            if level >= topo.num_levels() || domain >= topo.domain_count(level) {
                return Err(invalid(format!(
                    "store attached to domain {domain} of level {level}, which does not exist"
                )));
            }
        }
        Ok(Store {
            attach,
            read_gbps,
            write_gbps,
        })
    }
}

/// A job's storage traffic on one store: bytes per step, whole job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IoDemand {
    pub store: Store,
    pub read_bytes: f64,
    pub write_bytes: f64,
}

/// GPUs per host of a placement, with one GPU of each host: (host, GPUs, a GPU).
fn hosts_of(topo: &Topology, gpus: &[u32]) -> Vec<(usize, usize, u32)> {
    let mut hosts: Vec<(usize, usize, u32)> = Vec::new();
    let mut sorted: Vec<u32> = gpus.to_vec();
    sorted.sort_unstable_by_key(|&g| (topo.node_of(g as usize), g));
    for &g in &sorted {
        let node = topo.node_of(g as usize);
        match hosts.last_mut() {
            Some(last) if last.0 == node => last.1 += 1,
            _ => hosts.push((node, 1, g)),
        }
    }
    hosts
}

/// The load (GB/s per uplink direction) a job's storage traffic puts on the fabric: each
/// host's reads and writes at their rate alone, on the uplinks of its path to the store.
pub fn io_load(topo: &Topology, demand: &IoDemand, gpus: &[u32]) -> Load {
    let Attach::Domain { level, domain } = demand.store.attach else {
        return Vec::new();
    };
    let hosts = hosts_of(topo, gpus);
    let mut load = Vec::new();
    for (bytes, store_gbps, reading) in [
        (demand.read_bytes, demand.store.read_gbps, true),
        (demand.write_bytes, demand.store.write_gbps, false),
    ] {
        if bytes.is_nan() || bytes <= 0.0 {
            continue;
        }
        for &(_, count, gpu) in &hosts {
            let path = path_rate(topo, gpu as usize, count, level, domain);
            let rate = (store_gbps / hosts.len() as f64).min(path);
            path_slots(
                topo,
                (gpu as usize, level, domain, reading),
                rate,
                &mut load,
            );
        }
    }
    crate::fabric::merge(&mut load);
    load
}

/// The store's ancestor domain at `level` (>= the store's level).
fn ancestor(topo: &Topology, mut level: usize, mut domain: usize, target: usize) -> usize {
    while level < target {
        domain = topo.parent(level, domain).unwrap_or(0);
        level += 1;
    }
    domain
}

/// Seconds per step of reading `read_bytes` and writing `write_bytes` (whole job, per step)
/// from a job on `gpus`, with the running jobs of `state` on the fabric.
pub fn io_seconds(
    state: &ClusterState,
    store: &Store,
    read_bytes: f64,
    write_bytes: f64,
    gpus: &[u32],
) -> Result<f64> {
    let topo = state.topology().as_ref();
    crate::topology::check_placement(topo, gpus.len(), gpus)?;
    if gpus.is_empty() {
        return Ok(0.0);
    }
    let hosts = hosts_of(topo, gpus);
    let background = Background::of(state, gpus);
    let total = gpus.len() as f64;
    let mut seconds = 0.0;
    for (bytes, store_gbps, reading) in [
        (read_bytes, store.read_gbps, true),
        (write_bytes, store.write_gbps, false),
    ] {
        if bytes.is_nan() || bytes <= 0.0 {
            continue;
        }
        let mut slowest: f64 = 0.0;
        for &(_, count, gpu) in &hosts {
            let host_bytes = bytes * count as f64 / total;
            let rate = match store.attach {
                Attach::Local => store_gbps,
                Attach::Domain { level, domain } => {
                    let path = path_rate(topo, gpu as usize, count, level, domain);
                    let alone = (store_gbps / hosts.len() as f64).min(path);
                    let at = (gpu as usize, level, domain, reading);
                    alone * share_on_path(topo, background, at, alone)
                }
            };
            slowest = slowest.max(host_bytes / (rate * 1e9));
        }
        seconds += slowest;
    }
    Ok(seconds)
}

/// The level where a host's path to a store attached at (`level`, `domain`) meets.
fn meeting_level(topo: &Topology, gpu: usize, level: usize, domain: usize) -> usize {
    (level..topo.num_levels())
        .find(|&l| topo.domain_of(gpu, l) == ancestor(topo, level, domain, l))
        .unwrap_or(topo.num_levels() - 1)
}

/// A host's GPUs' bandwidth (GB/s) to the store, on healthy, idle hardware.
fn path_rate(topo: &Topology, gpu: usize, count: usize, level: usize, domain: usize) -> f64 {
    let meet = meeting_level(topo, gpu, level, domain).max(topo.nvlink_level() + 1);
    let meet = meet.min(topo.num_levels() - 1);
    count as f64 * topo.effective_bandwidth(meet)
}

/// The fair share a host's storage flow of `rate` GB/s gets on the uplinks it crosses.
/// `at`: (a GPU of the host, the store's level and domain, reading).
fn share_on_path(
    topo: &Topology,
    background: Option<Background<'_>>,
    at: (usize, usize, usize, bool),
    rate: f64,
) -> f64 {
    let Some(background) = background else {
        return 1.0;
    };
    let mut own: Load = Vec::new();
    path_slots(topo, at, rate, &mut own);
    crate::fabric::merge(&mut own);
    background.path_share(topo, &own)
}

/// Push the uplink direction slots a host's transfer crosses, at `rate` GB/s; `at` as in
/// [`share_on_path`].
fn path_slots(topo: &Topology, at: (usize, usize, usize, bool), rate: f64, out: &mut Load) {
    let (gpu, level, domain, reading) = at;
    let meet = meeting_level(topo, gpu, level, domain);
    // Reading: down into the host's domains, up out of the store's; writing: the reverse.
    let (host_dir, store_dir) = if reading { (DOWN, UP) } else { (UP, DOWN) };
    for l in topo.nvlink_level()..meet {
        if let Some(u) = topo.uplink_id(l, topo.domain_of(gpu, l)) {
            out.push(((2 * u + host_dir) as u32, rate));
        }
        if l >= level {
            if let Some(u) = topo.uplink_id(l, ancestor(topo, level, domain, l)) {
                out.push(((2 * u + store_dir) as u32, rate));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::testing::tp_dp_job;
    use crate::topology::tests::tree;
    use std::sync::Arc;

    #[test]
    fn near_data_is_faster_and_local_nvme_needs_no_network() {
        let topo = Arc::new(tree(4, 8, 2));
        let state = ClusterState::new(topo.clone());
        // A storage node on leaf 1, 1000 GB/s.
        let store = Store::new(
            &topo,
            Attach::Domain {
                level: 1,
                domain: 1,
            },
            1000.0,
            50.0,
        )
        .unwrap();
        let near: Vec<u32> = (16..24).collect();
        let far: Vec<u32> = (0..8).collect();
        let t_near = io_seconds(&state, &store, 8e9, 0.0, &near).unwrap();
        let t_far = io_seconds(&state, &store, 8e9, 0.0, &far).unwrap();
        // Near: 8 GPUs x 50 GB/s up to the leaf; far: 8 x 25 GB/s across the spine.
        assert!((t_near - 8e9 / 400e9).abs() < 1e-12, "{t_near}");
        assert!((t_far - 8e9 / 200e9).abs() < 1e-12, "{t_far}");
        let two_hosts: Vec<u32> = (0..4).chain(16..20).collect();
        let t_split = io_seconds(&state, &store, 8e9, 0.0, &two_hosts).unwrap();
        // Each host reads 4e9; the far one at 4 GPUs x 25 GB/s.
        assert!((t_split - 4e9 / 100e9).abs() < 1e-12, "{t_split}");
        let local = Store::new(&topo, Attach::Local, 20.0, 10.0).unwrap();
        let t_local = io_seconds(&state, &local, 8e9, 4e9, &two_hosts).unwrap();
        assert!((t_local - (4e9 / 20e9 + 2e9 / 10e9)).abs() < 1e-12);
    }

    #[test]
    fn a_running_job_storage_traffic_loads_the_uplinks_until_released() {
        let topo = Arc::new(tree(4, 8, 2));
        let mut state = ClusterState::new(topo.clone());
        let store = Store::new(
            &topo,
            Attach::Domain {
                level: 1,
                domain: 1,
            },
            100.0,
            50.0,
        )
        .unwrap();
        let io = vec![IoDemand {
            store,
            read_bytes: 8e9,
            write_bytes: 0.0,
        }];
        let far: Vec<u32> = (0..8).collect();
        state
            .allocate_job_io("reader", &far, None, io.clone())
            .unwrap();
        state.check().unwrap();
        // 100 GB/s from the storage node on leaf 1 down into host 0 through leaf 0.
        let load = state.fabric_load().unwrap();
        let leaf0 = topo.uplink_id(1, 0).unwrap();
        let leaf1 = topo.uplink_id(1, 1).unwrap();
        assert_eq!(load[2 * leaf0 + DOWN], 100.0);
        assert_eq!(load[2 * leaf1 + UP], 100.0);
        assert_eq!(load.iter().sum::<f64>(), 300.0); // and into host 0's NICs
        state
            .replace_allocation("reader", &(16..24).collect::<Vec<u32>>())
            .unwrap();
        state.check().unwrap();
        assert_eq!(state.fabric_load().unwrap()[2 * leaf0 + DOWN], 0.0);
        state.release("reader").unwrap();
        assert!(state.fabric_load().is_none());
    }

    #[test]
    fn storage_flows_get_their_fair_share_among_running_jobs() {
        let topo = tree(4, 8, 2);
        let caps: Vec<f64> = topo.uplink_gbps().iter().map(|c| c / 8.0).collect();
        let topo = Arc::new(topo.with_uplink_gbps(caps).unwrap());
        let mut state = ClusterState::new(topo.clone());
        let store = Store::new(
            &topo,
            Attach::Domain {
                level: 1,
                domain: 1,
            },
            1000.0,
            1000.0,
        )
        .unwrap();
        let far: Vec<u32> = (0..8).collect();
        let idle = io_seconds(&state, &store, 8e9, 0.0, &far).unwrap();
        // A running job straddling the leaves loads leaf 0's uplink.
        let job = Arc::new(tp_dp_job(&topo, 8, 2));
        let running: Vec<u32> = (8..16).chain(24..32).collect();
        state.allocate_job("r", &running, Some(job)).unwrap();
        let busy = io_seconds(&state, &store, 8e9, 0.0, &far).unwrap();
        assert!(busy > idle * 1.01, "{busy} vs {idle}");
    }
}
