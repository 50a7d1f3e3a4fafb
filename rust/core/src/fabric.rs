//! Fabric capacity, per-uplink load and contention between jobs.
//!
//! ## Uplinks
//!
//! Every domain from the NVLink domain up to below the top level has one *uplink*: the links
//! that connect it to its parent (a host's NICs, a leaf's links to the spine). Traffic inside
//! the NVLink domain never reaches the fabric. A flow from GPU `a` to GPU `b` whose lowest
//! common level is `l` leaves through the uplinks of `a`'s domains at the levels below `l`
//! (direction *up*) and enters through those of `b`'s domains (direction *down*); links are
//! full duplex, so each direction has the uplink's capacity.
//!
//! By default an uplink is non-blocking: its capacity (GB/s, each direction) is its domain's
//! GPUs times the bandwidth of the level above (the smallest bandwidth up to that level), so
//! every GPU under it can send at full speed at once. A topology may lower that with an
//! oversubscription ratio per level (2:1 leaf uplinks carry half) or give one switch's uplink
//! capacity explicitly ([`Topology::with_uplink_gbps`]).
//!
//! ## Flows and load
//!
//! [`collective_flows`] is the one place a collective's flows are enumerated: a ring kind
//! (all-reduce, all-gather, reduce-scatter) sends from every member to the next in NCCL's ring
//! order ([`crate::nccl::ring_order`], as the cost model prices it) at the collective's
//! bandwidth; an all-to-all sends from every member to every other at `1/(n-1)` of it (each
//! GPU's total is the collective's bandwidth); a point-to-point sends one flow. The rate of a
//! collective is its healthy bottleneck bandwidth: for a ring the one the cost model gives it
//! ([`crate::nccl::ring_bandwidths`], a hop out of the NVLink domain at the NIC shares of the
//! group's GPUs on its smaller side), so the load does not change when hardware degrades. A job's load on an uplink is that of its heaviest class:
//! its classes run one after another, so it never loads a link with two classes at once.
//! The state ([`crate::state`]) keeps the sum over running jobs, per uplink direction,
//! updated on allocate, release and repair and recounted by `check()`.
//!
//! ## Contention
//!
//! When the demand on an uplink direction exceeds its capacity, every flow gets the same
//! fraction `capacity / demand` of its rate (proportional sharing; it equals max-min fairness
//! when the competing flows ask for the same rate, as flows of one bottleneck level do). The
//! demand is the neighbours' load plus the collective's own flows or, on an oversubscribed
//! fabric (some uplink below non-blocking), its class's flows: the concurrent collectives of
//! one class (all dp rings, say) share the uplinks too. A collective runs at its bandwidth
//! times the smallest share on any of its flows' paths. So a job on a non-blocking fabric is
//! never slowed, two identical jobs slow each other equally, and a new job that crosses a hot
//! uplink pays for it.
//!
//! Left out, on purpose: the neighbours' load is their peak, assuming their communication
//! phases coincide with the job's. Shifting phases so that jobs
//! interleave on a link (CASSINI, NSDI'24) would lower that; it is not modelled. Explicit
//! traffic matrices are priced without contention and add no load.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::error::Result;
use crate::job::{CollectiveKind, JobSpec};
use crate::state::ClusterState;
use crate::topology::{Level, Topology};

/// Direction slot of an uplink: `2 * uplink + UP` leaves the domain, `2 * uplink + DOWN`
/// enters it.
pub const UP: usize = 0;
pub const DOWN: usize = 1;

/// Relative slack under which demand counts as within capacity (summed loads round).
const TOLERANCE: f64 = 1e-9;

/// Sparse load: (direction slot, GB/s), sorted by slot, one entry per slot.
pub type Load = Vec<(u32, f64)>;

/// Uplink ids (a base per level) and their non-blocking capacities.
pub(crate) fn non_blocking_uplinks(
    levels: &[Level],
    nvlink_level: usize,
    domain_size: &[Vec<u32>],
    effective_bw: &[f64],
) -> (Vec<usize>, Vec<f64>) {
    let nl = levels.len();
    let mut base = vec![0; nl];
    let mut capacity = Vec::new();
    for l in nvlink_level..nl.saturating_sub(1) {
        base[l] = capacity.len();
        capacity.extend(
            domain_size[l]
                .iter()
                .map(|&size| size as f64 * effective_bw[l + 1]),
        );
    }
    (base, capacity)
}

/// Every flow of one call of a collective over `members` (ordered by [`ordered_members`]: a
/// ring in NCCL's ring order; for a point-to-point, sender first): `flow(from, to, fraction
/// of the collective's bandwidth)`.
pub fn collective_flows(
    kind: CollectiveKind,
    members: &[u32],
    mut flow: impl FnMut(usize, usize, f64),
) {
    let n = members.len();
    if n < 2 {
        return;
    }
    match kind {
        CollectiveKind::PointToPoint => flow(members[0] as usize, members[1] as usize, 1.0),
        CollectiveKind::AllToAll => {
            let fraction = 1.0 / (n - 1) as f64;
            for &a in members {
                for &b in members {
                    if a != b {
                        flow(a as usize, b as usize, fraction);
                    }
                }
            }
        }
        _ => {
            for i in 0..n {
                flow(members[i] as usize, members[(i + 1) % n] as usize, 1.0);
            }
        }
    }
}

/// The uplink direction slots a flow from GPU `a` to GPU `b` crosses.
#[inline]
pub fn flow_slots(topo: &Topology, a: usize, b: usize, mut slot: impl FnMut(usize)) {
    if a == b {
        return;
    }
    let top = topo.lca(a, b);
    for level in topo.nvlink_level()..top {
        if let (Some(ua), Some(ub)) = (
            topo.uplink_id(level, topo.domain_of(a, level)),
            topo.uplink_id(level, topo.domain_of(b, level)),
        ) {
            slot(2 * ua + UP);
            slot(2 * ub + DOWN);
        }
    }
}

/// Healthy bottleneck bandwidth (GB/s) of a collective over `members` (ordered by
/// [`ordered_members`]): for a ring, the bandwidth the cost model gives it
/// ([`crate::nccl::ring_bandwidths`]: a hop out of the NVLink domain drives the NIC shares of
/// the group's GPUs on its smaller side), so its flows load the uplinks at the rate it runs.
fn healthy_rate(topo: &Topology, kind: CollectiveKind, members: &[u32]) -> f64 {
    if !matches!(
        kind,
        CollectiveKind::PointToPoint | CollectiveKind::AllToAll
    ) {
        let runs = crate::nccl::host_runs(topo, members);
        let (intra, inter) =
            crate::nccl::ring_bandwidths(topo, members, &runs, |a, b, _| topo.pair_bandwidth(a, b));
        return intra.min(inter);
    }
    let mut slowest = f64::INFINITY;
    collective_flows(kind, members, |a, b, _| {
        slowest = slowest.min(topo.pair_bandwidth(a, b));
    });
    slowest
}

/// Push the load (GB/s per direction slot) of one collective over `members` onto `out`
/// (unmerged).
pub fn collective_load(topo: &Topology, kind: CollectiveKind, members: &[u32], out: &mut Load) {
    if members.len() < 2 || topo.uplink_count() == 0 {
        return;
    }
    let rate = healthy_rate(topo, kind, members);
    collective_flows(kind, members, |a, b, fraction| {
        flow_slots(topo, a, b, |s| out.push((s as u32, rate * fraction)));
    });
}

/// Sort by slot and sum the entries of each slot.
pub fn merge(load: &mut Load) {
    load.sort_unstable_by_key(|&(s, _)| s);
    let mut out = 0;
    for i in 0..load.len() {
        if out > 0 && load[out - 1].0 == load[i].0 {
            load[out - 1].1 += load[i].1;
        } else {
            load[out] = load[i];
            out += 1;
        }
    }
    load.truncate(out);
}

/// Members of a collective in the order the cost model runs it: a ring kind in NCCL's ring
/// order ([`crate::nccl::ring_order`], the same order [`crate::cost`] prices), an all-to-all
/// sorted, a point-to-point sender first.
pub(crate) fn ordered_members(
    topo: &Topology,
    job: &JobSpec,
    group: u32,
    kind: CollectiveKind,
    gpus: &[u32],
    out: &mut Vec<u32>,
) {
    out.clear();
    out.extend(
        job.groups
            .row(group as usize)
            .iter()
            .map(|&r| gpus[r as usize]),
    );
    match kind {
        CollectiveKind::PointToPoint => {}
        CollectiveKind::AllToAll => out.sort_unstable(),
        _ => crate::nccl::ring_order(topo, out),
    }
}

/// The load of each class of a placed job (merged, GB/s per direction slot): the flows of
/// its collectives that run (bytes and count above zero).
pub fn class_loads(topo: &Topology, job: &JobSpec, gpus: &[u32]) -> Vec<Load> {
    let mut per_class: Vec<Load> = vec![Vec::new(); job.num_classes];
    if topo.uplink_count() == 0 {
        return per_class;
    }
    let mut members = Vec::new();
    for c in &job.collectives {
        if c.count <= 0.0 || c.bytes <= 0.0 {
            continue;
        }
        ordered_members(topo, job, c.group, c.kind, gpus, &mut members);
        collective_load(topo, c.kind, &members, &mut per_class[c.class as usize]);
    }
    for class in &mut per_class {
        merge(class);
    }
    per_class
}

/// The load of a placed job: per direction slot, its heaviest class's demand (GB/s).
pub fn job_load(topo: &Topology, job: &JobSpec, gpus: &[u32]) -> Load {
    let mut peak: HashMap<u32, f64> = HashMap::new();
    for class in class_loads(topo, job, gpus) {
        for (s, v) in class {
            let slot = peak.entry(s).or_insert(0.0);
            *slot = slot.max(v);
        }
    }
    let mut out: Load = peak.into_iter().collect();
    out.sort_unstable_by_key(|&(s, _)| s);
    out
}

/// Per slot, the larger of two merged loads.
pub fn peak(a: &[(u32, f64)], b: &[(u32, f64)]) -> Load {
    let mut out: Load = a.iter().chain(b).copied().collect();
    out.sort_unstable_by_key(|&(s, _)| s);
    let mut merged: Load = Vec::with_capacity(out.len());
    for (s, v) in out {
        match merged.last_mut() {
            Some(last) if last.0 == s => last.1 = last.1.max(v),
            _ => merged.push((s, v)),
        }
    }
    merged
}

fn lookup(load: &[(u32, f64)], slot: u32) -> f64 {
    load.binary_search_by_key(&slot, |&(s, _)| s)
        .map(|i| load[i].1)
        .unwrap_or(0.0)
}

/// The neighbours' load a collective competes with: the state's total, minus the job's own
/// load when the job is already running, plus a load being tried (a new job, when pricing what
/// it does to a running one).
#[derive(Clone, Copy)]
pub(crate) struct Background<'a> {
    total: &'a [f64],
    minus: &'a [(u32, f64)],
    plus: &'a [(u32, f64)],
}

thread_local! {
    static SCRATCH: RefCell<Load> = const { RefCell::new(Vec::new()) };
}

impl<'a> Background<'a> {
    /// The background of a job placed on `gpus` in `state` (its own load excluded when it
    /// runs there), or None when no job loads the fabric.
    pub(crate) fn of(state: &'a ClusterState, gpus: &[u32]) -> Option<Background<'a>> {
        let total = state.fabric_load()?;
        Some(Background {
            total,
            minus: state.own_load(gpus).unwrap_or(&[]),
            plus: &[],
        })
    }

    /// The priced job is the only one loading the fabric (its own load is the one taken out)
    /// and the fabric is not oversubscribed: no neighbour is left, and a job alone contends
    /// with itself only on an oversubscribed fabric, so the cost model prices it without a
    /// background, the same and much cheaper (no flows laid out per collective).
    pub(crate) fn alone(&self, state: &ClusterState) -> bool {
        state.loaded_jobs() == 1
            && !self.minus.is_empty()
            && self.plus.is_empty()
            && !state.topology().is_oversubscribed()
    }

    /// The background of running job `name` tried on other GPUs (a repair's trial): its own
    /// load, where it runs now, is not counted against it (None when no job loads the fabric).
    pub(crate) fn moving(state: &'a ClusterState, name: &str) -> Option<Background<'a>> {
        let total = state.fabric_load()?;
        Some(Background {
            total,
            minus: state.job(name).map_or(&[], |a| a.load.as_slice()),
            plus: &[],
        })
    }

    fn neighbours(&self, slot: u32) -> f64 {
        (self.total[slot as usize] - lookup(self.minus, slot) + lookup(self.plus, slot)).max(0.0)
    }

    /// The smallest fair share flows with load `own` (merged) get among the neighbours.
    pub(crate) fn path_share(&self, topo: &Topology, own: &[(u32, f64)]) -> f64 {
        let capacity = topo.uplink_gbps();
        own.iter()
            .map(|&(s, v)| {
                let demand = self.neighbours(s) + v;
                let cap = capacity[s as usize / 2];
                // A link loaded exactly to capacity (up to rounding) slows nobody.
                if demand > cap * (1.0 + TOLERANCE) {
                    cap / demand
                } else {
                    1.0
                }
            })
            .fold(1.0, f64::min)
    }
}

/// The smallest fair share (in (0, 1]) a collective over `members` (ordered as the cost model
/// runs it) gets on the uplinks its flows cross: there, its demand is the neighbours' load plus
/// its class's flows (`class`, which include its own; its own alone when not given).
pub(crate) fn collective_share(
    topo: &Topology,
    neighbours: Option<Background<'_>>,
    class: Option<&[(u32, f64)]>,
    kind: CollectiveKind,
    members: &[u32],
) -> f64 {
    if neighbours.is_none() && class.is_none() {
        return 1.0;
    }
    SCRATCH.with(|cell| {
        let mut own = cell.borrow_mut();
        own.clear();
        collective_load(topo, kind, members, &mut own);
        merge(&mut own);
        let capacity = topo.uplink_gbps();
        own.iter()
            .map(|&(s, v)| {
                let mine = class.map_or(v, |c| lookup(c, s).max(v));
                let demand = neighbours.map_or(0.0, |b| b.neighbours(s)) + mine;
                let cap = capacity[s as usize / 2];
                // A link loaded exactly to capacity (up to rounding) slows nobody.
                if demand > cap * (1.0 + TOLERANCE) {
                    cap / demand
                } else {
                    1.0
                }
            })
            .fold(1.0, f64::min)
    })
}

/// One uplink direction a job's traffic crosses while it is over capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct HotUplink {
    pub uplink: usize,
    /// [`UP`] or [`DOWN`].
    pub direction: usize,
    /// Capacity, each direction (GB/s).
    pub capacity_gbps: f64,
    /// The job's own demand (its heaviest class) on it (GB/s).
    pub own_gbps: f64,
    /// Every other job's demand (GB/s).
    pub others_gbps: f64,
    /// The other jobs loading it, heaviest first, with their demand (GB/s).
    pub jobs: Vec<(String, f64)>,
}

/// A job priced with its neighbours.
#[derive(Debug, Clone, PartialEq)]
pub struct ContentionReport {
    /// Communication time per step on the same hardware with nobody else on the fabric (s).
    pub alone_seconds: f64,
    /// Communication time per step with the running jobs' load (s).
    pub contended_seconds: f64,
    /// The uplinks over capacity on the job's paths, most oversubscribed first.
    pub uplinks: Vec<HotUplink>,
}

impl ContentionReport {
    /// `contended / alone` (1 when the job does not communicate).
    pub fn slowdown(&self) -> f64 {
        if self.alone_seconds > 0.0 {
            self.contended_seconds / self.alone_seconds
        } else {
            1.0
        }
    }
}

/// Price `job` on `gpus` with and without the running jobs' load and name the uplinks where
/// they meet over capacity.
pub fn contention(state: &ClusterState, job: &JobSpec, gpus: &[u32]) -> Result<ContentionReport> {
    let topo = state.topology();
    let alone = crate::cost::evaluate_with(topo, state.path_factors(), job, gpus)?.comm_seconds;
    // Without neighbours (none loads the fabric, or the job is alone on a fabric that is not
    // oversubscribed: Background::alone) the contended price is the price alone,
    // and no uplink is hot because of others.
    let background = Background::of(state, gpus).filter(|bg| !bg.alone(state));
    let contended = match background {
        Some(_) => crate::cost::evaluate_in(state, job, gpus)?.comm_seconds,
        None => alone,
    };
    let mut uplinks = Vec::new();
    if let Some(bg) = background {
        let own_slot = state.own_slot(gpus);
        for (s, own) in job_load(topo, job, gpus) {
            let others = bg.neighbours(s);
            let capacity = topo.uplink_gbps()[s as usize / 2];
            if own + others <= capacity * (1.0 + TOLERANCE) {
                continue;
            }
            let mut jobs: Vec<(String, f64)> = state
                .job_loads()
                .filter(|(slot, _, _)| Some(*slot) != own_slot)
                .filter_map(|(_, name, load)| {
                    let v = lookup(load, s);
                    (v > 0.0).then(|| (name.to_string(), v))
                })
                .collect();
            jobs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            uplinks.push(HotUplink {
                uplink: s as usize / 2,
                direction: s as usize % 2,
                capacity_gbps: capacity,
                own_gbps: own,
                others_gbps: others,
                jobs,
            });
        }
    }
    uplinks.sort_by(|a, b| {
        let ra = (a.own_gbps + a.others_gbps) / a.capacity_gbps;
        let rb = (b.own_gbps + b.others_gbps) / b.capacity_gbps;
        rb.total_cmp(&ra).then(a.uplink.cmp(&b.uplink))
    });
    Ok(ContentionReport {
        alone_seconds: alone,
        contended_seconds: contended,
        uplinks,
    })
}

/// Seconds per step that placing `job` on `gpus` adds to the running jobs (the sum over the
/// jobs whose uplinks it shares of their contended time with it minus without it).
pub fn added_to_neighbours(state: &ClusterState, job: &JobSpec, gpus: &[u32]) -> Result<f64> {
    let Some(total) = state.fabric_load() else {
        return Ok(0.0);
    };
    let topo = state.topology();
    let new_load = job_load(topo, job, gpus);
    if new_load.is_empty() {
        return Ok(0.0);
    }
    let mut added = 0.0;
    for (_, _, load, spec, their_gpus) in state.job_specs() {
        let shares = load.iter().any(|&(s, _)| lookup(&new_load, s) > 0.0);
        if !shares {
            continue;
        }
        let before = Background {
            total,
            minus: load,
            plus: &[],
        };
        let after = Background {
            plus: &new_load,
            ..before
        };
        let t0 = crate::cost::evaluate_background(state, spec, their_gpus, Some(before))?;
        let t1 = crate::cost::evaluate_background(state, spec, their_gpus, Some(after))?;
        added += (t1 - t0).max(0.0);
    }
    Ok(added)
}

/// What a solver minimises: the job's contended communication time per step plus, when
/// `neighbours` is set, what it adds to the running jobs.
pub fn placement_cost(
    state: &ClusterState,
    job: &JobSpec,
    gpus: &[u32],
    neighbours: bool,
) -> Result<f64> {
    let own = crate::cost::evaluate_in(state, job, gpus)?.comm_seconds;
    if !neighbours {
        return Ok(own);
    }
    Ok(own + added_to_neighbours(state, job, gpus)?)
}

/// Uplink direction slots by load over capacity, highest first: (slot, load GB/s, capacity).
pub fn hottest_uplinks(state: &ClusterState, count: usize) -> Vec<(usize, f64, f64)> {
    let Some(total) = state.fabric_load() else {
        return Vec::new();
    };
    let capacity = state.topology().uplink_gbps();
    let mut out: Vec<(usize, f64, f64)> = total
        .iter()
        .enumerate()
        .filter(|(_, &v)| v > 0.0)
        .map(|(s, &v)| (s, v, capacity[s / 2]))
        .collect();
    out.sort_by(|a, b| (b.1 / b.2).total_cmp(&(a.1 / a.2)).then(a.0.cmp(&b.0)));
    out.truncate(count);
    out
}

/// The load of one level's uplinks (a host's NICs, a leaf's links to the spine, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct LevelLoad {
    /// The level whose domains own these uplinks.
    pub level: usize,
    /// Uplink directions of the level (two per uplink).
    pub directions: usize,
    /// Directions carrying some load, and those loaded beyond their capacity.
    pub loaded: usize,
    pub over_capacity: usize,
    /// The `count` hottest directions: (slot, load GB/s, capacity GB/s), by load over
    /// capacity, highest first.
    pub hottest: Vec<(usize, f64, f64)>,
}

/// Per uplink level, bottom-up, its load: so that a level whose every uplink is saturated
/// (host NICs at 100 % under a fabric job) does not hide the hot spots of the levels above,
/// which decide contention between jobs. Empty while no running job loads the fabric.
pub fn uplinks_by_level(state: &ClusterState, count: usize) -> Vec<LevelLoad> {
    let Some(total) = state.fabric_load() else {
        return Vec::new();
    };
    let topo = state.topology();
    let capacity = topo.uplink_gbps();
    let mut levels: Vec<LevelLoad> = Vec::new();
    for (u, &cap) in capacity.iter().enumerate() {
        let (level, _) = topo.uplink_owner(u);
        if levels.last().is_none_or(|l| l.level != level) {
            levels.push(LevelLoad {
                level,
                directions: 0,
                loaded: 0,
                over_capacity: 0,
                hottest: Vec::new(),
            });
        }
        let entry = levels.last_mut().expect("pushed above");
        for slot in [2 * u + UP, 2 * u + DOWN] {
            entry.directions += 1;
            let load = total[slot];
            if load > 0.0 {
                entry.loaded += 1;
                if load > cap * (1.0 + 1e-9) {
                    entry.over_capacity += 1;
                }
                entry.hottest.push((slot, load, cap));
            }
        }
    }
    for entry in &mut levels {
        entry
            .hottest
            .sort_by(|a, b| (b.1 / b.2).total_cmp(&(a.1 / a.2)).then(a.0.cmp(&b.0)));
        entry.hottest.truncate(count);
    }
    levels
}

/// Running jobs (with a known spec) by slowdown from contention, most hurt first:
/// (name, alone seconds, contended seconds).
pub fn jobs_hurt(state: &ClusterState) -> Result<Vec<(String, f64, f64)>> {
    let mut out = Vec::new();
    for (_, name, _, spec, gpus) in state.job_specs() {
        let report = contention(state, spec, gpus)?;
        out.push((
            name.to_string(),
            report.alone_seconds,
            report.contended_seconds,
        ));
    }
    let ratio = |a: f64, c: f64| if a > 0.0 { c / a } else { 1.0 };
    out.sort_by(|x, y| {
        ratio(y.1, y.2)
            .total_cmp(&ratio(x.1, x.2))
            .then(x.0.cmp(&y.0))
    });
    Ok(out)
}

/// Domains whose uplink (either direction) would be over capacity with one more flow at the
/// level's bandwidth: where a new job's traffic would be slowed. (level, domain) pairs.
pub fn hot_domains(state: &ClusterState, threshold: f64) -> Vec<(usize, usize)> {
    let Some(total) = state.fabric_load() else {
        return Vec::new();
    };
    let topo = state.topology();
    (0..topo.uplink_count())
        .filter(|&u| {
            let (level, _) = topo.uplink_owner(u);
            let extra = topo.effective_bandwidth(level + 1);
            let cap = topo.uplink_gbps()[u];
            total[2 * u].max(total[2 * u + 1]) + extra > threshold * cap
        })
        .map(|u| topo.uplink_owner(u))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::testing::tp_dp_job;
    use crate::topology::tests::tree;
    use std::sync::Arc;

    /// 8 hosts of 8 GPUs, 2 hosts per leaf; leaf uplinks `ratio`:1 oversubscribed.
    fn fabric(ratio: f64) -> Arc<Topology> {
        let topo = tree(8, 8, 2);
        let caps: Vec<f64> = (0..topo.uplink_count())
            .map(|u| {
                let (level, _) = topo.uplink_owner(u);
                let cap = topo.uplink_gbps()[u];
                if level == 1 {
                    cap / ratio
                } else {
                    cap
                }
            })
            .collect();
        Arc::new(topo.with_uplink_gbps(caps).unwrap())
    }

    #[test]
    fn non_blocking_capacity_is_gpus_times_bandwidth_above() {
        let topo = tree(4, 8, 2);
        // Hosts (level 0, the NVLink domain) then leaves (level 1).
        assert_eq!(topo.uplink_count(), 4 + 2);
        assert_eq!(topo.uplink_gbps()[0], 8.0 * 50.0);
        assert_eq!(topo.uplink_gbps()[4], 16.0 * 25.0);
        assert_eq!(topo.uplink_owner(5), (1, 1));
    }

    #[test]
    fn uplinks_by_level_ranks_each_level_on_its_own() {
        let topo = fabric(4.0);
        let job = Arc::new(tp_dp_job(&topo, 8, 2));
        let mut s = ClusterState::new(topo.clone());
        assert!(uplinks_by_level(&s, 3).is_empty());
        // One host in leaf 0, one in leaf 1: both hosts' NICs and both leaf uplinks load.
        let a: Vec<u32> = (0..8).chain(16..24).collect();
        s.allocate_job("a", &a, Some(job)).unwrap();
        let levels = uplinks_by_level(&s, 3);
        assert_eq!(
            levels.iter().map(|l| l.level).collect::<Vec<_>>(),
            vec![0, 1]
        );
        // Hosts: 8 uplinks, two of them loaded both ways; leaves: 4 uplinks, two loaded.
        assert_eq!((levels[0].directions, levels[0].loaded), (16, 4));
        assert_eq!((levels[1].directions, levels[1].loaded), (8, 4));
        assert_eq!(levels[0].hottest.len(), 3);
        for level in &levels {
            for pair in level.hottest.windows(2) {
                assert!(pair[0].1 / pair[0].2 >= pair[1].1 / pair[1].2);
            }
            for &(slot, _, _) in &level.hottest {
                assert_eq!(topo.uplink_owner(slot / 2).0, level.level);
            }
        }
        let total: usize = levels.iter().map(|l| l.loaded).sum();
        assert_eq!(total, hottest_uplinks(&s, usize::MAX).len());
    }

    #[test]
    fn ring_load_crosses_each_boundary_once_each_way() {
        let topo = tree(4, 8, 2);
        let mut load = Vec::new();
        // Two GPUs on host 0 (leaf 0), two on host 2 (leaf 1).
        collective_load(&topo, CollectiveKind::AllReduce, &[0, 1, 16, 17], &mut load);
        merge(&mut load);
        let host0 = topo.uplink_id(0, 0).unwrap();
        let leaf0 = topo.uplink_id(1, 0).unwrap();
        // The ring runs at two NIC shares of 25 GB/s (two GPUs per host drive two rails,
        // `nccl::ring_bandwidths`), and loads each boundary at that rate.
        assert_eq!(lookup(&load, (2 * host0 + UP) as u32), 50.0);
        assert_eq!(lookup(&load, (2 * host0 + DOWN) as u32), 50.0);
        assert_eq!(lookup(&load, (2 * leaf0 + UP) as u32), 50.0);
        assert_eq!(load.len(), 8);
    }

    #[test]
    fn two_identical_jobs_slow_each_other_equally_and_only_when_oversubscribed() {
        for (ratio, slowed) in [(1.0, false), (8.0, true)] {
            let topo = fabric(ratio);
            let job = Arc::new(tp_dp_job(&topo, 8, 2));
            let mut s = ClusterState::new(topo.clone());
            // Each job: one host in leaf 0, one in leaf 1; both cross the same leaf uplinks.
            let a: Vec<u32> = (0..8).chain(16..24).collect();
            let b: Vec<u32> = (8..16).chain(24..32).collect();
            s.allocate_job("a", &a, Some(job.clone())).unwrap();
            s.allocate_job("b", &b, Some(job.clone())).unwrap();
            s.check().unwrap();
            let ra = contention(&s, &job, &a).unwrap();
            let rb = contention(&s, &job, &b).unwrap();
            assert!((ra.slowdown() - rb.slowdown()).abs() < 1e-12);
            assert_eq!(ra.slowdown() > 1.0 + 1e-9, slowed, "ratio {ratio}");
            assert_eq!(!ra.uplinks.is_empty(), slowed);
            if slowed {
                assert_eq!(ra.uplinks[0].jobs[0].0, "b");
            }
        }
    }

    #[test]
    fn load_is_conserved_through_allocate_repair_release() {
        let topo = fabric(2.0);
        let job = Arc::new(tp_dp_job(&topo, 4, 4));
        let mut s = ClusterState::new(topo.clone());
        let gpus: Vec<u32> = vec![0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51];
        s.allocate_job("a", &gpus, Some(job.clone())).unwrap();
        let total: f64 = s.fabric_load().unwrap().iter().sum();
        let flows: f64 = job_load(&topo, &job, &gpus).iter().map(|x| x.1).sum();
        assert!((total - flows).abs() < 1e-9);
        let mut moved = gpus.clone();
        moved[15] = 60;
        s.replace_allocation("a", &moved).unwrap();
        s.check().unwrap();
        s.release("a").unwrap();
        s.check().unwrap();
        assert!(s.fabric_load().is_none());
    }

    #[test]
    fn a_job_alone_contends_with_itself_only_when_oversubscribed() {
        // One host in leaf 0, one in leaf 1: 8 dp rings of 2 cross the leaf uplinks.
        let gpus: Vec<u32> = (0..8).chain(16..24).collect();
        let open = fabric(1.0);
        let job = tp_dp_job(&open, 8, 2);
        let healthy = crate::cost::evaluate(&open, &job, &gpus).unwrap();
        let tight = fabric(8.0);
        let slowed = crate::cost::evaluate(&tight, &job, &gpus).unwrap();
        assert!(tight.is_oversubscribed() && !open.is_oversubscribed());
        // The dp class puts 8 x 25 GB/s on a 50 GB/s uplink: each ring gets a quarter.
        let latency = 2.0 * 4e-6;
        let ratio = (slowed.class_seconds[1] - latency) / (healthy.class_seconds[1] - latency);
        assert!((ratio - 4.0).abs() < 1e-9, "{ratio}");
        assert_eq!(slowed.class_seconds[0], healthy.class_seconds[0]);
    }

    #[test]
    fn neighbours_pay_for_a_new_job_on_their_uplinks() {
        let topo = fabric(8.0);
        let job = Arc::new(tp_dp_job(&topo, 8, 2));
        let mut s = ClusterState::new(topo.clone());
        let a: Vec<u32> = (0..8).chain(16..24).collect();
        s.allocate_job("a", &a, Some(job.clone())).unwrap();
        let crossing: Vec<u32> = (8..16).chain(24..32).collect();
        let elsewhere: Vec<u32> = (32..40).chain(40..48).collect();
        assert!(added_to_neighbours(&s, &job, &crossing).unwrap() > 0.0);
        assert_eq!(added_to_neighbours(&s, &job, &elsewhere).unwrap(), 0.0);
    }
}
