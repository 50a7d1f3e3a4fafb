//! The one gate every placement passes before it is handed back, whatever solver made it.
//!
//! [`admit`] checks a proposed placement against the state it is meant for: one GPU per rank,
//! no GPU twice, every GPU existing, free, healthy and not a reserved spare, and, for a solver
//! that promises confinement, every confined group inside its domain and the job inside its
//! max span. It then prices the placement with the one cost model on the state's hardware and
//! against its running jobs' load on the fabric (contention), so the caller gets the GPUs and
//! their cost from one call. A placement that fails the gate is an [`CoreError::InvalidState`]
//! naming the solver, the GPU or group and what was expected.

use crate::cost::{evaluate_in_checked, CostReport};
use crate::error::{CoreError, Result};
use crate::job::JobSpec;
use crate::solvers::{self, SolveOptions};
use crate::state::ClusterState;
use crate::topology::check_placement;

/// Check `gpus` (the GPU of each rank) proposed by `solver` for `job` on `state`, and price it.
/// `confining`: the solver promises to keep the job's confinement rules.
pub fn admit(
    state: &ClusterState,
    job: &JobSpec,
    gpus: &[u32],
    solver: &str,
    confining: bool,
) -> Result<CostReport> {
    check(state, job, gpus, solver)?;
    let report = evaluate_in_checked(state, job, gpus)?;
    confined(report, solver, confining)
}

fn invalid(solver: &str, what: String) -> CoreError {
    CoreError::InvalidState(format!(
        "solver '{solver}' returned an invalid placement: {what}"
    ))
}

/// Everything [`admit`] checks before it prices: one GPU per rank, none twice, each existing,
/// free and healthy.
fn check(state: &ClusterState, job: &JobSpec, gpus: &[u32], solver: &str) -> Result<()> {
    let bad = |what: String| invalid(solver, what);
    check_placement(state.topology(), job.num_ranks, gpus).map_err(|e| bad(e.to_string()))?;
    for (rank, &g) in gpus.iter().enumerate() {
        let g = g as usize;
        if state.is_free(g) {
            continue;
        }
        let why = if let Some(owner) = state.owner_of(g) {
            format!("is allocated to job '{owner}'")
        } else if !state.health()[g].usable() {
            format!("is {:?}", state.health()[g]).to_lowercase()
        } else if state.fenced()[g] {
            "is fenced off for this job (outside its pool or excluded by a hardware rule)"
                .to_string()
        } else {
            "is a reserved spare".to_string()
        };
        return Err(bad(format!(
            "rank {rank} is on GPU {g}, which {why}; a placement may use only free, healthy GPUs"
        )));
    }
    Ok(())
}

/// The report of an admitted placement, unless its solver promised confinement and it
/// breaks it.
fn confined(report: CostReport, solver: &str, confining: bool) -> Result<CostReport> {
    if confining && !report.confinement_ok {
        return Err(invalid(
            solver,
            format!(
                "it promises confinement but breaks it: {}",
                report.violations.join("; ")
            ),
        ));
    }
    Ok(report)
}

/// Run a Rust solver and pass its placement through [`admit`]: the GPUs and their cost. A
/// solver that priced its answer on `state` as [`admit`] prices it (greedy choosing among
/// packings) hands that report over: the placement is checked, not priced again.
pub fn place(
    state: &ClusterState,
    job: &JobSpec,
    solver: &str,
    opts: &SolveOptions,
) -> Result<(Vec<u32>, CostReport)> {
    let (gpus, priced) = solvers::solve_priced(solver, state, job, opts)?;
    let confining = solvers::confining(solver);
    let report = match priced {
        Some(report) => {
            check(state, job, &gpus, solver)?;
            confined(report, solver, confining)?
        }
        None => admit(state, job, &gpus, solver, confining)?,
    };
    Ok((gpus, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Collective, CollectiveKind, Dim};
    use crate::state::GpuStatus;
    use crate::topology::tests::tree;
    use std::sync::Arc;

    /// A job of one tp group of `tp` ranks confined to a host.
    fn tp_job(topo: &crate::Topology, tp: usize) -> JobSpec {
        let dims = vec![Dim {
            name: "tp".into(),
            size: tp,
            confine: Some(topo.node_level()),
        }];
        let collectives = vec![Collective {
            group: 0,
            kind: CollectiveKind::AllReduce,
            bytes: 1e9,
            count: 1.0,
            class: 0,
            dim: Some(0),
        }];
        let ranks = (0..tp as u32).collect();
        JobSpec::new(tp, dims, 2, vec![0, tp], ranks, collectives, vec![], topo).unwrap()
    }

    #[test]
    fn admits_a_good_placement_and_prices_it() {
        let topo = Arc::new(tree(4, 8, 2));
        let state = ClusterState::new(topo.clone());
        let job = tp_job(&topo, 2);
        let report = admit(&state, &job, &[0, 1], "t", true).unwrap();
        assert!(report.confinement_ok && report.comm_seconds > 0.0);
    }

    #[test]
    fn refuses_short_duplicate_taken_failed_and_unconfined_placements() {
        let topo = Arc::new(tree(4, 8, 2));
        let mut state = ClusterState::new(topo.clone());
        let job = tp_job(&topo, 2);
        let err = |gpus: &[u32], state: &ClusterState, confining: bool| {
            admit(state, &job, gpus, "t", confining)
                .unwrap_err()
                .to_string()
        };
        assert!(err(&[0], &state, false).contains("1 GPUs for a job of 2 ranks"));
        assert!(err(&[3, 3], &state, false).contains("GPU 3 is given to two ranks"));
        state.allocate("other", &[5]).unwrap();
        assert!(err(&[4, 5], &state, false).contains("allocated to job 'other'"));
        state.set_health(&[6], GpuStatus::Failed).unwrap();
        assert!(err(&[6, 7], &state, false).contains("GPU 6, which is failed"));
        let far = (topo.num_gpus() - 1) as u32;
        assert!(admit(&state, &job, &[0, far], "t", false).is_ok());
        assert!(err(&[0, far], &state, true).contains("promises confinement"));
        state.set_fence(&[9], true).unwrap();
        assert!(err(&[8, 9], &state, false).contains("GPU 9, which is fenced off"));
    }
}
