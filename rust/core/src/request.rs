//! One request in, one report out: a placement request and everything a caller needs to know
//! about the answer, computed in one call.
//!
//! A [`Request`] is the job's storage traffic (its stores and bytes per step); the state it is
//! placed on carries the policy's fence, the running jobs (for contention), the health and the
//! spares. [`place`] runs a Rust solver and the placement gate ([`crate::gate`]); [`admit`]
//! gates a placement another solver made; [`price`] prices a placement without gating it.
//! Each returns one [`Report`]: the cost model's [`CostReport`] (which carries the step time
//! and the GPU peak it was priced at), and, in a state whose running jobs load the fabric, the
//! same placement's seconds alone and the uplinks over capacity on its paths
//! ([`crate::fabric::contention`]), and the seconds per step its storage traffic takes
//! ([`crate::storage::io_seconds`]). Nothing is priced twice on the caller's side.

use crate::cost::CostReport;
use crate::error::Result;
use crate::fabric::{self, ContentionReport};
use crate::gate;
use crate::job::JobSpec;
use crate::solvers::SolveOptions;
use crate::state::ClusterState;
use crate::storage::{self, IoDemand, IoTime};

/// What a placement request carries besides the job and the state.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The job's storage traffic per step, one entry per store it reads or writes.
    pub io: Vec<IoDemand>,
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
}
