//! One request in, one report out: a placement request and everything a caller needs to know
//! about the answer, computed in one call.
//!
//! A [`Request`] is the job's storage traffic (its stores and bytes per step) and, with power
//! domains, the budgets' account of the running jobs and the job's declared draw; the state it
//! is placed on carries the policy's fence, the running jobs (for contention), the health and
//! the spares. [`place`] runs a Rust solver and the placement gate ([`crate::gate`]);
//! [`place_within_power`] does so in each phase slot the budgets leave room in
//! ([`crate::power`]) and keeps the cheapest; [`admit`] gates a placement another solver made;
//! [`price`] prices a placement without gating it.
//! Each returns one [`Report`]: the cost model's [`CostReport`] (which carries the step time
//! and the GPU peak it was priced at), and, in a state whose running jobs load the fabric, the
//! same placement's seconds alone and the uplinks over capacity on its paths
//! ([`crate::fabric::contention`]), and the seconds per step its storage traffic takes
//! ([`crate::storage::io_seconds`]). Nothing is priced twice on the caller's side.

use crate::cost::CostReport;
use crate::error::{CoreError, Result};
use crate::fabric::{self, ContentionReport};
use crate::gate;
use crate::job::JobSpec;
use crate::power::{JobPower, Ledger, PowerModel};
use crate::solvers::SolveOptions;
use crate::state::ClusterState;
use crate::storage::{self, IoDemand, IoTime};
use crate::topology::Topology;
use std::sync::Arc;

/// What a placement request carries besides the job and the state.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The job's storage traffic per step, one entry per store it reads or writes.
    pub io: Vec<IoDemand>,
    /// With power domains: the budgets a placement must stay within.
    pub power: Option<PowerRequest>,
}

/// The power budgets of a request: the topology's domains, the running jobs' draw per domain
/// and slot (recomputed from the state's allocations by the caller, [`PowerModel::ledger_of_state`]),
/// and the job's declared draw (None: its GPUs draw their board power, unsynchronised).
#[derive(Debug, Clone)]
pub struct PowerRequest {
    pub model: Arc<PowerModel>,
    pub ledger: Ledger,
    pub job: Option<JobPower>,
}

/// Everything one placement costs, from one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The cost model's report: communication (contended, in a loaded state), per class,
    /// per level, confinement, and the step time at the slowest host type's GPU peak.
    pub cost: CostReport,
    /// Priced in a state whose running jobs load the fabric: alone and contended seconds and
    /// the hot uplinks on the job's paths; None when nobody loads the fabric.
    pub contention: Option<ContentionReport>,
    /// Seconds per step of the job's storage traffic over the paths to its stores (not part
    /// of `cost.comm_seconds`); 0 without storage traffic. Reads plus writes; the step
    /// (`cost.step`) carries them apart, as they enter it ([`crate::storage::step_with_io`]).
    pub io_seconds: f64,
}

impl Report {
    /// The report of a placement priced `cost`, with what it shares: its contention and its
    /// storage time, which also enters its step (when the cost model priced one).
    pub fn new(mut cost: CostReport, contention: Option<ContentionReport>, io: IoTime) -> Report {
        if let Some(step) = cost.step.as_mut() {
            if io.total() > 0.0 || step.input_seconds > 0.0 || step.checkpoint_seconds > 0.0 {
                storage::step_with_io(step, io);
            }
        }
        Report {
            cost,
            contention,
            io_seconds: io.total(),
        }
    }
}

/// Whether any running job loads a fabric uplink (so that a placement here contends).
pub fn fabric_loaded(state: &ClusterState) -> bool {
    state
        .fabric_load()
        .is_some_and(|load| load.iter().any(|&v| v > 0.0))
}

/// What `gpus` share on `state`: the contention with the running jobs (None when nobody
/// loads the fabric) and the storage time of the request.
pub fn shared(
    state: &ClusterState,
    job: &JobSpec,
    gpus: &[u32],
    request: &Request,
) -> Result<(Option<ContentionReport>, IoTime)> {
    let contention = if fabric_loaded(state) {
        Some(fabric::contention(state, job, gpus)?)
    } else {
        None
    };
    Ok((contention, io_seconds(state, gpus, request)?))
}

/// Seconds per step of the request's storage traffic from `gpus` to its stores.
fn io_seconds(state: &ClusterState, gpus: &[u32], request: &Request) -> Result<IoTime> {
    let mut seconds = IoTime::default();
    for demand in &request.io {
        seconds += storage::io_time(
            state,
            &demand.store,
            demand.read_bytes,
            demand.write_bytes,
            gpus,
        )?;
    }
    Ok(seconds)
}

/// What a placement shares on a state, seen on the state as it is now and completed once the
/// placement's price on that state is known ([`Shared::finish`]): for a caller that prices the
/// placement itself, later (a repair prices the old placement as it runs, then moves it).
///
/// The contention of a placement nobody else meets on the fabric (no other job loads it, or
/// the job is alone on a fabric that does not make it contend with itself) is its price on the
/// state, alone and contended, with no hot uplink: [`fabric::contention`] would price the same
/// placement again to find that, at the cost of a whole evaluation (about a millisecond for a
/// 16,384-rank job).
#[derive(Debug, Clone)]
pub struct Shared {
    contention: Pending,
    io_seconds: IoTime,
}

#[derive(Debug, Clone)]
enum Pending {
    /// Nobody loads the fabric.
    Unloaded,
    /// The fabric is loaded, but no neighbour meets the placement there.
    Alone,
    /// Priced with the neighbours.
    Priced(ContentionReport),
}

impl Shared {
    /// What `gpus` share on `state` as it is now (the contention is priced here only when
    /// neighbours meet the placement).
    pub fn of(
        state: &ClusterState,
        job: &JobSpec,
        gpus: &[u32],
        request: &Request,
    ) -> Result<Shared> {
        let contention = if !fabric_loaded(state) {
            Pending::Unloaded
        } else if fabric::Background::of(state, gpus).is_some_and(|bg| !bg.alone(state)) {
            Pending::Priced(fabric::contention(state, job, gpus)?)
        } else {
            Pending::Alone
        };
        Ok(Shared {
            contention,
            io_seconds: io_seconds(state, gpus, request)?,
        })
    }

    /// The contention and the storage time, given `priced`: the placement's communication
    /// seconds on the state it was seen on ([`crate::cost::evaluate_in`] there).
    pub fn finish(self, priced: f64) -> (Option<ContentionReport>, IoTime) {
        let contention = match self.contention {
            Pending::Unloaded => None,
            Pending::Alone => Some(ContentionReport {
                alone_seconds: priced,
                contended_seconds: priced,
                uplinks: Vec::new(),
            }),
            Pending::Priced(report) => Some(report),
        };
        (contention, self.io_seconds)
    }
}

/// Complete `cost` (the report of `gpus` on `state`, [`crate::cost::evaluate_in`]) with what
/// the placement shares: its contention with the running jobs and its storage seconds.
pub fn complete(
    state: &ClusterState,
    job: &JobSpec,
    gpus: &[u32],
    cost: CostReport,
    request: &Request,
) -> Result<Report> {
    let (contention, io) = Shared::of(state, job, gpus, request)?.finish(cost.comm_seconds);
    Ok(Report::new(cost, contention, io))
}

/// Price `gpus` on `state` (its hardware and running jobs) without gating them.
pub fn price(
    state: &ClusterState,
    job: &JobSpec,
    gpus: &[u32],
    request: &Request,
) -> Result<Report> {
    let cost = crate::cost::evaluate_in(state, job, gpus)?;
    complete(state, job, gpus, cost, request)
}

/// The placement gate ([`gate::admit`]) and the full report of the placement it admits.
pub fn admit(
    state: &ClusterState,
    job: &JobSpec,
    gpus: &[u32],
    solver: &str,
    confining: bool,
    request: &Request,
) -> Result<Report> {
    let cost = gate::admit(state, job, gpus, solver, confining)?;
    complete(state, job, gpus, cost, request)
}

/// Run a Rust solver, pass its placement through the gate, and report it: the GPU of each
/// rank and the full report, in one call.
pub fn place(
    state: &ClusterState,
    job: &JobSpec,
    solver: &str,
    opts: &SolveOptions,
    request: &Request,
) -> Result<(Vec<u32>, Report)> {
    let (gpus, cost) = gate::place(state, job, solver, opts)?;
    let report = complete(state, job, &gpus, cost, request)?;
    Ok((gpus, report))
}

/// Whether `gpus` stay inside one domain of the lowest level (from the NVLink domain up) whose
/// largest domain could hold all of them: no other placement spans less.
fn tightest(topo: &Topology, gpus: &[u32]) -> bool {
    let Some(&first) = gpus.first() else {
        return true;
    };
    for level in topo.nvlink_level()..topo.num_levels() {
        let largest = topo.domain_sizes(level).iter().copied().max().unwrap_or(0);
        if largest as usize >= gpus.len() {
            let home = topo.domain_of(first as usize, level);
            return gpus
                .iter()
                .all(|&g| topo.domain_of(g as usize, level) == home);
        }
    }
    true
}

/// [`place`] within the request's power budgets: in each phase slot the job may take (every
/// slot for a synchronised job, else slot 0), the free GPUs beyond each domain's headroom are
/// fenced off for the solver ([`Ledger::held`]) and the solver runs and is gated as in
/// [`place`]; the cheapest placement by communication plus storage seconds wins (the earliest
/// slot on a tie), and a first placement that no slot could keep tighter ([`tightest`]) ends
/// the search. Returns the GPUs, the report and the slot; the last slot's `Infeasible` when no
/// slot places the job. The state is as it was on return (the fence is lifted, also on error).
/// Without power in the request: [`place`], slot 0.
pub fn place_within_power(
    state: &mut ClusterState,
    job: &JobSpec,
    solver: &str,
    opts: &SolveOptions,
    request: &Request,
) -> Result<(Vec<u32>, Report, u32)> {
    let Some(power) = &request.power else {
        let (gpus, report) = place(state, job, solver, opts, request)?;
        return Ok((gpus, report, 0));
    };
    let n = state.topology().num_gpus();
    if power.model.num_gpus() != n {
        return Err(CoreError::InvalidState(format!(
            "power domains of a topology of {} GPUs, the state has {n}",
            power.model.num_gpus()
        )));
    }
    let slots = match power.job {
        Some(p) if p.synchronized => power.model.phases(),
        _ => 1,
    };
    let free: Vec<bool> = (0..n).map(|g| state.is_free(g)).collect();
    let mut best: Option<(f64, Vec<u32>, Report, u32)> = None;
    let mut last: Option<CoreError> = None;
    for slot in 0..slots {
        // Held GPUs are free, so none is fenced already: lifting the fence restores the state.
        let held = power
            .ledger
            .held(&power.model, &free, power.job.as_ref(), slot, &[]);
        state.set_fence(&held, true)?;
        let found = place(state, job, solver, opts, request);
        state.set_fence(&held, false)?;
        let (gpus, report) = match found {
            Ok(found) => found,
            Err(e @ CoreError::Infeasible(_)) => {
                last = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        if best.is_none() && tightest(state.topology(), &gpus) {
            return Ok((gpus, report, slot));
        }
        let price = report.cost.comm_seconds + report.io_seconds;
        if best
            .as_ref()
            .is_none_or(|(cheapest, ..)| price < cheapest * (1.0 - 1e-12))
        {
            best = Some((price, gpus, report, slot));
        }
    }
    match best {
        Some((_, gpus, report, slot)) => Ok((gpus, report, slot)),
        None => Err(last.unwrap_or_else(|| CoreError::Infeasible("no placement".into()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::testing::tp_dp_job;
    use crate::storage::{Attach, Store};
    use crate::topology::tests::tree;
    use std::sync::Arc;

    fn shared_full(
        state: &ClusterState,
        job: &JobSpec,
        gpus: &[u32],
        request: &Request,
    ) -> (Option<ContentionReport>, IoTime) {
        shared(state, job, gpus, request).unwrap()
    }

    #[test]
    fn one_call_gives_the_gated_placement_its_contention_and_its_storage_seconds() {
        let topo = Arc::new(tree(8, 8, 2));
        let job = Arc::new(tp_dp_job(&topo, 8, 2));
        let mut state = ClusterState::new(topo.clone());
        let empty = Request::default();
        // Nobody on the fabric: no contention part, no storage.
        let (gpus, report) = place(&state, &job, "greedy", &SolveOptions::default(), &empty)
            .expect("an empty cluster fits 16 GPUs");
        assert!(report.contention.is_none());
        assert_eq!(report.io_seconds, 0.0);
        assert_eq!(
            report.cost,
            crate::cost::evaluate_in(&state, &job, &gpus).unwrap()
        );

        // A running job across two leaves loads the fabric: the report prices a new
        // placement against it, alone and contended, in the same call.
        let running: Vec<u32> = (0..8).chain(16..24).collect();
        state
            .allocate_job("running", &running, Some(job.clone()))
            .unwrap();
        assert!(fabric_loaded(&state));
        let store = Store::new(
            &topo,
            Attach::Domain {
                level: 1,
                domain: 0,
            },
            10.0,
            10.0,
        )
        .unwrap();
        let request = Request {
            io: vec![IoDemand {
                store,
                read_bytes: 1e9,
                write_bytes: 0.0,
            }],
            power: None,
        };
        let far: Vec<u32> = (32..40).chain(48..56).collect();
        let report = admit(&state, &job, &far, "test", false, &request).unwrap();
        let seen = report.contention.clone().expect("the fabric is loaded");
        assert_eq!(seen, fabric::contention(&state, &job, &far).unwrap());
        assert_eq!(report.cost.comm_seconds, seen.contended_seconds);
        let io = storage::io_seconds(&state, &request.io[0].store, 1e9, 0.0, &far).unwrap();
        assert!(io > 0.0);
        assert_eq!(report.io_seconds, io);
        assert_eq!(price(&state, &job, &far, &request).unwrap(), report);

        // The running job alone on the fabric: its contention is its own price on the state,
        // as fabric::contention finds it (without pricing it again).
        let alone_state = {
            let mut s = ClusterState::new(topo.clone());
            s.allocate_job("running", &running, Some(job.clone()))
                .unwrap();
            s
        };
        let priced = price(&alone_state, &job, &running, &empty).unwrap();
        assert_eq!(
            priced.contention,
            Some(fabric::contention(&alone_state, &job, &running).unwrap())
        );
        let shared = Shared::of(&alone_state, &job, &running, &request).unwrap();
        let before = crate::cost::evaluate_in(&alone_state, &job, &running).unwrap();
        assert_eq!(
            shared.finish(before.comm_seconds),
            shared_full(&alone_state, &job, &running, &request)
        );
        // With a neighbour on the fabric, the same placement is priced against it.
        let shared = Shared::of(&state, &job, &far, &request).unwrap();
        let far_cost = crate::cost::evaluate_in(&state, &job, &far).unwrap();
        assert_eq!(
            shared.finish(far_cost.comm_seconds),
            shared_full(&state, &job, &far, &request)
        );

        // The gate still refuses what it refused.
        let err = admit(&state, &job, &running, "test", false, &request).unwrap_err();
        assert!(err.to_string().contains("allocated to job 'running'"));
    }

    #[test]
    fn the_slot_loop_places_in_the_slot_the_budgets_leave_room_in_and_leaves_no_fence() {
        use crate::power::{JobPower, PowerDomain, PowerModel};
        // 4 leaves of 16 GPUs at 700 W, 10 kW per leaf, 2 phase slots; everything but leaf 0
        // is taken, and a synchronised job (700 W peak, 400 W average) peaks in slot 0 on
        // GPUs 0..8: slot 0 leaves room for 6 more GPUs ((10,000 - 5,600) / 700), slot 1 for
        // all 8 free ones (min(6,800 / 700, 4,400 / 400) = 9).
        let topo = Arc::new(tree(8, 8, 2));
        let mut state = ClusterState::new(topo.clone());
        let synced = JobPower {
            peak_w: Some(700.0),
            average_w: Some(400.0),
            synchronized: true,
        };
        state.allocate("s0", &(0..8).collect::<Vec<_>>()).unwrap();
        state
            .allocate("rest", &(16..64).collect::<Vec<_>>())
            .unwrap();
        let domains = (0..4)
            .map(|_| PowerDomain {
                budget_w: 10_000.0,
                max_synchronized: None,
            })
            .collect();
        let gpus = (0..4u32).map(|r| (r * 16..r * 16 + 16).collect()).collect();
        let model = Arc::new(PowerModel::new(domains, 2, vec![700.0; 64], gpus).unwrap());
        let (ledger, _) = model
            .ledger_of_state(&state, |name| ((name == "s0").then_some(&synced), 0))
            .unwrap();
        let request = Request {
            io: Vec::new(),
            power: Some(PowerRequest {
                model,
                ledger,
                job: Some(synced),
            }),
        };
        let free_before: Vec<bool> = (0..64).map(|g| state.is_free(g)).collect();
        let opts = SolveOptions::default();
        let eight = tp_dp_job(&topo, 8, 1);
        let (gpus, report, slot) =
            place_within_power(&mut state, &eight, "greedy", &opts, &request).unwrap();
        assert_eq!(slot, 1);
        assert_eq!(gpus, (8..16).collect::<Vec<_>>());
        assert_eq!(report, price(&state, &eight, &gpus, &request).unwrap());
        let free_after: Vec<bool> = (0..64).map(|g| state.is_free(g)).collect();
        assert_eq!(free_before, free_after);
        // A job of 6 fits slot 0 on one host: the first slot wins.
        let six = tp_dp_job(&topo, 2, 3);
        let (_, _, slot) = place_within_power(&mut state, &six, "greedy", &opts, &request).unwrap();
        assert_eq!(slot, 0);
        // 16 GPUs fit no slot: Infeasible, and the fence is lifted all the same.
        let sixteen = tp_dp_job(&topo, 8, 2);
        let err = place_within_power(&mut state, &sixteen, "greedy", &opts, &request);
        assert!(matches!(err, Err(CoreError::Infeasible(_))), "{err:?}");
        assert!(state.fenced().iter().all(|&f| !f));
        // An unsynchronised job takes slot 0 only: 6 GPUs there, so 8 do not fit.
        let plain = Request {
            power: request
                .power
                .clone()
                .map(|p| PowerRequest { job: None, ..p }),
            ..request.clone()
        };
        // Board power, unsynchronised: (10,000 - 3,200 - 2,400) / 700 = 6.
        assert!(place_within_power(&mut state, &eight, "greedy", &opts, &plain).is_err());
        assert!(place_within_power(&mut state, &six, "greedy", &opts, &plain).is_ok());
    }
}
