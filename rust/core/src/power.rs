//! Power budgets: the draw of every power domain (rack, PDU, row) from the jobs that run in
//! it, and what a new job may take without exceeding a budget.
//!
//! The declarations (domains, budgets, `max_synchronized`, phase slots, board watts, a job's
//! declared draw) are read by the Python model (`gpuplace.model.power`), which documents them;
//! this module holds the arithmetic, once:
//!
//! - a job draws, per GPU, its `average` W, and a synchronised job (every GPU peaks at once, as
//!   a training step makes a data-parallel job) adds `peak - average` W at its peaks
//!   ([`Draw::of`] resolves a declaration on a GPU of a given board power);
//! - with `P` phase slots a synchronised job in slot `s` peaks `s / P` of a step later, so only
//!   the jobs of one slot peak together: a domain's draw is the sum of its jobs' averages plus
//!   the largest, over slots, of that slot's synchronised peak margins ([`Ledger::draw`]);
//! - `max_synchronized` bounds the synchronised jobs per domain and slot;
//! - [`Ledger::check`] says whether adding a job (its GPUs, draw and slot) would exceed a
//!   budget or that bound, naming the first domain; [`Ledger::allowed`] says how many of a
//!   domain's free GPUs a job may take in a slot (the headroom a power-limited view hides),
//!   and [`Ledger::held`] which free GPUs that leaves out.
//!
//! A domain's draw is always recomputed from the running jobs ([`PowerModel::ledger`]): there
//! is no counter to drift.

use crate::error::{CoreError, Result};
use crate::state::ClusterState;

/// Relative slack on a budget (float sums in another order must not refuse an exact fit).
const BUDGET_SLACK: f64 = 1e-12;

/// One power domain's limits.
#[derive(Clone, Debug, PartialEq)]
pub struct PowerDomain {
    /// Budget for its GPUs' draw (W).
    pub budget_w: f64,
    /// At most this many synchronised jobs per phase slot (None: no bound).
    pub max_synchronized: Option<u32>,
}

/// A job's declared per-GPU draw; None fields take the board power (peak) and the peak
/// (average).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct JobPower {
    pub peak_w: Option<f64>,
    pub average_w: Option<f64>,
    pub synchronized: bool,
}

/// A job's resolved per-GPU draw (W).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draw {
    pub peak: f64,
    pub average: f64,
    pub synchronized: bool,
}

impl Draw {
    /// The draw of a job with declaration `power` (None: none declared, so its GPUs draw their
    /// board power, peak and average alike, unsynchronised) on GPUs of `board_w`.
    pub fn of(power: Option<&JobPower>, board_w: f64) -> Draw {
        match power {
            None => Draw {
                peak: board_w,
                average: board_w,
                synchronized: false,
            },
            Some(p) => {
                let peak = p.peak_w.unwrap_or(board_w);
                let average = p.average_w.map_or(peak, |a| a.min(peak));
                Draw {
                    peak,
                    average,
                    synchronized: p.synchronized,
                }
            }
        }
    }
}

/// A running (or proposed) job as the budgets see it.
#[derive(Clone, Debug, PartialEq)]
pub struct Running {
    /// (domain index, GPUs of the job in it), for the domains it has GPUs in.
    pub gpus_in: Vec<(u32, u32)>,
    pub draw: Draw,
    /// Its phase slot (taken modulo the number of slots).
    pub slot: u32,
}

/// Why a domain lets a job take fewer GPUs than it has free, or refuses an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The watts left.
    Budget,
    /// That many synchronised jobs already peak in this slot.
    MaxSynchronized,
}

/// An allocation a budget refuses: the first domain (in declaration order) it would break.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Over {
    pub domain: usize,
    pub cause: Cause,
    /// The domain's draw with the job (W), for [`Cause::Budget`].
    pub draw: f64,
    /// The slot (modulo the slots) the job would peak in.
    pub slot: u32,
}

/// The compiled power domains of a topology.
#[derive(Clone, Debug)]
pub struct PowerModel {
    domains: Vec<PowerDomain>,
    phases: u32,
    /// Board power (W) per GPU (NaN when unknown).
    board_w: Vec<f64>,
    /// Per GPU, the domains it belongs to (CSR: `gpu_start[g]..gpu_start[g + 1]` in
    /// `gpu_domains`); domains may overlap (a rack inside a row).
    gpu_start: Vec<u32>,
    gpu_domains: Vec<u32>,
    /// Per domain, its GPUs in id order.
    domain_gpus: Vec<Vec<u32>>,
}

impl PowerModel {
    /// `domain_gpus[d]`: the GPUs of domain `d`; `board_w`: the board power of every GPU.
    pub fn new(
        domains: Vec<PowerDomain>,
        phases: u32,
        board_w: Vec<f64>,
        domain_gpus: Vec<Vec<u32>>,
    ) -> Result<PowerModel> {
        let bad = |m: String| Err(CoreError::InvalidTopology(m));
        if phases == 0 {
            return bad("power_phases: expected 1 or more, got 0".into());
        }
        if domain_gpus.len() != domains.len() {
            return bad(format!(
                "power domains: {} budgets but {} GPU lists",
                domains.len(),
                domain_gpus.len()
            ));
        }
        let n = board_w.len();
        let mut per_gpu: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (d, gpus) in domain_gpus.iter().enumerate() {
            for &g in gpus {
                match per_gpu.get_mut(g as usize) {
                    Some(list) if list.last() != Some(&(d as u32)) => list.push(d as u32),
                    Some(_) => return bad(format!("power domain {d}: GPU {g} listed twice")),
                    None => {
                        return bad(format!(
                            "power domain {d}: GPU {g} out of range (the topology has {n})"
                        ))
                    }
                }
            }
        }
        let mut gpu_start = Vec::with_capacity(n + 1);
        let mut gpu_domains = Vec::new();
        gpu_start.push(0);
        for list in per_gpu {
            gpu_domains.extend(list);
            gpu_start.push(gpu_domains.len() as u32);
        }
        let mut domain_gpus = domain_gpus;
        for gpus in &mut domain_gpus {
            gpus.sort_unstable();
        }
        Ok(PowerModel {
            domains,
            phases,
            board_w,
            gpu_start,
            gpu_domains,
            domain_gpus,
        })
    }

    pub fn domains(&self) -> &[PowerDomain] {
        &self.domains
    }

    pub fn phases(&self) -> u32 {
        self.phases
    }

    /// GPUs of the topology.
    pub fn num_gpus(&self) -> usize {
        self.board_w.len()
    }

    pub fn domain_gpus(&self, d: usize) -> &[u32] {
        &self.domain_gpus[d]
    }

    /// Does every GPU have a known board power?
    pub fn boards_known(&self) -> bool {
        !self.board_w.iter().any(|w| w.is_nan())
    }

    /// The largest board power among `gpus` (NaN ignored unless all are; 0 for none).
    fn board_of(&self, gpus: &[u32]) -> f64 {
        if gpus.is_empty() {
            return 0.0;
        }
        gpus.iter()
            .map(|&g| self.board_w[g as usize])
            .fold(f64::NAN, f64::max)
    }

    /// A job on `gpus` with declaration `power` in `slot`, as the budgets see it.
    pub fn running(&self, gpus: &[u32], power: Option<&JobPower>, slot: u32) -> Result<Running> {
        let n = self.board_w.len();
        if let Some(&g) = gpus.iter().find(|&&g| g as usize >= n) {
            return Err(CoreError::InvalidState(format!(
                "GPU {g} out of range (the topology has {n})"
            )));
        }
        let mut counts: Vec<(u32, u32)> = Vec::new();
        for &g in gpus {
            let g = g as usize;
            for &d in &self.gpu_domains[self.gpu_start[g] as usize..self.gpu_start[g + 1] as usize]
            {
                match counts.iter_mut().find(|(e, _)| *e == d) {
                    Some((_, c)) => *c += 1,
                    None => counts.push((d, 1)),
                }
            }
        }
        Ok(Running {
            gpus_in: counts,
            draw: Draw::of(power, self.board_of(gpus)),
            slot: slot % self.phases,
        })
    }

    /// The budgets' account of `jobs`.
    pub fn ledger<'a>(&self, jobs: impl IntoIterator<Item = &'a Running>) -> Ledger {
        let (nd, p) = (self.domains.len(), self.phases as usize);
        let mut ledger = Ledger {
            phases: p,
            average: vec![0.0; nd],
            margin: vec![0.0; nd * p],
            synchronized: vec![0; nd * p],
        };
        for job in jobs {
            ledger.add(job);
        }
        ledger
    }

    /// The budgets' account of the jobs allocated in `state`: each job's declaration and slot
    /// from `power_of` (None: none declared, slot 0).
    pub fn ledger_of_state<'s>(
        &self,
        state: &ClusterState,
        mut power_of: impl FnMut(&str) -> (Option<&'s JobPower>, u32),
    ) -> Result<(Ledger, Vec<(String, Running)>)> {
        let mut jobs = Vec::new();
        for job in state.jobs() {
            let (power, slot) = power_of(&job.name);
            jobs.push((job.name.clone(), self.running(&job.gpus, power, slot)?));
        }
        Ok((self.ledger(jobs.iter().map(|(_, r)| r)), jobs))
    }

    /// The job's draw on domain `d`'s GPUs (its declaration on the domain's largest board).
    pub fn draw_in(&self, d: usize, power: Option<&JobPower>) -> Draw {
        Draw::of(power, self.board_of(&self.domain_gpus[d]))
    }
}

/// Per domain and slot, the sums a budget is checked against.
#[derive(Clone, Debug, PartialEq)]
pub struct Ledger {
    phases: usize,
    /// Per domain: sum of its jobs' average draw (W).
    average: Vec<f64>,
    /// Per domain and slot (`d * phases + s`): the synchronised jobs' peak margin (W).
    margin: Vec<f64>,
    /// Per domain and slot: synchronised jobs with GPUs in it.
    synchronized: Vec<u32>,
}

fn max_of(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

impl Ledger {
    /// Count one more job.
    pub fn add(&mut self, job: &Running) {
        let s = job.slot as usize % self.phases;
        for &(d, n) in &job.gpus_in {
            let d = d as usize;
            let n = f64::from(n);
            self.average[d] += n * job.draw.average;
            if job.draw.synchronized {
                self.margin[d * self.phases + s] += n * (job.draw.peak - job.draw.average);
                self.synchronized[d * self.phases + s] += 1;
            }
        }
    }

    /// Per slot, domain `d`'s synchronised peak margin (W).
    pub fn margins(&self, d: usize) -> &[f64] {
        &self.margin[d * self.phases..(d + 1) * self.phases]
    }

    /// Domain `d`'s draw (W): the averages plus the worst slot's peak margin.
    pub fn draw(&self, d: usize) -> f64 {
        self.average[d] + max_of(self.margins(d))
    }

    /// Synchronised jobs with GPUs in domain `d` peaking in `slot`.
    pub fn synchronized(&self, d: usize, slot: u32) -> u32 {
        self.synchronized[d * self.phases + slot as usize % self.phases]
    }

    /// Would adding `job` exceed a budget or a `max_synchronized` of a domain it has GPUs in?
    /// The first such domain (in the job's order of domains, a domain's budget before its
    /// bound), or None.
    pub fn check(&self, model: &PowerModel, job: &Running) -> Option<Over> {
        let p = self.phases;
        let s = job.slot as usize % p;
        let mut margins = vec![0.0; p];
        let mut order: Vec<(u32, u32)> = job.gpus_in.clone();
        order.sort_unstable();
        for (d, n) in order {
            if n == 0 {
                continue;
            }
            let d = d as usize;
            let dom = &model.domains[d];
            let n = f64::from(n);
            margins.copy_from_slice(self.margins(d));
            if job.draw.synchronized {
                margins[s] += n * (job.draw.peak - job.draw.average);
            }
            let draw = self.average[d] + n * job.draw.average + max_of(&margins);
            if draw > dom.budget_w * (1.0 + BUDGET_SLACK) {
                return Some(Over {
                    domain: d,
                    cause: Cause::Budget,
                    draw,
                    slot: s as u32,
                });
            }
            if let (true, Some(limit)) = (job.draw.synchronized, dom.max_synchronized) {
                if self.synchronized[d * p + s] + 1 > limit {
                    return Some(Over {
                        domain: d,
                        cause: Cause::MaxSynchronized,
                        draw,
                        slot: s as u32,
                    });
                }
            }
        }
        None
    }

    /// How many GPUs of domain `d` (of `free` free ones) a job drawing `draw` per GPU may take
    /// in `slot`, and why fewer than `free` when so.
    pub fn allowed(
        &self,
        model: &PowerModel,
        d: usize,
        draw: Draw,
        slot: u32,
        free: usize,
    ) -> (usize, Option<Cause>) {
        let dom = &model.domains[d];
        let p = self.phases;
        let s = slot as usize % p;
        if draw.synchronized {
            if let Some(limit) = dom.max_synchronized {
                if self.synchronized[d * p + s] >= limit {
                    return (0, (free > 0).then_some(Cause::MaxSynchronized));
                }
            }
        }
        let margins = self.margins(d);
        let current = self.draw(d);
        let allowed = if dom.budget_w - current >= 0.0 {
            // The job adds its average per GPU, and its peak margin to its slot's:
            // draw' = average + n avg + max(margin[s] + n extra, worst other) <= budget.
            let extra = if draw.synchronized {
                draw.peak - draw.average
            } else {
                0.0
            };
            let worst_other = if p > 1 {
                margins
                    .iter()
                    .enumerate()
                    .filter(|&(t, _)| t != s)
                    .map(|(_, &m)| m)
                    .fold(f64::NEG_INFINITY, f64::max)
            } else {
                0.0
            };
            let base = self.average[d];
            let a = (dom.budget_w - base - margins[s]) / (draw.average + extra);
            let b = (dom.budget_w - base - worst_other) / draw.average;
            let n = (a.min(b) + 1e-9).floor();
            let size = model.domain_gpus[d].len() as f64;
            // A NaN (an unknown board power) allows nothing; a zero draw everything.
            if n.is_nan() {
                0
            } else {
                n.clamp(0.0, size) as usize
            }
        } else {
            0
        };
        if allowed < free {
            (allowed, Some(Cause::Budget))
        } else {
            (free, None)
        }
    }

    /// The free GPUs (`free[g]`) a job with declaration `power` may not take in `slot`: per
    /// domain (in order, skipping those in `relax`), its free GPUs beyond what
    /// [`Ledger::allowed`] lets the job take there, the lowest ids kept. A GPU held back for
    /// one domain no longer counts as free in a later one.
    pub fn held(
        &self,
        model: &PowerModel,
        free: &[bool],
        power: Option<&JobPower>,
        slot: u32,
        relax: &[usize],
    ) -> Vec<u32> {
        let mut free = free.to_vec();
        let mut held = Vec::new();
        for d in 0..model.domains.len() {
            if relax.contains(&d) {
                continue;
            }
            let mine: Vec<u32> = model.domain_gpus[d]
                .iter()
                .copied()
                .filter(|&g| free[g as usize])
                .collect();
            let (allowed, _) = self.allowed(model, d, model.draw_in(d, power), slot, mine.len());
            for &g in &mine[allowed..] {
                free[g as usize] = false;
                held.push(g);
            }
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 4 domains of 16 GPUs at 700 W each, `budget` W per domain.
    fn racks(budget: f64, max_synchronized: Option<u32>, phases: u32) -> PowerModel {
        let domains = (0..4)
            .map(|_| PowerDomain {
                budget_w: budget,
                max_synchronized,
            })
            .collect();
        let gpus = (0..4).map(|r| (r * 16..r * 16 + 16).collect()).collect();
        PowerModel::new(domains, phases, vec![700.0; 64], gpus).unwrap()
    }

    fn sync(peak: f64, average: f64) -> JobPower {
        JobPower {
            peak_w: Some(peak),
            average_w: Some(average),
            synchronized: true,
        }
    }

    #[test]
    fn an_undeclared_job_draws_its_board_power_unsynchronised() {
        assert_eq!(
            Draw::of(None, 700.0),
            Draw {
                peak: 700.0,
                average: 700.0,
                synchronized: false
            }
        );
        let p = JobPower {
            peak_w: None,
            average_w: Some(900.0),
            synchronized: true,
        };
        // The average never exceeds the peak, which defaults to the board.
        assert_eq!(Draw::of(Some(&p), 700.0).average, 700.0);
    }

    #[test]
    fn the_draw_is_the_averages_plus_the_worst_slots_margin() {
        let m = racks(20_000.0, None, 2);
        let a = m.running(&(0..8).collect::<Vec<_>>(), Some(&sync(700.0, 400.0)), 0);
        let b = m.running(&(8..16).collect::<Vec<_>>(), Some(&sync(700.0, 400.0)), 1);
        let c = m.running(&[16, 17], None, 0).unwrap();
        let (a, b) = (a.unwrap(), b.unwrap());
        let ledger = m.ledger([&a, &b, &c]);
        // 16 x 400 + max(8 x 300, 8 x 300) in rack 0; rack 1: 2 x 700.
        assert_eq!(ledger.draw(0), 16.0 * 400.0 + 2_400.0);
        assert_eq!(ledger.margins(0), &[2_400.0, 2_400.0]);
        assert_eq!(ledger.draw(1), 1_400.0);
        assert_eq!(ledger.draw(2), 0.0);
        assert_eq!(
            (ledger.synchronized(0, 0), ledger.synchronized(0, 1)),
            (1, 1)
        );
    }

    #[test]
    fn a_job_over_a_budget_is_refused_naming_the_domain() {
        let m = racks(6_000.0, None, 1);
        let first = m.running(&(0..8).collect::<Vec<_>>(), None, 0).unwrap();
        let ledger = m.ledger([&first]);
        let second = m.running(&(8..10).collect::<Vec<_>>(), None, 0).unwrap();
        let over = ledger.check(&m, &second).unwrap();
        assert_eq!((over.domain, over.cause), (0, Cause::Budget));
        assert_eq!(over.draw, 7_000.0);
        let elsewhere = m.running(&(16..24).collect::<Vec<_>>(), None, 0).unwrap();
        assert_eq!(ledger.check(&m, &elsewhere), None);
        // Exactly at the budget fits: 5,600 + 400 = 6,000.
        let p = JobPower {
            peak_w: Some(400.0),
            average_w: None,
            synchronized: false,
        };
        let exact = m.running(&[8], Some(&p), 0).unwrap();
        assert_eq!(ledger.check(&m, &exact), None);
    }

    #[test]
    fn max_synchronized_bounds_the_jobs_per_slot() {
        let m = racks(1e9, Some(1), 2);
        let a = m.running(&[0], Some(&sync(700.0, 400.0)), 0).unwrap();
        let ledger = m.ledger([&a]);
        let same = m.running(&[1], Some(&sync(700.0, 400.0)), 2).unwrap(); // slot 2 = 0
        let over = ledger.check(&m, &same).unwrap();
        assert_eq!((over.cause, over.slot), (Cause::MaxSynchronized, 0));
        let other = m.running(&[1], Some(&sync(700.0, 400.0)), 1).unwrap();
        assert_eq!(ledger.check(&m, &other), None);
        let d = m.draw_in(0, Some(&sync(700.0, 400.0)));
        assert_eq!(
            ledger.allowed(&m, 0, d, 0, 15),
            (0, Some(Cause::MaxSynchronized))
        );
        assert_eq!(ledger.allowed(&m, 0, d, 1, 15), (15, None));
        // An unsynchronised job is not bounded.
        let plain = m.running(&[1], None, 0).unwrap();
        assert_eq!(ledger.check(&m, &plain), None);
    }

    #[test]
    fn allowed_is_the_most_gpus_check_accepts() {
        // Staggered: rack 0 holds a synchronised job in slot 0; a new one fits more GPUs in
        // slot 1, and every count allowed passes check while one more does not.
        let m = racks(10_000.0, None, 2);
        let job = sync(700.0, 400.0);
        let first = m
            .running(&(0..8).collect::<Vec<_>>(), Some(&job), 0)
            .unwrap();
        let ledger = m.ledger([&first]);
        for slot in 0..2 {
            let (n, cause) = ledger.allowed(&m, 0, m.draw_in(0, Some(&job)), slot, 8);
            let take = |k: u32| m.running(&(8..8 + k).collect::<Vec<_>>(), Some(&job), slot);
            assert_eq!(
                ledger.check(&m, &take(n as u32).unwrap()),
                None,
                "slot {slot}"
            );
            if n < 8 {
                assert_eq!(cause, Some(Cause::Budget));
                assert!(ledger.check(&m, &take(n as u32 + 1).unwrap()).is_some());
            }
        }
        // 8 x 400 + 8 x 300 = 5,600; slot 0 peaks with it: (10,000 - 5,600) / 700 = 6;
        // slot 1: min((10,000 - 3,200) / 700, (10,000 - 3,200 - 2,400) / 400) = 9 -> all 8.
        assert_eq!(ledger.allowed(&m, 0, m.draw_in(0, Some(&job)), 0, 8).0, 6);
        assert_eq!(ledger.allowed(&m, 0, m.draw_in(0, Some(&job)), 1, 8).0, 8);
    }

    #[test]
    fn held_keeps_the_lowest_free_gpus_of_each_domain() {
        let m = racks(2_100.0, None, 1); // 3 GPUs at 700 W per rack
        let ledger = m.ledger([]);
        let mut free = vec![true; 64];
        free[0] = false;
        let held = ledger.held(&m, &free, None, 0, &[]);
        let rack0: Vec<u32> = held.iter().copied().filter(|&g| g < 16).collect();
        assert_eq!(rack0, (4..16).collect::<Vec<_>>());
        assert_eq!(held.len(), 12 + 3 * 13);
        assert!(ledger.held(&m, &free, None, 0, &[0, 1, 2, 3]).is_empty());
    }

    #[test]
    fn a_bad_model_is_refused() {
        let d = || PowerDomain {
            budget_w: 1.0,
            max_synchronized: None,
        };
        assert!(PowerModel::new(vec![d()], 1, vec![1.0; 2], vec![vec![5]]).is_err());
        assert!(PowerModel::new(vec![d()], 0, vec![1.0; 2], vec![vec![0]]).is_err());
        assert!(PowerModel::new(vec![d()], 1, vec![1.0; 2], vec![]).is_err());
    }
}
