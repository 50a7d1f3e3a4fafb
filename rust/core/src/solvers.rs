//! The Rust solvers behind one signature, and the naive baselines they are measured against.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::error::{CoreError, Result};
use crate::job::JobSpec;
use crate::state::ClusterState;

/// Solvers implemented in Rust: name and one-line description.
pub const SOLVERS: &[(&str, &str)] = &[
    (
        "greedy",
        "hierarchical best-fit in Rust: tightest domain that holds the job, tp groups inside \
         NVLink domains, heaviest traffic on the lowest levels",
    ),
    (
        "refine",
        "greedy, then local search in Rust on the cost model: rank swaps and moves to free GPUs \
         next to each rank's partners, within time_limit (default 0.5 s); never worse than greedy",
    ),
    (
        "first-fit",
        "baseline: the lowest free GPU ids, ranks in order (topology-blind)",
    ),
    (
        "random",
        "baseline: random free GPUs in random rank order (seeded)",
    ),
];

/// The Rust solvers that keep a job's confinement rules (the others are topology-blind
/// baselines whose reports say when confinement breaks).
pub const CONFINING: &[&str] = &["greedy", "refine"];

/// Whether a Rust solver promises to keep the job's confinement rules.
pub fn confining(name: &str) -> bool {
    CONFINING.contains(&name)
}

/// Whether a Rust solver searches until a time limit (and so may run long).
pub fn searches(name: &str) -> bool {
    name == "refine"
}

/// Options every solver accepts.
#[derive(Debug, Clone, Default)]
pub struct SolveOptions {
    pub seed: u64,
    /// Search budget for solvers that search (s); None means their default.
    pub time_limit: Option<f64>,
    /// Leave out what a new job adds to the running jobs' time (counted by default; see
    /// [`crate::fabric::placement_cost`]).
    pub ignore_neighbours: bool,
}

/// [`solve`], and the report of the answer when the solver priced it on `state` with
/// [`crate::cost::evaluate_in`] (greedy choosing among packings; None otherwise).
pub fn solve_priced(
    name: &str,
    state: &ClusterState,
    job: &JobSpec,
    opts: &SolveOptions,
) -> Result<(Vec<u32>, Option<crate::cost::CostReport>)> {
    if name == "greedy" {
        return crate::greedy::place_with_report(state, job, !opts.ignore_neighbours);
    }
    solve(name, state, job, opts).map(|gpus| (gpus, None))
}

/// Run a Rust solver by name; returns the GPU of each rank.
pub fn solve(
    name: &str,
    state: &ClusterState,
    job: &JobSpec,
    opts: &SolveOptions,
) -> Result<Vec<u32>> {
    match name {
        "greedy" => crate::greedy::place_with(state, job, !opts.ignore_neighbours),
        "refine" => {
            let mut refine_opts = crate::refine::RefineOptions {
                seed: opts.seed,
                ..Default::default()
            };
            if let Some(limit) = opts.time_limit {
                refine_opts.time_limit = std::time::Duration::from_secs_f64(limit.max(0.0));
            }
            let neighbours = !opts.ignore_neighbours;
            let mut start = crate::greedy::place_with(state, job, neighbours)?;
            if !job.traffic.is_empty() && job.num_ranks <= 8192 {
                // An explicit traffic matrix is a quadratic assignment problem on the GPUs
                // greedy chose: order the ranks with the QAP search first (a third of the
                // budget), then let the local search also trade GPUs.
                let qap_budget = refine_opts.time_limit / 3;
                start = map_onto(state, job, &start, qap_budget, opts.seed)?;
                refine_opts.time_limit -= qap_budget;
            }
            let refined = crate::refine::refine(state, job, &start, &refine_opts)?.gpus;
            // The local search prices the job against its neighbours but not what it does to
            // them; keep its result only when that total is no worse.
            if state.fabric_load().is_some() && neighbours {
                let cost = |g: &[u32]| crate::fabric::placement_cost(state, job, g, true);
                if cost(&refined)? > cost(&start)? {
                    return Ok(start);
                }
            }
            Ok(refined)
        }
        "first-fit" => first_fit(state, job),
        "random" => random(state, job, opts.seed),
        other => Err(CoreError::InvalidJob(format!(
            "unknown solver {other:?}; the Rust solvers are {}",
            SOLVERS
                .iter()
                .map(|(name, _)| *name)
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Reorder the ranks of an explicit-traffic job over a fixed set of GPUs with the QAP search;
/// the distance is the cost model's seconds per byte between two GPUs.
fn map_onto(
    state: &ClusterState,
    job: &JobSpec,
    gpus: &[u32],
    budget: std::time::Duration,
    seed: u64,
) -> Result<Vec<u32>> {
    let topo = state.topology();
    let n = gpus.len();
    let mut distance = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            if i != j {
                let bw = topo.pair_bandwidth(gpus[i] as usize, gpus[j] as usize);
                distance[i * n + j] = 1.0 / (bw * 1e9);
            }
        }
    }
    let traffic = crate::qap::Traffic::Sparse {
        n,
        edges: job.traffic.clone(),
    };
    let qap_opts = crate::qap::QapOptions {
        time_limit: budget,
        seed,
        threads: 1,
        initial: Some((0..n).collect()),
        max_iterations: None,
    };
    let mapping = crate::qap::map_ranks(&traffic, &distance, n, &qap_opts)?;
    Ok(mapping.perm.iter().map(|&slot| gpus[slot]).collect())
}

fn free_gpus(state: &ClusterState) -> Vec<u32> {
    (0..state.topology().num_gpus())
        .filter(|&g| state.is_free(g))
        .map(|g| g as u32)
        .collect()
}

/// Baseline: the lowest free GPU ids, rank i on the i-th. Ignores topology and confinement
/// (its report says when confinement breaks), as a topology-blind scheduler would.
pub fn first_fit(state: &ClusterState, job: &JobSpec) -> Result<Vec<u32>> {
    state.check_capacity(job.num_ranks)?;
    let mut out = Vec::with_capacity(job.num_ranks);
    for g in 0..state.topology().num_gpus() {
        if out.len() == job.num_ranks {
            break;
        }
        if state.is_free(g) {
            out.push(g as u32);
        }
    }
    Ok(out)
}

/// Baseline: uniformly random free GPUs in random rank order, deterministic for a seed.
pub fn random(state: &ClusterState, job: &JobSpec, seed: u64) -> Result<Vec<u32>> {
    state.check_capacity(job.num_ranks)?;
    let mut free = free_gpus(state);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (chosen, _) = free.partial_shuffle(&mut rng, job.num_ranks);
    Ok(chosen.to_vec())
}
