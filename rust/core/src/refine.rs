//! Local search on a placement, on the true objective of the one cost model.
//!
//! Moves: swap the GPUs of two ranks of the job, or move a rank to a GPU that is free (or that
//! the starting placement held). Candidates are drawn next to the rank's communication
//! partners: pick a collective (or explicit-traffic edge) of a rank, a partner in it, and a
//! random GPU in a domain of the partner's at a random level up to the group's span. A move is
//! priced incrementally (only the collectives of the moved ranks are re-priced; a class's cost
//! is the slowest of its collectives) and kept when it lowers the objective lexicographically:
//! first the step time (`comm_seconds`), then the sum of all collective times (so improving a
//! group that is not the slowest still counts, which lets the search leave plateaus); moves
//! that do not make it worse are kept, worse ones with a falling probability (annealing), and
//! the best placement seen is returned. A move that breaks a confinement rule or `max_span` is never kept, so the result is never worse
//! than the start and stays feasible. Deterministic for a seed and an iteration budget; the
//! time limit only cuts the budget short.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::cost::{collective_cost, span_of, traffic_cost, Health};
use crate::error::Result;
use crate::job::JobSpec;
use crate::state::ClusterState;
use crate::topology::check_placement;
use crate::topology::{Csr, Topology};

#[derive(Debug, Clone)]
pub struct RefineOptions {
    pub time_limit: Duration,
    pub max_iterations: u64,
    pub seed: u64,
}

impl Default for RefineOptions {
    fn default() -> Self {
        RefineOptions {
            time_limit: Duration::from_millis(500),
            max_iterations: 200_000,
            seed: 0,
        }
    }
}

/// What a refinement did.
#[derive(Debug, Clone)]
pub struct RefineOutcome {
    pub gpus: Vec<u32>,
    pub start_seconds: f64,
    pub final_seconds: f64,
    pub iterations: u64,
    pub accepted: u64,
}

struct Search<'a> {
    topo: &'a Topology,
    job: &'a JobSpec,
    state: &'a ClusterState,
    gpus: Vec<u32>,
    rank_at: HashMap<u32, u32>,
    /// GPUs the starting placement held: usable even if the state says they are allocated.
    start_set: HashMap<u32, ()>,
    collectives_of_rank: Csr,
    traffic_of_rank: Csr,
    collective_time: Vec<f64>,
    class_members: Vec<Vec<u32>>,
    class_time: Vec<f64>,
    /// Confined dimension groups: members, and the limit level.
    confined_groups: Vec<(Vec<u32>, usize)>,
    groups_of_rank: Csr,
    traffic_time: f64,
    sum_time: f64,
    scratch: Vec<u32>,
    anchor_domain: usize,
    /// Degraded hardware scales the bandwidth of the paths through it.
    health: Health<'a>,
}

fn csr(rows: usize, pairs: &[(usize, u32)]) -> Csr {
    let mut offsets = vec![0usize; rows + 1];
    for &(r, _) in pairs {
        offsets[r + 1] += 1;
    }
    for i in 0..rows {
        offsets[i + 1] += offsets[i];
    }
    let mut fill = offsets.clone();
    let mut items = vec![0u32; pairs.len()];
    for &(r, v) in pairs {
        items[fill[r]] = v;
        fill[r] += 1;
    }
    Csr { offsets, items }
}

impl<'a> Search<'a> {
    fn new(state: &'a ClusterState, job: &'a JobSpec, start: &[u32]) -> Search<'a> {
        let topo = state.topology().as_ref();
        let n = job.num_ranks;
        let mut pairs = Vec::new();
        for (ci, c) in job.collectives.iter().enumerate() {
            for &r in job.groups.row(c.group as usize) {
                pairs.push((r as usize, ci as u32));
            }
        }
        let collectives_of_rank = csr(n, &pairs);
        let mut tpairs = Vec::new();
        for (ti, &(a, b, _)) in job.traffic.iter().enumerate() {
            tpairs.push((a as usize, ti as u32));
            if a != b {
                tpairs.push((b as usize, ti as u32));
            }
        }
        let traffic_of_rank = csr(n, &tpairs);
        let mut class_members = vec![Vec::new(); job.num_classes];
        for (ci, c) in job.collectives.iter().enumerate() {
            class_members[c.class as usize].push(ci as u32);
        }
        let mut confined_groups = Vec::new();
        let mut gpairs = Vec::new();
        for (d, dim) in job.dims.iter().enumerate() {
            let Some(limit) = dim.confine else { continue };
            if dim.size < 2 || limit >= job.max_span {
                continue;
            }
            for group in job.dim_groups(d) {
                for &r in &group {
                    gpairs.push((r as usize, confined_groups.len() as u32));
                }
                confined_groups.push((group, limit));
            }
        }
        let groups_of_rank = csr(n, &gpairs);
        let mut s = Search {
            topo,
            job,
            state,
            gpus: start.to_vec(),
            rank_at: start
                .iter()
                .enumerate()
                .map(|(r, &g)| (g, r as u32))
                .collect(),
            start_set: start.iter().map(|&g| (g, ())).collect(),
            collectives_of_rank,
            traffic_of_rank,
            collective_time: vec![0.0; job.collectives.len()],
            class_members,
            class_time: vec![0.0; job.num_classes],
            confined_groups,
            groups_of_rank,
            traffic_time: 0.0,
            sum_time: 0.0,
            scratch: Vec::new(),
            anchor_domain: topo.domain_of(start[0] as usize, job.max_span),
            health: Health::with_neighbours(state, start),
        };
        for ci in 0..job.collectives.len() {
            s.collective_time[ci] = s.price(ci);
        }
        for class in 0..job.num_classes {
            s.class_time[class] = s.class_max(class);
        }
        s.sum_time = s.collective_time.iter().sum();
        s.traffic_time = job
            .traffic
            .iter()
            .map(|&(a, b, t)| {
                traffic_cost(
                    topo,
                    s.health,
                    s.gpus[a as usize] as usize,
                    s.gpus[b as usize] as usize,
                    t,
                )
            })
            .sum();
        s
    }

    fn price(&mut self, ci: usize) -> f64 {
        let c = &self.job.collectives[ci];
        self.scratch.clear();
        let gpus = &self.gpus;
        self.scratch.extend(
            self.job
                .groups
                .row(c.group as usize)
                .iter()
                .map(|&r| gpus[r as usize]),
        );
        c.count
            * collective_cost(
                self.topo,
                c.kind,
                c.bytes,
                &mut self.scratch,
                None,
                c.count,
                self.health,
            )
    }

    fn class_max(&self, class: usize) -> f64 {
        self.class_members[class]
            .iter()
            .map(|&ci| self.collective_time[ci as usize])
            .fold(0.0, f64::max)
    }

    fn objective(&self) -> (f64, f64) {
        (
            self.class_time.iter().sum::<f64>() + self.traffic_time,
            self.sum_time + self.traffic_time,
        )
    }

    fn available(&self, gpu: u32) -> bool {
        self.state.is_free(gpu as usize) || self.start_set.contains_key(&gpu)
    }

    fn confined_ok(&mut self, ranks: &[u32]) -> bool {
        for &r in ranks {
            for &gi in self.groups_of_rank.row(r as usize) {
                let (group, limit) = &self.confined_groups[gi as usize];
                self.scratch.clear();
                self.scratch
                    .extend(group.iter().map(|&m| self.gpus[m as usize]));
                if span_of(self.topo, &self.scratch).unwrap_or(0) > *limit {
                    return false;
                }
            }
        }
        true
    }

    /// Re-price everything the moved ranks take part in; returns the undo log.
    fn reprice(&mut self, ranks: &[u32]) -> Vec<(usize, f64)> {
        let mut undo = Vec::new();
        let mut touched_classes: Vec<usize> = Vec::new();
        for &r in ranks {
            let row: Vec<u32> = self.collectives_of_rank.row(r as usize).to_vec();
            for ci in row {
                let ci = ci as usize;
                if undo.iter().any(|&(c, _)| c == ci) {
                    continue;
                }
                let old = self.collective_time[ci];
                let new = self.price(ci);
                undo.push((ci, old));
                self.collective_time[ci] = new;
                self.sum_time += new - old;
                let class = self.job.collectives[ci].class as usize;
                if !touched_classes.contains(&class) {
                    touched_classes.push(class);
                }
            }
        }
        for class in touched_classes {
            self.class_time[class] = self.class_max(class);
        }
        undo
    }

    fn traffic_delta(&self, ranks: &[u32], before: &[u32]) -> f64 {
        // Edges touching the moved ranks, each once, priced before and after.
        let mut seen: Vec<u32> = Vec::new();
        let mut delta = 0.0;
        for &r in ranks {
            for &ti in self.traffic_of_rank.row(r as usize) {
                if seen.contains(&ti) {
                    continue;
                }
                seen.push(ti);
                let (a, b, t) = self.job.traffic[ti as usize];
                let old_gpu = |x: u32| {
                    ranks
                        .iter()
                        .position(|&m| m == x)
                        .map(|i| before[i])
                        .unwrap_or(self.gpus[x as usize])
                };
                let old = traffic_cost(
                    self.topo,
                    self.health,
                    old_gpu(a) as usize,
                    old_gpu(b) as usize,
                    t,
                );
                let new = traffic_cost(
                    self.topo,
                    self.health,
                    self.gpus[a as usize] as usize,
                    self.gpus[b as usize] as usize,
                    t,
                );
                delta += new - old;
            }
        }
        delta
    }

    /// A random GPU in the level-`level` domain of `gpu`.
    fn random_gpu_near(&self, rng: &mut ChaCha8Rng, gpu: u32, level: usize) -> u32 {
        let mut domain = self.topo.domain_of(gpu as usize, level);
        let mut l = level;
        while l > 0 {
            let kids = self.topo.children(l, domain);
            domain = kids[rng.gen_range(0..kids.len())] as usize;
            l -= 1;
        }
        let members = self.topo.lowest_members(domain);
        members[rng.gen_range(0..members.len())]
    }

    /// Propose one move for a random rank; returns (ranks moved, their GPUs before).
    fn propose(&mut self, rng: &mut ChaCha8Rng) -> Option<(Vec<u32>, Vec<u32>)> {
        let n = self.job.num_ranks;
        let a = rng.gen_range(0..n) as u32;
        let partner = {
            let colls = self.collectives_of_rank.row(a as usize);
            let edges = self.traffic_of_rank.row(a as usize);
            if colls.is_empty() && edges.is_empty() {
                return None;
            }
            let pick = rng.gen_range(0..colls.len() + edges.len());
            if pick < colls.len() {
                let group = self
                    .job
                    .groups
                    .row(self.job.collectives[colls[pick] as usize].group as usize);
                group[rng.gen_range(0..group.len())]
            } else {
                let (x, y, _) = self.job.traffic[edges[pick - colls.len()] as usize];
                if x == a {
                    y
                } else {
                    x
                }
            }
        };
        if partner == a {
            return None;
        }
        let ga = self.gpus[a as usize];
        let gp = self.gpus[partner as usize];
        let span = self.topo.lca(ga as usize, gp as usize);
        let level = rng.gen_range(0..=span.min(self.job.max_span));
        let target = self.random_gpu_near(rng, gp, level);
        if target == ga {
            return None;
        }
        match self.rank_at.get(&target).copied() {
            Some(b) => {
                self.gpus.swap(a as usize, b as usize);
                Some((vec![a, b], vec![ga, target]))
            }
            None => {
                if !self.available(target)
                    || self.topo.domain_of(target as usize, self.job.max_span) != self.anchor_domain
                {
                    return None;
                }
                self.gpus[a as usize] = target;
                Some((vec![a], vec![ga]))
            }
        }
    }

    fn commit_positions(&mut self, ranks: &[u32], before: &[u32]) {
        for &g in before {
            if self.rank_at.get(&g).is_some_and(|&r| ranks.contains(&r)) {
                self.rank_at.remove(&g);
            }
        }
        for &r in ranks {
            self.rank_at.insert(self.gpus[r as usize], r);
        }
    }

    fn revert(&mut self, ranks: &[u32], before: &[u32], undo: Vec<(usize, f64)>) {
        for (i, &r) in ranks.iter().enumerate() {
            self.gpus[r as usize] = before[i];
        }
        let mut classes = Vec::new();
        for (ci, old) in undo {
            self.sum_time += old - self.collective_time[ci];
            self.collective_time[ci] = old;
            let class = self.job.collectives[ci].class as usize;
            if !classes.contains(&class) {
                classes.push(class);
            }
        }
        for class in classes {
            self.class_time[class] = self.class_max(class);
        }
    }
}

fn better(new: (f64, f64), old: (f64, f64)) -> bool {
    let tol = 1e-12 * old.0.abs().max(1e-30);
    new.0 < old.0 - tol || (new.0 <= old.0 + tol && new.1 < old.1 - 1e-12 * old.1.abs().max(1e-30))
}

/// Improve `start` (a valid placement of `job` on GPUs that are free in `state` or held by
/// the job itself) within the options' budget. Never returns a worse placement.
pub fn refine(
    state: &ClusterState,
    job: &JobSpec,
    start: &[u32],
    opts: &RefineOptions,
) -> Result<RefineOutcome> {
    let topo = state.topology().as_ref();
    check_placement(topo, job.num_ranks, start)?;
    let began = Instant::now();
    let mut search = Search::new(state, job, start);
    let start_objective = search.objective();
    let mut current = start_objective;
    let mut best = start_objective;
    let mut best_gpus = search.gpus.clone();
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut iterations = 0u64;
    let mut accepted = 0u64;
    // Annealing on the step time: worse moves are taken with probability exp(-delta / T),
    // T falling from 2 % of the start cost to zero; equal moves are always taken, so the
    // search walks across plateaus (a ring split 4 + 4 over two hosts needs several sideways
    // moves before one that lowers the cost).
    let initial_temperature = 0.02 * start_objective.0;
    let limit = opts.time_limit.as_secs_f64().max(1e-9);
    if job.num_ranks >= 2 {
        let mut progress = 0.0f64;
        while iterations < opts.max_iterations {
            if iterations % 256 == 0 {
                let elapsed = began.elapsed().as_secs_f64();
                if elapsed >= limit || crate::interrupt::interrupted() {
                    break;
                }
                progress = (iterations as f64 / opts.max_iterations as f64).max(elapsed / limit);
            }
            iterations += 1;
            let Some((ranks, before)) = search.propose(&mut rng) else {
                continue;
            };
            if !search.confined_ok(&ranks) {
                for (i, &r) in ranks.iter().enumerate() {
                    search.gpus[r as usize] = before[i];
                }
                continue;
            }
            let undo = search.reprice(&ranks);
            let traffic_delta = search.traffic_delta(&ranks, &before);
            search.traffic_time += traffic_delta;
            let candidate = search.objective();
            let temperature = initial_temperature * (1.0 - progress).powi(2);
            let take = !better(current, candidate)
                || (temperature > 0.0
                    && rng.gen::<f64>() < (-(candidate.0 - current.0) / temperature).exp());
            if take {
                current = candidate;
                accepted += 1;
                search.commit_positions(&ranks, &before);
                if better(current, best) {
                    best = current;
                    best_gpus.copy_from_slice(&search.gpus);
                }
            } else {
                search.traffic_time -= traffic_delta;
                search.revert(&ranks, &before, undo);
            }
        }
    }
    if topo.self_contends() {
        // The search prices each collective with its own flows and the neighbours'; the cost
        // model also charges its class's concurrent flows on oversubscribed or hashed uplinks. Keep the
        // result only when the full model agrees it is no worse.
        let start_seconds = crate::cost::evaluate_in(state, job, start)?.comm_seconds;
        let final_seconds = crate::cost::evaluate_in(state, job, &best_gpus)?.comm_seconds;
        let (gpus, final_seconds) = if final_seconds <= start_seconds {
            (best_gpus, final_seconds)
        } else {
            (start.to_vec(), start_seconds)
        };
        return Ok(RefineOutcome {
            start_seconds,
            final_seconds,
            gpus,
            iterations,
            accepted,
        });
    }
    Ok(RefineOutcome {
        start_seconds: start_objective.0,
        final_seconds: best.0,
        gpus: best_gpus,
        iterations,
        accepted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::evaluate;
    use crate::topology::tests::tree;
    use rand::seq::SliceRandom;
    use std::sync::Arc;

    /// Two rings of 8 ranks with scrambled labels: the optimum puts each ring in one node.
    #[test]
    fn unscrambles_two_rings() {
        let topo = Arc::new(tree(4, 8, 2));
        let state = ClusterState::new(topo.clone());
        let mut labels: Vec<u32> = (0..16).collect();
        labels.shuffle(&mut ChaCha8Rng::seed_from_u64(5));
        let mut traffic = Vec::new();
        for ring in 0..2u32 {
            for i in 0..8u32 {
                let (a, b) = (ring * 8 + i, ring * 8 + (i + 1) % 8);
                traffic.push((labels[a as usize], labels[b as usize], 1e9));
            }
        }
        let job = JobSpec::new(16, vec![], 2, vec![0], vec![], vec![], traffic, &topo).unwrap();
        let start: Vec<u32> = (0..16).collect();
        let before = evaluate(&topo, &job, &start).unwrap().comm_seconds;
        let opts = RefineOptions {
            max_iterations: 50_000,
            time_limit: Duration::from_secs(10),
            seed: 1,
        };
        let out = refine(&state, &job, &start, &opts).unwrap();
        let after = evaluate(&topo, &job, &out.gpus).unwrap().comm_seconds;
        let optimum = 16.0 * 1e9 / 450e9;
        assert!(after < before, "{after} >= {before}");
        assert!(
            (after - optimum).abs() < 1e-9,
            "{after} vs optimum {optimum}"
        );
        assert!(
            (out.final_seconds - after).abs() < 1e-9,
            "incremental cost drifted"
        );
    }
}
