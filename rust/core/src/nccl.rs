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
//!   - all-gather and reduce-scatter use the ring, all-to-all pairwise exchange, p2p one hop.
//!
//! The report names the algorithm chosen for each class's slowest collective.
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
        }
    }
}

/// Fixed latency of an NVLS all-reduce (µs): an assumed figure of the order NCCL's tuning
/// model gives NVLS, so that rings win small messages and NVLS large ones (above ~10 MB on
/// 8 × H100).
pub const NVLS_LATENCY_US: f64 = 25.0;
/// NCCL's tree bus bandwidth relative to the ring's (`tuning.cc`: `busBw * .92`).
pub const TREE_BW_FACTOR: f64 = 0.92;

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
/// infinite where the ring has no such edge). The ring runs at the smaller of the two.
pub fn ring_bandwidths(
    topo: &Topology,
    ring: &[u32],
    runs: &[u32],
    mut bw: impl FnMut(usize, usize, usize) -> f64,
) -> (f64, f64) {
    let (mut intra, mut inter) = (f64::INFINITY, f64::INFINITY);
    for (a, b, level, lanes) in ring_edges(topo, ring, runs) {
        match lanes {
            Some(k) => inter = inter.min(k * bw(a, b, level)),
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
