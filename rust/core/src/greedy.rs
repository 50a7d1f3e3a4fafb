//! Hierarchical best-fit placement.
//!
//! The job is packed in *units*: at level `l` a unit is the block of `u_l` consecutive layout
//! positions that must share one level-`l` domain (the product of the degrees of the dimensions
//! confined at or below `l`; the whole job at and above `max_span`). The confined dimensions
//! are laid out innermost, so a unit always holds whole confined groups.
//!
//! 1. Capacity, bottom-up from the per-domain free counters: a level-0 domain holds
//!    `u_0 * floor(free / u_0)` GPUs; a level-`l` domain holds `u_l * floor(sum of its
//!    children's capacities / u_l)`. No GPU is scanned.
//! 2. The lowest level with a domain whose capacity covers the job; the tightest such domain
//!    (best fit: least capacity, then fewest free GPUs, then lowest id).
//! 3. Fill it recursively: a child that can take the whole demand gets it (tightest such
//!    child); otherwise the largest children are taken whole and the remainder goes to the
//!    tightest child that holds it, so the job touches as few domains as possible and the
//!    free capacity left behind stays in large blocks.
//! 4. Ranks follow the layout order: confined dimensions first (by level), then the others by
//!    bytes per step, heaviest innermost, so heavy traffic lands on the lowest levels.
//!
//! Degraded hardware (a GPU whose paths cross a degraded component; see [`crate::state`]) is
//! used only when it pays: when some free GPU is degraded, the packing runs twice, once over
//! the healthy free GPUs only and once over all of them, and the cheaper placement by the one
//! cost model wins (the healthy one on a tie). Inside a host, healthy GPUs are taken first.
//!
//! Contention (see [`crate::fabric`]): when running jobs load the fabric, the packing also
//! runs with the domains whose uplinks are hot (over a share of their capacity with one more
//! flow) held back, and every candidate is priced with the neighbours' load plus, unless
//! asked not to, the time it adds to the running jobs; the cheapest wins, so the job steers
//! clear of hot uplinks only when that lowers the cost. Among candidates equally cheap (to
//! rounding), the one sending fewer bytes above the first fabric tier (the spine) wins: on a
//! non-blocking fabric crossing the spine may cost a job nothing, but it loads links every job
//! shares and, where the fabric hashes flows, the ones where they collide.
//!
//! All-to-all (a job with an all-to-all over an unconfined dimension, MoE's `ep`): bytes per
//! step misjudge the layout there, since an all-to-all's fabric bytes per NVLink domain grow
//! with its ranks inside and a ring's do not; the other choices of innermost dimension are
//! priced, and the packing also runs on whole free NVLink domains only when the best so far
//! shares one.
//!
//! Spread (hosts whose links below the NVLink domain are slower than the fabric, as on PCIe
//! servers whose CPU sockets join at 16 GB/s under 400 Gb/s NICs): the packing also runs on a
//! view in which every NVLink domain offers only its freest domain of a level below it (one
//! PCIe switch per host), and the cheaper placement wins. A ring over several hosts, each
//! driving its NIC shares, can then beat one that crosses a host's CPU link ([`crate::nccl`]);
//! packing tight never tries it.

use std::borrow::Cow;

use crate::cost::CostReport;
use crate::error::{CoreError, Result};
use crate::job::JobSpec;
use crate::state::ClusterState;
use crate::topology::Topology;

/// The layout order (innermost first) of a job's dimensions: confined ones by level, then the
/// job's `inner_dim` if it names one, then by bytes per step, heaviest innermost.
pub fn layout_order(job: &JobSpec) -> Vec<usize> {
    let weights = job.dim_weights();
    let mut order: Vec<usize> = (0..job.dims.len()).collect();
    order.sort_by(|&a, &b| {
        let (da, db) = (&job.dims[a], &job.dims[b]);
        let la = da.confine.unwrap_or(usize::MAX);
        let lb = db.confine.unwrap_or(usize::MAX);
        la.cmp(&lb)
            .then((job.inner_dim != Some(a)).cmp(&(job.inner_dim != Some(b))))
            .then(
                weights[b]
                    .partial_cmp(&weights[a])
                    .unwrap_or(std::cmp::Ordering::Equal),
            )
            .then(a.cmp(&b))
    });
    order
}

/// Unit size per level: GPUs that must share one domain of that level.
pub fn unit_sizes(topo: &Topology, job: &JobSpec) -> Vec<usize> {
    (0..topo.num_levels())
        .map(|l| {
            if l >= job.max_span {
                job.num_ranks
            } else {
                job.dims
                    .iter()
                    .filter(|d| d.confine.is_some_and(|c| c <= l))
                    .map(|d| d.size)
                    .product()
            }
        })
        .collect()
}

/// Map layout positions (the order GPUs were chosen in) to ranks.
pub fn ranks_from_slots(job: &JobSpec, order: &[usize], slots: &[u32]) -> Vec<u32> {
    if job.dims.is_empty() {
        return slots.to_vec();
    }
    let strides = job.dim_strides();
    let mut gpus = vec![0u32; job.num_ranks];
    for (s, &gpu) in slots.iter().enumerate() {
        let mut rest = s;
        let mut rank = 0;
        for &d in order {
            let size = job.dims[d].size;
            rank += (rest % size) * strides[d];
            rest /= size;
        }
        gpus[rank] = gpu;
    }
    gpus
}

struct Packer<'a> {
    topo: &'a Topology,
    state: &'a ClusterState,
    units: Vec<usize>,
    /// Count only GPUs no degraded component slows down.
    healthy_only: bool,
    /// Count only the GPUs of domains of this level (the NVLink domain's) with every GPU free.
    whole_level: Option<usize>,
    /// `capacity[l][d]`, computed for levels 0..capacity.len().
    capacity: Vec<Vec<u64>>,
    /// `free_at[l][d]`, [`Packer::free`] of every domain of the levels computed so far: the
    /// state's own counters when every free GPU counts, a copy otherwise.
    free_at: Vec<Cow<'a, [u32]>>,
    slots: Vec<u32>,
}

impl<'a> Packer<'a> {
    /// Free GPUs of a domain this packing may use.
    #[inline]
    fn free(&self, l: usize, d: usize) -> u32 {
        if let Some(whole) = self.whole_level {
            if l <= whole {
                let mut a = d;
                for level in l..whole {
                    a = self.topo.parent(level, a).unwrap_or(a);
                }
                if self.state.free_count(whole, a) != self.topo.domain_size(whole, a) {
                    return 0;
                }
            } else {
                // Above the NVLink domain only whole ones count: the sum of the children's.
                return self
                    .topo
                    .children(l, d)
                    .iter()
                    .map(|&c| self.free(l - 1, c as usize))
                    .sum();
            }
        }
        let all = self.state.free_count(l, d);
        if self.healthy_only {
            all - self.state.free_degraded_count(l, d)
        } else {
            all
        }
    }

    /// [`Packer::free`] of every domain of level `l`, read from the state's counters when
    /// every free GPU counts (no per-domain call on thousands of hosts).
    fn free_level(&self, l: usize) -> Cow<'a, [u32]> {
        if self.whole_level.is_none() && !self.healthy_only {
            Cow::Borrowed(self.state.free_counts(l))
        } else {
            Cow::Owned(
                (0..self.topo.domain_count(l))
                    .map(|d| self.free(l, d))
                    .collect(),
            )
        }
    }

    fn compute_level(&mut self, l: usize) {
        let u = self.units[l] as u64;
        debug_assert_eq!(self.free_at.len(), l);
        let free = self.free_level(l);
        let caps: Vec<u64> = if l == 0 && u == 1 {
            // Units of one GPU (a job with no confinement at this level): every free GPU.
            free.iter().map(|&f| f as u64).collect()
        } else if l == 0 && u.is_power_of_two() {
            // Whole units of a power of two (a tp group of 8): a mask, not a division.
            free.iter().map(|&f| f as u64 & !(u - 1)).collect()
        } else if l == 0 {
            free.iter().map(|&f| u * (f as u64 / u)).collect()
        } else {
            let below = &self.capacity[l - 1];
            (0..self.topo.domain_count(l))
                .map(|d| {
                    let sum: u64 = self
                        .topo
                        .children(l, d)
                        .iter()
                        .map(|&c| below[c as usize])
                        .sum();
                    u * (sum / u)
                })
                .collect()
        };
        self.capacity.push(caps);
        self.free_at.push(free);
    }

    /// Raw capacity of a domain: what its children could hold before rounding to its unit.
    fn raw_capacity(&self, l: usize, d: usize) -> u64 {
        if l == 0 {
            self.free_at[0][d] as u64
        } else {
            self.topo
                .children(l, d)
                .iter()
                .map(|&c| self.capacity[l - 1][c as usize])
                .sum()
        }
    }

    fn tighter(&self, l: usize, a: usize, b: usize) -> bool {
        let key = |d: usize| (self.capacity[l][d], self.free_at[l][d], d);
        key(a) < key(b)
    }

    fn fill(&mut self, l: usize, d: usize, k: u64) {
        if l == 0 {
            self.pick_gpus(d, k as usize);
            return;
        }
        let children: Vec<usize> = self
            .topo
            .children(l, d)
            .iter()
            .map(|&c| c as usize)
            .filter(|&c| self.capacity[l - 1][c] > 0)
            .collect();
        let below = l - 1;
        let mut chosen: Vec<(usize, u64)> = Vec::new();
        let mut remaining = k;
        let mut used = vec![false; children.len()];
        let mut by_size: Vec<usize> = (0..children.len()).collect();
        by_size.sort_by(|&a, &b| {
            let (ca, cb) = (children[a], children[b]);
            self.capacity[below][cb]
                .cmp(&self.capacity[below][ca])
                .then(ca.cmp(&cb))
        });
        while remaining > 0 {
            let mut best: Option<usize> = None;
            for (i, &c) in children.iter().enumerate() {
                if !used[i]
                    && self.capacity[below][c] >= remaining
                    && best.is_none_or(|b| self.tighter(below, c, children[b]))
                {
                    best = Some(i);
                }
            }
            if let Some(i) = best {
                used[i] = true;
                chosen.push((children[i], remaining));
                break;
            }
            let Some(&i) = by_size.iter().find(|&&i| !used[i]) else {
                unreachable!("a domain's capacity never exceeds its children's");
            };
            used[i] = true;
            let take = self.capacity[below][children[i]];
            chosen.push((children[i], take));
            remaining -= take;
        }
        chosen.sort_unstable();
        for (c, amount) in chosen {
            self.fill(below, c, amount);
        }
    }

    /// Choose `k` free GPUs inside a level-0 domain. Where the host has a bandwidth matrix the
    /// subset with the best slowest pair (then the best total) wins; otherwise lowest ids.
    fn pick_gpus(&mut self, d: usize, k: usize) {
        let state = self.state;
        let mut free: Vec<u32> = self
            .topo
            .lowest_members(d)
            .iter()
            .copied()
            .filter(|&g| state.is_free(g as usize))
            .filter(|&g| !(self.healthy_only && state.is_degraded(g as usize)))
            .collect();
        // Healthy GPUs first (stable: lowest ids within each group).
        free.sort_by_key(|&g| state.is_degraded(g as usize));
        debug_assert!(free.len() >= k);
        let has_matrix = free.len() > k
            && k >= 2
            && self
                .topo
                .node_matrix_bandwidth(free[0] as usize, free[1] as usize)
                .is_some();
        if !has_matrix {
            self.slots.extend_from_slice(&free[..k]);
            return;
        }
        let best = best_subset(self.topo, &free, k);
        self.slots.extend(best);
    }
}

/// The k-subset of `free` (GPUs of one host) with the largest slowest-pair bandwidth, then the
/// largest total; exhaustive for small cases, greedy growth otherwise.
fn best_subset(topo: &Topology, free: &[u32], k: usize) -> Vec<u32> {
    let n = free.len();
    let bw = |i: usize, j: usize| topo.pair_bandwidth(free[i] as usize, free[j] as usize);
    let score = |set: &[usize]| {
        let mut min = f64::INFINITY;
        let mut sum = 0.0;
        for (x, &i) in set.iter().enumerate() {
            for &j in &set[x + 1..] {
                let b = bw(i, j);
                min = min.min(b);
                sum += b;
            }
        }
        (min, sum)
    };
    let better = |a: (f64, f64), b: (f64, f64)| a.0 > b.0 || (a.0 == b.0 && a.1 > b.1);
    // Exhaustive when C(n, k) is small (hosts have at most a few dozen GPUs).
    let mut combos: f64 = 1.0;
    for i in 0..k {
        combos = combos * (n - i) as f64 / (i + 1) as f64;
    }
    let chosen: Vec<usize> = if combos <= 20_000.0 {
        let mut idx: Vec<usize> = (0..k).collect();
        let mut best = idx.clone();
        let mut best_score = score(&idx);
        loop {
            // Next combination in lexicographic order.
            let mut i = k;
            while i > 0 && idx[i - 1] == n - k + i - 1 {
                i -= 1;
            }
            if i == 0 {
                break;
            }
            idx[i - 1] += 1;
            for j in i..k {
                idx[j] = idx[j - 1] + 1;
            }
            let s = score(&idx);
            if better(s, best_score) {
                best_score = s;
                best = idx.clone();
            }
        }
        best
    } else {
        let mut set = vec![0usize];
        while set.len() < k {
            let mut best: Option<(usize, (f64, f64))> = None;
            for c in 0..n {
                if set.contains(&c) {
                    continue;
                }
                let mut trial = set.clone();
                trial.push(c);
                let s = score(&trial);
                if best.is_none_or(|(_, bs)| better(s, bs)) {
                    best = Some((c, s));
                }
            }
            set.push(best.expect("enough free GPUs").0);
        }
        set.sort_unstable();
        set
    };
    chosen.into_iter().map(|i| free[i]).collect()
}

fn describe_confinement(topo: &Topology, job: &JobSpec) -> String {
    let parts: Vec<String> = job
        .dims
        .iter()
        .filter(|d| d.size > 1)
        .filter_map(|d| {
            d.confine.filter(|&c| c < job.max_span).map(|c| {
                format!(
                    "each {} group ({} GPUs) inside one {}",
                    d.name,
                    d.size,
                    topo.levels()[c].name
                )
            })
        })
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" with {}", parts.join(" and "))
    }
}

/// Place `job` on the free GPUs of `state`. Returns the GPU of each rank.
///
/// Besides the packing the job's own confinement rules ask for, it tries packings that also
/// keep the heaviest unconfined dimensions inside the smallest domain that holds their block
/// (e.g. the data-parallel groups of a tp x dp job inside one host when they fit), and keeps the
/// cheapest by the cost model. On a fragmented cluster the plain packing can cut such a group
/// across hosts where an aligned one would not; the variants cost one packing and one
/// evaluation each.
pub fn place(state: &ClusterState, job: &JobSpec) -> Result<Vec<u32>> {
    place_with(state, job, true)
}

/// [`place`], choosing among candidates by [`crate::fabric::placement_cost`]: with
/// `neighbours`, what the job adds to the running jobs counts too.
pub fn place_with(state: &ClusterState, job: &JobSpec, neighbours: bool) -> Result<Vec<u32>> {
    place_with_report(state, job, neighbours).map(|(gpus, _)| gpus)
}

/// [`place_with`], and the report of its answer when it priced that answer on `state` as the
/// placement gate prices it ([`crate::cost::evaluate_in`]), so the gate need not price the
/// same placement again.
pub fn place_with_report(
    state: &ClusterState,
    job: &JobSpec,
    neighbours: bool,
) -> Result<(Vec<u32>, Option<CostReport>)> {
    let (plain, report) = place_layouts(state, job)?;
    // A packing whose flows cross no uplink (a job inside one host) neither meets the
    // running jobs' load nor adds to it: the views that hold hot domains back cannot make it
    // cheaper, and building them costs more than the placement itself.
    if state.fabric_load().is_none()
        || crate::fabric::job_load(state.topology(), job, &plain).is_empty()
    {
        return Ok((plain, report));
    }
    let cost = |gpus: &[u32]| crate::fabric::placement_cost(state, job, gpus, neighbours);
    let mut best_cost = cost(&plain)?;
    let mut best = plain;
    let mut tried: Vec<Vec<(usize, usize)>> = Vec::new();
    for threshold in [1.0, 0.75, 0.5] {
        let hot = crate::fabric::hot_domains(state, threshold);
        if hot.is_empty() || tried.contains(&hot) {
            continue;
        }
        let Ok(view) = state.holding_back(&hot) else {
            continue;
        };
        tried.push(hot);
        let Ok((gpus, _)) = place_layouts(&view, job) else {
            continue;
        };
        let c = cost(&gpus)?;
        if c < best_cost * (1.0 - 1e-12) {
            best_cost = c;
            best = gpus;
        }
    }
    Ok((best, None))
}

/// The plain packing and the aligned variants; the cheapest by the cost model, with its
/// report on `state` when candidates were compared (None for the plain packing alone).
fn place_layouts(state: &ClusterState, job: &JobSpec) -> Result<(Vec<u32>, Option<CostReport>)> {
    let plain = place_health_aware(state, job)?;
    let variants = aligned_variants(state.topology(), job);
    if variants.is_empty() {
        return Ok((plain, None));
    }
    let topo = state.topology();
    let mut best = Cheapest::of(state, job, plain)?;
    // Which unconfined dimension goes innermost: bytes per step decide by default, but a
    // byte of all-to-all costs more than a byte of a ring all-reduce once it leaves the
    // NVLink domain. The plain packing is priced with each other choice; the cheapest order
    // is kept for every candidate below.
    let original = job;
    let mut job = job;
    let reordered: Vec<JobSpec> = inner_dim_variants(job);
    for candidate in &reordered {
        if best.offer(place_health_aware(state, candidate))? {
            job = candidate;
        }
    }
    let variants: Vec<JobSpec> = match job.inner_dim {
        None => variants,
        inner => variants
            .into_iter()
            .map(|mut v| {
                v.inner_dim = inner;
                v
            })
            .collect(),
    };
    for variant in &variants {
        best.offer(place_health_aware(state, variant))?;
    }
    // On a view the GPUs differ, and so may the cheapest order: the other orders are tried
    // there too.
    let others: Vec<&JobSpec> = std::iter::once(original)
        .chain(&reordered)
        .filter(|c| c.inner_dim != job.inner_dim)
        .collect();
    let candidates = || {
        std::iter::once(job)
            .chain(&variants)
            .chain(others.iter().copied())
    };
    // Whole NVLink domains. Best fit packs onto partly used domains first, which keeps whole
    // ones free for later jobs but can split the job's groups over more domains than whole
    // ones would: an all-to-all group of 16 ranks on hosts of 8 spread over three hosts sends
    // more of its bytes over the fabric, through fewer NICs, than on two. Whole free domains
    // are what Slurm's and Kueue's whole-node placements take; priced side by side, the
    // cheaper wins. Tried for jobs with an all-to-all, when the best so far spans several
    // domains, one of them shared: a ring's bytes over the fabric per domain do not grow with
    // its ranks inside, and on 90 fragmented cases of dense jobs (1:1 and 2:1 H100, A100) the
    // whole domains were never cheaper.
    if unconfined_all_to_all(original) && touches_shared_domains(state, &best.gpus) {
        for variant in candidates() {
            best.offer(pack(state, variant, Packing::WholeDomains))?;
        }
    }
    for level in spread_levels(topo) {
        let Some(view) = spread_view(state, level) else {
            continue;
        };
        for variant in candidates() {
            best.offer(place_health_aware(&view, variant))?;
        }
    }
    Ok((best.gpus, Some(best.report)))
}

/// The cheapest placement of a job offered so far on `state`: by comm seconds, then among
/// equally cheap ones the fewest bytes above the first fabric tier (spine bytes: shared with
/// every other job, and hashed on many fabrics); with its report.
struct Cheapest<'a> {
    state: &'a ClusterState,
    job: &'a JobSpec,
    key: (f64, f64),
    report: CostReport,
    gpus: Vec<u32>,
}

impl<'a> Cheapest<'a> {
    fn of(state: &'a ClusterState, job: &'a JobSpec, gpus: Vec<u32>) -> Result<Cheapest<'a>> {
        let (key, report) = Self::price(state, job, &gpus)?;
        Ok(Cheapest {
            state,
            job,
            key,
            report,
            gpus,
        })
    }

    fn price(
        state: &ClusterState,
        job: &JobSpec,
        gpus: &[u32],
    ) -> Result<((f64, f64), CostReport)> {
        let report = crate::cost::evaluate_in(state, job, gpus)?;
        Ok((
            (report.comm_seconds, spine_bytes(state.topology(), &report)),
            report,
        ))
    }

    /// Price a candidate (a packing that failed is no candidate) and keep it if cheaper;
    /// whether it was kept.
    fn offer(&mut self, candidate: Result<Vec<u32>>) -> Result<bool> {
        let Ok(gpus) = candidate else {
            return Ok(false);
        };
        let (key, report) = Self::price(self.state, self.job, &gpus)?;
        if !cheaper(key, self.key) {
            return Ok(false);
        }
        (self.key, self.report, self.gpus) = (key, report, gpus);
        Ok(true)
    }
}

/// Whether `gpus` span several NVLink domains and share one of them with free GPUs or other
/// jobs (a domain they do not fill).
fn touches_shared_domains(state: &ClusterState, gpus: &[u32]) -> bool {
    let topo = state.topology();
    let nv = topo.nvlink_level();
    let mut domains: Vec<usize> = gpus
        .iter()
        .map(|&g| topo.domain_of(g as usize, nv))
        .collect();
    domains.sort_unstable();
    let mut runs = domains.chunk_by(|a, b| a == b);
    let Some(first) = runs.next() else {
        return false;
    };
    let mut several = false;
    let mut shared = first.len() < topo.domain_size(nv, first[0]) as usize;
    for run in runs {
        several = true;
        shared |= run.len() < topo.domain_size(nv, run[0]) as usize;
    }
    several && shared
}

/// Bytes per step whose lowest common level is above the first level over the NVLink domain
/// (the spine and up).
fn spine_bytes(topo: &Topology, report: &crate::cost::CostReport) -> f64 {
    report
        .bytes_by_level
        .iter()
        .skip(topo.nvlink_level() + 2)
        .sum()
}

/// `(seconds, spine bytes)` strictly better: cheaper, or as cheap (to rounding) with fewer
/// spine bytes.
fn cheaper(candidate: (f64, f64), best: (f64, f64)) -> bool {
    candidate.0 < best.0 * (1.0 - 1e-12)
        || (candidate.0 <= best.0 * (1.0 + 1e-12) && candidate.1 < best.1 * (1.0 - 1e-9))
}

/// Levels below the NVLink domain worth spreading over: those whose domains' GPUs drive more
/// bandwidth to the fabric (level above the NVLink domain, times their NIC shares) than the
/// NVLink domain's slowest link gives a ring inside it.
fn spread_levels(topo: &Topology) -> Vec<usize> {
    let nv = topo.nvlink_level();
    let Some(fabric) = topo.levels().get(nv + 1) else {
        return Vec::new();
    };
    let inside = topo.effective_bandwidth(nv);
    (0..nv)
        .filter(|&l| {
            let k = topo.domain_sizes(l).iter().copied().max().unwrap_or(1);
            fabric.bandwidth_gbps * topo.max_nic_shares(k) > inside
        })
        .collect()
}

/// A view of `state` in which every NVLink domain offers only its freest domain of `level`
/// (ties: the lowest id); None when that holds nothing back.
fn spread_view(state: &ClusterState, level: usize) -> Option<ClusterState> {
    let topo = state.topology();
    let nv = topo.nvlink_level();
    let free = |g: usize| state.is_free(g);
    let mut free_in = vec![0u32; topo.domain_count(level)];
    for g in (0..topo.num_gpus()).filter(|&g| free(g)) {
        free_in[topo.domain_of(g, level)] += 1;
    }
    let mut keep = vec![usize::MAX; topo.domain_count(nv)];
    for g in (0..topo.num_gpus()).filter(|&g| free(g)) {
        let (unit, d) = (topo.domain_of(g, nv), topo.domain_of(g, level));
        let k = keep[unit];
        if k == usize::MAX || free_in[d] > free_in[k] || (free_in[d] == free_in[k] && d < k) {
            keep[unit] = d;
        }
    }
    let held: Vec<u32> = (0..topo.num_gpus())
        .filter(|&g| free(g) && keep[topo.domain_of(g, nv)] != topo.domain_of(g, level))
        .map(|g| g as u32)
        .collect();
    if held.is_empty() {
        return None;
    }
    let mut view = state.clone();
    view.set_fence(&held, true).ok()?;
    Some(view)
}

/// Whether an all-to-all runs over an unconfined dimension of two or more ranks.
fn unconfined_all_to_all(job: &JobSpec) -> bool {
    job.collectives.iter().any(|c| {
        c.kind == crate::job::CollectiveKind::AllToAll
            && c.dim.is_some_and(|d| {
                let dim = &job.dims[d as usize];
                dim.confine.is_none() && dim.size >= 2
            })
    })
}

/// The job with each unconfined dimension of two or more ranks other than the one its bytes
/// per step put innermost laid out innermost instead, when an all-to-all is among them; empty
/// otherwise.
fn inner_dim_variants(job: &JobSpec) -> Vec<JobSpec> {
    let free: Vec<usize> = layout_order(job)
        .into_iter()
        .filter(|&d| job.dims[d].confine.is_none() && job.dims[d].size >= 2)
        .collect();
    // Bytes decide well between rings: a ring's bytes over the fabric per NVLink domain do not
    // grow with the ranks inside it. An all-to-all's do, so where one is among the choices the
    // orders are priced instead.
    if !unconfined_all_to_all(job) {
        return Vec::new();
    }
    free.iter()
        .skip(1)
        .map(|&d| {
            let mut variant = job.clone();
            variant.inner_dim = Some(d);
            variant
        })
        .collect()
}

/// The job with its unconfined dimensions, heaviest first, progressively confined to the
/// lowest level whose largest domain holds their block (the product of the degrees laid out
/// inside it). These are preferences, tried by [`place`], never requirements.
fn aligned_variants(topo: &Topology, job: &JobSpec) -> Vec<JobSpec> {
    let mut block: usize = job
        .dims
        .iter()
        .filter(|d| d.confine.is_some_and(|c| c < job.max_span))
        .map(|d| d.size)
        .product();
    let mut variant = job.clone();
    let mut out = Vec::new();
    for d in layout_order(job) {
        if job.dims[d].confine.is_some() || job.dims[d].size < 2 {
            continue;
        }
        block *= job.dims[d].size;
        let fits = (0..job.max_span)
            .find(|&l| topo.domain_sizes(l).iter().copied().max().unwrap_or(0) as usize >= block);
        let Some(level) = fits else { break };
        variant.dims[d].confine = Some(level);
        out.push(variant.clone());
    }
    out
}

/// Pack on all free GPUs and, when some free GPUs are degraded, on the healthy ones only;
/// keep the cheaper.
fn place_health_aware(state: &ClusterState, job: &JobSpec) -> Result<Vec<u32>> {
    let any = pack(state, job, Packing::Any);
    if state.total_free_degraded() == 0 {
        return any;
    }
    let Ok(any) = any else { return any };
    match pack(state, job, Packing::HealthyOnly) {
        Ok(healthy) => {
            let cost =
                |gpus: &[u32]| crate::cost::evaluate_in(state, job, gpus).map(|r| r.comm_seconds);
            if cost(&healthy)? <= cost(&any)? {
                Ok(healthy)
            } else {
                Ok(any)
            }
        }
        Err(_) => Ok(any),
    }
}

/// Which free GPUs a packing may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Packing {
    Any,
    /// Only GPUs no degraded component slows down.
    HealthyOnly,
    /// Only NVLink domains with every GPU free.
    WholeDomains,
}

fn pack(state: &ClusterState, job: &JobSpec, packing: Packing) -> Result<Vec<u32>> {
    let topo = state.topology().as_ref();
    let n = job.num_ranks as u64;
    state.check_capacity(job.num_ranks)?;
    let total_free = state.total_free() as u64;
    let units = unit_sizes(topo, job);
    for (l, &u) in units.iter().enumerate().take(job.max_span + 1) {
        // Every domain holds a GPU: a unit of one always fits (and the largest domain need
        // not be looked for among thousands of hosts).
        if u <= 1 {
            continue;
        }
        let largest = topo.domain_sizes(l).iter().copied().max().unwrap_or(0) as usize;
        if u > largest {
            let level = &topo.levels()[l].name;
            let what = if l == job.max_span && u == job.num_ranks {
                format!("the job may span at most one {level}")
            } else {
                let names: Vec<&str> = job
                    .dims
                    .iter()
                    .filter(|d| d.size > 1 && d.confine.is_some_and(|c| c <= l))
                    .map(|d| d.name.as_str())
                    .collect();
                match names.as_slice() {
                    [one] => format!("each {one} group ({u} GPUs) must stay inside one {level}"),
                    many => format!(
                        "its {} groups together need {u} GPUs inside one {level}",
                        many.join(" and ")
                    ),
                }
            };
            return Err(CoreError::Infeasible(format!(
                "needs {n} GPUs: {what}, but the largest {level} has {largest} GPUs"
            )));
        }
    }
    let mut packer = Packer {
        topo,
        state,
        units,
        healthy_only: packing == Packing::HealthyOnly,
        whole_level: (packing == Packing::WholeDomains).then(|| topo.nvlink_level()),
        capacity: Vec::with_capacity(topo.num_levels()),
        free_at: Vec::with_capacity(topo.num_levels()),
        slots: Vec::with_capacity(job.num_ranks),
    };
    let mut found: Option<(usize, usize)> = None;
    for l in 0..=job.max_span {
        packer.compute_level(l);
        // The tightest domain that holds the job ([`Packer::tighter`]'s order), the best key
        // kept rather than recomputed at every comparison.
        let mut best: Option<(u64, u32, usize)> = None;
        let free = &packer.free_at[l];
        for (d, &capacity) in packer.capacity[l].iter().enumerate() {
            if capacity >= n {
                let key = (capacity, free[d], d);
                if best.is_none_or(|b| key < b) {
                    best = Some(key);
                }
            }
        }
        if let Some((_, _, d)) = best {
            found = Some((l, d));
            break;
        }
    }
    let Some((level, domain)) = found else {
        let l = job.max_span;
        let best = (0..topo.domain_count(l))
            .map(|d| packer.raw_capacity(l, d))
            .max()
            .unwrap_or(0);
        let scope = if topo.domain_count(l) == 1 {
            "across the cluster".to_string()
        } else {
            format!("inside one {}", topo.levels()[l].name)
        };
        return Err(CoreError::Infeasible(format!(
            "needs {n} GPUs {scope}{}; the free GPUs can hold only {best} that way now \
             ({total_free} GPUs are free in all)",
            describe_confinement(topo, job)
        )));
    };
    packer.fill(level, domain, n);
    debug_assert_eq!(packer.slots.len(), job.num_ranks);
    let order = layout_order(job);
    Ok(ranks_from_slots(job, &order, &packer.slots))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::evaluate;
    use crate::job::testing::tp_dp_job;
    use crate::topology::tests::tree;
    use std::sync::Arc;

    #[test]
    fn the_report_greedy_hands_the_gate_is_the_gates_own_price() {
        let topo = Arc::new(tree(8, 8, 4));
        let mut state = ClusterState::new(topo.clone());
        // Fragment the hosts so that the packings differ.
        state.allocate("a", &[0, 1, 2, 9, 10, 17]).unwrap();
        let job = tp_dp_job(&topo, 2, 8);
        assert!(!aligned_variants(&topo, &job).is_empty());
        let (gpus, report) = place_with_report(&state, &job, true).unwrap();
        let report = report.expect("candidates were compared");
        assert_eq!(
            report,
            crate::cost::evaluate_in(&state, &job, &gpus).unwrap()
        );
        let opts = crate::solvers::SolveOptions::default();
        let (gated, gated_report) = crate::gate::place(&state, &job, "greedy", &opts).unwrap();
        assert_eq!(gated, gpus);
        let confining = crate::solvers::confining("greedy");
        assert_eq!(
            gated_report,
            crate::gate::admit(&state, &job, &gpus, "greedy", confining).unwrap()
        );
    }

    #[test]
    fn equally_cheap_candidates_break_ties_on_spine_bytes() {
        assert!(cheaper((1.0, 5.0), (1.0, 9.0)));
        assert!(!cheaper((1.0, 9.0), (1.0, 5.0)));
        assert!(!cheaper((1.0, 5.0), (1.0, 5.0)));
        // Cost first: cheaper wins whatever its spine bytes, dearer loses.
        assert!(cheaper((0.9, 99.0), (1.0, 0.0)));
        assert!(!cheaper((1.1, 0.0), (1.0, 99.0)));
        // Spine bytes: levels above the first one over the NVLink domain (the spine here).
        let topo = tree(4, 8, 2);
        let job = tp_dp_job(&topo, 8, 2);
        let gpus: Vec<u32> = (0..8).chain(16..24).collect();
        let report = evaluate(&topo, &job, &gpus).unwrap();
        assert!(report.bytes_by_level[2] > 0.0);
        assert_eq!(spine_bytes(&topo, &report), report.bytes_by_level[2]);
        let near: Vec<u32> = (0..16).collect();
        assert_eq!(
            spine_bytes(&topo, &evaluate(&topo, &job, &near).unwrap()),
            0.0
        );
    }

    #[test]
    fn tp_groups_stay_in_nodes_on_a_fragmented_cluster() {
        let topo = Arc::new(tree(8, 8, 4));
        let mut s = ClusterState::new(topo.clone());
        // Leave 4 free GPUs in every node: a tp-8 group fits nowhere.
        for node in 0..8u32 {
            s.allocate(
                &format!("f{node}"),
                &(node * 8..node * 8 + 4).collect::<Vec<_>>(),
            )
            .unwrap();
        }
        let job8 = tp_dp_job(&topo, 8, 1);
        let err = place(&s, &job8).unwrap_err();
        assert!(err.to_string().contains("inside one node"), "{err}");
        let job4 = tp_dp_job(&topo, 4, 4);
        let gpus = place(&s, &job4).unwrap();
        let report = evaluate(&topo, &job4, &gpus).unwrap();
        assert!(report.confinement_ok, "{:?}", report.violations);
        // Best fit keeps it inside one leaf (4 nodes x 4 free GPUs).
        assert_eq!(report.span_level, Some(1));
    }

    /// tp 2 x dp 4 x pp 2 with heavy dp all-reduces, on 2 leaves of 4 hosts. The tightest
    /// leaf only has hosts with 6 free GPUs, which cut every dp group across hosts; the
    /// aligned variant takes two whole free hosts in the other leaf instead.
    #[test]
    fn keeps_heavy_dp_groups_inside_hosts_when_it_pays() {
        use crate::job::{Collective, CollectiveKind, Dim};
        let topo = Arc::new(tree(8, 8, 4));
        let mut s = ClusterState::new(topo.clone());
        for (i, host) in [0u32, 1, 2, 3, 6, 7].iter().enumerate() {
            s.allocate(&format!("bg{i}"), &[host * 8, host * 8 + 1])
                .unwrap();
        }
        let (tp, dp, pp) = (2usize, 4usize, 2usize);
        let rank = |t: usize, d: usize, p: usize| (t + tp * (d + dp * p)) as u32;
        let mut offsets = vec![0];
        let mut ranks = Vec::new();
        let mut collectives = Vec::new();
        let mut add = |members: Vec<u32>, kind, bytes: f64, dim: u32| {
            ranks.extend(members);
            offsets.push(ranks.len());
            collectives.push(Collective {
                group: (offsets.len() - 2) as u32,
                kind,
                bytes,
                count: 1.0,
                class: dim,
                dim: Some(dim),
            });
        };
        for d in 0..dp {
            for p in 0..pp {
                add(
                    (0..tp).map(|t| rank(t, d, p)).collect(),
                    CollectiveKind::AllReduce,
                    1e6,
                    0,
                );
            }
        }
        for t in 0..tp {
            for p in 0..pp {
                add(
                    (0..dp).map(|d| rank(t, d, p)).collect(),
                    CollectiveKind::AllReduce,
                    1e9,
                    1,
                );
            }
        }
        for t in 0..tp {
            for d in 0..dp {
                add(
                    vec![rank(t, d, 0), rank(t, d, 1)],
                    CollectiveKind::PointToPoint,
                    1e3,
                    2,
                );
            }
        }
        let dims = vec![
            Dim {
                name: "tp".into(),
                size: tp,
                confine: Some(0),
            },
            Dim {
                name: "dp".into(),
                size: dp,
                confine: None,
            },
            Dim {
                name: "pp".into(),
                size: pp,
                confine: None,
            },
        ];
        let job = JobSpec::new(16, dims, 2, offsets, ranks, collectives, vec![], &topo).unwrap();
        let gpus = place(&s, &job).unwrap();
        let hosts: std::collections::BTreeSet<u32> = gpus.iter().map(|g| g / 8).collect();
        assert_eq!(hosts, [4, 5].into_iter().collect(), "{gpus:?}");
        for t in 0..tp {
            for p in 0..pp {
                let group: Vec<u32> = (0..dp).map(|d| gpus[rank(t, d, p) as usize]).collect();
                assert_eq!(
                    crate::cost::span_of(&topo, &group),
                    Some(0),
                    "dp group {group:?}"
                );
            }
        }
    }

    #[test]
    fn small_job_takes_tightest_node() {
        let topo = Arc::new(tree(4, 8, 2));
        let mut s = ClusterState::new(topo.clone());
        s.allocate("x", &[16, 17, 18, 19, 20, 21]).unwrap();
        let job = tp_dp_job(&topo, 2, 1);
        let gpus = place(&s, &job).unwrap();
        assert_eq!(gpus, vec![22, 23]);
    }
}
