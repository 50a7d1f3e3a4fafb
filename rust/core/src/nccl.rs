//! Collective algorithms as NCCL builds and chooses them, for the one cost model
//! ([`crate::cost`]).
//!
//! * **Nodes.** NCCL's unit of a "node" is the NVLink domain: the host on HGX, the whole rack
//!   on NVL72, whose multi-node NVLink makes it one NCCL node ([`unit_of`]). Below, "host"
//!   means that unit.
//! * **Ring order.** NCCL orders a communicator's ring by its ranks across hosts and by the
//!   NVLink/PCIe topology inside a host: hosts are visited in the order of their lowest rank,
//!   the GPUs of one host consecutively in id order ([`ring_order`]). Rank order therefore
//!   changes which switches the ring crosses and how many bytes go over the spine.
//! * **Channels and NICs.** NCCL runs many channels at once, and a communicator with `k` GPUs
//!   on a host drives up to `k` of that host's NICs in parallel (each GPU's rail, or through
//!   PXN the host's other NICs). A level's bandwidth is per GPU (the GPU's share of its host's
//!   NICs), so a hop that leaves the NVLink domain runs at that bandwidth times the NIC shares
//!   of the smaller side of the hop ([`Topology::nic_shares`]): `k` shares when the host has a
//!   NIC per GPU (or more, or does not list its NICs), `min(k, nics)` NICs of `gpus / nics`
//!   shares each when it has fewer. A 16-GPU group packed 8 + 8 on DGX hosts gets eight NICs'
//!   worth, the same 16 GPUs spread one per host get one; on a host with one NIC for four GPUs
//!   two GPUs get no more than one. Concurrent collectives of one class each drive their own
//!   GPUs' shares, so one dp group per rail (tp 8 × dp) gets one.
//! * **Algorithm per call, fastest by size** (NCCL `src/graph/tuning.cc` picks the algorithm
//!   of least predicted time for each call):
//!   - *ring*: `2 (n-1)` latency steps at the highest level spanned, `2 (n-1)/n · S` bytes at
//!     the ring's bus bandwidth (its slowest hop, as above);
//!   - *tree* (NCCL's all-reduce tree: a chain through each host's GPUs, double binary trees
//!     across hosts; all-reduce only, as in NCCL): latency
//!     `2 · ((k_max − 1) · α_intra + ⌈log2 H⌉ · α_span)` for H hosts; bytes: each GPU of a
//!     chain passes `2 S` over NVLink (reduce up, broadcast down) and each host moves
//!     `2 (H−1)/H · S` over its NIC shares (S for two hosts, where each tree's root is one of
//!     them; the ring moves `2 (n−1)/n · S` per host instead), at 92 % efficiency
//!     (NCCL `tuning.cc` derates tree bandwidth by `.92`): time
//!     `max(2S/B_intra, 2(H−1)/H·S/B_inter) / 0.92`. Trees win across few hosts with many
//!     GPUs each and for mid-size messages; rings win when the NVLink chain is the bottleneck;
//!   - *NVLS* (NVLink SHARP, all-reduce inside one NVLink domain whose NVSwitches have it,
//!     H100/H200/B200 HGX and NVL72): `2 (n-1)/n · S` at the host type's measured NVLS bus
//!     bandwidth (`nvls_gbps` in the topology), after a fixed [`NVLS_LATENCY_US`];
//!   - *CollNet* (SHARP in-network reduction, all-reduce across hosts when every switch level
//!     from the NVLink domain up to the span reduces, `sharp: true` in the topology): a
//!     reduce-scatter and all-gather inside each host (`2 (k−1)/k · S` per GPU over NVLink)
//!     and each host sending `S` once to the switches and receiving the sum, so time
//!     `2 (α_intra + α_span) + max(2(k−1)/k · S / B_intra, S / B_inter)` (NCCL CollNet Direct;
//!     Graham et al., "Scalable Hierarchical Aggregation Protocol (SHArP)", COMHPC 2016);
//!   - *NVLS-tree* (NCCL 2.18+, all-reduce across NVLink domains whose switches have NVLS, at
//!     least two of the group's GPUs in each): NVLS inside each domain, NCCL's tree between
//!     them, pipelined ([`nvls_tree_bytes_seconds`]; latency `25 µs + 2 ⌈log2 H⌉ · α_span`,
//!     NCCL `tuning.cc`'s `intraLat + 2 log2(nNodes) interLat`);
//!   - all-gather and reduce-scatter use the ring, p2p one hop. NCCL 2.26's tuner
//!     (`src/graph/tuning.cc`, `ncclTopoTuneModel`) offers them Ring, PAT, NVLS and CollNet
//!     Direct only: PAT only with one GPU per node (`nNodes != nRanks` disables it), NVLS
//!     across nodes only with CollNet support, so across HGX hosts without SHARP they run
//!     the ring, at `nChannels · bwIntra` for up to two nodes with the ring's `nRanks / nsteps`
//!     conversion: the same bus bandwidth as an all-reduce ring on the same GPUs, which is
//!     what the model gives them (an all-reduce's tree or NVLS-tree, priced above, can beat
//!     the ring's bus bandwidth; an all-gather has no such algorithm here);
//!   - *all-to-all*: grouped send/receive, per NVLink domain its fabric bytes over its NIC
//!     shares plus its NVLink rounds (PXN forwarding included), the slowest domain setting the
//!     pace ([`alltoall_bytes_seconds`]).
//!
//! The report names the algorithm chosen for each class's slowest collective.
//!
//! ## Transports: direct or staged through host memory
//!
//! NCCL moves a hop's data directly where it can (P2P over NVLink or PCIe inside a host,
//! GPUDirect RDMA between a GPU and its NIC) and through buffers in host memory where it
//! cannot. NCCL's topology code diverts such a path through the CPU (`src/graph/paths.cc`,
//! `ncclTopoComputePaths`: `addInterStep(system, CPU, ...)` for GPU pairs without P2P and for
//! GPU-NIC pairs without GDR), and the transport copies twice: the sender's GPU writes a
//! buffer in host memory, the receiver's GPU (SHM) or the NIC (network) reads it, and back on
//! the other side. A host type declares which of its paths are staged (`p2p: false`,
//! `gpudirect_rdma: false` in the topology file; [`Topology::with_transports`]), and a staged
//! pair's bandwidth is capped at what staging was measured to deliver:
//!
//! * **SHM** (no GPU peer-to-peer inside a host: GeForce boards, whose driver reports no P2P,
//!   PCIe GPUs under different CPU sockets, `NCCL_P2P_DISABLE=1`): [`SHM_GBPS`] per GPU, in
//!   [`Topology::pair_bandwidth`], so every algorithm and solver sees it.
//! * **Network without GPUDirect RDMA** (the NIC is not under the GPU's PCIe switch, no
//!   `nvidia-peermem`, or an instance type without it such as EC2's g4dn and g6e): every hop
//!   that leaves the NVLink domain through a NIC of such a host is staged, and each GPU
//!   driving it moves at most [`NET_STAGED_GBPS`] whatever NIC shares it has
//!   ([`Topology::net_staged`]): per pair in [`Topology::pair_bandwidth`] (point-to-point,
//!   explicit traffic, the solvers' pricing), per GPU of a ring hop's smaller side in
//!   [`ring_bandwidths`] (ring, tree, NVLS-tree, CollNet), per GPU of a domain in
//!   [`alltoall_bytes_seconds`].
//!
//! Both are two-way copies through the CPU's root complex and memory, so they do not scale
//! with the PCIe generation the way direct paths do; the measured figures are flat constants,
//! not fractions of the link rate. A NIC slower than the cap keeps its own rate.
//!
//! Bytes per level are counted on the ring's edges whichever algorithm runs (the tree's and
//! NVLS's bytes stay on the same levels; their split between levels is not modelled apart).

use crate::topology::Topology;

/// An algorithm of NCCL's, as the cost model prices it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Algorithm {
    Ring = 0,
    Tree = 1,
    Nvls = 2,
    /// All-to-all: every rank exchanges with every other.
    Pairwise = 3,
    /// Point-to-point: one hop.
    P2p = 4,
    /// CollNet (SHARP): the fabric's switches reduce.
    CollNet = 5,
    /// NVLS inside each NVLink domain, NCCL's tree between them (NCCL `NVLS_TREE`).
    NvlsTree = 6,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::Nvls => "nvls",
            Algorithm::Pairwise => "pairwise",
            Algorithm::P2p => "p2p",
            Algorithm::CollNet => "collnet",
            Algorithm::NvlsTree => "nvls-tree",
        }
    }
}

/// Fixed latency of an NVLS all-reduce (µs): an assumed figure of the order NCCL's tuning
/// model gives NVLS, so that rings win small messages and NVLS large ones (above ~10 MB on
/// 8 × H100).
pub const NVLS_LATENCY_US: f64 = 25.0;
/// NCCL's tree bus bandwidth relative to the ring's (`tuning.cc`: `busBw * .92`).
pub const TREE_BW_FACTOR: f64 = 0.92;

/// Bandwidth (GB/s per GPU, each direction) of NCCL's SHM transport between two GPUs of one
/// host without peer-to-peer access (module docs, "Transports"). Source: NVIDIA/nccl issue
/// #384 (2020): two GPUs on PCIe Gen3 x16 with `NCCL_P2P_DISABLE=1` (SHM), NCCL 2.4.8 and one
/// channel, all-reduce bus bandwidth 3.9 GB/s (all-gather and reduce-scatter 3.17) against
/// 10.31 GB/s for a one-way broadcast; NCCL's maintainer (sjeaugey) answered that some CPUs
/// handle two-way traffic through host memory badly. A ring's hops all run both ways, so the
/// two-way figure applies.
pub const SHM_GBPS: f64 = 3.9;

/// Bandwidth (GB/s per GPU, each direction) of a network hop staged through host memory, for
/// hosts without GPUDirect RDMA (module docs, "Transports"). Source: aws/aws-ofi-nccl issue
/// #547 (2024-2025): nccl-tests on EC2 g6e (L40S, four EFA interfaces) "maxes out at 3GBps";
/// AWS's maintainer (bwbarrett) answered that the g6e hardware does not support GPUDirect
/// RDMA and that on EC2 only the P series from p4d does. Same vendor family (EFA through
/// aws-ofi-nccl) as the g4dn T4 run in the shared measurements, so that run is not an
/// independent check of this figure.
pub const NET_STAGED_GBPS: f64 = 3.0;

/// The unit NCCL treats as one node: the NVLink domain (the host on HGX; the whole rack on
/// NVL72, whose multi-node NVLink makes it one NCCL node, its NICs reachable through NVLink).
#[inline]
pub fn unit_of(topo: &Topology, gpu: usize) -> usize {
    topo.domain_of(gpu, topo.nvlink_level())
}

/// Reorder `members` (GPU ids in rank order) into NCCL's ring order: NVLink domains (hosts on
/// HGX) in the order of their lowest rank, each domain's GPUs consecutively in id order.
pub fn ring_order(topo: &Topology, members: &mut [u32]) {
    if members.len() < 2 {
        return;
    }
    // (host, rank position, GPU) sorted by host then rank: each host's first entry holds the
    // position of its lowest rank. Two sorts, O(n log n) for groups spanning many hosts.
    let mut by_host: Vec<(usize, u32, u32)> = members
        .iter()
        .enumerate()
        .map(|(i, &g)| (unit_of(topo, g as usize), i as u32, g))
        .collect();
    by_host.sort_unstable();
    let mut key: Vec<(u32, u32)> = Vec::with_capacity(members.len());
    let mut first = 0u32;
    for (i, &(h, pos, g)) in by_host.iter().enumerate() {
        if i == 0 || by_host[i - 1].0 != h {
            first = pos;
        }
        key.push((first, g));
    }
    key.sort_unstable();
    for (m, (_, g)) in members.iter_mut().zip(key) {
        *m = g;
    }
}

/// Number of the ring's GPUs in the NVLink domain of each position (members in ring order, so a
/// domain's GPUs are consecutive).
pub fn host_runs(topo: &Topology, ring: &[u32]) -> Vec<u32> {
    let n = ring.len();
    let mut out = vec![0u32; n];
    let mut start = 0;
    while start < n {
        let h = unit_of(topo, ring[start] as usize);
        let mut end = start + 1;
        while end < n && unit_of(topo, ring[end] as usize) == h {
            end += 1;
        }
        for slot in &mut out[start..end] {
            *slot = (end - start) as u32;
        }
        start = end;
    }
    out
}

/// Every edge of a ring (GPU ids in ring order, `runs` from [`host_runs`]), closing edge
/// included: (from GPU, to GPU, their lowest common level, the NIC shares it drives when it
/// leaves the NVLink domain or None inside it). The one definition of which hosts, NICs and
/// levels a ring crosses: the cost model prices its bandwidth from it, [`ring_hops`] lists the
/// crossings, and [`crate::fabric`] loads the uplinks with the same ring.
pub fn ring_edges<'a>(
    topo: &'a Topology,
    ring: &'a [u32],
    runs: &'a [u32],
) -> impl Iterator<Item = (usize, usize, usize, Option<f64>)> + 'a {
    let n = ring.len();
    let nvlink = topo.nvlink_level();
    (0..if n < 2 { 0 } else { n }).map(move |i| {
        let j = (i + 1) % n;
        let (a, b) = (ring[i] as usize, ring[j] as usize);
        let level = topo.lca(a, b);
        // Channels over the rails (or PXN) of the group's GPUs on the smaller side.
        let lanes =
            (level > nvlink).then(|| topo.nic_shares(a, runs[i]).min(topo.nic_shares(b, runs[j])));
        (a, b, level, lanes)
    })
}

/// The slowest edge inside NVLink domains and the slowest out of them (NIC shares included) of
/// a ring in ring order, given each edge's per-GPU bandwidth `bw(a, b, level)` (GB/s;
/// infinite where the ring has no such edge). The ring runs at the smaller of the two. A hop
/// staged through host memory (no GPUDirect RDMA on either side, [`Topology::net_staged`])
/// moves at most [`NET_STAGED_GBPS`] per GPU of its smaller side.
pub fn ring_bandwidths(
    topo: &Topology,
    ring: &[u32],
    runs: &[u32],
    mut bw: impl FnMut(usize, usize, usize) -> f64,
) -> (f64, f64) {
    let n = ring.len();
    let (mut intra, mut inter) = (f64::INFINITY, f64::INFINITY);
    for (i, (a, b, level, lanes)) in ring_edges(topo, ring, runs).enumerate() {
        match lanes {
            Some(k) => {
                let mut v = k * bw(a, b, level);
                if topo.net_staged(a, b) {
                    // Each GPU of the smaller side stages its own channels' data.
                    let gpus = runs[i].min(runs[(i + 1) % n]) as f64;
                    v = v.min(gpus * NET_STAGED_GBPS);
                }
                inter = inter.min(v);
            }
            None => intra = intra.min(bw(a, b, level)),
        }
    }
    (intra, inter)
}

/// One hop of a ring that leaves its NVLink domain (its host on HGX).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hop {
    pub from_gpu: u32,
    pub to_gpu: u32,
    pub from_host: u32,
    pub to_host: u32,
    /// The lowest common level of the two GPUs.
    pub level: usize,
    /// NIC shares (units of the per-GPU fabric bandwidth) driven in parallel on this hop when
    /// it leaves the NVLink domain (see [`Topology::nic_shares`]), 1 otherwise.
    pub lanes: f64,
}

/// The hops of NCCL's ring over `members` (GPU ids in rank order) that leave an NVLink domain,
/// in ring order, closing hop included: which hosts (and how many NIC shares) each ring
/// crosses, for per-uplink accounting.
pub fn ring_hops(topo: &Topology, members: &[u32]) -> Vec<Hop> {
    let mut ring = members.to_vec();
    ring_order(topo, &mut ring);
    let runs = host_runs(topo, &ring);
    let mut out = Vec::new();
    for (a, b, level, lanes) in ring_edges(topo, &ring, &runs) {
        if unit_of(topo, a) == unit_of(topo, b) {
            continue;
        }
        let (ha, hb) = (topo.node_of(a), topo.node_of(b));
        let lanes = lanes.unwrap_or(1.0);
        out.push(Hop {
            from_gpu: a as u32,
            to_gpu: b as u32,
            from_host: ha as u32,
            to_host: hb as u32,
            level,
            lanes,
        });
    }
    out
}

/// Number of distinct NVLink domains (hosts on HGX) and the most GPUs in one, of a ring (ring
/// order).
pub fn host_shape(topo: &Topology, ring: &[u32], runs: &[u32]) -> (usize, u32) {
    let mut hosts = 0usize;
    let mut k_max = 0u32;
    let mut prev = usize::MAX;
    for (i, &g) in ring.iter().enumerate() {
        let h = unit_of(topo, g as usize);
        if h != prev {
            hosts += 1;
            prev = h;
        }
        k_max = k_max.max(runs[i]);
    }
    (hosts, k_max)
}

/// Bandwidth time (s) of a tree all-reduce of `bytes` over `hosts` hosts with at most
/// `k_max` GPUs on one, given the slowest intra-host hop and the slowest host-to-host hop
/// (NIC shares included) in GB/s (see the module docs).
pub fn tree_bytes_seconds(bytes: f64, hosts: usize, k_max: u32, intra: f64, inter: f64) -> f64 {
    let h = hosts.max(2) as f64;
    let chain = if k_max > 1 && intra.is_finite() {
        2.0 * bytes / (intra * 1e9)
    } else {
        0.0
    };
    let fabric = 2.0 * (h - 1.0) / h * bytes / (inter * 1e9);
    chain.max(fabric) / TREE_BW_FACTOR
}

/// Bandwidth time (s) of a CollNet (SHARP) all-reduce of `bytes` with at most `k_max` GPUs in
/// one host, given the slowest intra-host hop and host-to-fabric hop (GB/s).
pub fn collnet_bytes_seconds(bytes: f64, k_max: u32, intra: f64, inter: f64) -> f64 {
    let k = k_max.max(1) as f64;
    let local = if k_max > 1 && intra.is_finite() {
        2.0 * (k - 1.0) / k * bytes / (intra * 1e9)
    } else {
        0.0
    };
    local.max(bytes / (inter * 1e9))
}

/// Bandwidth time (s) of an NVLS-tree all-reduce of `bytes` (NCCL's `NVLS_TREE`, 2.18+):
/// inside each NVLink domain the NVSwitches reduce and multicast (NVLS, at `nvls` GB/s of bus
/// bandwidth, the figure a one-domain NVLS all-reduce reaches, degradation and efficiency
/// applied by the caller), between domains NCCL's tree moves each domain's data over its NIC
/// shares (`inter` GB/s). The two stages are pipelined, so the slower one sets the pace. The
/// tree's fabric bytes follow NCCL's tuner (`src/graph/tuning.cc`, `interBw * (nNodes <= 2 ?
/// 2 : 1)` for `NCCL_ALGO_NVLS_TREE`): `S` per domain for two domains (each is the other's
/// root), `2 S` beyond (an interior node of the double binary tree receives from two children
/// and sends to two). Derated by the tree's [`TREE_BW_FACTOR`] like NCCL's tree.
pub fn nvls_tree_bytes_seconds(bytes: f64, hosts: usize, k_max: u32, nvls: f64, inter: f64) -> f64 {
    let k = k_max.max(1) as f64;
    let intra = 2.0 * (k - 1.0) / k * bytes / (nvls * 1e9);
    let per_domain = if hosts <= 2 { 1.0 } else { 2.0 };
    let fabric = per_domain * bytes / (inter * 1e9);
    intra.max(fabric) / TREE_BW_FACTOR
}

/// Bandwidth time (s) of an all-to-all of `bytes` per rank over `members` (GPU ids, any
/// order), as NCCL runs it: grouped send/receive, every rank sending `S/n` to every other.
///
/// * Bytes to peers in the sender's NVLink domain stay on NVLink; bytes to the other peers
///   cross the fabric. A domain's fabric bytes (out, and in: the larger of the two) go over the
///   NIC shares its `k` GPUs drive ([`Topology::nic_shares`]), each pair at its own path
///   bandwidth `bw(a, b, level)` (GB/s per share, degradation included), times
///   `fabric_share` (contention and hash collisions on the uplinks).
/// * PXN (NCCL 2.12+, on by default): a message whose destination sits on another rail is
///   first copied over NVLink to the sender domain's GPU on the destination's rail, so the
///   fabric keeps traffic on its rails; a fraction `1 - 1/min(rails, k)` of the fabric bytes
///   crosses NVLink once more on the sending side.
/// * NCCL schedules the peers of an all-to-all in rounds (peer `rank ± δ` for δ = 1..n-1) over
///   the same channels, so the NVLink rounds and the network rounds of a domain take turns
///   rather than overlap: a domain's time is its fabric time plus its NVLink time, and the
///   collective runs at the pace of the slowest domain.
///
/// Inside one NVLink domain this is `(n-1)/n · S` at the slowest pair, the ring model's
/// all-to-all. Across domains it gives the shape nccl-tests issues #130 and #267 show: bus
/// bandwidth near `(n-1)/(n-k)` times a GPU's network bandwidth (twice it across two domains,
/// falling towards once as domains are added), less the NVLink time.
pub fn alltoall_bytes_seconds(
    topo: &Topology,
    members: &[u32],
    bytes: f64,
    fabric_share: f64,
    mut bw: impl FnMut(usize, usize, usize) -> f64,
) -> f64 {
    let n = members.len();
    if n < 2 {
        return 0.0;
    }
    let pair = bytes / n as f64;
    let unit: Vec<usize> = members.iter().map(|&g| unit_of(topo, g as usize)).collect();
    let mut ids = unit.clone();
    ids.sort_unstable();
    ids.dedup();
    let index = |u: usize| ids.binary_search(&u).unwrap_or(0);
    let m = ids.len();
    // Per domain: its GPUs, first GPU, slowest pair inside, seconds out and in at one share.
    let mut k = vec![0u32; m];
    let mut first = vec![usize::MAX; m];
    let mut slow_intra = vec![f64::INFINITY; m];
    let mut out = vec![0.0f64; m];
    let mut inn = vec![0.0f64; m];
    let slot: Vec<usize> = unit.iter().map(|&u| index(u)).collect();
    for (i, &g) in members.iter().enumerate() {
        k[slot[i]] += 1;
        if first[slot[i]] == usize::MAX {
            first[slot[i]] = g as usize;
        }
    }
    for i in 0..n {
        for j in (i + 1)..n {
            let (a, b) = (members[i] as usize, members[j] as usize);
            let l = topo.lca(a, b);
            let v = bw(a, b, l);
            let (ua, ub) = (slot[i], slot[j]);
            if ua == ub {
                slow_intra[ua] = slow_intra[ua].min(v);
            } else {
                // Both directions of the pair: a -> b leaves ua and enters ub, and back.
                let t = pair / (v * 1e9);
                out[ua] += t;
                inn[ub] += t;
                out[ub] += t;
                inn[ua] += t;
            }
        }
    }
    let share = if fabric_share > 0.0 {
        fabric_share
    } else {
        1.0
    };
    let mut worst = 0.0f64;
    for u in 0..m {
        let ku = k[u] as f64;
        let remote = (n as f64) - ku;
        let mut fabric = if remote > 0.0 {
            out[u].max(inn[u]) / topo.nic_shares(first[u], k[u]) / share
        } else {
            0.0
        };
        if remote > 0.0 && !topo.transports(first[u]).1 {
            // No GPUDirect RDMA: each GPU stages its `remote · S/n` bytes through host memory.
            fabric = fabric.max(remote * pair / (NET_STAGED_GBPS * 1e9));
        }
        let nvlink = if k[u] > 1 && slow_intra[u].is_finite() {
            let rails = topo.rails(first[u]).min(k[u]).max(1) as f64;
            let pxn = if remote > 0.0 { 1.0 - 1.0 / rails } else { 0.0 };
            ((ku - 1.0) + pxn * remote) * pair / (slow_intra[u] * 1e9)
        } else {
            0.0
        };
        worst = worst.max(fabric + nvlink);
    }
    worst
}

/// ⌈log2 x⌉ for x >= 1.
pub fn ceil_log2(x: usize) -> f64 {
    (usize::BITS - x.saturating_sub(1).leading_zeros()) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::tests::tree;

    #[test]
    fn ring_visits_hosts_in_order_of_lowest_rank() {
        let topo = tree(4, 8, 2);
        // Ranks 0,1 on host 2; ranks 2,3 on host 0; rank 4 on host 2 again.
        let mut members = vec![17, 16, 1, 0, 18];
        ring_order(&topo, &mut members);
        assert_eq!(members, vec![16, 17, 18, 0, 1]);
        assert_eq!(host_runs(&topo, &members), vec![3, 3, 3, 2, 2]);
        let hops = ring_hops(&topo, &[17, 16, 1, 0, 18]);
        assert_eq!(hops.len(), 2);
        assert_eq!(
            (hops[0].from_host, hops[0].to_host, hops[0].lanes),
            (2, 0, 2.0)
        );
        assert_eq!(hops[0].level, 2);
    }

    #[test]
    fn log2() {
        assert_eq!(ceil_log2(1), 0.0);
        assert_eq!(ceil_log2(2), 1.0);
        assert_eq!(ceil_log2(3), 2.0);
        assert_eq!(ceil_log2(16), 4.0);
    }
}
