//! Rank mapping as a quadratic assignment problem (QAP).
//!
//! Minimise `cost(p) = sum_ij traffic[i][j] * distance[p[i]][p[j]]`, where `p[i]` is the location
//! of rank `i`. Ranks go to distinct locations; when there are fewer ranks (`n`) than locations
//! (`m`) the extra locations stay empty (internally they hold zero-traffic dummy ranks).
//!
//! # Algorithm
//! 1. **Construction.** If the distance matrix is ultrametric (a hierarchy: GPUs in a node, nodes
//!    in a rack, racks in a cluster), the hierarchy tree is recovered from the matrix and ranks are
//!    grouped top-down into the tree's blocks by heavy-edge region growing (a greedy graph
//!    partitioning that fills each block with the ranks most connected to it). Otherwise a greedy
//!    construction places the rank most connected to the already placed ones on the free location
//!    that adds the least cost.
//! 2. **Local search.** Dense problems (up to a few thousand locations with a reasonably dense
//!    traffic matrix) run Taillard's robust tabu search (RoTS, 1991): all pairwise swaps are
//!    evaluated every iteration from a delta matrix kept up to date in O(1) per pair after a swap;
//!    on stagnation it restarts from a perturbation of its best solution.
//!    Sparse or very large problems run an iterated local search whose swap moves are evaluated
//!    in O(degree) and are guided towards locations close to a rank's traffic partners.
//! 3. **Multi-start.** `threads` independent searches run in parallel (rayon), each with its own
//!    seed derived from `seed`; the best result wins (ties: lowest search index).
//!
//! # Determinism
//! Each search follows a trajectory that depends only on the input, `seed`, its search index and
//! `initial`, never on the clock: the time limit only decides *where* the trajectory is cut.
//! Hence:
//! * With `max_iterations = Some(k)` and a time limit that is not reached, the result is a pure
//!   function of (input, seed, threads, initial, k), whatever the machine load.
//! * With a binding time limit the result is the best point of the same trajectories seen so far:
//!   more time means more iterations and a result that is never worse.
//! * The returned mapping is never worse than `initial` when one is given.
//!
//! `max_iterations` caps the iterations of *each* search (RoTS: tabu moves; iterated local search:
//! perturbation rounds, after an initial descent that always runs). `Mapping::iterations` is the
//! total over all searches. The construction phase is not interruptible: its cost is about
//! O(levels * m^2) for the hierarchy detection plus near-linear work in the traffic edges, i.e.
//! milliseconds for m in the hundreds and around a second for m ~ 16k. A run with a time limit
//! too large to represent as a deadline and no `max_iterations` does not stop: give one of them.
//!
//! Engine choice: the dense tabu search when m <= 1024 and (m <= 256 or the traffic has at least
//! 5 % non-zero entries); the sparse iterated local search otherwise.

mod construct;
mod hier;
mod model;
mod rots;
mod sparse;
#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use model::{FlowCsr, Problem};

/// Traffic between ranks: how much rank `i` sends to rank `j`.
#[derive(Debug, Clone, PartialEq)]
pub enum Traffic {
    /// Row-major `n * n` matrix.
    Dense { n: usize, values: Vec<f64> },
    /// Directed weighted edges `(src, dst, weight)`; duplicates are summed.
    Sparse {
        n: usize,
        edges: Vec<(u32, u32, f64)>,
    },
}

impl Traffic {
    /// Number of ranks.
    pub fn n(&self) -> usize {
        match self {
            Traffic::Dense { n, .. } | Traffic::Sparse { n, .. } => *n,
        }
    }
}

/// Options of [`map_ranks`].
#[derive(Debug, Clone, PartialEq)]
pub struct QapOptions {
    /// Wall-clock budget of the search (construction included).
    pub time_limit: Duration,
    /// Seed of every random choice.
    pub seed: u64,
    /// Number of independent parallel searches (>= 1).
    pub threads: usize,
    /// Optional starting mapping (`initial[rank] = location`); the result is never worse.
    pub initial: Option<Vec<usize>>,
    /// Optional cap on the iterations of each search.
    pub max_iterations: Option<u64>,
}

impl Default for QapOptions {
    fn default() -> Self {
        QapOptions {
            time_limit: Duration::from_secs(1),
            seed: 0,
            threads: 1,
            initial: None,
            max_iterations: None,
        }
    }
}

/// Result of [`map_ranks`].
#[derive(Debug, Clone, PartialEq)]
pub struct Mapping {
    /// `perm[rank] = location`, length `n`, distinct locations `< m`.
    pub perm: Vec<usize>,
    /// `qap_cost` of `perm`.
    pub cost: f64,
    /// Total search iterations over all parallel searches.
    pub iterations: u64,
    /// Wall-clock time spent.
    pub elapsed: Duration,
}

/// Input errors of [`map_ranks`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QapError {
    #[error("traffic matrix has {got} entries; expected n*n = {expected} for n = {n} ranks")]
    TrafficShape {
        n: usize,
        expected: usize,
        got: usize,
    },
    #[error("distance matrix has {got} entries; expected m*m = {expected} for m = {m} locations")]
    DistanceShape {
        m: usize,
        expected: usize,
        got: usize,
    },
    #[error("traffic edge #{index} ({src} -> {dst}) names a rank >= n = {n}")]
    EdgeOutOfRange {
        index: usize,
        src: u32,
        dst: u32,
        n: usize,
    },
    #[error("traffic entry ({row}, {col}) is not finite: {value}")]
    TrafficNotFinite { row: usize, col: usize, value: f64 },
    #[error("distance entry ({row}, {col}) is not finite: {value}")]
    DistanceNotFinite { row: usize, col: usize, value: f64 },
    #[error("more ranks ({n}) than locations ({m}): every rank needs its own location")]
    TooManyRanks { n: usize, m: usize },
    #[error("problem too large: {what}")]
    TooLarge { what: String },
    #[error("initial mapping has length {got}; expected one location per rank ({n})")]
    InitialLength { n: usize, got: usize },
    #[error("initial mapping sends rank {rank} to location {location}, but there are only {m} locations")]
    InitialOutOfRange {
        rank: usize,
        location: usize,
        m: usize,
    },
    #[error("initial mapping is not a permutation: ranks {first} and {second} both go to location {location}")]
    InitialNotInjective {
        first: usize,
        second: usize,
        location: usize,
    },
    #[error("threads must be at least 1 (got 0)")]
    ZeroThreads,
}

/// Largest number of locations handled (ranks and locations are stored as `u32`).
const MAX_LOCATIONS: usize = 1 << 30;

fn validate(
    traffic: &Traffic,
    distance: &[f64],
    m: usize,
    opts: &QapOptions,
) -> Result<(), QapError> {
    if opts.threads == 0 {
        return Err(QapError::ZeroThreads);
    }
    if m > MAX_LOCATIONS {
        return Err(QapError::TooLarge {
            what: format!("{m} locations (at most {MAX_LOCATIONS})"),
        });
    }
    let mm = m.checked_mul(m).ok_or_else(|| QapError::TooLarge {
        what: format!("{m}*{m} distance entries overflow"),
    })?;
    if distance.len() != mm {
        return Err(QapError::DistanceShape {
            m,
            expected: mm,
            got: distance.len(),
        });
    }
    let n = traffic.n();
    match traffic {
        Traffic::Dense { n, values } => {
            let nn = n.checked_mul(*n).ok_or_else(|| QapError::TooLarge {
                what: format!("{n}*{n} traffic entries overflow"),
            })?;
            if values.len() != nn {
                return Err(QapError::TrafficShape {
                    n: *n,
                    expected: nn,
                    got: values.len(),
                });
            }
            if let Some(k) = values.iter().position(|v| !v.is_finite()) {
                return Err(QapError::TrafficNotFinite {
                    row: k / n,
                    col: k % n,
                    value: values[k],
                });
            }
        }
        Traffic::Sparse { n, edges } => {
            for (index, &(src, dst, w)) in edges.iter().enumerate() {
                if src as usize >= *n || dst as usize >= *n {
                    return Err(QapError::EdgeOutOfRange {
                        index,
                        src,
                        dst,
                        n: *n,
                    });
                }
                if !w.is_finite() {
                    return Err(QapError::TrafficNotFinite {
                        row: src as usize,
                        col: dst as usize,
                        value: w,
                    });
                }
            }
        }
    }
    if let Some(k) = distance.iter().position(|v| !v.is_finite()) {
        return Err(QapError::DistanceNotFinite {
            row: k / m,
            col: k % m,
            value: distance[k],
        });
    }
    if n > m {
        return Err(QapError::TooManyRanks { n, m });
    }
    if let Some(init) = &opts.initial {
        check_perm(init, n, m)?;
    }
    Ok(())
}

fn check_perm(perm: &[usize], n: usize, m: usize) -> Result<(), QapError> {
    if perm.len() != n {
        return Err(QapError::InitialLength { n, got: perm.len() });
    }
    let mut owner = vec![usize::MAX; m];
    for (rank, &loc) in perm.iter().enumerate() {
        if loc >= m {
            return Err(QapError::InitialOutOfRange {
                rank,
                location: loc,
                m,
            });
        }
        if owner[loc] != usize::MAX {
            return Err(QapError::InitialNotInjective {
                first: owner[loc],
                second: rank,
                location: loc,
            });
        }
        owner[loc] = rank;
    }
    Ok(())
}

/// Cost of `perm` (`perm[rank] = location`) under `traffic` and the row-major `m * m` `distance`.
///
/// Never panics: returns NaN when the shapes do not match or `perm` is not an injective map of
/// the `n` ranks into `0..m`.
pub fn qap_cost(traffic: &Traffic, distance: &[f64], m: usize, perm: &[usize]) -> f64 {
    let n = traffic.n();
    if m.checked_mul(m) != Some(distance.len()) || n > m || check_perm(perm, n, m).is_err() {
        return f64::NAN;
    }
    match traffic {
        Traffic::Dense { values, .. } => {
            if n.checked_mul(n) != Some(values.len()) {
                return f64::NAN;
            }
            let mut total = 0.0;
            for i in 0..n {
                let row = &values[i * n..(i + 1) * n];
                let drow = &distance[perm[i] * m..(perm[i] + 1) * m];
                let mut s = 0.0;
                for j in 0..n {
                    s += row[j] * drow[perm[j]];
                }
                total += s;
            }
            total
        }
        Traffic::Sparse { edges, .. } => {
            let mut total = 0.0;
            for &(a, b, w) in edges {
                let (a, b) = (a as usize, b as usize);
                if a >= n || b >= n {
                    return f64::NAN;
                }
                total += w * distance[perm[a] * m + perm[b]];
            }
            total
        }
    }
}

/// Seed of search `index`, derived from the user seed (splitmix64).
fn search_seed(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Map ranks to locations minimising `qap_cost`. See the module documentation.
pub fn map_ranks(
    traffic: &Traffic,
    distance: &[f64],
    m: usize,
    opts: &QapOptions,
) -> Result<Mapping, QapError> {
    let start = Instant::now();
    validate(traffic, distance, m, opts)?;
    let n = traffic.n();
    let deadline = start.checked_add(opts.time_limit);
    let max_iter = opts.max_iterations.unwrap_or(u64::MAX);

    let finish = |perm: Vec<usize>, iterations: u64| {
        let cost = qap_cost(traffic, distance, m, &perm);
        Mapping {
            perm,
            cost,
            iterations,
            elapsed: start.elapsed(),
        }
    };
    if n == 0 {
        return Ok(finish(Vec::new(), 0));
    }
    if m == 1 {
        return Ok(finish(vec![0], 0));
    }

    let csr = FlowCsr::from_traffic(traffic, m);
    let mut problem = Problem::new(n, m, distance, csr);
    let hierarchy = hier::Hierarchy::detect(distance, m);
    if problem.dense.is_none() {
        problem.near = Some(sparse::Near::build(distance, m, hierarchy.as_ref()));
    }
    let problem = problem;

    // Each search: construct (or take the initial mapping), then improve.
    let run_search = |index: usize| -> (Vec<usize>, u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(search_seed(opts.seed, index as u64));
        let start_perm = construct::start(
            &problem,
            hierarchy.as_ref(),
            opts.initial.as_deref(),
            index,
            &mut rng,
        );
        problem.improve(start_perm, &mut rng, deadline, max_iter)
    };

    let results: Vec<(Vec<usize>, u64)> = if opts.threads == 1 {
        vec![run_search(0)]
    } else {
        match rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads)
            .build()
        {
            Ok(pool) => {
                pool.install(|| (0..opts.threads).into_par_iter().map(run_search).collect())
            }
            // No thread pool available: run the searches one after the other, same results.
            Err(_) => (0..opts.threads).map(run_search).collect(),
        }
    };

    let mut iterations = 0u64;
    let mut best: Option<(f64, Vec<usize>)> = None;
    for (full_perm, iters) in results {
        iterations = iterations.saturating_add(iters);
        let perm: Vec<usize> = full_perm[..n].to_vec();
        let cost = qap_cost(traffic, distance, m, &perm);
        if best.as_ref().is_none_or(|(c, _)| cost < *c) {
            best = Some((cost, perm));
        }
    }
    let (best_cost, mut best_perm) = best.expect("at least one search");
    if let Some(init) = &opts.initial {
        // Never worse than the caller's mapping (exact costs, same summation).
        if qap_cost(traffic, distance, m, init) < best_cost {
            best_perm = init.clone();
        }
    }
    Ok(finish(best_perm, iterations))
}
