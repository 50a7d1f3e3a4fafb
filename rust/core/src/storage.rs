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
//! bandwidth), and that rate times the fair share it gets on the uplinks it crosses
//! ([`crate::fabric`]) among the running jobs' load and the job's own storage flows from its
//! other hosts (so an oversubscribed uplink limits a job's reads on an idle fabric too). The
//! slowest host sets the time ([`IoTime`]: reads and writes apart). In the step
//! ([`step_with_io`]) input reads are prefetched under the step (a stall only when longer
//! than it) and checkpoint writes are a stall amortized over the checkpoint interval.
//!
//! A running job's storage traffic also loads the uplinks ([`io_load`], kept by the state like
//! its collectives' load): each host's transfer at its rate alone, as if input loading and
//! checkpointing were a class of their own (the job's load is its heaviest class's).
//!
//! Left out: several jobs reading one store do not share its bandwidth.

use crate::error::{CoreError, Result};
use crate::fabric::{Background, Load, DOWN, UP};
use crate::state::ClusterState;
use crate::step::StepReport;
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

/// Seconds per step a job spends on its storage traffic: reading its input and writing its
/// checkpoints (each the slowest host's time). They enter the step differently
/// ([`step_with_io`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct IoTime {
    /// Input reads per step (s).
    pub read: f64,
    /// Checkpoint writes per step (s): a checkpoint's write time over its interval in steps.
    pub write: f64,
}

impl IoTime {
    pub fn total(&self) -> f64 {
        self.read + self.write
    }
}

impl std::ops::AddAssign for IoTime {
    fn add_assign(&mut self, other: IoTime) {
        self.read += other.read;
        self.write += other.write;
    }
}

/// Seconds per step of reading `read_bytes` and writing `write_bytes` (whole job, per step)
/// from a job on `gpus`, with the running jobs of `state` on the fabric: reads and writes
/// added ([`io_time`] keeps them apart).
pub fn io_seconds(
    state: &ClusterState,
    store: &Store,
    read_bytes: f64,
    write_bytes: f64,
    gpus: &[u32],
) -> Result<f64> {
    Ok(io_time(state, store, read_bytes, write_bytes, gpus)?.total())
}

/// [`io_seconds`], reads and writes apart.
///
/// Each host's transfer gets, on every uplink its path crosses, its fair share of the
/// uplink's capacity among the running jobs' load *and the job's own storage flows from its
/// other hosts* on that uplink: eight hosts of a leaf reading from a store behind the spine
/// share the leaf's uplink, on an idle fabric too (an oversubscribed leaf then reads at its
/// uplink's capacity, not at eight NICs' rate).
pub fn io_time(
    state: &ClusterState,
    store: &Store,
    read_bytes: f64,
    write_bytes: f64,
    gpus: &[u32],
) -> Result<IoTime> {
    let topo = state.topology().as_ref();
    crate::topology::check_placement(topo, gpus.len(), gpus)?;
    let mut out = IoTime::default();
    if gpus.is_empty() {
        return Ok(out);
    }
    let hosts = hosts_of(topo, gpus);
    let background = Background::of(state, gpus);
    let total = gpus.len() as f64;
    for (bytes, store_gbps, reading) in [
        (read_bytes, store.read_gbps, true),
        (write_bytes, store.write_gbps, false),
    ] {
        if bytes.is_nan() || bytes <= 0.0 {
            continue;
        }
        let rates: Vec<f64> = match store.attach {
            Attach::Local => vec![store_gbps; hosts.len()],
            Attach::Domain { level, domain } => {
                // Every host's flow at its rate alone, then the job's flows summed per
                // uplink direction: what each host's flow shares its uplinks with.
                let mut slots: Vec<Load> = Vec::with_capacity(hosts.len());
                let mut own: Load = Vec::new();
                let alone: Vec<f64> = hosts
                    .iter()
                    .map(|&(_, count, gpu)| {
                        let path = path_rate(topo, gpu as usize, count, level, domain);
                        let rate = (store_gbps / hosts.len() as f64).min(path);
                        let mut mine = Vec::new();
                        path_slots(
                            topo,
                            (gpu as usize, level, domain, reading),
                            rate,
                            &mut mine,
                        );
                        crate::fabric::merge(&mut mine);
                        own.extend_from_slice(&mine);
                        slots.push(mine);
                        rate
                    })
                    .collect();
                crate::fabric::merge(&mut own);
                alone
                    .iter()
                    .zip(&slots)
                    .map(|(&rate, mine)| {
                        // This host's slots, each at the job's whole storage demand there.
                        let at_job: Load =
                            mine.iter().map(|&(s, _)| (s, lookup(&own, s))).collect();
                        rate * share_with(topo, background, &at_job)
                    })
                    .collect()
            }
        };
        let slowest = hosts
            .iter()
            .zip(&rates)
            .map(|(&(_, count, _), &rate)| bytes * count as f64 / total / (rate * 1e9))
            .fold(0.0, f64::max);
        if reading {
            out.read = slowest;
        } else {
            out.write = slowest;
        }
    }
    Ok(out)
}

fn lookup(load: &[(u32, f64)], slot: u32) -> f64 {
    load.binary_search_by_key(&slot, |&(s, _)| s)
        .map(|i| load[i].1)
        .unwrap_or(0.0)
}

/// The smallest fair share on the uplinks of `demand` (merged: per slot, the job's storage
/// demand there), among the running jobs' load when any, against the capacity alone when
/// none loads the fabric.
fn share_with(topo: &Topology, background: Option<Background<'_>>, demand: &[(u32, f64)]) -> f64 {
    if let Some(background) = background {
        return background.path_share(topo, demand);
    }
    let capacity = topo.uplink_gbps();
    demand
        .iter()
        .map(|&(s, v)| {
            let cap = capacity[s as usize / 2];
            // A link loaded exactly to capacity (up to rounding) slows nobody.
            if v > cap * (1.0 + 1e-9) {
                cap / v
            } else {
                1.0
            }
        })
        .fold(1.0, f64::min)
}

/// Put a job's storage time into its step (`step` as the cost model priced it: compute,
/// bubble and exposed communication), as a training loop spends it:
///
/// * **Input reads are prefetched under the step.** A data loader reads the next batches
///   while the current step computes (PyTorch's `DataLoader` with `num_workers > 0` keeps
///   `prefetch_factor` batches per worker loading ahead of the training loop; NVIDIA DALI and
///   Megatron's data loaders likewise), so reading costs the step nothing until it takes
///   longer than the step itself, and then the GPUs wait for data: `step = max(step, read)`.
///   This is the "fetch stall" of Mohan et al., "Analyzing and Mitigating Data Stalls in DNN
///   Training" (VLDB 2021), who measure it on jobs whose dataset does not fit the page cache.
/// * **Checkpoint writes are a stall.** A synchronous checkpoint (Megatron's and
///   `torch.save`'s default) stops training while the model and optimizer state is written
///   (Mohan et al., "CheckFreq", FAST 2021, call it the checkpoint stall); it is amortized over
///   the checkpoint interval: `write` is a checkpoint's write time over its interval in steps,
///   added to every step. The stall of one checkpoint is `write × interval steps` (the
///   caller knows the interval). Asynchronous checkpointing, which hides most of it, is not
///   modelled.
///
/// MFU and tokens per second fall by the same factor as the step grows. Applying it again
/// replaces the storage part (the step's own part is kept).
pub fn step_with_io(step: &mut StepReport, io: IoTime) {
    let old = step.step_seconds;
    let base = old - step.input_stall_seconds - step.checkpoint_seconds;
    let stall = (io.read - base).max(0.0);
    let new = base + stall + io.write.max(0.0);
    step.input_seconds = io.read;
    step.input_stall_seconds = stall;
    step.checkpoint_seconds = io.write.max(0.0);
    if new > 0.0 && old > 0.0 {
        let ratio = old / new;
        step.mfu *= ratio;
        step.tokens_per_second *= ratio;
    }
    step.step_seconds = new;
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

/// Push the uplink direction slots a host's transfer crosses, at `rate` GB/s; `at` as in
/// [`io_time`].
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

    #[test]
    fn an_oversubscribed_uplink_limits_a_jobs_own_reads_on_an_idle_fabric() {
        let flat = tree(4, 8, 2);
        let caps: Vec<f64> = flat.uplink_gbps().iter().map(|c| c / 4.0).collect();
        let over = Arc::new(flat.clone().with_uplink_gbps(caps).unwrap());
        let flat = Arc::new(flat);
        let store_on = |topo: &Topology| {
            Store::new(
                topo,
                Attach::Domain {
                    level: 1,
                    domain: 1,
                },
                1000.0,
                1000.0,
            )
            .unwrap()
        };
        // Two hosts of leaf 0 read from the storage node of leaf 1: each at 8 x 25 GB/s
        // alone, 400 GB/s together through leaf 0's uplink (down) and leaf 1's (up).
        let job: Vec<u32> = (0..16).collect();
        let bytes = 16e9;
        let idle_flat = ClusterState::new(flat.clone());
        let t_flat = io_time(&idle_flat, &store_on(&flat), bytes, 0.0, &job).unwrap();
        assert!((t_flat.read - 8e9 / 200e9).abs() < 1e-12, "{t_flat:?}");
        let idle_over = ClusterState::new(over.clone());
        let t_over = io_time(&idle_over, &store_on(&over), bytes, 0.0, &job).unwrap();
        // On the idle 4:1 fabric the job's own flows meet the uplinks' capacity.
        let cap = over.uplink_gbps();
        let share = [
            cap[over.uplink_id(1, 0).unwrap()] / 400.0,
            cap[over.uplink_id(1, 1).unwrap()] / 400.0,
            cap[over.uplink_id(0, 0).unwrap()] / 200.0,
        ]
        .into_iter()
        .fold(1.0, f64::min);
        assert!(share < 1.0, "the 4:1 fabric is oversubscribed: {share}");
        assert!(
            (t_over.read - 8e9 / (200e9 * share)).abs() < 1e-12,
            "{t_over:?} vs share {share}"
        );
        assert!(t_over.read > t_flat.read * 1.5);
        assert_eq!(t_over.write, 0.0);
        // One host alone on leaf 0 shares the uplink with nobody: faster than two.
        let one: Vec<u32> = (0..8).collect();
        let t_one = io_time(&idle_over, &store_on(&over), bytes / 2.0, 0.0, &one).unwrap();
        assert!(t_one.read < t_over.read, "{t_one:?} vs {t_over:?}");
    }

    fn step_of(read: f64, write: f64) -> StepReport {
        let mut step = StepReport {
            compute_seconds: 0.8,
            bubble_seconds: 0.0,
            exposed_comm_seconds: 0.2,
            exposed_class_seconds: vec![0.2],
            step_seconds: 1.0,
            mfu: 0.48,
            tokens_per_second: 1000.0,
            peak_tflops: 100.0,
            input_seconds: 0.0,
            input_stall_seconds: 0.0,
            checkpoint_seconds: 0.0,
        };
        step_with_io(&mut step, IoTime { read, write });
        step
    }

    #[test]
    fn reads_hide_under_the_step_until_they_exceed_it_and_checkpoints_stall() {
        // Reads shorter than the step are prefetched under it: nothing changes.
        let hidden = step_of(0.9, 0.0);
        assert_eq!(hidden.step_seconds, 1.0);
        assert_eq!(hidden.input_stall_seconds, 0.0);
        assert_eq!(hidden.mfu, 0.48);
        // 4 s of reads per step on a 1 s step: the step waits for the data, MFU falls 4x.
        let slow = step_of(4.0, 0.0);
        assert!((slow.step_seconds - 4.0).abs() < 1e-12);
        assert!((slow.input_stall_seconds - 3.0).abs() < 1e-12);
        assert!((slow.mfu - 0.12).abs() < 1e-12);
        assert!((slow.tokens_per_second - 250.0).abs() < 1e-9);
        // Checkpoint writes stall the step whatever the reads.
        let both = step_of(0.5, 0.25);
        assert!((both.step_seconds - 1.25).abs() < 1e-12);
        assert!((both.mfu - 0.48 / 1.25).abs() < 1e-12);
        // Applied again (a report re-priced), the storage part is replaced, not added.
        let mut again = both.clone();
        step_with_io(
            &mut again,
            IoTime {
                read: 4.0,
                write: 0.0,
            },
        );
        assert_eq!(again, slow);
    }

    #[test]
    fn near_the_data_beats_far_only_when_reads_dominate_the_step() {
        use crate::request::{price, Request};
        use crate::step::StepSpec;
        let topo = Arc::new(tree(4, 8, 2).with_peak_tflops(vec![100.0]).unwrap());
        let state = ClusterState::new(topo.clone());
        // 8 GPUs x 100 TFLOPS x 0.6: 480 TFLOP of model FLOPs take 1 s.
        let job = tp_dp_job(&topo, 8, 1)
            .with_step(StepSpec::new(480e12, 1e6))
            .unwrap();
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
        let near: Vec<u32> = (16..24).collect();
        let far: Vec<u32> = (0..8).collect();
        let step = |gpus: &[u32], read: f64| {
            let request = Request {
                io: vec![IoDemand {
                    store,
                    read_bytes: read,
                    write_bytes: 0.0,
                }],
                power: None,
            };
            price(&state, &job, gpus, &request)
                .unwrap()
                .cost
                .step
                .unwrap()
        };
        let base = step(&near, 0.0);
        assert!((base.compute_seconds - 1.0).abs() < 1e-12);
        // 100 GB a step: 0.25 s near (8 x 50 GB/s to the leaf), 0.5 s far (8 x 25 GB/s
        // across the spine), both hidden under the 1 s step: placement does not matter.
        let (n, f) = (step(&near, 100e9), step(&far, 100e9));
        assert_eq!(n.step_seconds, base.step_seconds);
        assert_eq!(f.step_seconds, base.step_seconds);
        assert!((f.input_seconds - 0.5).abs() < 1e-12);
        // 800 GB a step: 2 s near, 4 s far; the step waits for the data, near wins 2x.
        let (n, f) = (step(&near, 800e9), step(&far, 800e9));
        assert!((n.step_seconds - 2.0).abs() < 1e-9, "{n:?}");
        assert!((f.step_seconds - 4.0).abs() < 1e-9, "{f:?}");
        assert!(base.step_seconds < 2.0);
        assert!((n.mfu - base.mfu * base.step_seconds / 2.0).abs() < 1e-12);
        assert!((f.mfu - base.mfu * base.step_seconds / 4.0).abs() < 1e-12);
    }
}
