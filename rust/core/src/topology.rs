//! The cluster topology as flat arrays: every GPU has a path of domain ids, one per level,
//! bottom-up (e.g. numa < node < nvlink-domain < leaf < spine). Traffic between two GPUs is
//! priced by their lowest common level; a host type may carry a GPU-to-GPU bandwidth matrix
//! that overrides the levels inside the host, for hosts that are not a clean tree.

use crate::error::{CoreError, Result};

/// One level of the hierarchy.
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    pub name: String,
    /// Per-GPU, one-direction bandwidth (GB/s) of traffic whose lowest common level is this one.
    pub bandwidth_gbps: f64,
    /// Latency of one message at this level (µs).
    pub latency_us: f64,
}

/// How a level's switches spread the flows leaving one of its domains over the parallel links
/// of its uplink (see [`crate::fabric`], "Routing and hash collisions").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routing {
    /// Adaptive routing (or any scheme that balances flows): every flow gets its fair share
    /// of the uplink's capacity. What the model assumes when a topology declares nothing.
    #[default]
    Adaptive,
    /// ECMP: each flow (each queue pair of a connection) is hashed onto one parallel link.
    Ecmp,
    /// Static (deterministic) routing by destination, InfiniBand's default: one path per
    /// destination, so queue pairs do not spread a connection.
    Static,
    /// The level's switches reduce in the network (SHARP); other traffic is balanced as with
    /// adaptive routing.
    Sharp,
}

impl Routing {
    /// The name used in topology files.
    pub fn label(self) -> &'static str {
        match self {
            Routing::Adaptive => "adaptive",
            Routing::Ecmp => "ecmp",
            Routing::Static => "static",
            Routing::Sharp => "sharp",
        }
    }

    /// Parse a label ([`Routing::label`]).
    pub fn from_label(label: &str) -> Result<Routing> {
        match label {
            "adaptive" => Ok(Routing::Adaptive),
            "ecmp" => Ok(Routing::Ecmp),
            "static" => Ok(Routing::Static),
            "sharp" => Ok(Routing::Sharp),
            other => Err(invalid(format!(
                "routing: expected ecmp, adaptive, static or sharp, got {other:?}"
            ))),
        }
    }

    /// Whether flows are hashed (or routed by destination) onto one link each, so that they
    /// may collide, rather than balanced.
    pub fn hashes(self) -> bool {
        matches!(self, Routing::Ecmp | Routing::Static)
    }
}

/// A host type: how many GPUs a host has and, optionally, their pairwise bandwidth.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeType {
    pub name: String,
    pub gpus: usize,
    /// Row-major `gpus x gpus` bandwidth (GB/s) between local GPUs; overrides the levels at and
    /// below the node level for pairs inside one host. The diagonal is ignored.
    pub bandwidth_gbps: Option<Vec<f64>>,
}

/// Compressed rows: the members of item `i` are `items[offsets[i]..offsets[i + 1]]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Csr {
    pub offsets: Vec<usize>,
    pub items: Vec<u32>,
}

impl Csr {
    pub(crate) fn from_pairs(
        rows: usize,
        pairs: impl Iterator<Item = (usize, u32)> + Clone,
    ) -> Csr {
        let mut counts = vec![0usize; rows + 1];
        for (row, _) in pairs.clone() {
            counts[row + 1] += 1;
        }
        for i in 0..rows {
            counts[i + 1] += counts[i];
        }
        let mut fill = counts.clone();
        let mut items = vec![0u32; counts[rows]];
        for (row, item) in pairs {
            items[fill[row]] = item;
            fill[row] += 1;
        }
        Csr {
            offsets: counts,
            items,
        }
    }

    #[inline]
    pub fn row(&self, i: usize) -> &[u32] {
        &self.items[self.offsets[i]..self.offsets[i + 1]]
    }

    pub fn rows(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }
}

/// An immutable, validated topology with its derived indexes.
#[derive(Debug, Clone)]
pub struct Topology {
    levels: Vec<Level>,
    node_level: usize,
    nvlink_level: usize,
    num_gpus: usize,
    /// GPU-major paths: `path[g * L + l]` is the id of GPU g's domain at level l.
    path: Vec<u32>,
    domain_count: Vec<usize>,
    /// `parent[l][d]`: the level-(l+1) domain containing level-l domain d (empty for the top).
    parent: Vec<Vec<u32>>,
    /// `children[l]`: for each level-l domain, its level-(l-1) domains (empty CSR for l = 0).
    children: Vec<Csr>,
    /// GPUs per domain, per level.
    domain_size: Vec<Vec<u32>>,
    /// GPUs of each level-0 domain, in id order.
    lowest_members: Csr,
    node_types: Vec<NodeType>,
    /// Host type of every node-level domain.
    node_type_of_node: Vec<u32>,
    /// Local index of every GPU inside its host.
    gpu_local: Vec<u32>,
    /// `effective_bw[l]`: the smallest bandwidth among levels 0..=l (GB/s). A ring that spans
    /// level l crosses links of every level below it, so this is its slowest hop.
    effective_bw: Vec<f64>,
    /// NVLink SHARP all-reduce bus bandwidth (GB/s) of each host type, 0 where there is none
    /// (see [`crate::nccl`]); empty: none anywhere.
    nvls_gbps: Vec<f64>,
    /// NICs of each host type (0: one per GPU); empty: one per GPU everywhere.
    nics: Vec<u32>,
    /// Time factor of a collective by the number of hosts it spans (index hosts - 1).
    host_factors: Vec<f64>,
    /// Per level, whether its switches reduce in the network (SHARP; NCCL's CollNet).
    sharp: Vec<bool>,
    /// Bandwidth efficiency of each algorithm (ring, tree, NVLS, CollNet), 1 by default.
    algorithm_efficiency: [f64; 4],
    /// Dense peak TFLOPS of one GPU of each host type, 0 where unknown (see [`crate::gpu`]);
    /// empty: unknown everywhere.
    peak_tflops: Vec<f64>,
    /// Per host type, (GPU peer-to-peer, GPUDirect RDMA): whether its GPUs reach each other
    /// and their NICs directly or through buffers in host memory (see [`crate::nccl`],
    /// "Transports"); empty: direct everywhere.
    direct: Vec<(bool, bool)>,
    /// Per level, whether its switches are cabled rail by rail (see [`Self::uplink_rails`]);
    /// empty: every level.
    rail_aligned: Vec<bool>,
    /// The fabric's uplinks (see [`crate::fabric`]): the id of level-l domain d's uplink is
    /// `uplink_base[l] + d` for levels from the NVLink domain up to below the top.
    uplink_base: Vec<usize>,
    /// Capacity (GB/s, each direction) of every uplink; non-blocking unless set.
    uplink_gbps: Vec<f64>,
    /// Some uplink has less than its non-blocking capacity.
    oversubscribed: bool,
    /// Per level, how its switches spread flows over its uplink's parallel links (empty:
    /// adaptive everywhere, the fair share).
    routing: Vec<Routing>,
    /// Per level, the queue pairs per connection (NCCL_IB_QPS_PER_CONNECTION; 1 when empty).
    qps_per_connection: Vec<u32>,
}

fn invalid(msg: impl Into<String>) -> CoreError {
    CoreError::InvalidTopology(msg.into())
}

impl Topology {
    /// Build and validate a topology.
    ///
    /// `path` is GPU-major (`num_gpus x levels.len()`), each level's domain ids dense from 0.
    pub fn new(
        levels: Vec<Level>,
        node_level: usize,
        nvlink_level: usize,
        path: Vec<u32>,
        node_types: Vec<NodeType>,
        node_type_of_node: Vec<u32>,
        gpu_local: Vec<u32>,
    ) -> Result<Topology> {
        let nl = levels.len();
        if nl == 0 {
            return Err(invalid("levels: at least one level is required"));
        }
        for (i, level) in levels.iter().enumerate() {
            if !(level.bandwidth_gbps.is_finite() && level.bandwidth_gbps > 0.0) {
                return Err(invalid(format!(
                    "levels[{i}] ({}): bandwidth_gbps must be a positive number, got {}",
                    level.name, level.bandwidth_gbps
                )));
            }
            if !(level.latency_us.is_finite() && level.latency_us >= 0.0) {
                return Err(invalid(format!(
                    "levels[{i}] ({}): latency_us must be a number >= 0, got {}",
                    level.name, level.latency_us
                )));
            }
            if levels[..i].iter().any(|other| other.name == level.name) {
                return Err(invalid(format!(
                    "levels[{i}]: duplicate level name {:?}",
                    level.name
                )));
            }
        }
        if node_level >= nl {
            return Err(invalid(format!(
                "node_level {node_level} is not a level (have {nl})"
            )));
        }
        if nvlink_level < node_level || nvlink_level >= nl {
            return Err(invalid(format!(
                "nvlink_domain must be a level at or above the node level {:?}",
                levels[node_level].name
            )));
        }
        if path.is_empty() || path.len() % nl != 0 {
            return Err(invalid(format!(
                "domain paths: expected a multiple of {nl} entries (one per level per GPU), got {}",
                path.len()
            )));
        }
        let num_gpus = path.len() / nl;
        if num_gpus > u32::MAX as usize / 2 {
            return Err(invalid(format!("{num_gpus} GPUs is more than supported")));
        }
        if gpu_local.len() != num_gpus {
            return Err(invalid(format!(
                "gpu_local: expected {num_gpus} entries, got {}",
                gpu_local.len()
            )));
        }

        // Dense ids per level.
        let mut domain_count = vec![0usize; nl];
        for g in 0..num_gpus {
            for l in 0..nl {
                let d = path[g * nl + l] as usize;
                if d >= num_gpus {
                    return Err(invalid(format!(
                        "GPU {g}: domain id {d} at level {:?} is out of range",
                        levels[l].name
                    )));
                }
                domain_count[l] = domain_count[l].max(d + 1);
            }
        }
        let mut domain_size: Vec<Vec<u32>> = domain_count.iter().map(|&n| vec![0; n]).collect();
        for g in 0..num_gpus {
            for l in 0..nl {
                domain_size[l][path[g * nl + l] as usize] += 1;
            }
        }
        for l in 0..nl {
            if let Some(d) = domain_size[l].iter().position(|&s| s == 0) {
                return Err(invalid(format!(
                    "level {:?}: domain id {d} has no GPU (ids must be dense from 0)",
                    levels[l].name
                )));
            }
        }
        if domain_count[nl - 1] != 1 {
            return Err(invalid(format!(
                "the top level {:?} has {} domains; it must have exactly one (add a level above it)",
                levels[nl - 1].name,
                domain_count[nl - 1]
            )));
        }

        // Parents must be unique: the domains nest.
        let mut parent: Vec<Vec<u32>> = Vec::with_capacity(nl);
        for l in 0..nl {
            if l + 1 == nl {
                parent.push(Vec::new());
                continue;
            }
            let mut p = vec![u32::MAX; domain_count[l]];
            for g in 0..num_gpus {
                let d = path[g * nl + l] as usize;
                let up = path[g * nl + l + 1];
                if p[d] == u32::MAX {
                    p[d] = up;
                } else if p[d] != up {
                    return Err(invalid(format!(
                        "domains do not nest: {:?} domain {d} lies in two {:?} domains ({} and {up})",
                        levels[l].name,
                        levels[l + 1].name,
                        p[d]
                    )));
                }
            }
            parent.push(p);
        }
        let mut children = vec![Csr::default()];
        for l in 1..nl {
            let below = &parent[l - 1];
            children.push(Csr::from_pairs(
                domain_count[l],
                below
                    .iter()
                    .enumerate()
                    .map(|(d, &p)| (p as usize, d as u32)),
            ));
        }
        let lowest_members = Csr::from_pairs(
            domain_count[0],
            (0..num_gpus).map(|g| (path[g * nl] as usize, g as u32)),
        );

        // Host types.
        let nodes = domain_count[node_level];
        if node_type_of_node.len() != nodes {
            return Err(invalid(format!(
                "node types: expected one per host ({nodes}), got {}",
                node_type_of_node.len()
            )));
        }
        for (t, nt) in node_types.iter().enumerate() {
            if nt.gpus == 0 {
                return Err(invalid(format!(
                    "node type {:?}: gpus must be >= 1",
                    nt.name
                )));
            }
            if let Some(m) = &nt.bandwidth_gbps {
                if m.len() != nt.gpus * nt.gpus {
                    return Err(invalid(format!(
                        "node type {:?}: bandwidth matrix must be {0}x{0}, got {1} entries",
                        nt.gpus,
                        m.len()
                    )));
                }
                for i in 0..nt.gpus {
                    for j in 0..nt.gpus {
                        if i == j {
                            continue;
                        }
                        let v = m[i * nt.gpus + j];
                        if !(v.is_finite() && v > 0.0) {
                            return Err(invalid(format!(
                                "node type {:?} (#{t}): bandwidth_gbps[{i}][{j}] must be > 0, got {v}",
                                nt.name
                            )));
                        }
                        if (v - m[j * nt.gpus + i]).abs() > 1e-9 * v.abs().max(1.0) {
                            return Err(invalid(format!(
                                "node type {:?}: bandwidth matrix is not symmetric at [{i}][{j}]",
                                nt.name
                            )));
                        }
                    }
                }
            }
        }
        let mut seen_local: Vec<u64> = vec![0; nodes];
        for g in 0..num_gpus {
            let node = path[g * nl + node_level] as usize;
            let t = node_type_of_node[node] as usize;
            let Some(nt) = node_types.get(t) else {
                return Err(invalid(format!("host {node}: unknown node type index {t}")));
            };
            let local = gpu_local[g] as usize;
            if local >= nt.gpus || local >= 64 {
                return Err(invalid(format!(
                    "GPU {g}: local index {local} out of range for node type {:?} ({} GPUs)",
                    nt.name, nt.gpus
                )));
            }
            if seen_local[node] & (1 << local) != 0 {
                return Err(invalid(format!(
                    "host {node}: local GPU index {local} appears twice"
                )));
            }
            seen_local[node] |= 1 << local;
        }
        for (node, &size) in domain_size[node_level].iter().enumerate() {
            let nt = &node_types[node_type_of_node[node] as usize];
            if size as usize != nt.gpus {
                return Err(invalid(format!(
                    "host {node} has {size} GPUs but its node type {:?} declares {}",
                    nt.name, nt.gpus
                )));
            }
        }

        let mut effective_bw = Vec::with_capacity(nl);
        let mut slowest = f64::INFINITY;
        for level in &levels {
            slowest = slowest.min(level.bandwidth_gbps);
            effective_bw.push(slowest);
        }

        let (uplink_base, uplink_gbps) =
            crate::fabric::non_blocking_uplinks(&levels, nvlink_level, &domain_size, &effective_bw);
        Ok(Topology {
            uplink_base,
            uplink_gbps,
            oversubscribed: false,
            routing: Vec::new(),
            qps_per_connection: Vec::new(),
            levels,
            node_level,
            nvlink_level,
            num_gpus,
            path,
            domain_count,
            parent,
            children,
            domain_size,
            lowest_members,
            node_types,
            node_type_of_node,
            gpu_local,
            effective_bw,
            nvls_gbps: Vec::new(),
            nics: Vec::new(),
            host_factors: Vec::new(),
            sharp: Vec::new(),
            algorithm_efficiency: [1.0; 4],
            peak_tflops: Vec::new(),
            direct: Vec::new(),
            rail_aligned: Vec::new(),
        })
    }

    pub fn levels(&self) -> &[Level] {
        &self.levels
    }
    pub fn num_levels(&self) -> usize {
        self.levels.len()
    }
    pub fn num_gpus(&self) -> usize {
        self.num_gpus
    }
    pub fn node_level(&self) -> usize {
        self.node_level
    }
    pub fn nvlink_level(&self) -> usize {
        self.nvlink_level
    }
    pub fn domain_count(&self, level: usize) -> usize {
        self.domain_count[level]
    }
    pub fn domain_size(&self, level: usize, domain: usize) -> u32 {
        self.domain_size[level][domain]
    }
    pub fn domain_sizes(&self, level: usize) -> &[u32] {
        &self.domain_size[level]
    }
    pub fn parent(&self, level: usize, domain: usize) -> Option<usize> {
        self.parent[level].get(domain).map(|&p| p as usize)
    }
    pub fn parents(&self, level: usize) -> &[u32] {
        &self.parent[level]
    }
    /// The level-(l-1) domains inside level-l domain `domain` (l >= 1).
    pub fn children(&self, level: usize, domain: usize) -> &[u32] {
        self.children[level].row(domain)
    }
    /// The GPUs of a level-0 domain.
    pub fn lowest_members(&self, domain: usize) -> &[u32] {
        self.lowest_members.row(domain)
    }
    pub fn path(&self) -> &[u32] {
        &self.path
    }
    #[inline]
    pub fn domain_of(&self, gpu: usize, level: usize) -> usize {
        self.path[gpu * self.levels.len() + level] as usize
    }
    #[inline]
    pub fn node_of(&self, gpu: usize) -> usize {
        self.domain_of(gpu, self.node_level)
    }
    pub fn gpu_local(&self) -> &[u32] {
        &self.gpu_local
    }
    pub fn node_types(&self) -> &[NodeType] {
        &self.node_types
    }
    pub fn node_type_of_node(&self) -> &[u32] {
        &self.node_type_of_node
    }
    pub fn effective_bandwidth(&self, level: usize) -> f64 {
        self.effective_bw[level]
    }
    pub fn has_node_matrices(&self) -> bool {
        self.node_types.iter().any(|t| t.bandwidth_gbps.is_some())
    }

    /// Lowest common level of two distinct GPUs (the top level always matches).
    #[inline]
    pub fn lca(&self, a: usize, b: usize) -> usize {
        let nl = self.levels.len();
        let pa = &self.path[a * nl..a * nl + nl];
        let pb = &self.path[b * nl..b * nl + nl];
        for l in 0..nl {
            if pa[l] == pb[l] {
                return l;
            }
        }
        nl - 1
    }

    /// The host-matrix bandwidth of two GPUs in one host, if that host type has a matrix.
    #[inline]
    pub fn node_matrix_bandwidth(&self, a: usize, b: usize) -> Option<f64> {
        let node = self.node_of(a);
        if node != self.node_of(b) {
            return None;
        }
        let nt = &self.node_types[self.node_type_of_node[node] as usize];
        let m = nt.bandwidth_gbps.as_ref()?;
        let (la, lb) = (self.gpu_local[a] as usize, self.gpu_local[b] as usize);
        Some(m[la * nt.gpus + lb])
    }

    /// Bandwidth (GB/s) of traffic between two distinct GPUs: the levels' (or the host
    /// matrix's), capped where the pair's path is staged through host memory: at
    /// [`crate::nccl::SHM_GBPS`] for two GPUs of one host without peer-to-peer access (NCCL's
    /// SHM transport), at [`crate::nccl::NET_STAGED_GBPS`] for a pair whose path leaves the
    /// NVLink domain from a host without GPUDirect RDMA ([`Self::net_staged`]; a hop driving
    /// several NIC shares is capped per GPU driving it, [`crate::nccl::ring_bandwidths`]).
    #[inline]
    pub fn pair_bandwidth(&self, a: usize, b: usize) -> f64 {
        let bw = self
            .node_matrix_bandwidth(a, b)
            .unwrap_or_else(|| self.effective_bw[self.lca(a, b)]);
        if self.direct.is_empty() {
            bw
        } else if self.node_of(a) == self.node_of(b) {
            if self.transports(a).0 {
                bw
            } else {
                bw.min(crate::nccl::SHM_GBPS)
            }
        } else if self.net_staged(a, b) {
            bw.min(crate::nccl::NET_STAGED_GBPS)
        } else {
            bw
        }
    }

    /// The same topology with, per host type, whether its GPUs have peer-to-peer access to
    /// each other (`p2p`; false: NCCL's SHM transport through host memory) and GPUDirect RDMA
    /// to their NICs (`gpudirect_rdma`; false: the network transport stages through host
    /// memory). Empty vectors: both everywhere.
    pub fn with_transports(
        mut self,
        p2p: Vec<bool>,
        gpudirect_rdma: Vec<bool>,
    ) -> Result<Topology> {
        let types = self.node_types.len();
        if p2p.is_empty() && gpudirect_rdma.is_empty() {
            self.direct = Vec::new();
            return Ok(self);
        }
        if p2p.len() != types || gpudirect_rdma.len() != types {
            return Err(invalid(format!(
                "transports: expected one p2p and one gpudirect_rdma flag per host type ({types}), \
                 got {} and {}",
                p2p.len(),
                gpudirect_rdma.len()
            )));
        }
        self.direct = p2p.into_iter().zip(gpudirect_rdma).collect();
        if self.direct.iter().all(|&(p, g)| p && g) {
            self.direct = Vec::new();
        }
        Ok(self)
    }

    /// The same topology with, per level, whether its switches are cabled rail by rail (empty:
    /// every level is).
    pub fn with_rail_alignment(mut self, rail_aligned: Vec<bool>) -> Result<Topology> {
        if !rail_aligned.is_empty() && rail_aligned.len() != self.levels.len() {
            return Err(invalid(format!(
                "rail_aligned: expected one flag per level ({}), got {}",
                self.levels.len(),
                rail_aligned.len()
            )));
        }
        self.rail_aligned = if rail_aligned.iter().all(|&r| r) {
            Vec::new()
        } else {
            rail_aligned
        };
        Ok(self)
    }

    /// Whether the GPUs of `gpu`'s host have peer-to-peer access to each other and GPUDirect
    /// RDMA to their NICs.
    #[inline]
    pub fn transports(&self, gpu: usize) -> (bool, bool) {
        match self
            .direct
            .get(self.node_type_of_node[self.node_of(gpu)] as usize)
        {
            Some(&d) => d,
            None => (true, true),
        }
    }

    /// Whether the path between two GPUs of different NVLink domains is staged through host
    /// memory on either side (a host without GPUDirect RDMA): each GPU driving such a hop
    /// moves at most [`crate::nccl::NET_STAGED_GBPS`], whatever NIC shares it has.
    #[inline]
    pub fn net_staged(&self, a: usize, b: usize) -> bool {
        !self.direct.is_empty()
            && (!self.transports(a).1 || !self.transports(b).1)
            && self.lca(a, b) > self.nvlink_level
    }

    /// Number of fabric uplinks (see [`crate::fabric`]).
    pub fn uplink_count(&self) -> usize {
        self.uplink_gbps.len()
    }
    /// The uplink of level-`level` domain `domain`, if that level has uplinks.
    #[inline]
    pub fn uplink_id(&self, level: usize, domain: usize) -> Option<usize> {
        if level < self.nvlink_level || level + 1 >= self.levels.len() {
            return None;
        }
        Some(self.uplink_base[level] + domain)
    }
    /// The (level, domain) whose uplink has this id.
    pub fn uplink_owner(&self, uplink: usize) -> (usize, usize) {
        let level = (self.nvlink_level..self.levels.len() - 1)
            .rev()
            .find(|&l| self.uplink_base[l] <= uplink)
            .unwrap_or(self.nvlink_level);
        (level, uplink - self.uplink_base[level])
    }
    /// Capacity (GB/s, each direction) of every uplink, by uplink id.
    pub fn uplink_gbps(&self) -> &[f64] {
        &self.uplink_gbps
    }
    /// The same topology with other uplink capacities (GB/s, each direction, by uplink id);
    /// every capacity must be a positive number.
    pub fn with_uplink_gbps(mut self, capacity: Vec<f64>) -> Result<Topology> {
        if capacity.len() != self.uplink_gbps.len() {
            return Err(invalid(format!(
                "uplink capacities: expected {} (one per domain from the NVLink domain up to \
                 below the top level), got {}",
                self.uplink_gbps.len(),
                capacity.len()
            )));
        }
        if let Some((u, c)) = capacity
            .iter()
            .enumerate()
            .find(|(_, c)| !(c.is_finite() && **c > 0.0))
        {
            return Err(invalid(format!(
                "uplink {u}: capacity must be a positive number of GB/s, got {c}"
            )));
        }
        let (_, open) = crate::fabric::non_blocking_uplinks(
            &self.levels,
            self.nvlink_level,
            &self.domain_size,
            &self.effective_bw,
        );
        self.oversubscribed = capacity
            .iter()
            .zip(&open)
            .any(|(c, o)| *c < *o * (1.0 - 1e-12));
        self.uplink_gbps = capacity;
        Ok(self)
    }

    /// Some uplink carries less than every GPU under it could send: a job's own flows may
    /// then contend with each other.
    pub fn is_oversubscribed(&self) -> bool {
        self.oversubscribed
    }

    /// A job's own concurrent flows may slow each other on some uplink: it is oversubscribed
    /// or some level hashes flows onto its links (where they collide).
    pub fn self_contends(&self) -> bool {
        self.oversubscribed || self.has_hashing()
    }

    /// The same topology with, per level, its routing and queue pairs per connection (each at
    /// least 1; empty vectors: adaptive, one queue pair). Hashed routing (ECMP, static) is
    /// only meaningful on levels with uplinks: from the NVLink domain up to below the top.
    pub fn with_routing(mut self, routing: Vec<Routing>, qps: Vec<u32>) -> Result<Topology> {
        let nl = self.levels.len();
        if !routing.is_empty() && routing.len() != nl {
            return Err(invalid(format!(
                "routing: expected one per level ({nl}), got {}",
                routing.len()
            )));
        }
        if !qps.is_empty() && qps.len() != nl {
            return Err(invalid(format!(
                "qps_per_connection: expected one per level ({nl}), got {}",
                qps.len()
            )));
        }
        if let Some(l) = qps.iter().position(|&q| q == 0) {
            return Err(invalid(format!(
                "levels[{l}].qps_per_connection: expected an integer >= 1, got 0"
            )));
        }
        for (l, r) in routing.iter().enumerate() {
            if r.hashes() && (l < self.nvlink_level || l + 1 >= nl) {
                return Err(invalid(format!(
                    "levels[{l}].routing: {:?} has no uplinks to route over ({} is {}); set \
                     routing on the levels from the NVLink domain up to below the top",
                    self.levels[l].name,
                    r.label(),
                    if l + 1 >= nl {
                        "the top level"
                    } else {
                        "inside the NVLink domain"
                    }
                )));
            }
        }
        self.routing = routing;
        self.qps_per_connection = qps;
        Ok(self)
    }

    /// The routing of level `level`'s uplinks.
    #[inline]
    pub fn routing(&self, level: usize) -> Routing {
        self.routing.get(level).copied().unwrap_or_default()
    }

    /// Queue pairs per connection at level `level` (1 unless set).
    #[inline]
    pub fn qps_per_connection(&self, level: usize) -> u32 {
        self.qps_per_connection.get(level).copied().unwrap_or(1)
    }

    /// Whether some level hashes flows onto its uplinks' links.
    pub fn has_hashing(&self) -> bool {
        self.routing.iter().any(|r| r.hashes())
    }

    /// Parallel links of uplink `uplink`: its capacity over [`Self::link_rate`] (a
    /// non-blocking uplink has one per NIC port under it: one per GPU where every GPU has its
    /// own NIC), at least one.
    pub fn uplink_links(&self, uplink: usize) -> usize {
        ((self.uplink_gbps[uplink] / self.link_rate(uplink)).round() as usize).max(1)
    }

    /// Rate (GB/s, each direction) of one parallel link of `uplink`: a NIC port's, the per-GPU
    /// bandwidth of the level above times the GPUs per NIC of the hosts under it (`gpus /
    /// nics` where the host type lists its NICs: 2 where two GPUs share a NIC, 1/2 where each
    /// GPU has two; 1 otherwise). Switch links above the hosts are taken to run at the NICs'
    /// port rate. A domain holding hosts of several types takes its first GPU's type.
    pub fn link_rate(&self, uplink: usize) -> f64 {
        let (level, domain) = self.uplink_owner(uplink);
        self.effective_bw[level + 1] * self.gpus_per_nic(self.first_gpu_of(level, domain))
    }

    /// GPUs per NIC of the host of `gpu`: `gpus / nics` where its type lists NICs, else 1.
    pub fn gpus_per_nic(&self, gpu: usize) -> f64 {
        let t = self.node_type_of_node[self.node_of(gpu)] as usize;
        match self.nics.get(t).copied() {
            Some(n) if n > 0 => self.node_types[t].gpus as f64 / n as f64,
            _ => 1.0,
        }
    }

    /// Rails the links of `uplink` split into: the NICs the host type under its domain lists
    /// (its first GPU's type), 1 where it lists none or where the uplink's level is not
    /// rail-aligned ([`Self::with_rail_alignment`]). A host type that lists its NICs declares
    /// its rails, and a rail-aligned level (the default: one leaf per rail, as NVIDIA's DGX
    /// SuperPOD reference designs cable them and NCCL's PXN assumes) lets a flow above the
    /// NVLink domain take only its own rail's links; a type without NICs says nothing about
    /// rails and its flows hash over the whole uplink, as on a top-of-rack leaf.
    pub fn uplink_rails(&self, uplink: usize) -> usize {
        let (level, domain) = self.uplink_owner(uplink);
        if !self.rail_aligned.get(level).copied().unwrap_or(true) {
            return 1;
        }
        let t = self.node_type_of_node[self.node_of(self.first_gpu_of(level, domain))] as usize;
        self.nics.get(t).map_or(1, |&n| (n as usize).max(1))
    }

    /// A GPU of level-`level` domain `domain` (its first child's, down to the lowest level).
    fn first_gpu_of(&self, level: usize, domain: usize) -> usize {
        let (mut l, mut d) = (level, domain);
        while l > 0 {
            d = self.children[l].row(d)[0] as usize;
            l -= 1;
        }
        self.lowest_members(d)[0] as usize
    }

    /// The same topology with, per host type, the NVLink SHARP all-reduce bus bandwidth (GB/s,
    /// 0 for none) and the number of NICs (0: one per GPU; see [`crate::nccl`]).
    pub fn with_fabric(mut self, nvls_gbps: Vec<f64>, nics: Vec<u32>) -> Result<Topology> {
        self.set_fabric(nvls_gbps, nics)?;
        Ok(self)
    }

    /// The same topology with a correction by the number of hosts a collective spans: the
    /// time of a collective over `k` hosts is multiplied by `factors[k - 1]` (the last entry
    /// beyond the list's end). Fitted by calibration where measurements demand it.
    pub fn with_host_count_factors(mut self, factors: Vec<f64>) -> Result<Topology> {
        if let Some((i, v)) = factors
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && **v > 0.0))
        {
            return Err(invalid(format!(
                "host_count_factors[{i}]: expected a number > 0, got {v}"
            )));
        }
        self.host_factors = factors;
        Ok(self)
    }

    /// The correction factor of a collective spanning `hosts` hosts (1 without factors).
    #[inline]
    pub fn host_count_factor(&self, hosts: usize) -> f64 {
        match self.host_factors.len() {
            0 => 1.0,
            len => self.host_factors[hosts.max(1).min(len) - 1],
        }
    }

    /// The same topology with in-network reduction (SHARP) at the levels flagged `true` (one
    /// flag per level).
    pub fn with_sharp(mut self, sharp: Vec<bool>) -> Result<Topology> {
        if !sharp.is_empty() && sharp.len() != self.levels.len() {
            return Err(invalid(format!(
                "sharp: expected one flag per level ({}), got {}",
                self.levels.len(),
                sharp.len()
            )));
        }
        self.sharp = sharp;
        Ok(self)
    }

    /// The same topology with a bandwidth efficiency per algorithm (ring, tree, NVLS, CollNet;
    /// each positive, 1 = as modelled, fitted by calibration): the algorithm's bandwidth terms
    /// run at that multiple of the modelled bandwidth.
    pub fn with_algorithm_efficiency(mut self, efficiency: [f64; 4]) -> Result<Topology> {
        if let Some((i, v)) = efficiency
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && **v > 0.0))
        {
            return Err(invalid(format!(
                "algorithm_efficiency[{i}]: expected a number > 0, got {v}"
            )));
        }
        self.algorithm_efficiency = efficiency;
        Ok(self)
    }

    /// Bandwidth efficiency of the algorithms: ring, tree, NVLS, CollNet.
    #[inline]
    pub fn algorithm_efficiency(&self) -> [f64; 4] {
        self.algorithm_efficiency
    }

    /// Whether every switch level from just above the NVLink domain up to `span` reduces in
    /// the network (SHARP), so that NCCL's CollNet can run over it.
    pub fn sharp_up_to(&self, span: usize) -> bool {
        span > self.nvlink_level
            && !self.sharp.is_empty()
            && self.sharp[self.nvlink_level + 1..=span].iter().all(|&f| f)
    }

    /// Whether the topology has host-count factors.
    pub fn has_host_count_factors(&self) -> bool {
        !self.host_factors.is_empty()
    }

    /// The smallest host-count factor (1 without factors).
    pub fn min_host_count_factor(&self) -> f64 {
        self.host_factors.iter().copied().fold(1.0, f64::min)
    }

    fn set_fabric(&mut self, nvls_gbps: Vec<f64>, nics: Vec<u32>) -> Result<()> {
        let types = self.node_types.len();
        if nvls_gbps.len() != types || nics.len() != types {
            return Err(invalid(format!(
                "fabric: expected one nvls_gbps and one NIC count per host type ({types}), got {} and {}",
                nvls_gbps.len(),
                nics.len()
            )));
        }
        if let Some((t, v)) = nvls_gbps
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
        {
            return Err(invalid(format!(
                "node type {:?}: nvls_gbps must be a number >= 0, got {v}",
                self.node_types[t].name
            )));
        }
        self.nvls_gbps = nvls_gbps;
        self.nics = nics;
        Ok(())
    }

    /// NIC shares (units of the per-GPU fabric bandwidth) that `k` GPUs of one host of `gpu`
    /// drive in parallel: `k` when the host has a NIC per GPU or more (or its NICs are not
    /// given); with fewer NICs than GPUs, `min(k, nics)` NICs of `gpus / nics` shares each.
    #[inline]
    pub fn nic_shares(&self, gpu: usize, k: u32) -> f64 {
        if self.nics.is_empty() {
            return k as f64;
        }
        let t = self.node_type_of_node[self.node_of(gpu)] as usize;
        let (nics, gpus) = (self.nics[t], self.node_types[t].gpus as u32);
        if nics == 0 || nics >= gpus {
            k as f64
        } else {
            k.min(nics) as f64 * gpus as f64 / nics as f64
        }
    }

    /// The rails of the host of `gpu`: its NICs when it lists them, else one per GPU (a
    /// rail-optimized fabric has one rail per NIC index of a host).
    #[inline]
    pub fn rails(&self, gpu: usize) -> u32 {
        let t = self.node_type_of_node[self.node_of(gpu)] as usize;
        let gpus = self.node_types[t].gpus as u32;
        match self.nics.get(t).copied() {
            Some(n) if n > 0 => n.min(gpus).max(1),
            _ => gpus.max(1),
        }
    }

    /// The most NIC shares `k` GPUs of one NVLink domain can drive, as [`Self::nic_shares`]
    /// counts them for any host type (not capped at a host's GPUs: on NVL72 a rack's GPUs
    /// reach the NICs of every tray through NVLink).
    pub fn max_nic_shares(&self, k: u32) -> f64 {
        self.node_types
            .iter()
            .enumerate()
            .map(|(t, nt)| {
                let nics = self.nics.get(t).copied().unwrap_or(0);
                if nics == 0 || nics >= nt.gpus as u32 {
                    k as f64
                } else {
                    k.min(nics) as f64 * nt.gpus as f64 / nics as f64
                }
            })
            .fold(1.0, f64::max)
    }

    /// The largest NVLink SHARP bus bandwidth of any host type (GB/s), 0 when none has it.
    pub fn max_nvls_gbps(&self) -> f64 {
        self.nvls_gbps.iter().copied().fold(0.0, f64::max)
    }

    /// NVLink SHARP all-reduce bus bandwidth (GB/s) of the host of `gpu`, 0 when it has none.
    #[inline]
    pub fn nvls_gbps(&self, gpu: usize) -> f64 {
        if self.nvls_gbps.is_empty() {
            return 0.0;
        }
        self.nvls_gbps[self.node_type_of_node[self.node_of(gpu)] as usize]
    }

    /// The same topology with the dense peak TFLOPS of one GPU of each host type (0 where
    /// unknown), for step time and MFU ([`crate::step`]).
    pub fn with_peak_tflops(mut self, peak_tflops: Vec<f64>) -> Result<Topology> {
        let types = self.node_types.len();
        if !peak_tflops.is_empty() && peak_tflops.len() != types {
            return Err(invalid(format!(
                "peak_tflops: expected one per host type ({types}), got {}",
                peak_tflops.len()
            )));
        }
        if let Some((t, v)) = peak_tflops
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
        {
            return Err(invalid(format!(
                "node type {:?}: peak_tflops must be a number >= 0, got {v}",
                self.node_types[t].name
            )));
        }
        self.peak_tflops = peak_tflops;
        Ok(self)
    }

    /// The peak (TFLOPS per GPU) a synchronous job on `gpus` runs at: the slowest host type's
    /// among the hosts used; None when one of them has no known peak.
    pub fn peak_tflops_of(&self, gpus: &[u32]) -> Option<f64> {
        if self.peak_tflops.is_empty() || gpus.is_empty() {
            return None;
        }
        let mut peak = f64::INFINITY;
        for &g in gpus {
            let p = self.peak_tflops[self.node_type_of_node[self.node_of(g as usize)] as usize];
            if p <= 0.0 {
                return None;
            }
            peak = peak.min(p);
        }
        Some(peak)
    }

    /// Index of a level by name.
    pub fn level_index(&self, name: &str) -> Option<usize> {
        self.levels.iter().position(|l| l.name == name)
    }
}

/// Check that a placement names `num_ranks` distinct, existing GPUs.
pub fn check_placement(topo: &Topology, num_ranks: usize, gpus: &[u32]) -> Result<()> {
    if gpus.len() != num_ranks {
        return Err(CoreError::InvalidState(format!(
            "the placement gives {} GPUs for a job of {num_ranks} ranks",
            gpus.len()
        )));
    }
    if let Some(&last) = gpus.iter().max() {
        if last as usize >= topo.num_gpus() {
            return Err(CoreError::InvalidState(format!(
                "GPU {last} does not exist (the cluster has {})",
                topo.num_gpus()
            )));
        }
    }
    // Large placements: one bit per GPU, linear in the ranks (sorting a 16,384-rank placement
    // cost more than a third of a millisecond, and a repair checks three). Small ones: sorted.
    if gpus.len() > 256 {
        let mut seen = vec![0u64; topo.num_gpus().div_ceil(64)];
        let mut twice = false;
        for &g in gpus {
            let (word, bit) = (g as usize / 64, 1u64 << (g % 64));
            twice |= seen[word] & bit != 0;
            seen[word] |= bit;
        }
        if !twice {
            return Ok(());
        }
    }
    // Name the smallest GPU given twice.
    let mut sorted = gpus.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(CoreError::InvalidState(format!(
            "GPU {} is given to two ranks",
            w[0]
        )));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `nodes` hosts of `per_node` GPUs, `nodes_per_leaf` hosts per leaf, one spine on top.
    pub fn tree(nodes: usize, per_node: usize, nodes_per_leaf: usize) -> Topology {
        let levels = vec![
            Level {
                name: "node".into(),
                bandwidth_gbps: 450.0,
                latency_us: 1.0,
            },
            Level {
                name: "leaf".into(),
                bandwidth_gbps: 50.0,
                latency_us: 3.0,
            },
            Level {
                name: "spine".into(),
                bandwidth_gbps: 25.0,
                latency_us: 4.0,
            },
        ];
        tree_with(levels, nodes, per_node, nodes_per_leaf)
    }

    /// [`tree`]'s shape (node, leaf, spine) with the given levels.
    pub fn tree_with(
        levels: Vec<Level>,
        nodes: usize,
        per_node: usize,
        nodes_per_leaf: usize,
    ) -> Topology {
        let mut path = Vec::new();
        let mut local = Vec::new();
        for n in 0..nodes {
            for g in 0..per_node {
                path.extend_from_slice(&[n as u32, (n / nodes_per_leaf) as u32, 0]);
                local.push(g as u32);
            }
        }
        let nt = NodeType {
            name: "box".into(),
            gpus: per_node,
            bandwidth_gbps: None,
        };
        Topology::new(levels, 0, 0, path, vec![nt], vec![0; nodes], local).unwrap()
    }

    #[test]
    fn lca_and_bandwidth() {
        let t = tree(4, 8, 2);
        assert_eq!(t.num_gpus(), 32);
        assert_eq!(t.lca(0, 7), 0);
        assert_eq!(t.lca(0, 8), 1);
        assert_eq!(t.lca(0, 16), 2);
        assert_eq!(t.pair_bandwidth(0, 1), 450.0);
        assert_eq!(t.pair_bandwidth(0, 31), 25.0);
        assert_eq!(t.children(2, 0), &[0, 1]);
        assert_eq!(t.children(1, 1), &[2, 3]);
        assert_eq!(t.lowest_members(3), &[24, 25, 26, 27, 28, 29, 30, 31]);
    }

    #[test]
    fn rejects_non_nesting_domains() {
        let levels = vec![
            Level {
                name: "node".into(),
                bandwidth_gbps: 1.0,
                latency_us: 0.0,
            },
            Level {
                name: "leaf".into(),
                bandwidth_gbps: 1.0,
                latency_us: 0.0,
            },
            Level {
                name: "top".into(),
                bandwidth_gbps: 1.0,
                latency_us: 0.0,
            },
        ];
        // Node 0 has one GPU under leaf 0 and one under leaf 1.
        let path = vec![0, 0, 0, 0, 1, 0];
        let nt = NodeType {
            name: "b".into(),
            gpus: 2,
            bandwidth_gbps: None,
        };
        let err = Topology::new(levels, 0, 0, path, vec![nt], vec![0], vec![0, 1]).unwrap_err();
        assert!(err.to_string().contains("do not nest"), "{err}");
    }

    #[test]
    fn rejects_several_top_domains() {
        let levels = vec![Level {
            name: "node".into(),
            bandwidth_gbps: 1.0,
            latency_us: 0.0,
        }];
        let nt = NodeType {
            name: "b".into(),
            gpus: 1,
            bandwidth_gbps: None,
        };
        let err =
            Topology::new(levels, 0, 0, vec![0, 1], vec![nt], vec![0, 0], vec![0, 0]).unwrap_err();
        assert!(err.to_string().contains("exactly one"), "{err}");
    }
}
