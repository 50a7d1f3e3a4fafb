//! Placement policies for pods on shared GPUs: the baselines of the FGD paper (Weng et al.,
//! "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
//! Descent", USENIX ATC'23, section 6.1) and gpuplace's own.
//!
//! Every policy filters the nodes that fit the pod (CPU, memory, GPU model, GPUs with room:
//! [`NodeView::fits`]), scores each, and takes the best. Among equal scores it takes the node
//! ranked first in a random ranking of the nodes drawn once from the seed: the authors'
//! simulator runs a kube-scheduler whose `selectHost` takes the lexicographically smallest node
//! name among the best (their fork of Kubernetes 1.20.5, "for reproducibility"), after naming
//! the nodes with a random permutation prefix (`syncClusterResourceList`). So ties go the same
//! way all run long, which packs pods that score alike (those without GPUs, under most
//! policies) onto the same nodes. The baselines keep
//! the integer scores (0-100) and GPU choices of the authors' Kubernetes scheduler plugins
//! (hkust-adsl/kubernetes-scheduler-simulator, `pkg/simulator/plugin/*_score.go` and
//! `open_gpu_share.go`), since those produced the published figures:
//!
//! - `random`: a node drawn at random among those that fit; a share goes to a random GPU with
//!   room.
//! - `dotprod` (Tetris, SIGCOMM'14, as the paper applies it): the node whose free resources
//!   (CPU, GPU) have the *smallest* dot product with the request, both normalised by the
//!   largest node (128 cores, 8 GPUs): score `100 (1 - dot / 2)`.
//! - `clustering`: pods with the same GPU ask together. 75-100 on a node holding only pods of
//!   the same ask, 50-75 on one holding that ask among others, 25-50 on an idle node, 0-25
//!   otherwise; within a band, the fuller node. Pods without GPUs score 0 everywhere.
//! - `packing`: a share goes first to GPUs already in use (the fuller the better), then to
//!   idle GPUs of a node in use, then to an idle node (smaller nodes first).
//! - `bestfit`: the node with the least free resources after placement, CPU and GPU weighted
//!   equally and normalised by the largest node.
//! - `fgd`: the node where the pod raises the expected fragmentation
//!   ([`crate::share::frag`]) least, score `100 sigmoid(-delta / 1000)`; a share goes to the
//!   GPU that raises it least.
//!
//! Within a node, `dotprod`, `clustering`, `packing` and `bestfit` give a share the tightest GPU
//! with room; every policy gives whole GPUs by lowest index.
//!
//! `gpuplace` is described on [`SharePolicy::Gpuplace`].

use std::collections::HashMap;
use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{CoreError, Result};
use crate::share::cluster::{GpuMode, Isolation, NodeView, PodRequest, SharedCluster, Slot, MILLI};
use crate::share::frag::Distribution;
use crate::share::mig::MigGpu;

/// The largest node the authors' plugins normalise by: 128 cores, 8 GPUs.
const MAX_SPEC_CPU: f64 = 128_000.0;
const MAX_SPEC_GPU: i64 = 8_000;
const MAX_SCORE: i64 = 100;

/// How a pod's node and GPUs are chosen (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SharePolicy {
    Random,
    DotProd,
    Clustering,
    Packing,
    BestFit,
    Fgd,
    /// gpuplace's policy: fragmentation gradient descent on a wider loss. A placement is
    /// charged the change of (a) FGD's expected fragmentation, plus (b) the milli-GPUs the
    /// node strands for lack of CPU (its free GPUs beyond what its free CPU serves at the
    /// workload's CPU per milli-GPU), weighted [`STRANDED_WEIGHT`] times the node's GPU value,
    /// plus (c) the opportunity cost of the resources it takes at the node's [`NodePrice`]
    /// (scarce GPU models stay for the pods that need them). FGD sees CPU only as "the next
    /// pod fits or not", so it lets CPU-heavy pods drain CPU-poor nodes whose GPUs then sit
    /// idle; and it sees model scarcity only through pods that cannot use a model. Scores are
    /// rounded as FGD's, and a share takes the tightest GPU among equals.
    Gpuplace,
}

impl SharePolicy {
    pub const ALL: [SharePolicy; 7] = [
        SharePolicy::Random,
        SharePolicy::DotProd,
        SharePolicy::Clustering,
        SharePolicy::Packing,
        SharePolicy::BestFit,
        SharePolicy::Fgd,
        SharePolicy::Gpuplace,
    ];

    pub fn label(self) -> &'static str {
        match self {
            SharePolicy::Random => "random",
            SharePolicy::DotProd => "dotprod",
            SharePolicy::Clustering => "clustering",
            SharePolicy::Packing => "packing",
            SharePolicy::BestFit => "bestfit",
            SharePolicy::Fgd => "fgd",
            SharePolicy::Gpuplace => "gpuplace",
        }
    }

    pub fn from_label(label: &str) -> Result<SharePolicy> {
        SharePolicy::ALL
            .into_iter()
            .find(|p| p.label() == label)
            .ok_or_else(|| {
                CoreError::InvalidJob(format!(
                    "unknown shared-GPU policy {label:?} (policies: {})",
                    SharePolicy::ALL.map(|p| p.label()).join(", ")
                ))
            })
    }

    /// Does the policy weigh fragmentation over a pod distribution?
    pub fn needs_distribution(self) -> bool {
        matches!(self, SharePolicy::Fgd | SharePolicy::Gpuplace)
    }
}

/// What gpuplace charges for one node's resources, in milli-GPUs of the cheapest GPU.
///
/// The prices come from a fluid plan of the workload on the cluster: the largest scale of the
/// pod mix the nodes can hold if pods were divisible, solved as a linear program by the caller
/// (`gpuplace.share.node_prices`); its dual values price each node group's GPUs, CPU and
/// memory ([`NodePrice::from_duals`]). A GPU model that constrained pods need more than the
/// cluster has is dear; GPUs the plan leaves spare are free.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodePrice {
    /// The node's GPUs' value relative to the dearest (1: all of them are needed), which
    /// weighs the GPUs the node strands for lack of CPU.
    pub gpu_value: f64,
    /// What a milli-GPU here costs over one of the cheapest GPUs.
    pub gpu_premium: f64,
    /// The price of a milli-CPU and of a MiB of memory.
    pub cpu: f64,
    pub memory: f64,
}

impl NodePrice {
    /// Every GPU equally needed, CPU and memory free: what gpuplace charges without a plan.
    pub const FLAT: NodePrice = NodePrice {
        gpu_value: 1.0,
        gpu_premium: 0.0,
        cpu: 0.0,
        memory: 0.0,
    };

    /// Prices from the plan's dual values per node (milli-GPU, milli-CPU, MiB), scaled so the
    /// dearest milli-GPU is worth 1. Negative or non-finite duals are an InvalidJob.
    pub fn from_duals(duals: &[[f64; 3]]) -> Result<Vec<NodePrice>> {
        if let Some(bad) = duals
            .iter()
            .flatten()
            .find(|d| !(d.is_finite() && **d >= 0.0))
        {
            return Err(CoreError::InvalidJob(format!(
                "node prices: {bad} is not a price (expected finite and >= 0)"
            )));
        }
        let dearest = duals.iter().map(|d| d[0]).fold(0.0, f64::max);
        if dearest <= 0.0 {
            return Ok(vec![NodePrice::FLAT; duals.len()]);
        }
        let cheapest = duals.iter().map(|d| d[0]).fold(f64::INFINITY, f64::min);
        Ok(duals
            .iter()
            .map(|d| NodePrice {
                gpu_value: d[0] / dearest,
                gpu_premium: (d[0] - cheapest) / dearest,
                cpu: d[1] / dearest,
                memory: d[2] / dearest,
            })
            .collect())
    }
}

/// Per request shape, per node: the score and chosen GPU (and MIG start) as of the node's stamp.
#[derive(Debug, Clone)]
struct ShapeCache {
    stamp: Vec<u64>,
    score: Vec<f64>,
    gpu: Vec<u32>,
    start: Vec<u8>,
}

/// Chooses slots for pods, one at a time, under one policy.
#[derive(Debug, Clone)]
pub struct Scheduler {
    policy: SharePolicy,
    rng: ChaCha8Rng,
    /// Each node's rank among equals (lower wins), a permutation drawn from the seed.
    rank: Vec<u32>,
    distribution: Option<Arc<Distribution>>,
    /// Per node, the prices gpuplace charges (see [`NodePrice`]).
    prices: Option<Arc<Vec<NodePrice>>>,
    /// Switch idle GPUs between fractional and MIG when a pod fits no GPU in its mode.
    reconfigure: bool,
    /// Cached fragmentation scores (fgd, gpuplace), valid for one cluster epoch.
    epoch: u64,
    shapes: HashMap<PodRequest, usize>,
    caches: Vec<ShapeCache>,
    scratch: Scratch,
}

/// A node's GPUs after a placement, for scoring it.
#[derive(Debug, Clone, Default)]
struct Scratch {
    left: Vec<u16>,
    mig: Vec<MigGpu>,
}

impl Scratch {
    fn load(&mut self, view: &NodeView<'_>) {
        self.left.clear();
        self.left.extend_from_slice(view.gpu_left);
        self.mig.clear();
        self.mig.extend_from_slice(view.mig);
    }
}

/// A node's score for a pod and the GPU (and MIG start) a share would get there.
#[derive(Debug, Clone, Copy)]
struct Scored {
    score: f64,
    gpu: u32,
    start: u8,
}

const NO_GPU: u32 = u32::MAX;

impl Scheduler {
    /// `distribution` is required by the policies that weigh fragmentation.
    pub fn new(
        policy: SharePolicy,
        seed: u64,
        distribution: Option<Arc<Distribution>>,
    ) -> Result<Scheduler> {
        if policy.needs_distribution() && distribution.is_none() {
            return Err(CoreError::InvalidJob(format!(
                "policy {} weighs fragmentation over a pod distribution; none was given",
                policy.label()
            )));
        }
        Ok(Scheduler {
            policy,
            rng: ChaCha8Rng::seed_from_u64(seed),
            rank: Vec::new(),
            distribution,
            prices: None,
            reconfigure: false,
            epoch: 0,
            shapes: HashMap::new(),
            caches: Vec::new(),
            scratch: Scratch::default(),
        })
    }

    /// Charge gpuplace's placements these per-node prices (one per node of the cluster the
    /// scheduler will see, by node index; a node past the list pays [`NodePrice::FLAT`]).
    pub fn with_prices(mut self, prices: Option<Arc<Vec<NodePrice>>>) -> Self {
        self.prices = prices;
        self
    }

    /// Allow reconfiguring idle GPUs: a pod that must run on a MIG instance (or on a fractional
    /// GPU) and fits no GPU in that mode may get idle GPUs switched to it, the slot naming them
    /// ([`Slot::reconfigure`]); the policy chooses among the nodes as if every idle GPU that
    /// can switch had. Reconfiguring only when nothing fits keeps the downtime of GPU resets
    /// to what the workload forces.
    pub fn with_reconfiguration(mut self, allowed: bool) -> Self {
        self.reconfigure = allowed;
        self
    }

    pub fn policy(&self) -> SharePolicy {
        self.policy
    }

    /// The slot the policy picks for `pod`, or None when no node fits it.
    pub fn choose(&mut self, cluster: &SharedCluster, pod: &PodRequest) -> Option<Slot> {
        if self.rank.len() != cluster.num_nodes() {
            let mut order: Vec<u32> = (0..cluster.num_nodes() as u32).collect();
            order.shuffle(&mut self.rng);
            self.rank = order;
        }
        let slot = self.choose_now(cluster, pod);
        if slot.is_some() || !self.reconfigure || pod.gpus == 0 {
            return slot;
        }
        let target = match pod.isolation {
            Isolation::Mig => GpuMode::Mig,
            Isolation::Fractional => GpuMode::Fractional,
            // Idle GPUs host any pod in either mode: switching one frees nothing.
            Isolation::Any => return None,
        };
        let mut view = cluster.clone();
        let mut switched: Vec<Vec<u32>> = vec![Vec::new(); cluster.num_nodes()];
        for (n, list) in switched.iter_mut().enumerate() {
            for g in 0..cluster.node(n).gpu_left.len() as u32 {
                if view.switch_view(n, g, target) {
                    list.push(g);
                }
            }
        }
        if switched.iter().all(Vec::is_empty) {
            return None;
        }
        // A scheduler of the same policy and ranking, without this one's caches (the view is
        // another cluster).
        let mut probe = Scheduler {
            epoch: 0,
            shapes: HashMap::new(),
            caches: Vec::new(),
            reconfigure: false,
            ..self.clone()
        };
        let mut slot = probe.choose_now(&view, pod)?;
        slot.reconfigure = slot
            .gpus
            .iter()
            .copied()
            .filter(|g| switched[slot.node as usize].contains(g))
            .collect();
        Some(slot)
    }

    fn choose_now(&mut self, cluster: &SharedCluster, pod: &PodRequest) -> Option<Slot> {
        match self.policy {
            SharePolicy::Random => self.choose_random(cluster, pod),
            SharePolicy::Fgd | SharePolicy::Gpuplace => self.choose_cached(cluster, pod),
            _ => self.choose_scored(cluster, pod),
        }
    }

    fn choose_random(&mut self, cluster: &SharedCluster, pod: &PodRequest) -> Option<Slot> {
        let mut seen = 0u32;
        let mut pick = None;
        for n in 0..cluster.num_nodes() {
            if cluster.node(n).fits(pod) {
                seen += 1;
                if self.rng.gen_range(0..seen) == 0 {
                    pick = Some(n);
                }
            }
        }
        let node = pick?;
        let view = cluster.node(node);
        let gpus = if pod.shared() {
            let mut seen = 0u32;
            let mut gpu = 0;
            for g in 0..view.gpu_left.len() {
                if view.hosts(g, pod) {
                    seen += 1;
                    if self.rng.gen_range(0..seen) == 0 {
                        gpu = g as u32;
                    }
                }
            }
            vec![gpu]
        } else {
            view.first_gpus(pod)?
        };
        Some(view.slot(node, pod, gpus))
    }

    /// Keep the best-scored node; among equals, the first in the ranking.
    #[inline]
    fn consider(
        &self,
        best: &mut Option<(f64, usize, u32, u8)>,
        score: f64,
        n: usize,
        gpu: u32,
        start: u8,
    ) {
        match best {
            Some((s, _, _, _)) if score < *s => {}
            Some((s, node, _, _)) if score == *s && self.rank[n] > self.rank[*node] => {}
            _ => *best = Some((score, n, gpu, start)),
        }
    }

    fn slot(
        view: &NodeView<'_>,
        node: usize,
        pod: &PodRequest,
        gpu: u32,
        start: u8,
    ) -> Option<Slot> {
        if !pod.shared() {
            return Some(view.slot(node, pod, view.first_gpus(pod)?));
        }
        if gpu == NO_GPU {
            let g = view.tightest_gpu(pod)?;
            return Some(view.slot(node, pod, vec![g]));
        }
        Some(Slot {
            node: node as u32,
            gpus: vec![gpu],
            starts: vec![start],
            reconfigure: Vec::new(),
        })
    }

    fn choose_scored(&mut self, cluster: &SharedCluster, pod: &PodRequest) -> Option<Slot> {
        let mut best = None;
        for n in 0..cluster.num_nodes() {
            let view = cluster.node(n);
            if !view.fits(pod) {
                continue;
            }
            let score = match self.policy {
                SharePolicy::DotProd => dot_product_score(&view, pod),
                SharePolicy::Clustering => clustering_score(cluster, n, &view, pod),
                SharePolicy::Packing => packing_score(&view, pod),
                SharePolicy::BestFit => best_fit_score(&view, pod),
                _ => unreachable!("choose_scored serves the plain baselines"),
            };
            self.consider(&mut best, score as f64, n, NO_GPU, 0);
        }
        let (_, node, _, _) = best?;
        Self::slot(&cluster.node(node), node, pod, NO_GPU, 0)
    }

    fn choose_cached(&mut self, cluster: &SharedCluster, pod: &PodRequest) -> Option<Slot> {
        if self.epoch != cluster.epoch() {
            self.epoch = cluster.epoch();
            self.shapes.clear();
            self.caches.clear();
        }
        let n_nodes = cluster.num_nodes();
        let shape = *self.shapes.entry(*pod).or_insert_with(|| {
            self.caches.push(ShapeCache {
                stamp: vec![u64::MAX; n_nodes],
                score: vec![f64::NEG_INFINITY; n_nodes],
                gpu: vec![NO_GPU; n_nodes],
                start: vec![0; n_nodes],
            });
            self.caches.len() - 1
        });
        let dist = Arc::clone(self.distribution.as_ref().expect("checked in new"));
        let mut best = None;
        for n in 0..n_nodes {
            let stamp = cluster.stamp(n);
            if self.caches[shape].stamp[n] != stamp {
                let view = cluster.node(n);
                let scored = if view.fits(pod) {
                    match self.policy {
                        SharePolicy::Fgd => fgd_score(&dist, &view, pod, &mut self.scratch),
                        _ => gpuplace_score(
                            &dist,
                            &view,
                            pod,
                            self.prices
                                .as_ref()
                                .and_then(|p| p.get(n).copied())
                                .unwrap_or(NodePrice::FLAT),
                            &mut self.scratch,
                        ),
                    }
                } else {
                    Scored {
                        score: f64::NEG_INFINITY,
                        gpu: NO_GPU,
                        start: 0,
                    }
                };
                let cache = &mut self.caches[shape];
                cache.stamp[n] = stamp;
                cache.score[n] = scored.score;
                cache.gpu[n] = scored.gpu;
                cache.start[n] = scored.start;
            }
            let score = self.caches[shape].score[n];
            if score == f64::NEG_INFINITY {
                continue;
            }
            let (gpu, start) = (self.caches[shape].gpu[n], self.caches[shape].start[n]);
            self.consider(&mut best, score, n, gpu, start);
        }
        let (_, node, gpu, start) = best?;
        Self::slot(&cluster.node(node), node, pod, gpu, start)
    }
}

/// `DotProductScorePlugin` with `dimExtMethod: merge`, `normMethod: max`.
fn dot_product_score(view: &NodeView<'_>, pod: &PodRequest) -> i64 {
    let node = [
        view.cpu_left as f64 / MAX_SPEC_CPU,
        view.gpu_left_total() as f64 / MAX_SPEC_GPU as f64,
    ];
    let req = [
        pod.cpu_milli as f64 / MAX_SPEC_CPU,
        pod.total_gpu_milli() as f64 / MAX_SPEC_GPU as f64,
    ];
    let dot = (node[0] * req[0] + node[1] * req[1]) / 2.0;
    (MAX_SCORE as f64 * (1.0 - dot)) as i64
}

/// `GpuClusteringScorePlugin`.
fn clustering_score(
    cluster: &SharedCluster,
    n: usize,
    view: &NodeView<'_>,
    pod: &PodRequest,
) -> i64 {
    if pod.gpus == 0 {
        return 0;
    }
    let fullness = MAX_SCORE / 4 * (MAX_SPEC_GPU - view.gpu_left_total() as i64) / MAX_SPEC_GPU;
    let kinds = cluster.affinity_kinds(n);
    let band = if cluster.affinity_count(n, pod.affinity()) > 0 {
        if kinds == 1 {
            3
        } else {
            2
        }
    } else if kinds == 0 {
        1
    } else {
        0
    };
    fullness + MAX_SCORE * band / 4
}

/// `GpuPackingScorePlugin`.
fn packing_score(view: &NodeView<'_>, pod: &PodRequest) -> i64 {
    if pod.gpu_milli == 0 {
        return 0;
    }
    let idle = view.idle_gpus() as i64;
    if idle == view.spec.gpus as i64 {
        return (MAX_SCORE / 3 - idle).max(idle);
    }
    // GPUs by free capacity, least first (stable), the first `gpus` with room.
    let mut order: Vec<usize> = (0..view.gpu_left.len()).collect();
    order.sort_by_key(|&g| view.gpu_left[g]);
    let mut need = pod.gpus;
    let mut idle_used = 0i64;
    let mut free_percent_used = 0i64;
    for g in order {
        if need == 0 {
            break;
        }
        let left = view.gpu_left[g];
        if view.hosts(g, pod) {
            need -= 1;
            if left == MILLI {
                idle_used += 1;
            }
            free_percent_used += left as i64 * 100 / MILLI as i64;
        }
    }
    if idle_used > 0 {
        return (MAX_SCORE / 2 - idle_used).max(MAX_SCORE / 3);
    }
    (MAX_SCORE - free_percent_used / 10).max(MAX_SCORE / 2)
}

/// `BestFitScorePlugin`.
fn best_fit_score(view: &NodeView<'_>, pod: &PodRequest) -> i64 {
    let cpu = (view.cpu_left as f64 - pod.cpu_milli as f64) / MAX_SPEC_CPU * 0.5;
    let gpu =
        (view.gpu_left_total() as f64 - pod.total_gpu_milli() as f64) / MAX_SPEC_GPU as f64 * 0.5;
    ((1.0 - (cpu + gpu)) * MAX_SCORE as f64) as i64
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Put the pod on GPU `g` of the scratch copy of a node (a MIG GPU: an instance at `start`).
fn put(view: &NodeView<'_>, scratch: &mut Scratch, pod: &PodRequest, g: usize, start: u8) {
    match (view.mode[g], view.rules) {
        (GpuMode::Mig, Some(rules)) => {
            let p = rules
                .profile_for(pod.gpu_milli, pod.gpu_memory_mib)
                .expect("the GPU hosts the pod");
            scratch.mig[g] = rules.with(&scratch.mig[g], p, start);
            scratch.left[g] = rules.free_milli(&scratch.mig[g]);
        }
        _ => scratch.left[g] -= pod.gpu_milli,
    }
}

/// The node's GPUs after the pod takes its whole GPUs (or its share) the way FGD's `Sub`
/// does: the least-free GPUs that host it first (stable), MIG instances at their lowest start.
fn take_gpus(view: &NodeView<'_>, pod: &PodRequest, scratch: &mut Scratch) {
    scratch.load(view);
    if pod.gpus == 0 {
        return;
    }
    let mut order: Vec<usize> = (0..view.gpu_left.len()).collect();
    order.sort_by_key(|&g| view.gpu_left[g]);
    let mut need = pod.gpus;
    for g in order {
        if need == 0 {
            break;
        }
        if view.hosts(g, pod) {
            put(view, scratch, pod, g, view.first_start(g, pod));
            need -= 1;
        }
    }
}

/// Score every way a share can go on the node (each GPU that hosts it; on a MIG GPU, each
/// allowed start), leaving out ways that leave the same node behind as an earlier one; keep
/// the best by `better(new, old)`. Returns (score, GPU, start).
fn best_share<S: Copy>(
    view: &NodeView<'_>,
    pod: &PodRequest,
    scratch: &mut Scratch,
    mut score: impl FnMut(&Scratch) -> S,
    better: impl Fn(&S, u16, &S, u16) -> bool,
) -> (S, u32, u8) {
    scratch.load(view);
    let mut best: Option<(S, u16, u32, u8)> = None;
    let mut seen: Vec<(GpuMode, u16, MigGpu, u8)> = Vec::new();
    let mut consider = |scratch: &mut Scratch, g: usize, start: u8| {
        let key = (view.mode[g], view.gpu_left[g], view.mig[g], start);
        if seen.contains(&key) {
            return;
        }
        seen.push(key);
        let (left, mig) = (scratch.left[g], scratch.mig[g]);
        put(view, scratch, pod, g, start);
        let s = score(scratch);
        let after = scratch.left[g];
        scratch.left[g] = left;
        scratch.mig[g] = mig;
        if best
            .as_ref()
            .is_none_or(|(b, l, _, _)| better(&s, after, b, *l))
        {
            best = Some((s, after, g as u32, start));
        }
    };
    for g in 0..view.gpu_left.len() {
        if !view.hosts(g, pod) {
            continue;
        }
        match (view.mode[g], view.rules) {
            (GpuMode::Mig, Some(rules)) => {
                let p = rules
                    .profile_for(pod.gpu_milli, pod.gpu_memory_mib)
                    .expect("the GPU hosts the pod");
                let starts: Vec<u8> = rules.starts(&view.mig[g], p).collect();
                for start in starts {
                    consider(scratch, g, start);
                }
            }
            _ => consider(scratch, g, 0),
        }
    }
    let (s, _, g, start) = best.expect("the node fits the pod");
    (s, g, start)
}

/// `FGDScorePlugin`: `100 sigmoid((before - after) / 1000)`, truncated; for a share, the GPU
/// (and MIG start) with the best score, the first among equals.
fn fgd_score(
    dist: &Distribution,
    view: &NodeView<'_>,
    pod: &PodRequest,
    scratch: &mut Scratch,
) -> Scored {
    let before = dist.node_fragmentation(view);
    let cpu = view.cpu_left - pod.cpu_milli;
    let score_of = |after: f64| (sigmoid((before - after) / 1000.0) * MAX_SCORE as f64) as i64;
    if !pod.shared() {
        take_gpus(view, pod, scratch);
        let after = dist.fragmentation(view, cpu, &scratch.left, &scratch.mig);
        return Scored {
            score: score_of(after) as f64,
            gpu: NO_GPU,
            start: 0,
        };
    }
    let (score, gpu, start) = best_share(
        view,
        pod,
        scratch,
        |sc| score_of(dist.fragmentation(view, cpu, &sc.left, &sc.mig)),
        |new, _, old, _| new > old,
    );
    Scored {
        score: score as f64,
        gpu,
        start,
    }
}

/// How much a milli-GPU stranded for lack of CPU weighs against a milli-GPU of fragmentation
/// in gpuplace's score (chosen on the openb `default` workload; see benches/bench_share.py).
pub const STRANDED_WEIGHT: f64 = 2.0;

/// gpuplace's score (see [`SharePolicy::Gpuplace`]).
fn gpuplace_score(
    dist: &Distribution,
    view: &NodeView<'_>,
    pod: &PodRequest,
    price: NodePrice,
    scratch: &mut Scratch,
) -> Scored {
    // The resources' opportunity cost, in milli-GPUs of the cheapest GPU.
    let cost = price.gpu_premium * pod.total_gpu_milli() as f64
        + price.cpu * pod.cpu_milli as f64
        + price.memory * pod.memory_mib as f64;
    let cpu_per_milli = view.spec.model.map_or(0.0, |m| dist.cpu_per_gpu_milli(m));
    let stranded_weight = STRANDED_WEIGHT * price.gpu_value;
    // FGD's fragmentation plus the milli-GPUs the node's free CPU cannot serve at the
    // workload's CPU per milli-GPU.
    let loss = |cpu_left: u32, left: &[u16], mig: &[MigGpu]| {
        let frag = dist.fragmentation(view, cpu_left, left, mig);
        let total: u64 = left.iter().map(|&g| g as u64).sum();
        let stranded = if cpu_per_milli > 0.0 {
            (total as f64 - cpu_left as f64 / cpu_per_milli).max(0.0)
        } else {
            0.0
        };
        frag + stranded_weight * stranded
    };
    let before = loss(view.cpu_left, view.gpu_left, view.mig);
    let cpu = view.cpu_left - pod.cpu_milli;
    // Rounded as FGD rounds, so near-equal nodes tie and go to the first-ranked one.
    let score_of =
        |after: f64| (sigmoid((before - after - cost) / 1000.0) * MAX_SCORE as f64) as i64 as f64;
    if !pod.shared() {
        take_gpus(view, pod, scratch);
        return Scored {
            score: score_of(loss(cpu, &scratch.left, &scratch.mig)),
            gpu: NO_GPU,
            start: 0,
        };
    }
    // Among ways of equal score, the one leaving the least free on its GPU.
    let (score, gpu, start) = best_share(
        view,
        pod,
        scratch,
        |sc| score_of(loss(cpu, &sc.left, &sc.mig)),
        |new, new_left, old, old_left| new > old || (new == old && new_left < old_left),
    );
    Scored { score, gpu, start }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::share::cluster::tests::{pod, small};
    use crate::share::cluster::NodeSpec;

    fn dist() -> Arc<Distribution> {
        Arc::new(
            Distribution::new(
                vec![
                    (pod(2000, 1, 500), 2.0),
                    (pod(4000, 1, 1000), 1.0),
                    (pod(8000, 8, 1000), 1.0),
                ],
                2,
            )
            .unwrap(),
        )
    }

    #[test]
    fn every_policy_places_only_where_the_pod_fits() {
        for policy in SharePolicy::ALL {
            let mut c = small();
            let mut s = Scheduler::new(policy, 7, Some(dist())).unwrap();
            let mut placed = 0;
            for k in 0..60 {
                let p = match k % 3 {
                    0 => pod(1000, 1, 300),
                    1 => pod(500, 0, 0),
                    _ => pod(2000, 2, 1000),
                };
                if let Some(slot) = s.choose(&c, &p) {
                    c.allocate(&p, &slot).unwrap();
                    placed += 1;
                } else {
                    // Nothing fits: no node passes the filter.
                    assert!(
                        (0..c.num_nodes()).all(|n| !c.node(n).fits(&p)),
                        "{policy:?}"
                    );
                }
            }
            assert!(placed > 20, "{policy:?} placed {placed}");
        }
    }

    #[test]
    fn fragmentation_policies_need_a_distribution() {
        assert!(Scheduler::new(SharePolicy::Fgd, 1, None).is_err());
        assert!(Scheduler::new(SharePolicy::BestFit, 1, None).is_ok());
        assert!(SharePolicy::from_label("nope").is_err());
        for p in SharePolicy::ALL {
            assert_eq!(SharePolicy::from_label(p.label()).unwrap(), p);
        }
    }

    #[test]
    fn fgd_fills_a_used_gpu_before_an_idle_one() {
        let mut c = small();
        c.allocate(&pod(1000, 1, 500), &Slot::new(2, vec![1]))
            .unwrap();
        let mut s = Scheduler::new(SharePolicy::Fgd, 1, Some(dist())).unwrap();
        let slot = s.choose(&c, &pod(1000, 1, 500)).unwrap();
        assert_eq!(slot, Slot::new(2, vec![1]));
    }

    #[test]
    fn baseline_scores_match_the_plugins() {
        let c = small();
        let v = c.node(0);
        // dot product: node (64/128, 8000/8000), pod (4/128, 500/8000).
        let p = pod(4000, 1, 500);
        let dot = (0.5 * 4000.0 / 128000.0 + 1.0 * 500.0 / 8000.0) / 2.0;
        assert_eq!(dot_product_score(&v, &p), (100.0 * (1.0 - dot)) as i64);
        // an idle 8-GPU node: packing max(33 - 8, 8), clustering band 1 (idle), fullness 0.
        assert_eq!(packing_score(&v, &p), 25);
        assert_eq!(clustering_score(&c, 0, &v, &p), 25);
        // best fit: (60/128 * 0.5 + 7500/8000 * 0.5).
        let bf = ((1.0 - (60000.0 / 128000.0 * 0.5 + 7500.0 / 8000.0 * 0.5)) * 100.0) as i64;
        assert_eq!(best_fit_score(&v, &p), bf);
    }

    #[test]
    fn prices_scale_to_the_dearest_gpu() {
        let p = NodePrice::from_duals(&[[2.0, 0.5, 0.0], [1.0, 0.0, 0.0]]).unwrap();
        assert_eq!(p[0].gpu_value, 1.0);
        assert_eq!(p[1].gpu_value, 0.5);
        assert_eq!(p[0].gpu_premium, 0.5);
        assert_eq!(p[1].gpu_premium, 0.0);
        assert_eq!(p[0].cpu, 0.25);
        assert_eq!(
            NodePrice::from_duals(&[[0.0; 3]]).unwrap(),
            vec![NodePrice::FLAT]
        );
        assert!(NodePrice::from_duals(&[[f64::NAN, 0.0, 0.0]]).is_err());
        assert!(NodePrice::from_duals(&[[-1.0, 0.0, 0.0]]).is_err());
    }

    #[test]
    fn gpuplace_keeps_cpu_poor_nodes_for_cpu_light_pods() {
        // Two 8-GPU nodes, one with 16 cores, one with 128; the workload needs 4 cores per GPU.
        let node = |name: &str, cpu| NodeSpec {
            name: name.into(),
            cpu_milli: cpu,
            memory_mib: 1 << 20,
            gpus: 8,
            model: Some(0),
        };
        let c = SharedCluster::new(
            vec![node("poor", 16_000), node("rich", 128_000)],
            vec!["G".into()],
        )
        .unwrap();
        let light = pod(2_000, 1, 1000);
        let heavy = pod(32_000, 1, 1000);
        let d = Arc::new(Distribution::new(vec![(light, 3.0), (heavy, 1.0)], 1).unwrap());
        let mut s = Scheduler::new(SharePolicy::Gpuplace, 0, Some(d)).unwrap();
        // The CPU-heavy pod would strand the poor node's GPUs: it goes to the rich one.
        assert_eq!(s.choose(&c, &heavy).unwrap().node, 1);
    }

    #[test]
    fn the_same_seed_gives_the_same_choices() {
        let run = |seed| {
            let mut c = small();
            let mut s = Scheduler::new(SharePolicy::Random, seed, None).unwrap();
            (0..10)
                .filter_map(|_| {
                    let p = pod(100, 1, 100);
                    let slot = s.choose(&c, &p)?;
                    c.allocate(&p, &slot).unwrap();
                    Some(slot)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
    }
}
