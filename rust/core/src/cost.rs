//! The one cost model. Every cost gpuplace reports comes from [`evaluate`].
//!
//! A collective over `n` ranks moving `S` bytes per rank is priced with the alpha-beta model
//! of ring algorithms (Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication
//! Operations in MPICH", IJHPCA 2005; the same bus-bandwidth factors NCCL's performance notes
//! use):
//!
//! | kind | steps (latency terms) | bytes each rank sends |
//! |---|---|---|
//! | all-reduce | 2 (n-1) | 2 (n-1)/n · S |
//! | all-gather, reduce-scatter | n-1 | (n-1)/n · S |
//! | all-to-all | n-1 | (n-1)/n · S |
//! | point-to-point | 1 | S |
//!
//! The ring visits the group's GPUs in GPU-id order (which follows the topology); its
//! bandwidth `B` is that of its slowest hop, its latency that of the highest level it spans.
//! An all-to-all is limited by its slowest pair. Time = count · (steps · latency + bytes / B).
//!
//! Collectives of one class (e.g. the tp all-reduces of every tp group) run concurrently: a
//! class costs its slowest member. Classes run one after another (no overlap of communication
//! with computation or with each other is assumed). Explicit traffic (rank i sends T bytes to
//! rank j) is priced as `T / B(i, j)` per entry and summed: the quadratic-assignment form.
//!
//! ## Degraded hardware
//!
//! A degraded component (GPU, host, NIC or switch; see [`crate::state`]) carries a bandwidth
//! factor `f` in (0, 1]. A path between GPUs `a` and `b` whose lowest common level is `l`
//! crosses: both GPUs and both hosts (always); both NICs once `l` is above the NVLink domain;
//! and the switches of both GPUs at every level from just above the host up to `l` (at `l`
//! itself the two are the same switch). The path's bandwidth is the healthy bandwidth times
//! the smallest factor on it: a path runs at the pace of its bottleneck, so two hops degraded
//! to 0.5 still give 0.5, not 0.25. The state keeps, per GPU and level, the smallest factor on
//! its half of the path (its *side factor*), so pricing a pair is one `min` of two lookups.
//! Failed and drained hardware is not priced: no solver may use it.
//!
//! Packet loss maps to a factor with [`loss_factor`]: `f = 1 / (1 + p / 0.01)`, so 1 % loss
//! halves the goodput, 0.1 % costs about 9 % and 5 % leaves a sixth. RDMA NICs recover losses
//! by go-back-N (or, on newer NICs, selective repeat) in hardware, which makes goodput far more
//! sensitive to loss than TCP's `1/sqrt(p)`: Wang et al., "Error Recovery of RDMA Packets in
//! Data Center Networks" (ICCCN 2019) measure plain go-back-N RoCEv2 falling to nearly zero
//! relative throughput above 1 % loss and an improved go-back-N keeping about 60 % at 1 %;
//! Mittal et al., "Revisiting Network Support for RDMA" (SIGCOMM 2018) show the same collapse
//! and the recovery selective repeat gives. Halving at 1 % sits between the two, and the curve
//! is smooth so that ranking two degraded links by loss stays monotone. A link that trained at
//! reduced width or speed has factor `trained / nominal` (x2 of x4 gives 0.5). Callers with a
//! measured goodput should pass the factor directly.
//!
//! ## Contention
//!
//! Priced in a state ([`evaluate_in`]), a collective also shares the fabric's uplinks with the
//! running jobs: its bandwidth is multiplied by the smallest fair share it gets on the uplinks
//! its flows cross ([`crate::fabric`] has the model and what it leaves out).

use crate::error::{CoreError, Result};
use crate::fabric::Background;
use crate::job::{CollectiveKind, JobSpec};
use crate::state::ClusterState;
use crate::topology::Topology;

/// Costs of one placement.
#[derive(Debug, Clone, PartialEq)]
pub struct CostReport {
    /// Estimated communication time per step (s).
    pub comm_seconds: f64,
    /// Time per collective class (s): the slowest collective of the class.
    pub class_seconds: Vec<f64>,
    /// Time of the explicit traffic (s), included in `comm_seconds`.
    pub traffic_seconds: f64,
    /// Bytes per step whose path's lowest common level is each level.
    pub bytes_by_level: Vec<f64>,
    /// The lowest level whose one domain holds every GPU of the job (None for one GPU).
    pub span_level: Option<usize>,
    /// Every confined group stays inside its level and the job inside `max_span`.
    pub confinement_ok: bool,
    /// What broke confinement, in words (at most [`MAX_VIOLATIONS`] entries).
    pub violations: Vec<String>,
}

pub const MAX_VIOLATIONS: usize = 8;

/// Lowest level whose one domain holds all `gpus` (None for fewer than two GPUs).
pub fn span_of(topo: &Topology, gpus: &[u32]) -> Option<usize> {
    if gpus.len() < 2 {
        return None;
    }
    let first = gpus[0] as usize;
    let mut span = 0;
    for &g in &gpus[1..] {
        span = span.max(topo.lca(first, g as usize));
    }
    Some(span)
}

use crate::topology::check_placement;

/// Bandwidth factor of a path with packet loss rate `loss` (a fraction, 0.01 = 1 %), per the
/// model in the module docs; never below [`MIN_FACTOR`] so costs stay finite.
pub fn loss_factor(loss: f64) -> f64 {
    if !loss.is_finite() || loss <= 0.0 {
        return 1.0;
    }
    (1.0 / (1.0 + loss / LOSS_HALVING)).max(MIN_FACTOR)
}

/// The loss rate that halves RDMA goodput in [`loss_factor`].
pub const LOSS_HALVING: f64 = 0.01;
/// The smallest bandwidth factor a degradation may have.
pub const MIN_FACTOR: f64 = 1e-3;

/// The per-GPU side factors of a state (`num_gpus x levels`), or none when nothing is degraded.
#[derive(Clone, Copy)]
pub(crate) struct Health<'a> {
    factors: Option<&'a [f32]>,
    levels: usize,
    /// The neighbours' load on the fabric, when pricing against running jobs.
    fabric: Option<Background<'a>>,
    /// The load of the priced collective's class, on an oversubscribed fabric: the job's
    /// concurrent collectives share the uplinks too.
    class_load: Option<&'a [(u32, f64)]>,
}

impl<'a> Health<'a> {
    /// The hardware of `state`, degraded components included.
    pub(crate) fn of(state: &'a ClusterState) -> Health<'a> {
        Health {
            factors: state.path_factors(),
            levels: state.topology().num_levels(),
            fabric: None,
            class_load: None,
        }
    }

    /// The hardware of `state` and its running jobs' load, for a job placed on `gpus` (its
    /// own load is not counted against it when it already runs there).
    pub(crate) fn with_neighbours(state: &'a ClusterState, gpus: &[u32]) -> Health<'a> {
        Health {
            fabric: Background::of(state, gpus),
            ..Health::of(state)
        }
    }

    /// Bandwidth (GB/s) between two distinct GPUs, degraded hardware included.
    #[inline]
    pub(crate) fn bandwidth(&self, topo: &Topology, a: usize, b: usize, lca: usize) -> f64 {
        let healthy = topo.pair_bandwidth(a, b);
        match self.factors {
            None => healthy,
            Some(f) => {
                let nl = self.levels;
                healthy * f[a * nl + lca].min(f[b * nl + lca]) as f64
            }
        }
    }
}

struct Scratch {
    members: Vec<u32>,
}

/// Time (s) of one call of a collective over `members` (GPU ids, reordered in place). When
/// `bytes_by_level` is given, adds the bytes of `weight` calls to it.
pub(crate) fn collective_cost(
    topo: &Topology,
    kind: CollectiveKind,
    bytes: f64,
    members: &mut [u32],
    mut bytes_by_level: Option<&mut [f64]>,
    weight: f64,
    health: Health<'_>,
) -> f64 {
    let n = members.len();
    if n < 2 {
        return 0.0;
    }
    let levels = topo.levels();
    let nf = n as f64;
    if kind == CollectiveKind::PointToPoint {
        let (a, b) = (members[0] as usize, members[1] as usize);
        let l = topo.lca(a, b);
        if let Some(acc) = bytes_by_level {
            acc[l] += bytes * weight;
        }
        let share =
            crate::fabric::collective_share(topo, health.fabric, health.class_load, kind, members);
        return call_seconds(
            kind,
            n,
            bytes,
            levels[l].latency_us,
            health.bandwidth(topo, a, b, l) * share,
        );
    }
    members.sort_unstable();
    let (_, per_rank) = ring_terms(kind, n, bytes);
    let mut span = 0usize;
    let mut slowest = f64::INFINITY;
    if kind == CollectiveKind::AllToAll {
        // Every ordered pair exchanges S/n bytes.
        let pair_bytes = bytes / nf * weight;
        for i in 0..n {
            for j in (i + 1)..n {
                let (a, b) = (members[i] as usize, members[j] as usize);
                let l = topo.lca(a, b);
                if let Some(acc) = bytes_by_level.as_deref_mut() {
                    acc[l] += 2.0 * pair_bytes;
                }
                span = span.max(l);
                slowest = slowest.min(health.bandwidth(topo, a, b, l));
            }
        }
    } else {
        for i in 0..n {
            let (a, b) = (members[i] as usize, members[(i + 1) % n] as usize);
            let l = topo.lca(a, b);
            if let Some(acc) = bytes_by_level.as_deref_mut() {
                acc[l] += per_rank * weight;
            }
            span = span.max(l);
            slowest = slowest.min(health.bandwidth(topo, a, b, l));
        }
    }
    slowest *=
        crate::fabric::collective_share(topo, health.fabric, health.class_load, kind, members);
    call_seconds(kind, n, bytes, levels[span].latency_us, slowest)
}

/// Latency steps and bytes each rank sends for one call of a collective over `n` ranks
/// moving `bytes` per rank (the table in the module docs): an exact model prices a group as
/// `steps * latency(span) + bytes_per_rank / bandwidth(slowest hop)`.
pub fn ring_terms(kind: CollectiveKind, n: usize, bytes: f64) -> (f64, f64) {
    let nf = n as f64;
    match kind {
        CollectiveKind::PointToPoint => (1.0, bytes),
        CollectiveKind::AllReduce => (2.0 * (nf - 1.0), 2.0 * (nf - 1.0) / nf * bytes),
        _ => (nf - 1.0, (nf - 1.0) / nf * bytes),
    }
}

/// Seconds of one call over `n` ranks at a latency (µs) and a bottleneck bandwidth (GB/s).
fn call_seconds(
    kind: CollectiveKind,
    n: usize,
    bytes: f64,
    latency_us: f64,
    bandwidth_gbps: f64,
) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let (steps, per_rank) = ring_terms(kind, n, bytes);
    steps * latency_us * 1e-6 + per_rank / (bandwidth_gbps * 1e9)
}

/// Seconds of one call of a collective over `n` ranks whose group spans each level (indexed
/// by level), on healthy hardware without host matrices: the prices an exact model needs, from
/// the same formulas [`evaluate`] uses.
pub fn collective_seconds_by_level(
    topo: &Topology,
    kind: CollectiveKind,
    n: usize,
    bytes: f64,
) -> Vec<f64> {
    topo.levels()
        .iter()
        .enumerate()
        .map(|(l, level)| {
            call_seconds(
                kind,
                n,
                bytes,
                level.latency_us,
                topo.effective_bandwidth(l),
            )
        })
        .collect()
}

/// Time (s) of explicit traffic of `bytes` from GPU `a` to GPU `b`.
#[inline]
pub(crate) fn traffic_cost(
    topo: &Topology,
    health: Health<'_>,
    a: usize,
    b: usize,
    bytes: f64,
) -> f64 {
    if a == b {
        0.0
    } else {
        bytes / (health.bandwidth(topo, a, b, topo.lca(a, b)) * 1e9)
    }
}

/// Evaluate a placement (`gpus[rank]` = GPU id) of `job` on healthy hardware of `topo`.
pub fn evaluate(topo: &Topology, job: &JobSpec, gpus: &[u32]) -> Result<CostReport> {
    evaluate_with(topo, None, job, gpus)
}

/// Evaluate a placement on the hardware of `state`, degraded components included,
/// and the running jobs' load on the fabric (contention).
pub fn evaluate_in(state: &ClusterState, job: &JobSpec, gpus: &[u32]) -> Result<CostReport> {
    check_placement(state.topology(), job.num_ranks, gpus)?;
    evaluate_in_checked(state, job, gpus)
}

/// [`evaluate_in`] for a placement already known to name `job.num_ranks` distinct, existing
/// GPUs (the placement gate checks that first).
pub(crate) fn evaluate_in_checked(
    state: &ClusterState,
    job: &JobSpec,
    gpus: &[u32],
) -> Result<CostReport> {
    evaluate_health(
        state.topology(),
        Health::with_neighbours(state, gpus),
        job,
        gpus,
    )
}

/// [`evaluate_in`] for running job `name` moved to `gpus` (what a repair compares): its own
/// load where it runs now is not counted against it, so a trial is priced as it will run
/// once the job has moved.
pub fn evaluate_moved(
    state: &ClusterState,
    name: &str,
    job: &JobSpec,
    gpus: &[u32],
) -> Result<CostReport> {
    check_placement(state.topology(), job.num_ranks, gpus)?;
    let health = Health {
        fabric: Background::moving(state, name),
        ..Health::of(state)
    };
    evaluate_health(state.topology(), health, job, gpus)
}

/// Communication seconds per step of a placement on the hardware of `state` against a given
/// neighbours' load (what [`crate::fabric::added_to_neighbours`] compares).
pub(crate) fn evaluate_background(
    state: &ClusterState,
    job: &JobSpec,
    gpus: &[u32],
    fabric: Option<Background<'_>>,
) -> Result<f64> {
    let health = Health {
        fabric,
        ..Health::of(state)
    };
    Ok(evaluate_health(state.topology(), health, job, gpus)?.comm_seconds)
}

/// Evaluate a placement with optional side factors (`num_gpus x levels`, GPU-major; see the
/// module docs), as [`ClusterState::path_factors`] gives them.
pub fn evaluate_with(
    topo: &Topology,
    factors: Option<&[f32]>,
    job: &JobSpec,
    gpus: &[u32],
) -> Result<CostReport> {
    check_placement(topo, job.num_ranks, gpus)?;
    evaluate_checked(topo, factors, job, gpus)
}

/// [`evaluate_with`] for a placement already known to name `job.num_ranks` distinct, existing
/// GPUs (the placement gate checks that first).
pub(crate) fn evaluate_checked(
    topo: &Topology,
    factors: Option<&[f32]>,
    job: &JobSpec,
    gpus: &[u32],
) -> Result<CostReport> {
    if factors.is_some_and(|f| f.len() != topo.num_gpus() * topo.num_levels()) {
        return Err(CoreError::InvalidState(
            "side factors do not match the topology".into(),
        ));
    }
    let health = Health {
        factors,
        levels: topo.num_levels(),
        fabric: None,
        class_load: None,
    };
    evaluate_health(topo, health, job, gpus)
}

fn evaluate_health(
    topo: &Topology,
    health: Health<'_>,
    job: &JobSpec,
    gpus: &[u32],
) -> Result<CostReport> {
    let nl = topo.num_levels();
    let mut bytes_by_level = vec![0.0; nl];
    let mut class_seconds = vec![0.0f64; job.num_classes];
    let mut scratch = Scratch {
        members: Vec::new(),
    };
    // On an oversubscribed fabric a collective also shares the uplinks with the other
    // collectives of its class (they run concurrently).
    let class_loads = if topo.is_oversubscribed() {
        crate::fabric::class_loads(topo, job, gpus)
    } else {
        Vec::new()
    };
    for c in &job.collectives {
        let health = Health {
            class_load: class_loads.get(c.class as usize).map(Vec::as_slice),
            ..health
        };
        scratch.members.clear();
        scratch.members.extend(
            job.groups
                .row(c.group as usize)
                .iter()
                .map(|&r| gpus[r as usize]),
        );
        let t = collective_cost(
            topo,
            c.kind,
            c.bytes,
            &mut scratch.members,
            Some(&mut bytes_by_level),
            c.count,
            health,
        );
        let slot = &mut class_seconds[c.class as usize];
        *slot = slot.max(c.count * t);
    }
    let mut traffic_seconds = 0.0;
    for &(i, j, bytes) in &job.traffic {
        let (a, b) = (gpus[i as usize] as usize, gpus[j as usize] as usize);
        if a == b || bytes == 0.0 {
            continue;
        }
        bytes_by_level[topo.lca(a, b)] += bytes;
        traffic_seconds += traffic_cost(topo, health, a, b, bytes);
    }
    let comm_seconds = class_seconds.iter().sum::<f64>() + traffic_seconds;

    let span_level = span_of(topo, gpus);
    let mut violations = Vec::new();
    let mut violation_count = 0usize;
    if let Some(span) = span_level {
        if span > job.max_span {
            violation_count += 1;
            violations.push(format!(
                "the job spans a {} but may span at most a {}",
                topo.levels()[span].name,
                topo.levels()[job.max_span].name
            ));
        }
    }
    for (d, dim) in job.dims.iter().enumerate() {
        let Some(limit) = dim.confine else { continue };
        if dim.size < 2 {
            continue;
        }
        for (index, group) in job.dim_groups(d).enumerate() {
            scratch.members.clear();
            scratch
                .members
                .extend(group.iter().map(|&r| gpus[r as usize]));
            let span = span_of(topo, &scratch.members).unwrap_or(0);
            if span > limit {
                violation_count += 1;
                if violations.len() < MAX_VIOLATIONS {
                    violations.push(format!(
                        "{} group {index} (ranks {}..) spans a {} but must stay inside one {}",
                        dim.name,
                        group[0],
                        topo.levels()[span].name,
                        topo.levels()[limit].name
                    ));
                }
            }
        }
    }
    Ok(CostReport {
        comm_seconds,
        class_seconds,
        traffic_seconds,
        bytes_by_level,
        span_level,
        confinement_ok: violation_count == 0,
        violations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Collective, Dim};
    use crate::topology::tests::tree;

    fn allreduce_job(topo: &Topology, n: usize, bytes: f64) -> JobSpec {
        JobSpec::new(
            n,
            vec![Dim {
                name: "dp".into(),
                size: n,
                confine: None,
            }],
            topo.num_levels() - 1,
            vec![0, n],
            (0..n as u32).collect(),
            vec![Collective {
                group: 0,
                kind: CollectiveKind::AllReduce,
                bytes,
                count: 1.0,
                class: 0,
                dim: Some(0),
            }],
            vec![],
            topo,
        )
        .unwrap()
    }

    #[test]
    fn ring_allreduce_inside_and_across_nodes() {
        let topo = tree(4, 8, 2);
        let job = allreduce_job(&topo, 8, 1e9);
        let inside: Vec<u32> = (0..8).collect();
        let r = evaluate(&topo, &job, &inside).unwrap();
        let expect = 14.0 * 1e-6 + 2.0 * 7.0 / 8.0 * 1e9 / 450e9;
        assert!((r.comm_seconds - expect).abs() < 1e-12);
        assert_eq!(r.span_level, Some(0));
        assert!((r.bytes_by_level[0] - 8.0 * 2.0 * 7.0 / 8.0 * 1e9).abs() < 1.0);

        // Four GPUs in node 0 and four in node 2 (another leaf): two ring hops cross the spine.
        let split: Vec<u32> = vec![0, 1, 2, 3, 16, 17, 18, 19];
        let r = evaluate(&topo, &job, &split).unwrap();
        let expect = 14.0 * 4e-6 + 2.0 * 7.0 / 8.0 * 1e9 / 25e9;
        assert!((r.comm_seconds - expect).abs() < 1e-12);
        assert_eq!(r.span_level, Some(2));
        let per_edge = 2.0 * 7.0 / 8.0 * 1e9;
        assert!((r.bytes_by_level[2] - 2.0 * per_edge).abs() < 1.0);
        assert!((r.bytes_by_level[0] - 6.0 * per_edge).abs() < 1.0);
    }

    #[test]
    fn degraded_leaf_slows_only_paths_through_it() {
        use crate::state::{ClusterState, Component, ComponentHealth, Condition};
        use std::sync::Arc;
        let topo = Arc::new(tree(4, 8, 2));
        let mut s = ClusterState::new(topo.clone());
        s.set_condition(
            &[Component::Switch {
                level: 1,
                domain: 0,
            }],
            Some(ComponentHealth {
                condition: Condition::Degraded,
                factor: loss_factor(0.01),
                reason: "loss".into(),
            }),
        )
        .unwrap();
        let job = allreduce_job(&topo, 2, 1e9);
        let inside = evaluate_in(&s, &job, &[0, 1]).unwrap().comm_seconds;
        assert_eq!(inside, evaluate(&topo, &job, &[0, 1]).unwrap().comm_seconds);
        let healthy = evaluate(&topo, &job, &[0, 8]).unwrap().comm_seconds;
        let slow = evaluate_in(&s, &job, &[0, 8]).unwrap().comm_seconds;
        let latency = 2.0 * 3e-6;
        assert!(((slow - latency) / (healthy - latency) - 2.0).abs() < 1e-6);
        // The other leaf is untouched.
        assert_eq!(
            evaluate_in(&s, &job, &[16, 24]).unwrap().comm_seconds,
            evaluate(&topo, &job, &[16, 24]).unwrap().comm_seconds
        );
    }

    #[test]
    fn rejects_duplicate_gpus() {
        let topo = tree(1, 8, 1);
        let job = allreduce_job(&topo, 2, 1.0);
        assert!(evaluate(&topo, &job, &[3, 3]).is_err());
        assert!(evaluate(&topo, &job, &[3, 99]).is_err());
    }
}
