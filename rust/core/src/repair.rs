//! Repair of a running job after hardware under it failed, was drained or degraded.
//!
//! Every surviving rank keeps its GPU; the lost ranks (on GPUs that are no longer usable) get
//! free healthy GPUs, chosen in three steps:
//!
//! 1. **Confinement first.** A job's confined dimensions define nested *units*: at level `c`,
//!    the ranks that differ only in dimensions confined at or below `c` must share one
//!    level-`c` domain (for the default rule, a tp group shares one NVLink domain). Lost ranks
//!    of a unit that still has survivors go inside the survivors' domain. When that domain has
//!    no room, the whole unit moves (its survivors too) and the repair says so; this repeats
//!    upward until everything fits or the job's own span (`max_span`) is exhausted.
//! 2. **Greedy by proximity.** A unit that moves whole goes to the domain nearest to where it
//!    was (lowest common level with its old GPUs), and among equally near ones to the tightest
//!    that holds it (best fit), healthy before degraded. A single rank takes the nearest free
//!    GPU to its old one. Near the old GPUs means near the job's other ranks, so the cost model
//!    usually agrees; step 3 checks it.
//! 3. **Local improvement.** Each moved piece is tried in the best alternative domain at every
//!    level up to its constraint (and the best healthy one), priced with the one cost model
//!    ([`crate::cost::evaluate_in`]), and kept where it is cheapest. With `max_moves = k`, up
//!    to k surviving ranks may then move too (whole lowest-level units at a time, a unit
//!    counted as its size, never breaking confinement) when that lowers the cost: the units
//!    that talk to the repaired ranks or sit on degraded hardware are tried next to the
//!    repaired ranks, in the nearest other domain and in the nearest healthy one.
//!
//! The same improvement runs when nothing was lost: a job slowed by a degraded NIC, host or
//! switch under one of its units is *evacuated* (the whole unit, e.g. a tp group, moves to
//! healthy hardware) when `max_moves` covers the unit and the cost goes down. Each move says
//! why: lost, its unit had to move, evacuated from a degraded component (the one that slowed
//! it most), or improvement.
//!
//! Candidates are GPUs that are unallocated and usable, plus reserved spares when allowed. A
//! repair that cannot be completed changes nothing and says what was missing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::cost::{evaluate_in, evaluate_moved, CostReport, MovedPricer};
use crate::error::{CoreError, Result};
use crate::job::JobSpec;
use crate::state::{ClusterState, Component};
use crate::topology::Topology;

/// Whether a repair may draw from the reserved spare GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparePolicy {
    /// Free GPUs and spares alike; the cost decides.
    Allow,
    /// Never spares.
    Forbid,
    /// Only spares.
    Only,
}

#[derive(Debug, Clone)]
pub struct RepairOptions {
    /// Surviving ranks that may move, beyond those that must, when that lowers the cost.
    pub max_moves: usize,
    pub spares: SparePolicy,
    /// Most full cost evaluations the improvement steps may spend.
    pub max_evaluations: usize,
    pub time_limit: Option<Duration>,
}

impl Default for RepairOptions {
    fn default() -> Self {
        RepairOptions {
            max_moves: 0,
            spares: SparePolicy::Allow,
            max_evaluations: 24,
            time_limit: None,
        }
    }
}

/// Why a rank moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveReason {
    /// Its GPU failed or was drained.
    Lost,
    /// Its unit confined at this level could not stay inside its domain, so the unit moved.
    UnitMoved { level: usize },
    /// Moved under `max_moves` because the cost went down.
    Improvement,
    /// Moved under `max_moves` off degraded hardware (the component that slowed it most),
    /// because the cost went down.
    Evacuated { component: Component },
}

#[derive(Debug, Clone, PartialEq)]
pub struct RankMove {
    pub rank: u32,
    pub old_gpu: u32,
    pub new_gpu: u32,
    pub reason: MoveReason,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RepairPlan {
    /// The new GPU of every rank.
    pub gpus: Vec<u32>,
    pub moves: Vec<RankMove>,
    /// Communication time per step (s) of the old placement, priced as if the lost hardware
    /// still worked (degradations included), and of the repaired one.
    pub cost_before: f64,
    pub cost_after: f64,
    /// The full cost reports behind `cost_before` and `cost_after` (the search priced both
    /// placements already; a caller need not price them again).
    pub report_before: CostReport,
    pub report_after: CostReport,
    pub evaluations: usize,
}

/// Plan the repair of job `name` (whose spec is `job`) and apply it to `state`, all or nothing.
pub fn repair(
    state: &mut ClusterState,
    job: &JobSpec,
    name: &str,
    opts: &RepairOptions,
) -> Result<RepairPlan> {
    let plan = plan(state, job, name, opts)?;
    if !plan.moves.is_empty() {
        state.replace_allocation(name, &plan.gpus)?;
    }
    Ok(plan)
}

/// A set of ranks placed together, for the improvement step.
#[derive(Debug, Clone)]
struct Piece {
    ranks: Vec<u32>,
    /// Index into `Ctx::levels` of the unit the piece forms (None: single ranks).
    unit_level: Option<usize>,
    /// The domain the piece must stay inside.
    constraint: (usize, usize),
}

enum Failure {
    /// Unit `unit` at confinement index `index` cannot keep its survivors' domain.
    Escalate { index: usize, unit: u32 },
    /// No room: what was needed, in words.
    NoRoom(String),
}

struct Ctx<'a> {
    topo: &'a Topology,
    state: &'a ClusterState,
    spares: SparePolicy,
    /// Distinct confinement levels below the job's span, ascending.
    levels: Vec<usize>,
    /// `unit_of[i][rank]`: the rank's unit at `levels[i]`.
    unit_of: Vec<Vec<u32>>,
    units: Vec<Vec<Vec<u32>>>,
    old: Vec<u32>,
    /// `moving[rank]`: why the rank needs a new GPU, if it does.
    moving: Vec<Option<MoveReason>>,
    new: Vec<u32>,
    taken: Vec<bool>,
    taken_list: Vec<u32>,
    taken_in: HashMap<(usize, usize), u32>,
    /// The domain the whole job must stay inside.
    job_domain: (usize, usize),
    pieces: Vec<Piece>,
    /// Prices the old placement and the trials (a trial only where it moved ranks; the job's
    /// own fabric load is not counted against its trials).
    pricer: MovedPricer<'a>,
}

const NONE: u32 = u32::MAX;

impl<'a> Ctx<'a> {
    #[inline]
    fn candidate(&self, g: usize) -> bool {
        if self.taken[g] {
            return false;
        }
        match self.spares {
            SparePolicy::Allow => self.state.is_free(g) || self.state.is_spare_free(g),
            SparePolicy::Forbid => self.state.is_free(g),
            SparePolicy::Only => self.state.is_spare_free(g),
        }
    }

    /// Candidate GPUs left in a domain.
    fn avail(&self, l: usize, d: usize) -> u32 {
        let base = match self.spares {
            SparePolicy::Allow => self.state.free_count(l, d) + self.state.spare_free_count(l, d),
            SparePolicy::Forbid => self.state.free_count(l, d),
            SparePolicy::Only => self.state.spare_free_count(l, d),
        };
        base - self.taken_in.get(&(l, d)).copied().unwrap_or(0)
    }

    /// Candidates in a domain that no degraded component slows down (approximate: degraded
    /// spares are not counted separately).
    fn healthy_avail(&self, l: usize, d: usize) -> u32 {
        self.avail(l, d)
            .saturating_sub(self.state.free_degraded_count(l, d))
    }

    fn take(&mut self, g: u32) {
        self.taken[g as usize] = true;
        self.taken_list.push(g);
        for l in 0..self.topo.num_levels() {
            *self
                .taken_in
                .entry((l, self.topo.domain_of(g as usize, l)))
                .or_insert(0) += 1;
        }
    }

    fn rollback(&mut self, mark: usize, pieces: usize) {
        while self.taken_list.len() > mark {
            let g = self.taken_list.pop().unwrap_or(0);
            self.taken[g as usize] = false;
            for l in 0..self.topo.num_levels() {
                if let Some(c) = self
                    .taken_in
                    .get_mut(&(l, self.topo.domain_of(g as usize, l)))
                {
                    *c -= 1;
                }
            }
        }
        self.pieces.truncate(pieces);
    }

    fn inside(&self, g: usize, (l, d): (usize, usize)) -> bool {
        self.topo.domain_of(g, l) == d
    }

    /// Level-`level` domains under domain `(l, d)`.
    fn descendants(&self, level: usize, (l, d): (usize, usize)) -> Vec<u32> {
        let mut frontier = vec![d as u32];
        for k in (level + 1..=l).rev() {
            frontier = frontier
                .iter()
                .flat_map(|&x| self.topo.children(k, x as usize).iter().copied())
                .collect();
        }
        frontier
    }

    /// Level-`level` domains inside `constraint` holding at least `need` candidates, nearest
    /// to `anchor` first, then healthy before degraded, then tightest, then lowest id. Stops
    /// after the first ring (set of equally near domains) that brings the list to `limit`.
    fn domains_near(
        &self,
        level: usize,
        need: u32,
        anchor: Option<usize>,
        constraint: (usize, usize),
        limit: usize,
    ) -> Vec<u32> {
        let key = |d: u32| {
            let d = d as usize;
            (self.healthy_avail(level, d) < need, self.avail(level, d), d)
        };
        let mut out = Vec::new();
        let start = match anchor {
            Some(a) if self.inside(a, constraint) => level,
            _ => constraint.0,
        };
        let mut below: Option<u32> = None;
        for l in start..=constraint.0 {
            let here = match anchor {
                Some(a) if self.inside(a, constraint) => self.topo.domain_of(a, l),
                _ => constraint.1,
            };
            let mut ring: Vec<u32> = if l == level {
                vec![here as u32]
            } else {
                self.topo
                    .children(l, here)
                    .iter()
                    .copied()
                    .filter(|&c| Some(c) != below)
                    .flat_map(|c| self.descendants(level, (l - 1, c as usize)))
                    .collect()
            };
            ring.retain(|&d| self.avail(level, d as usize) >= need);
            ring.sort_by_key(|&d| key(d));
            out.extend(ring);
            if out.len() >= limit {
                break;
            }
            below = Some(here as u32);
        }
        out
    }

    /// The candidate GPU nearest to `anchor` inside `constraint`.
    fn pick_gpu(&self, anchor: Option<usize>, constraint: (usize, usize)) -> Option<u32> {
        let domain = *self.domains_near(0, 1, anchor, constraint, 1).first()?;
        let members = self.topo.lowest_members(domain as usize);
        let healthy = members
            .iter()
            .copied()
            .find(|&g| self.candidate(g as usize) && !self.state.is_degraded(g as usize));
        healthy.or_else(|| {
            members
                .iter()
                .copied()
                .find(|&g| self.candidate(g as usize))
        })
    }

    /// The domain the survivors (ranks not moving) of a unit share at `level`, if they share
    /// one; `Err(())` when the unit has survivors in several domains.
    fn survivors_domain(
        &self,
        ranks: &[u32],
        level: usize,
    ) -> std::result::Result<Option<usize>, ()> {
        let mut domain = None;
        for &r in ranks {
            if self.moving[r as usize].is_some() {
                continue;
            }
            let d = self.topo.domain_of(self.old[r as usize] as usize, level);
            match domain {
                None => domain = Some(d),
                Some(x) if x != d => return Err(()),
                _ => {}
            }
        }
        Ok(domain)
    }

    /// Place the moving ranks `ranks` of one unit at confinement index `index` (or of the
    /// whole job when `index == levels.len()`) inside `constraint`.
    fn place_set(
        &mut self,
        ranks: &[u32],
        index: usize,
        constraint: (usize, usize),
    ) -> std::result::Result<(), Failure> {
        if index == 0 {
            for &r in ranks {
                let anchor = Some(self.old[r as usize] as usize);
                let Some(g) = self.pick_gpu(anchor, constraint) else {
                    return Err(Failure::NoRoom(format!(
                        "a free healthy GPU inside {}",
                        self.describe(constraint)
                    )));
                };
                self.take(g);
                self.new[r as usize] = g;
                self.pieces.push(Piece {
                    ranks: vec![r],
                    unit_level: None,
                    constraint,
                });
            }
            return Ok(());
        }
        let sub = index - 1;
        let level = self.levels[sub];
        // Group the moving ranks by their unit one level down.
        let mut groups: Vec<(u32, Vec<u32>)> = Vec::new();
        let mut pos: HashMap<u32, usize> = HashMap::new();
        for &r in ranks {
            let u = self.unit_of[sub][r as usize];
            let i = *pos.entry(u).or_insert_with(|| {
                groups.push((u, Vec::new()));
                groups.len() - 1
            });
            groups[i].1.push(r);
        }
        for (unit, members) in groups {
            let all = self.units[sub][unit as usize].clone();
            match self.survivors_domain(&all, level) {
                Ok(Some(d)) => {
                    // Survivors stay: the lost ranks go inside their domain, or the unit moves.
                    match self.place_set(&members, sub, (level, d)) {
                        Ok(()) => {}
                        Err(Failure::NoRoom(_)) => {
                            return Err(Failure::Escalate { index: sub, unit })
                        }
                        Err(other) => return Err(other),
                    }
                }
                Err(()) => {
                    // Already spread before the failure: keep what is left, no constraint here.
                    self.place_set(&members, sub, constraint)?;
                }
                Ok(None) => {
                    // The whole unit moves: the nearest domain that holds it.
                    let need = members.len() as u32;
                    let anchor = Some(self.old[members[0] as usize] as usize);
                    // The nearest few first; all of them only when those fail.
                    let near = self.domains_near(level, need, anchor, constraint, 4);
                    let mut placed = false;
                    let mut last = String::new();
                    let mut tried = near.clone();
                    let mut options = near;
                    let mut widened = false;
                    while let Some(x) = (!options.is_empty()).then(|| options.remove(0)) {
                        let mark = (self.taken_list.len(), self.pieces.len());
                        match self.place_set(&members, sub, (level, x as usize)) {
                            Ok(()) => {
                                placed = true;
                                break;
                            }
                            Err(Failure::NoRoom(why)) => {
                                last = why;
                                self.rollback(mark.0, mark.1);
                            }
                            Err(other) => return Err(other),
                        }
                        if options.is_empty() && !widened {
                            widened = true;
                            options = self
                                .domains_near(level, need, anchor, constraint, usize::MAX)
                                .into_iter()
                                .filter(|x| !tried.contains(x))
                                .collect();
                            tried.extend(options.iter().copied());
                        }
                    }
                    if !placed {
                        let mut why = format!(
                            "{need} free healthy GPUs inside one {} within {}",
                            self.topo.levels()[level].name,
                            self.describe(constraint)
                        );
                        if !last.is_empty() {
                            why = format!("{why} ({last})");
                        }
                        return Err(Failure::NoRoom(why));
                    }
                    self.pieces.push(Piece {
                        ranks: members.clone(),
                        unit_level: Some(sub),
                        constraint,
                    });
                }
            }
        }
        Ok(())
    }

    fn describe(&self, (l, d): (usize, usize)) -> String {
        let level = &self.topo.levels()[l].name;
        if self.topo.domain_count(l) == 1 {
            "the cluster".to_string()
        } else {
            format!("{level} #{d}")
        }
    }

    /// A trial's (rank, report): the cost it is compared by (the cost model's time, broken
    /// confinement ranked after any placement that keeps it) and its cost report (None for
    /// an invalid placement, ranked infinite).
    fn cost(&self, gpus: &[u32], evaluations: &mut usize) -> (f64, Option<CostReport>) {
        *evaluations += 1;
        self.pricer
            .evaluate(gpus)
            .ok()
            .map_or((f64::INFINITY, None), |r| (ranked(&r), Some(r)))
    }

    /// Where a piece could go instead: per level up to its constraint, the best domain away
    /// from where it is, and the best healthy one.
    fn alternatives(&self, piece: &Piece, anchor: usize) -> Vec<(usize, u32)> {
        let level = piece.unit_level.map(|i| self.levels[i]).unwrap_or(0);
        let need = piece.ranks.len() as u32;
        let here = self.topo.domain_of(anchor, level) as u32;
        let options = self.domains_near(level, need, Some(anchor), piece.constraint, usize::MAX);
        let mut out: Vec<(usize, u32)> = Vec::new();
        let mut seen_levels = Vec::new();
        for &x in &options {
            if x == here {
                continue;
            }
            let lca = self.topo.lca(
                anchor,
                self.topo.lowest_members(self.first_lowest(level, x))[0] as usize,
            );
            if !seen_levels.contains(&lca) {
                seen_levels.push(lca);
                out.push((level, x));
            }
        }
        if let Some(&x) = options
            .iter()
            .find(|&&x| x != here && self.healthy_avail(level, x as usize) >= need)
        {
            if !out.contains(&(level, x)) {
                out.push((level, x));
            }
        }
        out
    }

    fn first_lowest(&self, level: usize, d: u32) -> usize {
        let mut d = d as usize;
        for l in (1..=level).rev() {
            d = self.topo.children(l, d)[0] as usize;
        }
        d
    }

    /// The ranks that move with rank `r`: its unit at confinement index `lowest`, or itself.
    fn unit_at(&self, lowest: Option<usize>, r: usize) -> Vec<u32> {
        match lowest {
            Some(i) => self.units[i][self.unit_of[i][r] as usize].clone(),
            None => vec![r as u32],
        }
    }

    /// The domain a surviving unit (at confinement index `lowest`) must stay inside.
    fn unit_constraint(&self, gpus: &[u32], lowest: Option<usize>, unit: &[u32]) -> (usize, usize) {
        match lowest {
            Some(i) if i + 1 < self.levels.len() => {
                let l = self.levels[i + 1];
                (l, self.topo.domain_of(gpus[unit[0] as usize] as usize, l))
            }
            _ => self.job_domain,
        }
    }

    /// Every unit slowed most by the same degraded component, moved at once to the nearest
    /// healthy domains: one unit alone cannot lower the cost when its class is as slow as its
    /// slowest member and other units sit on the same switch. Returns the cheapest such move
    /// (cost, units, new GPUs in unit order) that lowers the cost below `best` within
    /// `moves_left` ranks.
    fn evacuate_together(
        &mut self,
        gpus: &[u32],
        lowest: Option<usize>,
        moves_left: usize,
        best: f64,
        evaluations: &mut usize,
    ) -> Option<Move> {
        let mut by_component: std::collections::BTreeMap<Component, Vec<Vec<u32>>> =
            Default::default();
        let mut seen = std::collections::HashSet::new();
        for (r, &g) in gpus.iter().enumerate() {
            if self.moving[r].is_some() {
                continue;
            }
            let Some((component, _)) = self.state.slowest_component(g as usize) else {
                continue;
            };
            let unit = self.unit_at(lowest, r);
            if unit.iter().any(|&x| self.moving[x as usize].is_some()) || !seen.insert(unit[0]) {
                continue;
            }
            by_component.entry(component).or_default().push(unit);
        }
        let level = lowest.map(|i| self.levels[i]).unwrap_or(0);
        let mut out: Option<Move> = None;
        for units in by_component.into_values() {
            let size: usize = units.iter().map(Vec::len).sum();
            if units.len() < 2 || size > moves_left {
                continue;
            }
            let mark = self.taken_list.len();
            let mut trial = gpus.to_vec();
            let mut placed = Vec::with_capacity(size);
            let mut anchor = gpus[units[0][0] as usize] as usize;
            let mut complete = true;
            for unit in &units {
                let need = unit.len() as u32;
                let constraint = self.unit_constraint(gpus, lowest, unit);
                let target = self
                    .domains_near(level, need, Some(anchor), constraint, usize::MAX)
                    .into_iter()
                    .find(|&x| self.healthy_avail(level, x as usize) >= need);
                let moved =
                    target.is_some_and(|x| self.try_inside(unit, lowest, (level, x as usize)));
                if !moved {
                    complete = false;
                    break;
                }
                for &r in unit {
                    trial[r as usize] = self.new[r as usize];
                    placed.push(self.new[r as usize]);
                }
                anchor = self.new[unit[0] as usize] as usize;
            }
            if complete {
                let (c, report) = self.cost(&trial, evaluations);
                if c < best * (1.0 - 1e-9) && out.as_ref().is_none_or(|o| c < o.0) {
                    out = Some((c, report, units.clone(), placed));
                }
            }
            self.rollback(mark, self.pieces.len());
            for &r in units.iter().flatten() {
                self.new[r as usize] = gpus[r as usize];
            }
        }
        out
    }

    /// Place `ranks` inside level-`level` domain `x` (nested units respected), as a trial.
    fn try_inside(&mut self, ranks: &[u32], unit_level: Option<usize>, x: (usize, usize)) -> bool {
        // A unit at confinement index i is placed as in step 2: its sub-units inside x; single
        // ranks go inside the level-0 domain x.
        let index = unit_level.unwrap_or(0);
        let pieces = self.pieces.len();
        let ok = self.place_set(ranks, index, x).is_ok();
        self.pieces.truncate(pieces);
        ok
    }
}

/// A move under `max_moves`: (rank cost, cost report, the units moved, their new GPUs rank
/// by rank in the order of the units).
type Move = (f64, Option<CostReport>, Vec<Vec<u32>>, Vec<u32>);

/// The cost model's time, with broken confinement ranked after any placement that keeps it.
fn ranked(report: &crate::cost::CostReport) -> f64 {
    if report.confinement_ok {
        report.comm_seconds
    } else {
        report.comm_seconds * 1e6 + 1.0
    }
}

fn check_time(start: Instant, limit: Option<Duration>) -> bool {
    !crate::interrupt::interrupted() && limit.is_none_or(|t| start.elapsed() < t)
}

/// Plan the repair of job `name` without changing `state`.
pub fn plan(
    state: &ClusterState,
    job: &JobSpec,
    name: &str,
    opts: &RepairOptions,
) -> Result<RepairPlan> {
    let start = Instant::now();
    let topo = state.topology().as_ref();
    let Some(alloc) = state.job(name) else {
        return Err(CoreError::InvalidState(format!(
            "no job named {name:?} is allocated"
        )));
    };
    let old = alloc.gpus.clone();
    if old.len() != job.num_ranks {
        return Err(CoreError::InvalidJob(format!(
            "job {name:?} holds {} GPUs but its spec has {} ranks",
            old.len(),
            job.num_ranks
        )));
    }
    let n = job.num_ranks;
    let mut evaluations = 0usize;
    let health = state.health();
    let moving: Vec<Option<MoveReason>> = old
        .iter()
        .map(|&g| (!health[g as usize].usable()).then_some(MoveReason::Lost))
        .collect();

    // Confinement levels below the job's span and the units they define.
    let mut levels: Vec<usize> = job
        .dims
        .iter()
        .filter(|d| d.size > 1)
        .filter_map(|d| d.confine)
        .filter(|&c| c < job.max_span)
        .collect();
    levels.sort_unstable();
    levels.dedup();
    let layout = job.layout();
    let mut unit_of = Vec::with_capacity(levels.len());
    let mut units = Vec::with_capacity(levels.len());
    for &c in &levels {
        // A unit is identified by the coordinates of the dimensions not confined at or below c.
        let mut ids: HashMap<u64, u32> = HashMap::new();
        let mut of = vec![0u32; n];
        let mut members: Vec<Vec<u32>> = Vec::new();
        for (r, slot) in of.iter_mut().enumerate() {
            let mut key = 0u64;
            for (d, dim) in job.dims.iter().enumerate() {
                if dim.confine.is_some_and(|x| x <= c) {
                    continue;
                }
                key = key * dim.size as u64 + layout.coordinate(r, d) as u64;
            }
            let next = ids.len() as u32;
            let id = *ids.entry(key).or_insert(next);
            if id as usize == members.len() {
                members.push(Vec::new());
            }
            members[id as usize].push(r as u32);
            *slot = id;
        }
        unit_of.push(of);
        units.push(members);
    }

    let top = topo.num_levels() - 1;
    let survivor = (0..n).find(|&r| moving[r].is_none());
    let job_domain = match survivor {
        Some(r) if job.max_span < top => {
            (job.max_span, topo.domain_of(old[r] as usize, job.max_span))
        }
        _ => (top, 0),
    };
    let mut ctx = Ctx {
        topo,
        state,
        spares: opts.spares,
        levels,
        unit_of,
        units,
        old: old.clone(),
        moving,
        new: old.clone(),
        taken: vec![false; topo.num_gpus()],
        taken_list: Vec::new(),
        taken_in: HashMap::new(),
        job_domain,
        pieces: Vec::new(),
        pricer: MovedPricer::new(state, name, job),
    };
    let nothing_lost = ctx.moving.iter().all(Option::is_none);
    if nothing_lost && opts.max_moves == 0 {
        let report = evaluate_in(state, job, &old)?;
        return Ok(RepairPlan {
            gpus: old,
            moves: Vec::new(),
            cost_before: report.comm_seconds,
            cost_after: report.comm_seconds,
            report_before: report.clone(),
            report_after: report,
            evaluations,
        });
    }
    if survivor.is_none() && job.max_span < top {
        return Err(CoreError::Infeasible(format!(
            "job {name:?} lost every rank; place it again instead of repairing it"
        )));
    }

    // Steps 1 and 2: place the moving ranks, moving whole units when they must (nothing to
    // place when nothing was lost: then only max_moves may move ranks).
    loop {
        if nothing_lost {
            break;
        }
        ctx.rollback(0, 0);
        for (slot, (&g, m)) in ctx.new.iter_mut().zip(old.iter().zip(&ctx.moving)) {
            *slot = if m.is_some() { NONE } else { g };
        }
        let ranks: Vec<u32> = (0..n as u32)
            .filter(|&r| ctx.moving[r as usize].is_some())
            .collect();
        let top_index = ctx.levels.len();
        match ctx.place_set(&ranks, top_index, ctx.job_domain) {
            Ok(()) => break,
            Err(Failure::Escalate { index, unit }) => {
                let level = ctx.levels[index];
                for &r in &ctx.units[index][unit as usize].clone() {
                    if ctx.moving[r as usize].is_none() {
                        ctx.moving[r as usize] = Some(MoveReason::UnitMoved { level });
                    }
                }
            }
            Err(Failure::NoRoom(why)) => {
                let lost = ctx
                    .moving
                    .iter()
                    .filter(|m| **m == Some(MoveReason::Lost))
                    .count();
                return Err(CoreError::Infeasible(format!(
                    "cannot repair job {name:?} ({lost} of its {n} ranks lost): it needs {why}, \
                     and the free GPUs{} do not have that",
                    match opts.spares {
                        SparePolicy::Allow => " and spares",
                        SparePolicy::Forbid => "",
                        SparePolicy::Only => " (spares only)",
                    }
                )));
            }
        }
    }
    // The old placement, priced as if the lost hardware still worked.
    let before = ctx.pricer.before(&old)?;
    let mut gpus = if nothing_lost {
        old.clone()
    } else {
        ctx.new.clone()
    };
    // The cost the search compares by, and the report of the current placement.
    let (mut best, mut report) = if nothing_lost {
        evaluations += 1;
        (ranked(&before), Some(before.clone()))
    } else {
        ctx.cost(&gpus, &mut evaluations)
    };

    // Step 3: local improvement of each moved piece.
    let pieces = ctx.pieces.clone();
    for piece in &pieces {
        if evaluations >= opts.max_evaluations || !check_time(start, opts.time_limit) {
            break;
        }
        let anchor = gpus[piece.ranks[0] as usize] as usize;
        for (level, x) in ctx.alternatives(piece, anchor) {
            if evaluations >= opts.max_evaluations {
                break;
            }
            // Free the piece's GPUs, try it in x.
            let mine: Vec<u32> = piece.ranks.iter().map(|&r| gpus[r as usize]).collect();
            let saved = (ctx.taken_list.clone(), ctx.taken_in.clone());
            release(&mut ctx, &mine);
            let mark = ctx.taken_list.len();
            if ctx.try_inside(&piece.ranks, piece.unit_level, (level, x as usize)) {
                let mut trial = gpus.clone();
                for &r in &piece.ranks {
                    trial[r as usize] = ctx.new[r as usize];
                }
                let (c, r) = ctx.cost(&trial, &mut evaluations);
                if c < best * (1.0 - 1e-9) {
                    (best, report) = (c, r);
                    gpus = trial;
                    continue;
                }
                ctx.rollback(mark, ctx.pieces.len());
            }
            restore(&mut ctx, saved);
            for &r in &piece.ranks {
                ctx.new[r as usize] = gpus[r as usize];
            }
        }
    }

    // max_moves: move surviving units that lower the cost.
    let mut moves_left = opts.max_moves;
    while moves_left > 0 && evaluations < opts.max_evaluations && check_time(start, opts.time_limit)
    {
        let lowest = if ctx.levels.is_empty() { None } else { Some(0) };
        let mut candidates: Vec<Vec<u32>> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let talks = partners(job, &ctx.moving);
        for r in 0..n {
            if ctx.moving[r].is_some() || !(talks[r] || state.is_degraded(gpus[r] as usize)) {
                continue;
            }
            let unit = ctx.unit_at(lowest, r);
            if unit.len() > moves_left
                || unit.iter().any(|&x| ctx.moving[x as usize].is_some())
                || !seen.insert(unit[0])
            {
                continue;
            }
            candidates.push(unit);
            if candidates.len() >= 8 {
                break;
            }
        }
        let repaired: Vec<usize> = (0..n)
            .filter(|&r| ctx.moving[r].is_some())
            .map(|r| gpus[r] as usize)
            .collect();
        let mut best_move: Option<Move> = None;
        for unit in candidates {
            if evaluations >= opts.max_evaluations {
                break;
            }
            let level = lowest.map(|i| ctx.levels[i]).unwrap_or(0);
            let constraint = ctx.unit_constraint(&gpus, lowest, &unit);
            let piece = Piece {
                ranks: unit.clone(),
                unit_level: lowest,
                constraint,
            };
            let mut targets: Vec<(usize, u32)> = Vec::new();
            for anchor in [
                repaired.first().copied(),
                Some(gpus[unit[0] as usize] as usize),
            ]
            .into_iter()
            .flatten()
            {
                // The nearest domain, and the nearest healthy one: evacuating degraded
                // hardware may have to go further than its degraded neighbours.
                let here = topo.domain_of(gpus[unit[0] as usize] as usize, level);
                let need = unit.len() as u32;
                let near = ctx.domains_near(level, need, Some(anchor), constraint, 2);
                let nearest = near.iter().find(|&&x| x as usize != here);
                let is_healthy =
                    |x: u32| x as usize != here && ctx.healthy_avail(level, x as usize) >= need;
                let healthy = near.iter().copied().find(|&x| is_healthy(x)).or_else(|| {
                    ctx.domains_near(level, need, Some(anchor), constraint, usize::MAX)
                        .into_iter()
                        .find(|&x| is_healthy(x))
                });
                targets.extend(nearest.map(|&x| (level, x)));
                targets.extend(healthy.map(|x| (level, x)));
            }
            targets.sort_unstable();
            targets.dedup();
            for (l, x) in targets {
                let mark = ctx.taken_list.len();
                if ctx.try_inside(&piece.ranks, piece.unit_level, (l, x as usize)) {
                    let mut trial = gpus.clone();
                    let placed: Vec<u32> = unit.iter().map(|&r| ctx.new[r as usize]).collect();
                    for (&r, &g) in unit.iter().zip(&placed) {
                        trial[r as usize] = g;
                    }
                    let (c, r) = ctx.cost(&trial, &mut evaluations);
                    if c < best * (1.0 - 1e-9) && best_move.as_ref().is_none_or(|b| c < b.0) {
                        best_move = Some((c, r, vec![unit.clone()], placed));
                    }
                }
                ctx.rollback(mark, ctx.pieces.len());
                for &r in &unit {
                    ctx.new[r as usize] = gpus[r as usize];
                }
            }
        }
        if best_move.is_none() && evaluations < opts.max_evaluations {
            best_move = ctx.evacuate_together(&gpus, lowest, moves_left, best, &mut evaluations);
        }
        let Some((c, r, units, placed)) = best_move else {
            break;
        };
        let mut placed = placed.into_iter();
        for unit in &units {
            // A unit with a rank on degraded hardware is evacuated from its slowest component.
            let reason = unit
                .iter()
                .find_map(|&r| state.slowest_component(gpus[r as usize] as usize))
                .map_or(MoveReason::Improvement, |(component, _)| {
                    MoveReason::Evacuated { component }
                });
            for (&r, g) in unit.iter().zip(placed.by_ref()) {
                ctx.take(g);
                gpus[r as usize] = g;
                ctx.new[r as usize] = g;
                ctx.moving[r as usize] = Some(reason);
            }
            moves_left -= unit.len();
        }
        (best, report) = (c, r);
    }

    let after = match report {
        Some(report) => report,
        // Only an invalid placement has no report: let the evaluator say what is wrong.
        None => evaluate_moved(state, name, job, &gpus)?,
    };
    let moves = (0..n)
        .filter(|&r| gpus[r] != old[r])
        .map(|r| RankMove {
            rank: r as u32,
            old_gpu: old[r],
            new_gpu: gpus[r],
            reason: ctx.moving[r].unwrap_or(MoveReason::Improvement),
        })
        .collect();
    Ok(RepairPlan {
        gpus,
        moves,
        cost_before: before.comm_seconds,
        cost_after: after.comm_seconds,
        report_before: before,
        report_after: after,
        evaluations,
    })
}

/// Give GPUs back to the candidate pool during a trial.
fn release(ctx: &mut Ctx<'_>, gpus: &[u32]) {
    for &g in gpus {
        if !ctx.taken[g as usize] {
            continue;
        }
        ctx.taken[g as usize] = false;
        ctx.taken_list.retain(|&x| x != g);
        for l in 0..ctx.topo.num_levels() {
            if let Some(c) = ctx
                .taken_in
                .get_mut(&(l, ctx.topo.domain_of(g as usize, l)))
            {
                *c -= 1;
            }
        }
    }
}

type Taken = (Vec<u32>, HashMap<(usize, usize), u32>);

fn restore(ctx: &mut Ctx<'_>, (list, counts): Taken) {
    for &g in &ctx.taken_list {
        ctx.taken[g as usize] = false;
    }
    for &g in &list {
        ctx.taken[g as usize] = true;
    }
    ctx.taken_list = list;
    ctx.taken_in = counts;
}

/// Ranks that share a communication group with a moving rank.
fn partners(job: &JobSpec, moving: &[Option<MoveReason>]) -> Vec<bool> {
    let mut out = vec![false; job.num_ranks];
    for g in 0..job.groups.rows() {
        let row = job.groups.row(g);
        if row.iter().any(|&r| moving[r as usize].is_some()) {
            for &r in row {
                out[r as usize] = true;
            }
        }
    }
    for &(a, b, _) in &job.traffic {
        if moving[a as usize].is_some() {
            out[b as usize] = true;
        }
        if moving[b as usize].is_some() {
            out[a as usize] = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::testing::tp_dp_job;
    use crate::state::GpuStatus;
    use crate::topology::tests::tree;
    use std::sync::Arc;

    #[test]
    fn a_trial_priced_where_it_moved_is_the_full_evaluation_bit_for_bit() {
        use crate::state::{ComponentHealth, Condition};
        let topo = Arc::new(tree(8, 8, 2));
        let job = tp_dp_job(&topo, 4, 8);
        let gpus: Vec<u32> = (0..32).collect();
        let mut s = ClusterState::with_nics(topo.clone(), (0..64).collect()).unwrap();
        s.allocate_job("a", &gpus, Some(Arc::new(job.clone())))
            .unwrap();
        let slow = ComponentHealth {
            condition: Condition::Degraded,
            factor: 0.5,
            reason: "loss".into(),
        };
        s.set_condition(&[Component::Nic(3)], Some(slow)).unwrap();
        let trials: Vec<Vec<u32>> = vec![
            gpus.clone(),
            // One tp group moved to another host, then two, then ranks swapped inside a host.
            (0..32).map(|r| if r < 4 { 40 + r } else { r }).collect(),
            (0..32)
                .map(|r| match r {
                    0..4 => 40 + r,
                    12..16 => 52 + r - 12,
                    _ => r,
                })
                .collect(),
            (0..32)
                .map(|r| match r {
                    0 => 1,
                    1 => 0,
                    _ => r,
                })
                .collect(),
        ];
        let check = |s: &ClusterState, reused: bool| {
            let mut pricer = crate::cost::MovedPricer::new(s, "a", &job);
            assert_eq!(
                pricer.before(&gpus).unwrap(),
                evaluate_in(s, &job, &gpus).unwrap()
            );
            assert_eq!(pricer.reuses(), reused);
            for trial in &trials {
                assert_eq!(
                    pricer.evaluate(trial).unwrap(),
                    evaluate_moved(s, "a", &job, trial).unwrap()
                );
            }
            assert!(pricer.evaluate(&gpus[..31]).is_err());
        };
        check(&s, true);
        // A neighbour on the fabric: the trials are priced in full.
        let other = tp_dp_job(&topo, 1, 2);
        s.allocate_job("b", &[32, 63], Some(Arc::new(other)))
            .unwrap();
        check(&s, false);
    }

    #[test]
    fn max_moves_evacuates_a_whole_group_off_a_degraded_nic_host_or_switch() {
        use crate::state::{ComponentHealth, Condition};
        let topo = Arc::new(tree(4, 8, 2));
        let job = tp_dp_job(&topo, 8, 2);
        // tp groups on node 0 (leaf 0) and node 2 (leaf 1); nodes 1 and 3 free.
        let gpus: Vec<u32> = (0..8).chain(16..24).collect();
        let slow = |factor: f64| ComponentHealth {
            condition: Condition::Degraded,
            factor,
            reason: "loss".into(),
        };
        for component in [
            Component::Nic(3),
            Component::Node(0),
            Component::Switch {
                level: 1,
                domain: 0,
            },
        ] {
            let mut s = ClusterState::with_nics(topo.clone(), (0..32).collect()).unwrap();
            s.allocate("a", &gpus).unwrap();
            let healthy = evaluate_in(&s, &job, &gpus).unwrap().comm_seconds;
            s.set_condition(&[component], Some(slow(0.5))).unwrap();
            let degraded = evaluate_in(&s, &job, &gpus).unwrap().comm_seconds;
            assert!(degraded > healthy * 1.5, "{component:?}");
            // A tp group is 8 ranks: 7 moves cannot move it, and nothing else may move.
            let opts = |max_moves| RepairOptions {
                max_moves,
                ..RepairOptions::default()
            };
            let plan = super::plan(&s, &job, "a", &opts(7)).unwrap();
            assert!(plan.moves.is_empty(), "{component:?}");
            assert_eq!(plan.cost_after, degraded);
            let plan = repair(&mut s, &job, "a", &opts(8)).unwrap();
            assert_eq!(plan.moves.len(), 8, "{component:?}");
            assert!(plan.moves.iter().all(|m| m.old_gpu < 8 && m.new_gpu >= 8));
            assert!(plan
                .moves
                .iter()
                .all(|m| m.reason == MoveReason::Evacuated { component }));
            assert_eq!(plan.cost_before, degraded);
            assert!(plan.cost_after <= healthy * (1.0 + 1e-12), "{component:?}");
            assert!(
                crate::cost::evaluate(&topo, &job, &plan.gpus)
                    .unwrap()
                    .confinement_ok
            );
            s.check().unwrap();
        }
    }

    #[test]
    fn a_trial_is_priced_without_the_jobs_own_load_on_the_fabric() {
        use crate::state::{ComponentHealth, Condition};
        // Leaf uplinks 16:1 oversubscribed: the job's dp ring alone fills them exactly, so
        // counting its old load against a trial would halve the trial's share.
        let topo = tree(4, 8, 2);
        let caps: Vec<f64> = (0..topo.uplink_count())
            .map(|u| {
                topo.uplink_gbps()[u]
                    / if topo.uplink_owner(u).0 == 1 {
                        16.0
                    } else {
                        1.0
                    }
            })
            .collect();
        let topo = Arc::new(topo.with_uplink_gbps(caps).unwrap());
        let job = Arc::new(tp_dp_job(&topo, 8, 2));
        let gpus: Vec<u32> = (0..8).chain(16..24).collect();
        let mut s = ClusterState::new(topo.clone());
        s.allocate_job("a", &gpus, Some(job.clone())).unwrap();
        let healthy = evaluate_in(&s, &job, &gpus).unwrap().comm_seconds;
        let slow = ComponentHealth {
            condition: Condition::Degraded,
            factor: 0.5,
            reason: "loss".into(),
        };
        s.set_condition(&[Component::Node(0)], Some(slow)).unwrap();
        let opts = RepairOptions {
            max_moves: 8,
            ..RepairOptions::default()
        };
        let plan = repair(&mut s, &job, "a", &opts).unwrap();
        assert_eq!(plan.moves.len(), 8);
        // What the repair reports is what the state charges once the job has moved.
        let after = evaluate_in(&s, &job, &plan.gpus).unwrap();
        assert_eq!(plan.report_after, after);
        assert!((plan.cost_after - healthy).abs() < 1e-12);
        s.check().unwrap();
    }

    #[test]
    fn groups_sharing_a_degraded_leaf_leave_it_together() {
        use crate::state::{ComponentHealth, Condition};
        let topo = Arc::new(tree(4, 8, 2));
        let job = tp_dp_job(&topo, 8, 2);
        // Both tp groups under leaf 0 (nodes 0 and 1); leaf 1 (nodes 2 and 3) is free.
        let gpus: Vec<u32> = (0..16).collect();
        let mut s = ClusterState::new(topo.clone());
        s.allocate("a", &gpus).unwrap();
        let healthy = evaluate_in(&s, &job, &gpus).unwrap().comm_seconds;
        let leaf = Component::Switch {
            level: 1,
            domain: 0,
        };
        s.set_condition(
            &[leaf],
            Some(ComponentHealth {
                condition: Condition::Degraded,
                factor: 0.5,
                reason: "loss".into(),
            }),
        )
        .unwrap();
        let opts = |max_moves| RepairOptions {
            max_moves,
            ..RepairOptions::default()
        };
        // One group alone would only put the dp ring over the spine: nothing moves.
        assert!(super::plan(&s, &job, "a", &opts(8))
            .unwrap()
            .moves
            .is_empty());
        let plan = repair(&mut s, &job, "a", &opts(16)).unwrap();
        assert_eq!(plan.moves.len(), 16);
        assert!(plan
            .moves
            .iter()
            .all(|m| m.new_gpu >= 16 && m.reason == MoveReason::Evacuated { component: leaf }));
        assert!((plan.cost_after - healthy).abs() < 1e-12);
        s.check().unwrap();
    }

    #[test]
    fn lost_rank_stays_in_its_tp_node_when_there_is_room() {
        let topo = Arc::new(tree(4, 8, 2));
        let mut s = ClusterState::new(topo.clone());
        let job = tp_dp_job(&topo, 4, 2);
        s.allocate("a", &[0, 1, 2, 3, 8, 9, 10, 11]).unwrap();
        s.set_health(&[1], GpuStatus::Failed).unwrap();
        let plan = repair(&mut s, &job, "a", &RepairOptions::default()).unwrap();
        assert_eq!(plan.moves.len(), 1);
        assert_eq!(plan.moves[0].rank, 1);
        assert!(
            plan.moves[0].new_gpu < 8,
            "stays in node 0: {:?}",
            plan.moves
        );
        s.check().unwrap();
    }

    #[test]
    fn full_node_moves_the_whole_tp_group() {
        let topo = Arc::new(tree(4, 8, 2));
        let mut s = ClusterState::new(topo.clone());
        let job = tp_dp_job(&topo, 8, 2);
        let gpus: Vec<u32> = (0..16).collect();
        s.allocate("a", &gpus).unwrap();
        s.set_health(&[3], GpuStatus::Failed).unwrap();
        let plan = repair(&mut s, &job, "a", &RepairOptions::default()).unwrap();
        assert_eq!(plan.moves.len(), 8);
        let reasons: Vec<_> = plan.moves.iter().map(|m| m.reason).collect();
        assert_eq!(
            reasons
                .iter()
                .filter(|r| matches!(r, MoveReason::UnitMoved { .. }))
                .count(),
            7
        );
        let report = crate::cost::evaluate(&topo, &job, &plan.gpus).unwrap();
        assert!(report.confinement_ok);
        s.check().unwrap();
    }

    #[test]
    fn infeasible_repair_changes_nothing() {
        let topo = Arc::new(tree(2, 4, 1));
        let mut s = ClusterState::new(topo.clone());
        let job = tp_dp_job(&topo, 4, 1);
        s.allocate("a", &[0, 1, 2, 3]).unwrap();
        s.allocate("b", &[4, 5]).unwrap();
        s.set_health(&[0], GpuStatus::Failed).unwrap();
        let before = s.job("a").unwrap().clone();
        let err = repair(&mut s, &job, "a", &RepairOptions::default()).unwrap_err();
        assert!(matches!(err, CoreError::Infeasible(_)), "{err}");
        assert_eq!(s.job("a").unwrap(), &before);
        s.check().unwrap();
    }
}
