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
//! The ring visits hosts in the order of their lowest rank and each host's GPUs in id order,
//! as NCCL builds it; its bandwidth `B` is that of its slowest hop (a hop out of the NVLink
//! domain counting one NIC share per GPU of the group on its smaller side), its latency that of
//! the highest level it spans. An all-reduce takes the fastest of ring, tree and NVLS, as
//! NCCL's tuner does ([`crate::nccl`] gives the algorithms and their sources), NVLS-tree
//! included. An all-to-all inside one NVLink domain is limited by its slowest pair; across
//! domains each domain's fabric bytes go over its NIC shares and its NVLink rounds follow
//! ([`crate::nccl::alltoall_bytes_seconds`]). Time = count · (steps · latency + bytes / B).
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
//! Packet loss maps to a factor with [`link_loss_factor`], by how the link's technology
//! recovers a lost packet. Both RoCE and InfiniBand run the reliable-connected (RC) transport,
//! whose NICs recover a loss end to end by go-back-N: the receiver drops every packet after a
//! gap and NAKs, the sender resends from the lost one (IBTA RC semantics; Mittal et al.,
//! "Revisiting Network Support for RDMA", SIGCOMM 2018, section 2, on NVIDIA/Mellanox
//! ConnectX). Each loss then wastes what was in flight, `W` packets, and goodput is
//! `f = 1 / (1 + p · W)`:
//!
//! * **RoCE** ([`LinkTransport::Roce`], also InfiniBand without link-level retry): `W` is
//!   the path's bandwidth-delay product in MTU packets, 400 Gb/s × 10 µs / 4096 B ≈ 122
//!   ([`ROCE_GO_BACK_N_PACKETS`]; 10 µs the low end of the "tens of microseconds" the Llama 3
//!   report, section 3.3.3, gives for its RoCE fabric's latency; 4096 B RDMA's largest MTU).
//!   1 % loss leaves 45 %, 0.1 % 89 %. That is an upper bound: a lost NAK or a lost last
//!   packet waits for the transport's retransmission timeout (4.096 µs · 2^timeout, the
//!   verbs QP attribute NCCL sets from NCCL_IB_TIMEOUT: 1.1 s at 18, 17 s at the 22 the OCI
//!   GB300 runs in the shared measurements set), and Wang et al., "Error Recovery of RDMA
//!   Packets in Data Center Networks" (ICCCN 2019) measured plain go-back-N RoCEv2 at nearly
//!   zero relative throughput above 1 % loss (their improved go-back-N, 60 % at 1 %).
//! * **InfiniBand** ([`LinkTransport::Infiniband`]) with link-level retransmission (NVIDIA's
//!   LLR, "UNBREAKABLE-LINK", MLNX-OS manual: the link layer adds a CRC per cell and the
//!   transmitter resends a cell the receiver dropped; NVIDIA-to-NVIDIA ports, cables up to
//!   30 m): the loss is repaired on the link, so the transport sees none and the cost is the
//!   link's own replay, about one link round trip of data: 400 Gb/s × 0.5 µs (30 m of cable
//!   each way plus the FEC and SerDes at both ends; an estimate) / 4096 B ≈ 6 packets
//!   ([`IB_LINK_RETRY_PACKETS`]): 1 % loss leaves 94 %. The latency the replays add is not
//!   priced. A level whose links cannot run LLR (longer cables, other vendors' ports) recovers
//!   end to end like RoCE and should be described as such.
//!
//! Bit errors below the packet level are corrected by the PHY's forward error correction
//! (RS-FEC on HDR/NDR and 100G+ Ethernet lanes) on both and cost nothing here: the loss rate
//! is what is left after FEC. The curve is smooth so that ranking two degraded links by loss
//! stays monotone. A link that trained at reduced width or speed has factor `trained /
//! nominal` (x2 of x4 gives 0.5). Callers with a measured goodput should pass the factor
//! directly.
//!
//! ## Contention
//!
//! Priced in a state ([`evaluate_in`]), a collective also shares the fabric's uplinks with the
//! running jobs: its bandwidth is multiplied by the smallest fair share it gets on the uplinks
//! its flows cross ([`crate::fabric`] has the model and what it leaves out). Where a level
//! hashes flows onto its uplinks' links (ECMP, static routing), its flows and its class's
//! collide there even alone, and the collective runs at the pace of the fullest link.

use crate::error::{CoreError, Result};
use crate::fabric::Background;
use crate::job::{CollectiveKind, JobSpec};
use crate::nccl::{self, Algorithm, NVLS_LATENCY_US};
use crate::state::ClusterState;
use crate::step::StepReport;
use crate::topology::Topology;

/// Costs of one placement.
#[derive(Debug, Clone, PartialEq)]
pub struct CostReport {
    /// Estimated communication time per step (s).
    pub comm_seconds: f64,
    /// Time per collective class (s): the slowest collective of the class.
    pub class_seconds: Vec<f64>,
    /// The algorithm NCCL would run for the slowest collective of each class.
    pub class_algorithms: Vec<Algorithm>,
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
    /// Step time, MFU and tokens/s from these class times ([`crate::step`]), when the job
    /// declares its compute and the peak of every host type it uses is known.
    pub step: Option<StepReport>,
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

/// How a link's technology recovers a lost packet (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LinkTransport {
    /// End-to-end go-back-N: RoCE, or InfiniBand without link-level retry.
    #[default]
    Roce,
    /// InfiniBand with link-level retransmission: the link resends a lost cell.
    Infiniband,
}

impl LinkTransport {
    /// The name used in topology files.
    pub fn label(self) -> &'static str {
        match self {
            LinkTransport::Roce => "roce",
            LinkTransport::Infiniband => "infiniband",
        }
    }

    /// Parse a label ([`LinkTransport::label`]).
    pub fn from_label(label: &str) -> Result<LinkTransport> {
        match label {
            "roce" => Ok(LinkTransport::Roce),
            "infiniband" => Ok(LinkTransport::Infiniband),
            other => Err(CoreError::InvalidTopology(format!(
                "transport: expected roce or infiniband, got {other:?}"
            ))),
        }
    }

    /// Packets wasted per lost packet.
    pub fn packets_per_loss(self) -> f64 {
        match self {
            LinkTransport::Roce => ROCE_GO_BACK_N_PACKETS,
            LinkTransport::Infiniband => IB_LINK_RETRY_PACKETS,
        }
    }
}

/// Packets RoCE's go-back-N resends per loss: 400 Gb/s × 10 µs / 4096 B (module docs).
pub const ROCE_GO_BACK_N_PACKETS: f64 = 50e9 * 10e-6 / 4096.0;
/// Packets InfiniBand's link-level retry replays per loss: 400 Gb/s × 0.5 µs / 4096 B.
pub const IB_LINK_RETRY_PACKETS: f64 = 50e9 * 0.5e-6 / 4096.0;

/// Bandwidth factor of a link of `transport` losing `loss` of its packets (a fraction, 0.01 =
/// 1 %): `1 / (1 + loss · W)`, per the module docs; never below [`MIN_FACTOR`] so costs stay
/// finite, 1 for no loss.
pub fn link_loss_factor(loss: f64, transport: LinkTransport) -> f64 {
    if !loss.is_finite() || loss <= 0.0 {
        return 1.0;
    }
    (1.0 / (1.0 + loss * transport.packets_per_loss())).max(MIN_FACTOR)
}

/// [`link_loss_factor`] of a RoCE link (end-to-end go-back-N), the default when a topology
/// does not name its links' transport.
pub fn loss_factor(loss: f64) -> f64 {
    link_loss_factor(loss, LinkTransport::Roce)
}

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
            fabric: Background::of(state, gpus).filter(|b| !b.alone(state)),
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

/// Where a collective's bytes per level go: added to a report's `bytes_by_level` and, when
/// recording, also listed (level, bytes) in the order they were added, so that an evaluation
/// reusing the collective adds them again in that order ([`PricedCollectives`]).
pub(crate) struct LevelBytes<'x> {
    sums: &'x mut [f64],
    record: Option<&'x mut Vec<(u32, f64)>>,
}

impl LevelBytes<'_> {
    #[inline]
    fn add(&mut self, level: usize, bytes: f64) {
        self.sums[level] += bytes;
        if let Some(record) = self.record.as_deref_mut() {
            record.push((level as u32, bytes));
        }
    }
}

/// Time (s) of one call of a collective over `members` (GPU ids in rank order, reordered in
/// place into NCCL's ring order). When `bytes_by_level` is given, adds the bytes of `weight`
/// calls to it.
pub(crate) fn collective_cost(
    topo: &Topology,
    kind: CollectiveKind,
    bytes: f64,
    members: &mut [u32],
    bytes_by_level: Option<&mut [f64]>,
    weight: f64,
    health: Health<'_>,
) -> f64 {
    let sink = bytes_by_level.map(|sums| LevelBytes { sums, record: None });
    collective_cost_algo(topo, kind, bytes, members, sink, weight, health).0
}

/// [`collective_cost`] and the algorithm chosen (see [`crate::nccl`]).
pub(crate) fn collective_cost_algo(
    topo: &Topology,
    kind: CollectiveKind,
    bytes: f64,
    members: &mut [u32],
    bytes_by_level: Option<LevelBytes<'_>>,
    weight: f64,
    health: Health<'_>,
) -> (f64, Algorithm) {
    let (t, algorithm) = priced(topo, kind, bytes, members, bytes_by_level, weight, health);
    if !topo.has_host_count_factors() || members.len() < 2 {
        return (t, algorithm);
    }
    let mut hosts: Vec<usize> = members.iter().map(|&g| topo.node_of(g as usize)).collect();
    hosts.sort_unstable();
    hosts.dedup();
    (t * topo.host_count_factor(hosts.len()), algorithm)
}

fn priced(
    topo: &Topology,
    kind: CollectiveKind,
    bytes: f64,
    members: &mut [u32],
    mut bytes_by_level: Option<LevelBytes<'_>>,
    weight: f64,
    health: Health<'_>,
) -> (f64, Algorithm) {
    let n = members.len();
    if n < 2 {
        return (0.0, Algorithm::Ring);
    }
    let levels = topo.levels();
    let nf = n as f64;
    if kind == CollectiveKind::PointToPoint {
        let (a, b) = (members[0] as usize, members[1] as usize);
        let l = topo.lca(a, b);
        if let Some(acc) = bytes_by_level.as_mut() {
            acc.add(l, bytes * weight);
        }
        let share =
            crate::fabric::collective_share(topo, health.fabric, health.class_load, kind, members);
        let bw = health.bandwidth(topo, a, b, l) * share;
        let t = call_seconds(kind, n, bytes, levels[l].latency_us, bw);
        return (t, Algorithm::P2p);
    }
    let (_, per_rank) = ring_terms(kind, n, bytes);
    let mut span = 0usize;
    if kind == CollectiveKind::AllToAll {
        members.sort_unstable();
        // Every ordered pair exchanges S/n bytes.
        let pair_bytes = bytes / nf * weight;
        for i in 0..n {
            for j in (i + 1)..n {
                let (a, b) = (members[i] as usize, members[j] as usize);
                let l = topo.lca(a, b);
                if let Some(acc) = bytes_by_level.as_mut() {
                    acc.add(l, 2.0 * pair_bytes);
                }
                span = span.max(l);
            }
        }
        // Contention and hash collisions slow the bytes that cross the fabric only.
        let share = if span > topo.nvlink_level() {
            crate::fabric::collective_share(topo, health.fabric, health.class_load, kind, members)
        } else {
            1.0
        };
        let (steps, _) = ring_terms(kind, n, bytes);
        let t = steps * levels[span].latency_us * 1e-6
            + nccl::alltoall_bytes_seconds(topo, members, bytes, share, |a, b, l| {
                health.bandwidth(topo, a, b, l)
            });
        return (t, Algorithm::Pairwise);
    }
    nccl::ring_order(topo, members);
    let runs = nccl::host_runs(topo, members);
    let nvlink = topo.nvlink_level();
    for (_, _, l, _) in nccl::ring_edges(topo, members, &runs) {
        if let Some(acc) = bytes_by_level.as_mut() {
            acc.add(l, per_rank * weight);
        }
        span = span.max(l);
    }
    // Slowest hop inside NVLink domains, and slowest hop out of them (NIC shares included).
    let (intra, mut inter) = nccl::ring_bandwidths(topo, members, &runs, |a, b, l| {
        health.bandwidth(topo, a, b, l)
    });
    // Contention: the fabric's uplinks (only hops out of the NVLink domain reach them) are
    // shared with the running jobs and, on an oversubscribed fabric, the class's collectives.
    // The flows are the ring's, in NCCL's ring order (`crate::fabric::ordered_members`).
    if inter.is_finite() {
        inter *=
            crate::fabric::collective_share(topo, health.fabric, health.class_load, kind, members);
    }
    let slowest = intra.min(inter);
    let [ring_eff, tree_eff, nvls_eff, collnet_eff] = topo.algorithm_efficiency();
    let ring = call_seconds(kind, n, bytes, levels[span].latency_us, slowest * ring_eff);
    if kind != CollectiveKind::AllReduce {
        return (ring, Algorithm::Ring);
    }
    let mut best = (ring, Algorithm::Ring);
    if span <= nvlink {
        // NVLS inside one NVLink domain whose switches have it; degraded hardware slows it by
        // the same factor as the ring.
        let nvls = members
            .iter()
            .map(|&g| topo.nvls_gbps(g as usize))
            .fold(f64::INFINITY, f64::min);
        if nvls > 0.0 {
            let healthy = topo.effective_bandwidth(span);
            let factor = (slowest / healthy).min(1.0);
            let t = NVLS_LATENCY_US * 1e-6 + per_rank / (nvls * factor * nvls_eff * 1e9);
            if t < best.0 {
                best = (t, Algorithm::Nvls);
            }
        }
    } else {
        let (hosts, k_max) = nccl::host_shape(topo, members, &runs);
        let intra_latency = levels[nvlink.min(span)].latency_us;
        let latency = 2.0
            * ((k_max.saturating_sub(1)) as f64 * intra_latency
                + nccl::ceil_log2(hosts) * levels[span].latency_us);
        let t =
            latency * 1e-6 + nccl::tree_bytes_seconds(bytes, hosts, k_max, intra, inter) / tree_eff;
        if t < best.0 {
            best = (t, Algorithm::Tree);
        }
        // NVLS-tree: NVLS inside each NVLink domain whose switches have it (every domain
        // holding at least two of the group's GPUs), NCCL's tree between the domains.
        let k_min = runs.iter().copied().min().unwrap_or(0);
        let nvls = members
            .iter()
            .map(|&g| topo.nvls_gbps(g as usize))
            .fold(f64::INFINITY, f64::min);
        if nvls > 0.0 && k_min >= 2 && intra.is_finite() {
            let healthy = topo.effective_bandwidth(nvlink);
            let factor = (intra / healthy).min(1.0);
            let latency = NVLS_LATENCY_US + 2.0 * nccl::ceil_log2(hosts) * levels[span].latency_us;
            let t = latency * 1e-6
                + nccl::nvls_tree_bytes_seconds(
                    bytes,
                    hosts,
                    k_max,
                    nvls * factor * nvls_eff,
                    inter,
                ) / tree_eff;
            if t < best.0 {
                best = (t, Algorithm::NvlsTree);
            }
        }
        if topo.sharp_up_to(span) {
            let latency = 2.0 * (intra_latency + levels[span].latency_us);
            let t = latency * 1e-6
                + nccl::collnet_bytes_seconds(bytes, k_max, intra, inter) / collnet_eff;
            if t < best.0 {
                best = (t, Algorithm::CollNet);
            }
        }
    }
    best
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
/// by level), on healthy hardware without host matrices: for each level, a lower bound of what
/// [`evaluate`] charges any such group, from the same formulas. It is exact for point-to-point,
/// for all-to-all inside the NVLink domain, and for rings inside the NVLink domain without NVLS
/// (an all-to-all across domains is bounded by the half of its bytes the smallest domain's GPUs
/// must send over the fabric); above the NVLink domain
/// the price depends on how many of the group's GPUs share each host (NIC shares, see
/// [`crate::nccl`]), so the bound assumes the most a host can drive (`min(host GPUs, n/2)`
/// shares), the cheapest algorithm and the smallest host-count factor.
pub fn collective_seconds_by_level(
    topo: &Topology,
    kind: CollectiveKind,
    n: usize,
    bytes: f64,
) -> Vec<f64> {
    collective_seconds_by_level_capped(topo, kind, n, bytes, n)
}

/// [`collective_seconds_by_level`] for a group of which at most `per_domain` GPUs can share
/// one NVLink domain (as when every member's confined group fills most of a domain, see
/// [`lower_bound`]): a hop out of a domain then drives at most `min(n/2, per_domain)` NIC
/// shares, a tree spans at least `ceil(n / per_domain)` domains with at most `per_domain`
/// GPUs in the fullest, and NVLS-tree (two GPUs in every domain) needs `per_domain >= 2`.
/// Every value is still a lower bound of what [`evaluate`] charges such a group.
pub fn collective_seconds_by_level_capped(
    topo: &Topology,
    kind: CollectiveKind,
    n: usize,
    bytes: f64,
    per_domain: usize,
) -> Vec<f64> {
    let per_domain = per_domain.clamp(1, n.max(1));
    let nvlink = topo.nvlink_level();
    let levels = topo.levels();
    let host_gpus = topo.node_types().iter().map(|t| t.gpus).max().unwrap_or(1);
    let lanes = topo.max_nic_shares((n / 2).min(per_domain).max(1) as u32);
    let nvls = topo.max_nvls_gbps();
    let factor = topo.min_host_count_factor();
    let [ring_eff, tree_eff, nvls_eff, collnet_eff] = topo.algorithm_efficiency();
    let (_, per_rank) = ring_terms(kind, n, bytes);
    levels
        .iter()
        .enumerate()
        .map(|(l, level)| {
            if kind == CollectiveKind::AllToAll && l > nvlink && n >= 2 {
                // The domain holding the fewest of the group's GPUs sends at least half of
                // each of its GPUs' bytes over the fabric, at no more than the fastest fabric
                // level's bandwidth times the most NIC shares one GPU can drive.
                let fastest = (nvlink + 1..=l)
                    .map(|x| topo.effective_bandwidth(x))
                    .fold(0.0, f64::max);
                let per_gpu = topo.max_nic_shares(1).max(1.0);
                return factor
                    * ((n - 1) as f64 * level.latency_us * 1e-6
                        + 0.5 * bytes / (fastest * per_gpu * 1e9));
            }
            let simple = matches!(
                kind,
                CollectiveKind::PointToPoint | CollectiveKind::AllToAll
            );
            if simple || n < 2 {
                return factor
                    * call_seconds(
                        kind,
                        n,
                        bytes,
                        level.latency_us,
                        topo.effective_bandwidth(l),
                    );
            }
            let bw = if l > nvlink {
                (lanes * topo.effective_bandwidth(l)).min(levels[0].bandwidth_gbps)
            } else {
                topo.effective_bandwidth(l)
            };
            let mut t = call_seconds(kind, n, bytes, level.latency_us, bw * ring_eff);
            if kind == CollectiveKind::AllReduce {
                if l <= nvlink && nvls > 0.0 {
                    t = t.min(NVLS_LATENCY_US * 1e-6 + per_rank / (nvls * nvls_eff * 1e9));
                }
                if l > nvlink {
                    // The least a tree can take over H >= 2 NVLink domains: the fullest holds
                    // at least ceil(n / H) GPUs (its chain latency and, when more than one,
                    // its chain bytes at the lowest level's bandwidth), the fabric carries
                    // 2 (H - 1) / H of the data, and the tree is ceil(log2 H) deep.
                    let intra_latency = levels[nvlink].latency_us;
                    let tree = (n.div_ceil(per_domain).max(2)..=n.max(2))
                        .map(|h| {
                            let k = n.div_ceil(h);
                            2.0 * ((k - 1) as f64 * intra_latency
                                + nccl::ceil_log2(h) * level.latency_us)
                                * 1e-6
                                + nccl::tree_bytes_seconds(
                                    bytes,
                                    h,
                                    k as u32,
                                    levels[0].bandwidth_gbps,
                                    bw,
                                ) / tree_eff
                        })
                        .fold(f64::INFINITY, f64::min);
                    t = t.min(tree);
                    if nvls > 0.0 && per_domain >= 2 {
                        // NVLS-tree: at least two domains (one tree level), at least two GPUs
                        // in the fullest, `S` per domain over at most `lanes` shares.
                        let nvls_tree = (NVLS_LATENCY_US + 2.0 * level.latency_us) * 1e-6
                            + nccl::nvls_tree_bytes_seconds(
                                bytes,
                                2,
                                2,
                                nvls * nvls_eff,
                                lanes * topo.effective_bandwidth(l),
                            ) / tree_eff;
                        t = t.min(nvls_tree);
                    }
                    if topo.sharp_up_to(l) {
                        let collnet = 2.0 * level.latency_us * 1e-6
                            + nccl::collnet_bytes_seconds(
                                bytes,
                                host_gpus as u32,
                                levels[0].bandwidth_gbps,
                                bw,
                            ) / collnet_eff;
                        t = t.min(collnet);
                    }
                }
            }
            factor * t
        })
        .collect()
}

/// A lower bound on the communication seconds per step ([`CostReport::comm_seconds`] of
/// [`evaluate_in`]) of every placement of `job` on the free GPUs of `state` that keeps its
/// confined groups inside their levels (what every solver must return), or None where the
/// per-level prices are not bounds (hosts with a GPU bandwidth matrix).
///
/// A group spans some level, so it sits inside one domain of that level together with every
/// confined group of its members whose level is at or below it (those stay inside the same
/// domain): it cannot span a level whose domains all have fewer free GPUs than that closure.
/// Its price is then at least the cheapest [`collective_seconds_by_level_capped`] price of a
/// level it can span, with at most as many members in one NVLink domain as whole groups
/// confined inside the NVLink domain fit there. A class costs its slowest member, so at least
/// the largest of its members' bounds, and classes add up. Explicit traffic costs at least
/// its bytes over the fastest level's bandwidth. Degraded hardware and the running jobs' load
/// only slow a path down (factors and fair shares are at most 1), so the bound holds in any
/// state. A placement whose evaluated cost meets it is optimal.
pub fn lower_bound(state: &ClusterState, job: &JobSpec) -> Option<f64> {
    let topo = state.topology();
    if topo.has_node_matrices() {
        return None;
    }
    let nl = topo.num_levels();
    let nvlink = topo.nvlink_level();
    let layout = job.layout();
    let most_free: Vec<usize> = (0..nl)
        .map(|l| state.free_counts(l).iter().copied().max().unwrap_or(0) as usize)
        .collect();
    let nvlink_size = topo.domain_sizes(nvlink).iter().copied().max().unwrap_or(1) as usize;
    // Per level: the dimensions whose groups stay inside a domain of that level or below.
    let confined: Vec<Vec<usize>> = (0..nl)
        .map(|l| {
            (0..job.dims.len())
                .filter(|&d| job.dims[d].confine.is_some_and(|c| c <= l))
                .collect()
        })
        .collect();
    // The members of `group` with their coordinates along `dims` zeroed (one key per confined
    // closure component), sorted, and the number of ranks in one component.
    let components = |group: &[u32], dims: &[usize]| -> (Vec<usize>, usize) {
        let mut keys: Vec<usize> = group
            .iter()
            .map(|&r| {
                let r = r as usize;
                r - dims
                    .iter()
                    .map(|&d| layout.coordinate(r, d) * layout.strides[d])
                    .sum::<usize>()
            })
            .collect();
        keys.sort_unstable();
        (keys, dims.iter().map(|&d| job.dims[d].size).product())
    };
    let mut prices: Vec<(CollectiveKind, usize, u64, usize, Vec<f64>)> = Vec::new();
    let mut class_bound = vec![0.0f64; job.num_classes];
    for c in &job.collectives {
        let row = job.groups.row(c.group as usize);
        // A point-to-point collective is priced between its first two members.
        let group = if c.kind == CollectiveKind::PointToPoint {
            &row[..row.len().min(2)]
        } else {
            row
        };
        let n = group.len();
        if n < 2 {
            continue;
        }
        // Most members in one NVLink domain: whole confined components, each holding at most
        // `most` members.
        let (keys, beta) = components(group, &confined[nvlink]);
        let mut most = 1usize;
        let mut run = 1usize;
        for w in keys.windows(2) {
            run = if w[0] == w[1] { run + 1 } else { 1 };
            most = most.max(run);
        }
        let per_domain = ((nvlink_size / beta.max(1)) * most).clamp(1, n);
        // The lowest level whose largest free domain holds the group's closure.
        let lowest = (0..nl)
            .find(|&l| {
                let (mut keys, beta) = components(group, &confined[l]);
                keys.dedup();
                keys.len() * beta <= most_free[l]
            })
            .unwrap_or(nl - 1);
        let bits = c.bytes.to_bits();
        let price = match prices
            .iter()
            .find(|p| p.0 == c.kind && p.1 == n && p.2 == bits && p.3 == per_domain)
        {
            Some(p) => &p.4,
            None => {
                let v = collective_seconds_by_level_capped(topo, c.kind, n, c.bytes, per_domain);
                prices.push((c.kind, n, bits, per_domain, v));
                &prices[prices.len() - 1].4
            }
        };
        let least = price[lowest..]
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        let slot = &mut class_bound[c.class as usize];
        *slot = slot.max(c.count * least);
    }
    let fastest = (0..nl)
        .map(|l| topo.effective_bandwidth(l))
        .fold(0.0, f64::max);
    let traffic: f64 = job
        .traffic
        .iter()
        .filter(|t| t.0 != t.1)
        .map(|t| t.2 / (fastest * 1e9))
        .sum();
    Some(class_bound.iter().fold(traffic, |a, b| a + b))
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

/// [`evaluate_in`] on `topo`, a variant of the state's topology with the same GPUs and uplinks
/// (another routing): what [`crate::fabric::collisions`] compares.
pub(crate) fn evaluate_in_variant(
    state: &ClusterState,
    topo: &Topology,
    job: &JobSpec,
    gpus: &[u32],
) -> Result<CostReport> {
    check_placement(topo, job.num_ranks, gpus)?;
    evaluate_health(topo, Health::with_neighbours(state, gpus), job, gpus)
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
        fabric: Background::moving(state, name).filter(|b| !b.alone(state)),
        ..Health::of(state)
    };
    evaluate_health(state.topology(), health, job, gpus)
}

/// Prices a running job's placements for a repair: the old one as [`evaluate_in`] does, then
/// trials as [`evaluate_moved`] does, bit for bit. Where a collective's price depends on its
/// members and the hardware alone (no neighbours' load on the fabric, before or after the
/// move, and a fabric on which a job's collectives do not contend), the old placement's
/// collectives are kept, and a trial is priced again only for the collectives holding a rank
/// it moved (a tp group moved in a 16,384-rank job changes some 20 of its 3,000).
pub struct MovedPricer<'a> {
    state: &'a ClusterState,
    name: &'a str,
    job: &'a JobSpec,
    base: Option<PricedCollectives>,
}

impl<'a> MovedPricer<'a> {
    pub fn new(state: &'a ClusterState, name: &'a str, job: &'a JobSpec) -> MovedPricer<'a> {
        MovedPricer {
            state,
            name,
            job,
            base: None,
        }
    }

    fn moved_health(&self) -> Health<'a> {
        Health {
            fabric: Background::moving(self.state, self.name).filter(|b| !b.alone(self.state)),
            ..Health::of(self.state)
        }
    }

    /// [`evaluate_in`] of the job's placement before it moves, kept for the trials when they
    /// can reuse it.
    pub fn before(&mut self, gpus: &[u32]) -> Result<CostReport> {
        let (state, job) = (self.state, self.job);
        let topo = state.topology();
        check_placement(topo, job.num_ranks, gpus)?;
        let health = Health::with_neighbours(state, gpus);
        if health.fabric.is_some() || self.moved_health().fabric.is_some() || topo.self_contends() {
            self.base = None;
            return evaluate_health(topo, health, job, gpus);
        }
        let mut record = PricedCollectives {
            gpus: gpus.to_vec(),
            times: Vec::with_capacity(job.collectives.len()),
            starts: Vec::with_capacity(job.collectives.len() + 1),
            // About one addition per member of a collective (a ring hop, a pair).
            adds: Vec::with_capacity(job.groups.items.len()),
        };
        record.starts.push(0);
        let report = evaluate_reusing(topo, health, job, gpus, None, Some(&mut record))?;
        self.base = Some(record);
        Ok(report)
    }

    /// Whether the trials reuse the old placement's collectives.
    pub fn reuses(&self) -> bool {
        self.base.is_some()
    }

    /// [`evaluate_moved`] of a trial placement.
    pub fn evaluate(&self, gpus: &[u32]) -> Result<CostReport> {
        let (state, job) = (self.state, self.job);
        let Some(base) = &self.base else {
            return evaluate_moved(state, self.name, job, gpus);
        };
        let topo = state.topology();
        check_placement(topo, job.num_ranks, gpus)?;
        let changed = job.collectives_moved(gpus, &base.gpus);
        let health = self.moved_health();
        evaluate_reusing(topo, health, job, gpus, Some((base, &changed)), None)
    }
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
    evaluate_reusing(topo, health, job, gpus, None, None)
}

/// The priced collectives of one placement, in the job's order: each one's time of one call
/// and algorithm, and the bytes it added per level in the order it added them. A placement
/// that differs in a few ranks is priced again only for the collectives holding one of them
/// ([`MovedPricer`]); the others' results are taken as they are and their bytes added again
/// in the same order, so the report is the full evaluation's, bit for bit.
struct PricedCollectives {
    gpus: Vec<u32>,
    times: Vec<(f64, Algorithm)>,
    /// `adds[starts[i]..starts[i + 1]]`: collective i's (level, bytes).
    starts: Vec<usize>,
    adds: Vec<(u32, f64)>,
}

/// [`evaluate_health`], recording every collective's result into `record`, or reusing those
/// of `base` for the collectives `changed` does not mark (their members and hardware are the
/// same, so their prices are too).
fn evaluate_reusing(
    topo: &Topology,
    health: Health<'_>,
    job: &JobSpec,
    gpus: &[u32],
    base: Option<(&PricedCollectives, &[bool])>,
    mut record: Option<&mut PricedCollectives>,
) -> Result<CostReport> {
    let nl = topo.num_levels();
    let mut bytes_by_level = vec![0.0; nl];
    let mut class_seconds = vec![0.0f64; job.num_classes];
    let mut class_algorithms = vec![Algorithm::Ring; job.num_classes];
    let mut scratch = Scratch {
        members: Vec::new(),
    };
    // On an oversubscribed fabric, or one that hashes flows onto links, a collective also
    // shares the uplinks with the other collectives of its class (they run concurrently).
    let class_loads = if topo.self_contends() {
        crate::fabric::class_loads(topo, job, gpus)
    } else {
        Vec::new()
    };
    for (i, c) in job.collectives.iter().enumerate() {
        if let Some((base, changed)) = base {
            if !changed[i] {
                for &(l, b) in &base.adds[base.starts[i]..base.starts[i + 1]] {
                    bytes_by_level[l as usize] += b;
                }
                let (t, algorithm) = base.times[i];
                let slot = &mut class_seconds[c.class as usize];
                if c.count * t >= *slot {
                    *slot = c.count * t;
                    class_algorithms[c.class as usize] = algorithm;
                }
                continue;
            }
        }
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
        let sink = LevelBytes {
            sums: &mut bytes_by_level,
            record: record.as_deref_mut().map(|r| &mut r.adds),
        };
        let (t, algorithm) = collective_cost_algo(
            topo,
            c.kind,
            c.bytes,
            &mut scratch.members,
            Some(sink),
            c.count,
            health,
        );
        if let Some(r) = record.as_deref_mut() {
            r.times.push((t, algorithm));
            r.starts.push(r.adds.len());
        }
        let slot = &mut class_seconds[c.class as usize];
        if c.count * t >= *slot {
            *slot = c.count * t;
            class_algorithms[c.class as usize] = algorithm;
        }
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
    let step = match (&job.step, topo.peak_tflops_of(gpus)) {
        (Some(spec), Some(peak)) => Some(crate::step::step_report(
            job,
            &class_seconds,
            traffic_seconds,
            spec,
            peak,
        )?),
        _ => None,
    };
    Ok(CostReport {
        comm_seconds,
        class_seconds,
        class_algorithms,
        traffic_seconds,
        bytes_by_level,
        span_level,
        confinement_ok: violation_count == 0,
        violations,
        step,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Collective, Dim};
    use crate::nccl::TREE_BW_FACTOR;
    use crate::topology::tests::tree;
    use std::sync::Arc;

    /// Every injective map of `n` ranks onto the free GPUs of `state`, in lexicographic order.
    fn placements(state: &ClusterState, n: usize) -> Vec<Vec<u32>> {
        let free: Vec<u32> = (0..state.topology().num_gpus())
            .filter(|&g| state.is_free(g))
            .map(|g| g as u32)
            .collect();
        let mut out = Vec::new();
        let mut current = Vec::new();
        fn walk(free: &[u32], n: usize, current: &mut Vec<u32>, out: &mut Vec<Vec<u32>>) {
            if current.len() == n {
                out.push(current.clone());
                return;
            }
            for &g in free {
                if !current.contains(&g) {
                    current.push(g);
                    walk(free, n, current, out);
                    current.pop();
                }
            }
        }
        walk(&free, n, &mut current, &mut out);
        out
    }

    #[test]
    fn lower_bound_is_below_every_placement_and_met_by_the_best() {
        // 4 hosts of 2 GPUs, 2 hosts per leaf; tp2 confined to the host, dp2 across hosts.
        let topo = Arc::new(tree(4, 2, 2));
        let job = crate::job::testing::tp_dp_job(&topo, 2, 2);
        for busy in [vec![], vec![0u32], vec![0, 2], vec![1, 2, 5]] {
            let mut state = ClusterState::new(topo.clone());
            if !busy.is_empty() {
                state.allocate("other", &busy).unwrap();
            }
            let bound = lower_bound(&state, &job).unwrap();
            let mut best = f64::INFINITY;
            for gpus in placements(&state, 4) {
                // The bound holds for placements that meet the job's rules (a tp group split
                // over hosts could be cheaper: no solver may return it).
                let report = evaluate_in(&state, &job, &gpus).unwrap();
                if report.confinement_ok {
                    assert!(
                        bound <= report.comm_seconds * (1.0 + 1e-12),
                        "{busy:?} {gpus:?}"
                    );
                    best = best.min(report.comm_seconds);
                }
            }
            if best.is_finite() {
                // tp inside a host, dp ring over two hosts of one leaf where one leaf holds
                // two free hosts; otherwise across the leaves, which the bound also prices.
                assert!(
                    (best - bound).abs() <= 1e-12 * best,
                    "{busy:?}: {best} vs {bound}"
                );
            }
        }
        // One GPU, no communication: zero.
        let one = crate::job::testing::tp_dp_job(&topo, 1, 1);
        assert_eq!(
            lower_bound(&ClusterState::new(topo.clone()), &one),
            Some(0.0)
        );
    }

    #[test]
    fn loss_factor_by_transport() {
        for t in [LinkTransport::Roce, LinkTransport::Infiniband] {
            assert_eq!(link_loss_factor(0.0, t), 1.0);
            assert_eq!(LinkTransport::from_label(t.label()).unwrap(), t);
            // Monotone in the loss rate, never below the floor.
            let mut last = 1.0;
            for i in 1..=100 {
                let f = link_loss_factor(i as f64 * 1e-3, t);
                assert!(f < last && f >= MIN_FACTOR);
                last = f;
            }
        }
        // Go-back-N over the path's bandwidth-delay product: 1 % leaves 45 %.
        assert!((loss_factor(0.01) - 1.0 / (1.0 + 0.01 * 500e3 / 4096.0)).abs() < 1e-12);
        assert!((loss_factor(0.01) - 0.45).abs() < 0.01);
        // InfiniBand's link-level retry replays a link round trip: 1 % leaves 94 %.
        let ib = link_loss_factor(0.01, LinkTransport::Infiniband);
        assert!((ib - 0.94).abs() < 0.01);
        for p in [1e-5, 1e-4, 1e-3, 1e-2, 0.1] {
            assert!(link_loss_factor(p, LinkTransport::Infiniband) > loss_factor(p));
        }
        assert!(LinkTransport::from_label("ethernet").is_err());
    }

    /// [`tree`] with every fabric level at `fabric` GB/s per GPU.
    fn tree_bw(nodes: usize, per_node: usize, per_leaf: usize, fabric: f64) -> Topology {
        use crate::topology::Level;
        let t = tree(nodes, per_node, per_leaf);
        let mut levels: Vec<Level> = t.levels().to_vec();
        for l in &mut levels[1..] {
            l.bandwidth_gbps = fabric;
        }
        crate::topology::tests::tree_with(levels, nodes, per_node, per_leaf)
    }

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
    fn staged_transports_cap_pairs_and_collectives() {
        use crate::nccl::{NET_STAGED_GBPS, SHM_GBPS};
        use crate::topology::tests::tree_with;
        use crate::topology::Level;
        // Without declarations nothing changes.
        let direct = tree(4, 8, 2);
        assert_eq!(direct.pair_bandwidth(0, 1), 450.0);
        assert_eq!(direct.transports(0), (true, true));
        // No peer-to-peer: a pair inside a host runs at the SHM figure, pairs across hosts
        // keep the fabric's rate.
        let shm = tree(4, 8, 2)
            .with_transports(vec![false], vec![true])
            .unwrap();
        assert_eq!(shm.transports(9), (false, true));
        assert_eq!(shm.pair_bandwidth(0, 1), SHM_GBPS);
        assert_eq!(shm.pair_bandwidth(0, 8), 50.0);
        // A two-GPU ring inside a host: bus bandwidth 2 (n-1)/n S / t = the SHM figure.
        let job = allreduce_job(&shm, 2, 1e9);
        let r = evaluate(&shm, &job, &[0, 1]).unwrap();
        let busbw = 1e9 / (r.comm_seconds - 2.0 * 1e-6) / 1e9;
        assert!((busbw - SHM_GBPS).abs() < 1e-9, "{busbw}");
        // No GPUDirect RDMA: hops through a NIC are staged, NVLink inside the host is not.
        let net = tree(4, 8, 2)
            .with_transports(vec![true], vec![false])
            .unwrap();
        assert_eq!(net.pair_bandwidth(0, 1), 450.0);
        assert!(!net.net_staged(0, 1) && net.net_staged(0, 8) && net.net_staged(0, 16));
        assert_eq!(net.pair_bandwidth(0, 8), NET_STAGED_GBPS);
        assert_eq!(net.pair_bandwidth(0, 16), NET_STAGED_GBPS);
        assert!(!direct.net_staged(0, 8));
        // One GPU on each of two hosts: the ring (staged rate) beats the tree (x 0.92).
        let r = evaluate(&net, &job, &[0, 8]).unwrap();
        let busbw = 1e9 / (r.comm_seconds - 2.0 * 3e-6) / 1e9;
        assert!((busbw - NET_STAGED_GBPS).abs() < 1e-9, "{busbw}");
        assert!(NET_STAGED_GBPS * TREE_BW_FACTOR < busbw);
        // Staging is per GPU, not per NIC share: 4 + 4 GPUs of two hosts drive four shares of
        // 50 GB/s each (200), but stage 4 x 3.0 = 12 GB/s; the NVLink chain is not staged.
        let job8 = allreduce_job(&net, 8, 1e9);
        let r = evaluate(&net, &job8, &[0, 1, 2, 3, 8, 9, 10, 11]).unwrap();
        let ring = 14.0 * 3e-6 + 2.0 * 7.0 / 8.0 * 1e9 / (4.0 * NET_STAGED_GBPS * 1e9);
        assert!(
            r.comm_seconds <= ring + 1e-12,
            "{} vs {ring}",
            r.comm_seconds
        );
        let tree_t = 2.0 * (3.0 * 1e-6 + 3e-6)
            + crate::nccl::tree_bytes_seconds(1e9, 2, 4, 450.0, 4.0 * NET_STAGED_GBPS);
        assert!((r.comm_seconds - ring.min(tree_t)).abs() < 1e-12);
        // One NIC for 8 GPUs: one GPU per host drives the whole NIC (8 shares, 400 GB/s) but
        // stages 3.0 GB/s alone.
        let one_nic = tree(4, 8, 2)
            .with_fabric(vec![0.0], vec![1])
            .unwrap()
            .with_transports(vec![true], vec![false])
            .unwrap();
        let r = evaluate(&one_nic, &job, &[0, 8]).unwrap();
        let busbw = 1e9 / (r.comm_seconds - 2.0 * 3e-6) / 1e9;
        assert!((busbw - NET_STAGED_GBPS).abs() < 1e-9, "{busbw}");
        // All-to-all across the two hosts: each GPU stages its 4/8 S through host memory.
        let a2a = alltoall_job(&net, 8, 1e9);
        let r = evaluate(&net, &a2a, &[0, 1, 2, 3, 8, 9, 10, 11]).unwrap();
        assert!(r.comm_seconds >= 4.0 / 8.0 * 1e9 / (NET_STAGED_GBPS * 1e9));
        // Staging slower than the NIC is a cap, never a speed-up: a 2 GB/s fabric keeps 2.
        let slow = tree_with(
            vec![
                Level {
                    name: "node".into(),
                    bandwidth_gbps: 450.0,
                    latency_us: 1.0,
                },
                Level {
                    name: "leaf".into(),
                    bandwidth_gbps: 2.0,
                    latency_us: 3.0,
                },
                Level {
                    name: "spine".into(),
                    bandwidth_gbps: 2.0,
                    latency_us: 4.0,
                },
            ],
            4,
            8,
            2,
        )
        .with_transports(vec![false], vec![false])
        .unwrap();
        assert_eq!(slow.pair_bandwidth(0, 1), SHM_GBPS);
        let r = evaluate(&slow, &job, &[0, 8]).unwrap();
        let busbw = 1e9 / (r.comm_seconds - 2.0 * 3e-6) / 1e9;
        assert!((busbw - 2.0).abs() < 1e-9, "{busbw}");
        // All flags true is the same as none; a wrong count is refused.
        let none = tree(4, 8, 2)
            .with_transports(vec![true], vec![true])
            .unwrap();
        assert!(!none.net_staged(0, 8));
        assert!(tree(4, 8, 2)
            .with_transports(vec![true, false], vec![true])
            .is_err());
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

        // Four GPUs in node 0 and four in node 2 (another leaf): two ring hops cross the spine,
        // each driving four NIC shares (channels over four rails).
        let split: Vec<u32> = vec![0, 1, 2, 3, 16, 17, 18, 19];
        let r = evaluate(&topo, &job, &split).unwrap();
        let ring = 14.0 * 4e-6 + 2.0 * 7.0 / 8.0 * 1e9 / (4.0 * 25e9);
        // NCCL's tree moves S per host over the four shares here (two hosts) and the chain
        // 2 S over NVLink: it beats the ring.
        let tree = 2.0 * (3.0 * 1e-6 + 4e-6) + (1e9 / (4.0 * 25e9)) / 0.92;
        assert!(tree < ring);
        let expect = tree;
        assert_eq!(r.class_algorithms, vec![Algorithm::Tree]);
        assert!((r.comm_seconds - expect).abs() < 1e-12);
        assert_eq!(r.span_level, Some(2));
        let per_edge = 2.0 * 7.0 / 8.0 * 1e9;
        assert!((r.bytes_by_level[2] - 2.0 * per_edge).abs() < 1.0);
        assert!((r.bytes_by_level[0] - 6.0 * per_edge).abs() < 1.0);
    }

    #[test]
    fn packing_a_group_drives_more_nics_and_rank_order_moves_spine_bytes() {
        let topo = tree(4, 8, 2);
        let job = allreduce_job(&topo, 4, 1e9);
        // 2 + 2 on two hosts under different leaves: two NIC shares per hop.
        let packed = evaluate(&topo, &job, &[0, 1, 16, 17]).unwrap();
        // One GPU on each of four hosts: one share per hop.
        let spread = evaluate(&topo, &job, &[0, 8, 16, 24]).unwrap();
        assert!(packed.comm_seconds < 0.6 * spread.comm_seconds);
        // Rank order: hosts 0 (leaf 0), 2 (leaf 1), 1 (leaf 0), 3 (leaf 1) make every ring
        // hop cross the spine; in leaf order only two do.
        let interleaved = evaluate(&topo, &job, &[0, 16, 8, 24]).unwrap();
        assert!(interleaved.bytes_by_level[2] > 1.9 * spread.bytes_by_level[2]);
        assert!((interleaved.bytes_by_level[2] - 4.0 * 1.5e9).abs() < 1.0);
    }

    #[test]
    fn a_host_with_one_nic_gives_two_gpus_no_more_than_one() {
        // Hosts of 8 GPUs with 2 NICs: each NIC carries 4 per-GPU shares.
        let topo = tree(4, 8, 2).with_fabric(vec![0.0], vec![2]).unwrap();
        assert_eq!(topo.nic_shares(0, 1), 4.0);
        assert_eq!(topo.nic_shares(0, 2), 8.0);
        assert_eq!(topo.nic_shares(0, 5), 8.0);
        // One NIC per host: one GPU already drives all of it, two add nothing.
        let one = tree(4, 8, 2).with_fabric(vec![0.0], vec![1]).unwrap();
        assert_eq!(one.nic_shares(0, 1), 8.0);
        assert_eq!(one.nic_shares(0, 2), 8.0);
        let hops = nccl::ring_hops(&one, &[0, 1, 16, 17]);
        assert!(hops.iter().all(|h| h.lanes == 8.0));
        let hops = nccl::ring_hops(&one, &[0, 16]);
        assert!(hops.iter().all(|h| h.lanes == 8.0));
        // A NIC per GPU (the default): shares follow the GPUs.
        let plain = tree(4, 8, 2);
        assert_eq!(plain.nic_shares(0, 2), 2.0);
        let job = allreduce_job(&plain, 4, 1e9);
        let packed = evaluate(&plain, &job, &[0, 1, 16, 17])
            .unwrap()
            .comm_seconds;
        let job_one = allreduce_job(&one, 4, 1e9);
        let single_nic = evaluate(&one, &job_one, &[0, 1, 16, 17])
            .unwrap()
            .comm_seconds;
        // The single NIC carries all 8 shares: faster than two rails of one share each.
        assert!(single_nic < packed);
    }

    #[test]
    fn collnet_where_the_fabric_reduces_in_the_network() {
        let plain = tree(4, 8, 2);
        let job = allreduce_job(&plain, 16, 1e9);
        let gpus: Vec<u32> = (0..8).chain(16..24).collect();
        let without = evaluate(&plain, &job, &gpus).unwrap();
        assert_ne!(without.class_algorithms, vec![Algorithm::CollNet]);
        // SHARP on the leaves only: the group spans the spine, so no CollNet.
        let leaf_only = tree(4, 8, 2).with_sharp(vec![false, true, false]).unwrap();
        let r = evaluate(&leaf_only, &job, &gpus).unwrap();
        assert_eq!(r.class_algorithms, without.class_algorithms);
        // SHARP on leaves and spine: each host sends S once and gets the sum back.
        let sharp = tree(4, 8, 2).with_sharp(vec![false, true, true]).unwrap();
        let r = evaluate(&sharp, &job, &gpus).unwrap();
        assert_eq!(r.class_algorithms, vec![Algorithm::CollNet]);
        let inter = 8.0 * 25e9;
        let expect =
            2.0 * (1.0 + 4.0) * 1e-6 + (2.0 * 7.0 / 8.0 * 1e9 / 450e9_f64).max(1e9 / inter);
        assert!((r.comm_seconds - expect).abs() < 1e-12);
        assert!(r.comm_seconds < without.comm_seconds);
        assert!(tree(1, 8, 1).with_sharp(vec![true, true]).is_err());
    }

    #[test]
    fn host_count_factors_scale_collectives_by_the_hosts_they_span() {
        let plain = tree(4, 8, 2);
        let topo = tree(4, 8, 2)
            .with_host_count_factors(vec![1.0, 2.0, 0.5])
            .unwrap();
        let job = allreduce_job(&plain, 4, 1e9);
        for (gpus, f) in [
            (vec![0u32, 1, 2, 3], 1.0),
            (vec![0, 1, 8, 9], 2.0),
            (vec![0, 8, 16, 17], 0.5),
            (vec![0, 8, 16, 24], 0.5),
        ] {
            let a = evaluate(&plain, &job, &gpus).unwrap().comm_seconds;
            let b = evaluate(&topo, &job, &gpus).unwrap().comm_seconds;
            assert!((b - f * a).abs() < 1e-12 * a.max(1.0), "{gpus:?}");
        }
        assert!(tree(1, 8, 1).with_host_count_factors(vec![0.0]).is_err());
    }

    #[test]
    fn nccl_algorithm_choice_on_known_cases() {
        let topo = tree(4, 8, 2).with_fabric(vec![470.0], vec![0]).unwrap();
        let job = allreduce_job(&topo, 8, 1e9);
        let r = evaluate(&topo, &job, &(0..8).collect::<Vec<u32>>()).unwrap();
        assert_eq!(r.class_algorithms, vec![Algorithm::Nvls]);
        let expect = NVLS_LATENCY_US * 1e-6 + 2.0 * 7.0 / 8.0 * 1e9 / 470e9;
        assert!((r.comm_seconds - expect).abs() < 1e-12);
        // Small messages: the ring's latency is lower than NVLS's.
        let small = allreduce_job(&topo, 8, 1e3);
        let r = evaluate(&topo, &small, &(0..8).collect::<Vec<u32>>()).unwrap();
        assert_eq!(r.class_algorithms, vec![Algorithm::Ring]);
        // Across 4 hosts: small all-reduces take the tree (log2 latency), large the ring.
        let across: Vec<u32> = vec![0, 1, 8, 9, 16, 17, 24, 25];
        let r = evaluate(&topo, &small, &across).unwrap();
        assert_eq!(r.class_algorithms, vec![Algorithm::Tree]);
        // Two full hosts under one leaf (8 shares of 50 GB/s against 450 GB/s NVLink) without
        // NVLS: the tree's NVLink chain is its bottleneck, the ring wins large all-reduces.
        let plain = tree(4, 8, 2);
        let job16 = allreduce_job(&plain, 16, 1e9);
        let r = evaluate(&plain, &job16, &(0..16).collect::<Vec<u32>>()).unwrap();
        assert_eq!(r.class_algorithms, vec![Algorithm::Ring]);
        // With NVLS (H100-like NVSwitches), NCCL's NVLS-tree replaces the chain by NVLS: each
        // host's 8 GPUs reduce in the switch, the two hosts exchange S over 8 shares.
        let r = evaluate(&topo, &job16, &(0..16).collect::<Vec<u32>>()).unwrap();
        assert_eq!(r.class_algorithms, vec![Algorithm::NvlsTree]);
        let expect = (NVLS_LATENCY_US + 2.0 * 3.0) * 1e-6
            + (2.0 * 7.0 / 8.0 * 1e9 / 470e9_f64).max(1e9 / (8.0 * 50e9)) / TREE_BW_FACTOR;
        assert!((r.comm_seconds - expect).abs() < 1e-12);
        let ring = evaluate(&plain, &job16, &(0..16).collect::<Vec<u32>>()).unwrap();
        assert!(r.comm_seconds < ring.comm_seconds);
        let r = evaluate(&topo, &job, &across).unwrap();
        assert_eq!(r.class_algorithms, vec![Algorithm::Tree]);
    }

    #[test]
    fn nvls_tree_moves_twice_the_bytes_per_domain_beyond_two_domains() {
        // Fabric-bound (8 shares of 1 GB/s): two domains move S each, more 2 S each.
        let two = nccl::nvls_tree_bytes_seconds(1e9, 2, 8, 470.0, 8.0);
        let four = nccl::nvls_tree_bytes_seconds(1e9, 4, 8, 470.0, 8.0);
        assert!((two - 1e9 / 8e9 / TREE_BW_FACTOR).abs() < 1e-12);
        assert!((four - 2.0 * two).abs() < 1e-12);
        // NVLS-bound (a fast fabric): the domain count does not matter.
        let two = nccl::nvls_tree_bytes_seconds(1e9, 2, 8, 470.0, 1e6);
        let four = nccl::nvls_tree_bytes_seconds(1e9, 16, 8, 470.0, 1e6);
        assert_eq!(two, four);
        // Without NVLS on the hosts, no NVLS-tree.
        let plain = tree(4, 8, 2);
        let job = allreduce_job(&plain, 32, 1e9);
        let r = evaluate(&plain, &job, &(0..32).collect::<Vec<u32>>()).unwrap();
        assert_ne!(r.class_algorithms, vec![Algorithm::NvlsTree]);
        // One GPU per host: nothing for the switches to reduce.
        let topo = tree(4, 8, 2).with_fabric(vec![470.0], vec![0]).unwrap();
        let job = allreduce_job(&topo, 4, 1e9);
        let r = evaluate(&topo, &job, &[0, 8, 16, 24]).unwrap();
        assert_ne!(r.class_algorithms, vec![Algorithm::NvlsTree]);
    }

    fn alltoall_job(topo: &Topology, n: usize, bytes: f64) -> JobSpec {
        let mut job = allreduce_job(topo, n, bytes);
        job.collectives[0].kind = CollectiveKind::AllToAll;
        job
    }

    fn busbw(topo: &Topology, gpus: &[u32], bytes: f64) -> f64 {
        let n = gpus.len();
        let job = alltoall_job(topo, n, bytes);
        let t = evaluate(topo, &job, gpus).unwrap().comm_seconds;
        (n as f64 - 1.0) / n as f64 * bytes / t / 1e9
    }

    #[test]
    fn alltoall_inside_an_nvlink_domain_never_crosses_the_fabric() {
        let topo = tree(4, 8, 2);
        let gpus: Vec<u32> = (0..8).collect();
        let job = alltoall_job(&topo, 8, 1e9);
        let r = evaluate(&topo, &job, &gpus).unwrap();
        assert_eq!(r.class_algorithms, vec![Algorithm::Pairwise]);
        assert!(r.bytes_by_level[1..].iter().all(|&b| b == 0.0));
        let expect = 7.0 * 1e-6 + 7.0 / 8.0 * 1e9 / 450e9;
        assert!((r.comm_seconds - expect).abs() < 1e-12);
        // A fabric a hundred times slower does not change it.
        let slow = tree_bw(4, 8, 2, 0.5);
        assert_eq!(
            evaluate(&slow, &job, &gpus).unwrap().comm_seconds,
            r.comm_seconds
        );
    }

    #[test]
    fn alltoall_busbw_falls_as_the_fabric_share_grows() {
        // 8 GPUs on each of d hosts: a share (d-1)/d of each GPU's bytes leaves its host.
        let topo = tree(8, 8, 8);
        let mut last = f64::INFINITY;
        for d in 1..=8u32 {
            let gpus: Vec<u32> = (0..8 * d).collect();
            let b = busbw(&topo, &gpus, 1e9);
            assert!(b < last, "{d} hosts: {b} not below {last}");
            last = b;
        }
        // Two hosts: between once and twice a GPU's network bandwidth (nccl-tests #130/#267),
        // less the NVLink rounds; many hosts: towards once.
        let two = busbw(&topo, &(0..16).collect::<Vec<u32>>(), 1e9);
        assert!(two > 50.0 && two < 100.0, "{two}");
        let eight = busbw(&topo, &(0..64).collect::<Vec<u32>>(), 1e9);
        assert!(eight > 45.0 && eight < 58.0, "{eight}");
        // Fewer GPUs of each host in the group: the same fabric bytes per GPU, fewer NVLink
        // rounds, no faster than the full hosts per byte of fabric.
        let one_each: Vec<u32> = (0..8).map(|h| 8 * h).collect();
        let spread = busbw(&topo, &one_each, 1e9);
        assert!((spread - 50.0 * 7.0 / 7.0).abs() < 1.0, "{spread}");
    }

    #[test]
    fn alltoall_time_grows_as_the_fabric_share_shrinks() {
        let topo = tree(4, 8, 2);
        let gpus: Vec<u32> = (0..8).chain(16..24).collect();
        let mut last = 0.0;
        for share in [1.0, 0.8, 0.5, 0.25] {
            let t = nccl::alltoall_bytes_seconds(&topo, &gpus, 1e9, share, |a, b, _| {
                topo.pair_bandwidth(a, b)
            });
            assert!(t > last);
            last = t;
        }
        // Inside one host the fabric share does not matter.
        let inside: Vec<u32> = (0..8).collect();
        let bw = |a: usize, b: usize, _| topo.pair_bandwidth(a, b);
        assert_eq!(
            nccl::alltoall_bytes_seconds(&topo, &inside, 1e9, 1.0, bw),
            nccl::alltoall_bytes_seconds(&topo, &inside, 1e9, 0.1, bw)
        );
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
                factor: 0.5,
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
