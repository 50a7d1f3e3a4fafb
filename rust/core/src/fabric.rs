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
//! group's GPUs on its smaller side), for an all-to-all the rate the cost model runs it at
//! ([`crate::nccl::alltoall_bytes_seconds`]: each flow carries `S/n` in its healthy time), so
//! the load does not change when hardware degrades. A job's load on an uplink is that of its heaviest class:
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
//! ## Routing and hash collisions
//!
//! Fair sharing assumes the fabric spreads flows evenly over the parallel links of an uplink
//! (a leaf's links to its spines), which adaptive routing comes close to: it is the default
//! ([`crate::topology::Routing::Adaptive`]). A level that hashes flows (ECMP) or routes them
//! by destination (static routing, InfiniBand's default) puts each flow on one link chosen
//! without regard to load, so flows collide: `n` equal flows hashed onto `n` links leave
//! `(1 - 1/n)^n` ≈ 37 % of the links idle and the fullest carries about 2.6, 3.1 and 4.0 flows
//! at `n` = 8, 16 and 64 ([`expected_fullest`], the balls-into-bins maximum). A synchronous
//! collective runs at the pace of its slowest flow, the one on the fullest link, so on a
//! hashed uplink it gets `1 / E[load of the fullest link]` of a link (never more than its
//! fair share). The balls are the flows on the uplink direction: the priced collective's
//! class (its concurrent collectives) and the running jobs' load, each hop split into one
//! connection per NIC port it drives, at the link rate (a NIC port's: the per-GPU bandwidth
//! of the level above times the GPUs per NIC of the hosts under the uplink,
//! [`Topology::link_rate`]; an uplink has `capacity / link rate` parallel links, so where two
//! GPUs share a NIC there are half as many links and connections as GPUs), and each
//! connection into the level's queue pairs (NCCL_IB_QPS_PER_CONNECTION: more, smaller flows,
//! less imbalance). Where the hosts list their NICs, the links of an uplink above the NVLink
//! domain split into one group per NIC (rail), and a flow hashes onto its own rail's links
//! only ([`Topology::uplink_rails`]; rail-aligned leaves and spines as NVIDIA's SuperPOD
//! designs cable them): the fullest link is the fullest over the rails, each taking an equal
//! part of the flows ([`expected_fullest_in_groups`]). Hosts that list no NICs hash over the
//! whole uplink. Flows of
//! unequal size count as `W² / Σw²` equal balls of weight `Σw² / W` (exact for equal flows);
//! the running jobs' load counts as flows at the link rate. Static routing does not split a
//! connection over its queue pairs (one path per destination). Hedera (Al-Fares et al.,
//! NSDI'10) measured static hashing against near-optimal flow placement; Meta (Gangidi et al.,
//! SIGCOMM'24) report enhanced ECMP with more queue pairs giving up to 40 % better all-reduce.
//! Assumed: the fullest link carries one of the collective's flows (true when the collective
//! owns most flows on the uplink, pessimistic when it is a few among many).
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
use crate::topology::{Level, Routing, Topology};

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
    flow_slots_at(topo, a, b, |s, _| slot(s));
}

/// [`flow_slots`] with the level owning each slot's uplink.
#[inline]
fn flow_slots_at(topo: &Topology, a: usize, b: usize, mut slot: impl FnMut(usize, usize)) {
    if a == b {
        return;
    }
    let top = topo.lca(a, b);
    for level in topo.nvlink_level()..top {
        if let (Some(ua), Some(ub)) = (
            topo.uplink_id(level, topo.domain_of(a, level)),
            topo.uplink_id(level, topo.domain_of(b, level)),
        ) {
            slot(2 * ua + UP, level);
            slot(2 * ub + DOWN, level);
        }
    }
}

/// Per uplink direction: (slot, GB/s, Σ w² of its flows in link units), where each flow of
/// `v` GB/s is `ceil(v / link rate)` connections of equal size (one per NIC port it drives;
/// the link rate is a NIC port's, [`Topology::link_rate`]).
pub(crate) type Balls = Vec<(u32, f64, f64)>;

/// Push the flows of one collective over `members` (ordered by [`ordered_members`]) onto
/// `out` as [`Balls`] (unmerged); returns the fraction of the bandwidth the cost model scales
/// by the share that its flows run at ([`healthy_rates`]).
fn collective_balls(
    topo: &Topology,
    kind: CollectiveKind,
    members: &[u32],
    out: &mut Balls,
) -> f64 {
    if members.len() < 2 || topo.uplink_count() == 0 {
        return 1.0;
    }
    let (rate, scale) = healthy_rates(topo, kind, members);
    collective_flows(kind, members, |a, b, fraction| {
        let v = rate * fraction;
        flow_slots_at(topo, a, b, |s, _| {
            let units = v / topo.link_rate(s / 2);
            let connections = (units - 1e-9).ceil().max(1.0);
            out.push((s as u32, v, units * units / connections));
        });
    });
    scale
}

/// Sort by slot and sum the entries of each slot.
fn merge_balls(balls: &mut Balls) {
    balls.sort_unstable_by_key(|&(s, _, _)| s);
    let mut out = 0;
    for i in 0..balls.len() {
        if out > 0 && balls[out - 1].0 == balls[i].0 {
            balls[out - 1].1 += balls[i].1;
            balls[out - 1].2 += balls[i].2;
        } else {
            balls[out] = balls[i];
            out += 1;
        }
    }
    balls.truncate(out);
}

/// The share (in (0, 1]) of a link's rate the slowest of a collective's flows gets on one
/// uplink direction `slot`: its fair share of the capacity and, where the level hashes flows,
/// `1 / E[load of the fullest link]` (module docs). `own_gbps` and `own_sq` are the priced
/// collective's flows ([`Balls`]); `mine_gbps` its class's (at least its own), `others_gbps`
/// the running jobs'; `scale` the fraction of the scaled bandwidth its flows run at.
fn uplink_share(
    topo: &Topology,
    slot: u32,
    own_gbps: f64,
    own_sq: f64,
    mine_gbps: f64,
    others_gbps: f64,
    scale: f64,
) -> f64 {
    let uplink = slot as usize / 2;
    let cap = topo.uplink_gbps()[uplink];
    let demand = others_gbps + mine_gbps;
    // A link loaded exactly to capacity (up to rounding) slows nobody.
    let fair = if demand > cap * (1.0 + TOLERANCE) {
        cap / demand
    } else {
        1.0
    };
    // The fullest link's flows run at 1 / fullest of their rate; the share is of the bandwidth
    // the cost model scales, `rate / scale` (a ring's hops may drive more NIC shares than it
    // runs at).
    match fullest_link(topo, uplink, own_gbps, own_sq, mine_gbps, others_gbps) {
        Some(fullest) if fullest > 1.0 => fair.min(scale / fullest),
        _ => fair,
    }
}

/// The expected load of the fullest parallel link of `uplink` (in flows at the link rate)
/// when its level hashes flows, or None when it balances them (module docs).
fn fullest_link(
    topo: &Topology,
    uplink: usize,
    own_gbps: f64,
    own_sq: f64,
    mine_gbps: f64,
    others_gbps: f64,
) -> Option<f64> {
    let (level, _) = topo.uplink_owner(uplink);
    let routing = topo.routing(level);
    if !routing.hashes() || own_gbps <= 0.0 || own_sq <= 0.0 {
        return None;
    }
    let rate = topo.link_rate(uplink);
    let qps = match routing {
        Routing::Ecmp => topo.qps_per_connection(level) as f64,
        _ => 1.0,
    };
    // The class's flows look like the collective's own (same kind, same shape): the same
    // mean connection size; the neighbours' load counts as connections at the link rate.
    let own_units = own_gbps / rate;
    let unit = own_sq / own_units;
    let total = (mine_gbps + others_gbps) / rate;
    let squares = mine_gbps / rate * unit + others_gbps / rate;
    let balls = total * total / squares;
    let weight = squares / total;
    let links = topo.uplink_links(uplink);
    // Above the NVLink domain a flow only takes its own rail's links: the rails hash apart.
    let rails = if level > topo.nvlink_level() {
        topo.uplink_rails(uplink).min(links)
    } else {
        1
    };
    Some(weight / qps * expected_fullest_in_groups(balls * qps, links, rails))
}

/// Largest ball and bin counts for which [`expected_fullest`] is computed exactly; beyond, the
/// Poisson approximation (within 0.5 % of the exact value from 64 balls in 64 bins on).
const EXACT_LIMIT: usize = 128;

thread_local! {
    static FULLEST: RefCell<HashMap<(usize, usize, usize), f64>> = RefCell::new(HashMap::new());
}

/// The expected number of balls in the fullest of `bins` bins when `balls` balls are thrown
/// independently and uniformly (balls into bins; a fractional count interpolates linearly
/// between its neighbours). Exact (sequential binomial splitting of the multinomial) up to
/// [`EXACT_LIMIT`] balls and bins, Poissonised beyond: `E[max] = Σ_k 1 - F_λ(k)^bins` with
/// `λ = balls / bins`. With `n` balls in `n` bins: 2.60 at 8, 3.08 at 16, 3.96 at 64.
pub fn expected_fullest(balls: f64, bins: usize) -> f64 {
    expected_fullest_in_groups(balls, bins, 1)
}

/// [`expected_fullest`] when the `bins` split into `groups` equal groups (rails) and each
/// group gets `balls / groups` of the balls, thrown into its own bins only: the expected
/// fullest bin over all groups, `Σ_k 1 - P(max of one group <= k)^groups` (exact up to
/// [`EXACT_LIMIT`] balls and bins per group, Poissonised beyond, where grouping changes
/// nothing). A fractional count per group interpolates linearly between its neighbours. With
/// 64 balls in 64 bins: 3.96 in one group, 3.61 in 8 rails of 8.
pub fn expected_fullest_in_groups(balls: f64, bins: usize, groups: usize) -> f64 {
    if balls.is_nan() || balls <= 0.0 {
        return 0.0;
    }
    let groups = groups.clamp(1, bins.max(1));
    let per_group = balls / groups as f64;
    let bins = (bins as f64 / groups as f64).round().max(1.0) as usize;
    if bins <= 1 {
        return per_group;
    }
    let low = per_group.floor();
    let frac = per_group - low;
    let at = |n: f64| -> f64 {
        let n = n as usize;
        if n == 0 {
            return 0.0;
        }
        FULLEST.with(|cell| {
            if let Some(&v) = cell.borrow().get(&(n, bins, groups)) {
                return v;
            }
            let v = if n <= EXACT_LIMIT && bins <= EXACT_LIMIT {
                fullest_exact(n, bins, groups)
            } else {
                fullest_poisson((n * groups) as f64, bins * groups)
            };
            cell.borrow_mut().insert((n, bins, groups), v);
            v
        })
    };
    if frac < 1e-12 {
        return at(low);
    }
    (1.0 - frac) * at(low) + frac * at(low + 1.0)
}

/// The expected share of `bins` links that carry at least one of `balls` hashed flows:
/// `1 - (1 - 1/bins)^balls` (≈ 63 % when there are as many flows as links).
pub fn links_used(balls: f64, bins: usize) -> f64 {
    if bins == 0 {
        return 0.0;
    }
    1.0 - (1.0 - 1.0 / bins as f64).powf(balls.max(0.0))
}

/// `E[max]` over `groups` independent groups of `n` balls in `m` bins each, exactly:
/// `Σ_k 1 - P(max <= k)^groups`, each group's `P(max <= k)` by splitting the balls bin by bin
/// (bin `b` of the `b` left gets Binomial(r, 1/b) of the `r` balls left).
fn fullest_exact(n: usize, m: usize, groups: usize) -> f64 {
    let mut expected = 0.0;
    let mut fits = vec![0.0; n + 1];
    let mut next = vec![0.0; n + 1];
    for k in 0..n {
        // One bin left: it holds all the balls left, which must be at most k.
        for (r, f) in fits.iter_mut().enumerate() {
            *f = if r <= k { 1.0 } else { 0.0 };
        }
        for b in 2..=m {
            let p = 1.0 / b as f64;
            for r in 0..=n {
                // P(this bin gets c of r) by the binomial recurrence.
                let mut pmf = (1.0 - p).powi(r as i32);
                let mut sum = 0.0;
                for c in 0..=r.min(k) {
                    sum += pmf * fits[r - c];
                    pmf *= (r - c) as f64 / (c + 1) as f64 * p / (1.0 - p);
                }
                next[r] = sum;
            }
            std::mem::swap(&mut fits, &mut next);
        }
        let below = fits[n].min(1.0).powi(groups as i32);
        expected += 1.0 - below;
        if below > 1.0 - 1e-12 {
            break;
        }
    }
    expected
}

/// `E[max]` of `n` balls in `m` bins with each bin's count Poisson(n / m) and independent.
/// Below `λ - 12 √λ` every bin is above `k` (the Poisson CDF there is under 1e-30), so the sum
/// starts there, the probabilities in log space (no underflow at large `λ`).
fn fullest_poisson(n: f64, m: usize) -> f64 {
    let lambda = n / m as f64;
    let start = (lambda - 12.0 * lambda.sqrt()).floor().max(0.0);
    // ln P(X = start), then the CDF up to it (its lower tail is negligible when start > 0).
    let mut log_term = -lambda + start * lambda.ln() - ln_factorial(start);
    if lambda <= 0.0 {
        log_term = if start == 0.0 { 0.0 } else { f64::NEG_INFINITY };
    }
    let mut cdf = 0.0;
    let mut expected = start;
    let mut k = start;
    loop {
        cdf += log_term.exp();
        let below = cdf.min(1.0).powf(m as f64);
        expected += 1.0 - below;
        if below > 1.0 - 1e-12 || k > n + 1.0 {
            break;
        }
        k += 1.0;
        log_term += (lambda / k).ln();
    }
    expected
}

/// `ln k!` for a whole number `k` (exact below 20, Stirling's series above).
fn ln_factorial(k: f64) -> f64 {
    if k < 20.0 {
        return (2..=k as u64).map(|i| (i as f64).ln()).sum();
    }
    let inv = 1.0 / k;
    k * k.ln() - k + 0.5 * (2.0 * std::f64::consts::PI * k).ln() + inv / 12.0
        - inv * inv * inv / 360.0
}

/// Healthy bottleneck bandwidth (GB/s) of a collective over `members` (ordered by
/// [`ordered_members`]): for a ring, the bandwidth the cost model gives it
/// ([`crate::nccl::ring_bandwidths`]: a hop out of the NVLink domain drives the NIC shares of
/// the group's GPUs on its smaller side), so its flows load the uplinks at the rate it runs.
fn healthy_rate(topo: &Topology, kind: CollectiveKind, members: &[u32]) -> f64 {
    healthy_rates(topo, kind, members).0
}

/// [`healthy_rate`] and its fraction of the bandwidth the cost model multiplies by the share
/// (a ring's fabric hops, which may drive more NIC shares than the ring runs at; 1 for the
/// other kinds).
fn healthy_rates(topo: &Topology, kind: CollectiveKind, members: &[u32]) -> (f64, f64) {
    if !matches!(
        kind,
        CollectiveKind::PointToPoint | CollectiveKind::AllToAll
    ) {
        let runs = crate::nccl::host_runs(topo, members);
        let (intra, inter) =
            crate::nccl::ring_bandwidths(topo, members, &runs, |a, b, _| topo.pair_bandwidth(a, b));
        let rate = intra.min(inter);
        let scale = if inter.is_finite() && inter > 0.0 {
            rate / inter
        } else {
            1.0
        };
        return (rate, scale);
    }
    if kind == CollectiveKind::AllToAll {
        // The rate the cost model runs it at ([`crate::nccl::alltoall_bytes_seconds`]): each
        // of the n-1 flows of a GPU carries S/n in the collective's time.
        let n = members.len() as f64;
        let t = crate::nccl::alltoall_bytes_seconds(topo, members, 1e9, 1.0, |a, b, _| {
            topo.pair_bandwidth(a, b)
        });
        if t > 0.0 && t.is_finite() {
            return ((n - 1.0) / n / t, 1.0);
        }
    }
    let mut slowest = f64::INFINITY;
    collective_flows(kind, members, |a, b, _| {
        slowest = slowest.min(topo.pair_bandwidth(a, b));
    });
    (slowest, 1.0)
}

/// Push the load (GB/s per direction slot) of one collective over `members` onto `out`
/// (unmerged).
pub fn collective_load(topo: &Topology, kind: CollectiveKind, members: &[u32], out: &mut Load) {
    collective_load_into(topo, kind, members, |s, v| out.push((s, v)));
}

/// [`collective_load`], each flow's (slot, GB/s) handed to `add`.
fn collective_load_into(
    topo: &Topology,
    kind: CollectiveKind,
    members: &[u32],
    mut add: impl FnMut(u32, f64),
) {
    if members.len() < 2 || topo.uplink_count() == 0 {
        return;
    }
    let rate = healthy_rate(topo, kind, members);
    collective_flows(kind, members, |a, b, fraction| {
        flow_slots(topo, a, b, |s| add(s as u32, rate * fraction));
    });
}

/// Sums per direction slot, dense over the fabric's slots with the list of slots touched:
/// a job's flows are summed in the order they come and read back by slot, without sorting
/// every flow (a 16,384-rank job pushes some 10^5 of them).
struct SlotSums {
    sum: Vec<f64>,
    touched: Vec<u32>,
    seen: Vec<bool>,
}

thread_local! {
    /// One accumulator per thread, kept between calls (a small job's load is computed tens
    /// of thousands of times a second; allocating the dense rows each time would cost more
    /// than its flows).
    static SLOT_SUMS: RefCell<SlotSums> = const {
        RefCell::new(SlotSums {
            sum: Vec::new(),
            touched: Vec::new(),
            seen: Vec::new(),
        })
    };
}

impl SlotSums {
    /// Run `f` with this thread's accumulator, sized for `topo` (empty on entry and exit).
    fn with<R>(topo: &Topology, f: impl FnOnce(&mut SlotSums) -> R) -> R {
        SLOT_SUMS.with(|cell| match cell.try_borrow_mut() {
            Ok(mut sums) => {
                sums.resize(topo);
                f(&mut sums)
            }
            // Re-entered (not expected): a fresh accumulator.
            Err(_) => {
                let mut sums = SlotSums {
                    sum: Vec::new(),
                    touched: Vec::new(),
                    seen: Vec::new(),
                };
                sums.resize(topo);
                f(&mut sums)
            }
        })
    }

    fn resize(&mut self, topo: &Topology) {
        let slots = 2 * topo.uplink_count();
        if self.sum.len() < slots {
            self.sum.resize(slots, 0.0);
            self.seen.resize(slots, false);
        }
    }

    #[inline]
    fn add(&mut self, slot: u32, v: f64) {
        let s = slot as usize;
        if !self.seen[s] {
            self.seen[s] = true;
            self.touched.push(slot);
        }
        self.sum[s] += v;
    }

    /// The sums by slot (sorted), and the accumulator emptied for the next use.
    fn take(&mut self) -> Load {
        self.touched.sort_unstable();
        let out = self
            .touched
            .iter()
            .map(|&s| (s, self.sum[s as usize]))
            .collect();
        for &s in &self.touched {
            self.sum[s as usize] = 0.0;
            self.seen[s as usize] = false;
        }
        self.touched.clear();
        out
    }
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

/// The flows of a placed job's collectives: each collective's (slot, GB/s) in the order
/// [`class_loads`] adds them (none for one inside an NVLink domain or not running). A
/// placement that moves a few ranks sums again only the flows of the collectives holding one
/// of them and adds the others' in the same order ([`job_load_moved`]): its load is the full
/// recount's, bit for bit, as the state's check demands.
#[derive(Debug, Clone)]
pub struct JobFlows {
    gpus: Vec<u32>,
    /// `flows[ranges[i].0..ranges[i].1]`: collective i's.
    ranges: Vec<(usize, usize)>,
    flows: Vec<(u32, f64)>,
}

/// The load of each class of a placed job (merged, GB/s per direction slot): the flows of
/// its collectives that run (bytes and count above zero).
pub fn class_loads(topo: &Topology, job: &JobSpec, gpus: &[u32]) -> Vec<Load> {
    class_loads_reusing(topo, job, gpus, None, None)
}

/// [`class_loads`], recording every collective's flows into `record`, or adding those of
/// `base` again for the collectives `changed` does not mark (same members, same flows).
fn class_loads_reusing(
    topo: &Topology,
    job: &JobSpec,
    gpus: &[u32],
    base: Option<(&JobFlows, &[bool])>,
    mut record: Option<&mut JobFlows>,
) -> Vec<Load> {
    let mut per_class: Vec<Load> = vec![Vec::new(); job.num_classes];
    if topo.uplink_count() == 0 {
        return per_class;
    }
    let mut members = Vec::new();
    let nvlink = topo.nvlink_level();
    SlotSums::with(topo, |sums| {
        for (class, out) in per_class.iter_mut().enumerate() {
            // The class's running collectives, in the job's order (a job has a few classes).
            let running = job
                .collectives
                .iter()
                .enumerate()
                .filter(|(_, c)| c.class as usize == class && c.count > 0.0 && c.bytes > 0.0);
            for (i, c) in running {
                if let Some((base, changed)) = base {
                    if !changed[i] {
                        let (a, b) = base.ranges[i];
                        for &(slot, v) in &base.flows[a..b] {
                            sums.add(slot, v);
                        }
                        if let Some(r) = record.as_deref_mut() {
                            let start = r.flows.len();
                            r.flows.extend_from_slice(&base.flows[a..b]);
                            r.ranges[i] = (start, r.flows.len());
                        }
                        continue;
                    }
                }
                // A collective inside one NVLink domain crosses no uplink: nothing to order
                // or rate (a 16,384-rank job has thousands of such tp groups).
                let row = job.groups.row(c.group as usize);
                let inside = row.first().is_some_and(|&r0| {
                    let d = topo.domain_of(gpus[r0 as usize] as usize, nvlink);
                    row.iter()
                        .all(|&r| topo.domain_of(gpus[r as usize] as usize, nvlink) == d)
                });
                if inside {
                    continue;
                }
                ordered_members(topo, job, c.group, c.kind, gpus, &mut members);
                match record.as_deref_mut() {
                    Some(r) => {
                        let start = r.flows.len();
                        collective_load_into(topo, c.kind, &members, |s, v| {
                            sums.add(s, v);
                            r.flows.push((s, v));
                        });
                        r.ranges[i] = (start, r.flows.len());
                    }
                    None => collective_load_into(topo, c.kind, &members, |s, v| sums.add(s, v)),
                }
            }
            *out = sums.take();
        }
    });
    per_class
}

/// The load of a placed job: per direction slot, its heaviest class's demand (GB/s).
pub fn job_load(topo: &Topology, job: &JobSpec, gpus: &[u32]) -> Load {
    peak_of_classes(class_loads(topo, job, gpus))
}

/// [`job_load`] and the flows behind it, for [`job_load_moved`].
pub fn job_load_recorded(topo: &Topology, job: &JobSpec, gpus: &[u32]) -> (Load, JobFlows) {
    let mut record = JobFlows {
        gpus: gpus.to_vec(),
        ranges: vec![(0, 0); job.collectives.len()],
        flows: Vec::new(),
    };
    let load = peak_of_classes(class_loads_reusing(
        topo,
        job,
        gpus,
        None,
        Some(&mut record),
    ));
    (load, record)
}

/// [`job_load_recorded`] of the job moved to `gpus` from the placement `flows` were recorded
/// on: only the collectives holding a moved rank are summed again. The load is
/// [`job_load`]'s, bit for bit.
pub fn job_load_moved(
    topo: &Topology,
    job: &JobSpec,
    flows: &JobFlows,
    gpus: &[u32],
) -> (Load, JobFlows) {
    if flows.gpus.len() != gpus.len() || flows.ranges.len() != job.collectives.len() {
        return job_load_recorded(topo, job, gpus);
    }
    let changed = job.collectives_moved(gpus, &flows.gpus);
    let mut record = JobFlows {
        gpus: gpus.to_vec(),
        ranges: vec![(0, 0); job.collectives.len()],
        flows: Vec::with_capacity(flows.flows.len()),
    };
    let classes = class_loads_reusing(topo, job, gpus, Some((flows, &changed)), Some(&mut record));
    (peak_of_classes(classes), record)
}

/// Per slot, the heaviest of the classes' loads.
fn peak_of_classes(classes: Vec<Load>) -> Load {
    match classes.len() {
        0 => Vec::new(),
        1 => classes.into_iter().next().unwrap_or_default(),
        _ => classes
            .iter()
            .skip(1)
            .fold(classes[0].clone(), |acc, class| peak(&acc, class)),
    }
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
    static SCRATCH: RefCell<Balls> = const { RefCell::new(Vec::new()) };
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
    /// and the fabric neither is oversubscribed nor hashes flows: no neighbour is left, and a
    /// job alone contends with itself only on such a fabric, so the cost model prices it
    /// without a background, the same and much cheaper (no flows laid out per collective).
    pub(crate) fn alone(&self, state: &ClusterState) -> bool {
        state.loaded_jobs() == 1
            && !self.minus.is_empty()
            && self.plus.is_empty()
            && !state.topology().self_contends()
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

/// The smallest share (in (0, 1]) a collective over `members` (ordered as the cost model
/// runs it) gets on the uplinks its flows cross: there, its demand is the neighbours' load plus
/// its class's flows (`class`, which include its own; its own alone when not given), shared
/// fairly or, where a level hashes flows, at the pace of the fullest link (module docs).
pub(crate) fn collective_share(
    topo: &Topology,
    neighbours: Option<Background<'_>>,
    class: Option<&[(u32, f64)]>,
    kind: CollectiveKind,
    members: &[u32],
) -> f64 {
    if neighbours.is_none() && class.is_none() && !topo.has_hashing() {
        return 1.0;
    }
    SCRATCH.with(|cell| {
        let mut own = cell.borrow_mut();
        own.clear();
        let scale = collective_balls(topo, kind, members, &mut own);
        merge_balls(&mut own);
        own.iter()
            .map(|&(s, v, sq)| {
                let mine = class.map_or(v, |c| lookup(c, s).max(v));
                let others = neighbours.map_or(0.0, |b| b.neighbours(s));
                uplink_share(topo, s, v, sq, mine, others, scale)
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

/// One level's uplinks as a job's flows cross them, seen by the collision model.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelCrossing {
    /// The level whose domains' uplinks these are (a host's NICs, a leaf's links to the spine).
    pub level: usize,
    pub routing: Routing,
    pub qps_per_connection: u32,
    /// Connections at the link rate (one per NIC share) of the job's heaviest class leaving
    /// domains of this level, summed over them.
    pub flows: f64,
    /// Uplinks of this level the job's flows leave by.
    pub uplinks: usize,
    /// Parallel links of the worst of them.
    pub links: usize,
    /// On the worst of them: the expected load of its fullest link (connections at the link
    /// rate, the running jobs' included) where the level hashes flows, the mean load per link
    /// where it balances them.
    pub fullest: f64,
    /// The smallest share of a link's rate one of the job's flows gets at this level (1: line
    /// rate).
    pub share: f64,
}

/// What hashing costs a placed job: per uplink level its crossing flows and their share, and
/// its communication time as routed and as it would be with every level balanced.
#[derive(Debug, Clone, PartialEq)]
pub struct CollisionReport {
    /// Every level with uplinks, bottom-up.
    pub levels: Vec<LevelCrossing>,
    /// Communication time per step (s) as the fabric routes it (the cost model's figure).
    pub seconds: f64,
    /// The same with every level's routing adaptive (the fair share).
    pub balanced_seconds: f64,
}

impl CollisionReport {
    /// Time as routed over time balanced (1: hashing costs nothing).
    pub fn slowdown(&self) -> f64 {
        if self.balanced_seconds > 0.0 {
            self.seconds / self.balanced_seconds
        } else {
            1.0
        }
    }
}

/// The flows of `job` on `gpus` crossing each uplink level of `state`'s fabric, the share its
/// flows get there among the running jobs' (hash collisions included), and its time as routed
/// and balanced.
pub fn collisions(state: &ClusterState, job: &JobSpec, gpus: &[u32]) -> Result<CollisionReport> {
    let topo = state.topology();
    let seconds = crate::cost::evaluate_in(state, job, gpus)?.comm_seconds;
    let balanced_seconds = if topo.has_hashing() {
        let balanced = topo.as_ref().clone().with_routing(Vec::new(), Vec::new())?;
        crate::cost::evaluate_in_variant(state, &balanced, job, gpus)?.comm_seconds
    } else {
        seconds
    };
    // Per direction slot, the heaviest class's flows.
    let mut heaviest: HashMap<u32, (f64, f64)> = HashMap::new();
    let mut classes: Vec<Balls> = vec![Vec::new(); job.num_classes];
    let mut members = Vec::new();
    for c in &job.collectives {
        if c.count <= 0.0 || c.bytes <= 0.0 {
            continue;
        }
        ordered_members(topo, job, c.group, c.kind, gpus, &mut members);
        collective_balls(topo, c.kind, &members, &mut classes[c.class as usize]);
    }
    for mut class in classes {
        merge_balls(&mut class);
        for (s, v, sq) in class {
            let slot = heaviest.entry(s).or_insert((0.0, 0.0));
            if v > slot.0 {
                *slot = (v, sq);
            }
        }
    }
    let background = Background::of(state, gpus);
    let nl = topo.num_levels();
    let mut levels: Vec<LevelCrossing> = (topo.nvlink_level()..nl.saturating_sub(1))
        .map(|level| LevelCrossing {
            level,
            routing: topo.routing(level),
            qps_per_connection: topo.qps_per_connection(level),
            flows: 0.0,
            uplinks: 0,
            links: 0,
            fullest: 0.0,
            share: 1.0,
        })
        .collect();
    let mut slots: Vec<(u32, (f64, f64))> = heaviest.into_iter().collect();
    slots.sort_unstable_by_key(|&(s, _)| s);
    for (s, (v, sq)) in slots {
        let uplink = s as usize / 2;
        let (level, _) = topo.uplink_owner(uplink);
        let rate = topo.link_rate(uplink);
        let entry = &mut levels[level - topo.nvlink_level()];
        if s as usize % 2 == UP {
            entry.flows += v / rate;
            entry.uplinks += 1;
        }
        let others = background.map_or(0.0, |b| b.neighbours(s));
        let share = uplink_share(topo, s, v, sq, v, others, 1.0);
        let links = topo.uplink_links(uplink);
        let fullest = fullest_link(topo, uplink, v, sq, v, others)
            .unwrap_or((v + others) / rate / links as f64);
        if entry.links == 0
            || share < entry.share
            || (share == entry.share && fullest > entry.fullest)
        {
            entry.share = share;
            entry.links = links;
            entry.fullest = fullest;
        }
    }
    Ok(CollisionReport {
        levels,
        seconds,
        balanced_seconds,
    })
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
    fn a_moved_jobs_load_summed_where_it_moved_is_the_full_recount_bit_for_bit() {
        // 80 hosts of 8 GPUs, 4 per leaf; a tp8 dp64 job on the first 512 GPUs (as many as a
        // state keeps flows for): its dp rings cross the leaves.
        let topo = tree(80, 8, 4);
        let job = tp_dp_job(&topo, 8, 64);
        let gpus: Vec<u32> = (0..512).collect();
        let (load, flows) = job_load_recorded(&topo, &job, &gpus);
        assert!(!load.is_empty());
        assert_eq!(load, job_load(&topo, &job, &gpus));
        let mut trial = gpus.clone();
        let mut recorded = flows;
        for (i, host) in [(0usize, 70u32), (9, 71), (37, 72), (9, 73)] {
            // Ranks of one tp group (8 consecutive ranks) onto a free host, one move after
            // another, each summed from the previous one's flows.
            for k in 0..8 {
                trial[i * 8 + k] = host * 8 + k as u32;
            }
            let (moved, next) = job_load_moved(&topo, &job, &recorded, &trial);
            assert_eq!(moved, job_load(&topo, &job, &trial));
            assert_eq!(moved.len(), job_load(&topo, &job, &trial).len());
            recorded = next;
        }
        // A state keeps the flows of a job this large and sums only the moved ones again;
        // its check recounts every job's load in full.
        let topo = Arc::new(topo);
        let mut s = ClusterState::new(topo.clone());
        s.allocate_job("a", &gpus, Some(Arc::new(job.clone())))
            .unwrap();
        s.replace_allocation("a", &trial).unwrap();
        s.check().unwrap();
        assert_eq!(s.job("a").unwrap().load, job_load(&topo, &job, &trial));
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

    #[test]
    fn balls_into_bins_matches_the_known_maxima() {
        // n flows on n links: the fullest carries about 2.6, 3.1 and 4.0 (the figures,
        // and the exact expectations 2.597, 3.078, 3.958).
        for (n, expect) in [(8usize, 2.597), (16, 3.078), (64, 3.958)] {
            let e = expected_fullest(n as f64, n);
            assert!((e - expect).abs() < 0.002, "n = {n}: {e}");
            // About 63 % of the links carry a flow.
            assert!((links_used(n as f64, n) - 0.63).abs() < 0.03);
        }
        // Small cases by hand: 2 balls in 8 bins collide with probability 1/8; one ball is one.
        assert!((expected_fullest(2.0, 8) - 1.125).abs() < 1e-12);
        assert_eq!(expected_fullest(1.0, 8), 1.0);
        assert_eq!(expected_fullest(5.0, 1), 5.0);
        assert!((expected_fullest(2.0, 2) - 1.5).abs() < 1e-12);
        // Beyond the exact range the Poisson approximation stays close and monotone.
        let (a, b) = (expected_fullest(128.0, 128), expected_fullest(129.0, 128));
        assert!((a - 4.379).abs() < 0.01 && b > a, "{a} {b}");
        // A fractional count interpolates between its neighbours.
        let mid = expected_fullest(8.5, 8);
        assert!(mid > expected_fullest(8.0, 8) && mid < expected_fullest(9.0, 8));
        // More balls per bin: the fullest approaches the mean.
        assert!(expected_fullest(1024.0, 8) / 128.0 < 1.15);
        // Far beyond (an all-to-all's many small flows on a few links): mean plus a few
        // standard deviations, not an underflow.
        for (n, m) in [(262_144.0, 256usize), (100_000.0, 2), (5_000.0, 200)] {
            let mean = n / m as f64;
            let e = expected_fullest(n, m);
            assert!(e > mean && e < mean + 6.0 * mean.sqrt(), "{n} in {m}: {e}");
        }
        assert!((ln_factorial(25.0) - (1..=25).map(|i| (i as f64).ln()).sum::<f64>()).abs() < 1e-9);
    }

    fn routed(routing: Routing, qps: u32) -> Topology {
        tree(8, 8, 2)
            .with_routing(
                vec![Routing::Adaptive, routing, Routing::Adaptive],
                vec![1, qps, 1],
            )
            .unwrap()
    }

    #[test]
    fn ecmp_leaf_uplinks_slow_a_job_by_its_fullest_link() {
        // One host in leaf 0, one in leaf 1: the 8 dp rings of 2 send 8 flows at the spine's
        // 25 GB/s up each leaf's 16 links (400 GB/s, non-blocking).
        let gpus: Vec<u32> = (0..8).chain(16..24).collect();
        let open = tree(8, 8, 2);
        let job = tp_dp_job(&open, 8, 2);
        let fair = crate::cost::evaluate(&open, &job, &gpus).unwrap();
        let latency = 2.0 * 4e-6;
        let adaptive = crate::cost::evaluate(&routed(Routing::Adaptive, 1), &job, &gpus).unwrap();
        assert_eq!(adaptive, fair);
        let ecmp = crate::cost::evaluate(&routed(Routing::Ecmp, 1), &job, &gpus).unwrap();
        let ratio = (ecmp.class_seconds[1] - latency) / (fair.class_seconds[1] - latency);
        assert!((ratio - expected_fullest(8.0, 16)).abs() < 1e-9, "{ratio}");
        assert!(ratio > 1.5);
        // The tp class stays inside the hosts: untouched.
        assert_eq!(ecmp.class_seconds[0], fair.class_seconds[0]);
        // Four queue pairs per connection: 32 quarter-flows, less imbalance.
        let qps = crate::cost::evaluate(&routed(Routing::Ecmp, 4), &job, &gpus).unwrap();
        let ratio4 = (qps.class_seconds[1] - latency) / (fair.class_seconds[1] - latency);
        assert!(
            (ratio4 - expected_fullest(32.0, 16) / 4.0).abs() < 1e-9,
            "{ratio4}"
        );
        assert!(ratio4 < ratio);
        // Static routing follows the destination: queue pairs do not spread it.
        let fixed = crate::cost::evaluate(&routed(Routing::Static, 4), &job, &gpus).unwrap();
        assert_eq!(fixed.class_seconds, ecmp.class_seconds);
        // Inside one leaf nothing crosses a hashed uplink.
        let near: Vec<u32> = (0..16).collect();
        assert_eq!(
            crate::cost::evaluate(&routed(Routing::Ecmp, 1), &job, &near).unwrap(),
            crate::cost::evaluate(&open, &job, &near).unwrap()
        );
    }

    #[test]
    fn a_job_alone_pays_for_its_own_flows_hashed_onto_as_many_links() {
        // Two hosts of n GPUs, one per leaf: a leaf's uplink has n links (one per GPU at the
        // spine's rate) and the n dp rings of 2 send one connection each up it. Alone on the
        // fabric, their price is the balls-into-bins maximum of n flows on n links.
        let latency = 2.0 * 4e-6;
        for (n, fullest) in [(8usize, 2.597), (16, 3.078)] {
            let with = |routing: Routing, qps: u32| {
                tree(2, n, 1)
                    .with_routing(
                        vec![Routing::Adaptive, routing, Routing::Adaptive],
                        vec![1, qps, 1],
                    )
                    .unwrap()
            };
            let open = tree(2, n, 1);
            let job = tp_dp_job(&open, n, 2);
            let gpus: Vec<u32> = (0..2 * n as u32).collect();
            let leaf = open.uplink_id(1, 0).unwrap();
            assert_eq!(open.uplink_links(leaf), n);
            let dp = |topo: &Topology| {
                crate::cost::evaluate(topo, &job, &gpus)
                    .unwrap()
                    .class_seconds[1]
                    - latency
            };
            let fair = dp(&open);
            // Adaptive routing: the fair share, exactly the price without routing.
            assert_eq!(dp(&with(Routing::Adaptive, 1)), fair);
            let ecmp = dp(&with(Routing::Ecmp, 1)) / fair;
            assert!(
                (ecmp - expected_fullest(n as f64, n)).abs() < 1e-9,
                "{n}: {ecmp}"
            );
            assert!((ecmp - fullest).abs() < 0.002, "{n}: {ecmp}");
            // Queue pairs: each connection hashed as q quarter-flows, the fullest link nearer
            // the mean (never below the fair share).
            let mut last = ecmp;
            for q in [2u32, 4, 8] {
                let spread = dp(&with(Routing::Ecmp, q)) / fair;
                let expect = expected_fullest((n * q as usize) as f64, n) / q as f64;
                assert!((spread - expect).abs() < 1e-9, "{n}, {q} QPs: {spread}");
                assert!(spread < last && spread >= 1.0, "{n}, {q} QPs: {spread}");
                last = spread;
            }
            // Static routing keeps one path per destination: queue pairs do not spread it.
            assert_eq!(dp(&with(Routing::Static, 8)) / fair, ecmp);
            // The contention report's alone price is the same figure (no second model).
            let state = ClusterState::new(Arc::new(with(Routing::Ecmp, 1)));
            let report = contention(&state, &job, &gpus).unwrap();
            let alone = crate::cost::evaluate(&with(Routing::Ecmp, 1), &job, &gpus).unwrap();
            assert_eq!(report.alone_seconds, alone.comm_seconds);
        }
    }

    #[test]
    fn running_jobs_flows_collide_too() {
        let topo = Arc::new(routed(Routing::Ecmp, 1));
        let job = Arc::new(tp_dp_job(&topo, 8, 2));
        let mut s = ClusterState::new(topo.clone());
        let a: Vec<u32> = (0..8).chain(16..24).collect();
        let alone = crate::cost::evaluate_in(&s, &job, &a).unwrap().comm_seconds;
        s.allocate_job("a", &a, Some(job.clone())).unwrap();
        // Alone on the fabric it still collides with itself.
        assert_eq!(
            crate::cost::evaluate_in(&s, &job, &a).unwrap().comm_seconds,
            alone
        );
        let b: Vec<u32> = (8..16).chain(24..32).collect();
        let report = collisions(&s, &job, &b).unwrap();
        // b's 8 flows join a's 8 on the same leaf uplinks (leaf 0 up, leaf 1 up): 16 flows on
        // each one's 16 links.
        let leaf = &report.levels[1];
        assert_eq!(
            (leaf.level, leaf.routing, leaf.uplinks),
            (1, Routing::Ecmp, 2)
        );
        assert!((leaf.flows - 16.0).abs() < 1e-9);
        assert_eq!(leaf.links, 16);
        assert!((leaf.fullest - expected_fullest(16.0, 16)).abs() < 1e-9);
        assert!((leaf.share - 1.0 / expected_fullest(16.0, 16)).abs() < 1e-9);
        assert!(report.slowdown() > expected_fullest(8.0, 16) * 0.99);
        // Hosts' NICs balance (adaptive): line rate.
        assert_eq!(report.levels[0].share, 1.0);
        // Elsewhere (leaves 2 and 3) only its own 8 flows collide.
        let c: Vec<u32> = (32..40).chain(48..56).collect();
        let quiet = collisions(&s, &job, &c).unwrap();
        assert!(quiet.seconds < report.seconds);
        assert!((quiet.levels[1].fullest - expected_fullest(8.0, 16)).abs() < 1e-9);
    }

    #[test]
    fn hashed_routing_is_refused_where_there_are_no_uplinks() {
        let top = tree(4, 8, 2).with_routing(
            vec![Routing::Adaptive, Routing::Adaptive, Routing::Ecmp],
            vec![],
        );
        assert!(top.unwrap_err().to_string().contains("top level"));
        assert!(tree(4, 8, 2).with_routing(vec![], vec![1, 0, 1]).is_err());
        assert!(tree(4, 8, 2)
            .with_routing(
                vec![Routing::Sharp, Routing::Adaptive, Routing::Sharp],
                vec![]
            )
            .is_ok());
    }
}

#[cfg(test)]
mod port_rate_tests {
    use super::*;
    use crate::job::testing::tp_dp_job;
    use crate::topology::tests::tree;
    use std::sync::Arc;

    #[test]
    fn rails_hash_apart() {
        // One group is the plain balls-into-bins maximum.
        for (b, m) in [(8.0, 8usize), (16.0, 16), (64.0, 64), (300.0, 200)] {
            assert_eq!(expected_fullest_in_groups(b, m, 1), expected_fullest(b, m));
        }
        // 64 flows on 64 links: 3.96 pooled, 3.61 when 8 rails of 8 links take 8 flows each
        // (each rail's maximum is 2.60, the fullest of eight such rails 3.61); 32 on 32 in 4
        // rails 3.29.
        assert!((expected_fullest_in_groups(64.0, 64, 1) - 3.9577).abs() < 1e-4);
        assert!((expected_fullest_in_groups(64.0, 64, 8) - 3.6070).abs() < 1e-4);
        assert!((expected_fullest_in_groups(32.0, 32, 4) - 3.2926).abs() < 1e-4);
        assert!((expected_fullest_in_groups(16.0, 16, 4) - 2.6577).abs() < 1e-4);
        // A rail of one link carries its rail's flows whatever the hashing.
        assert_eq!(expected_fullest_in_groups(8.0, 4, 4), 2.0);
        // More groups than bins: one bin each.
        assert_eq!(expected_fullest_in_groups(6.0, 3, 5), 2.0);
        // Beyond the exact range the Poisson form ignores grouping.
        assert_eq!(
            expected_fullest_in_groups(4000.0, 400, 8),
            expected_fullest(4000.0, 400)
        );
    }

    #[test]
    fn links_run_at_the_nic_port_rate() {
        // 8 GPUs and 4 NICs per host (two GPUs per NIC), one host per leaf, ECMP on the leaves'
        // uplinks. A NIC port runs at 2 x 25 GB/s: the leaf's 200 GB/s uplink is 4 links, not
        // 8, in 4 rails of one link each.
        let shared = || tree(2, 8, 1).with_fabric(vec![0.0], vec![4]).unwrap();
        let topo = shared()
            .with_routing(
                vec![Routing::Adaptive, Routing::Ecmp, Routing::Adaptive],
                vec![1, 1, 1],
            )
            .unwrap();
        let leaf = topo.uplink_id(1, 0).unwrap();
        assert_eq!(topo.gpus_per_nic(0), 2.0);
        assert_eq!(topo.link_rate(leaf), 50.0);
        assert_eq!(topo.uplink_links(leaf), 4);
        assert_eq!(topo.uplink_rails(leaf), 4);
        // Without NICs listed: a link per GPU at the per-GPU rate, no rails.
        let plain = tree(2, 8, 1);
        let pleaf = plain.uplink_id(1, 0).unwrap();
        assert_eq!(
            (
                plain.link_rate(pleaf),
                plain.uplink_links(pleaf),
                plain.uplink_rails(pleaf)
            ),
            (25.0, 8, 1)
        );
        // tp 8 x dp 2: eight dp rings of two, GPU i of one host to GPU i of the other. Each
        // ring's hop drives one NIC (two shares, 50 GB/s); two rings share each NIC, so each
        // rail's link carries two of them: exactly half of the priced rate (before, the 8
        // flows counted as 16 per-GPU connections on 8 per-GPU links: 1 / 4.20).
        let job = tp_dp_job(&topo, 8, 2);
        let gpus: Vec<u32> = (0..16).collect();
        let hashed = crate::cost::evaluate(&topo, &job, &gpus).unwrap();
        let open = crate::cost::evaluate(&shared(), &job, &gpus).unwrap();
        assert_eq!(hashed.class_seconds[0], open.class_seconds[0]);
        let latency = 2.0 * 4e-6;
        let ratio = (hashed.class_seconds[1] - latency) / (open.class_seconds[1] - latency);
        assert!((ratio - 2.0).abs() < 1e-9, "{ratio}");
        let state = ClusterState::new(Arc::new(topo.clone()));
        let report = collisions(&state, &job, &gpus).unwrap();
        let level = &report.levels[1];
        assert_eq!((level.links, level.fullest, level.share), (4, 2.0, 0.5));
        // 8 flows (one per ring, at the port rate) up each of the two leaves.
        assert!((level.flows - 16.0).abs() < 1e-9);
        // Top-of-rack leaves: the 8 port-rate flows hash over all 4 links.
        let tor = topo
            .clone()
            .with_rail_alignment(vec![true, false, true])
            .unwrap();
        let r = crate::cost::evaluate(&tor, &job, &gpus).unwrap();
        let ratio = (r.class_seconds[1] - latency) / (open.class_seconds[1] - latency);
        assert!((ratio - expected_fullest(8.0, 4)).abs() < 1e-9, "{ratio}");
    }

    #[test]
    fn rails_split_a_leafs_uplink() {
        // Four hosts of 8 GPUs with 8 NICs (one per GPU, 8 rails) under each leaf, two leaves,
        // ECMP: the leaf's uplink has 32 links, 4 per rail. The dp rings of a tp 8 x dp 2 job
        // spread 4 + 4 hosts over the leaves: each rail's 4 links take that rail's flows only.
        let topo = tree(8, 8, 4)
            .with_fabric(vec![0.0], vec![8])
            .unwrap()
            .with_routing(
                vec![Routing::Adaptive, Routing::Ecmp, Routing::Adaptive],
                vec![1, 1, 1],
            )
            .unwrap();
        let leaf = topo.uplink_id(1, 0).unwrap();
        assert_eq!((topo.uplink_links(leaf), topo.uplink_rails(leaf)), (32, 8));
        // GPU i of hosts 0 and 4 (leaves 0 and 1) in a dp ring: one flow per rail up each
        // leaf, alone on its rail's 4 links: no collision, where 8 flows pooled on 32 links
        // would put up to 2 on one.
        let job = tp_dp_job(&topo, 8, 2);
        let gpus: Vec<u32> = (0..8).chain(32..40).collect();
        let state = ClusterState::new(Arc::new(topo.clone()));
        let report = collisions(&state, &job, &gpus).unwrap();
        assert_eq!(report.levels[1].fullest, 1.0);
        assert!(expected_fullest(8.0, 32) > 1.5);
        assert_eq!(report.slowdown(), 1.0);
        // The same leaves cabled top-of-rack (not rail-aligned): the 8 flows hash over all 32.
        let tor = topo
            .clone()
            .with_rail_alignment(vec![true, false, true])
            .unwrap();
        assert_eq!(tor.uplink_rails(leaf), 1);
        let state = ClusterState::new(Arc::new(tor));
        let report = collisions(&state, &job, &gpus).unwrap();
        assert!((report.levels[1].fullest - expected_fullest(8.0, 32)).abs() < 1e-9);
        assert!(report.slowdown() > 1.0);
        // All levels aligned is the default; a wrong count is refused.
        assert_eq!(
            topo.clone()
                .with_rail_alignment(vec![true; 3])
                .unwrap()
                .uplink_rails(leaf),
            8
        );
        assert!(topo.clone().with_rail_alignment(vec![false]).is_err());
    }
}
